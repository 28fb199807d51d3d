"""What an awaited call returns is the caller's alone once the call has returned: nothing
of the loop, the task pool or aiosqlite's thread still holds it, so it is freed where the
caller drops it, as in the sync API, and not inside the caller's next call (where freeing
10,000 loaded messages cost that call 10 ms)."""

from __future__ import annotations

import asyncio
import gc
import inspect
import weakref
from typing import Any

from sessionrepo import Message, SessionRepository, open_async_repository


class Result:
    """A result the test can watch die (a weak reference to it)."""


def _holders(value: Any) -> list[Any]:
    """What holds ``value`` besides this test's own frames and coroutine."""
    return [
        held
        for held in gc.get_referrers(value)
        if not (inspect.isframe(held) or inspect.iscoroutine(held))
    ]


def test_run_sync_and_a_unit_of_work_leave_nothing_holding_their_result(
    database_url: str,
) -> None:
    async def main() -> None:
        async with await open_async_repository(database_url) as repo:
            result = await repo.run_sync(lambda _repository: Result())
            watched = weakref.ref(result)
            del result
            assert watched() is None  # no await in between: freed where it was dropped

            async with repo.session_transaction("aio:released", source="cli") as tx:
                result = await tx.run_sync(lambda _tx: Result())
                watched = weakref.ref(result)
                del result
                assert watched() is None

    asyncio.run(main())


def test_a_loaded_transcript_is_held_by_its_caller_only(database_url: str) -> None:
    def seed(repository: SessionRepository) -> None:
        repository.append(
            "aio:loaded",
            [Message(role="user", content=f"message {index}") for index in range(200)],
        )

    async def main() -> None:
        async with await open_async_repository(database_url) as repo:
            await repo.run_sync(seed)
            messages = await repo.load_transcript("aio:loaded")
            assert len(messages) == 200
            assert _holders(messages) == []
            assert _holders(messages[0]) == [messages]

    asyncio.run(main())
