"""Which dialect serves a backend: by SQLAlchemy's name of it, then by what the server
says on the first connection (PostgreSQL or a Citus coordinator)."""

from __future__ import annotations

from typing import Final

from sqlalchemy.engine.interfaces import DBAPIConnection

from sessionrepo.dialects.base import BackendDialect
from sessionrepo.dialects.citus import CitusDialect, is_coordinator
from sessionrepo.dialects.postgresql import PostgresDialect
from sessionrepo.dialects.sqlite import SQLiteDialect
from sessionrepo.errors import RepoError

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
