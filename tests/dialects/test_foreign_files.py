"""Files that are not sessionrepo's, files that are not there, and the files sessionrepo
makes (issue 12, point 4 and the outbox-file parts of point 8).

What a user relies on:

- pointed at another application's SQLite file, every command (and the library's open)
  says "PATH is not a sessionrepo database" and leaves the file exactly as it was: same
  bytes, same modification time, same journal mode, same tables, no ``-wal``/``-shm``;
- a read command (and ``doctor``) never creates, migrates or converts anything: a missing
  file stays missing, an empty or out-of-date store stays as it is (on PostgreSQL too);
- an outbox path that is a symbolic link is refused, dangling or not, and nothing is made
  at its target; another application's file is refused as an outbox too;
- what sessionrepo creates (the store and its ``-wal``/``-shm``, the outbox, exports,
  prune exports, import reports) is readable by its owner only (0600).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import sqlite3
import stat
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from sqlalchemy import inspect, text

from sessionrepo import (
    AsyncTranscriptWriter,
    InvalidArgument,
    Message,
    NotARepository,
    RepoError,
    SchemaOutOfDate,
    TranscriptWriter,
    open_async_repository,
    open_repository,
)
from sessionrepo.cli import main
from sessionrepo.outbox.writer import open_outbox_database
from sessionrepo.store.database import Database
from sessionrepo.store.schema import current_revision, downgrade, head_revision

from support.hermes_fixtures import HermesDB


def _run(*args: str) -> Result:
    # The tests choose every database: nothing comes from the environment.
    return CliRunner().invoke(
        main,
        list(args),
        env={
            "SESSIONREPO_DATABASE_URL": None,
            "SESSIONREPO_OUTBOX_URL": None,
            "SESSIONREPO_CONSOLE_TOKEN": None,
        },
    )


def _refused(result: Result) -> str:
    """The command failed with one clean line (no traceback, no library exception)."""
    assert result.exit_code != 0, result.output
    assert "Traceback" not in result.output
    assert not isinstance(result.exception, RepoError), result.exception
    return result.output


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@dataclass(frozen=True)
class Fingerprint:
    """Everything a read-only command must leave as it found it."""

    digest: str
    mtime_ns: int
    size: int
    journal_mode: str
    tables: tuple[str, ...]
    neighbours: tuple[str, ...]


def fingerprint(path: Path) -> Fingerprint:
    data = path.read_bytes()
    status = path.stat()
    # The header's read/write versions say WAL (2) or a rollback journal (1).
    journal = "wal" if data[18:20] == b"\x02\x02" else "rollback"
    # immutable=1: this look itself can neither write nor create a -wal/-shm.
    conn = sqlite3.connect(f"{path.as_uri()}?immutable=1", uri=True)
    try:
        tables = tuple(
            name
            for (name,) in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"
            )
        )
    finally:
        conn.close()
    return Fingerprint(
        digest=hashlib.sha256(data).hexdigest(),
        mtime_ns=status.st_mtime_ns,
        size=status.st_size,
        journal_mode=journal,
        tables=tables,
        neighbours=tuple(sorted(p.name for p in path.parent.glob(f"{path.name}*"))),
    )


def _app_with_messages(path: Path) -> Path:
    """An application's own database, with a ``messages`` table of its own."""
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE messages (id INTEGER PRIMARY KEY, body TEXT NOT NULL)")
    conn.execute("INSERT INTO messages (body) VALUES ('the app''s own row')")
    conn.commit()
    conn.close()
    return path


def _app_with_other_tables(path: Path) -> Path:
    """A non-empty database with tables sessionrepo has never heard of (and an Alembic
    revision of its own)."""
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, text TEXT)")
    conn.execute("CREATE TABLE alembic_version (version_num VARCHAR(32) PRIMARY KEY)")
    conn.execute("INSERT INTO alembic_version VALUES ('a1b2c3d4e5f6')")
    conn.commit()
    conn.close()
    return path


FOREIGN_KINDS = {"messages": _app_with_messages, "other-tables": _app_with_other_tables}


@pytest.fixture(params=sorted(FOREIGN_KINDS))
def foreign(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    folder = tmp_path / "app"
    folder.mkdir()
    return FOREIGN_KINDS[request.param](folder / "app.db")


@pytest.fixture
def export_file(tmp_path: Path) -> Path:
    """A valid (empty) export, for ``import``."""
    store = tmp_path / "source.db"
    _ok(_run("--url", str(store), "migrate"))
    path = tmp_path / "empty.jsonl"
    _ok(_run("--url", str(store), "export", str(path)))
    return path


def _ok(result: Result) -> Result:
    assert result.exit_code == 0, result.output
    return result


def _every_command(tmp: Path, export: Path) -> list[list[str]]:
    """Each command of the CLI that opens the store, with arguments that would work on a
    sessionrepo store (the output files are new paths)."""
    return [
        ["sessions", "list"],
        ["sessions", "show", "s"],
        ["sessions", "end", "s", "--reason", "done"],
        ["sessions", "rewind", "s", "--to-seq", "1"],
        ["sessions", "clear", "s"],
        ["sessions", "fork", "s", "--at-seq", "1", "--new-id", "t"],
        ["search", "hello"],
        ["reindex"],
        ["doctor"],
        ["migrate"],
        ["outbox", "status"],
        ["outbox", "drain"],
        ["outbox", "retry-dead"],
        ["export", str(tmp / "out.jsonl")],
        ["import", str(export)],
        ["prune", "--older-than", "1d"],
        ["serve", "--port", "1"],
    ]


def test_every_command_refuses_a_foreign_file_and_leaves_it_as_it_was(
    foreign: Path, export_file: Path, tmp_path: Path
) -> None:
    before = fingerprint(foreign)
    assert before.journal_mode == "rollback"
    for command in _every_command(tmp_path, export_file):
        output = _refused(_run("--url", str(foreign), *command))
        assert f"{foreign} is not a sessionrepo database" in output, (command, output)
        assert fingerprint(foreign) == before, command
    assert not (tmp_path / "out.jsonl").exists()


def test_import_hermes_and_demo_refuse_a_foreign_target(foreign: Path, tmp_path: Path) -> None:
    hermes = HermesDB(tmp_path / "state.db")
    hermes.session("h1")
    hermes.message("h1", "user", "hi")
    hermes.close()
    before = fingerprint(foreign)
    output = _refused(_run("import-hermes", "--url", str(foreign), str(tmp_path / "state.db")))
    assert f"{foreign} is not a sessionrepo database" in output
    assert fingerprint(foreign) == before
    # demo's --path must not exist at all: another application's file is never touched.
    _refused(_run("demo", "--path", str(foreign)))
    assert fingerprint(foreign) == before


def test_a_foreign_outbox_file_is_refused_by_every_outbox_command(
    foreign: Path, tmp_path: Path
) -> None:
    primary = tmp_path / "store.db"
    _ok(_run("--url", str(primary), "migrate"))
    before = fingerprint(foreign)
    for command in (["status"], ["drain"], ["retry-dead"]):
        result = _run("--url", str(primary), "outbox", "--outbox-url", str(foreign), *command)
        assert f"{foreign} is not a sessionrepo database" in _refused(result), command
        assert fingerprint(foreign) == before, command
    report = _run("--url", str(primary), "doctor", "--outbox-url", str(foreign), "--json")
    assert f"{foreign} is not a sessionrepo database" in report.output
    assert fingerprint(foreign) == before


def test_a_file_that_is_not_sqlite_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "notes.db"
    path.write_text("dear diary\n" * 100)
    before = path.read_bytes()
    for command in (["sessions", "list"], ["migrate"], ["sessions", "end", "s", "--reason", "x"]):
        output = _refused(_run("--url", str(path), *command))
        assert f"{path} is not a sessionrepo database (not a SQLite database)" in output
    assert path.read_bytes() == before


def test_read_commands_never_create_a_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "typo" / "store.db"
    for command in (
        ["sessions", "list"],
        ["sessions", "show", "s"],
        ["search", "hello"],
        ["export", str(tmp_path / "out.jsonl")],
        ["outbox", "status"],
        ["doctor"],
        ["serve", "--port", "1"],
    ):
        output = _refused(_run("--url", str(missing), *command))
        assert str(missing) in output, command
    store = tmp_path / "store.db"
    _ok(_run("--url", str(store), "migrate"))
    outbox = tmp_path / "typo" / "outbox.db"
    result = _run("--url", str(store), "outbox", "--outbox-url", str(outbox), "status")
    assert str(outbox) in _refused(result)
    assert not missing.parent.exists()
    assert not (tmp_path / "out.jsonl").exists()


def test_read_commands_leave_an_empty_file_empty_and_migrate_adopts_it(tmp_path: Path) -> None:
    empty = tmp_path / "new.db"
    empty.touch()
    before = fingerprint(empty)
    for command in (
        ["sessions", "list"],
        ["sessions", "show", "s"],
        ["export", str(tmp_path / "out.jsonl")],
        ["outbox", "status"],
    ):
        output = _refused(_run("--url", str(empty), *command))
        assert "empty (no schema)" in output, command
        assert "sessionrepo migrate" in output, command
        assert fingerprint(empty) == before, command
    assert "empty database" in _run("--url", str(empty), "doctor").output
    assert fingerprint(empty) == before
    # The explicit step adopts it (an empty file holds nobody's data).
    _ok(_run("--url", str(empty), "migrate"))
    database = Database(f"sqlite:///{empty}", read_only=True)
    assert current_revision(database) == head_revision()
    database.dispose()
    assert fingerprint(empty).journal_mode == "wal"


def test_read_commands_leave_a_store_as_they_found_it(tmp_path: Path) -> None:
    store = tmp_path / "store.db"
    with open_repository(str(store)) as repository:
        repository.append("s", [Message(role="user", content="hello dog")])
        repository.search("dog")  # index the backlog: nothing left for a reader to do
    before = fingerprint(store)
    for command in (
        ["sessions", "list"],
        ["sessions", "show", "s"],
        ["export", str(tmp_path / "out.jsonl")],
        ["outbox", "status"],
        ["doctor"],
        ["search", "dog"],
    ):
        _ok(_run("--url", str(store), *command))
        after = fingerprint(store)
        assert (after.digest, after.mtime_ns, after.tables) == (
            before.digest,
            before.mtime_ns,
            before.tables,
        ), command


def test_read_commands_never_migrate_an_old_store(tmp_path: Path) -> None:
    store = tmp_path / "store.db"
    _ok(_run("--url", str(store), "migrate"))
    database = Database(f"sqlite:///{store}")
    downgrade(database, "-1")
    old = current_revision(database)
    database.dispose()
    assert old != head_revision()
    for command in (["sessions", "list"], ["export", str(tmp_path / "o.jsonl")]):
        output = _refused(_run("--url", str(store), *command))
        assert f"at revision {old}" in output, command
    _run("--url", str(store), "doctor")
    database = Database(f"sqlite:///{store}", read_only=True)
    assert current_revision(database) == old
    database.dispose()


# -- the library ----------------------------------------------------------------------


@pytest.mark.parametrize("read_only", [False, True])
def test_open_repository_refuses_a_foreign_file(foreign: Path, read_only: bool) -> None:
    before = fingerprint(foreign)
    with pytest.raises(NotARepository, match="is not a sessionrepo database") as caught:
        open_repository(str(foreign), read_only=read_only)
    assert caught.value.path == str(foreign)
    with pytest.raises(NotARepository, match="is not a sessionrepo database"):
        asyncio.run(open_async_repository(f"sqlite:///{foreign}", read_only=read_only))
    # Not an outage: a gateway that may start while its primary is down is refused too.
    with pytest.raises(NotARepository):
        open_repository(str(foreign), require_connection=False)
    assert fingerprint(foreign) == before


def test_open_read_only_refuses_a_missing_file_and_creates_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "store.db"
    with pytest.raises(NotARepository, match=f"no sessionrepo database at {missing}"):
        open_repository(str(missing), read_only=True)
    with pytest.raises(NotARepository, match=f"no sessionrepo database at {missing}"):
        asyncio.run(open_async_repository(str(missing), read_only=True))
    assert not missing.parent.exists()
    with pytest.raises(RepoError, match="auto_migrate"):
        open_repository(str(missing), read_only=True, auto_migrate=True)


def test_read_only_never_migrates_on_either_backend(empty_database_url: str) -> None:
    if empty_database_url.startswith("sqlite"):
        Path(empty_database_url.removeprefix("sqlite:///")).touch()
    with pytest.raises(SchemaOutOfDate, match="empty"):
        open_repository(empty_database_url, read_only=True)
    with pytest.raises(SchemaOutOfDate, match="empty"):
        asyncio.run(open_async_repository(empty_database_url, read_only=True))
    database = Database(empty_database_url, read_only=True)
    try:
        assert current_revision(database) is None
        assert database.read(lambda conn: inspect(conn).get_table_names()) == []
    finally:
        database.dispose()


def test_a_read_only_repository_reads_and_refuses_writes(database_url: str) -> None:
    with open_repository(database_url) as writer:
        writer.append("s", [Message(role="user", content="hello dog")])
        writer.search("dog")  # indexed by the writer's side
    repository = open_repository(database_url, read_only=True)
    try:
        assert [m.content for m in repository.load_transcript("s")] == ["hello dog"]
        assert [hit.session_id for hit in repository.search("dog")] == ["s"]
        with pytest.raises(RepoError, match="read-only"):
            repository.append("s", [Message(role="user", content="more")])
        with pytest.raises(RepoError, match="read-only"):
            repository.end_session("s", "done")
        # The database itself refuses too, for a write that bypassed the check.
        with pytest.raises(RepoError, match=r"(?i)read.?only"):
            repository.database._run(
                repository.database.engine,
                lambda conn: conn.execute(text("DELETE FROM sessions")),
                reading=False,
            )
        # A writer over it could only park what it can never write: refused up front.
        with pytest.raises(InvalidArgument, match="read_only"):
            TranscriptWriter(repository)
    finally:
        repository.close()
    with open_repository(database_url) as check:
        assert check.get_session("s").message_count == 1


def test_a_read_only_async_repository_refuses_writes(database_url: str) -> None:
    async def scenario() -> None:
        repository = await open_async_repository(database_url, read_only=True)
        try:
            assert (await repository.list_sessions()).sessions == []
            with pytest.raises(RepoError, match="read-only"):
                await repository.append("s", [Message(role="user", content="hi")])
            with pytest.raises(InvalidArgument, match="read_only"):
                AsyncTranscriptWriter(repository)
        finally:
            await repository.close()

    asyncio.run(scenario())


# -- the outbox file ------------------------------------------------------------------


@pytest.fixture
def store(tmp_path: Path) -> str:
    path = tmp_path / "store.db"
    _ok(_run("--url", str(path), "migrate"))
    return f"sqlite:///{path}"


def test_a_dangling_symlink_at_the_outbox_path_is_refused(store: str, tmp_path: Path) -> None:
    target = tmp_path / "elsewhere" / "outbox.db"
    target.parent.mkdir()
    link = tmp_path / "outbox.db"
    link.symlink_to(target)
    with (
        open_repository(store) as repository,
        pytest.raises(NotARepository, match="symbolic link"),
    ):
        TranscriptWriter(repository, outbox_url=str(link))
    # The command sees no file behind the link (its own check comes first): refused too.
    for command in (["status"], ["drain"]):
        result = _run("--url", store, "outbox", "--outbox-url", str(link), *command)
        assert str(link) in _refused(result)
    assert not target.exists()
    assert link.is_symlink()


def test_a_symlink_to_a_real_outbox_is_refused(store: str, tmp_path: Path) -> None:
    real = tmp_path / "real-outbox.db"
    with open_repository(store) as repository:
        TranscriptWriter(repository, outbox_url=str(real)).close()
        link = tmp_path / "link.db"
        link.symlink_to(real)
        before = fingerprint(real)
        with pytest.raises(NotARepository, match="symbolic link"):
            TranscriptWriter(repository, outbox_url=f"sqlite:///{link}")
    for command in (["status"], ["retry-dead"]):
        result = _run("--url", store, "outbox", "--outbox-url", str(link), *command)
        assert "symbolic link" in _refused(result)
    assert fingerprint(real) == before


def test_a_foreign_outbox_file_is_refused_by_the_writer(store: str, foreign: Path) -> None:
    before = fingerprint(foreign)
    with (
        open_repository(store) as repository,
        pytest.raises(NotARepository, match="is not a sessionrepo database"),
    ):
        TranscriptWriter(repository, outbox_url=str(foreign))
    with pytest.raises(NotARepository, match="is not a sessionrepo database"):
        open_outbox_database(str(foreign), read_only=True)
    assert fingerprint(foreign) == before


def test_the_async_writer_refuses_a_foreign_outbox_on_first_use(store: str, foreign: Path) -> None:
    before = fingerprint(foreign)

    async def scenario() -> None:
        repository = await open_async_repository(store)
        try:
            # The asyncio writer opens its outbox where no I/O may happen: checked on
            # the first call that reaches it, which raises (the caller keeps the batch).
            writer = AsyncTranscriptWriter(repository, outbox_url=str(foreign))
            with pytest.raises(NotARepository, match="is not a sessionrepo database"):
                await writer.write("s", [Message(role="user", content="hi")])
            await writer.close()
        finally:
            await repository.close()

    asyncio.run(scenario())
    assert fingerprint(foreign) == before


def test_an_outbox_that_cannot_be_created_is_a_repo_error(store: str) -> None:
    # A configuration error (InvalidArgument), not "retry later": see test_outbox_files.
    with (
        open_repository(store) as repository,
        pytest.raises(InvalidArgument, match=r"the outbox file /proc/x/o\.db cannot be created"),
    ):
        TranscriptWriter(repository, outbox_url="sqlite:////proc/x/o.db")
    with pytest.raises(RepoError, match="cannot create the SQLite file"):
        open_repository("sqlite:////proc/x/store.db")


# -- file modes -----------------------------------------------------------------------


def test_files_sessionrepo_creates_are_private(tmp_path: Path) -> None:
    old_umask = os.umask(0o022)  # the usual one, which would give 0644
    try:
        primary = tmp_path / "data" / "store.db"
        outbox = tmp_path / "spool" / "outbox.db"
        with open_repository(str(primary)) as repository:
            writer = TranscriptWriter(repository, outbox_url=str(outbox))
            writer.write("s", [Message(role="user", content="private words")])
            try:
                # While both are open, each has its -wal and -shm: SQLite gives them
                # the main file's mode.
                made = [
                    Path(f"{path}{suffix}")
                    for path in (primary, outbox)
                    for suffix in ("", "-wal", "-shm")
                ]
                assert {path: _mode(path) for path in made} == dict.fromkeys(made, 0o600)
            finally:
                writer.close()
        migrated = tmp_path / "migrated.db"
        _ok(_run("--url", str(migrated), "migrate"))
        assert _mode(migrated) == 0o600
        assert _mode(primary.parent) == 0o700

        export = tmp_path / "backup.jsonl"
        _ok(_run("--url", str(primary), "export", str(export)))
        assert _mode(export) == 0o600
        _ok(_run("--url", str(primary), "sessions", "end", "s", "--reason", "done"))
        pruned = tmp_path / "pruned.jsonl"
        _ok(_run("--url", str(primary), "prune", "--older-than", "0s", "--export", str(pruned)))
        assert _mode(pruned) == 0o600
        assert pruned.stat().st_size > 0

        hermes = HermesDB(tmp_path / "state.db")
        hermes.session("h1")
        hermes.message("h1", "user", "hi")
        hermes.close()
        report = tmp_path / "import-report.json"
        result = _run(
            "import-hermes", "--url", str(primary), "--report", str(report), str(hermes.path)
        )
        assert report.exists(), result.output
        assert _mode(report) == 0o600
    finally:
        os.umask(old_umask)


def test_an_existing_files_mode_is_left_alone(tmp_path: Path) -> None:
    shared = tmp_path / "shared.db"
    shared.touch(mode=0o640)
    shared.chmod(0o640)  # the owner's choice, e.g. for a group of operators
    open_repository(str(shared)).close()
    assert _mode(shared) == 0o640
