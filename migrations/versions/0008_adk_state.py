"""Google ADK state: app, user and session state of sessionrepo.integrations.adk

- ``adk_app_states`` (``app:`` keys per app) and ``adk_user_states`` (``user:`` keys per
  app and user): global, reference tables on Citus.
- ``adk_sessions``: an ADK session's names (app, user, its own id), its session-scoped
  state, ``last_update_time`` and ``applied_seq`` (the newest event whose state delta
  the states hold: events replayed from an outbox later are applied after it); one row
  per sessionrepo session (``session_id``, which it goes with: ``ON DELETE CASCADE``),
  distributed with it on Citus.

State values are compact JSON text, as every JSON column here; times are epoch seconds
(``DOUBLE PRECISION``), exactly the floats ADK hands over.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TABLES = ("adk_sessions", "adk_user_states", "adk_app_states")

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
_OWN_TABLES = frozenset({"adk_sessions", "adk_app_states", "adk_user_states"})


def _has_citus(connection: sa.Connection) -> bool:
    return connection.exec_driver_sql(_DETECT).first() is not None


def _tables(connection: sa.Connection) -> dict[str, set[str]]:
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


def _distributed(connection: sa.Connection) -> dict[str, str]:
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


def _distribute_schema(connection: sa.Connection) -> list[str]:
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
            connection.execute(sa.text("SELECT create_reference_table(:t)"), {"t": table})
            connection.execute(
                sa.text("SELECT truncate_local_data_after_distributing_table(:t)"), {"t": table}
            )
        elif table == anchor:
            connection.execute(
                sa.text("SELECT create_distributed_table(:t, :c)"), {"t": table, "c": column}
            )
        else:
            connection.execute(
                sa.text("SELECT create_distributed_table(:t, :c, colocate_with => :a)"),
                {"t": table, "c": column, "a": anchor},
            )
        done.append(table)
    return done


def upgrade() -> None:
    ident, text = sa.String(255), sa.Text()
    time: sa.Double[float] = sa.Double()
    op.create_table(
        "adk_app_states",
        sa.Column("app_name", ident, nullable=False),
        sa.Column("state", text, nullable=False),
        sa.Column("update_time", time, nullable=False),
        sa.PrimaryKeyConstraint("app_name", name="pk_adk_app_states"),
    )
    op.create_table(
        "adk_user_states",
        sa.Column("app_name", ident, nullable=False),
        sa.Column("user_id", ident, nullable=False),
        sa.Column("state", text, nullable=False),
        sa.Column("update_time", time, nullable=False),
        sa.PrimaryKeyConstraint("app_name", "user_id", name="pk_adk_user_states"),
    )
    op.create_table(
        "adk_sessions",
        sa.Column("session_id", ident, nullable=False),
        sa.Column("app_name", ident, nullable=False),
        sa.Column("user_id", ident, nullable=False),
        sa.Column("adk_session_id", ident, nullable=False),
        sa.Column("state", text, nullable=False),
        sa.Column("update_time", time, nullable=False),
        sa.Column("applied_seq", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["session_id"],
            ["sessions.id"],
            name="fk_adk_sessions_session_id_sessions",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("session_id", name="pk_adk_sessions"),
    )
    op.create_index("ix_adk_sessions_app_name_user_id", "adk_sessions", ["app_name", "user_id"])
    # Citus (see 0007): the new session-scoped table is distributed by session id,
    # co-located with sessions; the two global ones become reference tables. A no-op
    # without the citus extension.
    if op.get_context().dialect.name == "postgresql" and not op.get_context().as_sql:
        _distribute_schema(op.get_bind())


def downgrade() -> None:
    op.drop_index("ix_adk_sessions_app_name_user_id", table_name="adk_sessions")
    for table in _TABLES:
        op.drop_table(table)
