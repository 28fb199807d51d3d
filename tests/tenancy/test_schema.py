"""What migration 0018 made on PostgreSQL, checked against the models (``alembic check``
leaves the database's ``tenant`` column out: see ``migrations/env.py``)."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from sqlalchemy import ForeignKeyConstraint, PrimaryKeyConstraint, UniqueConstraint
from sqlalchemy.engine import make_url

from sessionrepo.dialects.postgresql.tenancy import TENANT_TABLES
from sessionrepo.models import adk as _adk  # noqa: F401 - registers its tables
from sessionrepo.models import privacy as _privacy  # noqa: F401
from sessionrepo.models import usage as _usage  # noqa: F401
from sessionrepo.models.tables import Base
from tests.conftest import PostgresServer

pytestmark = pytest.mark.postgres


@pytest.fixture
def conn(postgres_server: PostgresServer) -> Iterator[psycopg.Connection]:
    name = postgres_server.new_database()
    url = make_url(postgres_server.url_for(name)).set(drivername="postgresql")
    with psycopg.connect(url.render_as_string(hide_password=False)) as connection:
        yield connection
    postgres_server.drop(name)


def test_the_tables_with_a_tenant_are_the_dialects_list(conn: psycopg.Connection) -> None:
    rows = conn.execute(
        "SELECT table_name FROM information_schema.columns "
        "WHERE table_schema = current_schema() AND column_name = 'tenant'"
    ).fetchall()
    assert {name for (name,) in rows} == TENANT_TABLES | {"tenants"}
    # Every other table is store-wide: no conversation data in it.
    tables = {
        name
        for (name,) in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
        )
    }
    assert tables - TENANT_TABLES - {"tenants"} == {
        "alembic_version",
        "privacy_keys",
        "search_index_state",
        "usage_prices",
    }


def test_every_tenant_table_has_a_forced_policy_on_the_connecting_role(
    conn: psycopg.Connection,
) -> None:
    rows = conn.execute(
        "SELECT c.relname, c.relrowsecurity, c.relforcerowsecurity, p.polcmd, "
        "pg_get_expr(p.polqual, p.polrelid), pg_get_expr(p.polwithcheck, p.polrelid) "
        "FROM pg_class c LEFT JOIN pg_policy p ON p.polrelid = c.oid "
        "WHERE c.relnamespace = current_schema()::regnamespace AND c.relname = ANY(%s)",
        [sorted(TENANT_TABLES | {"tenants"})],
    ).fetchall()
    assert len(rows) == len(TENANT_TABLES) + 1  # one policy each
    for name, enabled, forced, command, using, check in rows:
        assert (enabled, forced, command) == (True, True, "*"), name
        assert using == check == "((tenant)::text = (CURRENT_USER)::text)", name


def _keys(conn: psycopg.Connection, table: str) -> dict[str, tuple[str, list[str]]]:
    rows = conn.execute(
        "SELECT con.conname, con.contype, array_agg(a.attname ORDER BY k.n) "
        "FROM pg_constraint con CROSS JOIN LATERAL unnest(con.conkey) WITH ORDINALITY k(num, n) "
        "JOIN pg_attribute a ON a.attrelid = con.conrelid AND a.attnum = k.num "
        "WHERE con.conrelid = %s::regclass AND con.contype IN ('p', 'u', 'f') "
        "GROUP BY con.conname, con.contype",
        [table],
    ).fetchall()
    return {name: (kind, list(columns)) for name, kind, columns in rows}


def test_every_key_is_the_models_with_tenant_last(conn: psycopg.Connection) -> None:
    kinds = {PrimaryKeyConstraint: "p", UniqueConstraint: "u", ForeignKeyConstraint: "f"}
    for table in sorted(TENANT_TABLES - {"message_search"}):  # that one has no model
        model = Base.metadata.tables[table]
        expected = {
            str(constraint.name): (kind, [*(c.name for c in constraint.columns), "tenant"])
            for constraint in model.constraints
            for cls, kind in kinds.items()
            if isinstance(constraint, cls)
        }
        assert _keys(conn, table) == expected, table
    assert _keys(conn, "message_search") == {
        "pk_message_search": ("p", ["session_id", "seq", "tenant"])
    }
