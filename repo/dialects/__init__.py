"""Everything that differs between SQLite and PostgreSQL: one package per backend, one
module per role.

- :mod:`.base`: :class:`BackendDialect`, the interface each backend implements (one
  abstract class per role: engine and errors, append, search, doctor's probes) and the
  :class:`Capabilities` each declares;
- :mod:`.sqlite`, :mod:`.postgresql`: each backend's ``engine``, ``append``, ``search``
  and ``probes`` modules, joined in its ``dialect`` module;
- :mod:`.citus`: PostgreSQL on a Citus coordinator (found on the first connection, see
  :func:`for_server`) and the schema's distribution by session id;
- :mod:`.hits`: the SQL of a search page both backends share;
- :mod:`.registry`: :func:`dialect_for` and :func:`for_server`;
- :mod:`.urls`: which backend, driver and file a URL means.

The store asks :func:`dialect_for` for its backend's dialect and never branches on the
backend's name (it reads the dialect's :attr:`~BackendDialect.capabilities`); another
engine is not supported: asking for one raises, naming it. The dialects sit below the
store (they import :mod:`sessionrepo.search`, the models and the errors, never the
store).
"""

from sessionrepo.dialects.base import READ_ONLY, TENANT_NAME, BackendDialect, Capabilities
from sessionrepo.dialects.citus import CitusDialect
from sessionrepo.dialects.postgresql import PostgresDialect
from sessionrepo.dialects.registry import dialect_for, for_server
from sessionrepo.dialects.sqlite import SQLiteDialect
from sessionrepo.dialects.urls import database_file, default_database_path, normalize_url, safe_url

__all__ = [
    "READ_ONLY",
    "TENANT_NAME",
    "BackendDialect",
    "Capabilities",
    "CitusDialect",
    "PostgresDialect",
    "SQLiteDialect",
    "database_file",
    "default_database_path",
    "dialect_for",
    "for_server",
    "normalize_url",
    "safe_url",
]
