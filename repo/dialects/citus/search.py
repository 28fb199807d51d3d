"""The search index on Citus: the backlog claimed one session at a time, the rows counted
in the shards."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, Row, select

from sessionrepo.dialects.postgresql.search import PostgresSearch
from sessionrepo.models.tables import search_backlog_table

_B = search_backlog_table.c


class CitusSearch(PostgresSearch):
    """Backlog claims and the row estimate, as Citus can route and count them."""

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
        # The coordinator's table is an empty shell: the rows are in the shards.
        return float(
            connection.exec_driver_sql(
                "SELECT coalesce(sum(CASE WHEN success THEN result::float END), 0) FROM "
                "run_command_on_shards('message_search', "
                "$$SELECT greatest(reltuples, 0) FROM pg_class WHERE oid = '%%s'::regclass$$)"
            ).scalar_one()
        )
