"""semantic index: message vectors kept beside the messages, filled by a catch-up

- ``message_embeddings`` (session_id, seq, content_hash, vector): one row per message
  the semantic catch-up has looked at, keyed like the message it describes; ``vector``
  is the embedding as int8 bytes (NULL: nothing worth embedding, or the message is out
  of the live transcript); ``content_hash`` is the message's own when it was embedded,
  so an edited message (compaction moves seqs) never answers with an old vector. Rows go
  with their session (``ON DELETE CASCADE``); erasing single messages deletes the rows of
  the same (session_id, seq). Distributed with ``sessions`` on Citus.
- ``semantic_index_state``: one row, the model whose vectors the store holds (name and
  dimension: a store never mixes two models) and the catch-up's progress watermark (the
  sessions' ``last_active_at`` it has looked at up to). Global: a reference table on
  Citus.

Revision ID: 0013
Revises: 0009
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
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
#: table in the same schema (as 0007 and 0008 do).
_OWN_TABLES = frozenset({"message_embeddings", "semantic_index_state"})


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
    op.create_table(
        "message_embeddings",
        sa.Column("session_id", sa.String(255), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("content_hash", sa.LargeBinary(16), nullable=False),
        sa.Column("vector", sa.LargeBinary(), nullable=True),
        sa.ForeignKeyConstraint(
            ["session_id"],
            ["sessions.id"],
            name="fk_message_embeddings_session_id_sessions",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("session_id", "seq", name="pk_message_embeddings"),
    )
    op.create_table(
        "semantic_index_state",
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("model", sa.String(255), nullable=True),
        sa.Column("dimension", sa.BigInteger(), nullable=True),
        sa.Column("watermark", sa.DateTime(timezone=True), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_semantic_index_state"),
    )
    # Citus (see 0007): message_embeddings is distributed by session id, co-located with
    # sessions; semantic_index_state becomes a reference table. A no-op without citus.
    if op.get_context().dialect.name == "postgresql" and not op.get_context().as_sql:
        _distribute_schema(op.get_bind())


def downgrade() -> None:
    op.drop_table("semantic_index_state")
    op.drop_table("message_embeddings")
