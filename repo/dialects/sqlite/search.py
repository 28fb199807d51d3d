"""SQLite's search index: an FTS5 table whose rowid is derived from the message time, so
the newest matches come first without a sort; relevance is scored here, over the newest
matches (FTS5's ``bm25()`` would count every match first)."""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from sqlalchemy import Connection, Row, select, text
from sqlalchemy import exc as sa_exc

from sessionrepo.dialects.base import LOOKUP_CHUNK, IndexEntry, SearchOrder, SearchRole
from sessionrepo.dialects.hits import bind_times, page_of_hits, run_search
from sessionrepo.models.tables import messages_table
from sessionrepo.search.query import Query, SearchFilters, Term
from sessionrepo.search.ranking import relevance

_M = messages_table.c

#: The search index (the migrations made it so; a test checks they agree).
_FTS_DDL = (
    "CREATE VIRTUAL TABLE messages_fts USING fts5("
    "session_id UNINDEXED, seq UNINDEXED, meta, body, "
    "tokenize = 'unicode61 remove_diacritics 2')"
)
_FTS_SHADOWS = ("data", "idx", "content", "docsize", "config")


class SQLiteSearch(SearchRole):
    """The FTS5 index's statements."""

    search_index_ddl = (_FTS_DDL,)

    def index_documents(
        self, connection: Connection, session_id: str, seqs: Sequence[int], documents: Sequence[str]
    ) -> int:
        with _fts5_damage():
            return _sqlite_index_documents(connection, session_id, seqs, documents)

    def index_entries(self, connection: Connection, entries: Sequence[IndexEntry]) -> None:
        with _fts5_damage():
            _sqlite_index_entries(connection, entries)

    def reset_search_index(self, connection: Connection) -> None:
        _sqlite_reset_search_index(connection)

    def forget_search_entries(
        self, connection: Connection, session_id: str, seqs: Sequence[int]
    ) -> None:
        for start in range(0, len(seqs), LOOKUP_CHUNK):
            chunk = list(seqs[start : start + LOOKUP_CHUNK])
            connection.exec_driver_sql(
                "DELETE FROM messages_fts WHERE rowid IN (SELECT rowid FROM messages_fts "
                "WHERE messages_fts MATCH ? AND session_id = ? "
                f"AND seq IN ({', '.join('?' * len(chunk))}))",
                (f'meta : "{_session_token(session_id)}"', session_id, *chunk),
            )

    def forget_search_documents(self, connection: Connection, session_ids: Sequence[str]) -> None:
        self._forget_backlog(connection, session_ids)
        _sqlite_forget(connection, session_ids)

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
        with _fts5_damage():
            return _sqlite_search(
                connection, query, filters, order=order, limit=limit, offset=offset, window=window
            )

    def probe_search_index(self, connection: Connection) -> None:
        # A MATCH reads the FTS5 structure record and a doclist, not only the schema.
        with _fts5_damage():
            connection.exec_driver_sql(
                "SELECT rowid, session_id, seq, meta, body FROM messages_fts "
                "WHERE messages_fts MATCH '\"sessionrepo\"' LIMIT 1"
            ).all()


@contextmanager
def _fts5_damage() -> Iterator[None]:
    """FTS5 statements: a garbled length in a damaged index record makes FTS5 ask for an
    absurd allocation and fail with SQLITE_NOMEM, which Python's sqlite3 raises as a bare
    ``MemoryError``, outside SQLAlchemy's ``DBAPIError``. Raised from one of the index's own
    statements it means a damaged index: reported as SQLITE_CORRUPT, so the index is marked
    stale (``reindex`` repairs it) instead of the error escaping the public API."""
    try:
        yield
    except MemoryError as exc:
        damaged = sqlite3.DatabaseError(f"the FTS5 index could not be read ({exc!r})")
        damaged.sqlite_errorcode = sqlite3.SQLITE_CORRUPT
        damaged.sqlite_errorname = "SQLITE_CORRUPT"
        raise sa_exc.DatabaseError("FTS5 statement", None, damaged) from exc


_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_MILLISECOND: Final = timedelta(milliseconds=1)
#: A message's FTS5 rowid is its timestamp in milliseconds shifted left by this many
#: bits; the low bits number the messages of one millisecond in the order they were
#: indexed. FTS5 walks its index in rowid order, so "newest first" and "the newest N
#: matches" stop after N rows instead of sorting every match.
_KEY_SLOT_BITS: Final = 8
_KEY_SLOTS: Final = 1 << _KEY_SLOT_BITS
_ROLES: Final = frozenset(("system", "developer", "user", "assistant", "tool", "function"))


def search_key(timestamp: datetime) -> int:
    """The smallest FTS5 rowid a message with this timestamp may get."""
    return ((timestamp - _EPOCH) // _MILLISECOND) << _KEY_SLOT_BITS


def _session_token(session_id: str) -> str:
    """The word standing for a session in the ``meta`` column (a hash: any session id
    becomes one ASCII word; a collision is filtered out by the exact ``session_id``)."""
    digest = hashlib.blake2b(session_id.encode("utf-8", "surrogatepass"), digest_size=8)
    return "s" + digest.hexdigest()


def _sqlite_index_documents(
    connection: Connection, session_id: str, seqs: Sequence[int], documents: Sequence[str]
) -> int:
    found = {
        seq: (timestamp, role)
        for seq, timestamp, role in connection.execute(
            select(_M.seq, _M.timestamp, _M.role).where(
                _M.session_id == session_id, _M.seq >= min(seqs), _M.seq <= max(seqs)
            )
        )
    }
    entries = [
        (session_id, seq, *found[seq], body)
        for seq, body in zip(seqs, documents, strict=True)
        if seq in found
    ]
    _sqlite_index_entries(connection, entries)
    return len(entries)


def _sqlite_index_entries(
    connection: Connection, entries: Sequence[tuple[str, int, datetime, str | None, str]]
) -> None:
    if not entries:
        return
    keys = _sqlite_allocate_keys(connection, [search_key(entry[2]) for entry in entries])
    rows = sorted(  # ascending rowids: FTS5 appends them to its pending segment
        (key, session_id, seq, f"{_session_token(session_id)} r{role or ''}", body)
        for key, (session_id, seq, _, role, body) in zip(keys, entries, strict=True)
    )
    connection.exec_driver_sql(
        "INSERT INTO messages_fts (rowid, session_id, seq, meta, body) VALUES (?, ?, ?, ?, ?)",
        rows,
    )


def _sqlite_allocate_keys(connection: Connection, bases: Sequence[int]) -> list[int]:
    """A free rowid for each base key: after the last one taken in its millisecond."""
    last: dict[int, int | None] = {}
    distinct = sorted(set(bases))
    for start in range(0, len(distinct), LOOKUP_CHUNK):
        chunk = distinct[start : start + LOOKUP_CHUNK]
        values = ", ".join(["(?)"] * len(chunk))
        last.update(
            connection.exec_driver_sql(
                f"WITH b(base) AS (VALUES {values}) SELECT base, (SELECT max(rowid) "
                f"FROM messages_fts WHERE rowid BETWEEN b.base AND b.base + {_KEY_SLOTS - 1}) "
                "FROM b",
                tuple(chunk),
            ).all()
        )
    keys: list[int] = []
    taken: set[int] = set()
    for base in bases:
        previous = last[base]
        key = base if previous is None else previous + 1
        while key in taken:
            key += 1
        if key >= base + _KEY_SLOTS:
            # More messages in one millisecond than it has slots: the next free rowid
            # after it (such a message sorts as a little newer than it is).
            key = _sqlite_free_key(connection, key, taken)
        last[base] = key
        taken.add(key)
        keys.append(key)
    return keys


def _sqlite_free_key(connection: Connection, candidate: int, taken: set[int]) -> int:
    while True:
        used = {
            row[0]
            for row in connection.exec_driver_sql(
                "SELECT rowid FROM messages_fts WHERE rowid >= ? ORDER BY rowid LIMIT 512",
                (candidate,),
            )
        }
        for key in range(candidate, candidate + 512):
            if key not in used and key not in taken:
                return key
        candidate += 512


def _sqlite_reset_search_index(connection: Connection) -> None:
    try:
        with connection.begin_nested():
            connection.exec_driver_sql("DROP TABLE IF EXISTS messages_fts")
    except sa_exc.DBAPIError:
        # Too damaged for FTS5 to drop itself: remove its shadow tables and its entry.
        for shadow in _FTS_SHADOWS:
            connection.exec_driver_sql(f"DROP TABLE IF EXISTS messages_fts_{shadow}")
        connection.exec_driver_sql("PRAGMA writable_schema = ON")
        connection.exec_driver_sql("DELETE FROM sqlite_master WHERE name = 'messages_fts'")
        connection.exec_driver_sql("PRAGMA writable_schema = RESET")  # reload the schema
    connection.exec_driver_sql(_FTS_DDL)


def _sqlite_forget(connection: Connection, session_ids: Sequence[str]) -> None:
    for session_id in session_ids:
        connection.exec_driver_sql(
            "DELETE FROM messages_fts WHERE rowid IN (SELECT rowid FROM messages_fts "
            "WHERE messages_fts MATCH ? AND session_id = ?)",
            (f'meta : "{_session_token(session_id)}"', session_id),
        )


def _fts5_query(query: Query, filters: SearchFilters) -> str | None:
    """The FTS5 expression: the user's terms in ``body``, the session and role filters
    as words of ``meta``. ``None`` when nothing can match (an unknown role)."""

    def quoted(term: Term) -> str:
        return 'body : "' + " ".join(term.words) + '"' + ("*" if term.prefix else "")

    expression = " AND ".join(quoted(term) for term in query.positive)
    for term in query.negative:
        expression = f"({expression}) NOT {quoted(term)}"
    meta: list[str] = []
    if filters.session_id is not None:
        meta.append(f'meta : "{_session_token(filters.session_id)}"')
    role = filters.role
    if role is not None:
        if role not in _ROLES:
            return None
        meta.append(f'meta : "r{role}"')
    if meta:
        expression = " AND ".join(meta) + f" AND ({expression})"
    return expression


def _sqlite_search(
    connection: Connection,
    query: Query,
    filters: SearchFilters,
    *,
    order: SearchOrder,
    limit: int,
    offset: int,
    window: int,
) -> list[Row[Any]]:
    expression = _fts5_query(query, filters)
    if expression is None:
        return []
    params: dict[str, Any] = {"q": expression, "limit": limit, "offset": offset}
    clauses = ["messages_fts MATCH :q"]
    joins = ""
    # The FTS5 table drives (CROSS JOIN keeps it outermost), in rowid order.
    if filters.session_id is not None:
        clauses.append("f.session_id = :f_session_id")
        params["f_session_id"] = filters.session_id
    since, until = filters.since, filters.until
    if since is not None or until is not None:
        joins += " CROSS JOIN messages m ON m.session_id = f.session_id AND m.seq = f.seq"
    if since is not None:
        clauses += ["f.rowid >= :k_since", "m.timestamp >= :f_since"]
        params |= {"k_since": search_key(since), "f_since": since}
    if until is not None:
        clauses.append("m.timestamp < :f_until")
        params["f_until"] = until
    if filters.source is not None or filters.user_id is not None:
        joins += " CROSS JOIN sessions s ON s.id = f.session_id"
        for name, value in (("source", filters.source), ("user_id", filters.user_id)):
            if value is not None:
                clauses.append(f"s.{name} = :f_{name}")
                params[f"f_{name}"] = value
    where = " AND ".join(clauses)
    if order == "newest":
        matches = (
            "SELECT f.rowid AS k, f.session_id AS session_id, f.seq AS seq, 0.0 AS rank "
            f"FROM messages_fts f{joins} WHERE {where} "
            "ORDER BY f.rowid DESC LIMIT :limit OFFSET :offset"
        )
        return run_search(connection, page_of_hits(matches, "top.k DESC"), params)
    # The newest `window` matches (see store.search_index.RANK_WINDOW), scored here: FTS5's
    # bm25() counts every match of every term first (for its idf), which for a
    # common word is most of the table.
    window_sql = (
        "SELECT f.rowid AS k, f.session_id AS session_id, f.seq AS seq, f.body AS body "
        f"FROM messages_fts f{joins} WHERE {where} ORDER BY f.rowid DESC LIMIT :window"
    )
    params["window"] = window
    found = connection.execute(bind_times(text(window_sql), params), params).all()
    scores = relevance(query, [row.body for row in found])
    ranked = sorted(zip(scores, found, strict=True), key=lambda pair: (-pair[0], -pair[1].k))[
        offset : offset + limit
    ]
    if not ranked:
        return []
    values: dict[str, Any] = {}
    for index, (score, row) in enumerate(ranked):
        values |= {f"k{index}": row.k, f"s{index}": row.session_id}
        values |= {f"q{index}": row.seq, f"r{index}": score}
    rows = ", ".join(f"(:k{i}, :s{i}, :q{i}, :r{i})" for i in range(len(ranked)))
    matches = (
        "SELECT column1 AS k, column2 AS session_id, column3 AS seq, column4 AS rank "
        f"FROM (VALUES {rows})"
    )
    return run_search(connection, page_of_hits(matches, "top.rank DESC, top.k DESC"), values)
