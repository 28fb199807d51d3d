"""Locks on Citus: one statement per session, each routed to its shard; what a worker
that cannot be reached means."""

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


class CitusEngine(PostgresEngine):
    """``FOR UPDATE`` per session: Citus refuses it across shards. A worker down is the
    unavailability of its sessions, not of the database."""

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
