"""editing and every OpenAI message format: roles, Responses items, superseded messages, forks

- ``messages.role`` takes ``developer`` and ``function`` too, and may be NULL: an OpenAI
  Responses-API item without a role (its ``type`` is kept with the message's other keys).
- ``messages.superseded``: NULL for a message of the live transcript, ``retracted`` or
  ``compacted`` for one an edit took out of it (rewind, retract, clear, compact). Such
  messages stay stored: history is never deleted by an edit.
- ``sessions.forked_from_session_id`` / ``forked_from_seq``: where ``fork_session``
  copied a session's transcript from.

Every new key stays session-scoped (no new constraint spans sessions).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_ROLES = "role IN ('system', 'developer', 'user', 'assistant', 'tool', 'function')"
_OLD_ROLES = "role IN ('system', 'user', 'assistant', 'tool')"
_SUPERSEDED = "superseded IN ('retracted', 'compacted')"


def _messages_at_0005() -> sa.Table:
    """``messages`` as revisions 0001-0005 left it: SQLite's batch copy needs the table,
    and ``migrate --sql`` has no database to reflect it from."""
    text, ident = sa.Text(), sa.String(255)
    return sa.Table(
        "messages",
        sa.MetaData(),
        sa.Column("session_id", ident, nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("client_msg_uuid", sa.Uuid(), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("content", text, nullable=True),
        sa.Column("tool_calls", text, nullable=True),
        sa.Column("tool_call_id", ident, nullable=True),
        sa.Column("tool_name", ident, nullable=True),
        sa.Column("reasoning", text, nullable=True),
        sa.Column("finish_reason", ident, nullable=True),
        sa.Column("token_count", sa.BigInteger(), nullable=True),
        sa.Column("timestamp", sa.DateTime(timezone=True), nullable=False),
        sa.Column("platform_message_id", ident, nullable=True),
        sa.Column("extra", text, nullable=True),
        sa.Column("openai_keys", text, nullable=True),
        sa.Column("content_hash", sa.LargeBinary(16), nullable=False),
        sa.CheckConstraint(_OLD_ROLES, name="ck_messages_role"),
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


def upgrade() -> None:
    with op.batch_alter_table("messages", copy_from=_messages_at_0005()) as batch:
        batch.drop_constraint(op.f("ck_messages_role"), type_="check")
        batch.alter_column("role", existing_type=sa.String(16), nullable=True)
        batch.create_check_constraint("role", _ROLES)
        batch.add_column(sa.Column("superseded", sa.String(16), nullable=True))
        batch.create_check_constraint("superseded", _SUPERSEDED)
    # Plain ADD COLUMN on both backends (no table copy, nothing to reflect).
    op.add_column("sessions", sa.Column("forked_from_session_id", sa.String(255), nullable=True))
    op.add_column("sessions", sa.Column("forked_from_seq", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    # Refuses (the check fails) while messages of the new formats are stored: a
    # downgrade must not drop what a user stored.
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("forked_from_seq")
        batch.drop_column("forked_from_session_id")
    with op.batch_alter_table("messages") as batch:
        batch.drop_constraint(op.f("ck_messages_superseded"), type_="check")
        batch.drop_column("superseded")
        batch.drop_constraint(op.f("ck_messages_role"), type_="check")
        batch.alter_column("role", existing_type=sa.String(16), nullable=False)
        batch.create_check_constraint("role", _OLD_ROLES)
