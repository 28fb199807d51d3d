"""PostgreSQL's nearest vectors by pgvector's HNSW index, where migration 0021 made one.

The index is over ``sessionrepo_int8_halfvec(vector)::halfvec(512)`` (the stored int8
bytes as pgvector's half-precision vectors), partial on ``length(vector) = 512``; the
query below repeats that expression and predicate, so that the planner takes the index.
Its inner product is the int8 dot product the brute-force scan computes (int8 values are
exact in half precision, the products' sum exact in single precision), so a score means
the same on either path; the index's answer is approximate (HNSW), ordered by score here.

``hnsw.iterative_scan = relaxed_order`` lets the index scan go on past
``hnsw.ef_search`` rows until the ``LIMIT`` is met, so rows that row-level security
hides from a tenant's role (the index holds every tenant's) cannot make the answer
short; ``relaxed_order`` may return them slightly out of order, hence the sort.
"""

from __future__ import annotations

from typing import Final

from sqlalchemy import Connection, text

from sessionrepo.dialects.base import NearVector, SearchRole

#: What migration 0021 indexes (frozen there; the two must agree).
ANN_INDEX: Final = "ix_message_embeddings_ann"
ANN_DIMENSION: Final = 512
_EXPRESSION: Final = f"sessionrepo_int8_halfvec(e.vector)::halfvec({ANN_DIMENSION})"
_TARGET: Final = f"CAST(:target AS halfvec({ANN_DIMENSION}))"
_NEAREST: Final = text(
    f"SELECT e.session_id, e.seq, e.content_hash, -({_EXPRESSION} <#> {_TARGET}) AS score "
    "FROM message_embeddings e "
    f"WHERE e.vector IS NOT NULL AND length(e.vector) = {ANN_DIMENSION} "
    f"ORDER BY {_EXPRESSION} <#> {_TARGET} LIMIT :depth"
)
#: ``hnsw.ef_search``'s bounds: pgvector's default (40) and its maximum (1,000).
_EF_SEARCH: Final = (40, 1000)


class PostgresVectors(SearchRole):
    """:meth:`SearchRole.nearest_vectors` by the HNSW index."""

    def nearest_vectors(
        self, connection: Connection, target: bytes, depth: int
    ) -> list[NearVector] | None:
        if len(target) != ANN_DIMENSION:
            return None
        index = connection.exec_driver_sql("SELECT to_regclass(%(name)s)", {"name": ANN_INDEX})
        if index.scalar() is None:
            return None
        low, high = _EF_SEARCH
        connection.exec_driver_sql(
            "SELECT set_config('hnsw.ef_search', %(ef)s, true), "
            "set_config('hnsw.iterative_scan', 'relaxed_order', true)",
            {"ef": str(min(high, max(low, depth)))},
        )
        literal = "[" + ",".join(str(value) for value in _signed(target)) + "]"
        rows = connection.execute(_NEAREST, {"target": literal, "depth": depth}).all()
        found = [((row[0], int(row[1])), float(row[3]), bytes(row[2])) for row in rows]
        found.sort(key=lambda near: (-near[1], near[0]))
        return found


def _signed(vector: bytes) -> list[int]:
    return [value - 256 if value > 127 else value for value in vector]
