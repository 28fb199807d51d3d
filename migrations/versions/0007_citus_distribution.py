"""Citus: distribute the schema by session id (a no-op on plain PostgreSQL and SQLite)

On a Citus coordinator (a database with the ``citus`` extension), every session-scoped
table is hash-distributed by session id, co-located with ``sessions`` (distributed by
``id``), and every other table (``search_index_state``) becomes a reference table. It
runs under the migration's advisory lock, from a frozen copy of what
``sessionrepo.dialects.citus.distribute_schema`` was when this revision was made, and it is
idempotent: a table Citus knows already is left alone.

Later revisions: Citus propagates DDL on distributed tables (``ADD COLUMN``, indexes) by
itself. A revision that *creates* a table distributes the schema again at its end (with its
own frozen copy), so the new table is distributed (it has a ``session_id`` column) or made a
reference table like the rest; until then it is a plain table on the coordinator (Citus
13.2 accepts its foreign key to ``sessions`` there, and keeps it when distributing). A
revision that runs before this one needs nothing: this one distributes what it made.

The downgrade turns the tables back into plain tables on the coordinator (their rows
come back), so every older revision downgrades as on plain PostgreSQL.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op
from sqlalchemy import Connection, text

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# A frozen copy of sessionrepo.dialects.citus as of this revision (its distribute_schema
# and the helpers it calls): a revision's meaning must not change when library code does.
_DETECT = "SELECT extversion FROM pg_extension WHERE extname = 'citus'"
#: The table every session-scoped table is co-located with, and its distribution column.
_ANCHOR = ("sessions", "id")
#: The distribution column of every other session-scoped table.
_SESSION_COLUMN = "session_id"
#: Tables that stay plain tables on the coordinator.
_LOCAL_TABLES = frozenset({"alembic_version"})
#: The tables this revision distributes: sessionrepo's own, never an application's
#: table in the same schema (the anchor is distributed first when it is not yet).
_OWN_TABLES = frozenset(
    {
        "sessions",
        "messages",
        "search_backlog",
        "message_search",
        "pending_outbox",
        "search_index_state",
    }
)


def _has_citus(connection: Connection) -> bool:
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


def _plan(tables: dict[str, set[str]]) -> list[tuple[str, str | None]]:
    """``(table, distribution column)`` for every table of :data:`_OWN_TABLES` to
    distribute, the anchor first; ``None`` for a reference table."""
    anchor, anchor_column = _ANCHOR
    planned: list[tuple[str, str | None]] = []
    if anchor in tables:
        planned.append((anchor, anchor_column))
    for name in sorted(tables):
        if name == anchor or name in _LOCAL_TABLES or name not in _OWN_TABLES:
            continue
        planned.append((name, _SESSION_COLUMN if _SESSION_COLUMN in tables[name] else None))
    return planned


def _distribute_schema(connection: Connection) -> list[str]:
    """Distribute every table of :data:`_OWN_TABLES` (and the anchor) in the current
    schema that Citus does not know yet, leaving every other table alone; idempotent;
    a no-op without the ``citus`` extension."""
    if not _has_citus(connection):
        return []
    known = _distributed(connection)
    done: list[str] = []
    anchor = _ANCHOR[0]
    for table, column in _plan(_tables(connection)):
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


def _undistribute_schema(connection: Connection) -> list[str]:
    """Turn every distributed or reference table of :data:`_OWN_TABLES` in the current
    schema back into a plain table on the coordinator (its rows come back); a no-op
    without ``citus``."""
    if not _has_citus(connection):
        return []
    undone: list[str] = []
    # The co-located tables before the anchor their foreign keys point to.
    own = [name for name in _distributed(connection) if name in _OWN_TABLES]
    for table in sorted(own, key=lambda name: name == _ANCHOR[0]):
        if table in _distributed(connection):  # cascading may have taken it already
            connection.execute(
                text("SELECT undistribute_table(:t, cascade_via_foreign_keys => true)"),
                {"t": table},
            )
        undone.append(table)
    return undone


def upgrade() -> None:
    if op.get_context().dialect.name == "postgresql" and not op.get_context().as_sql:
        _distribute_schema(op.get_bind())


def downgrade() -> None:
    if op.get_context().dialect.name == "postgresql" and not op.get_context().as_sql:
        _undistribute_schema(op.get_bind())
