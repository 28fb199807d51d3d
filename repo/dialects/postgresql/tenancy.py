"""Tenants on PostgreSQL: the tenant is the role a connection logs in as.

Every table that holds a tenant's data carries a ``tenant`` column (migration 0018) that
the database fills (``DEFAULT current_user``) and filters: row-level security, enabled and
forced, with one policy, ``tenant = current_user``. The application never names the
column, except where PostgreSQL needs a unique key spelled out (``ON CONFLICT``): there
:data:`TENANT_TABLES` says which keys end with it.

The roles (``sessionrepo tenants``):

- a **tenant** is a login role, a member of :data:`GATEWAY_ROLE`, which holds only what a
  gateway needs: reading and writing the tenant tables (its own rows, by the policies),
  reading the store-wide ones, running the Citus append function; no DDL, no
  ``TRUNCATE``, no ``BYPASSRLS``, owner of nothing;
- the **operator** is a login role with ``BYPASSRLS`` and the same privileges: it sees
  every tenant (the console's all-tenants view, ``tenants list``), and acts as one tenant
  by ``SET ROLE`` (it is made a member of each tenant role, without inheriting);
- the **schema owner** runs the migrations and is neither.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from sqlalchemy import Connection

from sessionrepo.dialects.base import TENANT_NAME

#: The tables whose unique keys end with ``tenant`` (migration 0018's list).
TENANT_TABLES: Final = frozenset(
    {
        "sessions",
        "messages",
        "search_backlog",
        "message_search",
        "message_embeddings",
        "adk_sessions",
        "usage_records",
        "adk_app_states",
        "adk_user_states",
        "erased_sessions",
        "erased_messages",
        "privacy_audit",
        "retention_policies",
        "semantic_index_state",
        "pending_outbox",
        "usage_rollup",
    }
)
TENANT_COLUMN: Final = "tenant"
#: Store-wide tables a tenant reads; ``search_index_state`` it also writes (the health of
#: the one search index, which any catch-up may find damaged).
STORE_WIDE_READ: Final = ("privacy_keys", "usage_prices", "alembic_version")
STORE_WIDE_WRITE: Final = ("search_index_state",)
#: The group role that holds a gateway's privileges; every tenant role is its member.
GATEWAY_ROLE: Final = "sessionrepo_gateway"
#: The group of the operator roles (each a member of every tenant role, to act as one).
OPERATOR_ROLE: Final = "sessionrepo_operator"
_RESERVED: Final = (GATEWAY_ROLE, OPERATOR_ROLE, "public", "postgres")


@dataclass(frozen=True, slots=True)
class RoleRights:
    """What the connecting role can do to the policies."""

    role: str
    superuser: bool
    bypass_rls: bool
    #: Tenant tables the role owns whose row-level security is not forced (an owner
    #: passes unforced policies), and tenant tables with no row-level security at all.
    unforced_owned: tuple[str, ...]
    unprotected: tuple[str, ...]

    @property
    def bypasses(self) -> bool:
        return self.superuser or self.bypass_rls or bool(self.unforced_owned or self.unprotected)

    def describe(self) -> str:
        reasons = []
        if self.superuser:
            reasons.append("is a superuser")
        if self.bypass_rls:
            reasons.append("has BYPASSRLS")
        if self.unforced_owned:
            reasons.append(
                "owns tables whose row-level security is not forced: "
                + ", ".join(self.unforced_owned)
            )
        if self.unprotected:
            reasons.append("tables without row-level security: " + ", ".join(self.unprotected))
        return f"role {self.role!r} " + "; ".join(reasons)


def role_rights(connection: Connection) -> RoleRights:
    row = connection.exec_driver_sql(
        "SELECT current_user, rolsuper, rolbypassrls FROM pg_roles WHERE rolname = current_user"
    ).one()
    tables = connection.exec_driver_sql(
        "SELECT c.relname, c.relrowsecurity, c.relforcerowsecurity, "
        "pg_has_role(current_user, c.relowner, 'USAGE') "
        "FROM pg_class c WHERE c.relkind IN ('r', 'p') "
        "AND c.relnamespace = current_schema()::regnamespace AND c.relname = ANY(%(t)s)",
        {"t": sorted(TENANT_TABLES | {"tenants"})},
    ).all()
    return RoleRights(
        role=str(row[0]),
        superuser=bool(row[1]),
        bypass_rls=bool(row[2]),
        unforced_owned=tuple(
            sorted(name for name, on, forced, owns in tables if owns and not forced)
        ),
        unprotected=tuple(sorted(name for name, on, _, _ in tables if not on)),
    )


def tenant_count(connection: Connection) -> int:
    """The store's tenants (rows of its ``tenants`` table, which ``sessionrepo tenants
    create`` writes): the roles of a server are shared by its databases, a store's
    tenants are its own. As a role the policies hold, the tenant itself (or none)."""
    if connection.exec_driver_sql("SELECT to_regclass('tenants')").scalar() is None:
        return 0  # not migrated yet (doctor says so in a check of its own)
    return int(connection.exec_driver_sql("SELECT count(*) FROM tenants").scalar_one())


def check_tenant_name(name: str) -> str:
    if not TENANT_NAME.match(name) or name in _RESERVED or name.startswith("pg_"):
        raise ValueError(
            f"{name!r} cannot be a tenant: a tenant is a role name of lower-case letters, "
            "digits and _ (at most 63, starting with a letter), not pg_*, " + ", ".join(_RESERVED)
        )
    return name


def new_password() -> str:
    return secrets.token_urlsafe(24)


def grant_statements(tables: Sequence[str], schema: str, grantee: str = GATEWAY_ROLE) -> list[str]:
    """A gateway's privileges on the tables there are (``sessionrepo migrate`` grants
    them again on the tables a later revision makes)."""
    tenant = [t for t in tables if t in TENANT_TABLES or t == "tenants"]
    read = [t for t in tables if t in STORE_WIDE_READ]
    write = [t for t in tables if t in STORE_WIDE_WRITE]
    statements = [f"GRANT USAGE ON SCHEMA {schema} TO {grantee}"]
    if tenant:
        statements.append(
            f"GRANT SELECT, INSERT, UPDATE, DELETE ON {', '.join(tenant)} TO {grantee}"
        )
    if read:
        statements.append(f"GRANT SELECT ON {', '.join(read)} TO {grantee}")
    if write:
        statements.append(f"GRANT SELECT, INSERT, UPDATE ON {', '.join(write)} TO {grantee}")
    statements.append(f"GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA {schema} TO {grantee}")
    statements.append(f"GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA {schema} TO {grantee}")
    return statements


def regrant(connection: Connection) -> None:
    """After a migration: the gateway role's (and each operator's) privileges on every
    table, the new ones too. Only for the roles this store's ``tenants create`` granted
    (they can read its ``tenants`` table): a server's roles are shared by its databases,
    and a role made for another store gets nothing here. Nothing where none was made."""
    if connection.exec_driver_sql("SELECT to_regclass('tenants')").scalar() is None:
        return  # before revision 0018 (a downgrade): no tenant roles to keep
    roles = list(
        connection.exec_driver_sql(
            "SELECT rolname FROM ("
            "SELECT rolname FROM pg_roles WHERE rolname = %(g)s UNION ALL "
            "SELECT r.rolname FROM pg_auth_members m JOIN pg_roles g ON g.oid = m.roleid "
            "JOIN pg_roles r ON r.oid = m.member WHERE g.rolname = %(o)s"
            ") granted WHERE has_table_privilege(rolname, 'tenants', 'SELECT')",
            {"g": GATEWAY_ROLE, "o": OPERATOR_ROLE},
        ).scalars()
    )
    if not roles:
        return
    schema = str(connection.exec_driver_sql("SELECT current_schema()").scalar_one())
    tables = list(
        connection.exec_driver_sql(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
        ).scalars()
    )
    for role in roles:
        for statement in grant_statements(tables, schema, grantee=role):
            connection.exec_driver_sql(statement)
