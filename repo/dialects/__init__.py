"""Everything that differs between SQLite and PostgreSQL: one module per backend.

- :mod:`.base`: :class:`BackendDialect`, the interface each backend implements;
- :mod:`.sqlite`, :mod:`.postgresql`: engine setup, error translation, the append SQL,
  the search index's SQL and the doctor's settings checks of each;
- :mod:`.citus`: PostgreSQL on a Citus coordinator (found on the first connection, see
  :func:`for_server`) and the schema's distribution by session id;
- :mod:`.urls`: which backend and driver a URL means.

The store asks :func:`dialect_for` for its backend's dialect and never branches on the
backend's name; another engine is not supported: asking for one raises, naming it. The
dialects sit below the store (they import :mod:`sessionrepo.search`, the models and the
errors, never the store).
"""

from __future__ import annotations

from typing import Final

from sqlalchemy.engine.interfaces import DBAPIConnection

from sessionrepo.dialects.base import READ_ONLY, BackendDialect
from sessionrepo.dialects.citus import CitusDialect, is_coordinator
from sessionrepo.dialects.postgresql import PostgresDialect
from sessionrepo.dialects.sqlite import SQLiteDialect
from sessionrepo.dialects.urls import default_database_path, normalize_url, safe_url
from sessionrepo.errors import RepoError

__all__ = [
    "READ_ONLY",
    "BackendDialect",
    "CitusDialect",
    "PostgresDialect",
    "SQLiteDialect",
    "default_database_path",
    "dialect_for",
    "for_server",
    "normalize_url",
    "safe_url",
]

#: The supported backends, by SQLAlchemy dialect name.
_DIALECTS: Final[dict[str, type[BackendDialect]]] = {
    dialect.name: dialect for dialect in (SQLiteDialect, PostgresDialect)
}


def dialect_for(name: str) -> BackendDialect:
    """A new dialect object for the backend SQLAlchemy calls ``name``.

    Raises:
        RepoError: sessionrepo does not run on that backend; the message names it.
    """
    try:
        dialect = _DIALECTS[name]
    except KeyError:
        raise RepoError(
            f"unsupported database dialect {name!r}: sessionrepo runs on SQLite and PostgreSQL"
        ) from None
    return dialect()


def for_server(dialect: BackendDialect, dbapi_connection: DBAPIConnection) -> BackendDialect:
    """The dialect for the server a first driver connection reached: ``dialect`` itself,
    or for PostgreSQL with the ``citus`` extension a :class:`CitusDialect` with its
    settings (the store calls it once per engine, on its first connection)."""
    if type(dialect) is PostgresDialect and is_coordinator(dbapi_connection):
        return CitusDialect.like(dialect)
    return dialect
