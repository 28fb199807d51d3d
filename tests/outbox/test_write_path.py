"""The write path's shortcuts, each held to what it must never do.

- The circuit breaker: once the primary failed, writes park at once (no attempt each)
  until a probe finds it back; then they go to it again.
- The in-memory "has this session parked messages?" answer stays exact while other
  processes park and drain through the same SQLite outbox file.
- A drain or catch-up with nothing to do takes no write lock.
- Validation once: a re-flushed dict or ``Message`` is not validated again, but a dict
  changed in place since is, and its re-send is reported as the conflict it is.
- The memory of what was stored never skips a message the database no longer has.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from sessionrepo import Message, SessionRepository, TranscriptWriter, open_repository
from sessionrepo.models import message as message_module

from support import outbox_workers as workers
from support.harness import SPAWN, until_primary_back
from support.outbox_workers import FlakyRepository, keys_of, make_message


def _keys(repository: SessionRepository, session_id: str) -> list[str]:
    return [str(m.client_msg_uuid) for m in repository.load_transcript(session_id)]


# -- the circuit breaker ------------------------------------------------------------------


def test_after_a_failure_writes_park_at_once_until_a_probe_finds_the_primary_back(
    database_url: str, tmp_path: Path
) -> None:
    primary = FlakyRepository.open(database_url)
    writer = TranscriptWriter(
        primary, outbox_url=f"sqlite:///{tmp_path / 'outbox.db'}", probe_interval=0.1
    )
    try:
        messages = [make_message(f"s{index}", index) for index in range(6)]
        primary.down = True
        assert writer.write("s0", messages[:1]).status == "parked"
        tried = len(primary.attempts)
        assert writer.primary_down is not None
        for index in range(1, 4):  # other sessions too: the primary is known to be down
            result = writer.write(f"s{index}", messages[index : index + 1])
            assert result.status == "parked"
            assert result.reason is not None
            assert "unavailable" in result.reason
        assert len(primary.attempts) == tried  # none of them tried the primary

        primary.down = False
        until_primary_back(writer, seconds=10)  # the probe, once per interval
        assert writer.write("s4", messages[4:5]).status == "stored"
        report = writer.drain()
        assert (report.replayed, report.remaining) == (4, 0)
        for index in range(5):
            assert _keys(primary, f"s{index}") == keys_of(messages[index : index + 1])
    finally:
        writer.close()
        primary.close()


def test_a_failed_replay_keeps_the_breaker_and_a_good_one_closes_it(
    database_url: str, tmp_path: Path
) -> None:
    primary = FlakyRepository.open(database_url)
    # A probe interval longer than the test: only a replay can close the breaker.
    writer = TranscriptWriter(
        primary, outbox_url=f"sqlite:///{tmp_path / 'outbox.db'}", probe_interval=600
    )
    try:
        batch = [make_message("s", 0)]
        primary.down = True
        assert writer.write("s", batch).status == "parked"
        assert writer.drain(ignore_backoff=True).failed == 1
        assert writer.primary_down is not None
        primary.down = False
        assert writer.drain(ignore_backoff=True).replayed == 1
        assert writer.primary_down is None
        assert writer.write("s", [make_message("s", 1)]).status == "stored"
    finally:
        writer.close()
        primary.close()


# -- the in-memory parked check, exact across processes -----------------------------------


@pytest.mark.slow
def test_parked_messages_of_another_process_hold_this_ones_writes_behind_them(
    database_url: str, tmp_path: Path
) -> None:
    """Another gateway (its primary down) parks messages of a session in the shared
    outbox file; this gateway's writer, whose primary is fine and which asked about the
    session before, must now queue that session's writes behind them, and once it has
    drained them, write to the primary again."""
    outbox = tmp_path / "outbox.db"
    primary = open_repository(database_url)
    writer = TranscriptWriter(primary, outbox_url=f"sqlite:///{outbox}")
    try:
        first = [make_message("shared", 0)]
        assert writer.write("shared", first).status == "stored"  # asked: nothing parked

        theirs = [make_message("shared", 1), make_message("shared", 2)]
        child = SPAWN.Process(
            target=workers.park_batch,
            kwargs={"outbox_url": f"sqlite:///{outbox}", "session_id": "shared", "batch": theirs},
        )
        child.start()
        child.join(60)
        assert child.exitcode == 0

        mine = [make_message("shared", 3)]
        result = writer.write("shared", mine)
        assert result.status == "parked"
        assert result.reason is not None
        assert "queued behind" in result.reason
        assert writer.write("other", [make_message("other", 0)]).status == "stored"

        report = writer.drain()
        assert (report.replayed, report.remaining) == (3, 0)
        assert _keys(primary, "shared") == keys_of([*first, *theirs, *mine])
        later = [make_message("shared", 4)]
        assert writer.write("shared", later).status == "stored"  # drained: no queue
        assert _keys(primary, "shared") == keys_of([*first, *theirs, *mine, *later])
    finally:
        writer.close()
        primary.close()


# -- nothing to do, no write lock ---------------------------------------------------------


@pytest.mark.parametrize("backend", [pytest.param("sqlite", marks=pytest.mark.sqlite)])
def test_an_idle_drain_round_takes_no_write_lock(database_url: str, tmp_path: Path) -> None:
    outbox = tmp_path / "outbox.db"
    primary = open_repository(database_url, busy_timeout=5.0)
    writer = TranscriptWriter(primary, outbox_url=f"sqlite:///{outbox}")
    try:
        assert writer.write("s", [make_message("s", 0)]).status == "stored"
        primary.catch_up_search_index()  # the backlog empty
        primary.catch_up_semantic_index()  # and the vectors made (where a model is installed)
        lockers = []
        for path in (database_url.removeprefix("sqlite:///"), str(outbox)):
            locker = sqlite3.connect(path, isolation_level=None)
            locker.execute("BEGIN IMMEDIATE")  # held: a write transaction would wait 5 s
            lockers.append(locker)
        started = time.monotonic()
        writer.drain_round(1.0)
        assert time.monotonic() - started < 2.0
        for locker in lockers:
            locker.rollback()
            locker.close()
    finally:
        writer.close()
        primary.close()


# -- validation once ----------------------------------------------------------------------


def test_a_reflushed_dict_is_not_validated_again(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with open_repository(database_url) as repo:
        transcript = [make_message("s", index) for index in range(5)]
        repo.append("s", transcript)
        calls = 0
        real = message_module.Message.from_openai.__func__  # type: ignore[attr-defined]

        def counting(cls: type[Message], data: Any) -> Message:
            nonlocal calls
            calls += 1
            return real(cls, data)  # type: ignore[no-any-return]

        monkeypatch.setattr(message_module.Message, "from_openai", classmethod(counting))
        transcript.append(make_message("s", 5))
        result = repo.append("s", transcript)
        assert calls == 1  # only the new one
        assert len(result.inserted) == 1
        assert len(result.duplicates) == 5
        assert _keys(repo, "s") == keys_of(transcript)


def test_a_dict_changed_in_place_is_a_conflict_not_a_duplicate(database_url: str) -> None:
    with open_repository(database_url) as repo:
        transcript = [make_message("s", index) for index in range(5)]  # index 4: tool calls
        repo.append("s", transcript)
        transcript[4]["tool_calls"][0]["function"]["arguments"] = '{"n": 99}'  # deep inside
        transcript[1]["content"] = "edited"
        result = repo.append("s", transcript)
        assert sorted(map(str, result.conflicts)) == sorted(keys_of([transcript[1], transcript[4]]))
        assert len(result.duplicates) == 3
        stored = repo.load_transcript("s")
        assert stored[1].content != "edited"  # the stored row is unchanged


def test_a_message_object_reflushed_is_a_duplicate(database_url: str) -> None:
    with open_repository(database_url) as repo:
        transcript = [Message.from_openai(make_message("s", index)) for index in range(3)]
        repo.append("s", transcript)
        result = repo.append("s", transcript)
        assert (len(result.inserted), len(result.duplicates)) == (0, 3)


# -- the memory of what was stored is never the authority ---------------------------------


def _delete_messages(url: str, backend: str, session_id: str) -> None:
    """What a restore from an older backup (or a hand-made delete) does to a session."""
    if backend == "sqlite":
        with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
            conn.execute("DELETE FROM messages WHERE session_id = ?", (session_id,))
            conn.execute("DELETE FROM search_backlog WHERE session_id = ?", (session_id,))
            conn.execute("UPDATE sessions SET next_seq = 1, message_count = 0")
        return
    with psycopg.connect(url) as conn:
        conn.execute("DELETE FROM messages WHERE session_id = %s", (session_id,))
        conn.execute("DELETE FROM search_backlog WHERE session_id = %s", (session_id,))
        conn.execute("UPDATE sessions SET next_seq = 1, message_count = 0")


@pytest.mark.parametrize("new_ones", [0, 2])
def test_a_reflush_stores_again_what_the_database_lost(
    database_url: str, backend: str, new_ones: int
) -> None:
    with open_repository(database_url) as repo:
        transcript = [make_message("s", index) for index in range(4)]
        repo.append("s", transcript)
        repo.append("s", transcript)  # remembered now
        _delete_messages(database_url, backend, "s")
        transcript += [make_message("s", 4 + index) for index in range(new_ones)]
        result = repo.append("s", transcript)
        assert len(result.inserted) == len(transcript)
        assert _keys(repo, "s") == keys_of(transcript)
