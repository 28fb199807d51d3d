"""full-text search index, outside the messages table

SQLite: an FTS5 table ``messages_fts`` holding the indexed text of each message with its
(session_id, seq). PostgreSQL: ``message_search`` (session_id, seq, tsvector) with a GIN
index. Neither is maintained by a trigger: the repository indexes after the message
commit, so a broken index can never make a transcript write fail. ``search_index_state``
says whether the index can be trusted.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "search_index_state",
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_search_index_state"),
    )
    if op.get_context().dialect.name == "sqlite":
        op.execute(
            "CREATE VIRTUAL TABLE messages_fts USING fts5("
            "body, session_id UNINDEXED, seq UNINDEXED, "
            "tokenize = 'unicode61 remove_diacritics 2')"
        )
    else:
        op.execute(
            "CREATE TABLE message_search ("
            " session_id VARCHAR(255) NOT NULL,"
            " seq BIGINT NOT NULL,"
            " document TSVECTOR NOT NULL,"
            " CONSTRAINT pk_message_search PRIMARY KEY (session_id, seq),"
            " CONSTRAINT fk_message_search_messages FOREIGN KEY (session_id, seq)"
            "  REFERENCES messages (session_id, seq) ON DELETE CASCADE)"
        )
        op.execute("CREATE INDEX ix_message_search_document ON message_search USING gin (document)")
    # Existing messages (an upgrade of a populated store) are indexed by `sessionrepo
    # reindex`; until then the index says so.
    op.execute(
        sa.text(
            "INSERT INTO search_index_state (name, state, reason, updated_at) "
            "SELECT 'messages', CASE WHEN EXISTS (SELECT 1 FROM messages) "
            "THEN 'stale' ELSE 'ok' END, CASE WHEN EXISTS (SELECT 1 FROM messages) "
            "THEN 'created over existing messages: run sessionrepo reindex' END, "
            "CURRENT_TIMESTAMP"
        )
    )


def downgrade() -> None:
    if op.get_context().dialect.name == "sqlite":
        op.execute("DROP TABLE messages_fts")
    else:
        op.execute("DROP TABLE message_search")
    op.drop_table("search_index_state")
