"""SQLite's nearest vectors by sqlite-vec, where Python's ``sqlite3`` can load it.

sqlite-vec (the ``sqlite-vec`` package, ``pip install 'sessionrepo[sqlite-vec]'``) is a
loadable extension of distance functions in C. It is used where it loads and never
required: this needs the package, and a ``sqlite3`` built with extension loading
(``sqlite3.Connection.enable_load_extension``; CPython's builds from python.org and
Debian's have it, pyenv's and macOS's system Python do not by default). It is loaded
on a connection the first time that connection's search needs it, then kept with the
connection; where it does not load, the search scans in Python as without it.

It answers the query that reads the vectors from the database (the store's vectors do
not fit ``semantic_memory``, or it is ``0``); vectors kept in memory are scanned there,
which is faster still. It scans the stored int8 vectors where they are, in
``message_embeddings``: no table of its own (a ``vec0`` table holds a copy that a
Python without the extension could neither read nor erase), so nothing changes in the
schema, and erasing a message erases its only vector.

sqlite-vec has no inner product for int8 vectors, and its Euclidean distance alone
orders by the dot product only up to the vectors' norms, which quantization leaves
within about a percent of one another: among a million near-equal vectors that lost a
tenth of the exact ten (measured). So each row's dot product is taken from two
distances, to the query and to the origin (``a.q = (|a|^2 + |q|^2 - |a - q|^2) / 2``),
and the rows come in the scan's order (ties by key), which the caller's exact scores
then confirm.
That costs a second distance a row: at 1,000,000 vectors of 512 dimensions about 1.1 s
a query against the Python scan's 3.4 s (the first distance alone: 0.65 s).
"""

from __future__ import annotations

import logging
import sqlite3
from typing import Any, Final

from sqlalchemy import Connection, text
from sqlalchemy.util import await_

from sessionrepo.dialects.aiosqlite_compat import on_connection_thread
from sessionrepo.dialects.base import NearVector, SearchRole
from sessionrepo.dialects.hits import bind_times
from sessionrepo.search.query import SearchFilters

__all__ = ["SQLiteVectors", "load_sqlite_vec", "sqlite_vec_version"]

log = logging.getLogger(__name__)

#: Where a connection remembers whether sqlite-vec is loaded on it (its pool entry's
#: ``info``, which lives as long as the driver's connection).
_LOADED: Final = "sessionrepo.sqlite_vec"
#: The filters, each one's condition and the join it needs (``e``: the vectors).
_FILTERS: Final = (
    ("session_id", "e.session_id = :f_session_id", None),
    ("role", "m.role = :f_role", "m"),
    ("since", "m.timestamp >= :f_since", "m"),
    ("until", "m.timestamp < :f_until", "m"),
    ("source", "s.source = :f_source", "s"),
    ("user_id", "s.user_id = :f_user_id", "s"),
)
_JOINS: Final = {
    "m": " JOIN messages m ON m.session_id = e.session_id AND m.seq = e.seq",
    "s": " JOIN sessions s ON s.id = e.session_id",
}


def load_sqlite_vec(driver_connection: Any) -> str | None:
    """Load sqlite-vec on a ``sqlite3`` connection: its version, or ``None`` where it
    cannot load (the package absent, a ``sqlite3`` without extension loading, an
    object other than ``sqlite3``'s connection, or the load refused)."""
    if not isinstance(driver_connection, sqlite3.Connection):
        return None
    if not hasattr(driver_connection, "enable_load_extension"):
        return None  # this Python's sqlite3 was built without extension loading
    try:
        import sqlite_vec  # type: ignore[import-untyped]  # no py.typed
    except ImportError:
        return None
    try:
        driver_connection.enable_load_extension(True)
        try:
            sqlite_vec.load(driver_connection)
        finally:
            driver_connection.enable_load_extension(False)
        version = driver_connection.execute("SELECT vec_version()").fetchone()
    except sqlite3.Error as exc:
        log.warning("sqlite-vec is installed but did not load; scanning without it: %s", exc)
        return None
    return None if version is None else str(version[0])


def sqlite_vec_version(connection: Connection) -> str | None:
    """sqlite-vec's version on this connection (loaded at its first call), or ``None``
    where it cannot load (:func:`load_sqlite_vec`)."""
    info = connection.info
    if _LOADED not in info:
        driver = connection.connection.dbapi_connection
        inner = getattr(driver, "driver_connection", None)
        if inner is not None and not isinstance(driver, sqlite3.Connection):
            # aiosqlite's, through SQLAlchemy's adapter: loaded on the connection's thread
            info[_LOADED] = await_(on_connection_thread(inner, load_sqlite_vec))
        else:
            info[_LOADED] = load_sqlite_vec(driver)
    loaded: str | None = info[_LOADED]
    return loaded


def _nearest_sql(filters: SearchFilters) -> tuple[str, dict[str, Any]]:
    """The statement and its filters' parameters."""
    joins: list[str] = []
    conditions = ["length(e.vector) = :dimension"]  # NULL vectors and other models' out
    params: dict[str, Any] = {}
    for name, condition, table in _FILTERS:
        value = getattr(filters, name)
        if value is None:
            continue
        params[f"f_{name}"] = value
        conditions.append(condition)
        if table is not None and _JOINS[table] not in joins:
            joins.append(_JOINS[table])
    # The distances are columns of a subquery that SQLite may not flatten into the outer
    # query (both have a LIMIT), else it would compute each twice, once for each use.
    # Their squares' difference is 2 a.q - |q|^2, an integer: rounded, it undoes the
    # single-precision distances' error, so that equal scores are equal and come in the
    # key's order, as the scan breaks ties.
    sql = (
        "SELECT session_id, seq, content_hash, vector FROM ("
        "SELECT e.session_id, e.seq, e.content_hash, e.vector, "
        "vec_distance_l2(vec_int8(e.vector), vec_int8(:target)) AS apart, "
        "vec_distance_l2(vec_int8(e.vector), vec_int8(:origin)) AS norm "
        f"FROM message_embeddings e{''.join(joins)} WHERE {' AND '.join(conditions)} "
        "LIMIT -1) ORDER BY round(norm * norm - apart * apart) DESC, session_id, seq "
        "LIMIT :depth"
    )
    return sql, params


class SQLiteVectors(SearchRole):
    """:meth:`SearchRole.nearest_vectors` by sqlite-vec's distance, where it loads."""

    def nearest_vectors(
        self, connection: Connection, target: bytes, depth: int, filters: SearchFilters
    ) -> list[NearVector] | None:
        if sqlite_vec_version(connection) is None:
            return None
        sql, params = _nearest_sql(filters)
        rows = connection.execute(
            bind_times(text(sql), params),
            {
                **params,
                "target": target,
                "origin": bytes(len(target)),
                "dimension": len(target),
                "depth": depth,
            },
        ).all()
        # A scan, not an index: a short answer is all there is.
        return [((row[0], int(row[1])), bytes(row[2]), bytes(row[3])) for row in rows]
