"""search index ordered by message time, filters inside the index

SQLite: ``messages_fts`` is rebuilt with its rowid derived from the message timestamp
(milliseconds, shifted left 8 bits; the low bits number messages of one millisecond), so
FTS5 yields matches newest first without sorting them, and a ``meta`` column holding a
word for the session and one for the role, so those filters are index lookups.
PostgreSQL: ``message_search`` gains the message time (``ts``, with b-tree indexes on it
and on (session_id, ts), so the newest matches are found by walking the newest rows) and
the role, and loses its foreign key (``forget_search_documents`` deletes explicitly; the key
check locked the message row on every insert).

The index starts empty: a store with messages is marked stale until ``sessionrepo
reindex`` (the documents are prepared in Python, not in SQL).

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _mark_stale_if_populated(reason: str) -> None:
    op.execute(
        sa.text(
            "UPDATE search_index_state SET state = 'stale', reason = :reason, "
            "updated_at = CURRENT_TIMESTAMP "
            "WHERE name = 'messages' AND EXISTS (SELECT 1 FROM messages)"
        ).bindparams(reason=reason)
    )


def upgrade() -> None:
    if op.get_context().dialect.name == "sqlite":
        op.execute("DROP TABLE messages_fts")
        op.execute(
            "CREATE VIRTUAL TABLE messages_fts USING fts5("
            "session_id UNINDEXED, seq UNINDEXED, meta, body, "
            "tokenize = 'unicode61 remove_diacritics 2')"
        )
    else:
        op.execute("DROP TABLE message_search")
        op.execute(
            "CREATE TABLE message_search ("
            " session_id VARCHAR(255) NOT NULL,"
            " seq BIGINT NOT NULL,"
            " ts TIMESTAMP WITH TIME ZONE NOT NULL,"
            " role VARCHAR(16) NOT NULL,"
            " document TSVECTOR NOT NULL,"
            " CONSTRAINT pk_message_search PRIMARY KEY (session_id, seq))"
        )
        op.execute("CREATE INDEX ix_message_search_ts ON message_search (ts)")
        op.execute("CREATE INDEX ix_message_search_session_ts ON message_search (session_id, ts)")
        op.execute("CREATE INDEX ix_message_search_document ON message_search USING gin (document)")
    _mark_stale_if_populated("search index rebuilt by migration 0004: run sessionrepo reindex")


def downgrade() -> None:
    if op.get_context().dialect.name == "sqlite":
        op.execute("DROP TABLE messages_fts")
        op.execute(
            "CREATE VIRTUAL TABLE messages_fts USING fts5("
            "body, session_id UNINDEXED, seq UNINDEXED, "
            "tokenize = 'unicode61 remove_diacritics 2')"
        )
    else:
        op.execute("DROP TABLE message_search")
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
    _mark_stale_if_populated("search index rebuilt by downgrade to 0003: run sessionrepo reindex")
