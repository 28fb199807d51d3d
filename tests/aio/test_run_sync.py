"""AsyncSessionRepository.run_sync: several sync calls that belong together, run from
asyncio on the repository's own task pool, on both backends."""

from __future__ import annotations

import asyncio

import pytest

from sessionrepo import ArgumentTypeError, SessionRepository, open_async_repository


def test_run_sync_runs_a_sync_unit_of_work_and_returns_its_result(database_url: str) -> None:
    def work(repository: SessionRepository) -> int:
        with repository.session_transaction("aio:run-sync", source="cli") as tx:
            tx.append([{"role": "user", "content": "one"}, {"role": "user", "content": "two"}])
            return tx.next_seq

    async def main() -> None:
        async with await open_async_repository(database_url) as repo:
            next_seq = await repo.run_sync(work)
            stored = await repo.load_transcript("aio:run-sync")
            assert [m.content for m in stored] == ["one", "two"]
            assert next_seq == stored[-1].seq + 1  # the seq after the unit of work's rows

    asyncio.run(main())


def test_run_sync_refuses_what_is_not_callable_and_runs_nothing(database_url: str) -> None:
    async def main() -> None:
        async with await open_async_repository(database_url) as repo:
            with pytest.raises(ArgumentTypeError, match="fn"):
                await repo.run_sync("not a function")  # type: ignore[arg-type]
            assert (await repo.list_sessions()).sessions == []

    asyncio.run(main())
