"""Citus (distributed PostgreSQL): the schema distributed by session id, and the few
statements that must differ so that Citus can route them.

A database is a Citus coordinator when it has the ``citus`` extension; the store finds
out on its first connection (:func:`is_coordinator`) and then uses :class:`CitusDialect`,
a :class:`~sessionrepo.dialects.postgresql.PostgresDialect` that differs only where Citus
needs it.

The distribution (:func:`distribute_schema`, run by migration 0006 and by any later
migration that adds a table):

- ``sessions`` is hash-distributed by ``id``;
- every other table with a ``session_id`` column (``messages``, ``search_backlog``,
  ``message_search``, ``pending_outbox``, and whatever later revisions add) by
  ``session_id``, co-located with ``sessions``: a session's rows of every table live in
  one shard group, on one worker, and a statement filtered by one session id is routed
  there whole;
- every other table (``search_index_state``) is a reference table, copied to every
  worker; ``alembic_version`` stays a plain table on the coordinator, which alone
  migrates.

What differs once distributed: Citus refuses ``FOR UPDATE`` on a statement that spans
shards (SQLSTATE 0A000), so the search catch-up claims backlog rows one session at a
time (:meth:`CitusDialect.take_search_backlog`); the outbox's claims are per session
already. Everything else (listing, search across sessions, prune, export) is the
PostgreSQL SQL as it is: a multi-shard read with ``ORDER BY ... LIMIT`` is fine on Citus.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Final

from sqlalchemy import Connection, Row, Select, select, text
from sqlalchemy.engine.interfaces import DBAPIConnection
from sqlalchemy.sql.elements import ColumnElement

from sessionrepo.dialects.base import DirectAppend, DirectLoad, DirectResult
from sessionrepo.dialects.postgresql import PostgresDialect
from sessionrepo.models.doctor import Check
from sessionrepo.models.tables import search_backlog_table

#: The table every session-scoped table is co-located with, and its distribution column.
ANCHOR: Final = ("sessions", "id")
#: The distribution column of every other session-scoped table.
SESSION_COLUMN: Final = "session_id"
#: Tables that stay plain tables on the coordinator.
LOCAL_TABLES: Final = frozenset({"alembic_version"})

_B = search_backlog_table.c

_DETECT = "SELECT extversion FROM pg_extension WHERE extname = 'citus'"


def is_coordinator(dbapi_connection: DBAPIConnection) -> bool:
    """Whether the database of a fresh driver connection has the ``citus`` extension
    (the connection's transaction is rolled back after the look)."""
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(_DETECT)
        found = cursor.fetchone() is not None
    finally:
        cursor.close()
        dbapi_connection.rollback()
    return found


def has_citus(connection: Connection) -> bool:
    """Whether ``connection``'s database has the ``citus`` extension."""
    return connection.exec_driver_sql(_DETECT).first() is not None


def _tables(connection: Connection) -> dict[str, set[str]]:
    """The ordinary tables of the current schema and their columns."""
    rows = connection.exec_driver_sql(
        "SELECT c.relname, a.attname FROM pg_class c "
        "JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped "
        "WHERE c.relkind IN ('r', 'p') AND c.relnamespace = current_schema()::regnamespace"
    )
    tables: dict[str, set[str]] = {}
    for table, column in rows:
        tables.setdefault(table, set()).add(column)
    return tables


def _distributed(connection: Connection) -> dict[str, str]:
    """``{table: method}`` of the current schema's tables Citus knows (``h``: hash
    distributed, ``n``: reference)."""
    rows = connection.exec_driver_sql(
        "SELECT c.relname, p.partmethod FROM pg_dist_partition p "
        "JOIN pg_class c ON c.oid = p.logicalrelid "
        "WHERE c.relnamespace = current_schema()::regnamespace"
    )
    return {str(table): str(method) for table, method in rows}


def plan(tables: dict[str, set[str]]) -> list[tuple[str, str | None]]:
    """``(table, distribution column)`` for every table to distribute, in the order it
    must be done (the anchor first: the others are co-located with it); ``None`` for a
    reference table. Tables of :data:`LOCAL_TABLES` are left out."""
    anchor, anchor_column = ANCHOR
    planned: list[tuple[str, str | None]] = []
    if anchor in tables:
        planned.append((anchor, anchor_column))
    for name in sorted(tables):
        if name == anchor or name in LOCAL_TABLES:
            continue
        planned.append((name, SESSION_COLUMN if SESSION_COLUMN in tables[name] else None))
    return planned


def distribute_schema(connection: Connection) -> list[str]:
    """Distribute every table of the current schema that Citus does not know yet, as
    the module says; returns the tables distributed now (none: it was done already).
    Idempotent; a no-op without the ``citus`` extension. Migrations call it under their
    advisory lock; a later revision that creates a table calls it at its end.

    A reference table's rows are copied to the workers; the coordinator's local copy is
    then emptied (it is no longer read).
    """
    if not has_citus(connection):
        return []
    known = _distributed(connection)
    done: list[str] = []
    anchor = ANCHOR[0]
    for table, column in plan(_tables(connection)):
        if table in known:
            continue
        if column is None:
            connection.execute(text("SELECT create_reference_table(:t)"), {"t": table})
            connection.execute(
                text("SELECT truncate_local_data_after_distributing_table(:t)"), {"t": table}
            )
        elif table == anchor:
            connection.execute(
                text("SELECT create_distributed_table(:t, :c)"), {"t": table, "c": column}
            )
        else:
            connection.execute(
                text("SELECT create_distributed_table(:t, :c, colocate_with => :a)"),
                {"t": table, "c": column, "a": anchor},
            )
        done.append(table)
    return done


def undistribute_schema(connection: Connection) -> list[str]:
    """Turn every distributed or reference table of the current schema back into a
    plain table on the coordinator (its rows come back); returns them. The downgrade of
    migration 0006; a no-op without the ``citus`` extension."""
    if not has_citus(connection):
        return []
    undone: list[str] = []
    # The co-located tables before the anchor their foreign keys point to.
    for table in sorted(_distributed(connection), key=lambda name: name == ANCHOR[0]):
        if table in _distributed(connection):  # cascading may have taken it already
            connection.execute(
                text("SELECT undistribute_table(:t, cascade_via_foreign_keys => true)"),
                {"t": table},
            )
        undone.append(table)
    return undone


class CitusDialect(PostgresDialect):
    """PostgreSQL on a Citus coordinator, the schema distributed by session id."""

    @classmethod
    def like(cls, dialect: PostgresDialect) -> CitusDialect:
        """A Citus dialect with ``dialect``'s settings (its search configuration)."""
        citus = cls()
        citus.__dict__.update(dialect.__dict__)
        return citus

    def append_direct(self, driver: Any, append: DirectAppend) -> DirectResult | None:
        # Citus plans a data-modifying CTE as a chain of subplans, the batch pulled
        # through the coordinator: the one-statement append would not be one round
        # trip here, and its FOR UPDATE inside a CTE is not routable. The locked path
        # (a routed lock, a routed insert) is what the router test checks.
        return None

    def load_direct(self, driver: Any, load: DirectLoad) -> list[Sequence[Any]] | None:
        # Through SQLAlchemy, as every other statement here: the router test sees them
        # all (its statement log listens to SQLAlchemy's cursor events).
        return None

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

    def search_rows_estimate(self, connection: Connection) -> float:
        # The coordinator's table is an empty shell: the rows are in the shards.
        return float(
            connection.exec_driver_sql(
                "SELECT coalesce(sum(CASE WHEN success THEN result::float END), 0) FROM "
                "run_command_on_shards('message_search', "
                "$$SELECT greatest(reltuples, 0) FROM pg_class WHERE oid = '%%s'::regclass$$)"
            ).scalar_one()
        )

    def settings(self, connection: Connection) -> dict[str, str]:
        settings = super().settings(connection)
        settings["citus_version"] = str(
            connection.exec_driver_sql(
                "SELECT extversion FROM pg_extension WHERE extname = 'citus'"
            ).scalar()
        )
        settings["citus_workers"] = json.dumps(
            [
                f"{host}:{port}"
                for host, port in connection.exec_driver_sql(
                    "SELECT node_name, node_port FROM citus_get_active_worker_nodes() "
                    "ORDER BY node_name, node_port"
                )
            ]
        )
        tables = connection.exec_driver_sql(
            "SELECT c.relname, p.partmethod, "
            "coalesce(column_to_column_name(p.logicalrelid, p.partkey), ''), "
            "(SELECT count(*) FROM pg_dist_shard s WHERE s.logicalrelid = p.logicalrelid), "
            "p.colocationid "
            "FROM pg_dist_partition p JOIN pg_class c ON c.oid = p.logicalrelid "
            "WHERE c.relnamespace = current_schema()::regnamespace ORDER BY c.relname"
        )
        settings["citus_tables"] = json.dumps(
            {
                name: {"method": method, "column": column, "shards": shards, "group": group}
                for name, method, column, shards, group in tables
            }
        )
        settings["citus_expected"] = json.dumps(dict(plan(_tables(connection))))
        return settings

    def judge_settings(self, settings: dict[str, str]) -> list[Check]:
        checks = super().judge_settings(settings)
        workers: list[str] = json.loads(settings["citus_workers"])
        tables: dict[str, dict[str, Any]] = json.loads(settings["citus_tables"])
        expected: dict[str, str | None] = json.loads(settings["citus_expected"])
        checks.append(
            Check(
                name="citus.workers",
                status="ok" if workers else "fail",
                detail=f"Citus {settings['citus_version']}, {len(workers)} active workers"
                + (f" ({', '.join(workers)})" if workers else ""),
                fix=None if workers else "add workers: SELECT citus_add_node(host, port)",
            )
        )
        anchor = tables.get(ANCHOR[0], {})
        wrong = []
        for name, column in expected.items():
            found = tables.get(name)
            if found is None:
                wrong.append(f"{name}: not distributed")
            elif column is None and found["method"] != "n":
                wrong.append(f"{name}: should be a reference table")
            elif column is not None and (
                found["method"] != "h"
                or found["column"] != column
                or found["group"] != anchor.get("group")
            ):
                wrong.append(f"{name}: should be distributed by {column}, co-located with sessions")
        distributed = sorted(n for n, c in expected.items() if c is not None and n in tables)
        reference = sorted(n for n, c in expected.items() if c is None and n in tables)
        detail = (
            f"distributed by session id ({anchor.get('shards', 0)} shards, co-located): "
            f"{', '.join(distributed) or 'none'}; reference: {', '.join(reference) or 'none'}"
        )
        checks.append(
            Check(name="citus.distribution", status="ok", detail=detail)
            if not wrong
            else Check(
                name="citus.distribution",
                status="fail",
                detail="; ".join(wrong),
                fix="run `sessionrepo migrate` on the coordinator (it distributes the schema)",
            )
        )
        return checks
