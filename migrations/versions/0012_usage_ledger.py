"""The usage ledger: usage_records, usage_prices, and usage parked with a message

- ``usage_records``: one row per model call of a session, ``PRIMARY KEY (session_id,
  usage_id)`` (a retried or re-flushed record is a no-op), ``ON DELETE CASCADE`` with its
  session; distributed with ``sessions`` on Citus.
- ``usage_prices``: the operator's price list, per model and token kind, valid from a
  day on (a price change is a new row); a reference table on Citus.
- ``pending_outbox.usage``: the usage records parked with a message (JSON text, NULL for
  none: rows parked before this revision drain as they were).

Revision ID: 0012
Revises: 0009
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TOKEN_KINDS = (
    "input_tokens",
    "output_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "reasoning_tokens",
)

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
#: table in the same schema (as 0007 and 0008 do).
_OWN_TABLES = frozenset({"usage_records", "usage_prices"})


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
    """``(table, distribution column)`` for every table to distribute, the anchor first;
    ``None`` for a reference table."""
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
    """Distribute every table of :data:`_OWN_TABLES` that Citus does not know yet;
    idempotent; a no-op without the ``citus`` extension."""
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
    ident = sa.String(255)
    op.create_table(
        "usage_records",
        sa.Column("session_id", ident, nullable=False),
        sa.Column("usage_id", sa.Uuid(), nullable=False),
        sa.Column("message_uuid", sa.Uuid(), nullable=True),
        sa.Column("model", ident, nullable=True),
        sa.Column("provider", ident, nullable=True),
        *(sa.Column(kind, sa.BigInteger(), nullable=False) for kind in _TOKEN_KINDS),
        sa.Column("latency", sa.Double(), nullable=True),
        sa.Column("reported_cost", sa.Double(), nullable=True),
        sa.Column("currency", sa.String(16), nullable=False),
        sa.Column("occurred_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("extra", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["session_id"],
            ["sessions.id"],
            name="fk_usage_records_session_id_sessions",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("session_id", "usage_id", name="pk_usage_records"),
    )
    op.create_index("ix_usage_records_occurred_at", "usage_records", ["occurred_at"])
    op.create_table(
        "usage_prices",
        sa.Column("model", ident, nullable=False),
        sa.Column("token_kind", sa.String(32), nullable=False),
        sa.Column("valid_from", sa.Date(), nullable=False),
        sa.Column("per_million", sa.Double(), nullable=False),
        sa.Column("currency", sa.String(16), nullable=False),
        sa.CheckConstraint(
            "token_kind IN (" + ", ".join(f"'{kind}'" for kind in _TOKEN_KINDS) + ")",
            name="ck_usage_prices_token_kind",
        ),
        sa.PrimaryKeyConstraint("model", "token_kind", "valid_from", name="pk_usage_prices"),
    )
    op.add_column("pending_outbox", sa.Column("usage", sa.Text(), nullable=True))
    # Citus (see 0007): the ledger is distributed by session id, co-located with
    # sessions; the price list becomes a reference table. A no-op without citus.
    if op.get_context().dialect.name == "postgresql" and not op.get_context().as_sql:
        _distribute_schema(op.get_bind())


def downgrade() -> None:
    with op.batch_alter_table("pending_outbox") as batch:
        batch.drop_column("usage")
    op.drop_table("usage_prices")
    op.drop_index("ix_usage_records_occurred_at", table_name="usage_records")
    op.drop_table("usage_records")
