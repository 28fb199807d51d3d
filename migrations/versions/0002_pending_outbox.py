"""pending outbox

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ID = sa.String(255)
TIME = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "pending_outbox",
        sa.Column("session_id", ID, nullable=False),
        sa.Column("position", sa.BigInteger(), nullable=False),
        sa.Column("client_msg_uuid", sa.Uuid(), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("session_defaults", sa.Text(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("attempts", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("rejections", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("last_error_code", sa.String(32), nullable=True),
        sa.Column("next_attempt_at", TIME, nullable=False),
        sa.Column("claimed_by", sa.String(128), nullable=True),
        sa.Column("claimed_until", TIME, nullable=True),
        sa.Column("created_at", TIME, nullable=False),
        sa.CheckConstraint("state IN ('pending', 'dead')", name=op.f("ck_pending_outbox_state")),
        sa.PrimaryKeyConstraint("session_id", "position", name="pk_pending_outbox"),
        sa.UniqueConstraint(
            "session_id", "client_msg_uuid", name="uq_pending_outbox_session_id_client_msg_uuid"
        ),
    )
    op.create_index(
        "ix_pending_outbox_state_next_attempt_at", "pending_outbox", ["state", "next_attempt_at"]
    )


def downgrade() -> None:
    op.drop_index("ix_pending_outbox_state_next_attempt_at", table_name="pending_outbox")
    op.drop_table("pending_outbox")
