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

from sessionrepo.dialects.citus import distribute_schema

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TABLES = ("adk_sessions", "adk_user_states", "adk_app_states")


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
        distribute_schema(op.get_bind())


def downgrade() -> None:
    op.drop_index("ix_adk_sessions_app_name_user_id", table_name="adk_sessions")
    for table in _TABLES:
        op.drop_table(table)
