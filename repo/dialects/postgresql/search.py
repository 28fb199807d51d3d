"""PostgreSQL's search index: a ``tsvector`` table with a GIN index and b-trees on the
message time; a search chooses between them by measuring."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final

from sqlalchemy import Connection, Row, text

from sessionrepo.dialects.base import IndexEntry, SearchOrder, SearchRole
from sessionrepo.dialects.hits import bind_times, page_of_hits, run_search
from sessionrepo.errors import TenantMismatch
from sessionrepo.search.query import Query, SearchFilters

#: The search index (the migrations made it so; a test checks they agree). The indexes
#: are built apart from the table: a rebuild drops them and builds them after the rows.
_SEARCH_TABLE_DDL = (
    "CREATE TABLE message_search ("
    " session_id VARCHAR(255) NOT NULL,"
    " seq BIGINT NOT NULL,"
    " ts TIMESTAMP WITH TIME ZONE NOT NULL,"
    " role VARCHAR(16) NOT NULL,"
    " document TSVECTOR NOT NULL,"
    " tenant VARCHAR(63) DEFAULT CURRENT_USER NOT NULL,"
    " CONSTRAINT pk_message_search PRIMARY KEY (session_id, seq, tenant))"
)
#: Whether the policies hold this connection (a tenant's role), so that it sees its own rows.
_POLICIES_HOLD = "SELECT row_security_active('message_search')"
#: Whether a message is stored of a tenant other than the connecting role.
_OTHER_TENANTS_MESSAGES = (
    "SELECT EXISTS (SELECT 1 FROM messages WHERE tenant <> CAST(current_user AS text))"
)
_SEARCH_INDEX_DDL = (
    "CREATE INDEX ix_message_search_ts ON message_search (ts)",
    "CREATE INDEX ix_message_search_session_ts ON message_search (session_id, ts)",
    "CREATE INDEX ix_message_search_document ON message_search USING gin (document)",
)


def _one_tenant_seen(connection: Connection) -> bool:
    return bool(connection.exec_driver_sql(_POLICIES_HOLD).scalar())


class PostgresSearch(SearchRole):
    """The ``message_search`` table's statements."""

    search_index_ddl = (_SEARCH_TABLE_DDL, *_SEARCH_INDEX_DDL)

    #: Text search configuration of the index and the queries. ``simple`` (no stemming,
    #: no stop words) is language-neutral and matches SQLite; another one (``english``)
    #: stems words, and then search results are not verified against the text.
    search_config = "simple"

    #: The search transaction's planner settings (``SET LOCAL``, sent in one round trip
    #: before its first statement).
    search_settings: tuple[str, ...] = (
        "jit = off",
        "max_parallel_workers_per_gather = 0",
        "enable_seqscan = off",
    )

    def index_documents(
        self, connection: Connection, session_id: str, seqs: Sequence[int], documents: Sequence[str]
    ) -> int:
        # The timestamp and role come from the rows just inserted (one statement).
        return int(
            connection.exec_driver_sql(
                "INSERT INTO message_search (session_id, seq, ts, role, document) "
                "SELECT m.session_id, m.seq, m.timestamp, coalesce(m.role, ''), "
                "to_tsvector(%(cfg)s::regconfig, d.body) "
                "FROM unnest(%(seqs)b::bigint[], %(bodies)b::text[]) AS d(seq, body) "
                "JOIN messages m ON m.session_id = %(sid)s AND m.seq = d.seq",
                {
                    "sid": session_id,
                    "cfg": self.search_config,
                    "seqs": list(seqs),
                    "bodies": list(documents),
                },
            ).rowcount
        )

    def index_entries(self, connection: Connection, entries: Sequence[IndexEntry]) -> None:
        if not entries:
            return
        sids, seqs, stamps, roles, bodies = (list(column) for column in zip(*entries, strict=True))
        connection.exec_driver_sql(
            "INSERT INTO message_search (session_id, seq, ts, role, document) "
            "SELECT d.sid, d.seq, d.ts, coalesce(d.role, ''), "
            "to_tsvector(%(cfg)s::regconfig, d.body) "
            "FROM unnest(%(sids)b::text[], %(seqs)b::bigint[], %(stamps)b::timestamptz[], "
            "%(roles)b::text[], %(bodies)b::text[]) AS d(sid, seq, ts, role, body)",
            {
                "cfg": self.search_config,
                "sids": sids,
                "seqs": seqs,
                "stamps": stamps,
                "roles": roles,
                "bodies": bodies,
            },
        )

    def reset_search_index(self, connection: Connection) -> None:
        # Appends wait (the share lock) until the rebuild commits; the indexes are
        # built once over the whole table, after the rows, not maintained row by row.
        connection.exec_driver_sql("LOCK TABLE messages IN SHARE MODE")
        # Catch-ups in progress finish first and later ones wait (plain reads do not):
        # the rebuild then empties a backlog nobody holds, and no catch-up can be
        # waiting for message_search while this transaction waits for its rows.
        connection.exec_driver_sql("LOCK TABLE search_backlog IN EXCLUSIVE MODE")
        if _one_tenant_seen(connection):
            # A tenant's role (the policies hold it): it rebuilds its own entries, which
            # are all it sees and all the rebuild writes (another tenant's stay).
            connection.exec_driver_sql("DELETE FROM message_search")
            return
        # Every row is this role's to rebuild (a store of one tenant, rebuilt by it or by
        # the schema owner or an administrator): the rows the rebuild writes get the
        # connecting role as their tenant, so a role the policies do not hold may not
        # rebuild other tenants' entries.
        if connection.exec_driver_sql(_OTHER_TENANTS_MESSAGES).scalar():
            raise TenantMismatch(
                "this store holds several tenants' messages: rebuild the search index as "
                "each tenant (its URL from `sessionrepo tenants create`), each rebuild "
                "its own entries"
            )
        connection.exec_driver_sql("TRUNCATE message_search")
        connection.exec_driver_sql("DROP INDEX IF EXISTS ix_message_search_document")
        connection.exec_driver_sql("DROP INDEX IF EXISTS ix_message_search_ts")
        connection.exec_driver_sql("DROP INDEX IF EXISTS ix_message_search_session_ts")

    def finish_search_index(self, connection: Connection) -> None:
        if _one_tenant_seen(connection):
            connection.exec_driver_sql("ANALYZE message_search")
            return  # the indexes stayed (a tenant rebuilds its own rows only)
        connection.exec_driver_sql("SET LOCAL maintenance_work_mem = '256MB'")
        for statement in _SEARCH_INDEX_DDL:
            connection.exec_driver_sql(statement)
        connection.exec_driver_sql("ANALYZE message_search")

    def forget_search_entries(
        self, connection: Connection, session_id: str, seqs: Sequence[int]
    ) -> None:
        if seqs:
            connection.exec_driver_sql(
                "DELETE FROM message_search WHERE session_id = %(sid)s AND seq = ANY(%(seqs)s)",
                {"sid": session_id, "seqs": list(seqs)},
            )

    def forget_search_documents(self, connection: Connection, session_ids: Sequence[str]) -> None:
        self._forget_backlog(connection, session_ids)
        connection.exec_driver_sql(
            "DELETE FROM message_search WHERE session_id = ANY(%(ids)s)",
            {"ids": list(session_ids)},
        )

    def search_messages(
        self,
        connection: Connection,
        query: Query,
        filters: SearchFilters,
        *,
        order: SearchOrder,
        limit: int,
        offset: int,
        window: int,
    ) -> list[Row[Any]]:
        return _pg_search(
            connection,
            self.search_config,
            self.search_rows_estimate,
            query,
            filters,
            settings=self.search_settings,
            order=order,
            limit=limit,
            offset=offset,
            window=window,
        )

    def search_rows_estimate(self, connection: Connection) -> float:
        """The planner's estimate of the rows in ``message_search`` (a search's probe
        weighs the two ways to the newest matches by it)."""
        return float(
            connection.exec_driver_sql(
                "SELECT reltuples FROM pg_class WHERE oid = CAST('message_search' AS regclass)"
            ).scalar_one()
        )

    def probe_search_index(self, connection: Connection) -> None:
        connection.exec_driver_sql(
            "SELECT session_id, seq, ts, role, document FROM message_search "
            "WHERE document @@ CAST('sessionrepo' AS tsquery) LIMIT 1"
        ).all()


#: Rows of the newest end of ``message_search`` read to measure how common a query is.
_PG_PROBE_ROWS: Final = 500


def _pg_search(
    connection: Connection,
    config: str,
    rows_estimate: Callable[[Connection], float],
    query: Query,
    filters: SearchFilters,
    *,
    settings: Sequence[str],
    order: SearchOrder,
    limit: int,
    offset: int,
    window: int,
) -> list[Row[Any]]:
    """Two ways to the newest matches, chosen by measuring, not by the planner's guess
    (its estimates for words it has no statistics for are off by orders of magnitude):
    walk the ``ts`` (or ``(session_id, ts)``) index from the newest row, testing each
    document (cheap when the query is common), or take every match from the GIN index
    and sort them by time (cheap when it is rare). A probe of the newest 500 rows
    measures which. Either way the answer is the same; only its cost differs."""
    params: dict[str, Any] = {"cfg": config, "limit": limit, "offset": offset}
    parts: list[str] = []
    for index, term in enumerate(query.terms):
        name = f"t{index}"
        if term.prefix:
            params[name] = term.words[0]
            part = f"to_tsquery(CAST(:cfg AS regconfig), quote_literal(:{name}) || ':*')"
        else:
            params[name] = " ".join(term.words)
            part = f"phraseto_tsquery(CAST(:cfg AS regconfig), :{name})"
        parts.append(f"!! {part}" if term.excluded else part)
    tsquery = "(" + " && ".join(parts) + ")"
    time_clauses: list[str] = []
    clauses: list[str] = []
    for name, value, clause, kind in (
        ("since", filters.since, "ms.ts >= :f_since", time_clauses),
        ("until", filters.until, "ms.ts < :f_until", time_clauses),
        ("session_id", filters.session_id, "ms.session_id = :f_session_id", clauses),
        ("role", filters.role, "ms.role = :f_role", clauses),
        ("source", filters.source, "s.source = :f_source", clauses),
        ("user_id", filters.user_id, "s.user_id = :f_user_id", clauses),
    ):
        if value is not None:
            kind.append(clause)
            params[f"f_{name}"] = value
    joins = ""
    if filters.source is not None or filters.user_id is not None:
        joins = " JOIN sessions s ON s.id = ms.session_id"
        if filters.session_id is not None:
            joins += " AND s.id = :f_session_id"  # routed whole on Citus
    need = window if order == "rank" else offset + limit
    connection.exec_driver_sql("; ".join(f"SET LOCAL {setting}" for setting in settings))
    # The probe: the newest rows (of the session, with a session filter), how many match
    # the query with every filter, how many the query alone.
    scope = "".join(f" AND {clause}" for clause in time_clauses)
    if filters.session_id is not None:
        scope += " AND ms.session_id = :f_session_id"
    probe = (
        f"SELECT count(*) FILTER (WHERE ms.document @@ {tsquery}"
        + "".join(f" AND {clause}" for clause in clauses)
        + f"), count(*) FILTER (WHERE ms.document @@ {tsquery}), count(*) "
        "FROM (SELECT ms.session_id, ms.role, ms.document FROM message_search ms "
        f"WHERE true{scope} ORDER BY ms.ts DESC LIMIT :probe) ms{joins}"
    )
    probe_params = params | {"probe": _PG_PROBE_ROWS}
    hits, term_hits, scanned = connection.execute(
        bind_times(text(probe), probe_params), probe_params
    ).one()
    density = hits / scanned if scanned else 0.0
    if not hits and term_hits and (filters.source or filters.user_id):
        # The newest rows come from a few sessions (a session's messages are close in
        # time): the share of recently active sessions the filters keep is the better
        # guess of how many of the rows walked they keep.
        kept = connection.execute(
            text(
                "SELECT avg(CASE WHEN true"
                + "".join(f" AND {c}" for c in clauses if c.startswith("s."))
                + " THEN 1.0 ELSE 0.0 END) FROM (SELECT s.source, s.user_id FROM sessions s "
                "ORDER BY s.last_active_at DESC LIMIT 200) s"
            ),
            params,
        ).scalar()
        density = term_hits / scanned * float(kept or 0.0)
    if scanned < _PG_PROBE_ROWS:
        walk = True  # the probe read every candidate row: so will the walk
    elif not density:
        walk = False
    elif filters.session_id is not None:
        walk = True  # a walk reads the session's rows at most; the GIN way, every match
    else:
        # Rows the walk tests (each one's document read and matched), against the
        # matches of the query the GIN way reads: their time only (a third of the work)
        # unless the index cannot decide alone (a phrase, an exclusion: every candidate
        # document is read again).
        recheck = any(len(term.words) > 1 or term.excluded for term in query.terms)
        walk_rows = need / density * (1 if recheck else 3)
        total = rows_estimate(connection)
        walk = walk_rows <= term_hits / scanned * max(total, float(scanned))
    connection.exec_driver_sql(
        "SET LOCAL enable_bitmapscan = off" if walk else "SET LOCAL enable_indexscan = off"
    )
    where = "".join(f" AND {clause}" for clause in (*time_clauses, *clauses))
    newest = (
        f"FROM message_search ms{joins} WHERE ms.document @@ {tsquery}{where} "
        "ORDER BY ms.ts DESC, ms.session_id DESC, ms.seq DESC"
    )
    if order == "newest":
        matches = (
            "SELECT ms.session_id AS session_id, ms.seq AS seq, ms.ts AS ts, 0.0 AS rank "
            f"{newest} LIMIT :limit OFFSET :offset"
        )
        outer = "top.ts DESC, top.session_id DESC, top.seq DESC"
    else:
        matches = (
            f"SELECT w.session_id, w.seq, w.ts, ts_rank(w.document, {tsquery}) AS rank "
            f"FROM (SELECT ms.session_id, ms.seq, ms.ts, ms.document {newest} "
            "LIMIT :window) w "
            "ORDER BY rank DESC, w.ts DESC, w.session_id DESC, w.seq DESC "
            "LIMIT :limit OFFSET :offset"
        )
        params["window"] = window
        outer = "top.rank DESC, top.ts DESC, top.session_id DESC, top.seq DESC"
    one_session = filters.session_id is not None
    return run_search(connection, page_of_hits(matches, outer, one_session=one_session), params)
