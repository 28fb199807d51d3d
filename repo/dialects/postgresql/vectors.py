"""PostgreSQL's nearest vectors by pgvector's HNSW index, where migration 0021 made one.

The index is over ``message_embeddings.ann_vector``, a column the database generates
from the int8 bytes (pgvector's ``halfvec`` of 512 values; NULL for vectors of another
size). int8 values are exact in half precision, so the index's order is the
brute-force scan's; its answer is approximate (HNSW). The rows' int8 vectors are
returned, for the caller to score exactly as the scan does.

A filtered query (a source, a user, a role, a time range) takes the index's
:data:`_OVERFETCH` times as many nearest rows and keeps those that pass (a plan that
joined first would read and sort every matching row). ``hnsw.iterative_scan =
relaxed_order`` lets the index scan go on past ``hnsw.ef_search`` rows until its
``LIMIT`` is met, so that rows row-level security hides from a tenant's role (the index
holds every tenant's) do not make it short. An answer still short (fewer rows passed,
or pgvector stopped the scan at ``hnsw.max_scan_tuples``) is not used: the caller scans
the vectors exactly.
"""

from __future__ import annotations

from typing import Any, Final

from sqlalchemy import Connection, text

from sessionrepo.dialects.base import NearVector, SearchRole
from sessionrepo.search.query import SearchFilters

#: What migration 0021 indexes (frozen there; the two must agree).
ANN_INDEX: Final = "ix_message_embeddings_ann"
ANN_DIMENSION: Final = 512
_TARGET: Final = f"CAST(:target AS halfvec({ANN_DIMENSION}))"
#: ``hnsw.ef_search``, the candidates the index's search keeps: pgvector's maximum
#: (its default is 40). Recall over a few milliseconds: of the exact ten at 100,000
#: messages (the benchmark's words stand-in) it found 0.92 at 100 (6.3 ms a query),
#: 0.96 at 400 (9.3 ms), 0.98 at 1,000 (13 ms).
_EF_SEARCH: Final = 1000
#: How many of the index's nearest rows a filtered query reads for each it needs: a
#: filter that passes one row in this many or more is answered from them.
_OVERFETCH: Final = 20
#: The filters the index answers with, each one's condition and the table it needs
#: joined (checked on the index's nearest rows).
_FILTERS: Final = (
    ("source", "s.source = :f_source", "s"),
    ("user_id", "s.user_id = :f_user_id", "s"),
    ("role", "m.role = :f_role", "m"),
    ("since", "m.timestamp >= :f_since", "m"),
    ("until", "m.timestamp < :f_until", "m"),
)
_JOINS: Final = {
    "m": " JOIN messages m ON m.session_id = n.session_id AND m.seq = n.seq",
    "s": " JOIN sessions s ON s.id = n.session_id",
}
#: The index's nearest rows (with their int8 vectors: the caller scores them exactly).
_NEAREST: Final = (
    "SELECT e.session_id, e.seq, e.content_hash, e.vector FROM message_embeddings e "
    f"ORDER BY e.ann_vector <#> {_TARGET} LIMIT :scan"
)


def _nearest_sql(filters: SearchFilters) -> tuple[str, dict[str, Any], bool]:
    """The statement, its filters' parameters, and whether it filters."""
    joins: list[str] = []
    conditions: list[str] = []
    params: dict[str, Any] = {}
    for name, condition, table in _FILTERS:
        value = getattr(filters, name)
        if value is None:
            continue
        params[f"f_{name}"] = value
        conditions.append(condition)
        if _JOINS[table] not in joins:
            joins.append(_JOINS[table])
    if not conditions:
        return _NEAREST, params, False
    sql = (  # the nearest once (MATERIALIZED), then joined
        f"WITH n AS MATERIALIZED ({_NEAREST}) SELECT n.session_id, n.seq, n.content_hash, "
        f"n.vector FROM n{''.join(joins)} WHERE {' AND '.join(conditions)}"
    )
    return sql, params, True


class PostgresVectors(SearchRole):
    """:meth:`SearchRole.nearest_vectors` by the HNSW index."""

    def nearest_vectors(
        self, connection: Connection, target: bytes, depth: int, filters: SearchFilters
    ) -> list[NearVector] | None:
        if len(target) != ANN_DIMENSION or filters.session_id is not None:
            return None  # one session's vectors: fewer than an index scan would read
        # Whether the index is there, and, for this transaction: the index's search
        # width; its scan going on until the LIMIT is met; and the plan through the
        # index, never a sequential scan and a sort of every vector (at 1,000,000 rows
        # the planner's estimate chose that for a LIMIT of a few hundred: a second
        # instead of milliseconds). One round trip; the settings end with the read.
        index = connection.exec_driver_sql(
            "SELECT to_regclass(%(name)s), set_config('hnsw.ef_search', %(ef)s, true), "
            "set_config('hnsw.iterative_scan', 'relaxed_order', true), "
            "set_config('enable_seqscan', 'off', true)",
            {"name": ANN_INDEX, "ef": str(_EF_SEARCH)},
        )
        if index.scalar() is None:
            return None
        sql, params, filtered = _nearest_sql(filters)
        scan = depth * _OVERFETCH if filtered else depth
        literal = "[" + ",".join(map(str, memoryview(target).cast("b").tolist())) + "]"
        rows = connection.execute(text(sql), {**params, "target": literal, "scan": scan}).all()
        if len(rows) < depth:
            # Short: the store holds fewer, fewer of the nearest pass the filters, or the
            # scan stopped at pgvector's bound (hnsw.max_scan_tuples) before enough rows
            # passed row-level security; the caller's exact scan answers.
            return None
        return [((row[0], int(row[1])), bytes(row[2]), bytes(row[3])) for row in rows]
