"""Two gateways, one PostgreSQL store: each tenant role sees and changes only its own rows,
whatever it connects with (plain psycopg, or the API), and the API on another tenant's
session id behaves exactly as on one that does not exist (issue 28)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from sqlalchemy.engine import make_url

from sessionrepo import NotFound, TenantMismatch, open_repository
from sessionrepo.dialects.postgresql.tenancy import TENANT_TABLES
from sessionrepo.models.privacy import RetentionPolicy
from sessionrepo.models.usage import Usage
from sessionrepo.ops.doctor import run_doctor
from sessionrepo.ops.tenants import create_tenant, drop_tenant, list_tenants
from tests.conftest import CitusServer, PostgresServer

pytestmark = pytest.mark.postgres


@dataclass
class Store:
    admin: str
    a: str
    b: str
    names: tuple[str, str]


@pytest.fixture(params=["postgres", pytest.param("citus", marks=pytest.mark.citus)])
def store(request: pytest.FixtureRequest) -> Iterator[Store]:
    """A migrated store and two tenant roles on it: on PostgreSQL a database of its own; on
    a Citus coordinator (when there is one) a schema, which the roles are given as their
    search path."""
    tag = uuid.uuid4().hex[:8]
    a, b = f"ta_{tag}", f"tb_{tag}"
    if request.param == "citus":
        citus: CitusServer = request.getfixturevalue("citus_server")
        admin = citus.new_schema()
        schema = str(make_url(admin).username)
        done = lambda: citus.drop(admin)  # noqa: E731 - the schema's grants go with it
        server_url = citus.admin_url.render_as_string(hide_password=False)
    else:
        server: PostgresServer = request.getfixturevalue("postgres_server")
        name = server.new_database()
        admin = server.url_for(name)
        schema = None
        done = lambda: server.drop(name)  # noqa: E731 - the roles' privileges go with it
        server_url = server.url_for("postgres")
    urls = [create_tenant(admin, role, password=False).url for role in (a, b)]
    if schema is not None:
        with psycopg.connect(_conninfo(admin), autocommit=True) as conn:
            for role in (a, b):
                conn.execute(f'ALTER ROLE {role} SET search_path = "{schema}"')  # type: ignore[arg-type]
    yield Store(
        admin=admin,
        a=urls[0].render_as_string(hide_password=False),
        b=urls[1].render_as_string(hide_password=False),
        names=(a, b),
    )
    with psycopg.connect(_conninfo(admin), autocommit=True) as conn:
        for role in (a, b):
            if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role]).fetchone():
                conn.execute(f"DROP OWNED BY {role}")  # type: ignore[arg-type]  # (a test may drop it)
    done()
    with psycopg.connect(_conninfo(server_url), autocommit=True) as conn:
        for role in (a, b):
            conn.execute(f"DROP ROLE IF EXISTS {role}")  # type: ignore[arg-type]


def _conninfo(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def _fill(url: str, word: str) -> None:
    """Rows in every kind of table, written through the API as the URL's tenant."""
    with open_repository(url, embedder=False) as repo:
        repo.append(
            "discord:123",
            [{"role": "user", "content": f"shared id, {word}"}],
            source="discord",
            user_id="alice",
            usage=[Usage(model="m", input_tokens=5, output_tokens=2)],
        )
        repo.append("own:" + word, [{"role": "user", "content": f"only {word}"}], source="web")
        repo.append("gone:" + word, [{"role": "user", "content": "erase me"}], source="web")
        repo.erase(session_id="gone:" + word)
        repo.set_retention_policy(RetentionPolicy(source="discord", ended_days=7))
        repo.catch_up_search_index()
    with psycopg.connect(_conninfo(url), autocommit=True) as conn:
        conn.execute(
            "INSERT INTO adk_app_states (app_name, state, update_time) VALUES ('app', '{}', 0)"
        )


def _visible(url: str) -> dict[str, tuple[int, int]]:
    """Per tenant table: rows the role sees, and of those, rows not its own."""
    seen = {}
    with psycopg.connect(_conninfo(url)) as conn:
        for table in sorted(TENANT_TABLES | {"tenants"}):
            seen[table] = conn.execute(
                f"SELECT count(*), count(*) FILTER (WHERE tenant <> current_user) FROM {table}"  # type: ignore[arg-type]
            ).fetchone()
    return seen  # type: ignore[return-value]


def test_each_role_sees_only_its_own_rows_in_every_table(store: Store) -> None:
    _fill(store.a, "apple")
    _fill(store.b, "banana")
    with psycopg.connect(_conninfo(store.admin)) as conn:
        stored = dict(
            conn.execute(
                "SELECT 'sessions', count(DISTINCT tenant) FROM sessions UNION ALL "
                "SELECT 'messages', count(DISTINCT tenant) FROM messages"
            ).fetchall()
        )
    assert stored == {"sessions": 2, "messages": 2}  # both tenants' rows are there
    for url in (store.a, store.b):
        seen = _visible(url)
        assert all(foreign == 0 for _, foreign in seen.values()), seen
        # Not vacuous: the tables the fill wrote show the role its own rows.
        for table in ("sessions", "messages", "usage_records", "erased_sessions"):
            assert seen[table][0] > 0, table
        for table in ("privacy_audit", "retention_policies", "message_search", "adk_app_states"):
            assert seen[table][0] > 0, table


def test_a_role_cannot_insert_update_or_delete_another_tenants_rows(store: Store) -> None:
    _fill(store.a, "apple")
    a, _ = store.names
    with psycopg.connect(_conninfo(store.b), autocommit=True) as conn:
        for table in sorted(TENANT_TABLES | {"tenants"}):
            assert (
                conn.execute(
                    f"UPDATE {table} SET tenant = tenant WHERE tenant = %s",  # type: ignore[arg-type]
                    [a],
                ).rowcount
                == 0
            )
            assert (
                conn.execute(
                    f"DELETE FROM {table} WHERE tenant = %s",  # type: ignore[arg-type]
                    [a],
                ).rowcount
                == 0
            )
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security"):
            conn.execute(
                "INSERT INTO sessions (id, source, started_at, last_active_at, tenant) "
                "VALUES ('x', 'web', now(), now(), %s)",
                [a],
            )
        conn.execute(
            "INSERT INTO sessions (id, source, started_at, last_active_at) "
            "VALUES ('mine', 'web', now(), now())"
        )
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security"):
            conn.execute("UPDATE sessions SET tenant = %s", [a])  # its own row, given to A
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("TRUNCATE messages")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("ALTER TABLE sessions DISABLE ROW LEVEL SECURITY")
    with psycopg.connect(_conninfo(store.a)) as conn:
        assert conn.execute("SELECT count(*) FROM messages").fetchone() == (2,)  # one erased


def test_two_tenants_keep_the_same_session_id_apart(store: Store) -> None:
    with open_repository(store.a, embedder=False) as a, open_repository(store.b) as b:
        key = uuid.uuid4()
        first = a.append("discord:123", [{"role": "user", "content": "A", "client_msg_uuid": key}])
        # The same id and the same message key: no conflict, and B learns nothing.
        second = b.append("discord:123", [{"role": "user", "content": "B", "client_msg_uuid": key}])
        assert first.inserted == second.inserted == [key]
        assert [m.content for m in a.load_transcript("discord:123")] == ["A"]
        assert [m.content for m in b.load_transcript("discord:123")] == ["B"]
        assert a.get_session("discord:123").message_count == 1


def _outcome(call: Any, session_id: str) -> tuple[str, str]:
    try:
        return ("value", repr(call(session_id)))
    except Exception as exc:  # the exception's type and text, with the id made neutral
        return (type(exc).__name__, str(exc))


def test_api_calls_on_another_tenants_session_behave_as_on_none(store: Store) -> None:
    with open_repository(store.b, embedder=False) as b:
        b.append("b-only", [{"role": "user", "content": "private words"}], source="web")
        b.catch_up_search_index()
    with open_repository(store.a, embedder=False) as a:
        calls: dict[str, Any] = {
            "get_session": a.get_session,
            "load_transcript": a.load_transcript,
            "load_openai": a.load_openai,
            "end_session": lambda sid: a.end_session(sid, "done"),
            "reopen_session": a.reopen_session,
            "rewind": lambda sid: a.rewind(sid, 0),
            "pop_last": a.pop_last,
            "clear_session": a.clear_session,
            "fork_session": lambda sid: a.fork_session(sid, 1, "fork-" + sid),
            "session_chain": a.session_chain,
            "count_messages": lambda sid: a.count_messages([sid]),
            "search": lambda sid: [h.session_id for h in a.search("private", session_id=sid)],
        }
        for name, call in calls.items():
            taken = _outcome(call, "b-only")
            missing = _outcome(call, "no-such")
            assert taken == (missing[0], missing[1].replace("no-such", "b-only")), name
        assert a.list_sessions().sessions == []
        assert a.count_sessions() == 0
        assert a.search("private") == []
        with pytest.raises(NotFound):
            a.get_session("b-only")
    with open_repository(store.b, embedder=False) as b:  # and B's session is untouched
        assert [m.content for m in b.load_transcript("b-only")] == ["private words"]


def test_search_as_one_tenant_never_returns_the_others_messages(store: Store) -> None:
    _fill(store.a, "apple")
    _fill(store.b, "banana")
    with open_repository(store.a, embedder=False) as a:
        assert a.search("banana") == []
        hits = a.search("apple")
        assert hits
        assert {h.session_id for h in hits} <= {"discord:123", "own:apple"}
        # The shared id's hit is A's message, not B's.
        assert all("banana" not in (h.snippet or "") for h in a.search("shared"))


def test_a_tenants_reindex_rebuilds_its_own_entries_and_leaves_the_others(store: Store) -> None:
    """``reindex`` as a tenant: its entries rebuilt (the policies hold the rebuild to
    them), the other tenant's untouched; as a role that sees every tenant, refused
    before anything is changed (its rebuild would write the entries as its own)."""
    _fill(store.a, "apple")
    _fill(store.b, "banana")
    with open_repository(store.a, embedder=False) as a:
        assert a.reindex() == 2  # its two live messages (the erased session has none)
    with open_repository(store.b, embedder=False) as b:
        assert {h.session_id for h in b.search("banana")} == {"discord:123", "own:banana"}
    with open_repository(store.a, embedder=False) as a:
        assert {h.session_id for h in a.search("apple")} == {"discord:123", "own:apple"}
    with (
        open_repository(store.admin, embedder=False) as admin,
        pytest.raises(TenantMismatch, match="as each tenant"),
    ):
        admin.reindex()
    with open_repository(store.b, embedder=False) as b:
        assert len(b.search("banana")) == 2


def test_doctor_fails_a_gateway_connected_as_a_superuser(store: Store) -> None:
    admin = run_doctor(store.admin)
    check = next(c for c in admin.checks if c.name.endswith(".tenancy"))
    assert check.status == "fail"
    assert "superuser" in check.detail
    tenant = run_doctor(store.a)
    check = next(c for c in tenant.checks if c.name.endswith(".tenancy"))
    assert check.status == "ok"


def test_tenants_are_listed_and_dropped_with_their_data(store: Store) -> None:
    _fill(store.a, "apple")
    a, b = store.names
    listed = {t.name: t.sessions for t in list_tenants(store.admin)}
    assert listed == {a: 2, b: 0}
    assert [t.name for t in list_tenants(store.b)] == [b]  # a tenant sees itself
    from sessionrepo.ops.tenants import TenantError

    with pytest.raises(TenantError, match="holds 2 sessions"):
        drop_tenant(store.admin, a)
    assert drop_tenant(store.admin, a, delete_data=True) == 2
    with psycopg.connect(_conninfo(store.admin)) as conn:
        for table in sorted(TENANT_TABLES):
            rows = conn.execute(
                f"SELECT count(*) FROM {table} WHERE tenant = %s",  # type: ignore[arg-type]
                [a],
            ).fetchone()
            assert rows == (0,), table
        assert conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [a]).fetchone() is None
