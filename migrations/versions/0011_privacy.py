"""Erasure: tombstones, the store's tombstone key and the privacy audit

- ``privacy_keys``: one row, ``tombstone``, a random 32-byte HMAC key made here: the key
  of every tombstone hash (a copy of the tombstone tables alone names nobody).
- ``erased_sessions`` (keyed hash of an erased session's id, when, its audit row) and
  ``erased_messages`` (keyed hashes of an erased message's session id and key): what
  every write path consults, so nothing erased is stored again.
- ``privacy_audit``: one content-free row per erase or retention run.
- ``retention_policies``: per source (``*``: the default), how many days ended sessions,
  idle open sessions and retracted or compacted history are kept.

No table holds a session id in clear, so none has a ``session_id`` column: on Citus they
are reference tables (0007's pattern, a no-op without the extension).

Revision ID: 0011
Revises: 0009
Create Date: 2026-12-02
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TABLES = (
    "retention_policies",
    "privacy_audit",
    "erased_messages",
    "erased_sessions",
    "privacy_keys",
)

# A frozen copy of sessionrepo.dialects.citus as of revision 0008 (its distribute_schema
# and the helpers it calls): a revision's meaning must not change when library code does.
_DETECT = "SELECT extversion FROM pg_extension WHERE extname = 'citus'"
#: The table every session-scoped table is co-located with, and its distribution column.
_ANCHOR = ("sessions", "id")
#: The distribution column of every other session-scoped table.
_SESSION_COLUMN = "session_id"
#: Tables that stay plain tables on the coordinator.
_LOCAL_TABLES = frozenset({"alembic_version"})
#: The tables this revision distributes: sessionrepo's own, never an application's
#: table in the same schema (as 0007 and 0008 do).
_OWN_TABLES = frozenset(
    {"privacy_keys", "erased_sessions", "erased_messages", "privacy_audit", "retention_policies"}
)


def _has_citus(connection: sa.Connection) -> bool:
    return connection.exec_driver_sql(_DETECT).first() is not None


def _tables(connection: sa.Connection) -> dict[str, set[str]]:
    """The ordinary tables of the current schema and their columns."""
    rows = connection.exec_driver_sql(
        "SELECT c.relname, a.attname FROM pg_class c "
        "JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped "
        "WHERE c.relkind IN ('r', 'p') AND c.relnamespace = current_schema()::regnamespace"
    )
    tables: dict[str, set[str]] = {}
    for table, column in rows:
        tables.setdefault(table, set()).add(column)
    return tables


def _distributed(connection: sa.Connection) -> dict[str, str]:
    """``{table: method}`` of the current schema's tables Citus knows (``h``: hash
    distributed, ``n``: reference)."""
    rows = connection.exec_driver_sql(
        "SELECT c.relname, p.partmethod FROM pg_dist_partition p "
        "JOIN pg_class c ON c.oid = p.logicalrelid "
        "WHERE c.relnamespace = current_schema()::regnamespace"
    )
    return {str(table): str(method) for table, method in rows}


def _plan(tables: dict[str, set[str]]) -> list[tuple[str, str | None]]:
    """``(table, distribution column)`` for every table to distribute, the anchor first;
    ``None`` for a reference table."""
    anchor, anchor_column = _ANCHOR
    planned: list[tuple[str, str | None]] = []
    if anchor in tables:
        planned.append((anchor, anchor_column))
    for name in sorted(tables):
        if name == anchor or name in _LOCAL_TABLES or name not in _OWN_TABLES:
            continue
        planned.append((name, _SESSION_COLUMN if _SESSION_COLUMN in tables[name] else None))
    return planned


def _distribute_schema(connection: sa.Connection) -> list[str]:
    """Distribute every table of :data:`_OWN_TABLES` that Citus does not know yet;
    idempotent; a no-op without the ``citus`` extension."""
    if not _has_citus(connection):
        return []
    known = _distributed(connection)
    done: list[str] = []
    anchor = _ANCHOR[0]
    for table, column in _plan(_tables(connection)):
        if table in known:
            continue
        if column is None:
            connection.execute(sa.text("SELECT create_reference_table(:t)"), {"t": table})
            connection.execute(
                sa.text("SELECT truncate_local_data_after_distributing_table(:t)"), {"t": table}
            )
        elif table == anchor:
            connection.execute(
                sa.text("SELECT create_distributed_table(:t, :c)"), {"t": table, "c": column}
            )
        else:
            connection.execute(
                sa.text("SELECT create_distributed_table(:t, :c, colocate_with => :a)"),
                {"t": table, "c": column, "a": anchor},
            )
        done.append(table)
    return done


def upgrade() -> None:
    digest = sa.LargeBinary(32)
    time = sa.DateTime(timezone=True)
    op.create_table(
        "privacy_keys",
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("hmac_key", sa.LargeBinary(64), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_privacy_keys"),
    )
    op.create_table(
        "erased_sessions",
        sa.Column("session_hash", digest, nullable=False),
        sa.Column("erased_at", time, nullable=False),
        sa.Column("audit_id", sa.Uuid(), nullable=False),
        sa.PrimaryKeyConstraint("session_hash", name="pk_erased_sessions"),
    )
    op.create_table(
        "erased_messages",
        sa.Column("session_hash", digest, nullable=False),
        sa.Column("key_hash", digest, nullable=False),
        sa.PrimaryKeyConstraint("session_hash", "key_hash", name="pk_erased_messages"),
    )
    op.create_table(
        "privacy_audit",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("at", time, nullable=False),
        sa.Column("action", sa.String(16), nullable=False),
        sa.Column("actor", sa.String(255), nullable=True),
        sa.Column("selector_kind", sa.String(16), nullable=False),
        sa.Column("selector_hash", sa.String(64), nullable=False),
        sa.Column("counts", sa.Text(), nullable=False),
        sa.Column("note", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_privacy_audit"),
    )
    op.create_index("ix_privacy_audit_at", "privacy_audit", ["at"])
    op.create_table(
        "retention_policies",
        sa.Column("source", sa.String(255), nullable=False),
        sa.Column("ended_days", sa.BigInteger(), nullable=True),
        sa.Column("idle_days", sa.BigInteger(), nullable=True),
        sa.Column("superseded_days", sa.BigInteger(), nullable=True),
        sa.Column("updated_at", time, nullable=False),
        sa.PrimaryKeyConstraint("source", name="pk_retention_policies"),
    )
    # The key is made here, once per store, in SQL text (``alembic upgrade --sql`` prints
    # it: that script is then as secret as the key). SQLite's randomblob() is its
    # cryptographic generator; PostgreSQL has none built in without pgcrypto.
    if op.get_context().dialect.name == "sqlite":
        op.execute("INSERT INTO privacy_keys (name, hmac_key) VALUES ('tombstone', randomblob(32))")
    else:
        op.execute(
            "INSERT INTO privacy_keys (name, hmac_key) "
            f"VALUES ('tombstone', decode('{os.urandom(32).hex()}', 'hex'))"
        )
    if op.get_context().dialect.name == "postgresql" and not op.get_context().as_sql:
        _distribute_schema(op.get_bind())


def downgrade() -> None:
    op.drop_index("ix_privacy_audit_at", table_name="privacy_audit")
    for table in _TABLES:
        op.drop_table(table)
