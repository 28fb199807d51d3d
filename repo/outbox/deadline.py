"""The writer's deadline: how a call to the primary is held to it, and what carries the
calls.

A write's deadline is split in two: the primary's share (:attr:`Calls.budget`), and a
reserve kept for parking the batch after the primary gave up (:attr:`Calls.reserve`).
The primary's share is enforced three ways, the cheapest that can work first:

- by the server itself: the writes' pool (``repository.bounded_database(budget)``) has
  connections the server holds to it (statement and lock timeouts, SQLite's busy
  timeout), so the call runs on the caller's thread (or, on asyncio, in the caller's
  task, where no connect can hang: SQLite);
- by the :class:`Watchdog`, for a server that does not answer at all (frozen, or a
  network that drops everything), where the server's own timeouts cannot fire: past the
  deadline it cuts the connection under the call;
- by a pool thread (:class:`DaemonPool`) or an asyncio task, abandoned at the deadline,
  where there is no connection to cut yet (a new connection could hang in the connect)
  or the call is not on the writes' pool (an edit).

An abandoned call may still commit later; the message key makes its replay a no-op.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any, Final, Protocol, TypeVar

from sqlalchemy import event

from sessionrepo.errors import BackendUnavailable
from sessionrepo.store import bridge as _aio
from sessionrepo.store.database import Database

T = TypeVar("T")

log = logging.getLogger("sessionrepo.writer")

#: Seconds between the watchdog's looks at the calls in flight.
WATCH_TICK: Final = 0.05


class Pool(Protocol):
    """Where the writer runs a call with a deadline: daemon threads, or asyncio tasks."""

    def run(self, work: Callable[[], T], *, timeout: float) -> T: ...

    def submit(self, work: Callable[[], Any]) -> None: ...

    def shutdown(self) -> None: ...


class Calls:
    """What carries a writer's calls, and the deadline they are held to.

    Args:
        deadline: seconds a write may take, parking included.
        bounded: the writes' pool (connections the server holds to the primary's share).
        asynchronous: the repository is on an asyncio driver: calls are tasks.
        workers: threads for primary calls (synchronous only).
        task_pool: the asyncio task pool (asynchronous only; a new one if ``None``).
    """

    def __init__(
        self,
        deadline: float,
        bounded: Callable[[float], Database],
        *,
        asynchronous: bool,
        workers: int,
        task_pool: _aio.TaskPool | None,
    ) -> None:
        self.deadline = deadline
        #: Of the deadline, this much is kept for parking after the primary gave up.
        self.reserve = min(1.0, deadline / 4)
        #: The primary's share of the deadline.
        self.budget = deadline - self.reserve
        self.asynchronous = asynchronous
        self.primary: Pool
        self.outbox: Pool
        if asynchronous:
            # Tasks: a task waiting on the primary never keeps one from parking.
            self.primary = self.outbox = task_pool or _aio.TaskPool()
        else:
            # Daemon threads: a write abandoned on a frozen server must not keep the
            # process from exiting (the key makes the abandoned attempt harmless).
            self.primary = DaemonPool(workers, "sessionrepo-primary")
            self.outbox = DaemonPool(2, "sessionrepo-outbox")
        self.writes = bounded(self.budget)
        self.watchdog = None if asynchronous else Watchdog(self.writes)
        if self.watchdog is not None:
            self.writes.may_rerun = self.watchdog.not_severed

    def left(self, started: float) -> float:
        """Seconds left to park in, for a write that began at ``started`` (monotonic):
        what is left of the deadline, and never less than the reserve."""
        return max(self.reserve, self.deadline - (time.monotonic() - started))

    def attempt(self, work: Callable[[], T], *, on_writes_pool: bool) -> T:
        """``work()`` held to the primary's share of the deadline; ``TimeoutError``
        past it. ``on_writes_pool``: ``work`` uses only :attr:`writes` (whose
        connections the watchdog can cut), so it may run on the caller's thread."""
        watchdog = self.watchdog
        if (
            on_writes_pool
            and self.asynchronous
            and not self.writes.dialect.capabilities.connect_may_hang
        ):
            # SQLite on asyncio: as on the caller's thread synchronously, the writes'
            # pool bounds every statement (its busy timeout) and no connect can hang,
            # so the call runs in the caller's task, never abandoned: a first write
            # that opens the pool's connection on a loaded machine is slow, not failed.
            return work()
        if not on_writes_pool or watchdog is None or not watchdog.connection_ready():
            # A new connection to a server that may not answer, or a call the watchdog
            # cannot see: on a pool thread (or a task), abandoned at the deadline.
            return self.primary.run(work, timeout=self.budget)
        with watchdog.guard(self.budget) as guard:
            try:
                return work()
            except BackendUnavailable as exc:
                if guard.severed:
                    raise TimeoutError from exc
                raise

    def guarded(self, work: Callable[[], T]) -> T:
        """``work()`` on the caller's thread (a probe's), cut by the watchdog at the
        primary's share of the deadline."""
        if self.watchdog is None:
            return work()
        with self.watchdog.guard(self.budget):
            return work()

    def shutdown(self) -> None:
        self.primary.shutdown()
        self.outbox.shutdown()
        if self.watchdog is not None:
            self.watchdog.stop()


class Guard:
    __slots__ = ("connection", "deadline", "severed")

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.connection: Any = None
        self.severed = False


class Watchdog:
    """The deadline of a write that runs on the caller's thread, for a server that does
    not answer at all: past the deadline, the connection under the call is cut
    (:meth:`~sessionrepo.dialects.base.BackendDialect.sever`), and the call fails at
    once with the server's silence as its reason.

    One daemon thread per writer looks at the calls in flight a few times a second:
    a guarded call costs two dictionary operations, and no thread switch.
    """

    def __init__(self, database: Database) -> None:
        self._dialect = database.dialect
        self._pool = database.engine.pool
        self._guards: dict[int, Guard] = {}
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        event.listen(database.engine, "checkout", self._checked_out)

    def connection_ready(self) -> bool:
        """Whether the call would find a connection made already (a new one could hang
        in the connect, before there is a connection to cut)."""
        return not self._dialect.capabilities.connect_may_hang or self._pool.checkedin() > 0  # type: ignore[attr-defined]

    def _checked_out(self, dbapi_connection: Any, record: Any, proxy: Any) -> None:
        guard = self._guards.get(threading.get_ident())
        if guard is not None:
            guard.connection = dbapi_connection

    def not_severed(self) -> bool:
        guard = self._guards.get(threading.get_ident())
        return guard is None or not guard.severed

    @contextlib.contextmanager
    def guard(self, seconds: float) -> Iterator[Guard]:
        if self._thread is None:
            self._start()
        guard = Guard(time.monotonic() + seconds)
        ident = threading.get_ident()
        self._guards[ident] = guard
        try:
            yield guard
        finally:
            del self._guards[ident]

    def _start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._watch, name="sessionrepo-watchdog", daemon=True
                )
                self._thread.start()

    def _watch(self) -> None:
        while not self._stopped.wait(WATCH_TICK):
            now = time.monotonic()
            for guard in list(self._guards.values()):
                if guard.deadline <= now and not guard.severed and guard.connection is not None:
                    guard.severed = True
                    try:
                        self._dialect.sever(guard.connection)
                    except Exception:  # a connection closed meanwhile: nothing to cut
                        log.debug("could not cut a connection past its deadline", exc_info=True)

    def stop(self) -> None:
        self._stopped.set()


class DaemonPool:
    """A minimal thread pool of daemon threads with a per-call deadline.

    ``concurrent.futures`` joins its workers at interpreter exit, so one write stuck on
    a frozen server would keep the whole gateway from exiting. A call that misses its
    deadline is cancelled if it has not started; if it has, it is abandoned.
    """

    def __init__(self, size: int, name: str) -> None:
        self._queue: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]] | None] = (
            queue.SimpleQueue()
        )
        self._threads = [
            threading.Thread(target=self._work, name=f"{name}-{index}", daemon=True)
            for index in range(size)
        ]
        for thread in self._threads:
            thread.start()

    def run(self, work: Callable[[], T], *, timeout: float) -> T:
        """``work()`` on a pool thread; ``TimeoutError`` if it takes over ``timeout``."""
        future: Future[T] = Future()
        self._queue.put((future, work))
        try:
            return future.result(timeout=timeout)
        except TimeoutError:
            future.cancel()  # not started yet: never start it
            raise

    def submit(self, work: Callable[[], Any]) -> None:
        """``work()`` on a pool thread; not waited for (its failure is its own)."""
        self._queue.put((Future(), work))

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            future, work = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(work())
            except BaseException as exc:
                future.set_exception(exc)

    def shutdown(self) -> None:
        """Let idle threads end; threads stuck in a call end with it (or the process)."""
        for _ in self._threads:
            self._queue.put(None)
