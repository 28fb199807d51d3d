"""What only the async API can get wrong: cancellation, many tasks at once, the writer's
deadline and its drainer as asyncio tasks.

The contract itself (append, sessions, transcripts, search) runs on the async API in the
modules marked ``contract`` (see ``conftest.py``); here each test drives its own event
loop with ``asyncio.run``.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy import text

from sessionrepo import (
    AsyncSessionRepository,
    AsyncTranscriptWriter,
    BackendUnavailable,
    InvalidMessage,
    NotFound,
    open_async_repository,
)

from support.harness import holding_the_write_lock_off_the_loop
from support.outbox_workers import CLOSED_PORT_URL, FlakyRepository, make_message
from support.polling import eventually_async

#: Upper bound for a condition the background drainer must bring about.
DRAINER_TIMEOUT = 15.0


@pytest.fixture(autouse=True)
def _outbox_only_where_the_test_says(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SESSIONREPO_OUTBOX_URL", raising=False)


async def _keys(repo: AsyncSessionRepository, session_id: str) -> list[str]:
    try:
        return [str(m.client_msg_uuid) for m in await repo.load_transcript(session_id)]
    except NotFound:
        return []


async def _cancel_at_a_random_point(call: Awaitable[Any], rng: random.Random) -> bool:
    """Start ``call``, cancel it at a random point; ``True`` when it returned first
    (acknowledged), ``False`` when the cancellation won."""
    task = asyncio.ensure_future(call)
    draw = rng.random()
    if draw < 0.05:
        pass  # before the call has even started
    elif draw < 0.5:
        for _ in range(rng.randrange(300)):
            await asyncio.sleep(0)  # a point between two steps of the loop
    else:
        await asyncio.sleep(rng.uniform(0, 0.02))  # about 0-3 appends' time
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        return False
    return True


async def _assert_pool_healthy(repo: AsyncSessionRepository) -> None:
    """No connection left checked out or inside a transaction, and the store works."""
    assert await repo._calls.settle(30) == 0
    assert repo.database.engine.pool.checkedout() == 0  # type: ignore[attr-defined]
    if repo.backend == "postgresql":

        def in_transaction(conn: Any) -> int:
            return int(
                conn.execute(
                    text(
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = "
                        "current_database() AND pid <> pg_backend_pid() "
                        "AND state LIKE 'idle in transaction%'"
                    )
                ).scalar_one()
            )

        assert await repo._calls.call(repo.database.read, in_transaction) == 0
    probe = make_message("probe", 0)
    assert len((await repo.append("probe", [probe])).inserted) == 1
    assert await _keys(repo, "probe") == [probe["client_msg_uuid"]]


# -- cancellation ---------------------------------------------------------------------------


def test_a_thousand_cancelled_appends_lose_nothing_acknowledged_and_double_nothing(
    database_url: str,
) -> None:
    async def main() -> None:
        rng = random.Random(20261129)
        async with await open_async_repository(database_url) as repo:
            sent: dict[str, list[dict[str, Any]]] = {}
            acknowledged: set[str] = set()
            cancelled = 0
            for index in range(1000):
                session_id = f"cancel-{index % 7}"
                batch = [
                    make_message(session_id, len(sent.get(session_id, [])) + n)
                    for n in range(rng.randint(1, 3))
                ]
                sent.setdefault(session_id, []).extend(batch)
                if await _cancel_at_a_random_point(repo.append(session_id, batch), rng):
                    acknowledged.update(m["client_msg_uuid"] for m in batch)
                else:
                    cancelled += 1
            await _assert_pool_healthy(repo)

            stored = {sid: await _keys(repo, sid) for sid in sent}
            every = [key for keys in stored.values() for key in keys]
            assert len(every) == len(set(every)), "a message was stored twice"
            assert acknowledged <= set(every), "an acknowledged message was lost"

            # Re-sending everything stores exactly what the cancellations did not.
            missing = 0
            for session_id, messages in sent.items():
                result = await repo.append(session_id, messages)
                assert not result.conflicts
                missing += len(result.inserted)
                assert len(result.duplicates) == len(stored[session_id])
            total = sum(len(messages) for messages in sent.values())
            assert sum([len(await _keys(repo, sid)) for sid in sent]) == total
            print(
                f"\n[cancelled appends] calls=1000 cancelled={cancelled} "
                f"acknowledged={len(acknowledged)} stored_before_resend={len(every)} "
                f"stored_by_resend={missing} total={total}"
            )
            # Cancellation must have hit calls both before and after they committed.
            assert 0 < cancelled < 1000
            assert missing > 0

    asyncio.run(main())


def test_cancelled_writer_calls_lose_nothing_acknowledged_and_double_nothing(
    database_url: str, tmp_path: Path
) -> None:
    async def main() -> None:
        rng = random.Random(7)
        async with await open_async_repository(database_url) as repo:
            flaky = FlakyRepository(repo._sync)
            async with AsyncTranscriptWriter(
                AsyncSessionRepository(flaky), outbox_url=f"sqlite:///{tmp_path / 'outbox.db'}"
            ) as writer:
                sent: list[dict[str, Any]] = []
                acknowledged: set[str] = set()
                for index in range(300):
                    flaky.down = index % 50 >= 40  # outages: those writes park
                    message = make_message("writer", index)
                    sent.append(message)
                    call = writer.write("writer", [message])
                    if await _cancel_at_a_random_point(call, rng):
                        acknowledged.add(message["client_msg_uuid"])
                flaky.down = False
                await writer._calls.settle(30)
                await writer.drain(ignore_backoff=True)
                before = await _keys(repo, "writer")
                assert len(before) == len(set(before))
                assert acknowledged <= set(before)

                for message in sent:  # the gateway re-sends what it was not told about
                    await writer.write("writer", [message])
                await writer.drain(ignore_backoff=True)
                assert await writer.pending() == 0
                after = await _keys(repo, "writer")
                assert sorted(after) == sorted(m["client_msg_uuid"] for m in sent)
            await _assert_pool_healthy(repo)

    asyncio.run(main())


# -- many tasks -----------------------------------------------------------------------------


@pytest.mark.parametrize("backend", [pytest.param("postgres", marks=pytest.mark.postgres)])
def test_two_hundred_tasks_writing_twenty_sessions_store_every_row_in_order(
    database_url: str,
) -> None:
    tasks, sessions, batches, per_batch = 200, 20, 5, 2

    async def writer_task(repo: AsyncSessionRepository, task: int) -> list[str]:
        session_id = f"many-{task % sessions}"
        keys = []
        for batch in range(batches):
            messages = [
                make_message(f"{session_id}-t{task}", batch * per_batch + n)
                for n in range(per_batch)
            ]
            result = await repo.append(session_id, messages)
            assert len(result.inserted) == per_batch
            keys += [m["client_msg_uuid"] for m in messages]
        return keys

    async def main() -> None:
        async with await open_async_repository(database_url, pool_size=10) as repo:
            written = await asyncio.gather(*(writer_task(repo, task) for task in range(tasks)))
            for session in range(sessions):
                stored = await repo.load_transcript(f"many-{session}")
                assert [m.seq for m in stored] == list(range(1, len(stored) + 1))
                position = {str(m.client_msg_uuid): m.seq for m in stored}
                mine = [keys for task, keys in enumerate(written) if task % sessions == session]
                assert len(stored) == sum(len(keys) for keys in mine)
                for keys in mine:  # each task's messages in the order it wrote them
                    seqs = [position[key] for key in keys]
                    assert seqs == sorted(seqs)
            await _assert_pool_healthy(repo)

    asyncio.run(main())


# -- the writer -----------------------------------------------------------------------------


def test_the_async_writer_parks_while_the_primary_is_down_and_its_drainer_task_replays(
    database_url: str, tmp_path: Path
) -> None:
    async def main() -> None:
        async with await open_async_repository(database_url) as repo:
            flaky = FlakyRepository(repo._sync)
            flaky.down = True
            async with AsyncTranscriptWriter(
                AsyncSessionRepository(flaky),
                outbox_url=f"sqlite:///{tmp_path / 'outbox.db'}",
                backoff_base=0.01,
                backoff_cap=0.05,
            ) as writer:
                messages = [make_message("outage", index) for index in range(30)]
                for start in range(0, 30, 3):
                    result = await writer.write("outage", messages[start : start + 3])
                    assert result.status == "parked"
                assert await writer.pending() == 30
                assert await _keys(repo, "outage") == []

                writer.start(interval=0.05)
                flaky.down = False

                async def drained() -> bool:
                    return await writer.pending() == 0

                await eventually_async(
                    drained, "the drainer task replays the outbox", timeout=DRAINER_TIMEOUT
                )
                assert await _keys(repo, "outage") == [m["client_msg_uuid"] for m in messages]
                status = await writer.status()
                assert (status.pending, status.dead) == (0, 0)

    asyncio.run(main())


def test_stopping_the_drainer_as_it_is_woken_ends_it(database_url: str, tmp_path: Path) -> None:
    """A batch parked (waking the drainer) in the loop iteration that ``stop`` cancels it:
    the task ends. (Python 3.11's ``asyncio.wait_for`` returns instead of raising when the
    two meet, and the drainer ran on with ``close`` waiting for it: a CI run hung.)"""

    async def main() -> None:
        async with await open_async_repository(database_url) as repo:
            writer = AsyncTranscriptWriter(repo, outbox_url=f"sqlite:///{tmp_path / 'o.db'}")
            rounds: list[float] = []
            drain_round = writer._sync.drain_round

            def counted(interval: float) -> float:
                wait = drain_round(interval)
                rounds.append(wait)
                return wait

            writer._sync.drain_round = counted  # type: ignore[method-assign]
            writer.start(interval=60.0)

            async def waiting() -> bool:
                return bool(rounds)

            await eventually_async(waiting, "the drainer's first round")
            await asyncio.sleep(0.05)  # it is now waiting for a wake-up
            # In one loop iteration, in this order: the wake-up (what a parked write
            # does), then close()'s first step, which cancels the drainer.
            asyncio.get_running_loop().call_soon(writer._sync.notify_drainer)
            closing = asyncio.ensure_future(writer.close())
            done, _ = await asyncio.wait({closing}, timeout=10)
            assert closing in done, "close() waits for a drainer that never ends"
            assert len(rounds) == 1, rounds  # it stopped without another round

    asyncio.run(main())


def test_the_async_writer_parks_within_its_deadline_when_the_primary_is_held(
    database_url: str, backend: str, tmp_path: Path
) -> None:
    deadline = 1.0

    async def main() -> None:
        async with await open_async_repository(database_url) as repo:
            first = make_message("held", 0)
            await repo.append("held", [first])
            async with AsyncTranscriptWriter(
                repo, outbox_url=f"sqlite:///{tmp_path / 'outbox.db'}", deadline=deadline
            ) as writer:
                async with holding_the_write_lock_off_the_loop(database_url, backend, "held"):
                    started = time.monotonic()
                    result, ticks = await _ticking(writer.write("held", [make_message("held", 1)]))
                    took = time.monotonic() - started
                    assert result.status == "parked"
                    assert took < deadline + 0.5, f"write took {took:.2f}s"
                    assert ticks > 10, "the event loop stalled while the write waited"
                # Behind the parked one, in order, whatever the primary can do now.
                result = await writer.write("held", [make_message("held", 2)])
                assert result.status == "parked"
                report = await writer.drain(ignore_backoff=True)
                assert report.remaining == 0
                stored = await _keys(repo, "held")
                assert stored[0] == first["client_msg_uuid"]
                assert len(stored) == len(set(stored)) == 3
            await _assert_pool_healthy(repo)

    asyncio.run(main())


async def _ticking(call: Awaitable[Any]) -> tuple[Any, int]:
    """``call``'s result, and how many 10 ms ticks another task got while it ran."""
    ticks = 0
    task = asyncio.ensure_future(call)
    while not task.done():
        ticks += 1
        await asyncio.sleep(0.01)
    return await task, ticks


def test_invalid_input_raises_to_the_caller_and_writes_nothing(database_url: str) -> None:
    async def main() -> None:
        async with await open_async_repository(database_url) as repo:
            with pytest.raises(InvalidMessage):
                await repo.append("bad", [{"role": "wizard", "content": "x"}])
            with pytest.raises(NotFound):
                await repo.get_session("bad")
            async with AsyncTranscriptWriter(repo) as writer:
                with pytest.raises(InvalidMessage):
                    await writer.write("bad", [{"role": "user", "content": "\ud800"}])
                assert await writer.pending() == 0

    asyncio.run(main())


def test_an_unreachable_database_raises_backend_unavailable_or_defers_the_check() -> None:
    url = f"postgresql://postgres@127.0.0.1:1/nowhere-{uuid.uuid4().hex[:6]}"

    async def main() -> None:
        with pytest.raises(BackendUnavailable):
            await open_async_repository(url, connect_timeout=1)
        repo = await open_async_repository(url, require_connection=False, connect_timeout=1)
        with pytest.raises(BackendUnavailable):
            await repo.get_session("x")
        await repo.close()

    asyncio.run(main())


def test_a_gateway_starts_with_its_primary_down_and_parks_in_its_outbox_file(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        repo = await open_async_repository(
            CLOSED_PORT_URL, require_connection=False, connect_timeout=1
        )
        async with AsyncTranscriptWriter(
            repo, outbox_url=f"sqlite:///{tmp_path / 'outbox.db'}", deadline=2.0
        ) as writer:
            writer.start(interval=0.05)  # drain rounds fail quietly while it is down
            messages = [make_message("down", index) for index in range(4)]
            results = await asyncio.gather(
                *(writer.write("down", [message]) for message in messages)
            )
            assert {result.status for result in results} == {"parked"}
            assert await writer.pending("down") == 4
        await repo.close()

    asyncio.run(main())


@pytest.mark.parametrize("backend", [pytest.param("postgres", marks=pytest.mark.postgres)])
def test_connections_the_server_dropped_are_replaced_on_use(database_url: str) -> None:
    async def main() -> None:
        async with await open_async_repository(database_url, pool_size=3) as repo:
            first = [make_message("dropped", index) for index in range(3)]
            await asyncio.gather(*(repo.append("dropped", [message]) for message in first))
            with psycopg.connect(database_url, autocommit=True) as admin:
                terminated = admin.execute(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                ).fetchone()
            assert terminated is not None
            assert terminated[0] >= 1
            second = make_message("dropped", 3)
            assert len((await repo.append("dropped", [second])).inserted) == 1
            assert len(await _keys(repo, "dropped")) == 4
            await _assert_pool_healthy(repo)

    asyncio.run(main())
