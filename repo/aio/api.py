"""The asyncio API: :class:`AsyncSessionRepository` and :class:`AsyncTranscriptWriter`.

Same methods, arguments, results, errors and guarantees as :class:`SessionRepository` and
:class:`TranscriptWriter`, awaited; on aiosqlite (SQLite) and psycopg 3's async
connection (PostgreSQL). Not a second implementation: each method is the sync class's own
method (:func:`sessionrepo.store.bridge.awaited`: its signature and its contract's
docstring too), run with its database waits awaited on the running event loop (see
:mod:`sessionrepo.store.bridge`). A call, once
started, runs to its end even if its caller is cancelled; cancelling ends the wait. A
cancelled write has therefore either committed or not, and sending it again is a no-op
either way.

Use one repository from one event loop (its connections belong to that loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal, TypeVar

from sqlalchemy.engine import URL

from sessionrepo.aio.transaction import AsyncSessionTransaction
from sessionrepo.errors import ArgumentTypeError
from sessionrepo.models import AppendResult, Message
from sessionrepo.outbox.writer import TranscriptWriter
from sessionrepo.search.embedders import Embedder
from sessionrepo.store.arguments import check_choice, check_instance, check_int, check_seconds
from sessionrepo.store.bridge import AsyncFacade, TaskPool, awaited
from sessionrepo.store.database import Database
from sessionrepo.store.memory import DEFAULT_MEMORY_BYTES
from sessionrepo.store.repository import (
    PreparedBatch,
    SessionRepository,
    check_open_arguments,
    choose_embedder,
    with_tenant,
)
from sessionrepo.store.schema import check_schema
from sessionrepo.store.semantic import DEFAULT_VECTOR_MEMORY

log = logging.getLogger("sessionrepo")

#: Seconds ``close`` waits for calls still running (cancelled callers', abandoned ones).
CLOSE_TIMEOUT = 30.0

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")


def _documented_as(method: Callable[..., Any]) -> Callable[[F], F]:
    """Give a hand-written awaited method the docstring of the sync one (its contract's:
    :func:`inspect.getdoc` finds it on the protocol), as :func:`awaited` does."""

    def document(function: F) -> F:
        function.__doc__ = inspect.getdoc(method)
        return function

    return document


def _check_close_timeout(timeout: object) -> float | None:
    return None if timeout is None else check_seconds(timeout, "timeout", allow_zero=True)


async def open_async_repository(
    url: str | URL | None = None,
    *,
    auto_migrate: bool | None = None,
    require_connection: bool = True,
    search_index: bool | Literal["immediate"] = True,
    read_only: bool = False,
    append_memory: int = DEFAULT_MEMORY_BYTES,
    embedder: Embedder | bool | None = None,
    semantic_memory: int = DEFAULT_VECTOR_MEMORY,
    **options: Any,
) -> AsyncSessionRepository:
    """:func:`sessionrepo.open_repository` for asyncio: the same arguments and checks.

    Raises:
        SchemaOutOfDate: the database is not at this code's schema revision.
        BackendUnavailable: the database cannot be reached.
        NotARepository: a SQLite file that is not a sessionrepo store, or, ``read_only``,
            no file at all.
        InvalidArgument: an argument or option is invalid or unknown (nothing was
            opened; :class:`~sessionrepo.errors.ArgumentTypeError`: of the wrong type).
    """
    # Checked here, before a task is started: Database() checks the options too.
    check_open_arguments(auto_migrate, require_connection, search_index, read_only, append_memory)
    check_int(semantic_memory, "semantic_memory", minimum=0)
    embedder = choose_embedder(embedder) or False  # checked before anything is opened
    calls = TaskPool()

    def open_() -> SessionRepository:
        database = Database(url, asynchronous=True, read_only=read_only, **with_tenant(options))
        check_schema(
            database,
            auto_migrate=False if read_only else auto_migrate,
            require_connection=require_connection,
        )
        return SessionRepository(
            database,
            search_index=search_index,
            append_memory=append_memory,
            embedder=embedder,
            semantic_memory=semantic_memory,
        )

    return AsyncSessionRepository(await calls.call(open_), calls)


class AsyncSessionRepository(AsyncFacade[SessionRepository]):
    """:class:`sessionrepo.SessionRepository`, awaited. Made by :func:`open_async_repository`.

    Every method means what the sync one means (:class:`sessionrepo.contract.SessionStore`
    states the guarantees); only the waiting differs.
    """

    def __init__(self, repository: SessionRepository, calls: TaskPool | None = None) -> None:
        check_instance(repository, "repository", SessionRepository)
        if not repository.database.asynchronous:
            raise ArgumentTypeError(
                "repository", "use open_async_repository(): this repository is synchronous"
            )
        if calls is not None:
            check_instance(calls, "calls", TaskPool)
        super().__init__(repository, calls)

    @property
    def backend(self) -> str:
        return self._sync.backend

    @property
    def database(self) -> Database:
        return self._sync.database

    @property
    def display_url(self) -> str:
        return self._sync.display_url

    def __repr__(self) -> str:
        return f"AsyncSessionRepository({self.display_url})"

    async def __aenter__(self) -> AsyncSessionRepository:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    create_session = awaited(SessionRepository.create_session)
    get_session = awaited(SessionRepository.get_session)
    list_sessions = awaited(SessionRepository.list_sessions)
    end_session = awaited(SessionRepository.end_session)
    reopen_session = awaited(SessionRepository.reopen_session)
    resolve_tip = awaited(SessionRepository.resolve_tip)
    session_chain = awaited(SessionRepository.session_chain)
    append_prepared = awaited(SessionRepository.append_prepared)
    load_transcript = awaited(SessionRepository.load_transcript)
    load_openai = awaited(SessionRepository.load_openai)
    search = awaited(SessionRepository.search)
    reindex = awaited(SessionRepository.reindex)
    search_index_state = awaited(SessionRepository.search_index_state)
    search_index_backlog = awaited(SessionRepository.search_index_backlog)
    catch_up_search_index = awaited(SessionRepository.catch_up_search_index)
    catch_up_semantic_index = awaited(SessionRepository.catch_up_semantic_index)
    reindex_semantic = awaited(SessionRepository.reindex_semantic)
    semantic_index_state = awaited(SessionRepository.semantic_index_state)
    count_sessions = awaited(SessionRepository.count_sessions)
    session_snapshots = awaited(SessionRepository.session_snapshots)
    count_messages = awaited(SessionRepository.count_messages)
    delete_ended_sessions = awaited(SessionRepository.delete_ended_sessions)
    restore_session = awaited(SessionRepository.restore_session)
    backdate_activity = awaited(SessionRepository.backdate_activity)
    rewind = awaited(SessionRepository.rewind)
    retract = awaited(SessionRepository.retract)
    pop_last = awaited(SessionRepository.pop_last)
    clear_session = awaited(SessionRepository.clear_session)
    compact = awaited(SessionRepository.compact)
    fork_session = awaited(SessionRepository.fork_session)
    erase = awaited(SessionRepository.erase)
    scrub_erased = awaited(SessionRepository.scrub_erased)
    privacy_audit = awaited(SessionRepository.privacy_audit)
    retention_policies = awaited(SessionRepository.retention_policies)
    set_retention_policy = awaited(SessionRepository.set_retention_policy)
    delete_retention_policy = awaited(SessionRepository.delete_retention_policy)
    apply_retention = awaited(SessionRepository.apply_retention)
    record_usage = awaited(SessionRepository.record_usage)
    list_usage = awaited(SessionRepository.list_usage)

    @_documented_as(SessionRepository.append)
    async def append(
        self,
        session_id: str,
        messages: Iterable[Message | Mapping[str, Any]],
        *,
        on_conflict: Literal["report", "raise"] = "report",
        usage: Any = None,
        **session_defaults: Any,
    ) -> AppendResult:
        # Validated before the call starts: bad input raises to the caller, whether or
        # not it is cancelled later, and nothing is written.
        check_choice(on_conflict, "on_conflict", ("report", "raise"))
        batch = self._sync.prepare(session_id, messages, usage=usage, **session_defaults)
        return await self._calls.call(self._sync.append_prepared, batch, on_conflict=on_conflict)

    @_documented_as(SessionRepository.session_transaction)
    def session_transaction(
        self,
        /,
        session_id: str,
        *,
        create: bool = True,
        timeout: float | None = None,
        **session_defaults: Any,
    ) -> AsyncSessionTransaction:
        # Checked here, before ``async with``: no I/O until it is entered.
        sync = self._sync.session_transaction(
            session_id, create=create, timeout=timeout, **session_defaults
        )
        return AsyncSessionTransaction(sync, self._calls)

    async def run_sync(self, fn: Callable[[SessionRepository], T], /) -> T:
        """``fn(repository)`` on the sync repository this one wraps, with its database
        waits awaited on this repository's task pool (as SQLAlchemy's
        ``AsyncConnection.run_sync``): for several sync calls that belong together and
        that the async API has no one method for (a framework adapter's unit of work,
        say). :meth:`close` waits for it like any other call.

        Raises:
            ArgumentTypeError: ``fn`` is not callable (nothing runs).
        """
        if not callable(fn):
            raise ArgumentTypeError("fn", f"must be callable, got {type(fn).__name__}")
        return await self._calls.call(fn, self._sync)

    def prepare(
        self,
        session_id: str,
        messages: Iterable[Message | Mapping[str, Any]],
        *,
        usage: Any = None,
        **session_defaults: Any,
    ) -> PreparedBatch:
        """:meth:`sessionrepo.SessionRepository.prepare`: validation only, no I/O, so not
        awaited."""
        return self._sync.prepare(session_id, messages, usage=usage, **session_defaults)

    async def close(self, *, timeout: float | None = CLOSE_TIMEOUT) -> None:
        """Wait (up to ``timeout`` seconds; ``None``: as long as they take) for calls
        still running, then close the connections."""
        left = await self._calls.settle(_check_close_timeout(timeout))
        if left:
            log.warning("closing with %d database calls still running", left)
        await self._calls.call(self._sync.close)


class AsyncTranscriptWriter(AsyncFacade[TranscriptWriter]):
    """:class:`sessionrepo.TranscriptWriter`, awaited, with the same arguments (but
    ``workers``: primary calls are tasks, on the task pool it hands the writer, so that
    :meth:`close` waits for them); its background drainer (:meth:`start`) is an asyncio
    task.

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
        lease: float = 5.0,
        backoff_base: float = 0.5,
        backoff_cap: float = 30.0,
        probe_interval: float = 1.0,
    ) -> None:
        check_instance(repository, "repository", AsyncSessionRepository)
        # One pool for the facade's calls and the writer's own (primary attempts past
        # their deadline): ``close`` waits for them all.
        calls = TaskPool()
        writer = TranscriptWriter(
            repository._sync,
            outbox_url=outbox_url,
            deadline=deadline,
            max_attempts=max_attempts,
            batch_size=batch_size,
            lease=lease,
            backoff_base=backoff_base,
            backoff_cap=backoff_cap,
            probe_interval=probe_interval,
            task_pool=calls,
        )
        super().__init__(writer, calls)
        self._wake = asyncio.Event()
        writer.notify_drainer = self._wake.set
        self._drainer: asyncio.Task[None] | None = None

    @property
    def deadline(self) -> float:
        return self._sync.deadline

    @property
    def primary_down(self) -> str | None:
        """See :attr:`TranscriptWriter.primary_down`."""
        return self._sync.primary_down

    @property
    def fault_hook(self) -> Callable[[str], None] | None:
        """Fault injection for crash tests (see :attr:`TranscriptWriter.fault_hook`)."""
        return self._sync.fault_hook

    @fault_hook.setter
    def fault_hook(self, hook: Callable[[str], None] | None) -> None:
        self._sync.fault_hook = hook

    async def __aenter__(self) -> AsyncTranscriptWriter:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    write = awaited(TranscriptWriter.write)
    drain = awaited(TranscriptWriter.drain)
    pending = awaited(TranscriptWriter.pending)
    status = awaited(TranscriptWriter.status)
    retry_dead = awaited(TranscriptWriter.retry_dead)
    rewind = awaited(TranscriptWriter.rewind)
    retract = awaited(TranscriptWriter.retract)
    clear_session = awaited(TranscriptWriter.clear_session)
    compact = awaited(TranscriptWriter.compact)

    def start(self, *, interval: float = 1.0) -> None:
        """Run the drainer as a task of the running loop until :meth:`stop` or
        :meth:`close`: at once (startup recovery), whenever a batch is parked or a retry
        falls due, and at least every ``interval`` seconds."""
        interval = check_seconds(interval, "interval")
        if self._drainer is not None:
            return

        async def loop() -> None:
            timers = asyncio.get_running_loop()
            while True:
                wait = await self._calls.call(self._sync.drain_round, interval)
                # Not ``asyncio.wait_for``: on Python 3.11, when the wake-up and stop()'s
                # cancellation come in the same loop iteration it returns instead of
                # raising, and the task runs on with stop() waiting for it forever.
                timer = timers.call_later(wait, self._wake.set)
                try:
                    await self._wake.wait()
                finally:
                    timer.cancel()
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

    async def close(self, *, timeout: float | None = CLOSE_TIMEOUT) -> None:
        """Stop the drainer, wait (up to ``timeout`` seconds) for calls still running
        (primary attempts past their deadline included), and release the outbox. The
        repository stays open (it is the caller's)."""
        timeout = _check_close_timeout(timeout)
        await self.stop()
        left = await self._calls.settle(timeout)
        if left:
            log.warning("closing the writer with %d calls still running", left)
        await self._calls.call(self._sync.close)
