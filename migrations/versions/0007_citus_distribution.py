"""Citus: distribute the schema by session id (a no-op on plain PostgreSQL and SQLite)

On a Citus coordinator (a database with the ``citus`` extension), every session-scoped
table is hash-distributed by session id, co-located with ``sessions`` (distributed by
``id``), and every other table (``search_index_state``) becomes a reference table; see
:func:`sessionrepo.dialects.citus.distribute_schema`, which runs here under the
migration's advisory lock. It is idempotent: a table Citus knows already is left alone.

Later revisions: Citus propagates DDL on distributed tables (``ADD COLUMN``, indexes) by
itself. A revision that *creates* a table calls ``distribute_schema(op.get_bind())`` at
its end, so the new table is distributed (it has a ``session_id`` column) or made a
reference table like the rest; until then it is a plain table on the coordinator (Citus
13.2 accepts its foreign key to ``sessions`` there, and keeps it when distributing). A
revision that runs before this one needs nothing: this one distributes what it made.

The downgrade turns the tables back into plain tables on the coordinator (their rows
come back), so every older revision downgrades as on plain PostgreSQL.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

from sessionrepo.dialects.citus import distribute_schema, undistribute_schema

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    if op.get_context().dialect.name == "postgresql" and not op.get_context().as_sql:
        distribute_schema(op.get_bind())


def downgrade() -> None:
    if op.get_context().dialect.name == "postgresql" and not op.get_context().as_sql:
        undistribute_schema(op.get_bind())
