"""semantic index generations: what changed since a process last read the vectors

- ``semantic_index_state.generation``: a counter the semantic catch-up increments in
  every transaction that writes vectors (the row's lock, held to the commit, orders
  those transactions: a reader that sees generation G sees every row of generations up
  to G); ``cleared``: the generation at which every vector was last dropped (a
  ``reindex --semantic``).
- ``message_embeddings.generation``: the generation of the transaction that wrote the
  row (NULL for rows written before this revision), indexed: a process that keeps the
  vectors in memory reads only the rows written since it last looked.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Plain column additions and an index: Citus propagates them to the shards of the
    # distributed message_embeddings and to the reference semantic_index_state.
    op.add_column(
        "semantic_index_state",
        sa.Column("generation", sa.BigInteger(), nullable=False, server_default=sa.text("0")),
    )
    op.add_column(
        "semantic_index_state",
        sa.Column("cleared", sa.BigInteger(), nullable=False, server_default=sa.text("0")),
    )
    op.add_column("message_embeddings", sa.Column("generation", sa.BigInteger(), nullable=True))
    op.create_index(
        "ix_message_embeddings_generation", "message_embeddings", ["generation"], unique=False
    )


def downgrade() -> None:
    op.drop_index("ix_message_embeddings_generation", table_name="message_embeddings")
    with op.batch_alter_table("message_embeddings") as batch:
        batch.drop_column("generation")
    with op.batch_alter_table("semantic_index_state") as batch:
        batch.drop_column("cleared")
        batch.drop_column("generation")
