"""The append on Citus: the locked path, each of its statements one that Citus routes to
the session's shard whole (a filter or a ``VALUES`` row naming one session id), so an
append contacts one worker and commits there in one phase.

What PostgreSQL's append does in one statement (a data-modifying CTE fed by ``unnest``)
Citus cannot route: it plans ``INSERT … SELECT`` and CTEs as subplans run through the
coordinator, sends their intermediate results to every worker and commits on all of them
with two-phase commit. Here the lookup of stored keys, the insert of the new rows
(``INSERT … VALUES``) and the session's counters are three routed statements instead.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Final

from sqlalchemy import Connection

from sessionrepo.dialects.base import DirectAppend, DirectLoad, DirectResult, lock_bypassed
from sessionrepo.dialects.postgresql.append import PG_ACTIVITY, PostgresAppend
from sessionrepo.models.tables import ACTIVITY_GRANULARITY, MESSAGE_COLUMNS

#: Rows per ``INSERT … VALUES`` statement (PostgreSQL takes at most 65,535 parameters).
_ROWS_PER_INSERT: Final = 1000

_STORED_NAMES = ", ".join(f'"{name}"' for name in MESSAGE_COLUMNS)

# ``= ANY(array)`` with the session id: one shard, one index probe per key.
_CITUS_STORED_KEYS: Final = (
    "SELECT client_msg_uuid, content_hash FROM messages "
    "WHERE session_id = %(sid)s AND client_msg_uuid = ANY(%(keys)s::uuid[])"
)

# The activity as PostgreSQL's append writes it (``last_active_at`` within the granularity
# left alone, the lag in no index), so the row's update stays heap-only here too.
_CITUS_COUNT: Final = (
    "UPDATE sessions SET next_seq = next_seq + %(n)s, message_count = message_count + %(n)s, "
    f"tool_call_count = tool_call_count + %(tools)s, {PG_ACTIVITY} "
    "WHERE id = %(sid)s"
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
        "ON CONFLICT (session_id, client_msg_uuid) DO NOTHING"
    )


class CitusAppend(PostgresAppend):
    """The locked path, as routed statements; no driver-level statement."""

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
        connection.exec_driver_sql(
            _CITUS_COUNT,
            {
                "sid": session_id,
                "n": len(fresh),
                "tools": sum(int(row["tool_call_total"] or 0) for row in fresh),
                "now": now,
                "granularity": ACTIVITY_GRANULARITY,
            },
        )
        return stored

    def append_direct(self, driver: Any, append: DirectAppend) -> DirectResult | None:
        # PostgreSQL's one statement is a data-modifying CTE: not routable (see the
        # module's note). The locked path's statements are.
        return None

    def load_direct(self, driver: Any, load: DirectLoad) -> list[Sequence[Any]] | None:
        # Through SQLAlchemy, as every other statement here (a routed read either way).
        return None
