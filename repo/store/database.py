"""An engine plus the one place where transactions run and errors are translated."""

from __future__ import annotations

import copy
import random
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from functools import partial
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, event
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import URL

from sessionrepo.dialects import (
    READ_ONLY,
    TENANT_NAME,
    BackendDialect,
    dialect_for,
    for_server,
    normalize_url,
    safe_url,
)
from sessionrepo.dialects.sqlalchemy_compat import invalidate_generation
from sessionrepo.errors import (
    ArgumentTypeError,
    BackendUnavailable,
    InvalidArgument,
    RepoError,
    WriteRejected,
)
from sessionrepo.store import bridge as _aio
from sessionrepo.store.arguments import (
    check_bool,
    check_int,
    check_options,
    check_seconds,
    check_text,
)

T = TypeVar("T")


def _always() -> bool:
    return True


#: How many times a transaction that lost a lock race is run before giving up.
DEFAULT_ATTEMPTS = 8


def _check_synchronous(value: object, field: str) -> str:
    level = check_text(value, field)
    if level.upper() not in ("OFF", "NORMAL", "FULL", "EXTRA"):
        raise InvalidArgument(field, f"{level!r} is not a SQLite level (OFF, NORMAL, FULL, EXTRA)")
    return level


def _check_tenant(value: object, field: str) -> str:
    """A tenant's name: a PostgreSQL role name that needs no quoting (both backends take
    the same names, so a store can move between them)."""
    name = check_text(value, field)
    if not TENANT_NAME.match(name):
        raise InvalidArgument(
            field, f"{name!r}: lower-case letters, digits and _, starting with a letter, at most 63"
        )
    return name


def _check_optional_seconds(value: object, field: str) -> float | None:
    return None if value is None else check_seconds(value, field)


#: The engine options a caller may give (``open_repository(**options)``), each with its
#: check: both backends take them all (each ignores the other's), so a URL can change
#: backend without the options changing meaning.
ENGINE_OPTIONS: dict[str, Callable[[Any, str], object]] = {
    "pool_size": partial(check_int, minimum=0),
    "max_overflow": partial(check_int, minimum=-1),
    "pool_timeout": check_seconds,
    "pool_recycle": partial(check_int, minimum=-1),
    "pool_pre_ping": check_bool,
    "busy_timeout": partial(check_seconds, allow_zero=True),
    "sqlite_synchronous": _check_synchronous,
    "connect_timeout": _check_optional_seconds,
    "search_config": check_text,
    "tenant": _check_tenant,
}


class Database:
    """Runs units of work in transactions: all or nothing, retried on lock contention.

    Each ``work`` callable gets a connection inside a fresh transaction; it commits when
    ``work`` returns and rolls back when it raises. A transaction that lost a lock race
    (SQLite busy, PostgreSQL serialization failure or deadlock) is run again from the
    start, a bounded number of times, so ``work`` must be safe to rerun: it is, because
    every write is keyed.

    Args:
        url: see :func:`sessionrepo.open_repository`.
        attempts: how many times a transaction that lost a lock race is run.
        asynchronous: build the engine on the backend's asyncio driver (see below).
        read_only: open the database for reading only: a SQLite file read-only
            (``mode=ro``, ``query_only``: never created, its journal mode left as it
            is), on PostgreSQL every transaction ``READ ONLY``; every write is
            refused before it reaches the database.
        **engine_options: the options of :data:`ENGINE_OPTIONS`.

    Raises:
        InvalidArgument: an argument or option is out of range, or unknown
            (:class:`~sessionrepo.errors.ArgumentTypeError`: of the wrong type).
        NotARepository: ``read_only`` and the SQLite file does not exist.
        BackendUnavailable: the SQLite file to create (or its folder) cannot be.
    """

    def __init__(
        self,
        url: str | URL | None = None,
        *,
        attempts: int = DEFAULT_ATTEMPTS,
        asynchronous: bool = False,
        read_only: bool = False,
        _server_timeout: float | None = None,
        **engine_options: Any,
    ) -> None:
        if url is not None and not isinstance(url, str | URL):
            raise ArgumentTypeError("url", f"must be a string or a URL, got {type(url).__name__}")
        attempts = check_int(attempts, "options.attempts", minimum=1)
        check_bool(asynchronous, "asynchronous")
        check_bool(read_only, "read_only")
        engine_options = check_options(engine_options, ENGINE_OPTIONS)
        self.url = normalize_url(url)
        self.dialect: BackendDialect = dialect_for(self.url.get_backend_name())
        #: With ``asynchronous``, the engine is the synchronous face of an asyncio engine
        #: (aiosqlite, psycopg async): usable only from code that
        #: :mod:`sessionrepo.store.bridge` runs for a coroutine, where each database wait
        #: yields to the event loop.
        self.asynchronous = asynchronous
        self.read_only = read_only
        #: The tenant this database was opened for (``None``: whoever the connection is);
        #: checked when a repository opens it (:mod:`sessionrepo.store.tenancy`).
        self.tenant: str | None = engine_options.get("tenant")
        self._engine_options = dict(engine_options)
        self._bounded: dict[float, Database] = {}
        self._server_found = False
        self._bounded_lock = threading.Lock()
        options = dict(engine_options)
        if _server_timeout is not None:
            options["server_timeout"] = _server_timeout
        if read_only:
            options["read_only"] = True
        self.engine: Engine = self.dialect.create_engine(
            self.url, options, asynchronous=asynchronous
        )
        #: Whether a transaction whose connection was lost may run again at once (a
        #: writer says no for a call its watchdog cut: the server did not answer).
        self.may_rerun: Callable[[], bool] = _always
        # The server decides between dialects of one backend (PostgreSQL or a Citus
        # coordinator): the first connection asks, before any work runs on it.
        event.listen(self.engine, "first_connect", self._found_server)
        event.listen(self.engine, "connect", self._connected)
        self._read_engine = self.engine.execution_options(**{READ_ONLY: True})
        self._attempts = attempts
        self._first_use: Callable[[Database], None] | None = None
        self._first_use_lock: AbstractContextManager[Any] = (
            _aio.Lock() if asynchronous else threading.Lock()
        )

    def bounded(self, seconds: float) -> Database:
        """Another pool on the same database whose connections the server itself holds
        to ``seconds`` per statement and per lock wait (PostgreSQL's
        ``statement_timeout`` and ``lock_timeout``, SQLite's busy timeout), set once
        when each connects: no statement per transaction. For a writer's deadline: one
        per ``seconds``, made on first use, disposed with this database."""
        database = self._bounded.get(seconds)
        if database is None:
            with self._bounded_lock:
                database = self._bounded.get(seconds)
                if database is None:
                    database = self._bounded[seconds] = Database(
                        self.url,
                        # SQLite's busy error comes after a wait of the whole bound (its
                        # busy timeout): a rerun would wait it again, past the deadline.
                        # PostgreSQL reruns a deadlock or serialization failure once.
                        attempts=1 if self.dialect.capabilities.retry_waits_out_bound else 2,
                        asynchronous=self.asynchronous,
                        read_only=self.read_only,
                        _server_timeout=seconds,
                        **self._engine_options,
                    )
                    if self._first_use is not None:  # the same schema check, on first use
                        database.check_on_first_use(self._first_use)
                    if self._server_found and type(database.dialect) is not type(self.dialect):
                        # The same server: its dialect from the first call on (a call
                        # picks its statements before it connects; on Citus a
                        # PostgreSQL one would broadcast and commit in two phases). A
                        # copy: no state shared between the two pools.
                        database.dialect = copy.copy(self.dialect)
                        database._server_found = True
        return database

    @property
    def checked(self) -> bool:
        """Whether the check of :meth:`check_on_first_use` has passed (or none was set)."""
        return self._first_use is None

    def _found_server(self, dbapi_connection: Any, record: Any) -> None:
        self.dialect = for_server(self.dialect, dbapi_connection)
        self._server_found = True

    def _connected(self, dbapi_connection: Any, record: Any) -> None:
        self.dialect.configure_connection(dbapi_connection)

    def check_on_first_use(self, check: Callable[[Database], None]) -> None:
        """Run ``check(database)`` before the first unit of work, until it passes (a
        schema check deferred because the database was unreachable at open, or because
        it was opened where no I/O may happen)."""
        self._first_use = check

    def __repr__(self) -> str:
        return f"Database({self.display_url})"

    @property
    def backend(self) -> str:
        return self.dialect.name

    @property
    def display_url(self) -> str:
        return safe_url(self.url)

    def write(self, work: Callable[[Connection], T]) -> T:
        """Run ``work`` in a write transaction (SQLite: ``BEGIN IMMEDIATE``).

        Raises:
            RepoError: the database was opened ``read_only`` (nothing was run).
        """
        self._refuse_if_read_only()
        return self._run(self.engine, work, reading=False)

    def write_direct(self, work: Callable[[Any], T]) -> T:
        """Run ``work(driver)`` on a pooled connection's own driver connection (psycopg,
        sqlite3 or their asyncio faces), idle and outside any transaction: for the
        dialect's statements that manage their own (see
        :meth:`~sessionrepo.dialects.base.BackendDialect.append_direct`). Errors are
        translated, lost races and dropped connections rerun, as for :meth:`write`."""
        self._refuse_if_read_only()
        return self._run(self.engine, work, reading=False, direct=True)

    def _refuse_if_read_only(self) -> None:
        if self.read_only:
            raise RepoError(f"{self.display_url} was opened read-only; this call would write")

    def read_direct(self, work: Callable[[Any], T]) -> T:
        """:meth:`write_direct` for a read: one statement of the dialect's own, which is
        its own read transaction."""
        return self._run(self._read_engine, work, reading=True, direct=True)

    def read(self, work: Callable[[Connection], T]) -> T:
        """Run ``work`` in a read transaction (SQLite: deferred, never blocks writers).

        Never raises :class:`WriteRejected`: a read the database refuses for its data
        raises a plain :class:`RepoError` (nothing is parked or retried on a read).
        """
        return self._run(self._read_engine, work, reading=True)

    def _run(
        self, engine: Engine, work: Callable[[Any], T], *, reading: bool, direct: bool = False
    ) -> T:
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
                if direct:
                    return self._direct(engine, work)
                with engine.begin() as connection:
                    return work(connection)
            except sa_exc.DBAPIError as exc:
                # A connection the server dropped (a restart, an idle timeout, a
                # terminated backend) is found on use, not pinged before each checkout:
                # the pool discards it and its peers, and the transaction reruns once,
                # at once (a server that is down fails the rerun just as fast).
                if exc.connection_invalidated and not reconnected and self.may_rerun():
                    reconnected = True
                    continue
                if attempt < self._attempts and self.dialect.is_retryable(exc):
                    # Full jitter, capped: contenders spread out instead of colliding again.
                    self._pause(random.uniform(0, min(1.0, 0.01 * 2**attempt)))
                    continue
                translated = self.dialect.translate(exc)
                if reading and isinstance(translated, WriteRejected):
                    # "Do not retry this write as is" means nothing to a read; what the
                    # database refused here is stored data or a bug, not the caller's.
                    translated = RepoError(f"the database refused a read: {translated}")
                raise translated from exc
            except sa_exc.PendingRollbackError as exc:
                # The connection was lost inside the transaction: nothing was committed.
                raise BackendUnavailable(f"the connection was lost mid-transaction: {exc}") from exc
            except sa_exc.TimeoutError as exc:
                raise BackendUnavailable(f"no database connection free: {exc}") from exc
            except sa_exc.SQLAlchemyError as exc:
                # By its class only: SQLAlchemy's text has the statement and its
                # parameters (a user's query, a message); the chained cause keeps them.
                raise RepoError(f"SQLAlchemy {type(exc).__name__} in a transaction") from exc
            except RepoError:
                raise
            except Exception as exc:
                # The boundary holds for what no check foresaw (a value a driver cannot
                # bind raises OverflowError, not a DBAPI error): the transaction was
                # rolled back, and the caller gets a RepoError with the cause chained
                # (by its class: its text may hold the value).
                raise RepoError(f"unexpected {type(exc).__name__} in a transaction") from exc

    def _direct(self, engine: Engine, work: Callable[[Any], T]) -> T:
        """``work`` on a pooled driver connection; a driver error comes out as the
        SQLAlchemy error it would have been, the connection discarded when it is lost."""
        try:
            pooled = engine.raw_connection()
        except self.dialect.driver_error as exc:  # the connect itself failed
            raise sa_exc.DBAPIError.instance(None, None, exc, self.dialect.driver_error) from exc
        try:
            try:
                return work(pooled.driver_connection)
            except self.dialect.driver_error as exc:
                lost = self.dialect.connection_lost(pooled.driver_connection)
                if lost:
                    # As SQLAlchemy does on a disconnect: this connection and every one
                    # made before it (a restarted server dropped them all) are replaced.
                    invalidate_generation(engine.pool, pooled, exc)
                raise sa_exc.DBAPIError.instance(
                    None, None, exc, self.dialect.driver_error, connection_invalidated=lost
                ) from exc
        finally:
            pooled.close()

    def _pause(self, seconds: float) -> None:
        if self.asynchronous:
            _aio.sleep(seconds)
        else:
            time.sleep(seconds)

    def dispose(self) -> None:
        for database in list(self._bounded.values()):
            database.dispose()
        self.engine.dispose()
