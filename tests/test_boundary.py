"""The error boundary and the contract attached to the implementations (issue 11).

Every public call asked wrongly raises a ``RepoError`` subclass that is also the
``ValueError`` or ``TypeError`` Python code expects (``InvalidArgument``,
``ArgumentTypeError``, ``InvalidMessage``), before any SQL, the same on both backends and
both APIs, and leaves the store as it was. Derived session fields cannot be set, a session
cannot end without a reason, a strict append raises ``ConflictError``, and reads never
raise ``WriteRejected``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import BlockingAsync, EventLoopThread
from sqlalchemy import Connection, text
from sqlalchemy import exc as sa_exc

import sessionrepo
from sessionrepo import (
    ArgumentTypeError,
    AsyncSessionRepository,
    AsyncTranscriptWriter,
    ConflictError,
    InvalidArgument,
    InvalidMessage,
    Message,
    NotFound,
    RepoError,
    ResilientWriter,
    SchemaOutOfDate,
    SessionRepository,
    SessionStore,
    TranscriptWriter,
    WriteRejected,
    open_async_repository,
    open_repository,
)
from sessionrepo.cli import main
from sessionrepo.store.bridge import TaskPool
from sessionrepo.store.database import Database

pytestmark = pytest.mark.contract  # every repo test runs on the sync and async API

SEQ_MAX = 2**63 - 1
DERIVED = ["message_count", "tool_call_count", "next_seq", "last_active_at"]
DERIVED_VALUES = {
    "message_count": 1000,
    "tool_call_count": 7,
    "next_seq": 99,
    "last_active_at": datetime(2026, 1, 1, tzinfo=UTC),
}


def _stored(repo: Any) -> list[tuple[Any, list[Any]]]:
    """Everything the store holds, through the public API."""
    return [
        (session, repo.load_transcript(session.id))
        for session in repo.list_sessions(limit=1000).sessions
    ]


def _raises(kind: type[RepoError], call: Callable[[], object]) -> RepoError:
    """``call()`` raises exactly ``kind`` (not a subclass), with the flavour promised."""
    with pytest.raises(RepoError) as raised:
        call()
    assert type(raised.value) is kind, repr(raised.value)
    if kind is ArgumentTypeError:
        assert isinstance(raised.value, TypeError)
    if issubclass(kind, InvalidArgument):
        assert isinstance(raised.value, ValueError)
    return raised.value


@pytest.fixture
def seeded(repo: Any) -> Any:
    """A store with one session of three messages (and nothing else)."""
    repo.create_session("s", source="cli", user_id="u1")
    repo.append("s", [Message(role="user", content=f"hello {i}") for i in range(3)])
    return repo


# -- transcript cursors --------------------------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "kind"),
    [
        ({"after_seq": 2**64}, InvalidArgument),  # a bare OverflowError on SQLite before
        ({"after_seq": SEQ_MAX + 1}, InvalidArgument),
        ({"after_seq": -1}, InvalidArgument),
        ({"before_seq": 2**64}, InvalidArgument),
        ({"before_seq": -5}, InvalidArgument),
        ({"after_seq": "x"}, ArgumentTypeError),  # an empty page on SQLite before
        ({"after_seq": "1"}, ArgumentTypeError),
        ({"after_seq": True}, ArgumentTypeError),
        ({"after_seq": 1.0}, ArgumentTypeError),
        ({"before_seq": b"2"}, ArgumentTypeError),
        ({"limit": 0}, InvalidArgument),
        ({"limit": -1}, InvalidArgument),
        ({"limit": 2**64}, InvalidArgument),
        ({"limit": "10"}, ArgumentTypeError),
        ({"limit": True}, ArgumentTypeError),
        ({"include_ancestors": "yes"}, ArgumentTypeError),
        ({"include_ancestors": True, "after_seq": 1}, InvalidArgument),
    ],
)
def test_a_bad_transcript_cursor_is_an_argument_error(
    seeded: Any, arguments: dict[str, Any], kind: type[RepoError]
) -> None:
    before = _stored(seeded)
    error = _raises(kind, lambda: seeded.load_transcript("s", **arguments))
    assert error.field in arguments  # type: ignore[attr-defined]
    # Checked before any SQL: an unknown session is not even looked up.
    _raises(kind, lambda: seeded.load_transcript("nope", **arguments))
    assert _stored(seeded) == before


def test_the_edges_of_the_seq_range_are_valid_cursors(seeded: Any) -> None:
    assert [m.seq for m in seeded.load_transcript("s", after_seq=0)] == [1, 2, 3]
    assert seeded.load_transcript("s", after_seq=SEQ_MAX) == []
    assert seeded.load_transcript("s", before_seq=0) == []
    assert [m.seq for m in seeded.load_transcript("s", before_seq=SEQ_MAX, limit=2)] == [2, 3]
    assert len(seeded.load_transcript("s", limit=SEQ_MAX)) == 3


@pytest.mark.parametrize(
    ("session_id", "kind"),
    [(5, ArgumentTypeError), (None, ArgumentTypeError), ("", InvalidMessage)],
)
def test_a_bad_session_id_is_refused_by_reads_and_writes_alike(
    seeded: Any, session_id: Any, kind: type[RepoError]
) -> None:
    before = _stored(seeded)
    calls: list[Callable[[], object]] = [
        lambda: seeded.get_session(session_id),
        lambda: seeded.load_transcript(session_id),
        lambda: seeded.resolve_tip(session_id),
        lambda: seeded.session_chain(session_id),
        lambda: seeded.reopen_session(session_id),
        lambda: seeded.end_session(session_id, "done"),
        lambda: seeded.create_session(session_id),
        lambda: seeded.append(session_id, [Message(role="user", content="x")]),
    ]
    if session_id is not None:  # None is search's "every session"
        calls.append(lambda: seeded.search("hello", session_id=session_id))
    for call in calls:
        assert _raises(kind, call).field == "session_id"  # type: ignore[attr-defined]
    assert _stored(seeded) == before


# -- listing and search --------------------------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "kind"),
    [
        ({"limit": 0}, InvalidArgument),
        ({"limit": 1001}, InvalidArgument),
        ({"limit": "5"}, ArgumentTypeError),
        ({"limit": True}, ArgumentTypeError),
        ({"status": "closed"}, InvalidArgument),
        ({"source": 5}, ArgumentTypeError),
        ({"source": "a\x00b"}, InvalidArgument),  # a data error on PostgreSQL before
        ({"user_id": ""}, InvalidArgument),
        ({"cursor": 5}, ArgumentTypeError),
        ({"cursor": "not-a-cursor"}, InvalidArgument),
    ],
)
def test_a_bad_listing_is_an_argument_error(
    seeded: Any, arguments: dict[str, Any], kind: type[RepoError]
) -> None:
    before = _stored(seeded)
    _raises(kind, lambda: seeded.list_sessions(**arguments))
    assert _stored(seeded) == before


@pytest.mark.parametrize(
    ("arguments", "kind"),
    [
        ({"query": 5}, ArgumentTypeError),
        ({"limit": 0}, InvalidArgument),
        ({"limit": 1001}, InvalidArgument),
        ({"limit": 2.0}, ArgumentTypeError),
        ({"order": "best"}, InvalidArgument),
        ({"cursor": -1}, InvalidArgument),
        ({"cursor": "x"}, InvalidArgument),
        ({"cursor": "-1"}, InvalidArgument),
        ({"cursor": [1]}, ArgumentTypeError),  # a bare TypeError before
        ({"cursor": 1.5}, ArgumentTypeError),
        ({"cursor": 2**64}, InvalidArgument),
        ({"since": "yesterday"}, ArgumentTypeError),
        ({"since": True}, ArgumentTypeError),
        ({"until": datetime(2026, 1, 1)}, InvalidArgument),  # naive
        ({"until": float("nan")}, InvalidArgument),
        ({"role": 5}, ArgumentTypeError),
        ({"source": "\x1b"}, InvalidArgument),
        ({"user_id": []}, ArgumentTypeError),
    ],
)
def test_a_bad_search_is_an_argument_error(
    seeded: Any, arguments: dict[str, Any], kind: type[RepoError]
) -> None:
    before = _stored(seeded)
    arguments = dict(arguments)  # shared by the parametrized runs
    query = arguments.pop("query", "hello")
    _raises(kind, lambda: seeded.search(query, **arguments))
    assert _stored(seeded) == before
    assert len(seeded.search("hello", cursor="1")) == 2  # a command line's cursor still works


def test_bad_index_maintenance_arguments_are_argument_errors(seeded: Any) -> None:
    _raises(ArgumentTypeError, lambda: seeded.reindex(progress=5))
    _raises(InvalidArgument, lambda: seeded.catch_up_search_index(limit=0))
    _raises(ArgumentTypeError, lambda: seeded.catch_up_search_index(limit="10"))
    assert seeded.search_index_state() == ("ok", None)


# -- derived fields, reasons, conflicts ----------------------------------------------


@pytest.mark.parametrize("name", DERIVED)
def test_create_session_refuses_derived_fields(repo: Any, name: str) -> None:
    error = _raises(
        InvalidMessage, lambda: repo.create_session("s", **{name: DERIVED_VALUES[name]})
    )
    assert error.field == f"session.{name}"  # type: ignore[attr-defined]
    with pytest.raises(NotFound):
        repo.get_session("s")

    repo.append("s", [Message(role="user", content="hi")])
    before = _stored(repo)
    _raises(InvalidMessage, lambda: repo.create_session("s", **{name: DERIVED_VALUES[name]}))
    assert _stored(repo) == before
    assert repo.get_session("s").message_count == 1


@pytest.mark.parametrize("name", DERIVED)
def test_append_refuses_derived_session_defaults(repo: Any, name: str) -> None:
    def append() -> object:
        batch = [Message(role="user", content="hi")]
        return repo.append("s", batch, **{name: DERIVED_VALUES[name]})

    error = _raises(InvalidMessage, append)
    assert error.field == f"session_defaults.{name}"  # type: ignore[attr-defined]
    with pytest.raises(NotFound):
        repo.get_session("s")

    repo.append("s", [Message(role="user", content="first")])
    before = _stored(repo)
    _raises(InvalidMessage, append)
    assert _stored(repo) == before
    assert repo.get_session("s").message_count == 1  # not 1001


@pytest.mark.parametrize(
    ("reason", "kind"),
    [
        (None, ArgumentTypeError),
        (5, ArgumentTypeError),
        ("", InvalidMessage),
        ("done\x00", InvalidMessage),
        ("x" * 1025, InvalidMessage),
    ],
)
def test_a_session_ends_only_with_a_reason(repo: Any, reason: Any, kind: type[RepoError]) -> None:
    repo.create_session("s")
    error = _raises(kind, lambda: repo.end_session("s", reason))
    assert error.field == "reason"  # type: ignore[attr-defined]
    session = repo.get_session("s")
    assert session.is_open
    assert session.end_reason is None
    _raises(kind, lambda: repo.end_session("nope", reason))  # before looking it up

    assert repo.end_session("s", "x" * 1024) is True


def test_a_strict_append_raises_conflict_error_and_writes_nothing(repo: Any) -> None:
    stored = Message(role="user", content="what was said")
    repo.append("s", [stored])
    before = _stored(repo)
    changed = stored.model_copy(update={"content": "something else"})
    fresh = Message(role="assistant", content="new")

    with pytest.raises(ConflictError) as raised:
        repo.append("s", [fresh, changed], on_conflict="raise")

    assert raised.value.session_id == "s"
    assert raised.value.conflicts == [stored.client_msg_uuid]
    assert _stored(repo) == before  # the new message did not land either
    # The default reports instead, and stores the rest.
    result = repo.append("s", [fresh, changed])
    assert (result.inserted, result.conflicts) == (
        [fresh.client_msg_uuid],
        [changed.client_msg_uuid],
    )
    # Duplicates are no conflict, strict or not.
    assert repo.append("s", [stored, fresh], on_conflict="raise").duplicates == [
        stored.client_msg_uuid,
        fresh.client_msg_uuid,
    ]


def test_a_strict_append_that_creates_the_session_rolls_its_creation_back_too(
    repo: Any,
) -> None:
    message = Message(role="user", content="a")
    changed = message.model_copy(update={"content": "b"})
    with pytest.raises(ConflictError):
        repo.append("s", [message, changed], on_conflict="raise", source="cli")
    with pytest.raises(NotFound):
        repo.get_session("s")


def test_on_conflict_takes_only_report_or_raise(repo: Any) -> None:
    for value, kind in (("ignore", InvalidArgument), (True, InvalidArgument)):
        _raises(
            kind,
            lambda value=value: repo.append(
                "s", [Message(role="user", content="x")], on_conflict=value
            ),
        )
    with pytest.raises(NotFound):
        repo.get_session("s")


# -- the writer ----------------------------------------------------------------------


@pytest.fixture
def writer(repo: Any, api: str, request: pytest.FixtureRequest) -> Iterator[Any]:
    """A ``TranscriptWriter`` over ``repo`` (its outbox in the same database), on the
    test's API."""
    if api == "sync":
        sync = TranscriptWriter(repo)
        yield sync
        sync.close()
        return
    loop: EventLoopThread = request.getfixturevalue("event_loop_thread")

    async def make() -> AsyncTranscriptWriter:
        return AsyncTranscriptWriter(repo._target)

    async_writer = loop.run(make())
    yield BlockingAsync(async_writer, loop)
    loop.run(async_writer.close())


def test_the_writers_calls_check_their_arguments(writer: Any, repo: Any) -> None:
    _raises(ArgumentTypeError, lambda: writer.pending(5))
    _raises(InvalidMessage, lambda: writer.pending(""))
    _raises(ArgumentTypeError, lambda: writer.drain(session_id=5))
    _raises(ArgumentTypeError, lambda: writer.drain(ignore_backoff=1))
    _raises(ArgumentTypeError, lambda: writer.retry_dead(["s"]))
    _raises(ArgumentTypeError, lambda: writer.write(5, [Message(role="user", content="x")]))
    _raises(InvalidArgument, lambda: writer.start(interval=0))
    _raises(ArgumentTypeError, lambda: writer.start(interval="1"))
    assert writer.pending() == 0
    assert writer.drain().remaining == 0


@pytest.mark.parametrize("name", DERIVED)
def test_the_writer_refuses_derived_session_defaults_and_parks_nothing(
    writer: Any, repo: Any, name: str
) -> None:
    def write() -> object:
        batch = [Message(role="user", content="hi")]
        return writer.write("s", batch, **{name: DERIVED_VALUES[name]})

    error = _raises(InvalidMessage, write)
    assert error.field == f"session_defaults.{name}"  # type: ignore[attr-defined]
    assert writer.pending() == 0
    with pytest.raises(NotFound):
        repo.get_session("s")


@pytest.mark.parametrize(
    ("arguments", "kind"),
    [
        ({"deadline": 0}, InvalidArgument),
        ({"deadline": "5"}, ArgumentTypeError),
        ({"max_attempts": 0}, InvalidArgument),
        ({"batch_size": 2.5}, ArgumentTypeError),
        ({"lease": -1}, InvalidArgument),
        ({"backoff_base": -0.5}, InvalidArgument),
        ({"backoff_cap": None}, ArgumentTypeError),
        ({"outbox_url": 5}, ArgumentTypeError),
    ],
)
def test_a_writer_with_bad_settings_is_not_made(
    repo: Any, api: str, request: pytest.FixtureRequest, arguments: dict[str, Any], kind: type
) -> None:
    if api == "sync":
        _raises(kind, lambda: TranscriptWriter(repo, **arguments))
        return
    loop = request.getfixturevalue("event_loop_thread")

    async def make() -> AsyncTranscriptWriter:
        return AsyncTranscriptWriter(repo._target, **arguments)

    _raises(kind, lambda: loop.run(make()))


def test_the_sync_writers_own_settings(database_url: str) -> None:
    with open_repository(database_url) as repository:
        _raises(InvalidArgument, lambda: TranscriptWriter(repository, workers=0))
        # A task pool is for a repository on an asyncio driver (AsyncTranscriptWriter).
        _raises(ArgumentTypeError, lambda: TranscriptWriter(repository, task_pool=TaskPool()))
        _raises(ArgumentTypeError, lambda: TranscriptWriter("sqlite:///x.db"))  # type: ignore[arg-type]
        with TranscriptWriter(repository) as writer:
            _raises(InvalidArgument, lambda: writer.stop(timeout=-1))
            _raises(ArgumentTypeError, lambda: writer.drain_round("1"))  # type: ignore[arg-type]


def test_the_async_classes_check_what_they_wrap(database_url: str, event_loop_thread: Any) -> None:
    with open_repository(database_url) as repository:
        _raises(ArgumentTypeError, lambda: AsyncSessionRepository(repository))
        _raises(ArgumentTypeError, lambda: AsyncTranscriptWriter(repository))  # type: ignore[arg-type]

    async def close_with(timeout: Any) -> None:
        async_repository = await open_async_repository(database_url)
        try:
            await async_repository.close(timeout=timeout)
        finally:
            await async_repository.close()

    _raises(InvalidArgument, lambda: event_loop_thread.run(close_with(-1)))


# -- opening -------------------------------------------------------------------------


BAD_OPENS = [
    ({"pool_size": "10"}, ArgumentTypeError),
    ({"pool_size": -1}, InvalidArgument),
    ({"max_overflow": 1.5}, ArgumentTypeError),
    ({"pool_timeout": 0}, InvalidArgument),
    ({"pool_pre_ping": "yes"}, ArgumentTypeError),
    ({"busy_timeout": "10"}, ArgumentTypeError),
    ({"busy_timeout": float("nan")}, InvalidArgument),
    ({"sqlite_synchronous": "SOMETIMES"}, InvalidArgument),
    ({"sqlite_synchronous": 2}, ArgumentTypeError),
    ({"connect_timeout": 0}, InvalidArgument),
    ({"search_config": ""}, InvalidArgument),
    ({"attempts": 0}, InvalidArgument),
    ({"attempts": "8"}, ArgumentTypeError),
    ({"no_such_option": 1}, ArgumentTypeError),  # SQLAlchemy's TypeError before
    ({"search_index": "later"}, InvalidArgument),
    ({"search_index": 1}, InvalidArgument),
    ({"auto_migrate": "yes"}, ArgumentTypeError),
    ({"require_connection": None}, ArgumentTypeError),
]


@pytest.fixture(params=["sync", pytest.param("async", marks=pytest.mark.asyncapi)])
def opener(request: pytest.FixtureRequest) -> Callable[..., None]:
    """Opens (and closes) a repository with the given arguments, on one API."""
    if request.param == "sync":

        def open_sync(url: Any, **arguments: Any) -> None:
            open_repository(url, **arguments).close()

        return open_sync
    loop = request.getfixturevalue("event_loop_thread")

    def open_async(url: Any, **arguments: Any) -> None:
        async def run() -> None:
            await (await open_async_repository(url, **arguments)).close()

        loop.run(run())

    return open_async


@pytest.mark.parametrize(("arguments", "kind"), BAD_OPENS)
def test_bad_open_arguments_are_argument_errors_and_open_nothing(
    opener: Callable[..., None],
    empty_database_url: str,
    arguments: dict[str, Any],
    kind: type[RepoError],
) -> None:
    error = _raises(kind, lambda: opener(empty_database_url, **{"auto_migrate": True, **arguments}))
    (name,) = arguments
    assert error.field in (name, f"options.{name}")  # type: ignore[attr-defined]
    # Nothing was migrated: the database is still empty.
    with pytest.raises(SchemaOutOfDate):
        opener(empty_database_url, auto_migrate=False)


def test_a_url_that_is_not_one_is_an_argument_error(opener: Callable[..., None]) -> None:
    _raises(ArgumentTypeError, lambda: opener(5))
    _raises(ArgumentTypeError, lambda: opener(b"sqlite:///x.db"))
    for url in ["postgresql://app:s3cret@[::1", "mysql://app@db/chat"]:
        error = _raises(InvalidArgument, lambda url=url: opener(url))
        assert error.field == "url"  # type: ignore[attr-defined]
        assert "s3cret" not in str(error)


def test_a_fractional_connect_timeout_is_rounded_up_never_to_wait_forever() -> None:
    """libpq takes whole seconds and reads 0 as "no limit"."""
    from sqlalchemy import event

    from sessionrepo.dialects import dialect_for, normalize_url

    engine = dialect_for("postgresql").create_engine(
        normalize_url("postgresql://app@127.0.0.1/chat"), {"connect_timeout": 0.5}
    )
    sent: dict[str, Any] = {}

    @event.listens_for(engine, "do_connect")
    def capture(dialect: Any, record: Any, cargs: Any, cparams: dict[str, Any]) -> None:
        sent.update(cparams)
        raise ConnectionAbortedError  # what libpq would be given is all this test needs

    try:
        with pytest.raises(ConnectionAbortedError):
            engine.connect()
    finally:
        engine.dispose()
    assert sent["connect_timeout"] == 1


# -- reads never raise WriteRejected -------------------------------------------------

#: A statement each backend refuses for its data (SQLITE_TOOBIG, SQLSTATE 22012): a
#: write that runs it is rejected; a read must not say "write rejected".
REFUSED = {"sqlite": "SELECT zeroblob(2000000000)", "postgres": "SELECT 1/0", "citus": "SELECT 1/0"}


def test_a_read_the_database_refuses_is_not_a_write_rejection(
    database_url: str, backend: str
) -> None:
    database = Database(database_url)
    statement = text(REFUSED[backend])

    def work(conn: Connection) -> object:
        return conn.execute(statement).all()

    try:
        with pytest.raises(WriteRejected):
            database.write(work)
        with pytest.raises(RepoError) as raised:
            database.read(work)
    finally:
        database.dispose()
    assert type(raised.value) is RepoError
    assert isinstance(raised.value.__cause__, sa_exc.DBAPIError)


def test_an_unforeseen_error_inside_a_transaction_leaves_as_a_repo_error(
    database_url: str,
) -> None:
    database = Database(database_url)

    def work(conn: Connection) -> object:
        conn.execute(text("SELECT 1"))
        raise OverflowError("Python int too large to convert to SQLite INTEGER")

    try:
        for run in (database.read, database.write):
            with pytest.raises(RepoError) as raised:
                run(work)
            assert type(raised.value) is RepoError
            assert isinstance(raised.value.__cause__, OverflowError)
    finally:
        database.dispose()


def test_the_command_line_reports_an_out_of_range_cursor_cleanly(database_url: str) -> None:
    with open_repository(database_url) as repository:
        repository.append("s", [Message(role="user", content="hi")])
    result = CliRunner().invoke(
        main,
        ["--url", database_url, "sessions", "show", "s", "--after", str(2**64)],
        env={"SESSIONREPO_DATABASE_URL": None},
    )
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    assert "after_seq" in result.stderr


# -- the contract, attached ----------------------------------------------------------


def _contract_methods(contract: type) -> list[str]:
    return [name for name in vars(contract) if not name.startswith("_")]


@pytest.mark.parametrize(
    ("implementation", "contract"),
    [(SessionRepository, SessionStore), (TranscriptWriter, ResilientWriter)],
)
def test_the_implementations_inherit_the_contract_and_its_docstrings(
    implementation: type, contract: type
) -> None:
    assert contract in implementation.__mro__  # inherited, not merely structural
    for name in _contract_methods(contract):
        documented = inspect.getdoc(getattr(contract, name))
        assert documented, f"{contract.__name__}.{name} has no docstring"
        assert inspect.getdoc(getattr(implementation, name)) == documented, name


@pytest.mark.parametrize(
    ("facade", "contract"),
    [(AsyncSessionRepository, SessionStore), (AsyncTranscriptWriter, ResilientWriter)],
)
def test_the_async_methods_show_the_contract_text(facade: type, contract: type) -> None:
    # Their own: close (it waits for running calls), start and stop (an asyncio task),
    # session_transaction (an async context manager: its own docstring says so).
    own = {"backend", "close", "start", "stop", "session_transaction"}
    for name in _contract_methods(contract):
        if name in own:
            continue
        method = getattr(facade, name)
        assert inspect.iscoroutinefunction(method), name
        assert method.__doc__ == inspect.getdoc(getattr(contract, name)), name


def test_the_result_models_stay_importable_from_their_old_modules() -> None:
    from sessionrepo.models import outbox
    from sessionrepo.outbox import table, writer

    assert writer.WriteResult is outbox.WriteResult is sessionrepo.WriteResult
    assert writer.DrainReport is outbox.DrainReport is sessionrepo.DrainReport
    assert table.OutboxStatus is outbox.OutboxStatus is sessionrepo.OutboxStatus
    assert table.SessionBacklog is outbox.SessionBacklog is sessionrepo.SessionBacklog
    for name in ("Message", "Session", "InvalidArgument", "ArgumentTypeError", "ConflictError"):
        assert name in sessionrepo.__all__
