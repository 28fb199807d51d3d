"""sessions and messages

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ID = sa.String(255)
TIME = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "sessions",
        sa.Column("id", ID, nullable=False),
        sa.Column("source", ID, nullable=False),
        sa.Column("user_id", ID, nullable=True),
        sa.Column("title", sa.Text(), nullable=True),
        sa.Column("model", ID, nullable=True),
        sa.Column("model_config", sa.Text(), nullable=True),
        sa.Column("system_prompt", sa.Text(), nullable=True),
        sa.Column("parent_session_id", ID, nullable=True),
        sa.Column("started_at", TIME, nullable=False),
        sa.Column("ended_at", TIME, nullable=True),
        sa.Column("end_reason", sa.String(1024), nullable=True),
        sa.Column("message_count", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("tool_call_count", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("input_tokens", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("output_tokens", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("metadata", sa.Text(), nullable=True),
        sa.Column("next_seq", sa.BigInteger(), server_default=sa.text("1"), nullable=False),
        sa.Column("last_active_at", TIME, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_sessions"),
    )
    op.create_index("ix_sessions_last_active_at_id", "sessions", ["last_active_at", "id"])
    op.create_index(
        "ix_sessions_source_last_active_at_id", "sessions", ["source", "last_active_at", "id"]
    )
    op.create_index(
        "ix_sessions_user_id_last_active_at_id", "sessions", ["user_id", "last_active_at", "id"]
    )
    op.create_index(
        "ix_sessions_open_last_active_at_id",
        "sessions",
        ["last_active_at", "id"],
        sqlite_where=sa.text("ended_at IS NULL"),
        postgresql_where=sa.text("ended_at IS NULL"),
    )
    op.create_index("ix_sessions_parent_session_id", "sessions", ["parent_session_id"])
    op.create_index("ix_sessions_ended_at", "sessions", ["ended_at"])

    op.create_table(
        "messages",
        sa.Column("session_id", ID, nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("client_msg_uuid", sa.Uuid(), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("content", sa.Text(), nullable=True),
        sa.Column("tool_calls", sa.Text(), nullable=True),
        sa.Column("tool_call_id", ID, nullable=True),
        sa.Column("tool_name", ID, nullable=True),
        sa.Column("reasoning", sa.Text(), nullable=True),
        sa.Column("finish_reason", ID, nullable=True),
        sa.Column("token_count", sa.BigInteger(), nullable=True),
        sa.Column("timestamp", TIME, nullable=False),
        sa.Column("platform_message_id", ID, nullable=True),
        sa.Column("extra", sa.Text(), nullable=True),
        sa.Column("openai_keys", sa.Text(), nullable=True),
        sa.Column("content_hash", sa.LargeBinary(16), nullable=False),
        sa.CheckConstraint(
            "role IN ('system', 'user', 'assistant', 'tool')", name=op.f("ck_messages_role")
        ),
        sa.ForeignKeyConstraint(
            ["session_id"],
            ["sessions.id"],
            name="fk_messages_session_id_sessions",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("session_id", "seq", name="pk_messages"),
        sa.UniqueConstraint(
            "session_id", "client_msg_uuid", name="uq_messages_session_id_client_msg_uuid"
        ),
    )


def downgrade() -> None:
    op.drop_table("messages")
    op.drop_index("ix_sessions_ended_at", table_name="sessions")
    op.drop_index("ix_sessions_parent_session_id", table_name="sessions")
    op.drop_index("ix_sessions_open_last_active_at_id", table_name="sessions")
    op.drop_index("ix_sessions_user_id_last_active_at_id", table_name="sessions")
    op.drop_index("ix_sessions_source_last_active_at_id", table_name="sessions")
    op.drop_index("ix_sessions_last_active_at_id", table_name="sessions")
    op.drop_table("sessions")
