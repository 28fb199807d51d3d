"""sessions: the open day's message count on the session row, not in the rollup

0017's rollup took one more row write per append: the ``usage_rollup`` row of the
session's day, a page of its own on SQLite (5.9 WAL pages an append became 6.9) and a
second heap update and WAL record on PostgreSQL. Now the newest UTC day a session had
messages on (``rollup_day``) and the live messages of that day the rollup does not hold
(``rollup_messages``) are columns of the session row, which every append rewrites anyway
(in no index but ``ix_sessions_rollup_day``, and that column moves once a day): an
append on the session's day adds to the count in the same row update. The first append
of a later day moves the count to the rollup (one upsert, once a day a session) and
starts the new day's; messages of an older day (an import) go to the rollup directly.
The report adds the sessions' open days to the rollup's (``sessionrepo.ops.insights``).

Existing sessions start with no open day (every count is in the rollup already). The
Citus append function keeps adding to the rollup itself, so on Citus the columns stay
empty.

The downgrade moves every open count back into the rollup before the columns go. On
PostgreSQL the tables' row-level security (0018) would show the migrating role its own
tenant's rows only, so it is lifted (``NO FORCE``: the owner's rows are all of them) for
the two statements and forced again.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_INDEX = "ix_sessions_rollup_day"

#: Frozen: usage_rollup's columns after ``messages``, zero for a count of messages
#: (calls, the five token kinds, reported_cost).
_ZEROS = "0, 0, 0, 0, 0, 0, 0"


def upgrade() -> None:
    op.add_column("sessions", sa.Column("rollup_day", sa.String(10), nullable=True))
    op.add_column(
        "sessions",
        sa.Column("rollup_messages", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
    )
    op.create_index(_INDEX, "sessions", ["rollup_day"])


def downgrade() -> None:
    tenants = op.get_bind().dialect.name == "postgresql"
    same_tenant = " AND s.tenant = r.tenant" if tenants else ""
    if tenants:
        for table in ("sessions", "usage_rollup"):
            op.execute(f"ALTER TABLE {table} NO FORCE ROW LEVEL SECURITY")
    open_day = (
        "FROM sessions s WHERE s.id = r.session_id AND s.rollup_day = r.day"
        f"{same_tenant} AND s.rollup_messages > 0"
    )
    op.execute(
        "UPDATE usage_rollup AS r SET messages = r.messages + "
        f"(SELECT s.rollup_messages {open_day}) WHERE r.model = '' AND EXISTS (SELECT 1 {open_day})"
    )
    tenant_column, tenant_value = (", tenant", ", s.tenant") if tenants else ("", "")
    op.execute(
        "INSERT INTO usage_rollup (session_id, day, model, messages, calls, input_tokens, "
        "output_tokens, cache_read_tokens, cache_write_tokens, reasoning_tokens, "
        f"reported_cost{tenant_column}) "
        f"SELECT s.id, s.rollup_day, '', s.rollup_messages, {_ZEROS}{tenant_value} "
        "FROM sessions s WHERE s.rollup_messages > 0 AND NOT EXISTS ("
        "SELECT 1 FROM usage_rollup r WHERE r.session_id = s.id AND r.day = s.rollup_day "
        f"AND r.model = ''{same_tenant})"
    )
    if tenants:
        for table in ("sessions", "usage_rollup"):
            op.execute(f"ALTER TABLE {table} FORCE ROW LEVEL SECURITY")
    op.drop_index(_INDEX, table_name="sessions")
    # Plain DROP COLUMN on both (SQLite 3.35+; the columns are in no index now): a batch
    # rebuild of ``sessions`` on SQLite would drop the table, and its ON DELETE CASCADE
    # foreign keys would take every message with it.
    op.execute("ALTER TABLE sessions DROP COLUMN rollup_messages")
    op.execute("ALTER TABLE sessions DROP COLUMN rollup_day")
