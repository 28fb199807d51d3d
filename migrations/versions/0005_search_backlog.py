"""search backlog: appends record what to index, a catch-up indexes it later

``search_backlog`` (session_id, first_seq, count): one row per append, written in the
append's own transaction, so a committed message is either indexed or named here; the
catch-up (``repo/search.py``) indexes the rows and deletes them in one transaction. Rows
go with their session (``ON DELETE CASCADE``).

The backlog starts empty: messages stored before this revision are indexed already, or
the index is marked stale (migration 0004) and ``sessionrepo reindex`` covers them.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "search_backlog",
        sa.Column("session_id", sa.String(255), nullable=False),
        sa.Column("first_seq", sa.BigInteger(), nullable=False),
        sa.Column("count", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["session_id"],
            ["sessions.id"],
            name="fk_search_backlog_session_id_sessions",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("session_id", "first_seq", name="pk_search_backlog"),
    )


def downgrade() -> None:
    # Messages named here are not indexed: without the backlog, only a reindex finds them.
    op.execute(
        sa.text(
            "UPDATE search_index_state SET state = 'stale', reason = :reason, "
            "updated_at = CURRENT_TIMESTAMP "
            "WHERE name = 'messages' AND EXISTS (SELECT 1 FROM search_backlog)"
        ).bindparams(reason="search backlog dropped by downgrade to 0004: run sessionrepo reindex")
    )
    op.drop_table("search_backlog")
