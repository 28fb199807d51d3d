"""The append on Citus: one call of ``sessionrepo_append`` (migrations 0014, 0016, 0022,
0023, and 0024, which lets its statements keep their plans between calls), a PL/pgSQL
function distributed by its session id argument and co-located with ``sessions``, so the
coordinator delegates the call whole to the worker holding the session's shard group: one
round trip to one worker, committed there in one phase. Its common append (a session
that exists, new messages of its open day) takes the session's lock by updating its row,
then inserts; what must write nothing, or meets a stored key,
is rolled back inside the call and done the longer way (migration 0023 says how). It
screens erasures as PostgreSQL's statement does: after the session's lock it looks the
session's tombstone hash up in ``erased_sessions``, a reference table the worker holds
whole (``Capabilities.screens_erasure``, as PostgreSQL's). The locked path (each of its
statements one Citus routes to the session's shard: a filter or a ``VALUES`` row naming
one session id) stays for when the caller's transaction does more, and as the fallback.

What PostgreSQL's append does in one statement (a data-modifying CTE fed by ``unnest``)
Citus cannot route: it plans ``INSERT … SELECT`` and CTEs as subplans run through the
coordinator, sends their intermediate results to every worker and commits on all of them
with two-phase commit (and its router planner takes no ``INSERT`` in a CTE at all). The
function does the same work as statements local to the worker, each one Citus plans on
its fast path (one table, the session id); the locked path does it as routed statements
(the lookup of stored keys, ``INSERT … VALUES``, the session's open day, its counters).
Both keep the open day's message count on the session row, as PostgreSQL's append does
(``sessionrepo.store.rollup``): an append of the session's newest UTC day writes no
rollup row.
"""

from __future__ import annotations

import contextlib
import functools
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Final

import psycopg
import psycopg.errors
from sqlalchemy import Column, Connection
from sqlalchemy.dialects.postgresql.base import PGDialect
from sqlalchemy.util import await_

from sessionrepo.dialects.base import (
    NEW_SESSION_COLUMNS,
    DirectAppend,
    DirectResult,
    lock_bypassed,
)
from sessionrepo.dialects.postgresql.append import PG_ACTIVITY, PostgresAppend, direct_parameters
from sessionrepo.dialects.postgresql.tenancy import TENANT_COLUMN
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

#: Rows per ``INSERT … VALUES`` statement (PostgreSQL takes at most 65,535 parameters).
_ROWS_PER_INSERT: Final = 1000

_STORED_NAMES = ", ".join(f'"{name}"' for name in MESSAGE_COLUMNS)

# ``= ANY(array)`` with the session id: one shard, one index probe per key.
_CITUS_STORED_KEYS: Final = (
    "SELECT client_msg_uuid, content_hash FROM messages "
    "WHERE session_id = %(sid)s AND client_msg_uuid = ANY(%(keys)s::uuid[])"
)

# The activity as PostgreSQL's append writes it (``last_active_at`` within the granularity
# left alone, the lag in no index), so the row's update stays heap-only here too; and the
# session's open day (``rollup_day``) with its count, as migration 0020 keeps them: added
# to on the same day, started anew on a later one.
_CITUS_COUNT: Final = (
    "UPDATE sessions SET next_seq = next_seq + %(n)s, message_count = message_count + %(n)s, "
    f"tool_call_count = tool_call_count + %(tools)s, {PG_ACTIVITY}, "
    "rollup_messages = CASE WHEN rollup_day = %(day)s THEN rollup_messages ELSE 0 END "
    "+ %(counted)s, rollup_day = %(day)s "
    "WHERE id = %(sid)s"
)
#: The session's open day and its count (the caller holds the row's lock).
_CITUS_HELD: Final = "SELECT rollup_day, rollup_messages FROM sessions WHERE id = %(sid)s"


def _array_type(column: Column[Any]) -> str:
    """The type a column's values travel in: its PostgreSQL type, any text as ``text``
    (as PostgreSQL's append sends them: the insert refuses a value too long for a
    ``varchar(n)`` column rather than cutting it)."""
    dialect = PGDialect()  # type: ignore[no-untyped-call]  # SQLAlchemy leaves it untyped
    name = column.type.compile(dialect=dialect).lower()
    if name.startswith(("varchar", "text")):
        return "text"
    return {"timestamp with time zone": "timestamptz"}.get(name, name)


#: The function migration 0014 makes (0016 its signature, 0023 its body now), and its
#: arguments in order: the session id, one array per message column and the rows' tool
#: calls, a new session's columns (but its id), then the append's options (the last, the
#: session's tombstone hash). ``tests/citus`` checks them against the function the
#: migrations made.
APPEND_FUNCTION: Final = "sessionrepo_append"
_ARRAY_COLUMNS: Final = (*MESSAGE_COLUMNS, "tool_call_total")
_ARRAY_TYPES: Final = {
    **{name: _array_type(messages_table.c[name]) for name in MESSAGE_COLUMNS},
    "tool_call_total": "bigint",
}
_SESSION_COLUMNS: Final = tuple(name for name in NEW_SESSION_COLUMNS if name != "id")
_OPTIONS: Final = (
    ("now", "timestamptz"),
    ("granularity", "interval"),
    ("enqueue", "boolean"),
    ("refuse_conflicts", "boolean"),
    ("behind_outbox", "boolean"),
    ("verify_seq", "bigint"),
    ("verify_key", "uuid"),
    ("erased_probe", "bytea"),
)
#: ``(argument name, type)`` of the function, in order, as the dialect calls it.
APPEND_ARGUMENTS: Final = (
    ("p_session_id", "character varying"),
    *((f"p_{name}", f"{_ARRAY_TYPES[name]}[]") for name in _ARRAY_COLUMNS),
    *((f"p_s_{name}", _array_type(sessions_table.c[name])) for name in _SESSION_COLUMNS),
    *((f"p_{name}", kind) for name, kind in _OPTIONS),
)
# Alone in its statement, no FROM: what Citus delegates. The session id untyped (its
# type is the argument's), the arrays binary, the rest cast to the argument's type.
_CALL: Final = (
    f"SELECT {APPEND_FUNCTION}(%(sid)s, "
    + ", ".join(
        [
            *(f"%({name})b::{_ARRAY_TYPES[name]}[]" for name in _ARRAY_COLUMNS),
            *(f"%(s_{name})s::{_array_type(sessions_table.c[name])}" for name in _SESSION_COLUMNS),
            *(f"%({name})s::{kind}" for name, kind in _OPTIONS),
        ]
    )
    + ")"
)


@functools.lru_cache(maxsize=64)
def _insert_values(rows: int) -> str:
    """``INSERT … VALUES`` of ``rows`` rows of one session (the same text for the same
    count, so psycopg prepares it once per connection); ``ON CONFLICT DO NOTHING`` makes a
    key that appeared under the lock (never, while appenders take it) a count mismatch
    rather than an aborted transaction."""
    values = ", ".join(
        "(%(sid)s, "
        + ", ".join(f"%(r{index}_{column})s" for column in ("seq", *MESSAGE_COLUMNS))
        + ")"
        for index in range(rows)
    )
    return (
        f"INSERT INTO messages (session_id, seq, {_STORED_NAMES}) VALUES {values} "
        "ON CONFLICT (session_id, client_msg_uuid, tenant) DO NOTHING"
    )


#: What the function answers when it wrote nothing, and the result's field that says so:
#: parked messages, the remembered row gone, the session erased.
_UNWRITTEN: Final = {"q": "queued", "m": "lost", "x": "erased"}

#: The new messages of one UTC day added to the session's rollup (``INSERT … VALUES``
#: with the session id: routed to its shard).
_ROLLUP = rollup_messages((*ROLLUP_KEY, TENANT_COLUMN))
_CITUS_ROLLUP: Final = (
    f"{_ROLLUP[0]}VALUES (%(sid)s, %(day)s, '{ROLLUP_NO_MODEL}', %(n)s, "
    f"{ROLLUP_MESSAGES_ZEROS}){_ROLLUP[1]}"
)


def _open_day(held: str | None, count: int, days: Counter[str]) -> tuple[str, dict[str, int]]:
    """The session's open day after an append of new messages on ``days`` (a count per
    UTC day) to a session whose open day is ``held`` with ``count`` messages: the newest
    of them all. Returns it and what the rollup gets instead: the new messages of the
    other days, and the count the row kept when a later day opens."""
    newest = max(days)
    day = held if held is not None and held >= newest else newest
    elsewhere = {other: n for other, n in days.items() if other != day}
    if held is not None and held != day and count > 0:
        elsewhere[held] = elsewhere.get(held, 0) + count
    return day, elsewhere


class CitusAppend(PostgresAppend):
    """The direct path, one delegated call; the locked path, as routed statements."""

    def insert_new_messages(
        self,
        connection: Connection,
        session_id: str,
        next_seq: int,
        rows: Sequence[dict[str, Any]],
        now: datetime,
    ) -> dict[uuid.UUID, bytes]:
        stored: dict[uuid.UUID, bytes] = {
            key: bytes(digest)
            for key, digest in connection.exec_driver_sql(
                _CITUS_STORED_KEYS,
                {"sid": session_id, "keys": [row["client_msg_uuid"] for row in rows]},
            )
        }
        fresh = [row for row in rows if row["client_msg_uuid"] not in stored]
        if not fresh:
            return stored
        inserted = 0
        for start in range(0, len(fresh), _ROWS_PER_INSERT):
            chunk = fresh[start : start + _ROWS_PER_INSERT]
            params: dict[str, Any] = {"sid": session_id}
            for index, row in enumerate(chunk):
                params[f"r{index}_seq"] = next_seq + start + index
                params |= {f"r{index}_{column}": row[column] for column in MESSAGE_COLUMNS}
            inserted += connection.exec_driver_sql(_insert_values(len(chunk)), params).rowcount
        if inserted != len(fresh):
            raise lock_bypassed(session_id, len(fresh) - inserted)
        days = Counter(row["timestamp"].astimezone(UTC).date().isoformat() for row in fresh)
        held = connection.exec_driver_sql(_CITUS_HELD, {"sid": session_id}).one()
        day, elsewhere = _open_day(held[0], int(held[1]), days)
        for other, count in elsewhere.items():  # routed: the session's shard
            connection.exec_driver_sql(_CITUS_ROLLUP, {"sid": session_id, "day": other, "n": count})
        connection.exec_driver_sql(
            _CITUS_COUNT,
            {
                "sid": session_id,
                "n": len(fresh),
                "tools": sum(int(row["tool_call_total"] or 0) for row in fresh),
                "now": now,
                "granularity": ACTIVITY_GRANULARITY,
                "day": day,
                "counted": days.get(day, 0),
            },
        )
        return stored

    #: Whether the schema has the function with the signature called (one an operator
    #: dropped, or an older revision's, has not: the locked path then does every append).
    has_append_function = True

    def append_direct(self, driver: Any, append: DirectAppend) -> DirectResult | None:
        if not self.has_append_function:
            return None
        rows = append.rows
        params = direct_parameters(append, _SESSION_COLUMNS)
        params["erased_probe"] = append.erased_probe
        try:
            ((kind, keys, hashes, first_seq, inserted),) = _call_alone(driver, _CALL, params)
        except psycopg.errors.UndefinedFunction:
            self.has_append_function = False  # dropped, or not 0016's
            return None
        except psycopg.errors.UniqueViolation:  # pragma: no cover - only past the lock
            return None
        unwritten = _UNWRITTEN.get(kind)
        if unwritten is not None:
            return DirectResult(stored={}, first_seq=None, **{unwritten: True})
        stored: dict[uuid.UUID, bytes] = dict(zip(keys or (), hashes or (), strict=True))
        refused = append.refuse_conflicts and any(
            stored.get(row["client_msg_uuid"], row["content_hash"]) != row["content_hash"]
            for row in rows
        )
        fresh = 0 if refused else len(rows) - len(stored)
        if inserted != fresh:  # pragma: no cover - the function inserts all or fails
            raise lock_bypassed(append.session_id, fresh - inserted)
        return DirectResult(stored=stored, first_seq=first_seq)

    def select_direct(
        self, driver: Any, sql: str, params: Mapping[str, Any]
    ) -> list[Sequence[Any]] | None:
        # Through SQLAlchemy: a caller's statement may join a reference table with
        # distributed ones in a way Citus does not plan (the caller has another way).
        return None


def _call_alone(driver: Any, statement: str, params: dict[str, Any]) -> list[Any]:
    """Run one statement in autocommit on a psycopg connection (sync, or async from the
    greenlet of sessionrepo's async API), its result in binary: a call's record comes
    back with its fields typed (``uuid[]`` as a list of UUIDs), not as one text."""
    if isinstance(driver, psycopg.AsyncConnection):
        await_(driver.set_autocommit(True))
        try:
            cursor = await_(driver.execute(statement, params, prepare=True, binary=True))
            return [row[0] for row in await_(cursor.fetchall())]
        finally:
            with contextlib.suppress(psycopg.Error):  # a broken connection is discarded
                await_(driver.set_autocommit(False))
    driver.autocommit = True
    try:
        return [row[0] for row in driver.execute(statement, params, prepare=True, binary=True)]
    finally:
        with contextlib.suppress(psycopg.Error):
            driver.autocommit = False
