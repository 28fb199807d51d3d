"""Tenants: several gateways in one store, kept apart by PostgreSQL's row-level security

On PostgreSQL (and Citus) every table that holds a tenant's data gets a ``tenant`` column,
``DEFAULT current_user``: a row belongs to the role that wrote it. Its primary key, its
unique keys and the foreign keys between such tables gain ``tenant`` as their last column,
so a session id is unique within its tenant only (two tenants may both have
``discord:123``, and neither can tell). Each table then has row-level security enabled
and *forced* (its owner is held to it too) with one policy, ``tenant = current_user``,
for reading and writing: the tenant comes from the role the connection logged in as,
not from a setting a gateway could change, and a role whose name is no tenant's sees
nothing. Citus refuses subqueries in policies; this one has none, and each distributed
table carries the tenant itself.

Existing rows get the tenant of the role that runs this migration (``current_user``): a
store that had one role keeps working as that role's tenant.

The application never names the column (it is the database's): it is not in the
models, ``alembic check`` leaves it out (``migrations/env.py``), and
``tests/tenancy/test_schema.py`` checks what this revision made.

Store-wide tables stay without a tenant: ``privacy_keys`` (the tombstone key),
``usage_prices``, ``search_index_state`` (the health of the one search index) and
``alembic_version``. What a tenant role may do with them is a grant
(``sessionrepo tenants``), not a policy.

``tenants`` (new, on both backends): the tenants of the store. On PostgreSQL one row per
tenant role ``sessionrepo tenants create`` made (a tenant sees its own row). On SQLite,
where the file is the boundary (one tenant a file), at most one row: the file's tenant,
written when the store is first opened for a named tenant.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-02
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import sqlalchemy as sa
from alembic import context, op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: The tables that hold a tenant's data (as of this revision; frozen).
_TENANT_TABLES = (
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
)
#: The policy every tenant table gets: the row's tenant is the connecting role.
_POLICY = "tenant_isolation"
_OWN_ROW = "tenant = CAST(current_user AS text)"
#: A tenant is a role name (PostgreSQL's NAMEDATALEN - 1).
_TENANT_LENGTH = 63


def upgrade() -> None:
    op.create_table(
        "tenants",
        sa.Column("tenant", sa.String(_TENANT_LENGTH), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("tenant", name=op.f("pk_tenants")),
    )
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    if not context.is_offline_mode() and _has_citus(bind):
        op.execute("SELECT create_reference_table('tenants')")
    op.execute("ALTER TABLE tenants ALTER COLUMN tenant SET DEFAULT current_user")
    tables = ["tenants", *(t for t in _TENANT_TABLES if _exists(t))]
    for table in tables[1:]:
        # A constant for the rows there are (who migrates), then the connecting role for
        # every row written after: Citus takes a constant default on a distributed table.
        op.execute(
            f"ALTER TABLE {table} ADD COLUMN tenant VARCHAR({_TENANT_LENGTH}) NOT NULL "
            f"DEFAULT {_quoted_current_user(bind)}"
        )
        op.execute(f"ALTER TABLE {table} ALTER COLUMN tenant SET DEFAULT current_user")
    _extend_keys(bind, tables[1:])
    if not context.is_offline_mode():  # a script is for plain PostgreSQL (no function)
        _retarget_functions(bind)
    for table in tables:
        op.execute(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
        op.execute(f"ALTER TABLE {table} FORCE ROW LEVEL SECURITY")
        op.execute(f"CREATE POLICY {_POLICY} ON {table} USING ({_OWN_ROW}) WITH CHECK ({_OWN_ROW})")


def _has_citus(bind: sa.Connection) -> bool:
    return (
        bind.exec_driver_sql("SELECT 1 FROM pg_extension WHERE extname = 'citus'").first()
        is not None
    )


def _exists(table: str) -> bool:
    if context.is_offline_mode():
        return True
    return (
        op.get_bind().exec_driver_sql("SELECT to_regclass(%(t)s)", {"t": table}).scalar()
        is not None
    )


def _quoted_current_user(bind: sa.Connection) -> str:
    if context.is_offline_mode():
        return "current_user"
    name = bind.exec_driver_sql("SELECT current_user").scalar_one()
    return "'" + str(name).replace("'", "''") + "'"


#: ``PRIMARY KEY (a, b)``, ``UNIQUE (a, b)``, ``FOREIGN KEY (a) REFERENCES t(b) ...``.
_KEY = re.compile(r"^(PRIMARY KEY|UNIQUE) \((?P<columns>[^)]*)\)(?P<rest>.*)$")
_FOREIGN = re.compile(
    r"^FOREIGN KEY \((?P<columns>[^)]*)\) REFERENCES (?P<table>[\w.\"]+)\((?P<target>[^)]*)\)"
    r"(?P<rest>.*)$"
)


def _extend_keys(bind: sa.Connection, tables: Sequence[str]) -> None:
    """Every primary, unique and foreign key of the tenant tables gets ``tenant`` last."""
    if context.is_offline_mode():
        op.execute(_extend_keys_in_the_server(tables))
        return
    _rebuild_keys(bind, tables, key=_with_tenant, foreign=_foreign_with_tenant)


def _rebuild_keys(
    bind: sa.Connection,
    tables: Sequence[str],
    *,
    key: Callable[[str, str, str], str],
    foreign: Callable[[str, str, str], str],
) -> None:
    """Drop and make again every primary, unique and foreign key of ``tables``, each
    definition rewritten by ``key`` or ``foreign`` (``(table, name, definition)``): the
    foreign keys are dropped first and made again last (they need the new keys)."""
    rows = bind.exec_driver_sql(
        "SELECT conrelid::regclass::text, conname, contype, pg_get_constraintdef(oid) "
        "FROM pg_constraint WHERE contype IN ('p', 'u', 'f') "
        "AND conrelid = ANY(%(tables)s::regclass[]) ORDER BY conrelid::regclass::text, conname",
        {"tables": list(tables)},
    ).all()
    keys = [(t, name, definition) for t, name, kind, definition in rows if kind != "f"]
    foreigns = [(t, name, definition) for t, name, kind, definition in rows if kind == "f"]
    for table, name, _ in foreigns:
        op.execute(f"ALTER TABLE {table} DROP CONSTRAINT {name}")
    for table, name, definition in keys:
        rewritten = key(table, name, definition)
        op.execute(f"ALTER TABLE {table} DROP CONSTRAINT {name}")
        op.execute(f"ALTER TABLE {table} ADD CONSTRAINT {name} {rewritten}")
    for table, name, definition in foreigns:
        op.execute(f"ALTER TABLE {table} ADD CONSTRAINT {name} {foreign(table, name, definition)}")


def _with_tenant(table: str, name: str, definition: str) -> str:
    match = _KEY.match(definition)
    if match is None:
        raise RuntimeError(f"{table}.{name}: unexpected key {definition!r}")
    return f"{match.group(1)} ({match['columns']}, tenant){match['rest']}"


def _foreign_with_tenant(table: str, name: str, definition: str) -> str:
    match = _FOREIGN.match(definition)
    if match is None:
        raise RuntimeError(f"{table}.{name}: unexpected foreign key {definition!r}")
    return (
        f"FOREIGN KEY ({match['columns']}, tenant) "
        f"REFERENCES {match['table']}({match['target']}, tenant){match['rest']}"
    )


#: The same, for a script (``migrate --sql``): the catalog is read where it runs.
_EXTEND_KEYS_DO = r"""
DO $extend$
DECLARE
    r record;
BEGIN
    CREATE TEMPORARY TABLE sessionrepo_0018_keys ON COMMIT DROP AS
        SELECT conrelid::regclass::text AS tbl, conname, contype,
            pg_get_constraintdef(oid) AS definition
        FROM pg_constraint WHERE contype IN ('p', 'u', 'f')
        AND conrelid = ANY(ARRAY[{tables}]::regclass[]);
    FOR r IN SELECT * FROM sessionrepo_0018_keys WHERE contype = 'f' LOOP
        EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', r.tbl, r.conname);
    END LOOP;
    FOR r IN SELECT * FROM sessionrepo_0018_keys WHERE contype <> 'f' ORDER BY tbl, conname
    LOOP
        EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', r.tbl, r.conname);
        EXECUTE format('ALTER TABLE %s ADD CONSTRAINT %I %s', r.tbl, r.conname,
            regexp_replace(r.definition, '^(PRIMARY KEY|UNIQUE) \(([^)]*)\)',
                '\1 (\2, tenant)'));
    END LOOP;
    FOR r IN SELECT * FROM sessionrepo_0018_keys WHERE contype = 'f' ORDER BY tbl, conname
    LOOP
        EXECUTE format('ALTER TABLE %s ADD CONSTRAINT %I %s', r.tbl, r.conname,
            regexp_replace(r.definition,
                '^FOREIGN KEY \(([^)]*)\) REFERENCES ([^(]+)\(([^)]*)\)',
                'FOREIGN KEY (\1, tenant) REFERENCES \2(\3, tenant)'));
    END LOOP;
END
$extend$
"""


def _extend_keys_in_the_server(tables: Sequence[str]) -> str:
    return _EXTEND_KEYS_DO.replace("{tables}", ", ".join(f"'{t}'" for t in tables))


#: The Citus append function (0014, 0016, 0017) names unique keys in its ``ON CONFLICT``
#: clauses (a session's, the rollup's): each gets ``tenant`` appended, whatever else the
#: function says.
_FUNCTION = "sessionrepo_append"
_CONFLICT = re.compile(r"ON CONFLICT \((?P<columns>[^)]*)\)")


def _retarget_functions(bind: sa.Connection, *, back: bool = False) -> None:
    def retarget(match: re.Match[str]) -> str:
        columns = [c.strip() for c in match["columns"].split(",")]
        columns = [c for c in columns if c != "tenant"] if back else [*columns, "tenant"]
        return f"ON CONFLICT ({', '.join(columns)})"

    definitions = bind.exec_driver_sql(
        "SELECT pg_get_functiondef(oid) FROM pg_proc "
        "WHERE proname = %(name)s AND pronamespace = current_schema()::regnamespace",
        {"name": _FUNCTION},
    ).scalars()
    for definition in list(definitions):
        changed, count = _CONFLICT.subn(retarget, definition)
        if count == 0:
            raise RuntimeError(f"{_FUNCTION}: no ON CONFLICT to change")
        bind.exec_driver_sql(changed)


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "postgresql":
        tables = [t for t in _TENANT_TABLES if _exists(t)]
        for table in ["tenants", *tables]:
            op.execute(f"DROP POLICY IF EXISTS {_POLICY} ON {table}")
            op.execute(f"ALTER TABLE {table} NO FORCE ROW LEVEL SECURITY")
            op.execute(f"ALTER TABLE {table} DISABLE ROW LEVEL SECURITY")
        _retarget_functions(bind, back=True)
        _narrow_keys(bind, tables)
        for table in tables:
            op.execute(f"ALTER TABLE {table} DROP COLUMN tenant")
    op.drop_table("tenants")


def _narrow_keys(bind: sa.Connection, tables: Sequence[str]) -> None:
    """The keys as they were: ``tenant`` taken out again. Fails (as it must) when two
    tenants hold the same key: the store cannot go back to one tenant then."""
    _rebuild_keys(bind, tables, key=_without_tenant, foreign=_without_tenant)


def _without_tenant(table: str, name: str, definition: str) -> str:
    return definition.replace(", tenant)", ")")
