"""sessions.last_active_lag_us: an append moves the indexed last_active_at only past a granularity

``last_active_at`` sits in four of the session table's indexes (the listing's orders), so an
append that rewrote it each time rewrote four index pages on SQLite and could never be a
heap-only (HOT) update on PostgreSQL. From this revision an append rewrites it only when it
is more than the activity granularity (1 s, ``ACTIVITY_GRANULARITY`` in
``sessionrepo.models.tables``) behind the append's time; otherwise it records the time as
``last_active_lag_us``, microseconds after ``last_active_at``, in no index. A session's
activity is ``last_active_at + last_active_lag_us``; the listing orders by it exactly
(it reads the index at most a granularity wider than the page, see
``SessionRepository.list_sessions``).

On PostgreSQL the session table also gets ``fillfactor = 80``: a HOT update needs room for
the new row version on the same page (pages written before this revision fill up first).
Existing rows start with no lag: their ``last_active_at`` is their activity.

On SQLite, ``search_backlog`` becomes a ``WITHOUT ROWID`` table: its row lives in its
primary key's b-tree, so an append's backlog row writes one page, not two (the table's
and its key's).

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "sessions",
        sa.Column(
            "last_active_lag_us", sa.BigInteger(), server_default=sa.text("0"), nullable=False
        ),
    )
    bind = op.get_bind()
    if bind.dialect.name == "postgresql":
        # A storage parameter only: a server that cannot set it on this table (a Citus
        # coordinator whose version does not propagate it to the shards, say) keeps the
        # default, and its updates are HOT while a page has room.
        _storage_parameter("SET (fillfactor = 80)")
    else:
        _rebuild_backlog(" WITHOUT ROWID")


def _storage_parameter(change: str) -> None:
    statement = f"ALTER TABLE sessions {change}"
    if context.is_offline_mode():  # a script (``sessionrepo migrate --sql``): as it is
        op.execute(statement)
        return
    bind = op.get_bind()
    try:
        with bind.begin_nested():
            bind.exec_driver_sql(statement)
    except sa.exc.DBAPIError:
        pass


#: search_backlog as migration 0005 made it on SQLite (a frozen copy), with a table option.
_BACKLOG_DDL = """CREATE TABLE search_backlog_rebuilt (
    session_id VARCHAR(255) NOT NULL,
    first_seq BIGINT NOT NULL,
    count BIGINT NOT NULL,
    CONSTRAINT pk_search_backlog PRIMARY KEY (session_id, first_seq),
    CONSTRAINT fk_search_backlog_session_id_sessions FOREIGN KEY(session_id)
        REFERENCES sessions (id) ON DELETE CASCADE
){option}"""


def _rebuild_backlog(option: str) -> None:
    # In the migration's transaction: an append waits for it, none is lost meanwhile.
    op.execute(_BACKLOG_DDL.format(option=option))
    op.execute(
        "INSERT INTO search_backlog_rebuilt (session_id, first_seq, count) "
        "SELECT session_id, first_seq, count FROM search_backlog"
    )
    op.execute("DROP TABLE search_backlog")
    op.execute("ALTER TABLE search_backlog_rebuilt RENAME TO search_backlog")


def downgrade() -> None:
    # The lag is at most a granularity (1 s): folded into last_active_at, nothing of the
    # listing's order is lost. Done in Python: the time arithmetic differs per backend.
    bind = op.get_bind()
    if bind.dialect.name == "postgresql":
        op.execute(
            # In UTC's wall time: timestamp + interval and AT TIME ZONE are immutable
            # (timestamptz + interval is only stable, which Citus refuses in an UPDATE).
            "UPDATE sessions SET last_active_at = (last_active_at AT TIME ZONE 'UTC' "
            "+ last_active_lag_us * interval '1 microsecond') AT TIME ZONE 'UTC' "
            "WHERE last_active_lag_us <> 0"
        )
        _storage_parameter("RESET (fillfactor)")
    else:
        # SQLite stores the time as SQLAlchemy's text ("YYYY-MM-DD HH:MM:SS.ffffff").
        _rebuild_backlog("")
        op.execute(
            "UPDATE sessions SET last_active_at = strftime('%Y-%m-%d %H:%M:%f000', "
            "julianday(last_active_at) + last_active_lag_us / 86400000000.0) "
            "WHERE last_active_lag_us <> 0"
        )
    # Plain DROP COLUMN on both (SQLite 3.35+): the column is in no index or constraint.
    op.execute("ALTER TABLE sessions DROP COLUMN last_active_lag_us")
