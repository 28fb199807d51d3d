"""Locks on Citus: one statement per session, each routed to its shard."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, Row, Select
from sqlalchemy.sql.elements import ColumnElement

from sessionrepo.dialects.postgresql.engine import PostgresEngine


class CitusEngine(PostgresEngine):
    """``FOR UPDATE`` per session: Citus refuses it across shards."""

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
