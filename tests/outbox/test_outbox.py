"""The outbox contract: ``TranscriptWriter`` loses nothing it acknowledged, doubles
nothing, and keeps every session's order, through failures injected on demand.

Faults come from a :class:`support.outbox_workers.FlakyRepository` (a real repository whose
``append_prepared`` fails, hangs or rejects for chosen keys), from a primary URL on a
port where nothing listens, from SQLite's own ``SQLITE_FULL``, and from ``SIGKILL`` at
the writer's named steps (``fault_hook``) in child processes. Nothing sleeps and hopes:
children are released by barriers and events, kills land after counted acknowledgements.

Every contract test runs on both backends (the ``database_url`` fixture: the primary,
and the outbox when it lives there); where it matters, the outbox also lives in a
separate SQLite file. Crash and outage tests against a throwaway PostgreSQL cluster are
in ``test_outages.py``.

The outage-like tests print one figures line each (run with ``-s`` to see them):
attempted, acknowledged, rows, distinct, lost, duplicates, outbox left, dead.
"""

from __future__ import annotations

import multiprocessing
import queue
import random
import signal
import sqlite3
import stat
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import closing
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, func, select, text

from sessionrepo import (
    BackendUnavailable,
    InvalidMessage,
    Message,
    NotFound,
    SessionRepository,
    TranscriptWriter,
    WriteRejected,
    ensure_key,
    open_repository,
)
from sessionrepo.models.message import utcnow
from sessionrepo.models.tables import outbox_table

from support import outbox_workers as workers
from support.harness import SPAWN, holding_the_write_lock, until_primary_back
from support.outbox_workers import FlakyRepository, keys_of, make_message
from support.polling import eventually

#: Upper bound for anything a child process must do; a healthy run takes a second.
CHILD_TIMEOUT = 60.0
#: Upper bound for a condition the background drainer must bring about.
DRAINER_TIMEOUT = 15.0

OUTBOX_PLACES = ["primary", "sqlite-file"]


# -- fixtures and helpers -----------------------------------------------------------------


@pytest.fixture(autouse=True)
def _outbox_only_where_the_test_says(monkeypatch: pytest.MonkeyPatch) -> None:
    # ``outbox_url=None`` must mean "in the primary" here, whatever the environment.
    monkeypatch.delenv("SESSIONREPO_OUTBOX_URL", raising=False)


@pytest.fixture(params=OUTBOX_PLACES)
def outbox_url(request: pytest.FixtureRequest, database_url: str, tmp_path: Path) -> str:
    """Where the outbox lives: in the test's database, or in a separate SQLite file."""
    if request.param == "primary":
        return database_url
    return f"sqlite:///{tmp_path / 'outbox.db'}"


@pytest.fixture
def sqlite_outbox(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'outbox.db'}"


class _Resources:
    """Writers and repositories a test opens, closed at its end whatever happens."""

    def __init__(self) -> None:
        self._close: list[Callable[[], None]] = []

    def flaky(self, url: str) -> FlakyRepository:
        repository = FlakyRepository.open(url)
        self._close.append(repository.close)
        return repository

    def repository(self, url: str, **options: Any) -> SessionRepository:
        repository = open_repository(url, **options)
        self._close.append(repository.close)
        return repository

    def writer(self, repository: SessionRepository, **options: Any) -> TranscriptWriter:
        writer = TranscriptWriter(repository, **options)
        self._close.insert(0, writer.close)  # writers before the repositories they use
        return writer

    def close(self) -> None:
        for close in self._close:
            close()


@pytest.fixture
def res() -> Iterator[_Resources]:
    resources = _Resources()
    yield resources
    resources.close()


def _stored(repository: SessionRepository, session_id: str) -> list[str]:
    """The session's keys in transcript order (none when it does not exist)."""
    try:
        return [str(m.client_msg_uuid) for m in repository.load_transcript(session_id)]
    except NotFound:
        return []


def _messages(session_id: str, count: int, start: int = 0) -> list[dict[str, Any]]:
    return [make_message(session_id, index) for index in range(start, start + count)]


def _outbox_keys(writer: TranscriptWriter, state: str | None = None) -> list[str]:
    query = select(outbox_table.c.client_msg_uuid)
    if state is not None:
        query = query.where(outbox_table.c.state == state)
    rows = writer.outbox.database.read(lambda conn: conn.execute(query).scalars().all())
    return [str(key) for key in rows]


def _figures(
    label: str,
    *,
    attempted: set[str],
    acknowledged: set[str],
    stored: list[str],
    outbox_left: int,
    dead: int,
) -> None:
    """Print the figures line and assert nothing acknowledged was lost or doubled."""
    rows, distinct = len(stored), len(set(stored))
    lost = len(acknowledged - set(stored))
    duplicates = rows - distinct
    print(
        f"\n[{label}] attempted={len(attempted)} acknowledged={len(acknowledged)} "
        f"rows={rows} distinct={distinct} lost={lost} duplicates={duplicates} "
        f"outbox_left={outbox_left} dead={dead}"
    )
    assert lost == 0
    assert duplicates == 0


# -- 1. the healthy path ------------------------------------------------------------------


def test_write_stores_in_the_primary_when_it_is_healthy(
    res: _Resources, database_url: str, outbox_url: str
) -> None:
    repository = res.repository(database_url)
    writer = res.writer(repository, outbox_url=outbox_url)
    first, second, third = _messages("s", 3)

    result = writer.write("s", [first, second], source="cli", user_id="u1")

    assert result.status == "stored"
    assert [str(k) for k in result.inserted] == keys_of([first, second])
    assert result.duplicates == []
    assert result.conflicts == []
    assert result.parked == 0

    again = writer.write("s", [second, third])
    assert again.status == "stored"
    assert [str(k) for k in again.inserted] == keys_of([third])
    assert [str(k) for k in again.duplicates] == keys_of([second])

    assert _stored(repository, "s") == keys_of([first, second, third])
    session = repository.get_session("s")
    assert (session.source, session.user_id) == ("cli", "u1")
    assert writer.pending() == 0
    assert writer.write("s", []).status == "stored"


# -- 2. invalid input ---------------------------------------------------------------------


#: Bad input, as (session id, the bad message sent after a good one, the field named).
INVALID = {
    "bad-role": ("s", {"role": "wizard", "content": "hi"}, "messages[1]"),
    "lone-surrogate": ("s", {"role": "user", "content": "a\ud800b"}, "messages[1]"),
    "empty-session-id": ("", {"role": "user", "content": "fine"}, "session_id"),
}


@pytest.mark.parametrize("primary_down", [False, True], ids=["primary-up", "primary-down"])
@pytest.mark.parametrize("case", list(INVALID))
def test_invalid_input_raises_at_once_and_is_never_parked(
    res: _Resources, database_url: str, outbox_url: str, primary_down: bool, case: str
) -> None:
    session_id, bad, field = INVALID[case]
    primary = res.flaky(database_url)
    primary.down = primary_down
    writer = res.writer(primary, outbox_url=outbox_url)
    good = make_message("s", 0)

    with pytest.raises(InvalidMessage) as raised:
        writer.write(session_id, [good, bad])

    assert raised.value.field.startswith(field)
    assert primary.attempts == []  # never sent to the primary
    assert _outbox_keys(writer) == []  # never parked, not even the valid one
    assert _stored(primary, "s") == []


# -- 3. per-session FIFO ------------------------------------------------------------------


def test_a_session_with_parked_messages_parks_new_ones_behind_them(
    res: _Resources, database_url: str, outbox_url: str
) -> None:
    primary = res.flaky(database_url)
    writer = res.writer(primary, outbox_url=outbox_url, probe_interval=0.05)
    a = _messages("a", 6)
    b = _messages("b", 2)

    assert writer.write("a", a[0:1]).status == "stored"
    primary.down = True
    assert writer.write("a", a[1:3]).status == "parked"
    primary.down = False  # healthy again, but "a" still has parked messages
    until_primary_back(writer)

    behind = writer.write("a", a[3:5])
    other = writer.write("b", b)

    assert behind.status == "parked"
    assert behind.parked == 2
    assert other.status == "stored"  # other sessions are not held up
    assert _stored(primary, "a") == keys_of(a[0:1])
    assert _stored(primary, "b") == keys_of(b)
    assert writer.pending("a") == 4
    assert writer.pending("b") == 0

    report = writer.drain()

    assert (report.replayed, report.duplicates, report.remaining) == (4, 0, 0)
    assert _stored(primary, "a") == keys_of(a[0:5])
    # Nothing parked any more: straight to the primary again.
    assert writer.write("a", a[5:6]).status == "stored"
    assert _stored(primary, "a") == keys_of(a)


# -- 4. order under partial failure -------------------------------------------------------


def test_a_message_that_failed_is_never_overtaken_by_later_ones(
    res: _Resources, database_url: str, outbox_url: str
) -> None:
    primary = res.flaky(database_url)
    writer = res.writer(primary, outbox_url=outbox_url, backoff_base=0.0)
    sent = _messages("s", 8)
    primary.fail_once = {sent[2]["client_msg_uuid"]}  # one transient failure

    statuses = [writer.write("s", [message]).status for message in sent[:6]]
    statuses.append(writer.write("s", sent[6:8]).status)

    assert statuses == ["stored", "stored", "parked", "parked", "parked", "parked", "parked"]
    assert _stored(primary, "s") == keys_of(sent[:2])

    # The replay of the head fails once more: the whole session waits, in order.
    primary.fail_once = {sent[2]["client_msg_uuid"]}
    first = writer.drain()
    assert (first.replayed, first.failed, first.remaining) == (0, 6, 6)
    assert _stored(primary, "s") == keys_of(sent[:2])

    second = writer.drain()
    assert (second.replayed, second.failed, second.remaining) == (6, 0, 0)
    assert _stored(primary, "s") == keys_of(sent)


# -- 5. primary down, then back -----------------------------------------------------------

DOWN_SESSIONS = 5
DOWN_WRITES = 20


def test_primary_down_parks_every_write_within_the_deadline_then_drains_in_order(
    res: _Resources, database_url: str, outbox_url: str, request: pytest.FixtureRequest
) -> None:
    deadline = 2.0
    down = res.repository(workers.CLOSED_PORT_URL, require_connection=False, connect_timeout=1)
    gateway = res.writer(down, outbox_url=outbox_url, deadline=deadline)
    sent: dict[str, list[dict[str, Any]]] = {f"s{n}": [] for n in range(DOWN_SESSIONS)}
    slowest = 0.0
    for index in range(DOWN_WRITES):
        for session_id, messages in sent.items():
            batch = _messages(session_id, 1 + index % 2, start=len(messages))
            started = time.monotonic()
            result = gateway.write(session_id, batch)
            slowest = max(slowest, time.monotonic() - started)
            assert result.status == "parked", result
            messages.extend(batch)
    attempted = {key for messages in sent.values() for key in keys_of(messages)}
    assert slowest < deadline
    assert gateway.pending() == len(attempted)

    primary = res.repository(database_url)
    # The same outbox, reached by the healthy gateway (in the primary: its default).
    same_outbox = None if outbox_url == database_url else outbox_url
    healthy = res.writer(primary, outbox_url=same_outbox)
    report = healthy.drain()

    assert (report.replayed, report.duplicates, report.failed, report.dead) == (
        len(attempted),
        0,
        0,
        0,
    )
    for session_id, messages in sent.items():
        assert _stored(primary, session_id) == keys_of(messages)
    again = healthy.drain()
    assert (again.replayed, again.duplicates, again.remaining) == (0, 0, 0)
    stored = [key for sid in sent for key in _stored(primary, sid)]
    _figures(
        f"primary down, outbox in {request.node.callspec.params['outbox_url']}, "
        f"{request.node.callspec.params['backend']}",
        attempted=attempted,
        acknowledged=attempted,
        stored=stored,
        outbox_left=healthy.pending(),
        dead=healthy.status().dead,
    )
    assert healthy.pending() == 0


# -- 6. permanent rejection and poisoned rows ---------------------------------------------


def test_a_write_the_primary_rejects_is_raised_and_never_parked(
    res: _Resources, database_url: str, outbox_url: str
) -> None:
    primary = res.flaky(database_url)
    writer = res.writer(primary, outbox_url=outbox_url)
    ok, poisoned = _messages("s", 2)
    primary.reject = {poisoned["client_msg_uuid"]}

    with pytest.raises(WriteRejected):
        writer.write("s", [ok, poisoned])

    assert _outbox_keys(writer) == []
    assert _stored(primary, "s") == []
    assert writer.write("s", [ok]).status == "stored"


def test_a_poisoned_row_goes_dead_after_max_attempts_without_blocking_anything_else(
    res: _Resources, database_url: str, outbox_url: str
) -> None:
    primary = res.flaky(database_url)
    writer = res.writer(primary, outbox_url=outbox_url, max_attempts=3, backoff_base=0.0)
    poisoned, after = _messages("p", 2)
    others = _messages("q", 2)
    primary.down = True
    writer.write("p", [poisoned, after])
    writer.write("q", others)
    primary.down = False
    primary.reject = {poisoned["client_msg_uuid"]}

    reports = [writer.drain() for _ in range(2)]

    # Other sessions went through at once; the poisoned session keeps its order.
    assert _stored(primary, "q") == keys_of(others)
    assert [(r.failed, r.dead) for r in reports] == [(1, 0), (1, 0)]
    assert _stored(primary, "p") == []
    assert writer.status().dead == 0

    third = writer.drain()

    assert (third.dead, third.replayed, third.remaining) == (1, 1, 0)
    assert _stored(primary, "p") == keys_of([after])  # set aside, no longer in the way
    status = writer.status()
    assert (status.pending, status.dead) == (0, 1)
    [backlog] = status.sessions
    assert (backlog.session_id, backlog.pending, backlog.dead) == ("p", 0, 1)
    assert backlog.last_error is not None
    assert "rejected" in backlog.last_error
    assert _outbox_keys(writer, "dead") == keys_of([poisoned])
    assert writer.drain().dead == 0  # a dead row stays put, untried

    assert writer.retry_dead() == 1
    primary.reject = set()
    report = writer.drain()

    assert (report.replayed, report.remaining) == (1, 0)
    assert _stored(primary, "p") == keys_of([after, poisoned])
    assert writer.status().dead == 0
    assert _outbox_keys(writer) == []


# -- 7. double fault ----------------------------------------------------------------------


def _fill_up(writer: TranscriptWriter) -> Callable[[], None]:
    """Make the writer's SQLite outbox full: every connection caps the file at the pages
    it has now (``PRAGMA max_page_count``), so SQLite answers a write that needs a new
    page with SQLITE_FULL, as on a full disk (root ignores chmod; this it cannot).
    Returns the repair."""
    engine = writer.outbox.database.engine

    def cap(dbapi_connection: Any, record: Any) -> None:
        cursor = dbapi_connection.cursor()
        pages = cursor.execute("PRAGMA page_count").fetchone()[0]
        cursor.execute(f"PRAGMA max_page_count = {pages}")
        cursor.close()

    event.listen(engine, "connect", cap)
    engine.dispose()  # pooled connections reconnect, capped

    def repair() -> None:
        event.remove(engine, "connect", cap)
        engine.dispose()

    return repair


def test_primary_down_and_outbox_full_raises_and_acknowledges_nothing(
    res: _Resources, database_url: str, sqlite_outbox: str, request: pytest.FixtureRequest
) -> None:
    primary = res.flaky(database_url)
    writer = res.writer(primary, outbox_url=sqlite_outbox)
    batch = _messages("s", 3)
    batch[1]["content"] = "x" * 50_000  # needs new pages: overflow pages
    primary.down = True
    repair = _fill_up(writer)

    with pytest.raises(BackendUnavailable) as raised:
        writer.write("s", batch)

    cause = raised.value.__cause__
    assert isinstance(cause, BackendUnavailable), cause
    assert cause.code == "SQLITE_FULL", cause
    repair()
    assert _outbox_keys(writer) == []  # nothing acknowledged, nothing half-parked

    # The caller still holds the batch and sends it again; the outbox takes it now.
    assert writer.write("s", batch).status == "parked"
    primary.down = False
    writer.drain()

    stored = _stored(primary, "s")
    assert stored == keys_of(batch)
    _figures(
        f"double fault (SQLITE_FULL outbox), {request.node.callspec.params['backend']}",
        attempted=set(keys_of(batch)),
        acknowledged=set(keys_of(batch)),
        stored=stored,
        outbox_left=writer.pending(),
        dead=writer.status().dead,
    )


def test_outbox_in_an_unreachable_primary_raises_and_acknowledges_nothing(
    res: _Resources, database_url: str
) -> None:
    down = res.repository(workers.CLOSED_PORT_URL, require_connection=False, connect_timeout=1)
    gateway = res.writer(down, deadline=2.0)  # outbox in the primary: down with it
    batch = _messages("s", 3)

    with pytest.raises(BackendUnavailable):
        gateway.write("s", batch)

    primary = res.repository(database_url)
    repaired = res.writer(primary)
    assert repaired.write("s", batch).status == "stored"
    assert repaired.write("s", batch).duplicates != []  # a second re-send: no-op
    assert _stored(primary, "s") == keys_of(batch)
    assert repaired.pending() == 0


# -- 8. kill-point matrix -----------------------------------------------------------------

KILL_STEPS = [
    "before_primary",
    "after_primary_commit",
    "after_primary_failure",
    "after_park",
    "drain_after_primary_commit",
]
KILL_SESSIONS = ["kp-a", "kp-b"]
KILL_BATCHES = 6
#: The passage through the step that kills (drain: the first replayed commit).
KILL_AT = dict.fromkeys(KILL_STEPS, 4) | {"drain_after_primary_commit": 1}
#: Where the batch being written at the kill is found then: (in the primary, parked).
KILLED_BATCH_IS = {
    "before_primary": (False, False),
    "after_primary_commit": (True, False),
    "after_primary_failure": (False, False),
    "after_park": (False, True),
}


def _receive_all(reader: Any) -> list[Any]:
    items: list[Any] = []
    while True:
        try:
            if not reader.poll(CHILD_TIMEOUT):
                pytest.fail("the child neither reported nor died")
            items.append(reader.recv())
        except EOFError:
            return items


def _wait_for_leases(writer: TranscriptWriter) -> None:
    """A killed drainer's claims hold until their lease ends: wait that long, exactly."""
    until = writer.outbox.database.read(
        lambda conn: conn.execute(select(func.max(outbox_table.c.claimed_until))).scalar()
    )
    if until is not None:
        remaining = (until - utcnow()).total_seconds()
        time.sleep(max(0.0, remaining) + 0.05)


@pytest.mark.slow
@pytest.mark.parametrize("step", KILL_STEPS)
def test_sigkill_at_each_step_then_resend_and_drain_gives_exactly_one_row_each(
    res: _Resources,
    database_url: str,
    sqlite_outbox: str,
    step: str,
    request: pytest.FixtureRequest,
) -> None:
    batches = [
        (sid, [make_message(sid, 2 * n), make_message(sid, 2 * n + 1)])
        for n in range(KILL_BATCHES // 2)
        for sid in KILL_SESSIONS
    ]
    reader, sender = SPAWN.Pipe(duplex=False)
    child = SPAWN.Process(
        target=workers.kill_point_writer,
        kwargs={
            "url": database_url,
            "outbox_url": sqlite_outbox,
            "step": step,
            "kill_at": KILL_AT[step],
            "batches": batches,
            "conn": sender,
        },
        daemon=True,
    )
    child.start()
    sender.close()
    try:
        reports = _receive_all(reader)
        child.join(CHILD_TIMEOUT)
    finally:
        if child.is_alive():
            child.kill()
            child.join()
    assert child.exitcode == -signal.SIGKILL, (child.exitcode, reports)
    acknowledged = {key for kind, _, keys in reports if kind == "ack" for key in keys}

    primary = res.repository(database_url)
    writer = res.writer(primary, outbox_url=sqlite_outbox)
    # The kill landed where it was meant to.
    in_primary = {key for sid in KILL_SESSIONS for key in _stored(primary, sid)}
    parked = set(_outbox_keys(writer))
    if step == "drain_after_primary_commit":
        # One session's batch was committed by the primary and is still parked.
        assert in_primary
        assert in_primary <= parked == acknowledged
    else:
        killed = set(keys_of(batches[KILL_AT[step] - 1][1]))
        assert not killed & acknowledged
        assert (killed <= in_primary, killed <= parked) == KILLED_BATCH_IS[step]

    _wait_for_leases(writer)
    # Recovery: re-send, in order, every batch the child did not acknowledge.
    for session_id, messages in batches:
        if not set(keys_of(messages)) <= acknowledged:
            writer.write(session_id, messages)
    report = writer.drain()

    assert report.remaining == 0
    assert report.dead == 0
    stored: list[str] = []
    for session_id in KILL_SESSIONS:
        sent = [key for sid, messages in batches if sid == session_id for key in keys_of(messages)]
        assert _stored(primary, session_id) == sent
        stored += _stored(primary, session_id)
    _figures(
        f"kill {step}, {request.node.callspec.params['backend']}",
        attempted={key for _, messages in batches for key in keys_of(messages)},
        acknowledged=acknowledged,
        stored=stored,
        outbox_left=writer.pending(),
        dead=writer.status().dead,
    )


# -- 9. outbox durability -----------------------------------------------------------------

DURABILITY_KILLS = 20


@pytest.mark.slow
def test_sqlite_outbox_file_keeps_every_acknowledged_message_through_random_sigkills(
    sqlite_outbox: str, tmp_path: Path
) -> None:
    # forkserver, with the library preloaded: twenty fresh children without paying
    # twenty interpreter starts. Each child is forked from a clean, single-threaded
    # server process, so it starts like a spawned one, only faster.
    forkserver = multiprocessing.get_context("forkserver")
    forkserver.set_forkserver_preload(["sessionrepo", "sessionrepo.outbox.writer", "psycopg"])
    rng = random.Random(20261129)
    path = str(tmp_path / "outbox.db")
    attempted: set[str] = set()
    acknowledged: set[str] = set()
    inside_write = 0  # kills that landed between a batch's "trying" and its ack

    for kill in range(DURABILITY_KILLS):
        ready = forkserver.Event()
        reader, sender = forkserver.Pipe(duplex=False)
        child = forkserver.Process(
            target=workers.park_until_killed,
            kwargs={
                "outbox_url": sqlite_outbox,
                "seed": rng.randrange(2**32),
                "first_index": kill * 100_000,
                "ready": ready,
                "conn": sender,
            },
            daemon=True,
        )
        child.start()
        sender.close()
        acks = 0
        last: tuple[str, list[str]] | None = None
        try:
            assert ready.wait(CHILD_TIMEOUT), "the parking child did not start"
            target = rng.randint(1, 60)
            while acks < target:
                assert reader.poll(CHILD_TIMEOUT), "the parking child stalled"
                last = reader.recv()
                acks += _note(last, attempted, acknowledged)
            # The child is parking its next batches right now (it never waits for us);
            # a random few milliseconds more spread the kills over its steps.
            time.sleep(rng.uniform(0, 0.004))
            child.kill()  # SIGKILL
            child.join(CHILD_TIMEOUT)
        finally:
            if child.is_alive():
                child.kill()
                child.join()
        for item in _receive_all(reader):  # sent before the kill, not yet read
            last = item
            _note(item, attempted, acknowledged)
        assert child.exitcode == -signal.SIGKILL
        inside_write += last is not None and last[0] == "trying"

        with closing(sqlite3.connect(path)) as conn:
            assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
            rows = conn.execute("SELECT client_msg_uuid, state FROM pending_outbox").fetchall()
        parked = {_uuid(key) for key, _ in rows}
        assert parked <= attempted  # nothing appears that was not sent
        assert acknowledged <= parked, f"kill {kill}: {len(acknowledged - parked)} missing"

    _figures(
        f"outbox durability, {DURABILITY_KILLS} SIGKILLs, {inside_write} inside write()",
        attempted=attempted,
        acknowledged=acknowledged,
        stored=[_uuid(key) for key, _ in rows],
        outbox_left=len(rows),
        dead=sum(state == "dead" for _, state in rows),
    )


def _note(item: tuple[str, list[str]], attempted: set[str], acknowledged: set[str]) -> int:
    """Take one report of the parking child: keys it is about to write, or keys whose
    ``write`` returned (acknowledged). Returns 1 for an acknowledgement."""
    kind, keys = item
    if kind == "trying":
        attempted.update(keys)
        return 0
    assert kind == "parked", item
    acknowledged.update(keys)
    return 1


def _uuid(value: str) -> str:
    """SQLite keeps UUIDs as 32 hex digits; compare them in their usual form."""
    return str(uuid.UUID(value))


# -- 10. stranded outbox, two drainers ----------------------------------------------------

STRANDED_SESSIONS = 6
STRANDED_MESSAGES = 300
DRAINERS = 2


@pytest.mark.slow
def test_two_drainers_on_a_stranded_outbox_replay_each_message_once_in_order(
    res: _Resources, database_url: str, outbox_url: str, request: pytest.FixtureRequest
) -> None:
    # A gateway that parked 300 messages and died: it never drains, nor closes (its
    # resources are released only when the test ends).
    stranded = res.flaky(database_url)
    stranded.down = True
    gateway = res.writer(stranded, outbox_url=outbox_url)
    rng = random.Random(7)
    sent: dict[str, list[dict[str, Any]]] = {f"st{n}": [] for n in range(STRANDED_SESSIONS)}
    total = 0
    while total < STRANDED_MESSAGES:
        session_id = rng.choice(sorted(sent))
        count = min(rng.randint(1, 5), STRANDED_MESSAGES - total)
        batch = _messages(session_id, count, start=len(sent[session_id]))
        assert gateway.write(session_id, batch).status == "parked"
        sent[session_id].extend(batch)
        total += count

    start = SPAWN.Barrier(DRAINERS)
    results = SPAWN.Queue()
    same_outbox = None if outbox_url == database_url else outbox_url
    children = [
        SPAWN.Process(
            target=workers.drain_outbox,
            kwargs={
                "drainer": n,
                "url": database_url,
                "outbox_url": same_outbox,
                "batch_size": 4,
                "start": start,
                "results": results,
            },
            daemon=True,
        )
        for n in range(DRAINERS)
    ]
    for child in children:
        child.start()
    try:
        reports = []
        for _ in children:
            try:
                reports.append(results.get(timeout=CHILD_TIMEOUT))
            except queue.Empty:
                pytest.fail(f"drainers exit codes {[c.exitcode for c in children]}")
        for child in children:
            child.join(CHILD_TIMEOUT)
    finally:
        for child in children:
            if child.is_alive():
                child.kill()
                child.join()

    assert [error for report in reports for error in report["errors"]] == []
    drains = [report["drain"] for report in reports]
    assert sum(d["replayed"] for d in drains) == STRANDED_MESSAGES
    assert sum(d["duplicates"] + d["failed"] + d["dead"] for d in drains) == 0
    claimed = [{tuple(row) for batch in report["claims"] for row in batch} for report in reports]
    assert claimed[0].isdisjoint(claimed[1]), "a row was claimed by both drainers"

    primary = res.repository(database_url)
    stored: list[str] = []
    for session_id, messages in sent.items():
        assert _stored(primary, session_id) == keys_of(messages)
        stored += _stored(primary, session_id)
    checker = res.writer(primary, outbox_url=same_outbox)
    _figures(
        f"stranded outbox, two drainers, outbox in "
        f"{request.node.callspec.params['outbox_url']}, {request.node.callspec.params['backend']}"
        f" (claims {len(claimed[0])}/{len(claimed[1])})",
        attempted={key for messages in sent.values() for key in keys_of(messages)},
        acknowledged={key for messages in sent.values() for key in keys_of(messages)},
        stored=stored,
        outbox_left=checker.pending(),
        dead=checker.status().dead,
    )
    assert checker.pending() == 0


# -- 11. background drainer ---------------------------------------------------------------


def _drainer_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "sessionrepo-drainer"]


def test_background_drainer_recovers_at_start_and_drains_after_an_outage(
    res: _Resources, database_url: str, outbox_url: str
) -> None:
    # What an earlier process left parked.
    earlier = res.flaky(database_url)
    earlier.down = True
    left = _messages("left", 4)
    res.writer(earlier, outbox_url=outbox_url).write("left", left)

    primary = res.flaky(database_url)
    writer = res.writer(
        primary, outbox_url=outbox_url, backoff_base=0.01, backoff_cap=0.05, deadline=2.0
    )
    writer.start(interval=0.05)
    writer.start(interval=0.05)  # a second start does not start a second thread
    assert len(_drainer_threads()) == 1

    eventually(
        lambda: writer.pending() == 0,
        "startup recovery drained the outbox",
        timeout=DRAINER_TIMEOUT,
    )
    assert _stored(primary, "left") == keys_of(left)

    # An outage: writes park; the drainer tries and fails meanwhile; nothing is lost.
    primary.down = True
    during = _messages("live", 3)
    tried = len(primary.attempts)
    assert writer.write("live", during[:2]).status == "parked"  # the write's own try
    eventually(
        lambda: len(primary.attempts) > tried + 1,
        "the drainer tried during the outage",
        timeout=DRAINER_TIMEOUT,
    )
    assert writer.write("live", during[2:]).status == "parked"
    assert _stored(primary, "live") == []
    primary.down = False

    eventually(
        lambda: writer.pending() == 0,
        "the drainer drained after the outage",
        timeout=DRAINER_TIMEOUT,
    )
    assert _stored(primary, "live") == keys_of(during)

    writer.stop()
    assert _drainer_threads() == []
    writer.start(interval=0.05)
    assert len(_drainer_threads()) == 1
    writer.close()
    assert _drainer_threads() == []


# -- 12. status ---------------------------------------------------------------------------


def test_status_shows_pending_per_session_oldest_age_and_dead_rows(
    res: _Resources, database_url: str, outbox_url: str
) -> None:
    primary = res.flaky(database_url)
    writer = res.writer(primary, outbox_url=outbox_url, max_attempts=1, backoff_base=0.0)
    empty = writer.status()
    assert (empty.pending, empty.dead, empty.oldest_pending_age, empty.sessions) == (0, 0, 0, [])

    primary.down = True
    before = utcnow()
    writer.write("a", _messages("a", 3))
    after_first = utcnow()
    poisoned, *rest = _messages("b", 2)
    writer.write("b", [poisoned, *rest])

    asked = utcnow()
    status = writer.status()
    seen = utcnow()
    assert (status.pending, status.dead) == (5, 0)
    assert {(s.session_id, s.pending, s.dead) for s in status.sessions} == {
        ("a", 3, 0),
        ("b", 2, 0),
    }
    age = timedelta(seconds=status.oldest_pending_age)
    assert asked - after_first <= age <= seen - before
    assert [s.session_id for s in status.sessions] == ["a", "b"]  # oldest first
    assert before <= status.sessions[0].oldest <= after_first
    assert writer.pending("a") == 3
    assert writer.pending("b") == 2

    primary.down = False
    primary.reject = {poisoned["client_msg_uuid"]}
    writer.drain()

    status = writer.status()
    assert (status.pending, status.dead, status.oldest_pending_age) == (0, 1, 0.0)
    [backlog] = status.sessions
    assert (backlog.session_id, backlog.pending, backlog.dead) == ("b", 0, 1)
    assert backlog.last_error is not None
    assert "rejected" in backlog.last_error
    assert writer.pending() == 0  # dead rows are not pending...
    assert writer.retry_dead("b") == 1  # ...but kept, and put back on request
    assert (writer.status().pending, writer.status().dead) == (1, 0)


# -- beyond the list: payloads, hangs, leases, the file itself ----------------------------


def _rich_messages(session_id: str) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Be brief.\x00 (with a NUL)"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what is this?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
            ],
            "name": "alice",
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "look", "arguments": '{"q": "ünïcode ✓"}'},
                }
            ],
            "reasoning": "think first",
            "finish_reason": "tool_calls",
            "token_count": 17,
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"ok": true}', "extra_field": [1]},
        {"role": "assistant", "content": "done", "platform_message_id": "tg-42"},
    ]
    for message in messages:
        ensure_key(message)
    return messages


def test_a_parked_batch_is_replayed_exactly_as_it_would_have_been_stored(
    res: _Resources, database_url: str, outbox_url: str
) -> None:
    primary = res.flaky(database_url)
    writer = res.writer(primary, outbox_url=outbox_url)
    defaults = {
        "source": "telegram",
        "user_id": "u-7",
        "title": "a title",
        "model": "gpt-x",
        "model_config": {"temperature": 0.2},
        "metadata": {"chat": 42},
    }
    writer.write("direct", _rich_messages("direct"), **defaults)
    primary.down = True
    parked = _rich_messages("parked")
    assert writer.write("parked", parked, **defaults).status == "parked"
    primary.down = False
    writer.drain()

    def view(session_id: str) -> list[dict[str, Any]]:
        return [m.to_openai() for m in primary.load_transcript(session_id)]

    assert view("parked") == view("direct")
    assert [m.to_openai() for m in map(Message.from_openai, parked)] == view("parked")
    direct, replayed = primary.get_session("direct"), primary.get_session("parked")
    fields = ("source", "user_id", "title", "model", "model_settings", "metadata")
    assert [getattr(replayed, f) for f in fields] == [getattr(direct, f) for f in fields]


def test_write_returns_parked_within_its_deadline_when_the_primary_holds_it_up(
    res: _Resources, database_url: str, backend: str, sqlite_outbox: str
) -> None:
    """A primary that keeps the write waiting (a held lock): the server's own timeout
    (SQLite's busy timeout, PostgreSQL's lock timeout, set on the writer's connections)
    ends the attempt within the deadline, the batch is parked, and the next write parks
    at once (the primary is known to be down) instead of waiting again.

    The deadline leaves the outbox a reserve of a quarter of it (here 0.5 s) to park in:
    with a shorter one, a loaded machine's fsync of the outbox can outlast the reserve, and
    the write then rightly answers "nothing was acknowledged" instead of "parked"."""
    deadline = 2.0
    primary = res.repository(database_url)
    writer = res.writer(primary, outbox_url=sqlite_outbox, deadline=deadline, workers=1)
    batch = _messages("s", 3)
    assert writer.write("s", batch[:1]).status == "stored"
    with holding_the_write_lock(database_url, backend, "s"):
        started = time.monotonic()
        first = writer.write("s", batch[1:2])
        waited = time.monotonic() - started
        second = writer.write("s", batch[2:])
        elapsed = time.monotonic() - started

    assert (first.status, second.status) == ("parked", "parked")
    assert second.reason is not None
    assert "unavailable" in second.reason
    assert waited < deadline + 0.5  # its deadline, plus parking on a loaded machine
    assert elapsed - waited < deadline / 2  # no second wait for the primary
    report = writer.drain()
    assert report.replayed == 2, (report, writer.status())
    assert (report.replayed, report.duplicates, report.remaining) == (2, 0, 0)
    assert _stored(primary, "s") == keys_of(batch)
    assert writer.primary_down is None  # the replay found it back


def test_a_drainer_that_outlived_its_lease_deletes_nothing_it_did_not_replay(
    res: _Resources, database_url: str, outbox_url: str
) -> None:
    """A stalled drainer's lease runs out; another drainer replays its rows, and the
    session's next messages are parked (at the same positions, since the session's rows
    were all gone). When the stalled drainer wakes up, it must not delete those."""
    primary = res.flaky(database_url)
    stalled = res.writer(primary, outbox_url=outbox_url)
    other = res.writer(res.repository(database_url), outbox_url=outbox_url)
    first, later = _messages("s", 3), _messages("s", 2, start=3)
    primary.down = True
    stalled.write("s", first)
    primary.down = False

    def stall(step: str) -> None:
        if step != "drain_after_primary_commit" or stalled.fault_hook is None:
            return
        stalled.fault_hook = None
        # Meanwhile: the lease runs out, the other drainer takes over, new rows park.
        stalled.outbox.database.write(
            lambda conn: conn.execute(
                outbox_table.update().values(claimed_until=utcnow() - timedelta(seconds=1))
            )
        )
        assert other.drain().duplicates == 3
        primary.down = True
        assert stalled.write("s", later).status == "parked"
        primary.down = False

    stalled.fault_hook = stall
    stalled.drain()
    stalled.drain()

    assert _stored(primary, "s") == keys_of(first + later)
    assert stalled.pending() == 0


def test_sqlite_outbox_file_is_private_and_synchronous_full(
    res: _Resources, database_url: str, tmp_path: Path
) -> None:
    path = tmp_path / "gateway" / "outbox.db"
    writer = res.writer(res.repository(database_url), outbox_url=f"sqlite:///{path}")

    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    pragmas = writer.outbox.database.read(
        lambda conn: (
            conn.execute(text("PRAGMA journal_mode")).scalar(),
            conn.execute(text("PRAGMA synchronous")).scalar(),
        )
    )
    assert pragmas == ("wal", 2)  # 2 is FULL


# -- real error codes: a read-only primary is transient (backend-specific setups) ---------

SQLITE_ONLY = pytest.mark.parametrize("backend", [pytest.param("sqlite", marks=pytest.mark.sqlite)])
POSTGRES_ONLY = pytest.mark.parametrize(
    "backend", [pytest.param("postgres", marks=pytest.mark.postgres)]
)


def _read_only(repository: SessionRepository, statement: str) -> Callable[[], None]:
    """Run ``statement`` on every new connection of the primary, the writers' pools of
    it included (and on none of the outbox's, which has its own engine even in the same
    database). Returns the undo."""
    # White-box: the pools a writer's deadline made (Database.bounded).
    database = repository.database
    engines = [database.engine, *(bounded.engine for bounded in database._bounded.values())]

    def on_connect(dbapi_connection: Any, record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute(statement)
        cursor.close()
        dbapi_connection.commit()  # psycopg: a SET rolled back with its transaction is undone

    for engine in engines:
        event.listen(engine, "connect", on_connect)
        engine.dispose()

    def undo() -> None:
        for engine in engines:
            event.remove(engine, "connect", on_connect)
            engine.dispose()

    return undo


def _read_only_primary_parks(
    res: _Resources, database_url: str, outbox_url: str, statement: str, code: str
) -> None:
    primary = res.repository(database_url)
    writer = res.writer(primary, outbox_url=outbox_url)
    batch = _messages("s", 2)
    undo = _read_only(primary, statement)

    result = writer.write("s", batch)

    undo()
    assert result.status == "parked"
    assert result.reason is not None
    assert code in result.reason
    assert writer.drain().replayed == 2
    assert _stored(primary, "s") == keys_of(batch)


@SQLITE_ONLY
def test_sqlite_read_only_primary_is_transient_and_parks(
    res: _Resources, database_url: str, outbox_url: str
) -> None:
    _read_only_primary_parks(
        res, database_url, outbox_url, "PRAGMA query_only = ON", "readonly database"
    )


@POSTGRES_ONLY
def test_postgres_read_only_primary_is_transient_and_parks(
    res: _Resources, database_url: str, outbox_url: str
) -> None:
    _read_only_primary_parks(
        res, database_url, outbox_url, "SET default_transaction_read_only = on", "25006"
    )


# -- what drain does with rows it cannot replay as they are -------------------------------


def test_a_parked_message_whose_key_was_stored_with_other_content_is_reported_not_kept(
    res: _Resources, database_url: str, outbox_url: str
) -> None:
    primary = res.flaky(database_url)
    writer = res.writer(primary, outbox_url=outbox_url)
    message = make_message("s", 0)
    primary.down = True
    writer.write("s", [message])
    primary.down = False
    primary.append("s", [dict(message, content="stored first, by someone else")])

    report = writer.drain()

    assert (report.replayed, report.conflicts, report.remaining) == (0, 1, 0)
    [stored] = primary.load_transcript("s")
    assert stored.content == "stored first, by someone else"  # the store is not rewritten


def test_a_parked_payload_that_no_longer_validates_goes_dead_and_the_rest_replays(
    res: _Resources, database_url: str, outbox_url: str
) -> None:
    primary = res.flaky(database_url)
    writer = res.writer(primary, outbox_url=outbox_url)
    batch = _messages("s", 3)
    primary.down = True
    writer.write("s", batch)
    primary.down = False
    broken = outbox_table.c.client_msg_uuid == uuid.UUID(batch[1]["client_msg_uuid"])
    writer.outbox.database.write(
        lambda conn: conn.execute(
            outbox_table.update().where(broken).values(message={"role": "wizard"})
        )
    )

    report = writer.drain()

    assert (report.replayed, report.dead, report.remaining) == (2, 1, 0)
    assert _stored(primary, "s") == keys_of([batch[0], batch[2]])
    assert _outbox_keys(writer, "dead") == keys_of(batch[1:2])
