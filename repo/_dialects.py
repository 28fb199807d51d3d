"""Everything that differs between SQLite and PostgreSQL, in one place.

Repository code asks :func:`dialect_for` for the backend's :class:`BackendDialect` and
never branches on the dialect name itself. Another engine is not supported: asking for
one raises, naming it.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar, Final

from sqlalchemy import (
    BigInteger,
    Connection,
    Engine,
    Float,
    Insert,
    String,
    Table,
    Text,
    Uuid,
    bindparam,
    create_engine,
    event,
    select,
    text,
    update,
)
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import ConnectionPoolEntry
from sqlalchemy.types import TypeEngine

from models.tables import UTCDateTime, messages_table, sessions_table
from repo._codec import ROW_COLUMNS, encoded_messages
from repo.errors import BackendUnavailable, RepoError, WriteRejected

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
_S = sessions_table.c
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
    SELECT m.client_msg_uuid, m.content_hash
    FROM input i
    JOIN messages m ON m.session_id = %(sid)s AND m.client_msg_uuid = i.client_msg_uuid
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

        The caller holds the session row's lock and passes rows with distinct keys,
        encoded by ``repo._codec.message_row``.

        Returns:
            ``{key: content_hash}`` of the rows that were already stored (not inserted).
        """
        stored: dict[Any, bytes] = {}
        keys = [row["client_msg_uuid"] for row in rows]
        for start in range(0, len(keys), _LOOKUP_CHUNK):
            found = connection.execute(
                select(_M.client_msg_uuid, _M.content_hash).where(
                    _M.session_id == session_id,
                    _M.client_msg_uuid.in_(keys[start : start + _LOOKUP_CHUNK]),
                )
            )
            stored.update((key, digest) for key, digest in found)
        fresh = [row for row in rows if row["client_msg_uuid"] not in stored]
        if not fresh:
            return stored
        values = [
            {name: row[name] for name in ROW_COLUMNS}
            | {"session_id": session_id, "seq": next_seq + index}
            for index, row in enumerate(fresh)
        ]
        insert = self.insert_ignoring(encoded_messages, ["session_id", "client_msg_uuid"])  # type: ignore[arg-type]
        result = connection.execute(insert, values, execution_options={"preserve_rowcount": True})
        if result.rowcount != len(fresh):
            raise _lock_bypassed(session_id, len(fresh) - result.rowcount)
        connection.execute(
            update(sessions_table)
            .where(_S.id == session_id)
            .values(
                next_seq=_S.next_seq + len(fresh),
                message_count=_S.message_count + len(fresh),
                tool_call_count=_S.tool_call_count + sum(row["tool_call_total"] for row in fresh),
                last_active_at=now,
            )
        )
        return stored

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
    ) -> None:
        """Add prepared documents (space-separated words) to the search index."""
        raise NotImplementedError

    def reset_search_index(self, connection: Connection) -> None:
        """Empty the search index, recreating it if it is damaged."""
        raise NotImplementedError

    def search_messages(
        self,
        connection: Connection,
        query: Any,
        filters: dict[str, Any],
        *,
        order: str,
        limit: int,
        offset: int,
    ) -> list[Any]:
        """Rows (session_id, seq, client_msg_uuid, role, timestamp, source, user_id,
        content, rank) of the messages matching a parsed ``repo.search.Query``."""
        raise NotImplementedError

    def is_search_index_error(self, exc: RepoError) -> bool:
        """Whether a failed search points at the index itself (corrupt, missing)."""
        return False

    def forget_search_documents(self, connection: Connection, session_ids: Sequence[str]) -> None:
        """Drop the index entries of sessions being deleted (PostgreSQL's foreign key
        cascades by itself; FTS5 has no foreign keys)."""

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
    ) -> None:
        _sqlite_index_documents(connection, session_id, seqs, documents)

    def reset_search_index(self, connection: Connection) -> None:
        _sqlite_reset_search_index(connection)

    def transaction_alive(self, connection: Connection) -> bool:
        # SQLite rolls a transaction back by itself on some errors (I/O, full disk).
        if connection.invalidated:
            return False
        return bool(connection.connection.driver_connection.in_transaction)  # type: ignore[union-attr]

    def forget_search_documents(self, connection: Connection, session_ids: Sequence[str]) -> None:
        for start in range(0, len(session_ids), _LOOKUP_CHUNK):
            chunk = list(session_ids[start : start + _LOOKUP_CHUNK])
            marks = ", ".join("?" * len(chunk))
            connection.exec_driver_sql(
                f"DELETE FROM messages_fts WHERE session_id IN ({marks})", tuple(chunk)
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
    ) -> list[Any]:
        where, params = _search_filters(filters)
        rank = "-bm25(messages_fts)" if order == "rank" else "0.0"
        matches = (
            f"SELECT f.session_id AS session_id, f.seq AS seq, {rank} AS rank "
            f"FROM messages_fts f{_search_joins(filters, order, 'f')} "
            f"WHERE messages_fts MATCH :q{where}"
        )
        params |= {"q": _fts5_query(query), "limit": limit, "offset": offset}
        return _run_search(connection, _page_of_hits(matches, order), params, filters)

    def is_search_index_error(self, exc: RepoError) -> bool:
        cause = exc.__cause__
        code = self._code(cause) if isinstance(cause, sa_exc.DBAPIError) else None
        message = str(exc)
        return code == sqlite3.SQLITE_CORRUPT or "messages_fts" in message or "fts5" in message


_SQLITE_FTS_DDL = (
    "CREATE VIRTUAL TABLE messages_fts USING fts5("
    "body, session_id UNINDEXED, seq UNINDEXED, "
    "tokenize = 'unicode61 remove_diacritics 2')"
)
_SQLITE_FTS_SHADOWS = ("data", "idx", "content", "docsize", "config")


def _sqlite_index_documents(
    connection: Connection, session_id: str, seqs: Sequence[int], documents: Sequence[str]
) -> None:
    connection.exec_driver_sql(
        "INSERT INTO messages_fts (body, session_id, seq) VALUES (?, ?, ?)",
        [(text, session_id, seq) for text, seq in zip(documents, seqs, strict=True)],
    )


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


def _fts5_query(query: Any) -> str:
    def quoted(term: Any) -> str:
        return '"' + " ".join(term.words) + '"' + ("*" if term.prefix else "")

    expression = " AND ".join(quoted(term) for term in query.positive)
    for term in query.negative:
        expression = f"({expression}) NOT {quoted(term)}"
    return expression


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


def _search_filters(filters: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    clauses: list[str] = []
    params: dict[str, Any] = {}
    columns = {
        "session_id": "m.session_id = :f_session_id",
        "source": "s.source = :f_source",
        "role": "m.role = :f_role",
        "user_id": "s.user_id = :f_user_id",
        "since": "m.timestamp >= :f_since",
        "until": "m.timestamp < :f_until",
    }
    for name, clause in columns.items():
        if filters.get(name) is not None:
            clauses.append(clause)
            params[f"f_{name}"] = filters[name]
    return "".join(f" AND {clause}" for clause in clauses), params


def _search_joins(filters: dict[str, Any], order: str, index: str) -> str:
    """The joins the filters and the order need while choosing a page of hits (none for
    an unfiltered ranked search: the page is chosen on the index alone)."""
    joins = ""
    needs_sessions = filters.get("source") is not None or filters.get("user_id") is not None
    needs_messages = (
        needs_sessions
        or order == "newest"
        or any(filters.get(name) is not None for name in ("session_id", "role", "since", "until"))
    )
    if needs_messages:
        joins += f" JOIN messages m ON m.session_id = {index}.session_id AND m.seq = {index}.seq"
    if needs_sessions:
        joins += " JOIN sessions s ON s.id = m.session_id"
    return joins


def _page_of_hits(matches: str, order: str) -> str:
    """Choose the page on keys alone, then read the content of those hits only (never
    carry message text through the sort of every match)."""
    inner_order = "rank DESC" if order == "rank" else "m.timestamp DESC, m.session_id, m.seq DESC"
    if order == "newest":
        matches = matches.replace(" AS rank ", " AS rank, m.timestamp AS ts ", 1)
    outer_order = (
        "top.rank DESC" if order == "rank" else "m.timestamp DESC, m.session_id, m.seq DESC"
    )
    return (
        f"SELECT m.session_id, m.seq, m.client_msg_uuid, m.role, m.timestamp, s.source, "
        f"s.user_id, {_CONTENT_HEAD} AS content, top.rank AS rank "
        f"FROM ({matches} ORDER BY {inner_order} LIMIT :limit OFFSET :offset) top "
        "JOIN messages m ON m.session_id = top.session_id AND m.seq = top.seq "
        "JOIN sessions s ON s.id = m.session_id "
        f"ORDER BY {outer_order}"
    )


def _run_search(
    connection: Connection,
    sql: str,
    params: dict[str, Any],
    filters: dict[str, Any],
) -> list[Any]:
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
    ) -> None:
        connection.exec_driver_sql(
            "INSERT INTO message_search (session_id, seq, document) "
            "SELECT %(sid)s, d.seq, to_tsvector(%(cfg)s::regconfig, d.body) "
            "FROM unnest(%(seqs)b::bigint[], %(bodies)b::text[]) AS d(seq, body) "
            "ON CONFLICT (session_id, seq) DO UPDATE SET document = EXCLUDED.document",
            {
                "sid": session_id,
                "cfg": self.search_config,
                "seqs": list(seqs),
                "bodies": list(documents),
            },
        )

    def reset_search_index(self, connection: Connection) -> None:
        connection.exec_driver_sql("LOCK TABLE messages IN SHARE MODE")
        connection.exec_driver_sql("TRUNCATE message_search")
        connection.exec_driver_sql("REINDEX INDEX ix_message_search_document")

    def search_messages(
        self,
        connection: Connection,
        query: Any,
        filters: dict[str, Any],
        *,
        order: str,
        limit: int,
        offset: int,
    ) -> list[Any]:
        where, params = _search_filters(filters)
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
        tsquery = " && ".join(parts)
        rank = "ts_rank(ms.document, q.query)" if order == "rank" else "0.0"
        joins = _search_joins(filters, order, "ms")
        matches = (
            f"SELECT ms.session_id AS session_id, ms.seq AS seq, {rank} AS rank "
            f"FROM (SELECT {tsquery} AS query) q "
            f"JOIN message_search ms ON ms.document @@ q.query{joins} "
            f"WHERE true{where}"
        )
        params |= {"cfg": self.search_config, "limit": limit, "offset": offset}
        return _run_search(connection, _page_of_hits(matches, order), params, filters)

    def is_search_index_error(self, exc: RepoError) -> bool:
        code = getattr(exc, "code", None)
        return code in ("XX001", "XX002") or "message_search" in str(exc)
