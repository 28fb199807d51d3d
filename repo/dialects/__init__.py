"""Everything that differs between SQLite and PostgreSQL, in one place.

Repository code asks :func:`dialect_for` for the backend's :class:`BackendDialect` and
never branches on the dialect name itself. Another engine is not supported: asking for
one raises, naming it.
"""

from __future__ import annotations

import hashlib
import os
import re
import sqlite3
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar, Final

from sqlalchemy import (
    BigInteger,
    Connection,
    Engine,
    Float,
    Insert,
    Row,
    String,
    Table,
    Text,
    Uuid,
    bindparam,
    create_engine,
    delete,
    event,
    select,
    text,
    tuple_,
)
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import ConnectionPoolEntry
from sqlalchemy.types import TypeEngine

from sessionrepo.errors import BackendUnavailable, RepoError, WriteRejected
from sessionrepo.models.tables import UTCDateTime, messages_table, search_backlog_table
from sessionrepo.store.codec import ROW_COLUMNS

#: Key of the PostgreSQL advisory lock held while migrating ("sessrepo" in ASCII).
MIGRATION_LOCK_KEY: Final = 0x7365737372657070 & 0x7FFFFFFFFFFFFFFF

#: Execution option that marks a connection's transactions as read-only, so that
#: SQLite begins them DEFERRED instead of IMMEDIATE.
READ_ONLY: Final = "sessionrepo_read_only"


#: The stored content of a hit, cut to what is indexed (whole when it is encoded JSON,
#: which cannot be cut).
_CONTENT_HEAD = (
    "CASE WHEN substr(m.content, 1, 1) = '\ufdd0' THEN m.content "
    "ELSE substr(m.content, 1, 100000) END"
)

_M = messages_table.c
_B = search_backlog_table.c
#: Keys per ``IN (...)`` list when looking up which of a batch are already stored.
_LOOKUP_CHUNK = 500

_PG_INSERT_NEW = """
WITH input AS (
    SELECT * FROM unnest(
        %(client_msg_uuid)b::uuid[], %(role)b::text[], %(content)b::text[],
        %(tool_calls)b::text[], %(tool_call_id)b::text[], %(tool_name)b::text[],
        %(reasoning)b::text[], %(finish_reason)b::text[], %(token_count)b::bigint[],
        %(timestamp)b::timestamptz[], %(platform_message_id)b::text[], %(extra)b::text[],
        %(openai_keys)b::text[], %(content_hash)b::bytea[], %(tool_call_total)b::bigint[]
    ) WITH ORDINALITY AS i(
        client_msg_uuid, role, content, tool_calls, tool_call_id, tool_name, reasoning,
        finish_reason, token_count, "timestamp", platform_message_id, extra, openai_keys,
        content_hash, tool_call_total, ord
    )
),
existing AS (
    -- One probe of (session_id, client_msg_uuid) per key, whatever the statistics say:
    -- a join may be planned as a scan of the whole session (every append would then
    -- read every message the session has). A correlated subquery is never pulled up.
    SELECT client_msg_uuid, content_hash FROM (
        SELECT i.client_msg_uuid, (
            SELECT m.content_hash FROM messages m
            WHERE m.session_id = %(sid)s AND m.client_msg_uuid = i.client_msg_uuid
        ) AS content_hash
        FROM input i
        OFFSET 0  -- keeps the probe from being evaluated again for the WHERE below
    ) probed
    WHERE content_hash IS NOT NULL
),
fresh AS (
    SELECT i.*, %(next_seq)s::bigint + row_number() OVER (ORDER BY i.ord) - 1 AS seq
    FROM input i
    WHERE NOT EXISTS (SELECT 1 FROM existing e WHERE e.client_msg_uuid = i.client_msg_uuid)
),
inserted AS (
    INSERT INTO messages (
        session_id, seq, client_msg_uuid, role, content, tool_calls, tool_call_id,
        tool_name, reasoning, finish_reason, token_count, "timestamp",
        platform_message_id, extra, openai_keys, content_hash
    )
    SELECT %(sid)s, seq, client_msg_uuid, role, content, tool_calls, tool_call_id,
        tool_name, reasoning, finish_reason, token_count, "timestamp",
        platform_message_id, extra, openai_keys, content_hash
    FROM fresh
    ORDER BY seq
    ON CONFLICT (session_id, client_msg_uuid) DO NOTHING
    RETURNING client_msg_uuid
),
counted AS (
    UPDATE sessions SET
        next_seq = next_seq + (SELECT count(*) FROM inserted),
        message_count = message_count + (SELECT count(*) FROM inserted),
        tool_call_count = tool_call_count + (
            SELECT coalesce(sum(f.tool_call_total), 0)
            FROM fresh f JOIN inserted USING (client_msg_uuid)
        ),
        last_active_at = %(now)s
    WHERE id = %(sid)s AND EXISTS (SELECT 1 FROM inserted)
)
SELECT client_msg_uuid, NULL::bytea AS content_hash FROM inserted
UNION ALL
SELECT client_msg_uuid, content_hash FROM existing
"""


_PG_LOCK_SESSION = "SELECT next_seq FROM sessions WHERE id = %(sid)s FOR UPDATE"


def _lock_bypassed(session_id: str, missing: int) -> RepoError:
    # Only an appender that bypasses the session row lock could cause this.
    return RepoError(
        f"session {session_id!r}: {missing} keys appeared while the session was locked; "
        "nothing was written"
    )


def default_database_path() -> Path:
    """Where the embedded SQLite store lives when no URL is configured."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(Path.home(), ".local", "share")
    return Path(base) / "sessionrepo" / "sessionrepo.db"


def normalize_url(url: str | URL | None) -> URL:
    """A SQLAlchemy URL with the driver sessionrepo uses for that database.

    ``None`` means ``SESSIONREPO_DATABASE_URL``, else the embedded SQLite file. A bare
    file path is a SQLite file. ``postgresql://`` and ``postgres://`` use psycopg 3.
    """
    if not url:
        url = os.environ.get("SESSIONREPO_DATABASE_URL") or None
    if url is None:
        return URL.create("sqlite+pysqlite", database=str(default_database_path()))
    if isinstance(url, str):
        if "://" not in url:
            return URL.create("sqlite+pysqlite", database=url)
        try:
            url = make_url(url)
        except (sa_exc.ArgumentError, ValueError):
            # Not echoed: a URL that does not parse may still hold a password.
            raise RepoError(
                "not a database URL; expected postgresql://user@host/dbname, "
                "sqlite:///path/to/file.db or a file path"
            ) from None
    name = url.get_backend_name()
    if name in ("postgresql", "postgres"):
        return url.set(drivername="postgresql+psycopg")
    if name == "sqlite":
        return url.set(drivername="sqlite+pysqlite")
    raise RepoError(f"unsupported database {name!r}: sessionrepo runs on SQLite and PostgreSQL")


def safe_url(url: str | URL | None) -> str:
    """The URL with any password masked, for messages and logs."""
    if url is None:
        return "(default)"
    try:
        parsed = make_url(url) if isinstance(url, str) else url
    except sa_exc.ArgumentError:
        return "(unparseable URL)"
    return parsed.render_as_string(hide_password=True)


class BackendDialect:
    """What one backend does its own way. Subclasses register by SQLAlchemy dialect name."""

    name: ClassVar[str]
    _registry: ClassVar[dict[str, type[BackendDialect]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        BackendDialect._registry[cls.name] = cls

    def create_engine(
        self, url: URL, options: dict[str, Any], *, asynchronous: bool = False
    ) -> Engine:
        """The engine for ``url``; with ``asynchronous``, the synchronous face
        (``AsyncEngine.sync_engine``) of an engine on the backend's asyncio driver."""
        raise NotImplementedError

    def insert_ignoring(self, table: Table, conflict_columns: Sequence[str]) -> Insert:
        """``INSERT ... ON CONFLICT (conflict_columns) DO NOTHING``: only that key may be
        skipped; any other constraint violation still raises."""
        raise NotImplementedError

    def lock_for_migration(self, connection: Connection) -> None:
        """Serialise concurrent migrators for the rest of the current transaction."""

    def insert_new_messages(
        self,
        connection: Connection,
        session_id: str,
        next_seq: int,
        rows: Sequence[dict[str, Any]],
        now: datetime,
    ) -> dict[Any, bytes]:
        """Insert the rows whose key the session does not have yet, numbered from
        ``next_seq`` in order, and move the session's counters for them.

        The caller holds the session row's lock (:meth:`lock_session`) and passes rows
        with distinct keys, encoded by ``repo._codec.message_row``.

        Returns:
            ``{key: content_hash}`` of the rows that were already stored (not inserted).
        """
        raise NotImplementedError

    def lock_session(self, connection: Connection, session_id: str) -> int | None:
        """Lock the session's row for the rest of the transaction (appenders to one
        session queue here) and return its ``next_seq``; ``None`` when there is no such
        session."""
        raise NotImplementedError

    def lock_outbox_session(self, connection: Connection, session_id: str) -> None:
        """Serialise parkers of one session for the rest of the current transaction."""

    def limit_transaction_time(self, connection: Connection, seconds: float) -> None:
        """Make the server give up on the current transaction's statements (and lock
        waits) after ``seconds``. SQLite has nothing to give up on: its busy timeout
        bounds lock waits already."""

    def translate(self, exc: sa_exc.DBAPIError) -> RepoError:
        """Turn a driver error into sessionrepo's error, by error code, not by class."""
        raise NotImplementedError

    # -- full-text search (see repo/search.py) -----------------------------------------

    def index_documents(
        self, connection: Connection, session_id: str, seqs: Sequence[int], documents: Sequence[str]
    ) -> int:
        """Add prepared documents (space-separated words) of messages inserted in this
        transaction to the search index; returns how many of them were found and
        indexed."""
        raise NotImplementedError

    def index_entries(
        self, connection: Connection, entries: Sequence[tuple[str, int, datetime, str, str]]
    ) -> None:
        """Index ``(session_id, seq, timestamp, role, document)`` entries (a rebuild)."""
        raise NotImplementedError

    def reset_search_index(self, connection: Connection) -> None:
        """Empty the search index, recreating it if it is damaged (a rebuild starts)."""
        raise NotImplementedError

    def finish_search_index(self, connection: Connection) -> None:
        """Complete a rebuild once every entry is in."""

    def search_messages(
        self,
        connection: Connection,
        query: Any,
        filters: dict[str, Any],
        *,
        order: str,
        limit: int,
        offset: int,
        window: int,
    ) -> list[Any]:
        """Rows (session_id, seq, client_msg_uuid, role, timestamp, source, user_id,
        content, rank) of the messages matching a parsed ``repo.search.Query``; with
        ``order="rank"``, the newest ``window`` matches ordered by relevance."""
        raise NotImplementedError

    def is_search_index_error(self, exc: RepoError) -> bool:
        """Whether a failed search points at the index itself (corrupt, missing)."""
        return False

    def forget_search_documents(self, connection: Connection, session_ids: Sequence[str]) -> None:
        """Drop the index entries and backlog rows of sessions being deleted (the index
        has no foreign key to the messages: on PostgreSQL its check locked the message
        row of every insert; the backlog's cascade does not hold on a SQLite connection
        with foreign keys off)."""
        raise NotImplementedError

    def take_search_backlog(
        self,
        connection: Connection,
        limit: int,
        *,
        wait: bool,
        among: Sequence[tuple[str, int]] | None = None,
    ) -> list[Row[Any]]:
        """Up to ``limit`` backlog rows (session_id, first_seq, messages) in key order, locked
        for the rest of the transaction; only those keyed ``among`` when given. Rows
        another transaction holds are skipped (``FOR UPDATE SKIP LOCKED``: concurrent
        catch-ups never take the same rows) or, with ``wait``, waited for: then a row
        that transaction deleted is left out, so an empty answer means every row visible
        when the statement began is done. SQLite renders no lock clause: the catch-up
        holds the write lock already."""
        # Labelled: a Row's ``count`` is the tuple method.
        query = select(_B.session_id, _B.first_seq, _B.count.label("messages"))
        if among is not None:
            query = query.where(tuple_(_B.session_id, _B.first_seq).in_(among))
        query = query.order_by(_B.session_id, _B.first_seq).limit(limit)
        return list(connection.execute(query.with_for_update(skip_locked=not wait)))

    def _forget_backlog(self, connection: Connection, session_ids: Sequence[str]) -> None:
        # First: on PostgreSQL this waits for a catch-up holding these rows, whose index
        # entries are then committed and deleted below, not left behind.
        connection.execute(delete(search_backlog_table).where(_B.session_id.in_(session_ids)))

    def transaction_alive(self, connection: Connection) -> bool:
        """Whether the transaction survived a failed statement (after its savepoint was
        rolled back). PostgreSQL's does, unless the connection itself is gone."""
        return not connection.invalidated

    def is_retryable(self, exc: sa_exc.DBAPIError) -> bool:
        """Whether rerunning the whole transaction at once may succeed (lock contention)."""
        return False


def _engine(url: URL, asynchronous: bool, **options: Any) -> Engine:
    if asynchronous:
        return create_async_engine(url, **options).sync_engine
    return create_engine(url, **options)


def dialect_for(name: str) -> BackendDialect:
    try:
        return BackendDialect._registry[name]()
    except KeyError:
        raise RepoError(
            f"unsupported database dialect {name!r}: sessionrepo runs on SQLite and PostgreSQL"
        ) from None


class SQLiteDialect(BackendDialect):
    """SQLite in WAL mode: writes begin IMMEDIATE (take the write lock up front, which
    makes the busy timeout apply); reads begin DEFERRED and never block writers."""

    name = "sqlite"

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
        synchronous = str(options.pop("sqlite_synchronous", "FULL")).upper()
        if synchronous not in ("OFF", "NORMAL", "FULL", "EXTRA"):
            raise ValueError(f"sqlite_synchronous: {synchronous!r} is not a SQLite level")
        if url.database and url.database != ":memory:":
            Path(url.database).parent.mkdir(parents=True, exist_ok=True)
        engine = _engine(
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
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute(f"PRAGMA synchronous={synchronous}")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute(f"PRAGMA busy_timeout={int(busy_timeout * 1000)}")
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
    ) -> dict[Any, bytes]:
        # Keys are stored as SQLAlchemy's Uuid stores them without a native type.
        by_hex = {row["client_msg_uuid"].hex: row["client_msg_uuid"] for row in rows}
        hexes = list(by_hex)
        stored: dict[Any, bytes] = {}
        for start in range(0, len(hexes), _LOOKUP_CHUNK):
            chunk = hexes[start : start + _LOOKUP_CHUNK]
            found = connection.exec_driver_sql(
                f"{_SQLITE_LOOKUP}({', '.join('?' * len(chunk))})", (session_id, *chunk)
            )
            stored.update((by_hex[key], bytes(digest)) for key, digest in found)
        fresh = [row for row in rows if row["client_msg_uuid"] not in stored]
        if not fresh:
            return stored
        values = [
            (
                session_id,
                next_seq + index,
                row["client_msg_uuid"].hex,
                row["role"],
                row["content"],
                row["tool_calls"],
                row["tool_call_id"],
                row["tool_name"],
                row["reasoning"],
                row["finish_reason"],
                row["token_count"],
                _sqlite_time(row["timestamp"]),
                row["platform_message_id"],
                row["extra"],
                row["openai_keys"],
                row["content_hash"],
            )
            for index, row in enumerate(fresh)
        ]
        result = connection.exec_driver_sql(
            _SQLITE_INSERT, values, execution_options={"preserve_rowcount": True}
        )
        if result.rowcount != len(fresh):
            raise _lock_bypassed(session_id, len(fresh) - result.rowcount)
        tool_calls = sum(row["tool_call_total"] for row in fresh)
        connection.exec_driver_sql(
            _SQLITE_COUNTERS, (len(fresh), len(fresh), tool_calls, _sqlite_time(now), session_id)
        )
        return stored

    @staticmethod
    def _code(exc: sa_exc.DBAPIError) -> int | None:
        code = getattr(exc.orig, "sqlite_errorcode", None)
        return None if code is None else int(code) & 0xFF

    def translate(self, exc: sa_exc.DBAPIError) -> RepoError:
        code = self._code(exc)
        name = getattr(exc.orig, "sqlite_errorname", None)
        detail = f"SQLite: {exc.orig}"
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
        return _sqlite_index_documents(connection, session_id, seqs, documents)

    def index_entries(
        self, connection: Connection, entries: Sequence[tuple[str, int, datetime, str, str]]
    ) -> None:
        _sqlite_index_entries(connection, entries)

    def reset_search_index(self, connection: Connection) -> None:
        _sqlite_reset_search_index(connection)

    def transaction_alive(self, connection: Connection) -> bool:
        # SQLite rolls a transaction back by itself on some errors (I/O, full disk).
        if connection.invalidated:
            return False
        return bool(connection.connection.driver_connection.in_transaction)  # type: ignore[union-attr]

    def forget_search_documents(self, connection: Connection, session_ids: Sequence[str]) -> None:
        self._forget_backlog(connection, session_ids)
        _sqlite_forget(connection, session_ids)

    def search_messages(
        self,
        connection: Connection,
        query: Any,
        filters: dict[str, Any],
        *,
        order: str,
        limit: int,
        offset: int,
        window: int,
    ) -> list[Any]:
        return _sqlite_search(
            connection, query, filters, order=order, limit=limit, offset=offset, window=window
        )

    def is_search_index_error(self, exc: RepoError) -> bool:
        cause = exc.__cause__
        code = self._code(cause) if isinstance(cause, sa_exc.DBAPIError) else None
        message = str(exc)
        return code == sqlite3.SQLITE_CORRUPT or "messages_fts" in message or "fts5" in message


_SQLITE_NEXT_SEQ = "SELECT next_seq FROM sessions WHERE id = ?"
_SQLITE_LOOKUP = (
    "SELECT client_msg_uuid, content_hash FROM messages "
    "WHERE session_id = ? AND client_msg_uuid IN "
)
# The columns in _codec.ROW_COLUMNS order, after session_id and seq.
_SQLITE_ROW_COLUMNS = ", ".join(f'"{name}"' for name in ROW_COLUMNS)
_SQLITE_INSERT = (
    f"INSERT INTO messages (session_id, seq, {_SQLITE_ROW_COLUMNS}) "
    f"VALUES ({', '.join('?' * (len(ROW_COLUMNS) + 2))}) "
    "ON CONFLICT (session_id, client_msg_uuid) DO NOTHING"
)
_SQLITE_COUNTERS = (
    "UPDATE sessions SET next_seq = next_seq + ?, message_count = message_count + ?, "
    "tool_call_count = tool_call_count + ?, last_active_at = ? WHERE id = ?"
)


def _sqlite_time(value: datetime) -> str:
    """An aware time as ``UTCDateTime`` stores it on SQLite: the UTC wall time as
    SQLAlchemy's SQLite text ("2026-11-29 12:00:00.000000"), which sorts as time does."""
    if value.tzinfo is not UTC:
        if value.tzinfo is None or value.utcoffset() is None:
            raise RepoError("naive datetime reached the database layer")
        value = value.astimezone(UTC)
    return value.isoformat(" ", "microseconds")[:26]


_SQLITE_FTS_DDL = (
    "CREATE VIRTUAL TABLE messages_fts USING fts5("
    "session_id UNINDEXED, seq UNINDEXED, meta, body, "
    "tokenize = 'unicode61 remove_diacritics 2')"
)
_SQLITE_FTS_SHADOWS = ("data", "idx", "content", "docsize", "config")

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_MILLISECOND: Final = timedelta(milliseconds=1)
#: A message's FTS5 rowid is its timestamp in milliseconds shifted left by this many
#: bits; the low bits number the messages of one millisecond in the order they were
#: indexed. FTS5 walks its index in rowid order, so "newest first" and "the newest N
#: matches" stop after N rows instead of sorting every match.
_KEY_SLOT_BITS: Final = 8
_KEY_SLOTS: Final = 1 << _KEY_SLOT_BITS
_ROLES: Final = frozenset(("system", "user", "assistant", "tool"))


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
    connection: Connection, entries: Sequence[tuple[str, int, datetime, str, str]]
) -> None:
    if not entries:
        return
    keys = _sqlite_allocate_keys(connection, [search_key(entry[2]) for entry in entries])
    rows = sorted(  # ascending rowids: FTS5 appends them to its pending segment
        (key, session_id, seq, f"{_session_token(session_id)} r{role}", body)
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
    for start in range(0, len(distinct), _LOOKUP_CHUNK):
        chunk = distinct[start : start + _LOOKUP_CHUNK]
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
        for shadow in _SQLITE_FTS_SHADOWS:
            connection.exec_driver_sql(f"DROP TABLE IF EXISTS messages_fts_{shadow}")
        connection.exec_driver_sql("PRAGMA writable_schema = ON")
        connection.exec_driver_sql("DELETE FROM sqlite_master WHERE name = 'messages_fts'")
        connection.exec_driver_sql("PRAGMA writable_schema = RESET")  # reload the schema
    connection.exec_driver_sql(_SQLITE_FTS_DDL)


def _sqlite_forget(connection: Connection, session_ids: Sequence[str]) -> None:
    for session_id in session_ids:
        connection.exec_driver_sql(
            "DELETE FROM messages_fts WHERE rowid IN (SELECT rowid FROM messages_fts "
            "WHERE messages_fts MATCH ? AND session_id = ?)",
            (f'meta : "{_session_token(session_id)}"', session_id),
        )


def _fts5_query(query: Any, filters: dict[str, Any]) -> str | None:
    """The FTS5 expression: the user's terms in ``body``, the session and role filters
    as words of ``meta``. ``None`` when nothing can match (an unknown role)."""

    def quoted(term: Any) -> str:
        return 'body : "' + " ".join(term.words) + '"' + ("*" if term.prefix else "")

    expression = " AND ".join(quoted(term) for term in query.positive)
    for term in query.negative:
        expression = f"({expression}) NOT {quoted(term)}"
    meta: list[str] = []
    if filters.get("session_id") is not None:
        meta.append(f'meta : "{_session_token(filters["session_id"])}"')
    role = filters.get("role")
    if role is not None:
        if role not in _ROLES:
            return None
        meta.append(f'meta : "r{role}"')
    if meta:
        expression = " AND ".join(meta) + f" AND ({expression})"
    return expression


def _sqlite_search(
    connection: Connection,
    query: Any,
    filters: dict[str, Any],
    *,
    order: str,
    limit: int,
    offset: int,
    window: int,
) -> list[Any]:
    expression = _fts5_query(query, filters)
    if expression is None:
        return []
    params: dict[str, Any] = {"q": expression, "limit": limit, "offset": offset}
    clauses = ["messages_fts MATCH :q"]
    joins = ""
    # The FTS5 table drives (CROSS JOIN keeps it outermost), in rowid order.
    if filters.get("session_id") is not None:
        clauses.append("f.session_id = :f_session_id")
        params["f_session_id"] = filters["session_id"]
    since, until = filters.get("since"), filters.get("until")
    if since is not None or until is not None:
        joins += " CROSS JOIN messages m ON m.session_id = f.session_id AND m.seq = f.seq"
    if since is not None:
        clauses += ["f.rowid >= :k_since", "m.timestamp >= :f_since"]
        params |= {"k_since": search_key(since), "f_since": since}
    if until is not None:
        clauses.append("m.timestamp < :f_until")
        params["f_until"] = until
    if filters.get("source") is not None or filters.get("user_id") is not None:
        joins += " CROSS JOIN sessions s ON s.id = f.session_id"
        for name in ("source", "user_id"):
            if filters.get(name) is not None:
                clauses.append(f"s.{name} = :f_{name}")
                params[f"f_{name}"] = filters[name]
    where = " AND ".join(clauses)
    if order == "newest":
        matches = (
            "SELECT f.rowid AS k, f.session_id AS session_id, f.seq AS seq, 0.0 AS rank "
            f"FROM messages_fts f{joins} WHERE {where} "
            "ORDER BY f.rowid DESC LIMIT :limit OFFSET :offset"
        )
        return _run_search(connection, _page_of_hits(matches, "top.k DESC"), params)
    # The newest `window` matches (see repo.search.RANK_WINDOW), scored here: FTS5's
    # bm25() counts every match of every term first (for its idf), which for a
    # common word is most of the table.
    window_sql = (
        "SELECT f.rowid AS k, f.session_id AS session_id, f.seq AS seq, f.body AS body "
        f"FROM messages_fts f{joins} WHERE {where} ORDER BY f.rowid DESC LIMIT :window"
    )
    params["window"] = window
    found = connection.execute(_bind_times(text(window_sql), params), params).all()
    scores = _relevance(query, [row.body for row in found])
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
    return _run_search(connection, _page_of_hits(matches, "top.rank DESC, top.k DESC"), values)


#: BM25's term-frequency saturation and length normalisation.
_BM25_K1: Final = 1.2
_BM25_B: Final = 0.75


def _relevance(query: Any, bodies: Sequence[str]) -> list[float]:
    """BM25 without its idf factor (every document here holds every term) of indexed
    documents for a query's positive terms; a document's length is its length in
    characters, against the average of ``bodies``."""
    patterns = [
        re.compile(
            " "  # a literal first: the regex engine then skips ahead to candidates
            + " +".join(re.escape(word) for word in term.words)
            + ("" if term.prefix else "(?= )")
        )
        for term in query.positive
    ]
    average = max(1.0, sum(map(len, bodies)) / max(1, len(bodies)))
    scores: list[float] = []
    for body in bodies:
        padded = f" {body} "
        norm = _BM25_K1 * (1 - _BM25_B + _BM25_B * len(body) / average)
        score = 0.0
        for pattern in patterns:
            count = len(pattern.findall(padded))
            score += count * (_BM25_K1 + 1) / (count + norm)
        scores.append(score)
    return scores


_SEARCH_COLUMNS: dict[str, TypeEngine[Any]] = {
    "session_id": String(),
    "seq": BigInteger(),
    "client_msg_uuid": Uuid(),
    "role": String(),
    "timestamp": UTCDateTime(),
    "source": String(),
    "user_id": String(),
    "content": Text(),
    "rank": Float(),
}


def _page_of_hits(matches: str, outer_order: str) -> str:
    """Choose the page on the index alone, then read the content of those hits only
    (never carry message text through the choice)."""
    return (
        f"SELECT m.session_id, m.seq, m.client_msg_uuid, m.role, m.timestamp, s.source, "
        f"s.user_id, {_CONTENT_HEAD} AS content, top.rank AS rank "
        f"FROM ({matches}) top "
        "JOIN messages m ON m.session_id = top.session_id AND m.seq = top.seq "
        "JOIN sessions s ON s.id = m.session_id "
        f"ORDER BY {outer_order}"
    )


def _run_search(connection: Connection, sql: str, params: dict[str, Any]) -> list[Any]:
    statement = text(sql).columns(**_SEARCH_COLUMNS)
    bind_types = {"f_since": UTCDateTime(), "f_until": UTCDateTime()}
    statement = statement.bindparams(
        *(bindparam(name, type_=kind) for name, kind in bind_types.items() if name in params)
    )
    return list(connection.execute(statement, params))


class PostgresDialect(BackendDialect):
    """PostgreSQL through psycopg 3: a pool whose dead connections are replaced on use,
    every session in UTC."""

    name = "postgresql"

    # SQLSTATE classes and codes that describe the server's state, not the data.
    _TRANSIENT_CLASSES: Final = ("08", "53", "57", "58", "40")
    _TRANSIENT_CODES: Final = {
        "55P03",  # lock_not_available (lock_timeout)
        "55006",  # object_in_use
        "25006",  # read_only_sql_transaction (a standby, or default_transaction_read_only)
        "XX001",  # data_corrupted
        "XX002",  # index_corrupted
    }
    _REJECT_CLASSES: Final = ("22", "54")  # data_exception, program_limit_exceeded

    #: Text search configuration of the index and the queries. ``simple`` (no stemming,
    #: no stop words) is language-neutral and matches SQLite; another one (``english``)
    #: stems words, and then search results are not verified against the text.
    search_config = "simple"

    def create_engine(
        self, url: URL, options: dict[str, Any], *, asynchronous: bool = False
    ) -> Engine:
        self.search_config = str(options.pop("search_config", "simple"))
        # SQLite's options: they mean nothing to a server (one URL, one set of options).
        options.pop("busy_timeout", None)
        options.pop("sqlite_synchronous", None)
        connect_args: dict[str, Any] = {"options": "-c timezone=UTC"}
        connect_timeout = options.pop("connect_timeout", 10)
        if connect_timeout is not None:
            connect_args["connect_timeout"] = int(connect_timeout)
        # No ping before each checkout (a round trip per transaction): a dead connection
        # is detected on use and the transaction rerun (see Database._run).
        options.setdefault("pool_pre_ping", False)
        # psycopg 3 serves both: SQLAlchemy picks its async dialect for an async engine.
        return _engine(url, asynchronous, connect_args=connect_args, **options)

    def insert_ignoring(self, table: Table, conflict_columns: Sequence[str]) -> Insert:
        return postgresql.insert(table).on_conflict_do_nothing(
            index_elements=list(conflict_columns)
        )

    def lock_for_migration(self, connection: Connection) -> None:
        connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY})

    def lock_session(self, connection: Connection, session_id: str) -> int | None:
        row = connection.exec_driver_sql(_PG_LOCK_SESSION, {"sid": session_id}).first()
        return None if row is None else int(row[0])

    def insert_new_messages(
        self,
        connection: Connection,
        session_id: str,
        next_seq: int,
        rows: Sequence[dict[str, Any]],
        now: datetime,
    ) -> dict[Any, bytes]:
        # One statement, one round trip: the batch travels as binary arrays (no text
        # quoting of each element), and the lookup,
        # the insert and the counters happen on the server. Its snapshot is taken after
        # the caller locked the session row, so the lookup sees every committed row.
        params: dict[str, Any] = {
            name: [row[name] for row in rows] for name in (*ROW_COLUMNS, "tool_call_total")
        }
        params |= {"sid": session_id, "next_seq": next_seq, "now": now}
        found = connection.exec_driver_sql(_PG_INSERT_NEW, params).all()
        stored = {key: digest for key, digest in found if digest is not None}
        inserted = len(found) - len(stored)
        if inserted != len(rows) - len(stored):
            raise _lock_bypassed(session_id, len(rows) - len(stored) - inserted)
        return stored

    def limit_transaction_time(self, connection: Connection, seconds: float) -> None:
        milliseconds = max(1, int(seconds * 1000))
        connection.exec_driver_sql(
            f"SET LOCAL statement_timeout = {milliseconds}; SET LOCAL lock_timeout = {milliseconds}"
        )

    def lock_outbox_session(self, connection: Connection, session_id: str) -> None:
        connection.execute(
            text("SELECT pg_advisory_xact_lock(hashtextextended(:key, 0))"),
            {"key": f"sessionrepo.outbox:{session_id}"},
        )

    @staticmethod
    def _sqlstate(exc: sa_exc.DBAPIError) -> str | None:
        return getattr(exc.orig, "sqlstate", None)

    def translate(self, exc: sa_exc.DBAPIError) -> RepoError:
        state = self._sqlstate(exc)
        detail = f"PostgreSQL{f' [{state}]' if state else ''}: {str(exc.orig).strip()}"
        if state is None:
            # No SQLSTATE: the connection failed before the server could answer.
            if isinstance(exc, sa_exc.OperationalError | sa_exc.InterfaceError):
                return BackendUnavailable(detail)
            return RepoError(detail)
        if state[:2] in self._TRANSIENT_CLASSES or state in self._TRANSIENT_CODES:
            return BackendUnavailable(detail, code=state)
        if state[:2] in self._REJECT_CLASSES:
            return WriteRejected(detail, code=state)
        return RepoError(detail)

    def is_retryable(self, exc: sa_exc.DBAPIError) -> bool:
        return self._sqlstate(exc) in ("40001", "40P01")

    def index_documents(
        self, connection: Connection, session_id: str, seqs: Sequence[int], documents: Sequence[str]
    ) -> int:
        # The timestamp and role come from the rows just inserted (one statement).
        return int(
            connection.exec_driver_sql(
                "INSERT INTO message_search (session_id, seq, ts, role, document) "
                "SELECT m.session_id, m.seq, m.timestamp, m.role, "
                "to_tsvector(%(cfg)s::regconfig, d.body) "
                "FROM unnest(%(seqs)b::bigint[], %(bodies)b::text[]) AS d(seq, body) "
                "JOIN messages m ON m.session_id = %(sid)s AND m.seq = d.seq",
                {
                    "sid": session_id,
                    "cfg": self.search_config,
                    "seqs": list(seqs),
                    "bodies": list(documents),
                },
            ).rowcount
        )

    def index_entries(
        self, connection: Connection, entries: Sequence[tuple[str, int, datetime, str, str]]
    ) -> None:
        if not entries:
            return
        sids, seqs, stamps, roles, bodies = (list(column) for column in zip(*entries, strict=True))
        connection.exec_driver_sql(
            "INSERT INTO message_search (session_id, seq, ts, role, document) "
            "SELECT d.sid, d.seq, d.ts, d.role, to_tsvector(%(cfg)s::regconfig, d.body) "
            "FROM unnest(%(sids)b::text[], %(seqs)b::bigint[], %(stamps)b::timestamptz[], "
            "%(roles)b::text[], %(bodies)b::text[]) AS d(sid, seq, ts, role, body)",
            {
                "cfg": self.search_config,
                "sids": sids,
                "seqs": seqs,
                "stamps": stamps,
                "roles": roles,
                "bodies": bodies,
            },
        )

    def reset_search_index(self, connection: Connection) -> None:
        # Appends wait (the share lock) until the rebuild commits; the indexes are
        # built once over the whole table, after the rows, not maintained row by row.
        connection.exec_driver_sql("LOCK TABLE messages IN SHARE MODE")
        # Catch-ups in progress finish first and later ones wait (plain reads do not):
        # the rebuild then empties a backlog nobody holds, and no catch-up can be
        # waiting for message_search while this transaction waits for its rows.
        connection.exec_driver_sql("LOCK TABLE search_backlog IN EXCLUSIVE MODE")
        connection.exec_driver_sql("TRUNCATE message_search")
        connection.exec_driver_sql("DROP INDEX IF EXISTS ix_message_search_document")
        connection.exec_driver_sql("DROP INDEX IF EXISTS ix_message_search_ts")
        connection.exec_driver_sql("DROP INDEX IF EXISTS ix_message_search_session_ts")

    def finish_search_index(self, connection: Connection) -> None:
        connection.exec_driver_sql("SET LOCAL maintenance_work_mem = '256MB'")
        connection.exec_driver_sql(_PG_SEARCH_TS_INDEX)
        connection.exec_driver_sql(_PG_SEARCH_SESSION_TS_INDEX)
        connection.exec_driver_sql(_PG_SEARCH_GIN_INDEX)
        connection.exec_driver_sql("ANALYZE message_search")

    def forget_search_documents(self, connection: Connection, session_ids: Sequence[str]) -> None:
        self._forget_backlog(connection, session_ids)
        connection.exec_driver_sql(
            "DELETE FROM message_search WHERE session_id = ANY(%(ids)s)",
            {"ids": list(session_ids)},
        )

    def search_messages(
        self,
        connection: Connection,
        query: Any,
        filters: dict[str, Any],
        *,
        order: str,
        limit: int,
        offset: int,
        window: int,
    ) -> list[Any]:
        return _pg_search(
            connection,
            self.search_config,
            query,
            filters,
            order=order,
            limit=limit,
            offset=offset,
            window=window,
        )

    def is_search_index_error(self, exc: RepoError) -> bool:
        code = getattr(exc, "code", None)
        return code in ("XX001", "XX002") or "message_search" in str(exc)


_PG_SEARCH_TS_INDEX = "CREATE INDEX ix_message_search_ts ON message_search (ts)"
_PG_SEARCH_SESSION_TS_INDEX = (
    "CREATE INDEX ix_message_search_session_ts ON message_search (session_id, ts)"
)
_PG_SEARCH_GIN_INDEX = (
    "CREATE INDEX ix_message_search_document ON message_search USING gin (document)"
)
#: Rows of the newest end of ``message_search`` read to measure how common a query is.
_PG_PROBE_ROWS: Final = 500


def _pg_search(
    connection: Connection,
    config: str,
    query: Any,
    filters: dict[str, Any],
    *,
    order: str,
    limit: int,
    offset: int,
    window: int,
) -> list[Any]:
    """Two ways to the newest matches, chosen by measuring, not by the planner's guess
    (its estimates for words it has no statistics for are off by orders of magnitude):
    walk the ``ts`` (or ``(session_id, ts)``) index from the newest row, testing each
    document (cheap when the query is common), or take every match from the GIN index
    and sort them by time (cheap when it is rare). A probe of the newest 500 rows
    measures which. Either way the answer is the same; only its cost differs."""
    params: dict[str, Any] = {"cfg": config, "limit": limit, "offset": offset}
    parts: list[str] = []
    for index, term in enumerate(query.terms):
        name = f"t{index}"
        if term.prefix:
            params[name] = term.words[0]
            part = f"to_tsquery(CAST(:cfg AS regconfig), quote_literal(:{name}) || ':*')"
        else:
            params[name] = " ".join(term.words)
            part = f"phraseto_tsquery(CAST(:cfg AS regconfig), :{name})"
        parts.append(f"!! {part}" if term.excluded else part)
    tsquery = "(" + " && ".join(parts) + ")"
    time_clauses: list[str] = []
    clauses: list[str] = []
    for name, clause, kind in (
        ("since", "ms.ts >= :f_since", time_clauses),
        ("until", "ms.ts < :f_until", time_clauses),
        ("session_id", "ms.session_id = :f_session_id", clauses),
        ("role", "ms.role = :f_role", clauses),
        ("source", "s.source = :f_source", clauses),
        ("user_id", "s.user_id = :f_user_id", clauses),
    ):
        if filters.get(name) is not None:
            kind.append(clause)
            params[f"f_{name}"] = filters[name]
    joins = ""
    if filters.get("source") is not None or filters.get("user_id") is not None:
        joins = " JOIN sessions s ON s.id = ms.session_id"
    need = window if order == "rank" else offset + limit
    settings = ["jit = off", "max_parallel_workers_per_gather = 0", "enable_seqscan = off"]
    connection.exec_driver_sql("; ".join(f"SET LOCAL {setting}" for setting in settings))
    # The probe: the newest rows (of the session, with a session filter), how many match
    # the query with every filter, how many the query alone.
    scope = "".join(f" AND {clause}" for clause in time_clauses)
    if filters.get("session_id") is not None:
        scope += " AND ms.session_id = :f_session_id"
    probe = (
        f"SELECT count(*) FILTER (WHERE ms.document @@ {tsquery}"
        + "".join(f" AND {clause}" for clause in clauses)
        + f"), count(*) FILTER (WHERE ms.document @@ {tsquery}), count(*), "
        "(SELECT reltuples FROM pg_class WHERE oid = CAST('message_search' AS regclass)) "
        "FROM (SELECT ms.session_id, ms.role, ms.document FROM message_search ms "
        f"WHERE true{scope} ORDER BY ms.ts DESC LIMIT :probe) ms{joins}"
    )
    probe_params = params | {"probe": _PG_PROBE_ROWS}
    hits, term_hits, scanned, total = connection.execute(
        _bind_times(text(probe), probe_params), probe_params
    ).one()
    density = hits / scanned if scanned else 0.0
    if not hits and term_hits and (filters.get("source") or filters.get("user_id")):
        # The newest rows come from a few sessions (a session's messages are close in
        # time): the share of recently active sessions the filters keep is the better
        # guess of how many of the rows walked they keep.
        kept = connection.execute(
            text(
                "SELECT avg(CASE WHEN true"
                + "".join(f" AND {c}" for c in clauses if c.startswith("s."))
                + " THEN 1.0 ELSE 0.0 END) FROM (SELECT s.source, s.user_id FROM sessions s "
                "ORDER BY s.last_active_at DESC LIMIT 200) s"
            ),
            params,
        ).scalar()
        density = term_hits / scanned * float(kept or 0.0)
    if scanned < _PG_PROBE_ROWS:
        walk = True  # the probe read every candidate row: so will the walk
    elif not density:
        walk = False
    elif filters.get("session_id") is not None:
        walk = True  # a walk reads the session's rows at most; the GIN way, every match
    else:
        # Rows the walk tests (each one's document read and matched), against the
        # matches of the query the GIN way reads: their time only (a third of the work)
        # unless the index cannot decide alone (a phrase, an exclusion: every candidate
        # document is read again).
        recheck = any(len(term.words) > 1 or term.excluded for term in query.terms)
        walk_rows = need / density * (1 if recheck else 3)
        walk = walk_rows <= term_hits / scanned * max(float(total), float(scanned))
    connection.exec_driver_sql(
        "SET LOCAL enable_bitmapscan = off" if walk else "SET LOCAL enable_indexscan = off"
    )
    where = "".join(f" AND {clause}" for clause in (*time_clauses, *clauses))
    newest = (
        f"FROM message_search ms{joins} WHERE ms.document @@ {tsquery}{where} "
        "ORDER BY ms.ts DESC, ms.session_id DESC, ms.seq DESC"
    )
    if order == "newest":
        matches = (
            "SELECT ms.session_id AS session_id, ms.seq AS seq, ms.ts AS ts, 0.0 AS rank "
            f"{newest} LIMIT :limit OFFSET :offset"
        )
        outer = "top.ts DESC, top.session_id DESC, top.seq DESC"
    else:
        matches = (
            f"SELECT w.session_id, w.seq, w.ts, ts_rank(w.document, {tsquery}) AS rank "
            f"FROM (SELECT ms.session_id, ms.seq, ms.ts, ms.document {newest} "
            "LIMIT :window) w "
            "ORDER BY rank DESC, w.ts DESC, w.session_id DESC, w.seq DESC "
            "LIMIT :limit OFFSET :offset"
        )
        params["window"] = window
        outer = "top.rank DESC, top.ts DESC, top.session_id DESC, top.seq DESC"
    return _run_search(connection, _page_of_hits(matches, outer), params)


def _bind_times(statement: Any, params: dict[str, Any]) -> Any:
    kinds = {"f_since": UTCDateTime(), "f_until": UTCDateTime()}
    return statement.bindparams(
        *(bindparam(name, type_=kind) for name, kind in kinds.items() if name in params)
    )
