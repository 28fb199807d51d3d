"""The asyncio API: :class:`AsyncSessionRepository` and :class:`AsyncTranscriptWriter`.

Same methods, arguments, results, errors and guarantees as :class:`SessionRepository` and
:class:`TranscriptWriter`, awaited; on aiosqlite (SQLite) and psycopg 3's async
connection (PostgreSQL). Not a second implementation: each method runs the sync class's
own code, whose database waits are awaited on the running event loop (see
:mod:`repo._aio`). A call, once started, runs to its end even if its caller is
cancelled; cancelling ends the wait. A cancelled write has therefore either committed or
not, and sending it again is a no-op either way.

Use one repository from one event loop (its connections belong to that loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any, Literal

from sqlalchemy.engine import URL

from models import (
    AppendResult,
    Message,
    SearchHit,
    Session,
    SessionPage,
    StoredMessage,
)
from repo._aio import TaskPool
from repo._database import Database
from repo.outbox import OutboxStatus
from repo.repository import PreparedBatch, SessionRepository, check_schema
from repo.writer import DrainReport, TranscriptWriter, WriteResult

log = logging.getLogger("sessionrepo.writer")

#: Seconds ``close`` waits for calls still running (cancelled callers', abandoned ones).
CLOSE_TIMEOUT = 30.0


async def open_async_repository(
    url: str | URL | None = None,
    *,
    auto_migrate: bool | None = None,
    require_connection: bool = True,
    search_index: bool = True,
    **options: Any,
) -> AsyncSessionRepository:
    """:func:`repo.open_repository` for asyncio: the same arguments and checks.

    Raises:
        SchemaOutOfDate: the database is not at this code's schema revision.
        BackendUnavailable: the database cannot be reached.
    """
    calls = TaskPool()

    def open_() -> SessionRepository:
        database = Database(url, asynchronous=True, **options)
        check_schema(database, auto_migrate=auto_migrate, require_connection=require_connection)
        return SessionRepository(database, search_index=search_index)

    return AsyncSessionRepository(await calls.call(open_), calls)


class AsyncSessionRepository:
    """:class:`repo.SessionRepository`, awaited. Made by :func:`open_async_repository`.

    Every method means what the sync one means (:class:`repo.contract.SessionStore`
    states the guarantees); only the waiting differs.
    """

    def __init__(self, repository: SessionRepository, calls: TaskPool | None = None) -> None:
        if not repository.database.asynchronous:
            raise ValueError("use open_async_repository(): this repository is synchronous")
        self._repository = repository
        self._calls = calls or TaskPool()

    @property
    def backend(self) -> str:
        return self._repository.backend

    @property
    def database(self) -> Database:
        return self._repository.database

    def __repr__(self) -> str:
        return f"AsyncSessionRepository({self.database.display_url})"

    async def __aenter__(self) -> AsyncSessionRepository:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # -- sessions -------------------------------------------------------------------

    async def create_session(self, session_id: str, **fields: Any) -> Session:
        return await self._calls.call(self._repository.create_session, session_id, **fields)

    async def get_session(self, session_id: str) -> Session:
        return await self._calls.call(self._repository.get_session, session_id)

    async def list_sessions(
        self,
        *,
        source: str | None = None,
        user_id: str | None = None,
        status: Literal["open", "ended"] | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> SessionPage:
        return await self._calls.call(
            self._repository.list_sessions,
            source=source,
            user_id=user_id,
            status=status,
            limit=limit,
            cursor=cursor,
        )

    async def end_session(self, session_id: str, reason: str) -> bool:
        return await self._calls.call(self._repository.end_session, session_id, reason)

    async def reopen_session(self, session_id: str) -> bool:
        return await self._calls.call(self._repository.reopen_session, session_id)

    async def resolve_tip(self, session_id: str) -> Session:
        return await self._calls.call(self._repository.resolve_tip, session_id)

    async def session_chain(self, session_id: str) -> list[Session]:
        return await self._calls.call(self._repository.session_chain, session_id)

    # -- messages -------------------------------------------------------------------

    async def append(
        self,
        session_id: str,
        messages: Iterable[Message | Mapping[str, Any]],
        **session_defaults: Any,
    ) -> AppendResult:
        # Validated here, before the call starts: bad input raises to the caller
        # whether or not it is cancelled later, and nothing is written.
        batch = self._repository.prepare(session_id, messages, **session_defaults)
        return await self._calls.call(self._repository.append_prepared, batch)

    def prepare(
        self,
        session_id: str,
        messages: Iterable[Message | Mapping[str, Any]],
        **session_defaults: Any,
    ) -> PreparedBatch:
        """:meth:`repo.SessionRepository.prepare`: validation only, no I/O, so not awaited."""
        return self._repository.prepare(session_id, messages, **session_defaults)

    async def append_prepared(
        self, batch: PreparedBatch, *, timeout: float | None = None
    ) -> AppendResult:
        return await self._calls.call(self._repository.append_prepared, batch, timeout=timeout)

    async def load_transcript(
        self,
        session_id: str,
        *,
        after_seq: int | None = None,
        before_seq: int | None = None,
        limit: int | None = None,
        include_ancestors: bool = False,
    ) -> list[StoredMessage]:
        return await self._calls.call(
            self._repository.load_transcript,
            session_id,
            after_seq=after_seq,
            before_seq=before_seq,
            limit=limit,
            include_ancestors=include_ancestors,
        )

    # -- search ---------------------------------------------------------------------

    async def search(
        self,
        query: str,
        *,
        session_id: str | None = None,
        source: str | None = None,
        role: str | None = None,
        user_id: str | None = None,
        since: datetime | float | None = None,
        until: datetime | float | None = None,
        order: Literal["rank", "newest"] = "rank",
        limit: int = 20,
        cursor: int | str | None = None,
    ) -> list[SearchHit]:
        return await self._calls.call(
            self._repository.search,
            query,
            session_id=session_id,
            source=source,
            role=role,
            user_id=user_id,
            since=since,
            until=until,
            order=order,
            limit=limit,
            cursor=cursor,
        )

    async def reindex(self, *, progress: Callable[[int, int], None] | None = None) -> int:
        return await self._calls.call(self._repository.reindex, progress=progress)

    async def search_index_state(self) -> tuple[str, str | None]:
        return await self._calls.call(self._repository.search_index_state)

    async def close(self, *, timeout: float = CLOSE_TIMEOUT) -> None:
        """Wait (up to ``timeout`` seconds) for calls still running, then close the
        connections."""
        left = await self._calls.settle(timeout)
        if left:
            log.warning("closing with %d database calls still running", left)
        await self._calls.call(self._repository.close)


class AsyncTranscriptWriter:
    """:class:`repo.TranscriptWriter`, awaited, with the same arguments (but ``workers``:
    primary calls are tasks); its background drainer (:meth:`start`) is an asyncio task.

    No I/O happens here: the outbox is checked (and a SQLite outbox file migrated) by the
    first call that uses it.
    """

    def __init__(
        self,
        repository: AsyncSessionRepository,
        *,
        outbox_url: str | URL | None = None,
        deadline: float = 5.0,
        max_attempts: int = 5,
        batch_size: int = 500,
        lease: float = 60.0,
        backoff_base: float = 0.5,
        backoff_cap: float = 30.0,
    ) -> None:
        self._writer = TranscriptWriter(
            repository._repository,
            outbox_url=outbox_url,
            deadline=deadline,
            max_attempts=max_attempts,
            batch_size=batch_size,
            lease=lease,
            backoff_base=backoff_base,
            backoff_cap=backoff_cap,
        )
        self._calls = TaskPool()
        self._wake = asyncio.Event()
        self._writer.notify_drainer = self._wake.set
        self._drainer: asyncio.Task[None] | None = None

    @property
    def deadline(self) -> float:
        return self._writer.deadline

    @property
    def fault_hook(self) -> Callable[[str], None] | None:
        """Fault injection for crash tests (see :attr:`TranscriptWriter.fault_hook`)."""
        return self._writer.fault_hook

    @fault_hook.setter
    def fault_hook(self, hook: Callable[[str], None] | None) -> None:
        self._writer.fault_hook = hook

    async def __aenter__(self) -> AsyncTranscriptWriter:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def write(
        self,
        session_id: str,
        messages: Iterable[Message | Mapping[str, Any]],
        **session_defaults: Any,
    ) -> WriteResult:
        return await self._calls.call(self._writer.write, session_id, messages, **session_defaults)

    async def drain(
        self, *, session_id: str | None = None, ignore_backoff: bool = False
    ) -> DrainReport:
        return await self._calls.call(
            self._writer.drain, session_id=session_id, ignore_backoff=ignore_backoff
        )

    async def pending(self, session_id: str | None = None) -> int:
        return await self._calls.call(self._writer.pending, session_id)

    async def status(self) -> OutboxStatus:
        return await self._calls.call(self._writer.status)

    async def retry_dead(self, session_id: str | None = None) -> int:
        return await self._calls.call(self._writer.retry_dead, session_id)

    def start(self, *, interval: float = 1.0) -> None:
        """Run the drainer as a task of the running loop until :meth:`stop` or
        :meth:`close`: at once (startup recovery), whenever a batch is parked or a retry
        falls due, and at least every ``interval`` seconds."""
        if self._drainer is not None:
            return

        async def loop() -> None:
            while True:
                wait = await self._calls.call(self._writer.drain_round, interval)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), wait)
                self._wake.clear()

        self._drainer = asyncio.get_running_loop().create_task(loop(), name="sessionrepo-drainer")

    async def stop(self) -> None:
        """Stop the drainer task. A drain round in progress finishes in the background
        (each of its steps is bounded by the deadline); :meth:`close` waits for it."""
        drainer, self._drainer = self._drainer, None
        if drainer is not None:
            drainer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await drainer

    async def close(self, *, timeout: float = CLOSE_TIMEOUT) -> None:
        """Stop the drainer, wait (up to ``timeout`` seconds) for calls still running,
        and release the outbox. The repository stays open (it is the caller's)."""
        await self.stop()
        left = await self._calls.settle(timeout)
        left += await self._writer_pool_settle(timeout)
        if left:
            log.warning("closing the writer with %d calls still running", left)
        await self._calls.call(self._writer.close)

    async def _writer_pool_settle(self, timeout: float) -> int:
        # Primary attempts past their deadline run in the writer's own task pools.
        left = 0
        for pool in (self._writer._primary_pool, self._writer._outbox_pool):
            if isinstance(pool, TaskPool):
                left += await pool.settle(timeout)
        return left
