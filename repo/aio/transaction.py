"""The unit of work, awaited: :class:`AsyncSessionTransaction`.

The sync :class:`~sessionrepo.store.transaction.SessionTransaction` itself, each call run
on the event loop's task pool (see :mod:`sessionrepo.store.bridge`) one after the other
on its one connection, as SQLAlchemy's ``AsyncConnection`` runs its ``Connection``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from types import TracebackType
from typing import Any, Literal, TypeVar
from uuid import UUID

from sqlalchemy import Executable, Result

from sessionrepo.models import AppendResult, EditResult, Message, Session
from sessionrepo.models.usage import UsageResult
from sessionrepo.store.bridge import TaskPool, boxed, handed_over
from sessionrepo.store.transaction import SessionTransaction

T = TypeVar("T")


class AsyncSessionTransaction:
    """:class:`~sessionrepo.store.transaction.SessionTransaction`, awaited: ``async with
    repository.session_transaction(sid) as tx:``, then ``await tx.append(...)``.

    Same contract (:class:`sessionrepo.contract.SessionUnitOfWork`). A call whose caller
    is cancelled runs to its end, as every call of the async API does, and the next
    call (the block's end included) waits for it: the transaction's statements never
    overlap. A caller cancelled while the lock is taken leaves nothing behind: the
    transaction is rolled back once the lock is held.
    """

    def __init__(self, sync: SessionTransaction, calls: TaskPool) -> None:
        self._sync = sync
        self._calls = calls
        self._last: asyncio.Task[Any] | None = None

    @property
    def session_id(self) -> str:
        return self._sync.session_id

    @property
    def created(self) -> bool:
        """Whether this transaction created the session (it did not exist on entry)."""
        return self._sync.created

    @property
    def next_seq(self) -> int:
        """The ``seq`` the next appended message gets."""
        return self._sync.next_seq

    async def session(self) -> Session:
        """The session as it stands in this transaction."""
        return await self._call(self._sync.session)

    async def append(
        self,
        messages: Iterable[Message | Mapping[str, Any]],
        *,
        on_conflict: Literal["report", "raise"] = "report",
    ) -> AppendResult:
        """See :meth:`SessionTransaction.append`."""
        return await self._call(self._sync.append, messages, on_conflict=on_conflict)

    async def supersede(
        self, keys: Iterable[UUID | str], state: Literal["retracted", "compacted"] = "retracted"
    ) -> list[UUID]:
        """See :meth:`SessionTransaction.supersede`."""
        return await self._call(self._sync.supersede, keys, state)

    async def retract(self, keys: Iterable[UUID | str]) -> EditResult:
        """See :meth:`SessionTransaction.retract`."""
        return await self._call(self._sync.retract, keys)

    async def record_usage(self, usage: Any) -> UsageResult:
        """See :meth:`SessionTransaction.record_usage`."""
        return await self._call(self._sync.record_usage, usage)

    async def execute(
        self, statement: Executable, parameters: Mapping[str, Any] | None = None
    ) -> Result[Any]:
        """See :meth:`SessionTransaction.execute` (the rows come back buffered)."""
        return await self._call(self._sync.execute, statement, parameters)

    async def run_sync(self, fn: Callable[[SessionTransaction], T]) -> T:
        """``fn(tx)`` with the sync unit of work, for an extension's synchronous code
        (its statements on ``tx.connection`` awaited on the loop, like SQLAlchemy's
        ``AsyncConnection.run_sync``)."""
        return await self._call(fn, self._sync)

    async def __aenter__(self) -> AsyncSessionTransaction:
        task = self._calls.task(self._sync.__enter__)
        self._last = task
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            # The caller left while the lock was being taken: release it once held.
            task.add_done_callback(self._abandon)
            raise
        return self

    def _abandon(self, entered: asyncio.Task[Any]) -> None:
        if not entered.cancelled() and entered.exception() is None:
            cancelled = asyncio.CancelledError()
            self._calls.task(self._sync.__exit__, type(cancelled), cancelled, None)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self._call(self._sync.__exit__, exc_type, exc, traceback)

    async def _call(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        previous = self._last
        if previous is not None and not previous.done():
            # The call of a cancelled caller: its statement is still on the connection.
            await asyncio.wait({previous})
        task = self._calls.task(boxed(fn), *args, **kwargs)
        self._last = task
        return await handed_over(task)

    def __repr__(self) -> str:
        return f"Async{self._sync!r}"
