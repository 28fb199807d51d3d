"""A password given to sessionrepo is never shown: not by any command (text or JSON,
its output or its errors), not in a log record, not in a ``repr``.

Every command of the ``sessionrepo`` tree is run (the tree is walked, so a new command
must be given its arguments here, or the test fails), with the password in the URL's
userinfo (``user:secret@``, the URL before the command) and as libpq's ``?password=``
(after the command, with ``--json`` where the command has it), and with
``$PGPASSWORD`` set; then the main error paths. The test server trusts local
connections: the password is accepted and ignored, so every command really works.
"""

from __future__ import annotations

import logging
import re
import traceback
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import pytest
from click.testing import CliRunner, Result
from sqlalchemy.engine import make_url

from sessionrepo import (
    AsyncSessionRepository,
    RepoError,
    TranscriptWriter,
    open_async_repository,
    open_repository,
)
from sessionrepo.cli import main
from sessionrepo.dialects import normalize_url, safe_url
from sessionrepo.ops.tenants import create_tenant, drop_tenant
from sessionrepo.store.database import Database

from support.cli_tree import LEAVES, command_at

if TYPE_CHECKING:
    from conftest import PostgresServer

# Distinctive, and with characters that URL-quoting changes.
SECRET = "S3cr3t-pw/+%x"
ENV_SECRET = "EnvPw-91ab7"
FORMS = [
    "S3cr3t-pw",  # the readable part: never shown in any quoting
    "S3cr3t-pw%2F%2B%25x",
    "S3cr3t-pw%2F+%25x",
    ENV_SECRET,
]


def with_password(url: str, form: str) -> str:
    """``url`` carrying :data:`SECRET` in its userinfo or as ``?password=``."""
    quoted = "S3cr3t-pw%2F%2B%25x"
    if form == "userinfo":  # by hand: the URL need not parse
        user = re.match(r"[a-z+]+://[^:@/]+", url)
        assert user is not None, url
        return f"{user.group()}:{quoted}{url[user.end() :]}"
    return f"{url}{'&' if '?' in url else '?'}password={quoted}"


def assert_no_secret(text: str, where: str) -> None:
    for form in FORMS:
        assert form not in text, f"{where} shows the password ({form!r}):\n{text}"


#: Commands that open no database given to them (the demo makes its own files).
NO_DATABASE = {("demo",)}


def _arguments(path: tuple[str, ...], files: Path, out: Path, n: int) -> list[str]:
    """A call of each command that does real work on the store :func:`_store` made
    (``out``: where a new file goes)."""
    arguments: dict[tuple[str, ...], list[str]] = {
        ("migrate",): [],
        ("doctor",): [],
        ("sessions", "list"): [],
        ("sessions", "show"): ["s1"],
        ("sessions", "end"): ["s1", "--reason", "done"],
        ("sessions", "reopen"): ["s1"],
        ("sessions", "rewind"): ["s1", "--to-seq", "1"],
        ("sessions", "clear"): ["s2"],
        ("sessions", "fork"): ["s1", "--at-seq", "1", "--new-id", f"fork-{n}"],
        ("search",): ["mochi"],
        ("reindex",): [],
        ("outbox", "status"): [],
        ("outbox", "drain"): [],
        ("outbox", "retry-dead"): [],
        ("export",): [str(out / f"export-{n}.jsonl")],
        ("import",): [str(files / "backup.jsonl")],
        ("prune",): ["--older-than", "1d"],
        ("import-hermes",): [str(files / "hermes" / "state.db")],
        ("serve",): [],
        ("erase",): ["--session", "s2", "--dry-run"],
        ("verify-erased",): ["--text", "never-stored"],
        ("audit",): [],
        ("retention", "show"): [],
        ("retention", "set"): ["cli", "--idle-days", "30"],
        ("retention", "clear"): ["cli"],
        ("insights",): [],
        ("backup",): [str(out / f"backup-{n}.backup")],
        ("restore-backup",): [str(files / "store.backup")],
        ("tenants", "create"): [_tenant(path, n), "--url-file", str(out / f"tenant-{n}.url")],
        ("tenants", "list"): [],
        ("tenants", "drop"): [_tenant(path, n)],
    }
    assert path in arguments, f"new command {' '.join(path)}: give it arguments here"
    return arguments[path]


#: The roles ``tenants create`` and ``drop`` are run on (made and dropped by the test).
_TAG = uuid.uuid4().hex[:8]


def _tenant(path: tuple[str, ...], n: int) -> str:
    return f"secrets_{_TAG}_{path[-1]}_{n}"


def _store(url: str, files: Path) -> None:
    """Two sessions with messages, an export of them, a Hermes state.db."""
    from support.hermes_fixtures import build_v2_state_db

    with open_repository(url) as repository:
        for sid in ("s1", "s2"):
            repository.append(
                sid,
                [{"role": "user", "content": "mochi"}, {"role": "assistant", "content": "ok"}],
                source="cli",
            )
    exported = CliRunner().invoke(main, ["--url", url, "export", str(files / "backup.jsonl")])
    assert exported.exit_code == 0, exported.output
    backed_up = CliRunner().invoke(main, ["--url", url, "backup", str(files / "store.backup")])
    assert backed_up.exit_code == 0, backed_up.output
    build_v2_state_db(files / "hermes")


@pytest.fixture
def no_server(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """``serve`` prints its startup line, then returns instead of serving."""
    import uvicorn

    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **options: calls.append(options))
    return calls


def _invoke(args: list[str]) -> Result:
    return CliRunner().invoke(
        main,
        args,
        env={
            "SESSIONREPO_DATABASE_URL": None,
            "SESSIONREPO_OUTBOX_URL": None,
            "PGPASSWORD": ENV_SECRET,
        },
    )


def _check(result: Result, what: str, caplog: pytest.LogCaptureFixture) -> None:
    assert "Traceback" not in result.output, f"{what}:\n{result.output}"
    assert_no_secret(result.stdout, f"{what} (stdout)")
    assert_no_secret(result.stderr, f"{what} (stderr)")
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        assert_no_secret("".join(traceback.format_exception(result.exception)), what)
    formatter = logging.Formatter("%(name)s %(message)s")
    for record in caplog.records:
        assert_no_secret(formatter.format(record), f"{what} (log record {record.name})")
    caplog.clear()


def _has_option(command: click.Command, name: str) -> bool:
    return any(name in getattr(param, "opts", ()) for param in command.params)


@pytest.fixture(scope="module")
def store(
    postgres_server: PostgresServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Path]]:
    """One database and its files for every command (each call leaves it usable)."""
    name = postgres_server.new_database()
    files = tmp_path_factory.mktemp("secrets")
    try:
        url = postgres_server.url_for(name)
        _store(url, files)
        yield url, files
    finally:
        postgres_server.drop(name)


@pytest.mark.postgres
@pytest.mark.parametrize("path", LEAVES, ids=" ".join)
def test_no_command_shows_the_password(
    path: tuple[str, ...],
    store: tuple[str, Path],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    no_server: list[dict[str, Any]],
) -> None:
    if path in NO_DATABASE:
        pytest.skip("opens no database given to it")
    caplog.set_level(logging.DEBUG)
    url, files = store
    command = command_at(path)
    outbox = ["--outbox-url"] if _has_option(command, "--outbox-url") else []
    for n, form in enumerate(["userinfo", "query"]):
        secret_url = with_password(url, form)
        args = [*path, *_arguments(path, files, tmp_path, n)]
        if form == "userinfo":  # before the command, as text
            args = ["--url", secret_url, *args]
        else:  # after it, as JSON where the command has it
            args += ["--url", secret_url]
            args += ["--json"] if _has_option(command, "--json") else []
        if outbox:
            args += [*outbox, secret_url]
        if path == ("prune",):
            args.append("--yes")
        if path == ("tenants", "drop"):
            create_tenant(url, _tenant(path, n))
        result = _invoke(args)
        if path == ("tenants", "create") and result.exit_code == 0:
            drop_tenant(url, _tenant(path, n))
        # 3: hermes notes; 1 for restore-backup: a session another test changed in the
        # shared store since the backup (a mismatch, listed) is a finding, not an error.
        allowed = (0, 1, 3) if path == ("restore-backup",) else (0, 3)
        assert result.exit_code in allowed, f"{args}: {result.output}"
        if result.exit_code == 1:
            assert "MISMATCH" in result.stderr or '"mismatches"' in result.stdout, result.output
        _check(result, f"{' '.join(path)} ({form})", caplog)
        if path == ("serve",):
            assert no_server, "serve did not get as far as serving"
            assert "***" in result.stderr  # the startup line names the database


OUTBOX_COMMANDS = [p for p in LEAVES if _has_option(command_at(p), "--outbox-url")]


@pytest.mark.postgres
@pytest.mark.parametrize("path", OUTBOX_COMMANDS, ids=" ".join)
def test_a_sqlite_store_with_a_postgresql_outbox_shows_no_password(
    path: tuple[str, ...],
    store: tuple[str, Path],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    no_server: list[dict[str, Any]],
) -> None:
    caplog.set_level(logging.DEBUG)
    outbox_url, _ = store
    primary = f"sqlite:///{tmp_path / 'primary.db'}"
    open_repository(primary).close()  # a new, migrated SQLite store
    for form in ("userinfo", "query"):
        args = ["--url", primary, *path, "--outbox-url", with_password(outbox_url, form)]
        if form == "query" and _has_option(command_at(path), "--json"):
            args.append("--json")
        result = _invoke(args)
        assert result.exit_code == 0, f"{args}: {result.output}"
        _check(result, f"{' '.join(path)} ({form})", caplog)


ERROR_COMMANDS = [
    ["migrate"],
    ["doctor", "--json"],
    ["sessions", "list"],
    ["outbox", "status", "--json"],
]


def _error_urls(postgres_url: str) -> dict[str, str]:
    base = make_url(postgres_url)
    return {
        "unreachable server": base.set(host="127.0.0.1", port=1).render_as_string(False),
        "no such database": base.set(database="sessionrepo_no_such_db").render_as_string(False),
        # Under trust authentication a wrong password is accepted; an unknown user is
        # the authentication failure the server gives.
        "authentication refused": base.set(username="no_such_user_x").render_as_string(False),
        "bad URL": "postgresql://someone@db.example:notaport/chat",
        "unsupported database": "mysql://someone@db.example/chat",
        "bad sslmode": f"{postgres_url}?sslmode=bogus",
    }


@pytest.mark.postgres
@pytest.mark.parametrize("form", ["userinfo", "query"])
def test_no_error_shows_the_password(
    form: str, postgres_server: PostgresServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    for case, bad in _error_urls(postgres_server.url_for("postgres")).items():
        secret_url = with_password(bad, form)
        for command in ERROR_COMMANDS:
            result = _invoke(["--url", secret_url, *command])
            assert result.exit_code in (1, 2), f"{case} {command}: {result.output}"
            _check(result, f"{case}: {' '.join(command)}", caplog)
        # And the library's own errors, with their whole chain of causes.
        with pytest.raises(RepoError) as raised:
            open_repository(secret_url).close()
        assert_no_secret("".join(traceback.format_exception(raised.value)), f"{case}: open")


def test_safe_url_masks_the_password_wherever_it_is() -> None:
    cases = {
        "postgresql://u:S3cr3t-pw@h/d": "postgresql://u:***@h/d",
        "postgresql://u@h/d?password=S3cr3t-pw": "postgresql://u@h/d?password=***",
        "postgresql://u@h/d?PassWord=S3cr3t-pw&sslmode=require": (
            "postgresql://u@h/d?PassWord=***&sslmode=require"
        ),
        "postgresql://u@h/d?sslpassword=S3cr3t-pw": "postgresql://u@h/d?sslpassword=***",
        "postgresql://u@h/d?options=-c%20password%3DS3cr3t-pw": (
            "postgresql://u@h/d?options=-c+password%3D***"
        ),
        "host=db user=u password=S3cr3t-pw dbname=chat": (
            "host=db user=u password=*** dbname=chat"
        ),
        "host=db password='S3cr3t-pw with space'": "host=db password=***",
        "sqlite:////var/lib/chat.db": "sqlite:////var/lib/chat.db",
        "/var/lib/chat.db": "/var/lib/chat.db",
    }
    for url, shown in cases.items():
        assert safe_url(url) == shown, url


def test_a_query_password_is_the_urls_password_once_normalized() -> None:
    # So SQLAlchemy's own reprs (of the URL, of an engine) mask it too.
    url = normalize_url("postgresql://u@h/d?password=S3cr3t-pw&sslmode=require")

    assert url.password == "S3cr3t-pw"
    assert dict(url.query) == {"sslmode": "require"}
    assert "S3cr3t-pw" not in repr(url)


@pytest.mark.postgres
@pytest.mark.parametrize("form", ["userinfo", "query"])
def test_no_repr_shows_the_password(
    form: str, postgres_server: PostgresServer, event_loop_thread: Any
) -> None:
    name = postgres_server.new_database()
    try:
        _reprs(with_password(postgres_server.url_for(name), form), event_loop_thread)
    finally:
        postgres_server.drop(name)


def _reprs(url: str, event_loop_thread: Any) -> None:
    repository = open_repository(url)
    writer = TranscriptWriter(repository, outbox_url=url)
    try:
        for value in (repository, repository.database, repository.database.engine, writer):
            assert_no_secret(repr(value), f"repr of {type(value).__name__}")
            assert "***" in repr(value), repr(value)
        assert_no_secret(repository.display_url, "display_url")
    finally:
        writer.close()
        repository.close()

    async def both() -> AsyncSessionRepository:
        return await open_async_repository(url)

    async_repository = event_loop_thread.run(both())
    try:
        assert_no_secret(repr(async_repository), "repr of AsyncSessionRepository")
        assert "***" in repr(async_repository)
    finally:
        event_loop_thread.run(async_repository.close())


def test_a_sqlite_database_repr_names_its_file(tmp_path: Path) -> None:
    database = Database(str(tmp_path / "x.db"))
    try:
        assert repr(database) == f"Database(sqlite+pysqlite:///{tmp_path / 'x.db'})"
    finally:
        database.dispose()
