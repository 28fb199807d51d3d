"""The asyncio bridge: one implementation of the logic, for the sync and the async API.

sessionrepo's logic (validation, statements, transactions, lock-race retries, error
translation, the outbox protocol) is written once, as ordinary synchronous code against a
SQLAlchemy ``Connection``. The async API runs that same code on the backend's asyncio
driver (aiosqlite, psycopg async) the way SQLAlchemy's asyncio extension runs its ORM
(``AsyncSession`` wraps a ``Session``): inside a greenlet, where every wait on the driver
suspends the greenlet and gives the event loop back. There is no thread hop per call and
no second copy of the logic to drift.

Code running under :meth:`TaskPool.call` may use an asynchronous :class:`Database`
(``asynchronous=True``), :func:`sleep` and :meth:`TaskPool.run`; called anywhere else they
raise SQLAlchemy's ``MissingGreenlet``.

Cancellation: a call, once started, runs to its end in a task of its own (a transaction
commits or rolls back and its connection goes back to the pool clean); cancelling the
caller ends its wait, not the call. So a cancelled write has either committed or not, and
since every write is keyed, sending it again is a no-op either way. ``close`` waits for
calls still running.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Callable, Coroutine
from types import TracebackType
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar

# SQLAlchemy's greenlet bridge, the one its asyncio extension is built on (exported by
# ``sqlalchemy.util`` since 1.4). Only this module touches it.
from sqlalchemy.util import await_, greenlet_spawn

T = TypeVar("T")
P = ParamSpec("P")
# Covariant: a method the sync class inherits (say from an editing mixin) is awaited on a
# facade over the subclass.
S_co = TypeVar("S_co", covariant=True)


def sleep(seconds: float) -> None:
    """``time.sleep`` for code running under :meth:`TaskPool.call`: the loop runs on."""
    await_(asyncio.sleep(seconds))


class Lock:
    """A mutex for code running under :meth:`TaskPool.call` (not reentrant): waiting for
    it yields to the event loop, where a ``threading`` lock would let every coroutine of
    the loop's thread in at once."""

    def __init__(self) -> None:
        self._lock = asyncio.Lock()

    def __enter__(self) -> None:
        await_(self._lock.acquire())

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._lock.release()


class TaskPool:
    """Runs synchronous logic for coroutines, each call in a task of its own.

    The asyncio counterpart of the writer's daemon thread pool: :meth:`run` has the same
    shape (``work`` with a deadline; past it the caller stops waiting and the call runs
    on, harmlessly, because it is keyed).
    """

    def __init__(self) -> None:
        self._running: set[asyncio.Task[Any]] = set()

    async def call(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """``fn(*args, **kwargs)`` with its database waits awaited on the running loop.

        Shielded: cancelling the caller does not cancel the call (see the module's
        docstring); its result, or its error, is then dropped.
        """
        return await handed_over(self.task(boxed(fn), *args, **kwargs))

    def task(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> asyncio.Task[T]:
        """:meth:`call`'s task, started and returned (awaited by the caller, shielded:
        a unit of work waits for its last call before it ends)."""
        task = asyncio.get_running_loop().create_task(
            greenlet_spawn(functools.partial(fn, *args, **kwargs))
        )
        self._running.add(task)
        task.add_done_callback(self._finished)
        return task

    def _finished(self, task: asyncio.Task[Any]) -> None:
        self._running.discard(task)
        if not task.cancelled():
            # Retrieved here so that a call whose caller was cancelled, and which then
            # failed, is not reported as "exception never retrieved": nobody waits for it.
            task.exception()

    def run(self, work: Callable[[], T], *, timeout: float) -> T:
        """From logic running under :meth:`call`: ``work()`` as a call of its own, waited
        for at most ``timeout`` seconds (then ``TimeoutError``; the call runs on)."""
        return await_(asyncio.wait_for(self.call(work), timeout))

    def submit(self, work: Callable[[], Any]) -> None:
        """From logic running under :meth:`call`: start ``work()`` as a call of its own
        and do not wait for it (its failure is its own to handle)."""
        self.task(work)

    async def settle(self, timeout: float | None = None) -> int:
        """Wait up to ``timeout`` seconds for the calls still running (a cancelled
        caller's, an abandoned deadline's); returns how many are still running."""
        if self._running:
            await asyncio.wait(set(self._running), timeout=timeout)
        return len(self._running)

    def shutdown(self) -> None:
        """Nothing to stop: each call ends with its task (see :meth:`settle`)."""


def boxed(fn: Callable[P, T]) -> Callable[P, list[T]]:
    """``fn`` returning its result in a one-item list, for :func:`handed_over`."""

    @functools.wraps(fn)
    def call(*args: P.args, **kwargs: P.kwargs) -> list[T]:
        return [fn(*args, **kwargs)]

    return call


async def handed_over(task: asyncio.Task[list[T]]) -> T:
    """The result of a :func:`boxed` call's ``task``, taken out of its box: awaited
    shielded, so that cancelling the caller leaves the call running.

    A finished future keeps its result for as long as anything holds the future, and
    the loop holds the one that woke the caller until its next callback, that is, into
    the caller's next await. A large result (a loaded transcript, a page of rows) would
    then be freed inside the caller's next call, tens of milliseconds of it for 10,000
    messages, on whatever that call was. Out of the box, it lives exactly as long as
    the caller keeps it, as in the sync API.
    """
    box = await asyncio.shield(task)
    return box.pop()


class AsyncFacade(Generic[S_co]):
    """An asyncio face over a synchronous object ``_sync``; see :func:`awaited`."""

    def __init__(self, sync: S_co, calls: TaskPool | None = None) -> None:
        self._sync = sync
        self._calls = calls or TaskPool()


def awaited(
    method: Callable[Concatenate[S_co, P], T],
) -> Callable[Concatenate[AsyncFacade[S_co], P], Coroutine[Any, Any, T]]:
    """The awaited form of a sync class's ``method``, for an :class:`AsyncFacade` over it:
    the same parameters, result and docstring by construction, so the two cannot drift."""

    @functools.wraps(method)
    async def call(self: AsyncFacade[S_co], /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await self._calls.call(method, self._sync, *args, **kwargs)

    call.__doc__ = inspect.getdoc(method)  # the contract's, which the sync method inherits
    return call
