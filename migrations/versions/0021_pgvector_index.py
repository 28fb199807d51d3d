"""semantic index: pgvector's HNSW index over the vectors, where the database has pgvector

Only on plain PostgreSQL whose database has the ``vector`` extension installed, at 0.8.0
or later (``CREATE EXTENSION vector`` is the operator's, before ``sessionrepo migrate``;
sessionrepo never requires it); elsewhere, SQLite and Citus included, a no-op.

The vectors stay what they are, ``message_embeddings.vector`` as int8 bytes, the copy the
catch-up writes and the cache and the brute-force scan read. Beside it, a generated
column the database fills, ``ann_vector``: the same values as pgvector's ``halfvec`` of
:data:`DIMENSION` (the default model's) values, NULL for a vector of another size (a
store of another model has no index and searches by brute force, as without pgvector).
int8 values are exact in half precision, and the inner product of two of them is the
int8 dot product the scan computes. ``sessionrepo_int8_halfvec`` converts the bytes
(0.17 ms a row: a generated column converts each row once, where an index over the
expression would convert it again for each row a query returns). The HNSW index is over
``ann_vector`` by inner product; ``sessionrepo.dialects.postgresql.vectors`` queries it.

On a store that has vectors already, the upgrade rewrites ``message_embeddings`` and
builds the index: minutes for a million rows.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import context, op

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: Frozen: the default model's dimension (Universal Sentence Encoder multilingual, 512).
DIMENSION = 512
_INDEX = "ix_message_embeddings_ann"
_COLUMN = "ann_vector"
_FUNCTION = "sessionrepo_int8_halfvec"
#: pgvector 0.8.0 (2024-10) has halfvec and iterative index scans (a filtered or
#: row-level-secured query that would otherwise come back short).
_MINIMUM = (0, 8)


def _plain_postgresql() -> bool:
    """PostgreSQL without Citus, on a live connection (a ``migrate --sql`` script is
    written for a database whose extensions it cannot see: it leaves the index out)."""
    connection = op.get_bind()
    if context.is_offline_mode() or connection.dialect.name != "postgresql":
        return False
    citus = connection.exec_driver_sql("SELECT 1 FROM pg_extension WHERE extname = 'citus'")
    return citus.first() is None


def _pgvector() -> bool:
    if not _plain_postgresql():
        return False
    row = (
        op.get_bind()
        .exec_driver_sql("SELECT extversion FROM pg_extension WHERE extname = 'vector'")
        .first()
    )
    if row is None:
        return False
    version = tuple(int(part) for part in str(row[0]).split(".")[:2] if part.isdigit())
    return version >= _MINIMUM


def upgrade() -> None:
    if not _pgvector():
        return
    # The signed bytes as reals: get_byte answers 0..255; flipping the top bit and
    # taking 128 away maps 0..127 to themselves and 128..255 to -128..-1.
    op.execute(
        f"CREATE FUNCTION {_FUNCTION}(v bytea) RETURNS halfvec "
        "LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$ "
        "SELECT array_agg(((get_byte(v, i) # 128) - 128)::real ORDER BY i)::halfvec "
        "FROM generate_series(0, length(v) - 1) AS i $$"
    )
    op.execute(
        f"ALTER TABLE message_embeddings ADD COLUMN {_COLUMN} halfvec({DIMENSION}) "
        f"GENERATED ALWAYS AS (CASE WHEN length(vector) = {DIMENSION} "
        f"THEN {_FUNCTION}(vector)::halfvec({DIMENSION}) END) STORED"
    )
    op.execute(f"CREATE INDEX {_INDEX} ON message_embeddings USING hnsw ({_COLUMN} halfvec_ip_ops)")


def downgrade() -> None:
    if not _plain_postgresql():
        return
    op.execute(f"DROP INDEX IF EXISTS {_INDEX}")
    op.execute(f"ALTER TABLE message_embeddings DROP COLUMN IF EXISTS {_COLUMN}")
    op.execute(f"DROP FUNCTION IF EXISTS {_FUNCTION}(bytea)")
