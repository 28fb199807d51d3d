"""Locks on Citus: one statement per session, each routed to its shard; what a worker
that cannot be reached means; the coordinator's connections to the workers kept."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Final

from sqlalchemy import Connection, Row, Select
from sqlalchemy import exc as sa_exc
from sqlalchemy.sql.elements import ColumnElement

from sessionrepo.dialects.postgresql.engine import PostgresEngine
from sessionrepo.errors import BackendUnavailable, RepoError

#: How the coordinator says a worker did not answer (SQLSTATE 08006, from a coordinator
#: that itself answers): "connection to the remote node user@host:port failed ...".
_NODE_FAILED: Final = re.compile(r"connection to the remote node (?:\S+@)?(\S+:\d+) failed")


#: Set on each connection to the coordinator. A statement across shards (a listing, a
#: store-wide search, the backlog check) runs its 32 tasks over up to
#: ``max_adaptive_executor_pool_size`` connections to each worker (Citus's default: 16),
#: and the coordinator keeps ``max_cached_conns_per_worker`` of them open after it
#: (default: 1): every such statement opened, and closed again, up to 15 connections
#: per worker, a new server process each. Four of each: every statement after the
#: first finds its connections open, and a worker still runs a statement's tasks four
#: at a time. (Each coordinator connection may then hold 4 idle ones to each worker:
#: the workers' ``max_connections``, README "Operating notes".)
CONNECTION_SETTINGS: Final = {
    "citus.max_adaptive_executor_pool_size": "4",
    "citus.max_cached_conns_per_worker": "4",
}


class CitusEngine(PostgresEngine):
    """``FOR UPDATE`` per session: Citus refuses it across shards. A worker down is the
    unavailability of its sessions, not of the database."""

    def configure_connection(self, dbapi_connection: Any) -> None:
        cursor = dbapi_connection.cursor()
        try:
            for name, value in CONNECTION_SETTINGS.items():
                cursor.execute(f"SET {name} = {value}")
        finally:
            cursor.close()
        dbapi_connection.commit()

    def translate(self, exc: sa_exc.DBAPIError) -> RepoError:
        translated = super().translate(exc)
        if isinstance(translated, BackendUnavailable) and not exc.connection_invalidated:
            found = _NODE_FAILED.search(str(exc.orig))
            if found is not None:
                return BackendUnavailable(str(translated), code=translated.code, node=found[1])
        return translated

    def nearest_ranks(self, values: Select[Any], shares: Sequence[tuple[int, int]]) -> Select[Any]:
        # An ordered-set aggregate is not pushed down to the shards: the values are
        # gathered first (a MATERIALIZED CTE, which Citus plans as an intermediate
        # result on the coordinator), and ranked there.
        gathered = values.cte("ranked_values").prefix_with("MATERIALIZED")
        return self._ranks(gathered, shares)

    def select_locked(
        self,
        connection: Connection,
        query: Select[Any],
        session_column: ColumnElement[Any],
        session_ids: Sequence[str],
    ) -> list[Row[Any]]:
        # One statement per session, each routed to its shard (FOR UPDATE across
        # shards is refused); in the order of the ids, as the one statement would lock.
        rows: list[Row[Any]] = []
        for session_id in session_ids:
            rows += connection.execute(query.where(session_column == session_id).with_for_update())
        return rows
