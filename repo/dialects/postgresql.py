"""PostgreSQL: engine setup, error translation, the append SQL and the tsvector index.

PostgreSQL through psycopg 3 (its async mode for asyncio). An append is one statement:
the batch travels as binary arrays and the lookup of stored keys, the insert and the
session's counters happen on the server. The search index is a ``tsvector`` table with
a GIN index and b-trees on the message time; a search chooses between them by measuring.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import socket
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, Final

import psycopg
import psycopg.errors
from sqlalchemy import Column, Connection, Engine, Insert, Row, Table, event, func, text
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects.postgresql.base import PGDialect
from sqlalchemy.dialects.postgresql.psycopg import dialect as psycopg_dialect
from sqlalchemy.engine import URL
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.util import await_

from sessionrepo.dialects.base import (
    NEW_SESSION_COLUMNS,
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
from sessionrepo.errors import BackendUnavailable, RepoError, WriteRejected
from sessionrepo.models.doctor import Check
from sessionrepo.models.tables import MESSAGE_COLUMNS, messages_table, sessions_table
from sessionrepo.search.query import Query, SearchFilters

#: Key of the PostgreSQL advisory lock held while migrating ("sessrepo" in ASCII).
MIGRATION_LOCK_KEY: Final = 0x7365737372657070 & 0x7FFFFFFFFFFFFFFF

#: Oldest PostgreSQL major version sessionrepo is tested on.
MIN_POSTGRES: Final = 13

#: The search index (the migrations made it so; a test checks they agree). The indexes
#: are built apart from the table: a rebuild drops them and builds them after the rows.
_SEARCH_TABLE_DDL = (
    "CREATE TABLE message_search ("
    " session_id VARCHAR(255) NOT NULL,"
    " seq BIGINT NOT NULL,"
    " ts TIMESTAMP WITH TIME ZONE NOT NULL,"
    " role VARCHAR(16) NOT NULL,"
    " document TSVECTOR NOT NULL,"
    " CONSTRAINT pk_message_search PRIMARY KEY (session_id, seq))"
)
_SEARCH_INDEX_DDL = (
    "CREATE INDEX ix_message_search_ts ON message_search (ts)",
    "CREATE INDEX ix_message_search_session_ts ON message_search (session_id, ts)",
    "CREATE INDEX ix_message_search_document ON message_search USING gin (document)",
)


def _array_type(column: Column[Any]) -> str:
    """The element type of the array a column's values travel in: its PostgreSQL type,
    any text as ``text`` (a cast to ``varchar(n)`` would cut a longer value silently)."""
    dialect = PGDialect()  # type: ignore[no-untyped-call]  # SQLAlchemy leaves it untyped
    name = column.type.compile(dialect=dialect).lower()
    if name.startswith(("varchar", "text")):
        return "text"
    return {"timestamp with time zone": "timestamptz"}.get(name, name)


#: The arrays of an append: the encoded rows' columns, then each row's tool calls.
_INPUT_COLUMNS: Final = (*MESSAGE_COLUMNS, "tool_call_total")
_INPUT_TYPES: Final = {
    **{name: _array_type(messages_table.c[name]) for name in MESSAGE_COLUMNS},
    "tool_call_total": "bigint",
}
_ARRAYS = ", ".join(f"%({name})b::{_INPUT_TYPES[name]}[]" for name in _INPUT_COLUMNS)
_INPUT_NAMES = ", ".join(f'"{name}"' for name in _INPUT_COLUMNS)
_STORED_NAMES = ", ".join(f'"{name}"' for name in MESSAGE_COLUMNS)

# The fragments both append statements are built from, so that the lookup of stored keys
# and the numbering and insert of the new rows are written once: ``input`` is the batch
# in its order (``ord``), ``existing`` its keys the session stores (with their stored
# hash), ``fresh`` the others numbered in batch order, and the insert takes ``fresh``.
_PG_INPUT = f"""input AS (
    SELECT * FROM unnest({_ARRAYS}) WITH ORDINALITY AS i({_INPUT_NAMES}, ord)
)"""
_PG_EXISTING = """existing AS (
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
)"""


def _pg_fresh(first_seq: str, held_back: str = "") -> str:
    """The ``fresh`` CTE: the rows of ``input`` whose key ``existing`` lacks, numbered in
    batch order from ``first_seq`` (an SQL expression); ``held_back`` adds conditions on
    the whole batch (each ``AND …``): when one fails, no row is fresh."""
    return f"""fresh AS (
    SELECT i.*, {first_seq} + row_number() OVER (ORDER BY i.ord) - 1 AS seq
    FROM input i
    WHERE NOT EXISTS (SELECT 1 FROM existing e
        WHERE e.client_msg_uuid = i.client_msg_uuid){held_back}
)"""


_PG_INSERT_FRESH = f"""INSERT INTO messages (session_id, seq, {_STORED_NAMES})
    SELECT %(sid)s, seq, {_STORED_NAMES}
    FROM fresh"""

_PG_INSERT_NEW = f"""
WITH {_PG_INPUT},
{_PG_EXISTING},
{_pg_fresh("%(next_seq)s::bigint")},
inserted AS (
    {_PG_INSERT_FRESH}
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


_CREATED_NAMES = ", ".join(f'"{name}"' for name in NEW_SESSION_COLUMNS)
_CREATED_VALUES = ", ".join(
    f"%(s_{name})s::{_array_type(sessions_table.c[name])}" for name in NEW_SESSION_COLUMNS
)
_PSYCOPG = psycopg_dialect()  # type: ignore[no-untyped-call]  # untyped in SQLAlchemy
#: The sessions columns' own conversions (JSON as text, times in UTC), as SQLAlchemy
#: would bind them.
_SESSION_BINDS: Final = {
    name: sessions_table.c[name].type.bind_processor(_PSYCOPG) for name in NEW_SESSION_COLUMNS
}

#: Nothing is fresh (nothing is written) while the session's messages are parked, when
#: the row the caller remembers is gone, or when a key is stored with other content and
#: the caller asked for conflicts to be refused.
_PG_DIRECT_HELD_BACK = """
        AND NOT EXISTS (SELECT 1 FROM parked)
        AND NOT EXISTS (SELECT 1 FROM lost)
        AND NOT (%(refuse_conflicts)s AND EXISTS (
            SELECT 1 FROM existing e JOIN input j USING (client_msg_uuid)
            WHERE e.content_hash <> j.content_hash
        ))"""

# The whole append as one statement that commits by itself (an implicit transaction):
# one round trip, one durable commit. The session row is locked first (``locked``:
# appenders to one session queue there; under READ COMMITTED the lock returns the row
# as the appender before us committed it) and created when missing; the new rows are
# numbered from its ``next_seq``; the counters, ``last_active_at`` and the search
# backlog move with them. The statement's snapshot is older than the lock: rows an
# appender before us committed while we waited are invisible to ``existing``. If one of
# them has a key of this batch, the insert (no ON CONFLICT) fails on the unique key and
# nothing is written; a session created meanwhile shows as the ``r`` row. Both send the
# caller to the locked path, whose probe runs after its lock.
_PG_APPEND_DIRECT = f"""
WITH {_PG_INPUT},
lost AS (
    SELECT 1 WHERE %(verify_seq)s::bigint IS NOT NULL AND NOT EXISTS (
        SELECT 1 FROM messages
        WHERE session_id = %(sid)s AND seq = %(verify_seq)s
            AND client_msg_uuid = %(verify_key)s::uuid
    )
),
parked AS (
    SELECT 1 FROM pending_outbox
    WHERE %(behind_outbox)s AND session_id = %(sid)s AND state = 'pending'
    LIMIT 1
),
locked AS (
    SELECT next_seq FROM sessions WHERE id = %(sid)s FOR UPDATE
),
{_PG_EXISTING},
{_pg_fresh("coalesce((SELECT next_seq FROM locked), 1)", _PG_DIRECT_HELD_BACK)},
created AS (
    INSERT INTO sessions ({_CREATED_NAMES},
        message_count, tool_call_count, next_seq, last_active_at)
    SELECT {_CREATED_VALUES},
        (SELECT count(*) FROM fresh),
        (SELECT coalesce(sum(tool_call_total), 0) FROM fresh),
        1 + (SELECT count(*) FROM fresh),
        %(now)s
    WHERE NOT EXISTS (SELECT 1 FROM locked) AND NOT EXISTS (SELECT 1 FROM parked)
        AND NOT EXISTS (SELECT 1 FROM lost)
    ON CONFLICT (id) DO NOTHING
    RETURNING 1
),
inserted AS (
    {_PG_INSERT_FRESH}
    WHERE EXISTS (SELECT 1 FROM locked) OR EXISTS (SELECT 1 FROM created)
    ORDER BY seq
    RETURNING seq
),
counted AS (
    UPDATE sessions SET
        next_seq = next_seq + n.inserted,
        message_count = message_count + n.inserted,
        tool_call_count = tool_call_count + n.tool_calls,
        last_active_at = %(now)s
    FROM (
        SELECT (SELECT count(*) FROM inserted) AS inserted,
            (SELECT coalesce(sum(tool_call_total), 0) FROM fresh) AS tool_calls
    ) n
    WHERE id = %(sid)s AND n.inserted > 0 AND EXISTS (SELECT 1 FROM locked)
),
queued AS (
    INSERT INTO search_backlog (session_id, first_seq, count)
    SELECT %(sid)s, min(seq), count(*) FROM inserted
    WHERE %(enqueue)s
    HAVING count(*) > 0
)
SELECT 'i', NULL::uuid, NULL::bytea, min(seq), count(*) FROM inserted HAVING count(*) > 0
UNION ALL
SELECT 'e', client_msg_uuid, content_hash, NULL, NULL FROM existing
UNION ALL
SELECT 'q', NULL, NULL, NULL, NULL FROM parked
UNION ALL
SELECT 'm', NULL, NULL, NULL, NULL FROM lost
UNION ALL
SELECT 'r', NULL, NULL, NULL, NULL
WHERE NOT EXISTS (SELECT 1 FROM locked) AND NOT EXISTS (SELECT 1 FROM created)
    AND NOT EXISTS (SELECT 1 FROM parked) AND NOT EXISTS (SELECT 1 FROM lost)
"""

_PG_LOCK_SESSION = "SELECT next_seq FROM sessions WHERE id = %(sid)s FOR UPDATE"


class PostgresDialect(BackendDialect):
    """PostgreSQL through psycopg 3: a pool whose dead connections are replaced on use,
    every session in UTC."""

    name = "postgresql"
    search_index_ddl = (_SEARCH_TABLE_DDL, *_SEARCH_INDEX_DDL)

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
        read_only = bool(options.pop("read_only", False))
        connect_timeout = options.pop("connect_timeout", 10)
        server_timeout = options.pop("server_timeout", None)
        if server_timeout is not None:
            milliseconds = max(1, int(server_timeout * 1000))
            connect_args["options"] += (
                f" -c statement_timeout={milliseconds} -c lock_timeout={milliseconds}"
            )
            seconds = max(1, math.ceil(server_timeout))
            connect_timeout = seconds if connect_timeout is None else min(connect_timeout, seconds)
        if connect_timeout is not None:
            # libpq takes whole seconds and reads 0 as "wait forever": round a fraction up.
            connect_args["connect_timeout"] = max(1, math.ceil(connect_timeout))
        # No ping before each checkout (a round trip per transaction): a dead connection
        # is detected on use and the transaction rerun (see Database._run).
        options.setdefault("pool_pre_ping", False)
        # psycopg 3 serves both: SQLAlchemy picks its async dialect for an async engine.
        engine = make_engine(url, asynchronous, connect_args=connect_args, **options)
        if read_only:
            # Every transaction is BEGIN READ ONLY: the server itself refuses any write
            # or DDL (the session's default_transaction_read_only, which doctor reports
            # as the server's, is left alone).
            @event.listens_for(engine, "connect")
            def _read_only(dbapi_connection: Any, record: Any) -> None:
                engine.dialect.set_readonly(dbapi_connection, True)  # type: ignore[attr-defined]

        return engine

    def insert_ignoring(self, table: Table, conflict_columns: Sequence[str]) -> Insert:
        return postgresql.insert(table).on_conflict_do_nothing(
            index_elements=list(conflict_columns)
        )

    def text_after(self, value: ColumnElement[Any], part: str, length: int) -> ColumnElement[str]:
        # split_part and left() work in bytes up to the cut; substr(value, strpos(...))
        # would count characters through the whole value twice.
        result: ColumnElement[str] = func.left(func.split_part(value, part, 2), length)
        return result

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
    ) -> dict[uuid.UUID, bytes]:
        # One statement, one round trip: the batch travels as binary arrays (no text
        # quoting of each element), and the lookup,
        # the insert and the counters happen on the server. Its snapshot is taken after
        # the caller locked the session row, so the lookup sees every committed row.
        params: dict[str, Any] = {name: [row[name] for row in rows] for name in _INPUT_COLUMNS}
        params |= {"sid": session_id, "next_seq": next_seq, "now": now}
        found = connection.exec_driver_sql(_PG_INSERT_NEW, params).all()
        stored = {key: digest for key, digest in found if digest is not None}
        inserted = len(found) - len(stored)
        if inserted != len(rows) - len(stored):
            raise lock_bypassed(session_id, len(rows) - len(stored) - inserted)
        return stored

    driver_error = psycopg.Error

    def append_direct(self, driver: Any, append: DirectAppend) -> DirectResult | None:
        rows = append.rows
        params: dict[str, Any] = {name: [row[name] for row in rows] for name in _INPUT_COLUMNS}
        params |= {
            f"s_{name}": value if (bind := _SESSION_BINDS[name]) is None else bind(value)
            for name in NEW_SESSION_COLUMNS
            for value in (append.new_session.get(name),)
        }
        params |= {
            "sid": append.session_id,
            "now": append.now,
            "enqueue": append.enqueue,
            "refuse_conflicts": append.refuse_conflicts,
            "behind_outbox": append.behind_outbox,
            "verify_seq": None if append.verify is None else append.verify[0],
            "verify_key": None if append.verify is None else append.verify[1],
        }
        try:
            found = _execute_alone(driver, _PG_APPEND_DIRECT, params)
        except psycopg.errors.UniqueViolation:
            return None  # a concurrent re-send committed first: the locked path decides
        stored: dict[uuid.UUID, bytes] = {}
        first_seq: int | None = None
        inserted = 0
        for kind, key, digest, seq, count in found:
            if kind == "q":
                return DirectResult(stored={}, first_seq=None, queued=True)
            if kind == "m":
                return DirectResult(stored={}, first_seq=None, lost=True)
            if kind == "r":
                return None  # the session was created meanwhile: the locked path decides
            if kind == "e":
                stored[key] = digest
            else:
                first_seq, inserted = int(seq), int(count)
        refused = append.refuse_conflicts and any(
            stored.get(row["client_msg_uuid"], row["content_hash"]) != row["content_hash"]
            for row in rows
        )
        fresh = 0 if refused else len(rows) - len(stored)
        if inserted != fresh:  # pragma: no cover - the statement inserts all or fails
            raise lock_bypassed(append.session_id, fresh - inserted)
        return DirectResult(stored=stored, first_seq=first_seq)

    def message_at(self, driver: Any, session_id: str, seq: int, key: uuid.UUID) -> bool:
        return bool(
            _execute_alone(
                driver,
                "SELECT 1 FROM messages WHERE session_id = %(sid)s AND seq = %(seq)s "
                "AND client_msg_uuid = %(key)s",
                {"sid": session_id, "seq": seq, "key": key},
            )
        )

    def load_direct(self, driver: Any, load: DirectLoad) -> list[Sequence[Any]] | None:
        sql, params = load.statement(lambda name: f"%({name})s")
        return _execute_alone(driver, sql, params)

    def sever(self, driver: Any) -> None:
        # Shut the socket down under libpq: the blocked read fails at once (a frozen
        # server cannot act on a cancel request, nor time out its own statement).
        descriptor = os.dup(driver.pgconn.socket)
        with socket.socket(fileno=descriptor) as connection:
            connection.shutdown(socket.SHUT_RDWR)

    def connection_lost(self, driver: Any) -> bool:
        return bool(driver.closed or driver.broken)

    def lock_outbox_session(self, connection: Connection, session_id: str) -> None:
        connection.execute(
            text("SELECT pg_advisory_xact_lock(hashtextextended(:key, 0))"),
            {"key": f"sessionrepo.outbox:{session_id}"},
        )

    @staticmethod
    def _sqlstate(exc: sa_exc.DBAPIError) -> str | None:
        return getattr(exc.orig, "sqlstate", None)

    #: SQLSTATE classes whose messages may quote a value or the statement (data
    #: exceptions: ``invalid input syntax for type integer: "..."``; syntax errors and
    #: access rules: ``syntax error at or near "..."``; PL/pgSQL's ``RAISE``): described
    #: by their condition and the objects named apart instead.
    _QUOTING_CLASSES: Final = ("22", "42", "P0")
    #: Of those, the conditions whose message names only objects and types (``relation
    #: "x" does not exist``, ``operator does not exist: timestamp with time zone > text``).
    #: Not an undefined column: any stray word of a statement reads as a column name.
    _NAMING_STATES: Final = ("42P01", "42P07", "42704", "42501", "42883", "42804")

    def describe(self, exc: sa_exc.DBAPIError) -> str:
        state = self._sqlstate(exc)
        if state is None:
            # Raised before a statement reached the server (connecting, adapting a
            # value): the driver's own words, which name neither the statement nor a value.
            return f"PostgreSQL: {' '.join(str(exc.orig).split())}"
        diag = getattr(exc.orig, "diag", None)
        primary = getattr(diag, "message_primary", None)
        if primary and (state[:2] not in self._QUOTING_CLASSES or state in self._NAMING_STATES):
            return f"PostgreSQL [{state}]: {primary}"
        # Never the message's other lines either: "LINE 1: <the statement>", "DETAIL:
        # Failing row contains (<the values>)".
        named = [
            f"{label} {value}"
            for label, value in (
                ("table", getattr(diag, "table_name", None)),
                ("column", getattr(diag, "column_name", None)),
                ("constraint", getattr(diag, "constraint_name", None)),
                ("type", getattr(diag, "datatype_name", None)),
            )
            if value
        ]
        return f"PostgreSQL [{state}]: {_condition(state)}" + (
            f" ({', '.join(named)})" if named else ""
        )

    def translate(self, exc: sa_exc.DBAPIError) -> RepoError:
        state = self._sqlstate(exc)
        detail = self.describe(exc)
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
                "SELECT m.session_id, m.seq, m.timestamp, coalesce(m.role, ''), "
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

    def index_entries(self, connection: Connection, entries: Sequence[IndexEntry]) -> None:
        if not entries:
            return
        sids, seqs, stamps, roles, bodies = (list(column) for column in zip(*entries, strict=True))
        connection.exec_driver_sql(
            "INSERT INTO message_search (session_id, seq, ts, role, document) "
            "SELECT d.sid, d.seq, d.ts, coalesce(d.role, ''), "
            "to_tsvector(%(cfg)s::regconfig, d.body) "
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
        for statement in _SEARCH_INDEX_DDL:
            connection.exec_driver_sql(statement)
        connection.exec_driver_sql("ANALYZE message_search")

    def forget_search_entries(
        self, connection: Connection, session_id: str, seqs: Sequence[int]
    ) -> None:
        if seqs:
            connection.exec_driver_sql(
                "DELETE FROM message_search WHERE session_id = %(sid)s AND seq = ANY(%(seqs)s)",
                {"sid": session_id, "seqs": list(seqs)},
            )

    def forget_search_documents(self, connection: Connection, session_ids: Sequence[str]) -> None:
        self._forget_backlog(connection, session_ids)
        connection.exec_driver_sql(
            "DELETE FROM message_search WHERE session_id = ANY(%(ids)s)",
            {"ids": list(session_ids)},
        )

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
        return _pg_search(
            connection,
            self.search_config,
            self.search_rows_estimate,
            query,
            filters,
            order=order,
            limit=limit,
            offset=offset,
            window=window,
        )

    def search_rows_estimate(self, connection: Connection) -> float:
        """The planner's estimate of the rows in ``message_search`` (a search's probe
        weighs the two ways to the newest matches by it)."""
        return float(
            connection.exec_driver_sql(
                "SELECT reltuples FROM pg_class WHERE oid = CAST('message_search' AS regclass)"
            ).scalar_one()
        )

    #: An object missing or not usable as a statement needs it: undefined table,
    #: column or object (a text search configuration), a privilege taken away. Not the
    #: rest of class 42 (a syntax error, an operator for other types: the statement's
    #: own fault, or a value of the wrong type), which no rebuild of an index repairs.
    _MISSING_OBJECT: Final = ("42P01", "42703", "42704", "42501")
    _DAMAGED: Final = ("XX001", "XX002")  # data_corrupted, index_corrupted

    def is_broken_object(self, exc: sa_exc.DBAPIError) -> bool:
        state = self._sqlstate(exc)
        return state in self._MISSING_OBJECT or state in self._DAMAGED

    def is_damaged(self, exc: sa_exc.DBAPIError) -> bool:
        return self._sqlstate(exc) in self._DAMAGED

    def probe_search_index(self, connection: Connection) -> None:
        connection.exec_driver_sql(
            "SELECT session_id, seq, ts, role, document FROM message_search "
            "WHERE document @@ CAST('sessionrepo' AS tsquery) LIMIT 1"
        ).all()

    def server_version(self, connection: Connection) -> str:
        return str(connection.exec_driver_sql("SHOW server_version").scalar()).split()[0]

    def settings(self, connection: Connection) -> dict[str, str]:
        settings = {
            name: str(connection.exec_driver_sql(f"SHOW {name}").scalar())
            for name in (
                "server_version_num",
                "synchronous_commit",
                "fsync",
                "full_page_writes",
                "TimeZone",
                "default_transaction_read_only",
            )
        }
        settings["in_recovery"] = str(
            connection.execute(text("SELECT pg_is_in_recovery()")).scalar()
        )
        return settings

    def judge_settings(self, settings: dict[str, str]) -> list[Check]:
        """Judge PostgreSQL settings as a sessionrepo session sees them."""
        checks = []
        major = int(settings["server_version_num"]) // 10_000
        checks.append(
            Check(name="server_version", status="ok", detail=str(major))
            if major >= MIN_POSTGRES
            else Check(
                name="server_version",
                status="warn",
                detail=f"{major}: older than {MIN_POSTGRES}, untested",
                fix=f"upgrade PostgreSQL to {MIN_POSTGRES} or later",
            )
        )
        commit = settings["synchronous_commit"]
        checks.append(
            Check(name="synchronous_commit", status="ok", detail=commit)
            if commit != "off"
            else Check(
                name="synchronous_commit",
                status="fail",
                detail="off: a server crash loses commits already acknowledged to gateways",
                fix="set synchronous_commit = on (ALTER SYSTEM, or reset it for the "
                "database / role the gateways use)",
            )
        )
        checks.append(
            Check(name="fsync", status="ok", detail="on")
            if settings["fsync"] == "on"
            else Check(
                name="fsync",
                status="fail",
                detail="off: a crash can lose or corrupt committed data",
                fix="set fsync = on in postgresql.conf",
            )
        )
        checks.append(
            Check(name="full_page_writes", status="ok", detail="on")
            if settings["full_page_writes"] == "on"
            else Check(
                name="full_page_writes",
                status="warn",
                detail="off: a crash during a page write can corrupt it",
                fix="set full_page_writes = on unless the file system rules torn pages out",
            )
        )
        zone = settings["TimeZone"]
        checks.append(
            Check(name="timezone", status="ok", detail=zone)
            if zone.upper() in ("UTC", "ETC/UTC")
            else Check(
                name="timezone",
                status="warn",
                detail=f"{zone}: sessionrepo asks for UTC at connect (a pooler may drop that)",
                fix="let connection options through the pooler, or set the role's timezone to UTC",
            )
        )
        read_only = (
            settings["in_recovery"] == "True" or settings["default_transaction_read_only"] == "on"
        )
        checks.append(
            Check(name="writable", status="ok", detail="read-write")
            if not read_only
            else Check(
                name="writable",
                status="fail",
                detail="read-only (a standby, or default_transaction_read_only = on)",
                fix="point --url at the primary server",
            )
        )
        return checks


#: Rows of the newest end of ``message_search`` read to measure how common a query is.
_PG_PROBE_ROWS: Final = 500


def _pg_search(
    connection: Connection,
    config: str,
    rows_estimate: Callable[[Connection], float],
    query: Query,
    filters: SearchFilters,
    *,
    order: SearchOrder,
    limit: int,
    offset: int,
    window: int,
) -> list[Row[Any]]:
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
    for name, value, clause, kind in (
        ("since", filters.since, "ms.ts >= :f_since", time_clauses),
        ("until", filters.until, "ms.ts < :f_until", time_clauses),
        ("session_id", filters.session_id, "ms.session_id = :f_session_id", clauses),
        ("role", filters.role, "ms.role = :f_role", clauses),
        ("source", filters.source, "s.source = :f_source", clauses),
        ("user_id", filters.user_id, "s.user_id = :f_user_id", clauses),
    ):
        if value is not None:
            kind.append(clause)
            params[f"f_{name}"] = value
    joins = ""
    if filters.source is not None or filters.user_id is not None:
        joins = " JOIN sessions s ON s.id = ms.session_id"
    need = window if order == "rank" else offset + limit
    settings = ["jit = off", "max_parallel_workers_per_gather = 0", "enable_seqscan = off"]
    connection.exec_driver_sql("; ".join(f"SET LOCAL {setting}" for setting in settings))
    # The probe: the newest rows (of the session, with a session filter), how many match
    # the query with every filter, how many the query alone.
    scope = "".join(f" AND {clause}" for clause in time_clauses)
    if filters.session_id is not None:
        scope += " AND ms.session_id = :f_session_id"
    probe = (
        f"SELECT count(*) FILTER (WHERE ms.document @@ {tsquery}"
        + "".join(f" AND {clause}" for clause in clauses)
        + f"), count(*) FILTER (WHERE ms.document @@ {tsquery}), count(*) "
        "FROM (SELECT ms.session_id, ms.role, ms.document FROM message_search ms "
        f"WHERE true{scope} ORDER BY ms.ts DESC LIMIT :probe) ms{joins}"
    )
    probe_params = params | {"probe": _PG_PROBE_ROWS}
    hits, term_hits, scanned = connection.execute(
        bind_times(text(probe), probe_params), probe_params
    ).one()
    density = hits / scanned if scanned else 0.0
    if not hits and term_hits and (filters.source or filters.user_id):
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
    elif filters.session_id is not None:
        walk = True  # a walk reads the session's rows at most; the GIN way, every match
    else:
        # Rows the walk tests (each one's document read and matched), against the
        # matches of the query the GIN way reads: their time only (a third of the work)
        # unless the index cannot decide alone (a phrase, an exclusion: every candidate
        # document is read again).
        recheck = any(len(term.words) > 1 or term.excluded for term in query.terms)
        walk_rows = need / density * (1 if recheck else 3)
        total = rows_estimate(connection)
        walk = walk_rows <= term_hits / scanned * max(total, float(scanned))
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
    return run_search(connection, page_of_hits(matches, outer), params)


def _execute_alone(driver: Any, statement: str, params: dict[str, Any]) -> list[Any]:
    """Run one statement in autocommit on a psycopg connection (sync, or async from the
    greenlet of sessionrepo's async API): one round trip, a prepared statement (planned
    once per connection), its own implicit transaction."""
    if isinstance(driver, psycopg.AsyncConnection):
        await_(driver.set_autocommit(True))
        try:
            cursor = await_(driver.execute(statement, params, prepare=True))
            return list(await_(cursor.fetchall()))
        finally:
            with contextlib.suppress(psycopg.Error):  # a broken connection is discarded
                await_(driver.set_autocommit(False))
    driver.autocommit = True
    try:
        return list(driver.execute(statement, params, prepare=True).fetchall())
    finally:
        with contextlib.suppress(psycopg.Error):
            driver.autocommit = False


def _condition(state: str) -> str:
    """The condition a SQLSTATE names, in words (``42P01``: "undefined table")."""
    try:
        name = psycopg.errors.lookup(state).__name__
    except KeyError:
        return "error"
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", name).lower()
