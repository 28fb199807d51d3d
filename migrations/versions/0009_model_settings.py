"""sessions.model_config is renamed model_settings: the name of the Python field and JSON

Pydantic reserves ``model_config`` on a model, so ``Session`` could only call the field
``model_settings`` and carried an alias for the column and the export's JSON. Now the
three agree. ``ALTER TABLE ... RENAME COLUMN`` runs as it is on PostgreSQL, on SQLite
(3.25 or newer; it rewrites nothing but the schema) and on a Citus coordinator, which
propagates the rename of a distributed table's column to its shards.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("ALTER TABLE sessions RENAME COLUMN model_config TO model_settings")


def downgrade() -> None:
    op.execute("ALTER TABLE sessions RENAME COLUMN model_settings TO model_config")
