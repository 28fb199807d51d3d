"""The outbox's protocol is defined once (``sessionrepo.models.outbox_protocol``), and
every place that asks "has this session parked rows?" answers from it.

A row's state either holds its session's FIFO (a new write queues behind it, the drainer
replays it) or does not (kept for a person, never in the way). Each state says which; the
tests below run every state through every place that asks, on both backends and both
APIs: the primary's own outbox (the store's append statement asks, in SQL) and a separate
SQLite file (the outbox asks, in Core and in its in-memory answer's SQL text). A new state
added to the enum is tested with no change here; one added without a migration that lets
the table hold it fails the constraint test.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import BlockingAsync, EventLoopThread
from sqlalchemy import CheckConstraint, update
from sqlalchemy.exc import IntegrityError

from sessionrepo import AsyncTranscriptWriter, Message, TranscriptWriter, open_repository
from sessionrepo.models import Session
from sessionrepo.models.outbox_protocol import (
    FIFO_STATE_SQL,
    FIFO_STATES,
    OUTBOX_TABLE,
    STATE_CHECK_SQL,
    OutboxState,
    parked_rows_sql,
)
from sessionrepo.models.tables import outbox_table
from sessionrepo.outbox.table import Outbox
from sessionrepo.outbox.writer import open_outbox_database

pytestmark = pytest.mark.contract

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["on-primary", "sqlite-file"])
def outbox_url(request: pytest.FixtureRequest, tmp_path: Path) -> str | None:
    """Where the writer parks: the primary's own ``pending_outbox``, or a SQLite file."""
    return None if request.param == "on-primary" else f"sqlite:///{tmp_path / 'outbox.db'}"


@pytest.fixture
def writer(
    repo: Any, api: str, outbox_url: str | None, request: pytest.FixtureRequest
) -> Iterator[Any]:
    if api == "sync":
        sync = TranscriptWriter(repo, outbox_url=outbox_url)
        yield sync
        sync.close()
        return
    loop: EventLoopThread = request.getfixturevalue("event_loop_thread")

    async def make() -> AsyncTranscriptWriter:
        return AsyncTranscriptWriter(repo._target, outbox_url=outbox_url)

    async_writer = loop.run(make())
    yield BlockingAsync(async_writer, loop)
    loop.run(async_writer.close())


@pytest.fixture
def side_outbox(database_url: str, outbox_url: str | None) -> Iterator[Outbox]:
    """The writer's outbox, opened synchronously beside it: rows are put in a state there."""
    if outbox_url is None:
        repository = open_repository(database_url)
        yield Outbox.of(repository)
        repository.close()
        return
    outbox = Outbox(open_outbox_database(outbox_url))
    yield outbox
    outbox.close()


def _message(text: str) -> Message:
    return Message(role="user", content=text)


def _park_in(outbox: Outbox, session_id: str, message: Message, state: OutboxState) -> None:
    assert outbox.park(session_id, [message], Session(id=session_id), reason="test") == 1
    outbox.database.write(
        lambda conn: conn.execute(
            update(outbox_table)
            .where(outbox_table.c.session_id == session_id)
            .values(state=state.value)
        )
    )


@pytest.mark.parametrize("state", list(OutboxState), ids=str)
def test_a_write_queues_behind_a_parked_row_exactly_when_its_state_holds_the_fifo(
    writer: Any, side_outbox: Outbox, state: OutboxState, repo: Any
) -> None:
    first, parked, later, fresh_parked, fresh_later = (
        _message(text) for text in ("first", "parked", "later", "fresh parked", "fresh later")
    )
    assert writer.write("known", [first]).status == "stored"  # the session exists
    _park_in(side_outbox, "known", parked, state)
    _park_in(side_outbox, "fresh", fresh_parked, state)  # a session the primary lacks

    expected = "parked" if state.holds_fifo else "stored"
    assert writer.write("known", [later]).status == expected
    assert writer.write("fresh", [fresh_later]).status == expected
    # An edit asks the same question (its own way: it is no append).
    assert writer.rewind("known", 1).status == expected

    report = writer.drain()
    stored = [m.client_msg_uuid for m in repo.load_transcript("known", include_retracted=True)]
    if state.holds_fifo:
        # Replayed in the order parked: the row in the state first, then what queued.
        assert report.remaining == 0
        assert stored == [first.client_msg_uuid, parked.client_msg_uuid, later.client_msg_uuid]
    else:
        # Never in the way, never replayed by itself: still there, in its state.
        assert stored == [first.client_msg_uuid, later.client_msg_uuid]
        assert side_outbox.count("known", state=state.value) == 1
        assert side_outbox.count("fresh", state=state.value) == 1


def test_every_state_says_whether_it_holds_the_fifo() -> None:
    assert {state.value for state in OutboxState} == {"pending", "dead"}
    for state in OutboxState:
        assert isinstance(state.holds_fifo, bool), state
        assert OutboxState(state.value) is state
    assert FIFO_STATES == (OutboxState.PENDING,)
    assert FIFO_STATE_SQL == "state = 'pending'"


def test_the_table_holds_exactly_the_states(database_url: str) -> None:
    # The model's constraint is the protocol's...
    [check] = [c for c in outbox_table.constraints if isinstance(c, CheckConstraint)]
    assert str(check.sqltext) == STATE_CHECK_SQL
    assert outbox_table.name == OUTBOX_TABLE
    # ... and so is the migrated table's: every state is admitted, nothing else.
    repository = open_repository(database_url)
    outbox = Outbox.of(repository)
    try:
        for state in OutboxState:
            _park_in(outbox, f"s-{state.value}", _message(state.value), state)
        _park_in(outbox, "other", _message("other"), OutboxState.PENDING)
        with pytest.raises(IntegrityError), outbox.database.engine.begin() as conn:
            conn.execute(
                update(outbox_table)
                .where(outbox_table.c.session_id == "other")
                .values(state="archived")
            )
    finally:
        repository.close()


def test_the_sql_text_is_the_core_question(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'outbox.db'}"
    outbox = Outbox(open_outbox_database(url))
    try:
        _park_in(outbox, "held", _message("a"), OutboxState.PENDING)
        _park_in(outbox, "aside", _message("b"), OutboxState.DEAD)
        for session_id, holds in (("held", True), ("aside", False), ("none", False)):
            found = outbox.database.read(
                lambda conn, sid=session_id: conn.exec_driver_sql(
                    parked_rows_sql("?"), (sid,)
                ).first()
            )
            assert (found is not None) is holds
            assert outbox.has_pending(session_id) is holds
        guarded = parked_rows_sql("?", also="? = 1")
        assert guarded.startswith(f"SELECT 1 FROM {OUTBOX_TABLE} WHERE ? = 1 AND session_id = ?")
    finally:
        outbox.close()


#: Where a state is still written by hand, until the lead applies the writer's report
#: at merge (each becomes a name from sessionrepo.models.outbox_protocol); then empty.
_NOT_YET: frozenset[str] = frozenset()


def test_no_state_is_written_by_hand_outside_the_protocol() -> None:
    """A state's name in SQL or a comparison outside the protocol module (the frozen
    migrations aside) is a second definition that a new state would not update."""
    literal = re.compile(r"""state\s*(?:==|=|IN\s*\(|!=)\s*["']?\s*["'](?:pending|dead)["']""")
    found = []
    for folder in ("repo", "models"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            name = path.relative_to(ROOT).as_posix()
            if name == "models/outbox_protocol.py" or name in _NOT_YET:
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if literal.search(line):
                    found.append(f"{name}:{number}: {line.strip()}")
    assert not found, found


def test_a_key_parked_in_any_state_is_not_parked_twice(tmp_path: Path) -> None:
    """The protocol's states share the table's key: a message is in one state at a time."""
    outbox = Outbox(open_outbox_database(f"sqlite:///{tmp_path / 'outbox.db'}"))
    try:
        message = _message("once")
        _park_in(outbox, "s", message, OutboxState.DEAD)
        assert outbox.park("s", [message], Session(id="s"), reason="again") == 0
        assert outbox.count("s", state=OutboxState.DEAD) == 1
        assert outbox.count("s") == 0
    finally:
        outbox.close()
