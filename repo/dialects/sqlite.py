"""SQLite: engine setup, error translation, the append SQL and the FTS5 search index.

SQLite in WAL mode through the standard library driver (``aiosqlite`` for asyncio). The
append runs its own SQL through the driver: compiling and binding through SQLAlchemy
cost more than SQLite itself (the values are stored exactly as SQLAlchemy's column types
would store them: see :func:`_sqlite_time`). The search index is an FTS5 table whose
rowid is derived from the message time, so the newest matches come first without a sort.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from functools import partial
from operator import itemgetter
from pathlib import Path
from typing import Any, Final, Protocol

from sqlalchemy import Connection, Engine, Insert, Row, Table, Uuid, event, func, select, text
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects import sqlite
from sqlalchemy.engine import URL
from sqlalchemy.pool import ConnectionPoolEntry
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.util import await_

from sessionrepo.dialects.base import (
    LOOKUP_CHUNK,
    NEW_SESSION_COLUMNS,
    READ_ONLY,
    BackendDialect,
    DirectAppend,
    DirectLoad,
    DirectResult,
    IndexEntry,
    SearchOrder,
    bind_times,
    lock_bypassed,
    make_engine,
    page_of_hits,
    run_search,
)
from sessionrepo.errors import BackendUnavailable, NotARepository, RepoError, WriteRejected
from sessionrepo.models.doctor import Check
from sessionrepo.models.tables import (
    MESSAGE_COLUMNS,
    MESSAGE_PLACE,
    UTCDateTime,
    messages_table,
    sessions_table,
)
from sessionrepo.search.query import Query, SearchFilters, Term
from sessionrepo.search.ranking import relevance

_M = messages_table.c

#: The search index (the migrations made it so; a test checks they agree).
_FTS_DDL = (
    "CREATE VIRTUAL TABLE messages_fts USING fts5("
    "session_id UNINDEXED, seq UNINDEXED, meta, body, "
    "tokenize = 'unicode61 remove_diacritics 2')"
)
_FTS_SHADOWS = ("data", "idx", "content", "docsize", "config")


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


class SQLiteDialect(BackendDialect):
    """SQLite in WAL mode: writes begin IMMEDIATE (take the write lock up front, which
    makes the busy timeout apply); reads begin DEFERRED and never block writers."""

    name = "sqlite"
    search_index_ddl = (_FTS_DDL,)

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
        busy_timeout = float(options.pop("busy_timeout", 10.0))
        server_timeout = options.pop("server_timeout", None)
        if server_timeout is not None:
            busy_timeout = min(busy_timeout, float(server_timeout))
        synchronous = str(options.pop("sqlite_synchronous", "FULL")).upper()
        if synchronous not in ("OFF", "NORMAL", "FULL", "EXTRA"):
            raise ValueError(f"sqlite_synchronous: {synchronous!r} is not a SQLite level")
        read_only = bool(options.pop("read_only", False))
        path = None if url.database in (None, "", ":memory:") else Path(url.database)
        if path is not None and url.query.get("uri") in ("true", "1"):
            # The caller's own SQLite URI (``file:…?…``): SQLite opens it as given.
            if read_only:
                url = url.update_query_dict({"mode": "ro"})
        elif path is not None:
            url = _read_only_url(url, path) if read_only else _create_private(url, path)
        engine = make_engine(
            url.set(drivername="sqlite+aiosqlite") if asynchronous else url,
            asynchronous,
            connect_args={"timeout": busy_timeout, "check_same_thread": False},
            **options,
        )

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
            cursor.close()

        @event.listens_for(engine, "begin")
        def _begin(connection: Connection) -> None:
            read_only = connection.get_execution_options().get(READ_ONLY, False)
            connection.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")

        return engine

    def insert_ignoring(self, table: Table, conflict_columns: Sequence[str]) -> Insert:
        return sqlite.insert(table).on_conflict_do_nothing(index_elements=list(conflict_columns))

    # The append path runs its own SQL through the driver: compiling and binding through
    # SQLAlchemy cost more than SQLite itself (the values are stored exactly as
    # SQLAlchemy's column types would store them: see _sqlite_time).

    def lock_session(self, connection: Connection, session_id: str) -> int | None:
        # BEGIN IMMEDIATE took the database's write lock: reading is enough.
        row = connection.exec_driver_sql(_SQLITE_NEXT_SEQ, (session_id,)).first()
        return None if row is None else int(row[0])

    def insert_new_messages(
        self,
        connection: Connection,
        session_id: str,
        next_seq: int,
        rows: Sequence[dict[str, Any]],
        now: datetime,
    ) -> dict[uuid.UUID, bytes]:
        stored, fresh = _sqlite_stored(connection.exec_driver_sql, session_id, rows)
        if not fresh:
            return stored
        _sqlite_insert(
            partial(connection.exec_driver_sql, execution_options={"preserve_rowcount": True}),
            session_id,
            next_seq,
            fresh,
        )
        tool_calls = sum(row["tool_call_total"] for row in fresh)
        connection.exec_driver_sql(
            _SQLITE_COUNTERS, (len(fresh), len(fresh), tool_calls, _sqlite_time(now), session_id)
        )
        return stored

    @staticmethod
    def _code(exc: sa_exc.DBAPIError) -> int | None:
        code = getattr(exc.orig, "sqlite_errorcode", None)
        return None if code is None else int(code) & 0xFF

    driver_error = sqlite3.Error

    def append_direct(self, driver: Any, append: DirectAppend) -> DirectResult | None:
        # The statements on the sqlite3 connection itself: SQLAlchemy's compiling,
        # binding and result handling cost more than SQLite's work. On aiosqlite, the
        # whole append runs in its thread as one call (one hop, not one per statement).
        if isinstance(driver, sqlite3.Connection):
            return _sqlite_append(driver, append)
        result: DirectResult = await_(driver._execute(_sqlite_append, driver._conn, append))
        return result

    def message_at(self, driver: Any, session_id: str, seq: int, key: uuid.UUID) -> bool:
        params = (session_id, seq, _sqlite_key(key))
        if isinstance(driver, sqlite3.Connection):
            return driver.execute(_SQLITE_AT, params).fetchone() is not None
        found: list[Any] = await_(driver._execute(_fetch_all, driver._conn, _SQLITE_AT, params))
        return bool(found)

    def load_direct(self, driver: Any, load: DirectLoad) -> list[Sequence[Any]] | None:
        sql, params = load.statement(lambda name: f":{name}")
        if isinstance(driver, sqlite3.Connection):
            return driver.execute(sql, params).fetchall()
        rows: list[Sequence[Any]] = await_(driver._execute(_fetch_all, driver._conn, sql, params))
        return rows

    def rare(self, condition: ColumnElement[bool]) -> ColumnElement[bool]:
        result: ColumnElement[bool] = func.unlikely(condition)
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

    def index_documents(
        self, connection: Connection, session_id: str, seqs: Sequence[int], documents: Sequence[str]
    ) -> int:
        with _fts5_damage():
            return _sqlite_index_documents(connection, session_id, seqs, documents)

    def index_entries(self, connection: Connection, entries: Sequence[IndexEntry]) -> None:
        with _fts5_damage():
            _sqlite_index_entries(connection, entries)

    def reset_search_index(self, connection: Connection) -> None:
        _sqlite_reset_search_index(connection)

    def transaction_alive(self, connection: Connection) -> bool:
        # SQLite rolls a transaction back by itself on some errors (I/O, full disk).
        if connection.invalidated:
            return False
        return bool(connection.connection.driver_connection.in_transaction)  # type: ignore[union-attr]

    def forget_search_entries(
        self, connection: Connection, session_id: str, seqs: Sequence[int]
    ) -> None:
        for start in range(0, len(seqs), LOOKUP_CHUNK):
            chunk = list(seqs[start : start + LOOKUP_CHUNK])
            connection.exec_driver_sql(
                "DELETE FROM messages_fts WHERE rowid IN (SELECT rowid FROM messages_fts "
                "WHERE messages_fts MATCH ? AND session_id = ? "
                f"AND seq IN ({', '.join('?' * len(chunk))}))",
                (f'meta : "{_session_token(session_id)}"', session_id, *chunk),
            )

    def forget_search_documents(self, connection: Connection, session_ids: Sequence[str]) -> None:
        self._forget_backlog(connection, session_ids)
        _sqlite_forget(connection, session_ids)

    def search_messages(
        self,
        connection: Connection,
        query: Query,
        filters: SearchFilters,
        *,
        order: SearchOrder,
        limit: int,
        offset: int,
        window: int,
    ) -> list[Row[Any]]:
        with _fts5_damage():
            return _sqlite_search(
                connection, query, filters, order=order, limit=limit, offset=offset, window=window
            )

    def is_broken_object(self, exc: sa_exc.DBAPIError) -> bool:
        # SQLITE_ERROR: a missing table or column, FTS5 refusing its own files (or a
        # statement badly put together: the probe tells); SQLITE_CORRUPT: damage.
        return self._code(exc) in (sqlite3.SQLITE_ERROR, sqlite3.SQLITE_CORRUPT)

    def is_damaged(self, exc: sa_exc.DBAPIError) -> bool:
        # A damaged page or FTS5 record (SQLITE_CORRUPT_VTAB too: the primary code).
        return self._code(exc) == sqlite3.SQLITE_CORRUPT

    def probe_search_index(self, connection: Connection) -> None:
        # A MATCH reads the FTS5 structure record and a doclist, not only the schema.
        with _fts5_damage():
            connection.exec_driver_sql(
                "SELECT rowid, session_id, seq, meta, body FROM messages_fts "
                "WHERE messages_fts MATCH '\"sessionrepo\"' LIMIT 1"
            ).all()

    def server_version(self, connection: Connection) -> str:
        return str(connection.exec_driver_sql("SELECT sqlite_version()").scalar())

    def settings(self, connection: Connection) -> dict[str, str]:
        return {
            name: str(connection.exec_driver_sql(f"PRAGMA {name}").scalar())
            for name in ("journal_mode", "synchronous", "foreign_keys", "busy_timeout")
        }

    def judge_settings(self, settings: dict[str, str]) -> list[Check]:
        """Judge SQLite PRAGMAs as a sessionrepo connection sees them."""
        checks = []
        mode = settings["journal_mode"].lower()
        checks.append(
            Check(name="journal_mode", status="ok", detail="wal")
            if mode == "wal"
            else Check(
                name="journal_mode",
                status="fail",
                detail=f"{mode}: WAL could not be enabled, so writers block readers",
                fix="keep the file on a local file system (WAL needs shared memory), "
                "writable by every gateway",
            )
        )
        levels = {"0": "OFF", "1": "NORMAL", "2": "FULL", "3": "EXTRA"}
        level = levels.get(settings["synchronous"], settings["synchronous"])
        if level in ("FULL", "EXTRA"):
            checks.append(Check(name="synchronous", status="ok", detail=level))
        else:
            checks.append(
                Check(
                    name="synchronous",
                    status="fail" if level == "OFF" else "warn",
                    detail=f"{level}: a power loss may lose commits already acknowledged",
                    fix="leave sqlite_synchronous at its default (FULL)",
                )
            )
        checks.append(
            Check(name="foreign_keys", status="ok", detail="on")
            if settings["foreign_keys"] == "1"
            else Check(
                name="foreign_keys",
                status="fail",
                detail="off: deleting a session would leave its messages behind",
                fix="open the store with sessionrepo (its connections turn foreign keys on)",
            )
        )
        timeout = int(settings["busy_timeout"])
        checks.append(
            Check(name="busy_timeout", status="ok", detail=f"{timeout} ms")
            if timeout > 0
            else Check(
                name="busy_timeout",
                status="fail",
                detail="0 ms: a writer fails at once while another holds the lock",
                fix="leave busy_timeout at its default (10 s)",
            )
        )
        return checks


_SQLITE_NEXT_SEQ = "SELECT next_seq FROM sessions WHERE id = ?"
_SQLITE_LOOKUP = (
    "SELECT client_msg_uuid, content_hash FROM messages "
    "WHERE session_id = ? AND client_msg_uuid IN "
)
#: A message's stored columns (its place first), quoted: ``timestamp`` is a keyword.
_INSERT_COLUMNS = ", ".join(f'"{name}"' for name in (*MESSAGE_PLACE, *MESSAGE_COLUMNS))
_SQLITE_INSERT = (
    f"INSERT INTO messages ({_INSERT_COLUMNS}) "
    f"VALUES ({', '.join('?' * (len(MESSAGE_PLACE) + len(MESSAGE_COLUMNS)))}) "
    "ON CONFLICT (session_id, client_msg_uuid) DO NOTHING"
)
#: An encoded row's values in :data:`MESSAGE_COLUMNS` order.
_pick_columns = itemgetter(*MESSAGE_COLUMNS)


_SQLITE_COUNTERS = (
    "UPDATE sessions SET next_seq = next_seq + ?, message_count = message_count + ?, "
    "tool_call_count = tool_call_count + ?, last_active_at = ? WHERE id = ?"
)


class _Rows(Protocol):
    """What a statement returns on either connection: a ``sqlite3.Cursor`` or a
    SQLAlchemy ``CursorResult``."""

    @property
    def rowcount(self) -> int: ...

    def __iter__(self) -> Iterator[Sequence[Any]]: ...


#: Runs one statement (``sqlite3.Connection.execute``, ``Connection.exec_driver_sql``).
_Execute = Callable[[str, Sequence[Any]], _Rows]
#: Runs one statement for each parameter tuple (``sqlite3.Connection.executemany``, or
#: ``exec_driver_sql`` with a list of tuples).
_ExecuteMany = Callable[[str, list[tuple[Any, ...]]], _Rows]


def _sqlite_stored(
    execute: _Execute, session_id: str, rows: Sequence[dict[str, Any]]
) -> tuple[dict[uuid.UUID, bytes], list[dict[str, Any]]]:
    """The batch's keys the session stores (with their stored content hash), and the
    rows whose key it does not store, in batch order. Both append paths look up through
    this, on the sqlite3 connection or on SQLAlchemy's, under the write lock."""
    # Keys are stored as SQLAlchemy's Uuid stores them without a native type.
    by_hex = {row["client_msg_uuid"].hex: row["client_msg_uuid"] for row in rows}
    hexes = list(by_hex)
    stored: dict[uuid.UUID, bytes] = {}
    for start in range(0, len(hexes), LOOKUP_CHUNK):
        chunk = hexes[start : start + LOOKUP_CHUNK]
        found = execute(f"{_SQLITE_LOOKUP}({', '.join('?' * len(chunk))})", (session_id, *chunk))
        stored.update((by_hex[key], bytes(digest)) for key, digest in found)
    return stored, [row for row in rows if row["client_msg_uuid"] not in stored]


def _sqlite_insert(
    executemany: _ExecuteMany, session_id: str, next_seq: int, fresh: Sequence[dict[str, Any]]
) -> None:
    """Insert ``fresh`` numbered from ``next_seq`` in one ``executemany``. Its rowcount must
    be every row: a key the lookup did not see means a writer bypassed the lock."""
    values = []
    for index, row in enumerate(fresh):
        value = list(_pick_columns(row))
        for position, convert in _CONVERTED:
            value[position] = convert(value[position])
        values.append((session_id, next_seq + index, *value))
    inserted = executemany(_SQLITE_INSERT, values).rowcount
    if inserted != len(fresh):
        raise lock_bypassed(session_id, len(fresh) - inserted)


@contextmanager
def _fts5_damage() -> Iterator[None]:
    """FTS5 statements: a garbled length in a damaged index record makes FTS5 ask for an
    absurd allocation and fail with SQLITE_NOMEM, which Python's sqlite3 raises as a bare
    ``MemoryError``, outside SQLAlchemy's ``DBAPIError``. Raised from one of the index's own
    statements it means a damaged index: reported as SQLITE_CORRUPT, so the index is marked
    stale (``reindex`` repairs it) instead of the error escaping the public API."""
    try:
        yield
    except MemoryError as exc:
        damaged = sqlite3.DatabaseError(f"the FTS5 index could not be read ({exc!r})")
        damaged.sqlite_errorcode = sqlite3.SQLITE_CORRUPT
        damaged.sqlite_errorname = "SQLITE_CORRUPT"
        raise sa_exc.DatabaseError("FTS5 statement", None, damaged) from exc


def _sqlite_time(value: datetime) -> str:
    """An aware time as ``UTCDateTime`` stores it on SQLite: the UTC wall time as
    SQLAlchemy's SQLite text ("2026-11-29 12:00:00.000000"), which sorts as time does."""
    if value.tzinfo is not UTC:
        if value.tzinfo is None or value.utcoffset() is None:
            raise RepoError("naive datetime reached the database layer")
        value = value.astimezone(UTC)
    return value.isoformat(" ", "microseconds")[:26]


def _sqlite_key(key: uuid.UUID) -> str:
    """A key as SQLAlchemy's ``Uuid`` stores it without a native type: 32 hex digits."""
    return key.hex


def _converter(column_type: object) -> Callable[[Any], Any] | None:
    if isinstance(column_type, Uuid):
        return _sqlite_key
    if isinstance(column_type, UTCDateTime):
        return _sqlite_time
    return None


#: ``(position, convert)`` of the encoded row's values that the driver takes in another
#: form than the codec gives (the key, times), found by the column's type.
_CONVERTED: Final = tuple(
    (position, convert)
    for position, name in enumerate(MESSAGE_COLUMNS)
    if (convert := _converter(messages_table.c[name].type)) is not None
)
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_MILLISECOND: Final = timedelta(milliseconds=1)
#: A message's FTS5 rowid is its timestamp in milliseconds shifted left by this many
#: bits; the low bits number the messages of one millisecond in the order they were
#: indexed. FTS5 walks its index in rowid order, so "newest first" and "the newest N
#: matches" stop after N rows instead of sorting every match.
_KEY_SLOT_BITS: Final = 8
_KEY_SLOTS: Final = 1 << _KEY_SLOT_BITS
_ROLES: Final = frozenset(("system", "developer", "user", "assistant", "tool", "function"))


def search_key(timestamp: datetime) -> int:
    """The smallest FTS5 rowid a message with this timestamp may get."""
    return ((timestamp - _EPOCH) // _MILLISECOND) << _KEY_SLOT_BITS


def _session_token(session_id: str) -> str:
    """The word standing for a session in the ``meta`` column (a hash: any session id
    becomes one ASCII word; a collision is filtered out by the exact ``session_id``)."""
    digest = hashlib.blake2b(session_id.encode("utf-8", "surrogatepass"), digest_size=8)
    return "s" + digest.hexdigest()


def _sqlite_index_documents(
    connection: Connection, session_id: str, seqs: Sequence[int], documents: Sequence[str]
) -> int:
    found = {
        seq: (timestamp, role)
        for seq, timestamp, role in connection.execute(
            select(_M.seq, _M.timestamp, _M.role).where(
                _M.session_id == session_id, _M.seq >= min(seqs), _M.seq <= max(seqs)
            )
        )
    }
    entries = [
        (session_id, seq, *found[seq], body)
        for seq, body in zip(seqs, documents, strict=True)
        if seq in found
    ]
    _sqlite_index_entries(connection, entries)
    return len(entries)


def _sqlite_index_entries(
    connection: Connection, entries: Sequence[tuple[str, int, datetime, str | None, str]]
) -> None:
    if not entries:
        return
    keys = _sqlite_allocate_keys(connection, [search_key(entry[2]) for entry in entries])
    rows = sorted(  # ascending rowids: FTS5 appends them to its pending segment
        (key, session_id, seq, f"{_session_token(session_id)} r{role or ''}", body)
        for key, (session_id, seq, _, role, body) in zip(keys, entries, strict=True)
    )
    connection.exec_driver_sql(
        "INSERT INTO messages_fts (rowid, session_id, seq, meta, body) VALUES (?, ?, ?, ?, ?)",
        rows,
    )


def _sqlite_allocate_keys(connection: Connection, bases: Sequence[int]) -> list[int]:
    """A free rowid for each base key: after the last one taken in its millisecond."""
    last: dict[int, int | None] = {}
    distinct = sorted(set(bases))
    for start in range(0, len(distinct), LOOKUP_CHUNK):
        chunk = distinct[start : start + LOOKUP_CHUNK]
        values = ", ".join(["(?)"] * len(chunk))
        last.update(
            connection.exec_driver_sql(
                f"WITH b(base) AS (VALUES {values}) SELECT base, (SELECT max(rowid) "
                f"FROM messages_fts WHERE rowid BETWEEN b.base AND b.base + {_KEY_SLOTS - 1}) "
                "FROM b",
                tuple(chunk),
            ).all()
        )
    keys: list[int] = []
    taken: set[int] = set()
    for base in bases:
        previous = last[base]
        key = base if previous is None else previous + 1
        while key in taken:
            key += 1
        if key >= base + _KEY_SLOTS:
            # More messages in one millisecond than it has slots: the next free rowid
            # after it (such a message sorts as a little newer than it is).
            key = _sqlite_free_key(connection, key, taken)
        last[base] = key
        taken.add(key)
        keys.append(key)
    return keys


def _sqlite_free_key(connection: Connection, candidate: int, taken: set[int]) -> int:
    while True:
        used = {
            row[0]
            for row in connection.exec_driver_sql(
                "SELECT rowid FROM messages_fts WHERE rowid >= ? ORDER BY rowid LIMIT 512",
                (candidate,),
            )
        }
        for key in range(candidate, candidate + 512):
            if key not in used and key not in taken:
                return key
        candidate += 512


def _sqlite_reset_search_index(connection: Connection) -> None:
    try:
        with connection.begin_nested():
            connection.exec_driver_sql("DROP TABLE IF EXISTS messages_fts")
    except sa_exc.DBAPIError:
        # Too damaged for FTS5 to drop itself: remove its shadow tables and its entry.
        for shadow in _FTS_SHADOWS:
            connection.exec_driver_sql(f"DROP TABLE IF EXISTS messages_fts_{shadow}")
        connection.exec_driver_sql("PRAGMA writable_schema = ON")
        connection.exec_driver_sql("DELETE FROM sqlite_master WHERE name = 'messages_fts'")
        connection.exec_driver_sql("PRAGMA writable_schema = RESET")  # reload the schema
    connection.exec_driver_sql(_FTS_DDL)


def _sqlite_forget(connection: Connection, session_ids: Sequence[str]) -> None:
    for session_id in session_ids:
        connection.exec_driver_sql(
            "DELETE FROM messages_fts WHERE rowid IN (SELECT rowid FROM messages_fts "
            "WHERE messages_fts MATCH ? AND session_id = ?)",
            (f'meta : "{_session_token(session_id)}"', session_id),
        )


def _fts5_query(query: Query, filters: SearchFilters) -> str | None:
    """The FTS5 expression: the user's terms in ``body``, the session and role filters
    as words of ``meta``. ``None`` when nothing can match (an unknown role)."""

    def quoted(term: Term) -> str:
        return 'body : "' + " ".join(term.words) + '"' + ("*" if term.prefix else "")

    expression = " AND ".join(quoted(term) for term in query.positive)
    for term in query.negative:
        expression = f"({expression}) NOT {quoted(term)}"
    meta: list[str] = []
    if filters.session_id is not None:
        meta.append(f'meta : "{_session_token(filters.session_id)}"')
    role = filters.role
    if role is not None:
        if role not in _ROLES:
            return None
        meta.append(f'meta : "r{role}"')
    if meta:
        expression = " AND ".join(meta) + f" AND ({expression})"
    return expression


def _sqlite_search(
    connection: Connection,
    query: Query,
    filters: SearchFilters,
    *,
    order: SearchOrder,
    limit: int,
    offset: int,
    window: int,
) -> list[Row[Any]]:
    expression = _fts5_query(query, filters)
    if expression is None:
        return []
    params: dict[str, Any] = {"q": expression, "limit": limit, "offset": offset}
    clauses = ["messages_fts MATCH :q"]
    joins = ""
    # The FTS5 table drives (CROSS JOIN keeps it outermost), in rowid order.
    if filters.session_id is not None:
        clauses.append("f.session_id = :f_session_id")
        params["f_session_id"] = filters.session_id
    since, until = filters.since, filters.until
    if since is not None or until is not None:
        joins += " CROSS JOIN messages m ON m.session_id = f.session_id AND m.seq = f.seq"
    if since is not None:
        clauses += ["f.rowid >= :k_since", "m.timestamp >= :f_since"]
        params |= {"k_since": search_key(since), "f_since": since}
    if until is not None:
        clauses.append("m.timestamp < :f_until")
        params["f_until"] = until
    if filters.source is not None or filters.user_id is not None:
        joins += " CROSS JOIN sessions s ON s.id = f.session_id"
        for name, value in (("source", filters.source), ("user_id", filters.user_id)):
            if value is not None:
                clauses.append(f"s.{name} = :f_{name}")
                params[f"f_{name}"] = value
    where = " AND ".join(clauses)
    if order == "newest":
        matches = (
            "SELECT f.rowid AS k, f.session_id AS session_id, f.seq AS seq, 0.0 AS rank "
            f"FROM messages_fts f{joins} WHERE {where} "
            "ORDER BY f.rowid DESC LIMIT :limit OFFSET :offset"
        )
        return run_search(connection, page_of_hits(matches, "top.k DESC"), params)
    # The newest `window` matches (see store.search_index.RANK_WINDOW), scored here: FTS5's
    # bm25() counts every match of every term first (for its idf), which for a
    # common word is most of the table.
    window_sql = (
        "SELECT f.rowid AS k, f.session_id AS session_id, f.seq AS seq, f.body AS body "
        f"FROM messages_fts f{joins} WHERE {where} ORDER BY f.rowid DESC LIMIT :window"
    )
    params["window"] = window
    found = connection.execute(bind_times(text(window_sql), params), params).all()
    scores = relevance(query, [row.body for row in found])
    ranked = sorted(zip(scores, found, strict=True), key=lambda pair: (-pair[0], -pair[1].k))[
        offset : offset + limit
    ]
    if not ranked:
        return []
    values: dict[str, Any] = {}
    for index, (score, row) in enumerate(ranked):
        values |= {f"k{index}": row.k, f"s{index}": row.session_id}
        values |= {f"q{index}": row.seq, f"r{index}": score}
    rows = ", ".join(f"(:k{i}, :s{i}, :q{i}, :r{i})" for i in range(len(ranked)))
    matches = (
        "SELECT column1 AS k, column2 AS session_id, column3 AS seq, column4 AS rank "
        f"FROM (VALUES {rows})"
    )
    return run_search(connection, page_of_hits(matches, "top.rank DESC, top.k DESC"), values)


#: A new session's columns (:data:`NEW_SESSION_COLUMNS`) converted as SQLAlchemy would
#: for SQLite (JSON as text, times as SQLAlchemy writes them).
_SESSION_BINDS: Final = tuple(
    sessions_table.c[name].type.bind_processor(sqlite.dialect()) for name in NEW_SESSION_COLUMNS
)
_SQLITE_CREATE = (
    "INSERT INTO sessions ("
    + ", ".join(f'"{name}"' for name in NEW_SESSION_COLUMNS)
    + ", message_count, tool_call_count, next_seq, last_active_at) VALUES ("
    + ", ".join("?" * (len(NEW_SESSION_COLUMNS) + 4))
    + ")"
)
_SQLITE_PARKED = "SELECT 1 FROM pending_outbox WHERE session_id = ? AND state = 'pending' LIMIT 1"
_SQLITE_AT = "SELECT 1 FROM messages WHERE session_id = ? AND seq = ? AND client_msg_uuid = ?"
_SQLITE_BACKLOG = "INSERT INTO search_backlog (session_id, first_seq, count) VALUES (?, ?, ?)"


def _sqlite_append(db: sqlite3.Connection, append: DirectAppend) -> DirectResult:
    """An append in one ``BEGIN IMMEDIATE`` transaction on the sqlite3 connection: the
    write lock serialises appenders, so what the lookup finds is what the insert would
    collide with."""
    sid = append.session_id
    db.execute("BEGIN IMMEDIATE")
    try:
        result = _sqlite_append_locked(db, append, sid)
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise
    if result.first_seq is None:
        db.execute("ROLLBACK")  # nothing written: no commit to wait for
    else:
        db.execute("COMMIT")
    return result


def _sqlite_append_locked(db: sqlite3.Connection, append: DirectAppend, sid: str) -> DirectResult:
    if append.verify is not None:
        seq, key = append.verify
        if db.execute(_SQLITE_AT, (sid, seq, _sqlite_key(key))).fetchone() is None:
            return DirectResult(stored={}, first_seq=None, lost=True)
    session = db.execute(_SQLITE_NEXT_SEQ, (sid,)).fetchone()
    if append.behind_outbox and db.execute(_SQLITE_PARKED, (sid,)).fetchone() is not None:
        return DirectResult(stored={}, first_seq=None, queued=True)
    rows = append.rows
    if session is None:
        stored: dict[uuid.UUID, bytes] = {}
        fresh = list(rows)  # a session that does not exist yet stores none of them
    else:
        stored, fresh = _sqlite_stored(db.execute, sid, rows)
    refused = append.refuse_conflicts and any(
        stored.get(row["client_msg_uuid"], row["content_hash"]) != row["content_hash"]
        for row in rows
    )
    if not fresh or refused:
        return DirectResult(stored=stored, first_seq=None)
    now = _sqlite_time(append.now)
    tool_calls = sum(row["tool_call_total"] for row in fresh)
    if session is None:
        next_seq = 1
        values = [
            value if bind is None else bind(value)
            for name, bind in zip(NEW_SESSION_COLUMNS, _SESSION_BINDS, strict=True)
            for value in (append.new_session.get(name),)
        ]
        db.execute(_SQLITE_CREATE, (*values, len(fresh), tool_calls, 1 + len(fresh), now))
    else:
        next_seq = int(session[0])
        db.execute(_SQLITE_COUNTERS, (len(fresh), len(fresh), tool_calls, now, sid))
    _sqlite_insert(db.executemany, sid, next_seq, fresh)
    if append.enqueue:
        db.execute(_SQLITE_BACKLOG, (sid, next_seq, len(fresh)))
    return DirectResult(stored=stored, first_seq=next_seq)


def _fetch_all(db: sqlite3.Connection, sql: str, params: Any) -> list[Any]:
    return db.execute(sql, params).fetchall()
