"""The search index on Citus: the backlog claimed one session at a time, the planner
settings sent to the workers, the rows counted in the shards (now and then)."""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from typing import Any, Final

from sqlalchemy import Connection, Row, select

from sessionrepo.dialects.base import IndexEntry
from sessionrepo.dialects.postgresql.search import PostgresSearch
from sessionrepo.models.tables import search_backlog_table

_B = search_backlog_table.c

#: Index entries per ``INSERT … VALUES`` (five parameters each).
_ENTRIES_PER_INSERT: Final = 1000


@functools.lru_cache(maxsize=64)
def _insert_entries(rows: int) -> str:
    values = ", ".join(
        f"(%(sid)s, %(q{i})s, %(t{i})s, %(r{i})s, to_tsvector(%(cfg)s::regconfig, %(b{i})s))"
        for i in range(rows)
    )
    return f"INSERT INTO message_search (session_id, seq, ts, role, document) VALUES {values}"


#: Seconds a count of the search rows in the shards is used again: it only weighs two
#: ways to the same answer, and counting asks every shard (about 0.4 s at 32 shards).
ESTIMATE_TTL: Final = 300.0


class CitusSearch(PostgresSearch):
    """Backlog claims, planner settings and the row estimate, as Citus routes them."""

    #: The search's SET LOCAL planner settings choose the plan where the scans run: on
    #: the workers. Citus sends a transaction's SET LOCALs to the workers it opens in
    #: that transaction only when told to (the default is to send none): told first, in
    #: the same round trip.
    search_settings = ("citus.propagate_set_commands = 'local'", *PostgresSearch.search_settings)

    def index_entries(self, connection: Connection, entries: Sequence[IndexEntry]) -> None:
        # PostgreSQL's one INSERT … SELECT FROM unnest goes through the coordinator (a
        # COPY to each shard, committed in two phases); an INSERT … VALUES of one
        # session's entries is routed to its shard whole.
        by_session: dict[str, list[IndexEntry]] = {}
        for entry in entries:
            by_session.setdefault(entry[0], []).append(entry)
        for session_id, mine in by_session.items():
            for start in range(0, len(mine), _ENTRIES_PER_INSERT):
                chunk = mine[start : start + _ENTRIES_PER_INSERT]
                params: dict[str, Any] = {"sid": session_id, "cfg": self.search_config}
                for index, (_, seq, stamp, role, body) in enumerate(chunk):
                    params |= {f"q{index}": seq, f"t{index}": stamp, f"r{index}": role or ""}
                    params[f"b{index}"] = body
                connection.exec_driver_sql(_insert_entries(len(chunk)), params)

    def take_search_backlog(
        self,
        connection: Connection,
        limit: int,
        *,
        wait: bool,
        among: Sequence[tuple[str, int]] | None = None,
    ) -> list[Row[Any]]:
        # Which sessions have rows: one multi-shard read, without a lock. Then each
        # session's rows are locked by a statement filtered by its id, which Citus
        # routes to the session's shard (FOR UPDATE across shards is refused).
        if among is not None:
            sessions = sorted({session_id for session_id, _ in among})
        else:
            sessions = list(
                connection.execute(
                    select(_B.session_id).distinct().order_by(_B.session_id).limit(limit)
                ).scalars()
            )
        wanted: dict[str, list[int]] = {}
        for session_id, first_seq in among or ():
            wanted.setdefault(session_id, []).append(first_seq)
        taken: list[Row[Any]] = []
        for session_id in sessions:
            if len(taken) >= limit:
                break
            query = select(_B.session_id, _B.first_seq, _B.count.label("messages")).where(
                _B.session_id == session_id
            )
            if among is not None:
                query = query.where(_B.first_seq.in_(wanted[session_id]))
            query = query.order_by(_B.first_seq).limit(limit - len(taken))
            taken += connection.execute(query.with_for_update(skip_locked=not wait))
        return taken

    def search_rows_estimate(self, connection: Connection) -> float:
        # The coordinator's table is an empty shell: the rows are in the shards, and
        # asking them all costs more than the search. A count a few minutes old weighs
        # the two ways as well. (One dialect per engine: one schema.)
        now = time.monotonic()
        cached: tuple[float, float] | None = self.__dict__.get("_rows_estimate")
        if cached is not None and now - cached[0] < ESTIMATE_TTL:
            return cached[1]
        rows = float(
            connection.exec_driver_sql(
                "SELECT coalesce(sum(CASE WHEN success THEN result::float END), 0) FROM "
                "run_command_on_shards('message_search', "
                "$$SELECT greatest(reltuples, 0) FROM pg_class WHERE oid = '%%s'::regclass$$)"
            ).scalar_one()
        )
        self.__dict__["_rows_estimate"] = (now, rows)  # one assignment: thread-safe
        return rows
