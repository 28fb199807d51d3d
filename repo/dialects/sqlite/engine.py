"""SQLite's engine: WAL, a busy timeout, transactions begun by sessionrepo, the store file
created private and another application's file refused; errors classified by their
primary result code."""

from __future__ import annotations

import math
import os
import sqlite3
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, Final, cast

from sqlalchemy import (
    Connection,
    Engine,
    Insert,
    Integer,
    Select,
    Table,
    Text,
    event,
    func,
    literal,
    select,
)
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects import sqlite
from sqlalchemy.engine import URL
from sqlalchemy.pool import ConnectionPoolEntry, PoolResetState
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.util import await_

from sessionrepo.dialects.aiosqlite_compat import on_connection_thread
from sessionrepo.dialects.base import READ_ONLY, EngineRole, make_engine
from sessionrepo.dialects.urls import database_file
from sessionrepo.errors import BackendUnavailable, NotARepository, RepoError, WriteRejected

#: Tables every sessionrepo store has, from its first revision on; a file with tables
#: but not these is another application's.
_OWN_TABLES: Final = frozenset({"alembic_version", "sessions", "messages"})


def _read_only_url(url: URL, path: Path) -> URL:
    """The URL that opens ``path`` read-only (``mode=ro``): SQLite then neither creates
    the file nor writes to it, whatever a statement asks."""
    if not path.exists():
        raise NotARepository(f"no sessionrepo database at {path}", path=str(path))
    query = {**url.query, "mode": "ro", "uri": "true"}
    return url.set(database=path.absolute().as_uri(), query=query)


def _create_private(url: URL, path: Path) -> URL:
    """Create a missing store file (and its folder) readable by its owner only (it holds
    private conversations); SQLite gives its ``-wal`` and ``-shm`` files the same mode."""
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        pass  # there already (or a symlink, followed as SQLite follows it)
    except OSError as exc:
        raise BackendUnavailable(f"cannot create the SQLite file {path}: {exc.strerror}") from exc
    return url


#: The aggregate ``NEAREST_RANK(value, share)``: the value at rank ``ceil(share * n)`` of
#: its group's ``n`` values in ascending order (PostgreSQL's ``percentile_disc``).
NEAREST_RANK: Final = "sessionrepo_nearest_rank"


class _NearestRank:
    """:data:`NEAREST_RANK`'s state: the group's values, ranked when it ends."""

    def __init__(self) -> None:
        self.values: list[float] = []
        self.share = 0.0

    def step(self, value: float | None, share: float) -> None:
        if value is not None:
            self.values.append(value)
            self.share = share

    def finalize(self) -> float | None:
        if not self.values:
            return None
        self.values.sort()
        return self.values[max(math.ceil(self.share * len(self.values)) - 1, 0)]


def _register_functions(connection: sqlite3.Connection) -> None:
    # typeshed types an aggregate's step as taking one int.
    connection.create_aggregate(NEAREST_RANK, 2, cast(Any, _NearestRank))


def _refuse_foreign(dbapi_connection: Any, cursor: Any, path: Path) -> None:
    """Raise :class:`NotARepository` (closing the connection) unless the file is empty or
    a sessionrepo store: its tables are read, nothing is written."""
    try:
        # Statement, then fetch: aiosqlite's adapter returns no cursor from execute.
        cursor.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite!_%' "
            "ESCAPE '!'"
        )
        tables = {name for (name,) in cursor.fetchall()}
        cursor.execute("PRAGMA table_info(messages)")
        ours = tables >= _OWN_TABLES and any(
            column[1] == "client_msg_uuid" for column in cursor.fetchall()
        )
    except sqlite3.DatabaseError as exc:
        if exc.sqlite_errorcode & 0xFF != sqlite3.SQLITE_NOTADB:
            raise  # busy, I/O: the caller's error handling decides
        reason = "not a SQLite database"
    else:
        if not tables or ours:
            return
        names = ", ".join(sorted(tables)[:5]) + (", ..." if len(tables) > 5 else "")
        reason = f"its tables are another application's: {names}"
    cursor.close()
    dbapi_connection.close()
    raise NotARepository(
        f"{path} is not a sessionrepo database ({reason}); sessionrepo opens only its own "
        "stores, or an empty file",
        path=str(path),
    )


#: How SQLITE_ERROR messages that name a schema object (a table, an index), and nothing
#: of a statement or a query, begin ("no such column" is not one: FTS5 says it of a
#: query's word).
_NAMING_OBJECTS: Final = ("no such table: ", "no such index: ", "table ", "index ")


class SQLiteEngine(EngineRole):
    """SQLite in WAL mode: writes begin IMMEDIATE (take the write lock up front, which
    makes the busy timeout apply); reads begin DEFERRED and never block writers."""

    # Primary result codes of errors that come from the file's state, not the data.
    _TRANSIENT: Final = {
        sqlite3.SQLITE_BUSY,
        sqlite3.SQLITE_LOCKED,
        sqlite3.SQLITE_IOERR,
        sqlite3.SQLITE_FULL,
        sqlite3.SQLITE_CANTOPEN,
        sqlite3.SQLITE_PROTOCOL,
        sqlite3.SQLITE_READONLY,
        sqlite3.SQLITE_CORRUPT,
        sqlite3.SQLITE_NOTADB,
        sqlite3.SQLITE_NOLFS,
        sqlite3.SQLITE_PERM,
    }
    _REJECTS: Final = {
        sqlite3.SQLITE_TOOBIG,
        sqlite3.SQLITE_MISMATCH,
        sqlite3.SQLITE_RANGE,
    }

    def create_engine(
        self, url: URL, options: dict[str, Any], *, asynchronous: bool = False
    ) -> Engine:
        options.pop("connect_timeout", None)  # PostgreSQL's; a file has nothing to connect
        options.pop("search_config", None)
        options.pop("tenant", None)  # the file is the tenant (sessionrepo.store.tenancy)
        busy_timeout = float(options.pop("busy_timeout", 10.0))
        server_timeout = options.pop("server_timeout", None)
        if server_timeout is not None:
            busy_timeout = min(busy_timeout, float(server_timeout))
        synchronous = str(options.pop("sqlite_synchronous", "FULL")).upper()
        if synchronous not in ("OFF", "NORMAL", "FULL", "EXTRA"):
            raise ValueError(f"sqlite_synchronous: {synchronous!r} is not a SQLite level")
        read_only = bool(options.pop("read_only", False))
        path = database_file(url)
        if path is not None and url.query.get("uri") in ("true", "1"):
            # The caller's own SQLite URI (``file:…?…``): SQLite opens it as given.
            if read_only:
                url = url.update_query_dict({"mode": "ro"})
        elif path is not None:
            url = _read_only_url(url, path) if read_only else _create_private(url, path)
        # On aiosqlite every call on a connection is a hop to its thread and back: the
        # pool's rollback on return would be a second hop per append (the append runs
        # in one, and leaves no transaction open). Rolled back only when one is open.
        reset_when_open = asynchronous and "pool_reset_on_return" not in options
        if reset_when_open:
            options["pool_reset_on_return"] = None
        engine = make_engine(
            url.set(drivername="sqlite+aiosqlite") if asynchronous else url,
            asynchronous,
            connect_args={"timeout": busy_timeout, "check_same_thread": False},
            **options,
        )
        if reset_when_open:
            event.listen(engine, "reset", _rollback_when_open)

        @event.listens_for(engine, "connect")
        def _configure(dbapi_connection: Any, record: ConnectionPoolEntry) -> None:
            # Take transaction control from the driver: we issue BEGIN ourselves.
            dbapi_connection.isolation_level = None
            cursor = dbapi_connection.cursor()
            cursor.execute(f"PRAGMA busy_timeout={int(busy_timeout * 1000)}")
            if path is not None:
                # Before anything that could change the file (the journal mode first).
                _refuse_foreign(dbapi_connection, cursor, path)
            if read_only:
                cursor.execute("PRAGMA query_only=ON")
            else:
                cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute(f"PRAGMA synchronous={synchronous}")
            cursor.execute("PRAGMA foreign_keys=ON")
            # Deleted and overwritten content is zeroed, not left in the file's free
            # space: what an erasure, a prune or an edit removes leaves the bytes (see
            # sessionrepo.dialects.sqlite.erasure). Debian's SQLite has it on by default.
            cursor.execute("PRAGMA secure_delete=ON")
            cursor.close()
            if isinstance(dbapi_connection, sqlite3.Connection):
                _register_functions(dbapi_connection)
            else:  # aiosqlite's, through SQLAlchemy's adapter: on the connection's thread
                await_(
                    on_connection_thread(dbapi_connection.driver_connection, _register_functions)
                )

        @event.listens_for(engine, "begin")
        def _begin(connection: Connection) -> None:
            read_only = connection.get_execution_options().get(READ_ONLY, False)
            connection.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")

        return engine

    def begin_snapshot(self, connection: Connection) -> None:
        # Nothing to set: a deferred read transaction is one already (in WAL mode its
        # first read fixes its snapshot, and writers go on beside it).
        return

    def insert_ignoring(self, table: Table, conflict_columns: Sequence[str]) -> Insert:
        return sqlite.insert(table).on_conflict_do_nothing(index_elements=list(conflict_columns))

    def insert_adding(
        self, table: Table, conflict_columns: Sequence[str], added: Sequence[str]
    ) -> Insert:
        statement = sqlite.insert(table)
        return statement.on_conflict_do_update(
            index_elements=list(conflict_columns),
            set_={name: table.c[name] + statement.excluded[name] for name in added},
        )

    def nearest_ranks(self, values: Select[Any], shares: Sequence[tuple[int, int]]) -> Select[Any]:
        # No ordered-set aggregate: the connection's own (NEAREST_RANK, registered on
        # every connection), one per share; measured 2-4x faster than a window's ranks
        # (row_number or cume_dist) over 100,000 values.
        given = values.subquery()
        return select(
            given.c.key,
            *(
                getattr(func, NEAREST_RANK)(given.c.value, a / b).label(f"p{index}")
                for index, (a, b) in enumerate(shares)
            ),
        ).group_by(given.c.key)

    @staticmethod
    def _code(exc: sa_exc.DBAPIError) -> int | None:
        code = getattr(exc.orig, "sqlite_errorcode", None)
        return None if code is None else int(code) & 0xFF

    def rare(self, condition: ColumnElement[bool]) -> ColumnElement[bool]:
        result: ColumnElement[bool] = func.unlikely(condition)
        return result

    def utc_day(self, value: ColumnElement[Any]) -> ColumnElement[str]:
        # Stored as UTC text, "YYYY-MM-DD HH:MM:SS...": its first ten characters.
        day: ColumnElement[str] = func.substr(value, 1, 10)
        return day

    def activity(self, at: ColumnElement[Any], lag_us: ColumnElement[Any]) -> ColumnElement[Any]:
        # Integer microseconds from the text (julianday is a float: not exact): the
        # seconds, then the fraction's six digits (padded, should one be shorter); the
        # arithmetic reads both texts as integers.
        seconds = func.strftime("%s", func.substr(at, 1, 19), type_=Integer)
        padded = at.op("||")(literal("000000", Text))
        fraction = func.substr(padded, 21, 6, type_=Integer)
        result: ColumnElement[int] = seconds * 1_000_000 + fraction + lag_us
        return result

    def time_before(self, at: ColumnElement[Any], by: timedelta) -> ColumnElement[Any]:
        # strftime's %f has milliseconds, rounded to the nearest: a millisecond more off
        # keeps the result earlier than exact (its shorter text sorts before the stored
        # time of the same millisecond); ``at`` once, so a subquery runs once.
        milliseconds = math.ceil(by / timedelta(milliseconds=1)) + 1
        result: ColumnElement[str] = func.strftime(
            "%Y-%m-%d %H:%M:%f", at, f"-{milliseconds / 1000:.3f} seconds", type_=Text
        )
        return result

    def text_after(self, value: ColumnElement[Any], part: str, length: int) -> ColumnElement[str]:
        at = func.instr(value, part)
        result: ColumnElement[str] = func.coalesce(
            func.substr(value, func.nullif(at, 0) + len(part), length), ""
        )
        return result

    def sever(self, driver: Any) -> None:
        driver.interrupt()  # the statement (or its busy wait) ends with SQLITE_INTERRUPT

    def describe(self, exc: sa_exc.DBAPIError) -> str:
        code = self._code(exc)
        name = getattr(exc.orig, "sqlite_errorname", None)
        if code is None:  # the sqlite3 module's own (binding, a closed connection)
            return f"SQLite: {exc.orig}"
        text = str(exc.orig)
        if code == sqlite3.SQLITE_ERROR and not (
            text.startswith(_NAMING_OBJECTS) and len(text) <= 200 and "\n" not in text
        ):
            # Its messages quote the statement ('near "...": syntax error') or, from
            # FTS5, the query ('fts5: syntax error near "..."'): SQLite's own words
            # for the code instead, unless the message only names a schema object.
            return f"SQLite [{name}]: SQL logic error"
        return f"SQLite [{name}]: {text}"

    def translate(self, exc: sa_exc.DBAPIError) -> RepoError:
        code = self._code(exc)
        name = getattr(exc.orig, "sqlite_errorname", None)
        detail = self.describe(exc)
        if code in self._TRANSIENT or (code is None and exc.connection_invalidated):
            return BackendUnavailable(detail, code=name)
        if code in self._REJECTS:
            return WriteRejected(detail, code=name)
        return RepoError(detail)

    def is_retryable(self, exc: sa_exc.DBAPIError) -> bool:
        return self._code(exc) in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)

    def transaction_alive(self, connection: Connection) -> bool:
        # SQLite rolls a transaction back by itself on some errors (I/O, full disk).
        if connection.invalidated:
            return False
        return bool(connection.connection.driver_connection.in_transaction)  # type: ignore[union-attr]

    def is_broken_object(self, exc: sa_exc.DBAPIError) -> bool:
        # SQLITE_ERROR: a missing table or column, FTS5 refusing its own files (or a
        # statement badly put together: the probe tells); SQLITE_CORRUPT: damage.
        return self._code(exc) in (sqlite3.SQLITE_ERROR, sqlite3.SQLITE_CORRUPT)

    def is_damaged(self, exc: sa_exc.DBAPIError) -> bool:
        # A damaged page or FTS5 record (SQLITE_CORRUPT_VTAB too: the primary code).
        return self._code(exc) == sqlite3.SQLITE_CORRUPT


def _rollback_when_open(
    dbapi_connection: Any, record: ConnectionPoolEntry, reset_state: PoolResetState
) -> None:
    """The pool's reset of an aiosqlite connection (``pool_reset_on_return=None``): what
    the default reset does, a rollback, but only when the connection has a transaction
    open (its ``sqlite3`` connection says so; nothing runs on it while it is returned).
    A SQLAlchemy connection that ended its transaction, or a connection collected
    outside the event loop, is left as the default reset leaves it."""
    del record
    if reset_state.transaction_was_reset or not reset_state.asyncio_safe:
        return
    if dbapi_connection.driver_connection.in_transaction:
        dbapi_connection.rollback()
