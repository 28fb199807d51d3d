"""usage_records: an index of each session's calls by time with their latency

- ``ix_usage_records_session_id_occurred_at``: ``(session_id, occurred_at, latency)``.
  The insights report's latency percentiles by the session's source or user join the
  calls to their sessions; SQLite runs that join as a search of each session's calls,
  and through the primary key alone that is a second lookup of every call's row
  (100,000 calls: 0.17 s of the percentiles' 0.2 s). This index holds all the join
  reads (0.06 s). It also serves a session's calls within a range (the busiest sessions'
  partial days). A plain index on both backends; on Citus created on every shard of
  the distributed table, like 0012's.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_INDEX = "ix_usage_records_session_id_occurred_at"


def upgrade() -> None:
    op.create_index(_INDEX, "usage_records", ["session_id", "occurred_at", "latency"])


def downgrade() -> None:
    op.drop_index(_INDEX, table_name="usage_records")
