"""The schema distributed by session id (see the package's note), and how a Citus
coordinator is recognised."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from sqlalchemy import Connection, text
from sqlalchemy.engine.interfaces import DBAPIConnection

from sessionrepo.models.tables import Base

#: The table every session-scoped table is co-located with, and its distribution column.
ANCHOR: Final = ("sessions", "id")
#: The distribution column of every other session-scoped table.
SESSION_COLUMN: Final = "session_id"
#: Tables that stay plain tables on the coordinator.
LOCAL_TABLES: Final = frozenset({"alembic_version"})
#: sessionrepo's own tables: the only ones it distributes. An application's table in
#: the same schema is the application's to place (Citus cannot co-locate it with
#: ``sessions`` unless it is distributed the same way; a reference table is copied to
#: every worker).
OWN_TABLES: Final = frozenset(
    {
        *(name for name in Base.metadata.tables if not name.startswith("adk_")),
        "message_search",  # the search index, made by its own DDL (a rebuild remakes it)
        # sessionrepo.integrations.adk's state (migration 0008).
        "adk_sessions",
        "adk_app_states",
        "adk_user_states",
    }
)

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


def schema_tables(connection: Connection) -> dict[str, set[str]]:
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


def plan(
    tables: dict[str, set[str]], own: Iterable[str] = OWN_TABLES
) -> list[tuple[str, str | None]]:
    """``(table, distribution column)`` for every table of ``own`` to distribute, in the
    order it must be done (the anchor first: the others are co-located with it); ``None``
    for a reference table. Other tables, and those of :data:`LOCAL_TABLES`, are left out."""
    anchor, anchor_column = ANCHOR
    wanted = set(own)
    planned: list[tuple[str, str | None]] = []
    if anchor in tables:
        planned.append((anchor, anchor_column))
    for name in sorted(tables):
        if name == anchor or name in LOCAL_TABLES or name not in wanted:
            continue
        planned.append((name, SESSION_COLUMN if SESSION_COLUMN in tables[name] else None))
    return planned


def distribute_schema(connection: Connection, also: Iterable[str] = ()) -> list[str]:
    """Distribute every table of sessionrepo's own (:data:`OWN_TABLES`, and those named
    in ``also``: a later revision's new tables) in the current schema that Citus does not
    know yet, as the module says; returns the tables distributed now (none: it was done
    already). Any other table of the schema is left as it is. Idempotent; a no-op
    without the ``citus`` extension. Migrations call (a frozen copy of) it under their
    advisory lock; a later revision that creates a table calls it at its end.

    A reference table's rows are copied to the workers; the coordinator's local copy is
    then emptied (it is no longer read).
    """
    if not has_citus(connection):
        return []
    known = _distributed(connection)
    done: list[str] = []
    anchor = ANCHOR[0]
    for table, column in plan(schema_tables(connection), OWN_TABLES | set(also)):
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
    """Turn every distributed or reference table of sessionrepo's own in the current
    schema back into a plain table on the coordinator (its rows come back); returns
    them. The downgrade of migration 0007; a no-op without the ``citus`` extension."""
    if not has_citus(connection):
        return []
    undone: list[str] = []
    # The co-located tables before the anchor their foreign keys point to.
    own = [name for name in _distributed(connection) if name in OWN_TABLES]
    for table in sorted(own, key=lambda name: name == ANCHOR[0]):
        if table in _distributed(connection):  # cascading may have taken it already
            connection.execute(
                text("SELECT undistribute_table(:t, cascade_via_foreign_keys => true)"),
                {"t": table},
            )
        undone.append(table)
    return undone
