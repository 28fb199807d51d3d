"""``doctor``: check a store's health without changing it.

Unlike the rest of :mod:`sessionrepo.ops`, the doctor does not work through a
:class:`SessionRepository`: it inspects a database that may not be a working repository
at all (no file, no schema, an old revision, a separate outbox file), so it opens the URL
itself and probes it low-level: the connection, the schema revision, the backend's
settings (probed and judged by its dialect), the outbox and the search index. Every probe
only reads, through databases opened read-only (a SQLite file ``mode=ro``, its journal mode
left alone; on PostgreSQL, read-only transactions): the doctor cannot
change what it examines, even by mistake.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from alembic.script import ScriptDirectory
from pydantic import BaseModel, ConfigDict
from sqlalchemy.engine import URL

from sessionrepo.dialects import database_file, normalize_url, safe_url
from sessionrepo.errors import RepoError
from sessionrepo.models.doctor import Check
from sessionrepo.outbox.table import Outbox
from sessionrepo.store import schema
from sessionrepo.store.database import Database
from sessionrepo.store.search_index import SearchIndex


class DoctorReport(BaseModel):
    """Everything ``doctor`` found, and its verdict."""

    model_config = ConfigDict(frozen=True)

    database: str
    backend: str | None
    #: Where the outbox that was checked lives (``"primary"``: its ``pending_outbox``).
    outbox: str
    checks: list[Check]

    @property
    def failures(self) -> list[Check]:
        return [check for check in self.checks if check.status == "fail"]

    @property
    def warnings(self) -> list[Check]:
        return [check for check in self.checks if check.status == "warn"]

    @property
    def healthy(self) -> bool:
        return not self.failures


@dataclass
class _Probe:
    """What the checks share, filled in as they run."""

    url: URL
    outbox_url: str | None
    max_outbox_age: float
    database: Database | None = None
    connected: bool = False
    #: The schema revision (``None``: empty); meaningful once ``schema`` has run.
    revision: str | None = None
    extra: list[Database] = field(default_factory=list)


def missing_sqlite_file(url: str | URL | None) -> Path | None:
    """The path of a SQLite database file that does not exist (opening would create
    it, empty); ``None`` for an existing file or another backend."""
    path = database_file(normalize_url(url))
    return None if path is None or path.exists() else path


def _check_connection(probe: _Probe) -> Iterator[Check]:
    missing = missing_sqlite_file(probe.url)
    if missing is not None:
        yield Check(
            name="connection",
            status="fail",
            detail=f"no database file at {missing}",
            fix="check --url / SESSIONREPO_DATABASE_URL; `sessionrepo migrate` creates a new "
            "store there",
        )
        return
    database = Database(probe.url, read_only=True)
    probe.database = database
    started = time.perf_counter()
    version = database.read(database.dialect.server_version)
    elapsed = (time.perf_counter() - started) * 1000
    probe.connected = True
    name = database.dialect.display_name
    yield Check(name="connection", status="ok", detail=f"{name} {version}, {elapsed:.0f} ms")


def _check_settings(probe: _Probe) -> Iterator[Check]:
    assert probe.database is not None
    dialect = probe.database.dialect
    settings = probe.database.read(dialect.settings)
    for check in dialect.judge_settings(settings):
        yield check.model_copy(update={"name": f"{dialect.name}.{check.name}"})


_MIGRATE_FIX: Final = "run `sessionrepo migrate` with the same --url / SESSIONREPO_DATABASE_URL"


def _check_schema(probe: _Probe) -> Iterator[Check]:
    assert probe.database is not None
    head = schema.head_revision()
    current = schema.current_revision(probe.database)
    probe.revision = current
    if current == head:
        yield Check(name="schema", status="ok", detail=f"at revision {head} (head)")
    elif current is None:
        yield Check(
            name="schema",
            status="fail",
            detail=f"empty database (no schema); this sessionrepo needs revision {head}",
            fix=_MIGRATE_FIX,
        )
    elif current not in _known_revisions():
        yield Check(
            name="schema",
            status="fail",
            detail=f"at revision {current}, unknown to this sessionrepo (its head is {head}): "
            "a newer sessionrepo migrated it",
            fix="upgrade sessionrepo",
        )
    else:
        yield Check(
            name="schema",
            status="fail",
            detail=f"at revision {current}; this sessionrepo needs {head} (out of date: "
            "gateways on PostgreSQL refuse to open it)",
            fix=_MIGRATE_FIX,
        )


@functools.cache
def _known_revisions() -> frozenset[str]:
    """Every revision this sessionrepo ships (read once: the scripts do not change)."""
    scripts = ScriptDirectory.from_config(schema.alembic_config())
    return frozenset(script.revision for script in scripts.walk_revisions())


def _check_outbox(probe: _Probe) -> Iterator[Check]:
    if probe.outbox_url is None:
        if probe.database is None or not probe.connected:
            yield Check(name="outbox", status="skip", detail="no connection")
            return
        if probe.revision is None:
            yield Check(name="outbox", status="skip", detail="no schema, so no outbox table")
            return
        database = probe.database
    else:
        missing = missing_sqlite_file(probe.outbox_url)
        if missing is not None:
            yield Check(
                name="outbox",
                status="fail",
                detail=f"no outbox file at {missing}",
                fix="check --outbox-url / SESSIONREPO_OUTBOX_URL (a TranscriptWriter "
                "creates the file when it starts)",
            )
            return
        database = Database(probe.outbox_url, read_only=True)
        probe.extra.append(database)
        if schema.current_revision(database) is None:
            yield Check(
                name="outbox",
                status="fail",
                detail="not a sessionrepo outbox (no schema)",
                fix="check --outbox-url / SESSIONREPO_OUTBOX_URL",
            )
            return
    try:
        health = Outbox(database).status(limit=1)
    except RepoError:
        if probe.outbox_url is None and probe.revision != schema.head_revision():
            yield Check(name="outbox", status="skip", detail="unreadable until migrated")
            return
        raise
    age = _duration(health.oldest_pending_age)
    detail = f"{health.pending:,} pending, {health.dead:,} dead"
    if health.pending:
        detail += f" (oldest {age} old)"
    if health.dead:
        yield Check(
            name="outbox",
            status="fail",
            detail=detail,
            fix="see `sessionrepo outbox status`; fix the cause, then "
            "`sessionrepo outbox retry-dead`",
        )
    elif health.pending and health.oldest_pending_age > probe.max_outbox_age:
        yield Check(
            name="outbox",
            status="fail",
            detail=f"{detail}: older than {_duration(probe.max_outbox_age)}",
            fix="is a gateway's drainer running and the primary reachable? "
            "`sessionrepo outbox drain` replays by hand",
        )
    elif health.pending:
        yield Check(
            name="outbox",
            status="warn",
            detail=f"{detail}: messages waiting for the primary",
            fix="they replay on their own; `sessionrepo outbox status` shows why they wait",
        )
    else:
        yield Check(name="outbox", status="ok", detail=detail)


def _duration(seconds: float) -> str:
    whole = max(int(seconds), 0)
    for unit, size in (("d", 86_400), ("h", 3600), ("m", 60)):
        if whole >= size:
            return f"{whole // size}{unit}"
    return f"{whole}s"


def _check_search_index(probe: _Probe) -> Iterator[Check]:
    assert probe.database is not None
    if probe.revision != schema.head_revision():
        yield Check(name="search", status="skip", detail="schema not at head")
        return
    index = SearchIndex(probe.database)
    state, reason = index.state()
    backlog = index.backlog()
    if state != "ok":
        yield Check(
            name="search",
            status="fail",
            detail=f"full-text index is {state}: {reason} (search refuses; writes are fine)",
            fix="sessionrepo reindex",
        )
    elif backlog:
        # Normal between catch-ups; each search indexes it first, so nothing is missed.
        yield Check(
            name="search",
            status="ok",
            detail=f"full-text index in step; {backlog:,} messages wait for indexing "
            "(the next search or drainer round indexes them)",
        )
    else:
        yield Check(name="search", status="ok", detail="full-text index in step, backlog empty")


#: The checks ``doctor`` runs, in order; each yields its findings. A check that needs the
#: connection is skipped when ``connection`` failed; an error raised by a check becomes a
#: ``fail`` finding under its name.
DOCTOR_CHECKS: Final[list[tuple[str, Callable[[_Probe], Iterable[Check]], bool]]] = [
    # (name, check, needs the connection)
    ("connection", _check_connection, False),
    ("schema", _check_schema, True),
    ("settings", _check_settings, True),
    ("outbox", _check_outbox, False),
    ("search", _check_search_index, True),
]


def run_doctor(
    url: str | URL | None = None,
    *,
    outbox_url: str | None = None,
    max_outbox_age: float = 3600.0,
) -> DoctorReport:
    """Check a store's health; never changes it (no migration, no file created).

    Args:
        url: the primary database (default: as :func:`repo.open_repository`).
        outbox_url: a separate outbox (a gateway's ``TranscriptWriter(outbox_url=...)``);
            ``None`` checks the primary's ``pending_outbox``.
        max_outbox_age: seconds a pending outbox row may wait before it is a failure.
    """
    probe = _Probe(url=normalize_url(url), outbox_url=outbox_url, max_outbox_age=max_outbox_age)
    checks: list[Check] = []
    try:
        for name, check, needs_connection in DOCTOR_CHECKS:
            if needs_connection and not probe.connected:
                checks.append(Check(name=name, status="skip", detail="no connection"))
                continue
            try:
                checks.extend(check(probe))
            except RepoError as exc:
                checks.append(Check(name=name, status="fail", detail=" ".join(str(exc).split())))
    finally:
        for database in [probe.database, *probe.extra]:
            if database is not None:
                database.dispose()
    return DoctorReport(
        database=safe_url(probe.url),
        backend=probe.url.get_backend_name(),
        outbox="primary" if outbox_url is None else safe_url(normalize_url(outbox_url)),
        checks=checks,
    )
