"""An engine plus the one place where transactions run and errors are translated."""

from __future__ import annotations

import copy
import random
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import URL

from sessionrepo.dialects import READ_ONLY, BackendDialect, dialect_for, normalize_url, safe_url
from sessionrepo.errors import BackendUnavailable, RepoError
from sessionrepo.store import bridge as _aio

T = TypeVar("T")

#: How many times a transaction that lost a lock race is run before giving up.
DEFAULT_ATTEMPTS = 8


class Database:
    """Runs units of work in transactions: all or nothing, retried on lock contention.

    Each ``work`` callable gets a connection inside a fresh transaction; it commits when
    ``work`` returns and rolls back when it raises. A transaction that lost a lock race
    (SQLite busy, PostgreSQL serialization failure or deadlock) is run again from the
    start, a bounded number of times, so ``work`` must be safe to rerun: it is, because
    every write is keyed.
    """

    def __init__(
        self,
        url: str | URL | None = None,
        *,
        attempts: int = DEFAULT_ATTEMPTS,
        asynchronous: bool = False,
        **engine_options: Any,
    ) -> None:
        self.url = normalize_url(url)
        self.dialect: BackendDialect = dialect_for(self.url.get_backend_name())
        #: With ``asynchronous``, the engine is the synchronous face of an asyncio engine
        #: (aiosqlite, psycopg async): usable only from code that ``repo._aio`` runs for
        #: a coroutine, where each database wait yields to the event loop.
        self.asynchronous = asynchronous
        self.engine: Engine = self.dialect.create_engine(
            self.url, dict(engine_options), asynchronous=asynchronous
        )
        self._read_engine = self.engine.execution_options(**{READ_ONLY: True})
        self._attempts = attempts
        self._first_use: Callable[[Database], None] | None = None
        self._first_use_lock: AbstractContextManager[Any] = (
            _aio.Lock() if asynchronous else threading.Lock()
        )

    def check_on_first_use(self, check: Callable[[Database], None]) -> None:
        """Run ``check(database)`` before the first unit of work, until it passes (a
        schema check deferred because the database was unreachable at open, or because
        it was opened where no I/O may happen)."""
        self._first_use = check

    @property
    def backend(self) -> str:
        return self.dialect.name

    @property
    def display_url(self) -> str:
        return safe_url(self.url)

    def write(self, work: Callable[[Connection], T]) -> T:
        """Run ``work`` in a write transaction (SQLite: ``BEGIN IMMEDIATE``)."""
        return self._run(self.engine, work)

    def read(self, work: Callable[[Connection], T]) -> T:
        """Run ``work`` in a read transaction (SQLite: deferred, never blocks writers)."""
        return self._run(self._read_engine, work)

    def _run(self, engine: Engine, work: Callable[[Connection], T]) -> T:
        if self._first_use is not None:
            with self._first_use_lock:
                check = self._first_use
                if check is not None:
                    # Every other caller waits on the lock until the check has passed;
                    # the check itself works through a view without it.
                    unchecked = copy.copy(self)
                    unchecked._first_use = None
                    check(unchecked)
                    self._first_use = None
        attempt = 0
        reconnected = False
        while True:
            attempt += 1
            try:
                with engine.begin() as connection:
                    return work(connection)
            except sa_exc.DBAPIError as exc:
                # A connection the server dropped (a restart, an idle timeout, a
                # terminated backend) is found on use, not pinged before each checkout:
                # the pool discards it and its peers, and the transaction reruns once,
                # at once (a server that is down fails the rerun just as fast).
                if exc.connection_invalidated and not reconnected:
                    reconnected = True
                    continue
                if attempt < self._attempts and self.dialect.is_retryable(exc):
                    # Full jitter, capped: contenders spread out instead of colliding again.
                    self._pause(random.uniform(0, min(1.0, 0.01 * 2**attempt)))
                    continue
                raise self.dialect.translate(exc) from exc
            except sa_exc.PendingRollbackError as exc:
                # The connection was lost inside the transaction: nothing was committed.
                raise BackendUnavailable(f"the connection was lost mid-transaction: {exc}") from exc
            except sa_exc.TimeoutError as exc:
                raise BackendUnavailable(f"no database connection free: {exc}") from exc
            except sa_exc.SQLAlchemyError as exc:
                raise RepoError(f"{type(exc).__name__}: {exc}") from exc

    def _pause(self, seconds: float) -> None:
        if self.asynchronous:
            _aio.sleep(seconds)
        else:
            time.sleep(seconds)

    def dispose(self) -> None:
        self.engine.dispose()
