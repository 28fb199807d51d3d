"""Which tenant a repository serves, checked when it is opened.

On PostgreSQL the tenant is the role (``sessionrepo.dialects.postgresql.tenancy``): a
repository opened with ``tenant=NAME`` connects with ``role=NAME`` (an operator acts as
the tenant so, the policies then hold it), and the role the server reports must be that
tenant. On SQLite the file is the boundary: its tenant is the one row of ``tenants``
(none: ``default``), claimed by the first repository opened on it for a named tenant
while the file holds no session; any other tenant is refused.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Final

from sqlalchemy import Connection, exists, select

from sessionrepo.errors import TenantMismatch
from sessionrepo.models.tables import sessions_table, tenants_table
from sessionrepo.store.database import Database

#: The tenant of a SQLite file opened for none in particular.
DEFAULT_TENANT: Final = "default"


def check_tenant(database: Database) -> None:
    """Refuse a store that does not serve ``database.tenant`` (nothing to check without one).

    Raises:
        TenantMismatch: the role or the file is another tenant's.
    """
    tenant = database.tenant
    if tenant is None:
        return
    if database.dialect.capabilities.tenant_roles:
        role = database.read(lambda conn: conn.exec_driver_sql("SELECT current_user").scalar())
        if role != tenant:
            raise TenantMismatch(
                f"opened for tenant {tenant!r}, but the server says this connection is "
                f"role {role!r}"
            )
        return
    if database.read(file_tenant) == tenant:
        return
    if database.read_only:
        _refuse(tenant, database.read(file_tenant))
    database.write(lambda conn: _claim(conn, tenant))


def file_tenant(connection: Connection) -> str:
    """A SQLite file's tenant (``default`` until one is claimed)."""
    claimed = connection.execute(select(tenants_table.c.tenant).limit(1)).scalar()
    return DEFAULT_TENANT if claimed is None else str(claimed)


def _claim(connection: Connection, tenant: str) -> None:
    current = file_tenant(connection)  # again, under the write lock
    if current == tenant:
        return
    claimed = connection.execute(select(exists().select_from(tenants_table))).scalar()
    if claimed or connection.execute(select(exists().select_from(sessions_table))).scalar():
        _refuse(tenant, current)
    connection.execute(tenants_table.insert().values(tenant=tenant, created_at=datetime.now(UTC)))


def _refuse(tenant: str, current: str) -> None:
    raise TenantMismatch(
        f"this SQLite file is tenant {current!r}'s, not {tenant!r}'s: a file holds one "
        "tenant (give each tenant a file of its own)"
    )
