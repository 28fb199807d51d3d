"""PostgreSQL's append: one statement, the batch as binary arrays, the lookup of stored
keys, the insert and the session's counters on the server; the direct path commits by
itself (an implicit transaction: one round trip, one durable commit)."""

from __future__ import annotations

import contextlib
import re
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Final

import psycopg
import psycopg.errors
from psycopg.types.array import ListBinaryDumper
from sqlalchemy import Column, Connection
from sqlalchemy.dialects.postgresql.base import PGDialect
from sqlalchemy.dialects.postgresql.psycopg import dialect as psycopg_dialect
from sqlalchemy.util import await_

from sessionrepo.dialects.base import (
    NEW_SESSION_COLUMNS,
    AppendRole,
    DirectAppend,
    DirectLoad,
    DirectResult,
    lock_bypassed,
)
from sessionrepo.dialects.postgresql.tenancy import TENANT_COLUMN
from sessionrepo.models.outbox_protocol import parked_rows_sql
from sessionrepo.models.tables import (
    ACTIVITY_GRANULARITY,
    MESSAGE_COLUMNS,
    messages_table,
    sessions_table,
)
from sessionrepo.models.usage import (
    ROLLUP_KEY,
    ROLLUP_MESSAGES_ZEROS,
    ROLLUP_NO_MODEL,
    rollup_messages,
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


#: The rollup's upsert, its key with the row's tenant (see ``tenancy``).
_ROLLUP = rollup_messages((*ROLLUP_KEY, TENANT_COLUMN))


#: A message's UTC day, as the rollup keeps it.
_PG_DAY = """to_char(timezone('UTC', {}."timestamp"), 'YYYY-MM-DD')"""


def _pg_rolled(held: str) -> str:
    """The CTEs that count the inserted rows (``inserted`` returns each one's time) per
    UTC day: ``days``; ``opened``, the session's open day after this append (the newest
    of its open day before, ``rollup_day`` of the CTE ``held``, and the new rows' days),
    whose count the session row keeps (see ``counted``); and ``rolled``, the upsert into
    the rollup of the other days' new rows and, when a later day opens, of the count
    the row kept for the day before. Off the common path (a message of the session's
    open day), ``rolled`` inserts nothing. From ``inserted`` alone: a join back to
    ``fresh`` (estimated at a hundred rows, planned as a nested loop) cost 25 ms at
    1,000 messages."""
    return f"""days AS (
    SELECT {_PG_DAY.format("i")} AS day, count(*) AS n FROM inserted i GROUP BY 1
),
opened AS (
    SELECT greatest((SELECT rollup_day FROM {held}), (SELECT max(day) FROM days)) AS day
),
rolled AS (
    {_ROLLUP[0]}
    SELECT %(sid)s, r.day, '{ROLLUP_NO_MODEL}', sum(r.n), {ROLLUP_MESSAGES_ZEROS}
    FROM (
        SELECT d.day, d.n FROM days d, opened o WHERE d.day <> o.day
        UNION ALL
        SELECT h.rollup_day, h.rollup_messages FROM {held} h, opened o
        WHERE h.rollup_day <> o.day AND h.rollup_messages > 0
            AND EXISTS (SELECT 1 FROM inserted)
    ) r
    GROUP BY r.day
    {_ROLLUP[1]}
)"""


#: The session row's open day and its count after the append (``opened``, ``days``): in
#: an UPDATE's SET list, where a column names the row's old value.
_PG_OPEN_DAY = """rollup_day = o.day,
        rollup_messages = CASE WHEN rollup_day = o.day THEN rollup_messages ELSE 0 END
            + coalesce((SELECT n FROM days WHERE day = o.day), 0)"""


_PG_INSERT_FRESH = f"""INSERT INTO messages (session_id, seq, {_STORED_NAMES})
    SELECT %(sid)s, seq, {_STORED_NAMES}
    FROM fresh"""

#: The session's activity after an append at ``now``: within the granularity after
#: ``last_active_at``, only the lag (in no index) changes and ``last_active_at`` keeps its
#: value, so the row's update touches no index and can be heap-only (HOT); further (or a
#: clock behind it), ``last_active_at`` moves to ``now``. (In a SET list, a column names
#: the row's old value.)
PG_ACTIVITY = """last_active_at = CASE
            WHEN %(now)s - last_active_at BETWEEN interval '0' AND %(granularity)s
            THEN last_active_at ELSE %(now)s END,
        last_active_lag_us = CASE
            WHEN %(now)s - last_active_at BETWEEN interval '0' AND %(granularity)s
            THEN (extract(epoch FROM %(now)s - last_active_at) * 1000000)::bigint
            ELSE 0 END"""

_PG_INSERT_NEW = f"""
WITH {_PG_INPUT},
held AS (  -- the caller holds the row's lock: this snapshot is its latest version
    SELECT rollup_day, rollup_messages FROM sessions WHERE id = %(sid)s
),
{_PG_EXISTING},
{_pg_fresh("%(next_seq)s::bigint")},
inserted AS (
    {_PG_INSERT_FRESH}
    ORDER BY seq
    ON CONFLICT (session_id, client_msg_uuid, tenant) DO NOTHING
    RETURNING client_msg_uuid, "timestamp"
),
{_pg_rolled("held")},
counted AS (
    UPDATE sessions SET
        next_seq = next_seq + (SELECT count(*) FROM inserted),
        message_count = message_count + (SELECT count(*) FROM inserted),
        tool_call_count = tool_call_count + (
            SELECT coalesce(sum(f.tool_call_total), 0)
            FROM fresh f JOIN inserted USING (client_msg_uuid)
        ),
        {PG_ACTIVITY},
        {_PG_OPEN_DAY}
    FROM opened o
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
        AND NOT EXISTS (SELECT 1 FROM erased)
        AND NOT (%(refuse_conflicts)s AND EXISTS (
            SELECT 1 FROM existing e JOIN input j USING (client_msg_uuid)
            WHERE e.content_hash <> j.content_hash
        ))"""

#: The session's parked rows, when the writer parks in this database (the protocol's).
_PG_PARKED = parked_rows_sql("%(sid)s", also="%(behind_outbox)s")

# The whole append as one statement that commits by itself (an implicit transaction):
# one round trip, one durable commit. The session row is locked first (``locked``:
# appenders to one session queue there; under READ COMMITTED the lock returns the row
# as the appender before us committed it) and created when missing; the new rows are
# numbered from its ``next_seq``; the counters, ``last_active_at`` and the search
# backlog move with them. The statement's snapshot is older than the lock: rows an
# appender before us committed while we waited are invisible to ``existing``. If one of
# them has a key of this batch, the insert (no ON CONFLICT) fails on the unique key and
# nothing is written; a session created meanwhile shows as the ``r`` row. Both send the
# caller to the locked path, whose probe runs after its lock. So does a session deleted
# while we waited (``visible`` but not ``locked``: an erasure, which commits its
# tombstone with the deletion, where this statement's snapshot cannot see it); a
# tombstone the snapshot does see (``erased``) writes nothing and answers ``x``.
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
    {_PG_PARKED}
),
erased AS (
    SELECT 1 FROM erased_sessions
    WHERE %(erased_probe)s::bytea IS NOT NULL AND session_hash = %(erased_probe)s::bytea
),
visible AS (
    SELECT 1 FROM sessions WHERE id = %(sid)s
),
locked AS (
    SELECT next_seq, rollup_day, rollup_messages FROM sessions WHERE id = %(sid)s FOR UPDATE
),
{_PG_EXISTING},
{_pg_fresh("coalesce((SELECT next_seq FROM locked), 1)", _PG_DIRECT_HELD_BACK)},
created AS (
    INSERT INTO sessions ({_CREATED_NAMES},
        message_count, tool_call_count, next_seq, last_active_at, rollup_day, rollup_messages)
    SELECT {_CREATED_VALUES},
        (SELECT count(*) FROM fresh),
        (SELECT coalesce(sum(tool_call_total), 0) FROM fresh),
        1 + (SELECT count(*) FROM fresh),
        %(now)s,
        f.day, coalesce(f.n, 0)
    FROM (SELECT) one LEFT JOIN (
        -- Its open day: the newest of its messages' (the others go to the rollup).
        SELECT day, count(*) AS n FROM (SELECT {_PG_DAY.format("fresh")} AS day FROM fresh) d
        GROUP BY day ORDER BY day DESC LIMIT 1
    ) f ON true
    WHERE NOT EXISTS (SELECT 1 FROM visible) AND NOT EXISTS (SELECT 1 FROM parked)
        AND NOT EXISTS (SELECT 1 FROM lost) AND NOT EXISTS (SELECT 1 FROM erased)
    ON CONFLICT (id, tenant) DO NOTHING
    RETURNING 1
),
inserted AS (
    {_PG_INSERT_FRESH}
    WHERE EXISTS (SELECT 1 FROM locked) OR EXISTS (SELECT 1 FROM created)
    ORDER BY seq
    RETURNING seq, "timestamp"
),
{_pg_rolled("locked")},
counted AS (
    UPDATE sessions SET
        next_seq = next_seq + n.inserted,
        message_count = message_count + n.inserted,
        tool_call_count = tool_call_count + n.tool_calls,
        {PG_ACTIVITY},
        {_PG_OPEN_DAY}
    FROM (
        SELECT (SELECT count(*) FROM inserted) AS inserted,
            (SELECT coalesce(sum(tool_call_total), 0) FROM fresh) AS tool_calls
    ) n, opened o
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
SELECT 'x', NULL, NULL, NULL, NULL FROM erased
UNION ALL
SELECT 'r', NULL, NULL, NULL, NULL
WHERE NOT EXISTS (SELECT 1 FROM locked) AND NOT EXISTS (SELECT 1 FROM created)
    AND NOT EXISTS (SELECT 1 FROM parked) AND NOT EXISTS (SELECT 1 FROM lost)
    AND NOT EXISTS (SELECT 1 FROM erased)
"""

_PG_LOCK_SESSION = "SELECT next_seq FROM sessions WHERE id = %(sid)s FOR UPDATE"


class PostgresAppend(AppendRole):
    """The append's statements, on SQLAlchemy's connection or psycopg's."""

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
        params |= {
            "sid": session_id,
            "next_seq": next_seq,
            "now": now,
            "granularity": ACTIVITY_GRANULARITY,
        }
        found = connection.exec_driver_sql(_PG_INSERT_NEW, params).all()
        stored = {key: digest for key, digest in found if digest is not None}
        inserted = len(found) - len(stored)
        if inserted != len(rows) - len(stored):
            raise lock_bypassed(session_id, len(rows) - len(stored) - inserted)
        return stored

    driver_error = psycopg.Error

    def append_direct(self, driver: Any, append: DirectAppend) -> DirectResult | None:
        rows = append.rows
        params = direct_parameters(append, NEW_SESSION_COLUMNS)
        params["erased_probe"] = append.erased_probe
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
            if kind == "x":
                return DirectResult(stored={}, first_seq=None, erased=True)
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

    def select_direct(
        self, driver: Any, sql: str, params: Mapping[str, Any]
    ) -> list[Sequence[Any]] | None:
        return _execute_alone(driver, _pyformat(sql), dict(params), prepare=None, binary=True)


#: SQL text with ``:name`` parameters, as psycopg's ``%(name)s`` (a ``%`` doubled).
_PYFORMAT: Final[dict[str, str]] = {}
_NAMED = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")


def _pyformat(sql: str) -> str:
    converted = _PYFORMAT.get(sql)
    if converted is None:
        converted = _NAMED.sub(r"%(\1)s", sql.replace("%", "%%"))
        if len(_PYFORMAT) < 256:  # the statements of this package: a few fixed texts
            _PYFORMAT[sql] = converted
    return converted


#: The statements as the server takes them: ``%(name)s`` / ``%(name)b`` as ``$1, $2, …``
#: (a name used twice is one parameter), with the parameters' names in that order.
_POSITIONAL: Final[dict[str, tuple[str, tuple[str, ...]]]] = {}
_PLACEHOLDER = re.compile(r"%\((\w+)\)[sb]|%%")


def _positional(statement: str) -> tuple[str, tuple[str, ...]]:
    """``statement`` (psycopg's ``%(name)s`` form) in the server's ``$n`` form, once.

    psycopg parses a query's placeholders at every execution of a text longer than
    4,096 bytes (it caches only shorter ones); the one-call append is about 7,000, and
    the parse cost about 0.2 ms of Python a call, as much as the server's execution.
    A raw cursor sends the text as it is.
    """
    converted = _POSITIONAL.get(statement)
    if converted is None:
        names: list[str] = []

        def number(match: re.Match[str]) -> str:
            name = match.group(1)
            if name is None:
                return "%"  # an escaped percent sign
            if name not in names:
                names.append(name)
            return f"${names.index(name) + 1}"

        converted = (_PLACEHOLDER.sub(number, statement), tuple(names))
        if len(_POSITIONAL) < 256:  # the statements of this package: a few fixed texts
            _POSITIONAL[statement] = converted
    return converted


def _execute_alone(
    driver: Any,
    statement: str,
    params: dict[str, Any],
    *,
    prepare: bool | None = True,
    binary: bool = False,
) -> list[Any]:
    """Run one statement in autocommit on a psycopg connection (sync, or async from the
    greenlet of sessionrepo's async API): one round trip, its own implicit transaction;
    a prepared statement (planned once per connection), or with ``prepare=None`` one
    once it has run a few times (a statement whose text varies is never prepared);
    ``binary``: the results in binary (a ``bytea`` in half the bytes, parsed faster).
    The statement goes as its :func:`_positional` form, through a raw cursor."""
    sql, names = _positional(statement)
    values = [params[name] for name in names]
    if isinstance(driver, psycopg.AsyncConnection):
        await_(driver.set_autocommit(True))
        try:
            cursor = psycopg.AsyncRawCursor(driver)
            cursor.adapters.register_dumper(list, ListBinaryDumper)
            await_(cursor.execute(sql, values, prepare=prepare, binary=binary))
            return list(await_(cursor.fetchall()))
        finally:
            with contextlib.suppress(psycopg.Error):  # a broken connection is discarded
                await_(driver.set_autocommit(False))
    driver.autocommit = True
    try:
        cursor_ = psycopg.RawCursor(driver)
        cursor_.adapters.register_dumper(list, ListBinaryDumper)
        return list(cursor_.execute(sql, values, prepare=prepare, binary=binary).fetchall())
    finally:
        with contextlib.suppress(psycopg.Error):
            driver.autocommit = False


def direct_parameters(append: DirectAppend, session_columns: Sequence[str]) -> dict[str, Any]:
    """The parameters of a one-call append (this dialect's statement, Citus's function):
    the rows as one array per column, the new session's ``session_columns`` (``s_`` and
    the name) bound as SQLAlchemy would, and the append's options."""
    params: dict[str, Any] = {name: [row[name] for row in append.rows] for name in _INPUT_COLUMNS}
    params |= {
        f"s_{name}": value if (bind := _SESSION_BINDS[name]) is None else bind(value)
        for name in session_columns
        for value in (append.new_session.get(name),)
    }
    params |= {
        "sid": append.session_id,
        "now": append.now,
        "granularity": ACTIVITY_GRANULARITY,
        "enqueue": append.enqueue,
        "refuse_conflicts": append.refuse_conflicts,
        "behind_outbox": append.behind_outbox,
        "verify_seq": None if append.verify is None else append.verify[0],
        "verify_key": None if append.verify is None else append.verify[1],
    }
    return params
