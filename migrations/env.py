"""Alembic environment for sessionrepo (SQLite and PostgreSQL).

The URL comes from, in order: a connection handed in by sessionrepo
(``config.attributes["connection"]``), ``-x url=...``, ``sqlalchemy.url`` in the config,
``SESSIONREPO_DATABASE_URL``, the embedded SQLite default. Migrating takes a lock
(PostgreSQL advisory lock, SQLite write lock) so several processes may start at once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from alembic import context
from sqlalchemy import Connection
from sqlalchemy.dialects.postgresql.base import ischema_names
from sqlalchemy.types import UserDefinedType

from sessionrepo.dialects import dialect_for, normalize_url
from sessionrepo.models import adk as _adk_tables  # noqa: F401 - registers its tables on Base
from sessionrepo.models import privacy as _privacy_tables  # noqa: F401 - registers its tables on Base
from sessionrepo.models import usage as _usage_tables  # noqa: F401 - registers its tables on Base
from sessionrepo.models.tables import Base
from sessionrepo.store.database import Database

config = context.config
target_metadata = Base.metadata


def _configured_url() -> str | None:
    return context.get_x_argument(as_dictionary=True).get("url") or config.get_main_option(
        "sqlalchemy.url"
    )


#: The search index's objects (an FTS5 virtual table and its shadow tables, or a tsvector
#: table and its indexes), made by raw DDL (``BackendDialect.search_index_ddl``), and
#: pgvector's column and index over the vectors (0021, where the database has the
#: extension): not in the models' metadata, so autogenerate and `alembic check` leave
#: them alone.
_UNMODELLED_PREFIXES = (
    "messages_fts",
    "message_search",
    "ix_message_search",
    "ix_message_embeddings_ann",
    "ann_vector",
)


class _HalfVec(UserDefinedType[Any]):
    """pgvector's ``halfvec(n)``, the type of ``ann_vector`` (0021), as reflection finds
    it: known, so that reflecting the column is silent (the comparison leaves it out)."""

    cache_ok = True

    def __init__(self, dimension: int | None = None) -> None:
        self.dimension = dimension

    def get_col_spec(self, **kw: Any) -> str:
        return "halfvec" if self.dimension is None else f"halfvec({self.dimension})"


ischema_names.setdefault("halfvec", _HalfVec)


def _include_name(name: str | None, type_: str, parent_names: object) -> bool:
    return not (name or "").startswith(_UNMODELLED_PREFIXES)


#: PostgreSQL's tenant column (migration 0018): the database's, filled by its default and
#: filtered by row-level security, never named by the application, so in no model but
#: ``tenants``. The comparison leaves it out, and with it the unique and foreign keys it
#: was appended to (they are compared on SQLite, whose tables are the models' exactly;
#: ``tests/tenancy/test_schema.py`` checks that on PostgreSQL every key of a tenant table
#: is the model's with ``tenant`` last, under a forced policy).
_TENANT = "tenant"
_TENANT_KEYS = ("unique_constraint", "foreign_key_constraint")


def _tenant_filter(tenant_tables: frozenset[str]) -> Callable[..., bool]:
    def include(item: Any, name: str | None, type_: str, reflected: bool, compare_to: Any) -> bool:
        table = getattr(item, "table", None)
        if getattr(table, "name", None) not in tenant_tables:
            return True
        if type_ == "column":
            return not (reflected and name == _TENANT)
        return type_ not in _TENANT_KEYS

    return include


def _tenant_tables(connection: Connection) -> frozenset[str]:
    """The tables whose ``tenant`` column is the database's alone (no model names it)."""
    if connection.dialect.name != "postgresql":
        return frozenset()
    rows = connection.exec_driver_sql(
        "SELECT table_name FROM information_schema.columns "
        "WHERE table_schema = current_schema() AND column_name = 'tenant'"
    ).scalars()
    modelled = {table.name for table in target_metadata.tables.values() if _TENANT in table.columns}
    return frozenset(rows) - modelled


def _migrate(connection: Connection) -> None:
    dialect = dialect_for(connection.dialect.name)
    dialect.lock_for_migration(connection)
    if connection.dialect.name == "postgresql":
        # Citus: the migration's distributed commands over one connection per worker,
        # from the transaction's start (a distributed function's DDL, migration 0014,
        # is refused after a parallel command in the same transaction). On plain
        # PostgreSQL a placeholder setting, without effect.
        connection.exec_driver_sql("SET LOCAL citus.multi_shard_modify_mode TO 'sequential'")
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
        include_name=_include_name,
        include_object=_tenant_filter(_tenant_tables(connection)),
    )
    with context.begin_transaction():
        context.run_migrations()
        dialect.after_migration(connection)


def run_offline() -> None:
    url = normalize_url(_configured_url())
    context.configure(
        url=url,
        target_metadata=target_metadata,
        render_as_batch=url.get_backend_name() == "sqlite",
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _migrate(connection)
        return
    database = Database(_configured_url())
    try:
        with database.engine.begin() as connection:
            _migrate(connection)
    finally:
        database.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
