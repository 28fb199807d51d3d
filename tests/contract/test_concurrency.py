"""Concurrency: many writers, one store; nothing doubled, lost, reordered or refused.

The multi-process tests start their children with the ``spawn`` method (a fresh
interpreter, as separate gateway processes would be) and release them together through a
barrier. Their worker functions live in ``tests/support/workers.py``.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from typing import Any

import psycopg
import pytest
from sqlalchemy.engine import make_url

from sessionrepo import Message, SessionRepository, open_repository

from support import workers
from support.harness import RUN_TIMEOUT, SPAWN, ThreadCall, children, collect_reports

pytestmark = pytest.mark.contract  # every repo test runs on the sync and async API

#: Upper bound for a whole multi-process run; a healthy one takes a few seconds.
#: How long a call that must not wait may take, at most (it takes milliseconds).
NO_WAIT_BOUND = 10.0

POSTGRES_ONLY = pytest.mark.parametrize(
    "backend", [pytest.param("postgres", marks=pytest.mark.postgres)]
)
SQLITE_ONLY = pytest.mark.parametrize("backend", [pytest.param("sqlite", marks=pytest.mark.sqlite)])


# -- helpers ------------------------------------------------------------------------------


def _start(processes: list[Any], target: Callable[..., None], **kwargs: Any) -> None:
    process = SPAWN.Process(target=target, kwargs=kwargs, daemon=True)
    process.start()
    processes.append(process)


def _keys(messages: list[Any]) -> list[str]:
    return [str(m.client_msg_uuid) for m in messages]


# -- many processes, one session ----------------------------------------------------------

FLUSHERS = 6
PER_FLUSHER = 200


@pytest.mark.slow
def test_six_processes_flushing_one_session_store_each_message_once_in_their_order(
    database_url: str,
) -> None:
    start = SPAWN.Barrier(FLUSHERS)
    results = SPAWN.Queue()
    with children() as processes:
        for worker in range(FLUSHERS):
            _start(
                processes,
                workers.flush_one_session,
                url=database_url,
                session_id="shared",
                worker=worker,
                count=PER_FLUSHER,
                seed=1000 + worker,
                start=start,
                results=results,
            )
        reports = sorted(collect_reports(results, FLUSHERS, processes), key=lambda r: r["worker"])

    assert [error for report in reports for error in report["errors"]] == []
    made = {report["worker"]: report["made"] for report in reports}
    assert all(len(keys) == PER_FLUSHER for keys in made.values())
    resent_calls = 0
    for report in reports:
        for call in report["calls"]:
            fresh = set(call["fresh"])
            # Keys are private to a worker, so each call's outcome is known exactly.
            assert call["conflicts"] == [], call
            assert call["inserted"] == call["fresh"], call
            assert call["duplicates"] == [k for k in call["sent"] if k not in fresh], call
            resent_calls += call["kind"] != "new"
    assert resent_calls > 0
    inserted = [k for report in reports for call in report["calls"] for k in call["inserted"]]
    assert len(inserted) == FLUSHERS * PER_FLUSHER
    assert set(inserted) == {k for keys in made.values() for k in keys}

    with open_repository(database_url) as repository:
        transcript = repository.load_transcript("shared")
        session = repository.get_session("shared")
    assert [m.seq for m in transcript] == list(range(1, FLUSHERS * PER_FLUSHER + 1))
    seq_of = dict(zip(_keys(transcript), (m.seq for m in transcript), strict=True))
    assert len(seq_of) == FLUSHERS * PER_FLUSHER
    for worker, keys in made.items():
        seqs = [seq_of[k] for k in keys]
        assert seqs == sorted(seqs), f"worker {worker}'s messages are out of its order"
    for report in reports:
        for call in report["calls"]:
            if call["inserted"]:
                first = call["first_seq"]
                assert [seq_of[k] for k in call["inserted"]] == list(
                    range(first, first + len(call["inserted"]))
                ), "a batch was not stored contiguously from first_seq"
    assert session.message_count == FLUSHERS * PER_FLUSHER
    assert session.tool_call_count == FLUSHERS * (PER_FLUSHER // 5)

    # The workers did run at the same time (else this test proved nothing about races).
    owner = {k: worker for worker, keys in made.items() for k in keys}
    runs = 1 + sum(a != b for a, b in pairwise(owner[k] for k in _keys(transcript)))
    assert runs > FLUSHERS


# -- SQLite: many processes on one file ---------------------------------------------------

SQLITE_WRITERS = 8
SQLITE_READERS = 2
SQLITE_ROUNDS = 30
SHARED = ["shared-a", "shared-b"]


@pytest.mark.slow
@SQLITE_ONLY
def test_sqlite_eight_processes_on_one_file_never_see_locked(database_url: str) -> None:
    with open_repository(database_url) as repository:
        for session_id in SHARED:
            repository.create_session(session_id, source="test")

    start = SPAWN.Barrier(SQLITE_WRITERS + SQLITE_READERS)
    stop = SPAWN.Event()
    writer_results = SPAWN.Queue()
    reader_results = SPAWN.Queue()
    with children() as processes:
        for worker in range(SQLITE_WRITERS):
            _start(
                processes,
                workers.sqlite_writer,
                url=database_url,
                worker=worker,
                rounds=SQLITE_ROUNDS,
                shared_sessions=SHARED,
                seed=2000 + worker,
                start=start,
                results=writer_results,
            )
        for reader in range(SQLITE_READERS):
            _start(
                processes,
                workers.sqlite_reader,
                url=database_url,
                reader=reader,
                shared_sessions=SHARED,
                start=start,
                stop=stop,
                results=reader_results,
            )
        writers = collect_reports(writer_results, SQLITE_WRITERS, processes)
        stop.set()
        readers = collect_reports(reader_results, SQLITE_READERS, processes)

    # Not "database is locked", nor anything else: no caller saw an exception.
    assert [error for report in writers + readers for error in report["errors"]] == []
    assert [gap for report in readers for gap in report["gaps"]] == []
    assert all(report["reads"] > 0 for report in readers)

    expected: dict[str, list[list[str]]] = {}
    for report in writers:
        for session_id, keys in report["sent"].items():
            expected.setdefault(session_id, []).append(keys)
    assert sorted(expected) == sorted([*SHARED, *(f"own-{w}" for w in range(SQLITE_WRITERS))])
    with open_repository(database_url) as repository:
        for session_id, per_writer in expected.items():
            stored = _keys(repository.load_transcript(session_id))
            assert sorted(stored) == sorted(k for keys in per_writer for k in keys), session_id
            position = {k: i for i, k in enumerate(stored)}
            for keys in per_writer:
                assert [position[k] for k in keys] == sorted(position[k] for k in keys)
            assert repository.get_session(session_id).message_count == len(stored)


# -- PostgreSQL: a locked session does not hold up the others -----------------------------


def _blocked_by(monitor: psycopg.Connection[Any], pid: int) -> int:
    """How many backends are waiting for a lock that backend ``pid`` holds."""
    row = monitor.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))", (pid,)
    ).fetchone()
    assert row is not None
    return int(row[0])


@POSTGRES_ONLY
def test_postgres_appenders_to_different_sessions_do_not_wait_for_each_other(
    repo: SessionRepository, database_url: str
) -> None:
    repo.append("A", [Message(role="user", content="a0")])
    repo.append("B", [Message(role="user", content="b0")])
    conninfo = make_url(database_url).set(drivername="postgresql")
    dsn = conninfo.render_as_string(hide_password=False)
    a1 = Message(role="user", content="a1")
    b1 = Message(role="user", content="b1")

    with psycopg.connect(dsn) as holder, psycopg.connect(dsn, autocommit=True) as monitor:
        # Another writer sits on session A's row, mid-transaction.
        holder.execute("SELECT id FROM sessions WHERE id = 'A' FOR UPDATE")
        holder_pid = holder.info.backend_pid

        append_a = ThreadCall(lambda: repo.append("A", [a1]))
        deadline = time.monotonic() + NO_WAIT_BOUND
        while _blocked_by(monitor, holder_pid) == 0:
            assert not append_a.done.is_set(), f"append to A did not wait: {append_a.error!r}"
            assert time.monotonic() < deadline, "append to A never queued behind the lock"
            time.sleep(0.01)

        append_b = ThreadCall(lambda: repo.append("B", [b1]))
        assert append_b.done.wait(NO_WAIT_BOUND), "append to B waited for session A's lock"
        assert append_b.error is None
        assert append_b.result.inserted == [b1.client_msg_uuid]

        assert not append_a.done.is_set()
        assert _blocked_by(monitor, holder_pid) == 1

        holder.rollback()
        assert append_a.done.wait(NO_WAIT_BOUND), "append to A stayed blocked after release"
        assert append_a.error is None
        assert append_a.result.inserted == [a1.client_msg_uuid]
        append_a.join()
        append_b.join()

    assert [m.content for m in repo.load_transcript("A")] == ["a0", "a1"]
    assert [m.content for m in repo.load_transcript("B")] == ["b0", "b1"]


# -- listing while sessions are being created ---------------------------------------------

ORIGINALS = 120
PAGE = 25
BASE = datetime(2024, 1, 1, tzinfo=UTC)
#: Originals come in groups of this many with equal activity (sessions imported or
#: started in the same instant), so that pages also end in the middle of a tie.
TIED = 3


def _started(i: int) -> datetime:
    return BASE + timedelta(minutes=i // TIED)


def _insert_round(repository: SessionRepository, round_: int) -> list[tuple[str, datetime]]:
    """What another gateway does between two page fetches: new sessions with new
    messages (newest activity of all), one back-dated between the originals, and one
    tied with an original. Returns the back-dated sessions with their activity."""
    for j in range(3):
        repository.append(
            f"new-{round_}-{j}", [Message(role="user", content=f"hello {j}")], source="test"
        )
    minute = (round_ * 37 + 11) % (ORIGINALS // TIED)
    backdated = BASE + timedelta(minutes=minute, seconds=30)
    repository.create_session(f"old-{round_}", source="test", started_at=backdated)
    repository.create_session(f"tie-{round_}", source="test", started_at=_started(minute))
    return [(f"old-{round_}", backdated)]


def test_listing_pages_stay_stable_while_sessions_are_created(
    repo: SessionRepository, database_url: str
) -> None:
    originals = [f"orig-{i:03d}" for i in range(ORIGINALS)]
    for i, session_id in enumerate(originals):
        repo.create_session(session_id, source="test", started_at=_started(i))
    for session_id in originals[::10]:  # recent activity on some of them
        repo.append(session_id, [Message(role="user", content="still here")])

    requests: queue.Queue[int | None] = queue.Queue()
    acks: queue.Queue[list[tuple[str, datetime]] | BaseException] = queue.Queue()

    def other_gateway() -> None:
        with open_repository(database_url) as repository:
            while (round_ := requests.get()) is not None:
                try:
                    acks.put(_insert_round(repository, round_))
                except BaseException as exc:
                    acks.put(exc)

    inserter = threading.Thread(target=other_gateway, daemon=True)
    inserter.start()
    pages = []
    unread_backdated: list[tuple[str, datetime]] = []
    try:
        cursor = None
        while True:
            page = repo.list_sessions(limit=PAGE, cursor=cursor)
            assert len(page.sessions) <= PAGE
            pages.append(page.sessions)
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
            requests.put(len(pages))  # the other gateway writes between two fetches
            ack = acks.get(timeout=NO_WAIT_BOUND)
            assert not isinstance(ack, BaseException), ack
            boundary = page.sessions[-1].last_active_at
            assert boundary is not None
            unread_backdated += [(sid, when) for sid, when in ack if when < boundary]
    finally:
        requests.put(None)
        inserter.join(RUN_TIMEOUT)

    listed = [session for page_ in pages for session in page_]
    ids = [s.id for s in listed]
    seen = Counter(ids)
    assert [sid for sid, n in seen.items() if n > 1] == []
    assert [sid for sid in originals if seen[sid] != 1] == []
    activity = [s.last_active_at for s in listed]
    assert all(a is not None and b is not None and a >= b for a, b in pairwise(activity))
    # Sessions created further down than the pages already read are reached, not skipped.
    assert unread_backdated
    assert {sid for sid, _ in unread_backdated} <= set(ids)
    assert not any(sid.startswith("new-") for sid in ids)
    # Some page ended inside a group of equal activity (else ties went untested).
    assert any(a[-1].last_active_at == b[0].last_active_at for a, b in pairwise(pages))
