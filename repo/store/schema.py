"""Alembic, driven from code: the schema's only source, on both backends.

The store checks (or upgrades) a database's revision when it opens it; :func:`migrate` and
:func:`upgrade_script` are the operator's step (``sessionrepo migrate``), by URL.
"""

from __future__ import annotations

import functools
import io
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Final

from sqlalchemy import Connection
from sqlalchemy.engine import URL

from sessionrepo.errors import BackendUnavailable, RepoError, SchemaOutOfDate
from sessionrepo.store.database import Database
from sessionrepo.store.tenancy import check_tenant

#: Alembic's loggers that speak at INFO when nothing is migrated: its plugins as it is
#: imported, and every ``MigrationContext`` ("Context impl SQLiteImpl.", ...).
_CHATTY_LOGGERS: Final = ("alembic.runtime.plugins", "alembic.runtime.migration")


@contextmanager
def _quiet_alembic() -> Iterator[None]:
    """Drop what Alembic logs at INFO or below from this thread, meanwhile: opening a
    store reads its revision, which is no news; a migration that runs is (see
    :func:`upgrade`), and so is whatever other threads log."""
    thread = threading.get_ident()

    def keep(record: logging.LogRecord) -> bool:
        return record.thread != thread or record.levelno > logging.INFO

    loggers = [logging.getLogger(name) for name in _CHATTY_LOGGERS]
    for logger in loggers:
        logger.addFilter(keep)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(keep)


with _quiet_alembic():  # importing Alembic logs a line per plugin it sets up
    from alembic import command
    from alembic.config import Config
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory
    from alembic.util.exc import CommandError

#: The Alembic environment, installed as ``sessionrepo.migrations`` (found by name, not
#: imported: the migrations sit above the store, whose code they run).
MIGRATIONS_DIR: Final = Path(str(resources.files("sessionrepo.migrations")))


def alembic_config(connection: Connection | None = None) -> Config:
    """An Alembic config for sessionrepo's migrations, optionally bound to a connection."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


@functools.cache
def head_revision() -> str:
    """This sessionrepo's newest schema revision (read from the scripts once: they do not
    change while the process runs)."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    if head is None:  # pragma: no cover - the package always ships a revision
        raise RepoError("sessionrepo ships no migrations")
    return head


def current_revision(database: Database) -> str | None:
    """The revision the database is at; ``None`` for an empty database."""

    def read(conn: Connection) -> str | None:
        with _quiet_alembic():
            return MigrationContext.configure(conn).get_current_revision()

    return database.read(read)


def upgrade(database: Database, revision: str = "head") -> None:
    """Migrate to ``revision``. Safe when several processes do it at once: PostgreSQL
    takes an advisory lock, SQLite the write lock, and the loser finds nothing to do."""

    def work(connection: Connection) -> None:
        command.upgrade(alembic_config(connection), revision)

    try:
        database.write(work)
    except CommandError as exc:
        raise RepoError(f"migration failed: {exc}") from exc


@dataclass(frozen=True)
class Migration:
    """What :func:`migrate` did."""

    #: The database's URL, its password masked.
    url: str
    #: The revision before (``None``: an empty database) and after the upgrade.
    before: str | None
    after: str | None
    #: This sessionrepo's newest revision.
    head: str

    @property
    def changed(self) -> bool:
        return self.before != self.after


def migrate(url: str | URL | None = None) -> Migration:
    """Upgrade the database at ``url`` to this sessionrepo's head, as :func:`upgrade`
    does (nothing to do when it is current; safe from several processes at once).

    Args:
        url: as for ``open_repository``: a URL or a file path, by default
            ``SESSIONREPO_DATABASE_URL``, else the embedded SQLite file.

    Raises:
        RepoError: the migration failed (``BackendUnavailable``: the database cannot be
            reached).
    """
    database = Database(url)
    try:
        before = current_revision(database)
        upgrade(database)
        return Migration(
            url=database.display_url,
            before=before,
            after=current_revision(database),
            head=head_revision(),
        )
    finally:
        database.dispose()


def upgrade_script(url: str | None = None) -> str:
    """The SQL that would upgrade an empty database to head, for ``url``'s dialect
    (Alembic's offline mode: no connection is made; only the URL's dialect is used).

    Raises:
        RepoError: Alembic could not produce the script.
    """
    config = alembic_config()
    if url is not None:
        # migrations/env.py reads it in offline mode; ConfigParser needs "%" doubled.
        config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    buffer = io.StringIO()
    config.output_buffer = buffer
    try:
        command.upgrade(config, "head", sql=True)
    except CommandError as exc:
        raise RepoError(f"migration failed: {exc}") from exc
    return buffer.getvalue()


def downgrade(database: Database, revision: str) -> None:
    """Migrate down to ``revision`` (the migration tests' round trip)."""

    def work(connection: Connection) -> None:
        command.downgrade(alembic_config(connection), revision)

    try:
        database.write(work)
    except CommandError as exc:
        raise RepoError(f"migration failed: {exc}") from exc


def check_schema(
    database: Database,
    *,
    auto_migrate: bool | None = None,
    require_connection: bool = True,
    defer: bool = False,
) -> None:
    """:func:`ensure_current` for a database being opened; disposes of it when that fails.

    Args:
        auto_migrate: upgrade instead of refusing; ``None``: on SQLite only.
        require_connection: with ``False``, a database that cannot be reached now is
            checked by the first unit of work that reaches it.
        defer: check on first use in any case (no I/O now: the asyncio API opens
            databases where none may happen).
    """
    migrate = auto_migrate
    if migrate is None:
        migrate = database.dialect.capabilities.migrates_on_open

    def check(database: Database) -> None:
        ensure_current(database, auto_migrate=migrate)
        check_tenant(database)

    if defer:
        database.check_on_first_use(check)
        return
    try:
        check(database)
    except BackendUnavailable:
        if require_connection:
            database.dispose()
            raise
        database.check_on_first_use(check)
    except BaseException:
        database.dispose()
        raise


def ensure_current(database: Database, *, auto_migrate: bool) -> None:
    """Refuse (or, with ``auto_migrate``, upgrade) a database not at this code's head.

    Raises:
        SchemaOutOfDate: the revision differs and may not (or cannot) be fixed here.
    """
    head = head_revision()
    current = current_revision(database)
    if current == head:
        return
    scripts = ScriptDirectory.from_config(alembic_config())
    known = current is None or _is_known(scripts, current)
    if not known:
        raise SchemaOutOfDate(
            f"database {database.display_url} is at revision {current}, which this version "
            f"of sessionrepo does not know (its newest is {head}): a newer sessionrepo "
            "migrated it; upgrade sessionrepo"
        )
    if auto_migrate:
        upgrade(database)
        return
    at = "empty (no schema)" if current is None else f"at revision {current}"
    raise SchemaOutOfDate(
        f"database {database.display_url} is {at}; this sessionrepo needs revision {head}. "
        "Run `sessionrepo migrate` (with SESSIONREPO_DATABASE_URL or --url set to this "
        "database) to upgrade it"
    )


def _is_known(scripts: ScriptDirectory, revision: str) -> bool:
    try:
        return scripts.get_revision(revision) is not None
    except CommandError:
        return False
