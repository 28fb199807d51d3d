"""``sessionrepo tenants``: the roles several gateways share one PostgreSQL store with.

A tenant is a login role (see :mod:`sessionrepo.dialects.postgresql.tenancy`): what it
writes carries its name, and the policies show it nothing else. These functions run as
an administrator that the policies do not hold (a superuser, or a role with
``BYPASSRLS`` and ``CREATEROLE`` that owns the schema or may grant on it), each in one
transaction: a tenant is made whole or not at all.

On SQLite there are no roles: the file is the boundary, and its tenant is the one it was
first opened for (``open_repository(url, tenant=...)``); :func:`list_tenants` shows it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, select
from sqlalchemy.engine import URL

from sessionrepo.dialects.postgresql.tenancy import (
    GATEWAY_ROLE,
    OPERATOR_ROLE,
    TENANT_TABLES,
    check_tenant_name,
    grant_statements,
    new_password,
    role_rights,
)
from sessionrepo.errors import InvalidArgument, RepoError
from sessionrepo.models.tables import tenants_table
from sessionrepo.store.database import Database
from sessionrepo.store.tenancy import DEFAULT_TENANT


class TenantError(RepoError):
    """A tenant command that cannot be done as asked (nothing was changed)."""


@dataclass(frozen=True, slots=True)
class CreatedRole:
    name: str
    operator: bool
    #: The connection URL of the new role, with its password if one was made.
    url: URL


@dataclass(frozen=True, slots=True)
class TenantInfo:
    name: str
    created_at: datetime | None
    sessions: int


def create_tenant(
    url: str | URL | None, name: str, *, password: bool = True, operator: bool = False
) -> CreatedRole:
    """Make the login role ``name``: a tenant (a gateway's role), or with ``operator``
    the role that sees every tenant and may act as each (``BYPASSRLS``; a member of every
    tenant role, without inheriting their rights). ``password``: a random one, returned
    in the URL only; without, the role logs in as the server's authentication allows
    (a certificate, peer, or trust)."""
    try:
        check_tenant_name(name)
    except ValueError as exc:
        raise InvalidArgument("name", str(exc)) from None
    database = _postgres(url)
    secret = new_password() if password else None
    try:

        def create(conn: Connection) -> None:
            _one_connection_per_node(conn)
            _require_admin(conn)
            if conn.exec_driver_sql(
                "SELECT 1 FROM pg_roles WHERE rolname = %(n)s", {"n": name}
            ).first():
                raise TenantError(f"a role named {name!r} exists already on this server")
            schema = str(conn.exec_driver_sql("SELECT current_schema()").scalar_one())
            _ensure_group_roles(conn, schema)
            login = f"CREATE ROLE {name} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION"
            login += " BYPASSRLS" if operator else " NOBYPASSRLS"
            conn.exec_driver_sql(f"{login} IN ROLE {OPERATOR_ROLE if operator else GATEWAY_ROLE}")
            if secret is not None:
                # A literal: utility statements take no parameters.
                conn.exec_driver_sql(f"ALTER ROLE {name} PASSWORD '{secret}'")
            if operator:
                # A member of every tenant role: it may act as one (SET ROLE). Its own
                # rights are granted to it directly (a store may have no tenant yet).
                for tenant in _store_tenants(conn):
                    conn.exec_driver_sql(f"GRANT {tenant} TO {name}")
                for statement in grant_statements(_tables(conn), schema, grantee=name):
                    conn.exec_driver_sql(statement)
            else:
                for member in _store_operators(conn):
                    conn.exec_driver_sql(f"GRANT {name} TO {member}")
                conn.execute(
                    tenants_table.insert().values(
                        tenant=name, created_at=datetime.now().astimezone()
                    )
                )

        database.write(create)
    finally:
        database.dispose()
    role_url = database.url.set(username=name, password=secret)
    return CreatedRole(name=name, operator=operator, url=role_url.set(drivername="postgresql"))


def list_tenants(url: str | URL | None) -> list[TenantInfo]:
    """The store's tenants, with how many sessions each holds. On PostgreSQL as a role
    that sees them all (the operator, an administrator); a tenant sees itself."""
    database = Database(url, read_only=True)
    try:
        if not database.dialect.capabilities.tenant_roles:
            return database.read(_file_tenant)

        def read(conn: Connection) -> list[TenantInfo]:
            # Two statements: Citus takes no subquery over a reference table correlated
            # with a distributed one.
            counted = conn.exec_driver_sql("SELECT tenant, count(*) FROM sessions GROUP BY tenant")
            counts: dict[str, int] = {name: int(n) for name, n in counted}
            rows = conn.exec_driver_sql(
                "SELECT tenant, created_at FROM tenants ORDER BY tenant"
            ).all()
            return [
                TenantInfo(name=name, created_at=created, sessions=counts.get(name, 0))
                for name, created in rows
            ]

        return database.read(read)
    finally:
        database.dispose()


def drop_tenant(url: str | URL | None, name: str, *, delete_data: bool = False) -> int:
    """Drop the tenant role ``name``; with ``delete_data``, every row of its first (in
    the same transaction). Without it, refuses while the tenant holds sessions: its rows
    would stay, reachable by no gateway. Returns the sessions deleted."""
    database = _postgres(url)
    try:

        def drop(conn: Connection) -> int:
            _one_connection_per_node(conn)
            _require_admin(conn)
            if not conn.exec_driver_sql(
                "SELECT 1 FROM tenants WHERE tenant = %(n)s", {"n": name}
            ).first():
                raise TenantError(f"{name!r} is not a tenant of this store")
            sessions = int(
                conn.exec_driver_sql(
                    "SELECT count(*) FROM sessions WHERE tenant = %(n)s", {"n": name}
                ).scalar_one()
            )
            if sessions and not delete_data:
                raise TenantError(
                    f"tenant {name!r} holds {sessions} sessions: drop it with its data "
                    "(--delete-data), or erase or move them first"
                )
            for table in _tables(conn):
                if table in TENANT_TABLES:
                    conn.exec_driver_sql(f"DELETE FROM {table} WHERE tenant = %(n)s", {"n": name})
            conn.exec_driver_sql("DELETE FROM tenants WHERE tenant = %(n)s", {"n": name})
            conn.exec_driver_sql(f"DROP OWNED BY {name}")
            conn.exec_driver_sql(f"DROP ROLE {name}")
            return sessions

        return database.write(drop)
    finally:
        database.dispose()


def _postgres(url: str | URL | None) -> Database:
    database = Database(url)
    if not database.dialect.capabilities.tenant_roles:
        database.dispose()
        raise TenantError(
            "tenant roles are PostgreSQL's; a SQLite file is one tenant's "
            "(open it with tenant=NAME), its file permissions the boundary"
        )
    return database


def _one_connection_per_node(conn: Connection) -> None:
    """Citus makes or changes a role only in a transaction that reaches each node over one
    connection (its grants on distributed tables too). On plain PostgreSQL a placeholder
    setting, without effect (as ``migrations/env.py`` sets it)."""
    conn.exec_driver_sql("SET LOCAL citus.multi_shard_modify_mode TO 'sequential'")


def _require_admin(conn: Connection) -> None:
    rights = role_rights(conn)
    if not (rights.superuser or rights.bypass_rls):
        raise TenantError(
            f"role {rights.role!r} is held to the tenants' policies: run tenant commands as "
            "a superuser or a role with BYPASSRLS and CREATEROLE"
        )


def _ensure_group_roles(conn: Connection, schema: str) -> None:
    for role in (GATEWAY_ROLE, OPERATOR_ROLE):
        if not conn.exec_driver_sql(
            "SELECT 1 FROM pg_roles WHERE rolname = %(r)s", {"r": role}
        ).first():
            conn.exec_driver_sql(f"CREATE ROLE {role} NOLOGIN")
    for statement in grant_statements(_tables(conn), schema):
        conn.exec_driver_sql(statement)


def _tables(conn: Connection) -> list[str]:
    return list(
        conn.exec_driver_sql(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() ORDER BY 1"
        ).scalars()
    )


# A server's roles are shared by its databases: an operator acts for this store's tenants
# only (the rows of its `tenants` table), and a new tenant is given to this store's
# operators only (those granted its tables), never to another store's.


def _store_tenants(conn: Connection) -> list[str]:
    return list(conn.exec_driver_sql("SELECT tenant FROM tenants ORDER BY 1").scalars())


def _store_operators(conn: Connection) -> list[str]:
    return [
        member
        for member in _members(conn, OPERATOR_ROLE)
        if conn.exec_driver_sql(
            "SELECT has_table_privilege(%(r)s, 'tenants', 'SELECT')", {"r": member}
        ).scalar()
    ]


def _members(conn: Connection, group: str) -> list[str]:
    rows = conn.exec_driver_sql(
        "SELECT r.rolname FROM pg_auth_members m JOIN pg_roles g ON g.oid = m.roleid "
        "JOIN pg_roles r ON r.oid = m.member WHERE g.rolname = %(g)s ORDER BY 1",
        {"g": group},
    ).scalars()
    return list(rows)


def _file_tenant(conn: Connection) -> list[TenantInfo]:
    row = conn.execute(select(tenants_table.c.tenant, tenants_table.c.created_at)).first()
    sessions = int(conn.exec_driver_sql("SELECT count(*) FROM sessions").scalar_one())
    if row is None:
        return [TenantInfo(name=DEFAULT_TENANT, created_at=None, sessions=sessions)]
    return [TenantInfo(name=row[0], created_at=row[1], sessions=sessions)]
