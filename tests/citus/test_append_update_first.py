"""Migration 0023's append on Citus: the session's row updated first, as its lock.

The common append (a session that exists, new messages of its open day) is the row's
update, the tombstone's probe, the insert and the backlog's entry, in a block whose
writes are rolled back when the call must write nothing or meets a stored key (then
0022's body runs). What these tests hold it to, each append still one call to the
session's worker committed in one phase:

- new messages are numbered from what the update returned, counted once;
- a re-send (one message, a batch, part of a batch) writes nothing of what is stored and
  answers the stored keys; a refused conflict writes nothing; the session's row is left
  as it was by every call that wrote nothing (the block's update undone);
- a call that must write nothing on an existing session ('q' parked messages, 'x' an
  erased session's tombstone, 'm' the remembered row gone) leaves the row as it was;
- appenders racing on one session number their messages without a gap or a repeat;
- the downgrade puts 0022's function back on every node, the upgrade this one.

Needs ``SESSIONREPO_TEST_CITUS_URL`` (``python tests/citus_cluster.py start`` prints
one); skipped without it (failed with ``SESSIONREPO_REQUIRE_CITUS=1``).
"""

from __future__ import annotations

import functools
import threading
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

from sessionrepo import AppendResult, ConflictError, Message, TranscriptWriter, open_repository
from sessionrepo.dialects.citus.append import APPEND_FUNCTION
from sessionrepo.errors import QueuedBehindOutbox
from sessionrepo.store.database import Database
from sessionrepo.store.schema import downgrade, upgrade

from support.citus_remote import RemoteCommands, assert_one_worker
from support.sql import conninfo, execute, query

pytestmark = pytest.mark.citus

#: The session row's columns an append moves.
_ROW = (
    "next_seq, message_count, tool_call_count, last_active_at, last_active_lag_us, "
    "rollup_day, rollup_messages"
)
#: When the tests' messages were made: their UTC day is the session's open day, whenever
#: the tests run.
_MADE = datetime(2026, 11, 2, 9, tzinfo=UTC)


def _row(url: str, sid: str) -> tuple[Any, ...]:
    """The session row's append columns."""
    (row,) = query(url, f"SELECT {_ROW} FROM sessions WHERE id = %s", [sid])
    return row


def _seqs(url: str, sid: str) -> list[int]:
    rows = query(url, "SELECT seq FROM messages WHERE session_id = %s ORDER BY seq", [sid])
    return [int(seq) for (seq,) in rows]


def _backlog(url: str, sid: str) -> list[tuple[int, int]]:
    rows = query(
        url,
        "SELECT first_seq, count FROM search_backlog WHERE session_id = %s ORDER BY first_seq",
        [sid],
    )
    return [(int(first), int(count)) for first, count in rows]


def _one_call(name: str, commands: list[tuple[str, str]]) -> str:
    """The action was the one delegated call (the only command sent) to one worker,
    committed there in one phase; returns the worker."""
    assert [command for _, command in commands if f"{APPEND_FUNCTION}(" in command] == [
        command for _, command in commands
    ], (name, commands)
    assert len(commands) == 1, (name, commands)
    return assert_one_worker(name, commands)


def _calls(name: str, commands: list[tuple[str, str]], count: int) -> str:
    """``count`` calls of the function among the commands, all to one worker; nothing
    sent committed in two phases; returns the worker."""
    assert_one_worker(name, [("any", command) for _, command in commands])
    calls = [(worker, command) for worker, command in commands if f"{APPEND_FUNCTION}(" in command]
    assert len(calls) == count, (name, commands)
    return assert_one_worker(name, calls)


def _into(results: list[AppendResult], call: Callable[[], AppendResult]) -> None:
    """``call()``, its result kept in ``results``."""
    results.append(call())


def _messages(text: str, count: int) -> list[Message]:
    return [Message(role="user", content=f"{text} {n}", timestamp=_MADE) for n in range(count)]


def test_new_messages_are_numbered_from_the_update_and_counted_once(citus_url: str) -> None:
    sid = "uf-" + uuid.uuid4().hex[:8]
    with RemoteCommands() as remote, open_repository(citus_url) as repository:
        repository.append(sid, _messages("first", 1))
        before = _row(citus_url, sid)
        one = remote.during(lambda: repository.append(sid, _messages("one", 1)))
        tools = [
            Message(role="assistant", content="calls", tool_calls=[{"id": "c1"}], timestamp=_MADE)
        ]
        ten = remote.during(lambda: repository.append(sid, [*tools, *_messages("ten", 9)]))
        after = _row(citus_url, sid)
        stored = repository.load_transcript(sid)
    assert _one_call("one message", one) == _one_call("ten messages", ten)
    assert [m.seq for m in stored] == list(range(1, 13))
    assert [m.content for m in stored][:3] == ["first 0", "one 0", "calls"]
    # next_seq, message_count and the open day's count moved by the 11 new messages; the
    # assistant's tool call counted; the day stayed open (no rollup row).
    assert (after[0] - before[0], after[1] - before[1], after[2] - before[2]) == (11, 11, 1)
    assert (after[5], after[6] - before[6]) == (before[5], 11)
    rollup = "SELECT count(*) FROM usage_rollup WHERE session_id = %s"
    assert query(citus_url, rollup, [sid]) == [(0,)]
    assert _backlog(citus_url, sid) == [(1, 1), (2, 1), (3, 10)]


def test_a_re_send_writes_nothing_of_what_is_stored(citus_url: str) -> None:
    sid = "rs-" + uuid.uuid4().hex[:8]
    one = _messages("one", 1)
    batch = _messages("batch", 5)
    results: list[AppendResult] = []
    with (
        RemoteCommands() as remote,
        open_repository(citus_url) as repository,
        open_repository(citus_url) as other,  # never saw them acknowledged: sends them
    ):
        repository.append(sid, one)
        repository.append(sid, batch)
        before = _row(citus_url, sid)
        backlog = _backlog(citus_url, sid)
        calls: dict[str, Callable[[], AppendResult]] = {
            "one message": lambda: other.append(sid, one),
            "a batch": lambda: other.append(sid, batch),
        }
        for name, call in calls.items():
            _one_call(name, remote.during(functools.partial(_into, results, call)))
        changed = Message(
            role="user",
            content="changed",
            client_msg_uuid=batch[2].client_msg_uuid,
            timestamp=_MADE,
        )

        def refused() -> None:
            with pytest.raises(ConflictError):
                other.append(sid, [*_messages("new", 2), changed], on_conflict="raise")

        _one_call("refused conflict", remote.during(refused))
        unchanged = _row(citus_url, sid)
        # Part of a batch stored: the new ones numbered right after, counted once.
        mixed = [batch[4], *_messages("fresh", 3), one[0]]
        partly = remote.during(lambda: results.append(other.append(sid, mixed)))
        _one_call("part of a batch", partly)
        after = _row(citus_url, sid)
        stored = repository.load_transcript(sid)
    resent_one, resent_batch, mixed_result = results
    assert resent_one.duplicates == [one[0].client_msg_uuid]
    assert not resent_one.inserted
    assert resent_batch.duplicates == [m.client_msg_uuid for m in batch]
    assert not resent_batch.inserted
    # Nothing of the re-sends or the refused batch was kept: the row as it was.
    assert unchanged == before
    assert mixed_result.duplicates == [batch[4].client_msg_uuid, one[0].client_msg_uuid]
    assert mixed_result.inserted == [m.client_msg_uuid for m in mixed[1:4]]
    assert mixed_result.first_seq == 7
    assert [m.seq for m in stored] == list(range(1, 10))
    assert [m.content for m in stored][-3:] == ["fresh 0", "fresh 1", "fresh 2"]
    assert (after[0] - before[0], after[1] - before[1], after[6] - before[6]) == (3, 3, 3)
    assert _backlog(citus_url, sid) == [*backlog, (7, 3)]


def test_a_call_that_writes_nothing_leaves_the_row_as_it_was(citus_url: str) -> None:
    """On an existing session of the open day, where the block updates the row first:
    the parked messages ('q'), the remembered row gone ('m'), and a tombstone ('x')."""
    parked, lost, erased = (f"{kind}-" + uuid.uuid4().hex[:8] for kind in "qmx")
    results: list[AppendResult] = []
    with (
        RemoteCommands() as remote,
        open_repository(citus_url) as repository,
        TranscriptWriter(repository) as writer,
    ):
        # 'q': a writer's batch behind the session's parked messages.
        repository.append(parked, _messages("first", 1))
        session = repository.get_session(parked)
        writer.outbox.park(parked, _messages("parked", 1), session, reason="t")
        before = _row(citus_url, parked)
        batch = repository.prepare(parked, _messages("after", 1))

        def queued() -> None:
            with pytest.raises(QueuedBehindOutbox):
                repository.append_prepared(batch, behind_outbox=True)

        _one_call("queued", remote.during(queued))
        assert _row(citus_url, parked) == before
        assert _seqs(citus_url, parked) == [1]

        # 'm': a re-flush of acknowledged messages and a new one, the tip's row gone
        # behind the memory's back: the call answers 'm', the whole batch is sent again.
        transcript = _messages("kept", 3)
        repository.append(lost, transcript)
        execute(citus_url, "DELETE FROM messages WHERE session_id = %s AND seq = 3", [lost])
        before = _row(citus_url, lost)
        newer = [*transcript, *_messages("newer", 1)]
        sent = remote.during(lambda: results.append(repository.append(lost, newer)))
        after = _row(citus_url, lost)
        _calls("lost tip", sent, 2)
        assert results[-1].inserted == [transcript[2].client_msg_uuid, newer[3].client_msg_uuid]
        assert _seqs(citus_url, lost) == [1, 2, 4, 5]
        # Counted once: the two rows the second call inserted, none the first undid.
        assert (after[0] - before[0], after[1] - before[1], after[6] - before[6]) == (2, 2, 2)

        # 'x': a session erased, then written again (a new message in an erased session
        # is stored): its tombstone is there while its row is, so each call answers 'x'
        # after the block's update, and the store screens the batch and sends it again.
        # Made after the erasure (one made before it is screened out as erased).
        repository.append(erased, _messages("gone", 2))
        repository.erase(session_id=erased, scrub=False)
        repository.append(erased, [Message(role="user", content="again")])
        before = _row(citus_url, erased)
        more = [Message(role="user", content=f"more {n}") for n in range(2)]
        sent = remote.during(lambda: repository.append(erased, more))
        after = _row(citus_url, erased)
        _calls("erased session", sent, 2)
        stored = repository.load_transcript(erased)
    assert [m.content for m in stored] == ["again", "more 0", "more 1"]
    assert [m.seq for m in stored] == [1, 2, 3]
    assert (after[0] - before[0], after[1] - before[1]) == (2, 2)


def test_racing_appenders_number_without_a_gap(citus_url: str) -> None:
    """Four appenders on one session, each sending new messages and re-sending the
    others': every key stored once, seqs 1..n, the counters n."""
    sid = "race-" + uuid.uuid4().hex[:8]
    shared = _messages("shared", 3)
    with open_repository(citus_url) as repository:
        repository.append(sid, _messages("first", 1))
        start = threading.Barrier(4)
        failures: list[BaseException] = []

        def appender(index: int) -> None:
            try:
                with open_repository(citus_url) as own:
                    start.wait(10)
                    for turn in range(5):
                        own.append(sid, [*shared, *_messages(f"w{index} t{turn}", 2)])
            except BaseException as exc:  # reported below, with the others'
                failures.append(exc)

        threads = [threading.Thread(target=appender, args=(n,)) for n in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        stored = repository.load_transcript(sid)
        session = repository.get_session(sid)
    assert not failures, failures
    assert [m.seq for m in stored] == list(range(1, 1 + 1 + 3 + 4 * 5 * 2))
    assert len({m.client_msg_uuid for m in stored}) == len(stored)
    assert session.message_count == len(stored)
    row = _row(citus_url, sid)
    assert (row[0], row[6]) == (len(stored) + 1, len(stored))


def _bodies(url: str) -> list[str]:
    """The text of the schema's function, on the coordinator then on each worker."""
    probe = (
        f"SELECT prosrc FROM pg_proc WHERE proname = '{APPEND_FUNCTION}' "
        "AND pronamespace = '{0}'::regnamespace"
    )
    with psycopg.connect(conninfo(url), autocommit=True) as conn:
        schema = str(conn.execute("SELECT current_schema()").fetchone()[0])  # type: ignore[index]
        sql = probe.format(schema)
        here = str(conn.execute(sql).fetchone()[0])  # type: ignore[index]
        workers = conn.execute(
            "SELECT result FROM run_command_on_workers(%s) ORDER BY nodeport", [sql]
        ).fetchall()
    return [here, *(str(row[0]) for row in workers)]


def test_the_downgrade_puts_0022s_function_back(empty_citus_url: str) -> None:
    database = Database(empty_citus_url)
    try:
        upgrade(database, "0022")
        at_0022 = _bodies(empty_citus_url)
        upgrade(database)
        at_head = _bodies(empty_citus_url)
        assert len(set(at_head)) == 1  # the same on every node
        assert "SQLSTATE 'SR001'" in at_head[0]
        assert "SQLSTATE 'SR001'" not in at_0022[0]
        downgrade(database, "0022")
        assert _bodies(empty_citus_url) == at_0022
        upgrade(database)
        assert _bodies(empty_citus_url) == at_head
        with RemoteCommands() as remote, open_repository(empty_citus_url) as repository:
            repository.append("d", _messages("first", 2))
            sent = remote.during(lambda: repository.append("d", _messages("then", 1)))
            assert repository.get_session("d").message_count == 3
        _one_call("after the round trip", sent)
        assert _seqs(empty_citus_url, "d") == [1, 2, 3]
    finally:
        database.dispose()
