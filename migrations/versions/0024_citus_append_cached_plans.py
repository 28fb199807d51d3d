"""Citus: the append function's statements keep their plans between calls

Since 0014 ``sessionrepo_append`` has run with ``plan_cache_mode = force_custom_plan``,
so every statement of its body was planned anew on every call; on a worker that is Citus's
distributed planner and then the shard's own plan, each time, for each of the four or
five statements an append runs. With ``auto`` (PostgreSQL's default, set on the function
here so that a server or role set to ``force_generic_plan`` does not reach it), PL/pgSQL
keeps each statement's generic plan on the worker's connection after its first five
calls, and Citus prunes it to the session's shard when it runs (its deferred pruning,
from the session id the call was given). A statement Citus cannot plan without the
parameters' values (the batch's ``INSERT … SELECT`` from the arrays, for one) gets an
exorbitant generic cost from Citus, so PostgreSQL keeps planning it for each call, as
before; under ``force_generic_plan`` that statement would fail instead ("could not create
distributed plan"), which is why the function names its mode rather than inheriting one.

Measured on a 2-worker cluster on one machine (the function called alone, interleaved,
medians): 1 message 2.19 → 1.95 ms, 10 messages 2.94 → 2.68 ms, 100 messages 6.87 →
4.92 ms. Nothing stored changes; the function's body and signature are 0023's.
``ALTER FUNCTION`` on a distributed function reaches every node. The downgrade puts the
forced custom plans back. Citus only: a no-op on plain PostgreSQL and SQLite.

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-07
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op
from sqlalchemy import Connection

revision: str = "0024"
down_revision: str | None = "0023"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_DETECT = "SELECT extversion FROM pg_extension WHERE extname = 'citus'"

#: The function (its name is unique in the schema, so no argument list is needed).
FUNCTION = "sessionrepo_append"


def _applies() -> Connection | None:
    """The migration's connection on a Citus coordinator whose ``sessions`` is
    distributed (where the function is), else ``None``."""
    if op.get_context().dialect.name != "postgresql" or op.get_context().as_sql:
        return None
    connection = op.get_bind()
    if connection.exec_driver_sql(_DETECT).first() is None:
        return None
    distributed = connection.exec_driver_sql(
        "SELECT 1 FROM pg_dist_partition p JOIN pg_class c ON c.oid = p.logicalrelid "
        "WHERE c.relname = 'sessions' AND c.relnamespace = current_schema()::regnamespace"
    ).first()
    return connection if distributed is not None else None


def upgrade() -> None:
    connection = _applies()
    if connection is not None:
        connection.exec_driver_sql(f"ALTER FUNCTION {FUNCTION} SET plan_cache_mode = auto")


def downgrade() -> None:
    connection = _applies()
    if connection is not None:
        connection.exec_driver_sql(
            f"ALTER FUNCTION {FUNCTION} SET plan_cache_mode = force_custom_plan"
        )
