"""The console of a store shared by several tenants (issue 28): as the operator it offers a
tenant picker and reads each tenant's pages through a repository opened for that tenant
(the policies hold it); as a tenant's role, or with ``SESSIONREPO_TENANT``, it shows that
tenant and no picker. Its metrics carry the tenant each page was read as."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy.engine import make_url
from starlette.testclient import TestClient

from sessionrepo import observability, open_repository
from sessionrepo.ops.tenants import create_tenant
from sessionrepo.web import create_app
from tests.conftest import PostgresServer

pytestmark = pytest.mark.postgres


@dataclass
class Store:
    a: str
    b: str
    operator: str
    names: tuple[str, str]


def _conninfo(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@pytest.fixture
def store(postgres_server: PostgresServer) -> Iterator[Store]:
    """A migrated store with two tenants, each holding a session ``shared:1`` (ids are per
    tenant) with words of its own, and an operator role."""
    tag = uuid.uuid4().hex[:8]
    a, b, operator = f"ta_{tag}", f"tb_{tag}", f"op_{tag}"
    name = postgres_server.new_database()
    admin = postgres_server.url_for(name)
    roles = (a, b, operator)
    try:
        urls = [create_tenant(admin, role, password=False).url for role in (a, b)]
        made = create_tenant(admin, operator, password=False, operator=True)
        a_url, b_url = (url.render_as_string(hide_password=False) for url in urls)
        for url, word in ((a_url, "apple"), (b_url, "banana")):
            with open_repository(url, embedder=False) as repo:
                repo.append("shared:1", [{"role": "user", "content": f"{word} words"}])
                if word == "banana":
                    repo.append("only:b", [{"role": "user", "content": "banana only"}])
        yield Store(
            a=a_url,
            b=b_url,
            operator=made.url.render_as_string(hide_password=False),
            names=(a, b),
        )
    finally:
        with psycopg.connect(_conninfo(admin), autocommit=True) as conn:
            for role in roles:
                if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role]).fetchone():
                    conn.execute(f"DROP OWNED BY {role}")
        postgres_server.drop(name)
        with psycopg.connect(_conninfo(postgres_server.url_for("postgres")), autocommit=True) as c:
            for role in roles:
                c.execute(f"DROP ROLE IF EXISTS {role}")


def _csrf(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found is not None
    return found.group(1)


def test_the_operator_picks_a_tenant_and_sees_only_its_conversations(store: Store) -> None:
    a, b = store.names
    repository = open_repository(store.operator, embedder=False)
    app = create_app(repository, url=store.operator, allow_writes=True)
    try:
        with TestClient(app, base_url="http://127.0.0.1") as client:
            # No tenant chosen: the tenants, their session counts, a link to each.
            landing = client.get("/")
            assert landing.status_code == 200
            assert 'id="tenant-picker"' in landing.text
            rows = dict(
                re.findall(
                    r'data-tenant="(\w+)">\s*<td><a class="tenant-link" href="[^"]+">\w+</a>'
                    r'</td>\s*<td class="num">(\d+)</td>',
                    landing.text,
                )
            )
            assert rows == {a: "1", b: "2"}
            assert f'href="/?tenant={a}"' in landing.text
            assert "apple" not in landing.text
            assert "banana" not in landing.text
            # A listing asked for without a tenant keeps its filters in the links.
            asked = client.get("/search", params={"q": "words"}).text
            assert f'href="/search?q=words&amp;tenant={a}"' in asked

            # As a tenant: its sessions, every link and form keeping tenant=.
            listing = client.get("/", params={"tenant": a}).text
            assert "shared:1" in listing
            assert "only:b" not in listing
            assert "banana" not in listing
            assert f'href="/session?id=shared%3A1&amp;tenant={a}"' in listing
            assert f'href="/search?tenant={a}"' in listing
            assert f'<option value="{a}" selected>' in listing
            assert f'<input type="hidden" name="tenant" value="{a}">' in listing
            # The same id, another tenant's session.
            assert (
                "banana words"
                in client.get("/session", params={"id": "shared:1", "tenant": b}).text
            )
            assert (
                "apple words" in client.get("/session", params={"id": "shared:1", "tenant": a}).text
            )
            assert client.get("/session", params={"id": "only:b", "tenant": a}).status_code == 404
            found = client.get("/search", params={"q": "words", "tenant": a}).text
            assert "apple" in found
            assert "banana" not in found
            assert f"tenant={a}" in re.search(r'class="hit-link" href="([^"]+)"', found).group(1)  # type: ignore[union-attr]

            # The JSON API takes the same parameter, and needs it here.
            listed = client.get("/api/sessions", params={"tenant": b}).json()
            assert sorted(s["id"] for s in listed["sessions"]) == ["only:b", "shared:1"]
            unscoped = client.get("/api/sessions")
            assert unscoped.status_code == 400
            assert "tenant" in unscoped.json()["error"]

            # A tenant that is not one of this store's, however spelled: refused, not echoed.
            for wrong in ("nosuch", '"><script>alert(1)</script>', "TA"):
                refused = client.get("/", params={"tenant": wrong})
                assert refused.status_code == 404
                assert "<script>alert" not in refused.text

            # A write goes to the tenant the form names, and back to its page.
            page = client.get("/session", params={"id": "shared:1", "tenant": a}).text
            ended = client.post(
                "/actions/end",
                data={"id": "shared:1", "csrf": _csrf(page), "tenant": a},
                follow_redirects=False,
            )
            assert ended.status_code == 303
            assert ended.headers["location"] == f"/session?id=shared%3A1&done=ended&tenant={a}"
            ended_a = client.get("/api/session", params={"id": "shared:1", "tenant": a}).json()
            ended_b = client.get("/api/session", params={"id": "shared:1", "tenant": b}).json()
            assert ended_a["session"]["ended_at"] is not None
            assert ended_b["session"]["ended_at"] is None

            # Read as the tenant's role (the policies hold it), one repository per tenant.
            tenants = app.state.console.tenants
            opened = tenants.scope(a).repository
            assert opened is tenants.scope(a).repository
            assert opened.database.tenant == a
            assert (
                opened.database.read(
                    lambda conn: conn.exec_driver_sql("SELECT current_user").scalar()
                )
                == a
            )
        # Closed with the app.
        assert tenants._opened == {}
    finally:
        repository.close()


@pytest.mark.parametrize("how", ["role", "environment"])
def test_a_tenant_console_shows_its_tenant_and_no_picker(
    store: Store, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = store.names
    if how == "role":
        repository = open_repository(store.b, embedder=False)
    else:  # the operator's URL, acting as one tenant
        monkeypatch.setenv("SESSIONREPO_TENANT", b)
        repository = open_repository(store.operator, embedder=False)
    try:
        with TestClient(create_app(repository), base_url="http://127.0.0.1") as client:
            listing = client.get("/").text
            assert "only:b" in listing
            assert "tenant-picker" not in listing
            assert "tenant=" not in listing
            assert "banana words" in client.get("/session", params={"id": "shared:1"}).text
            assert client.get("/", params={"tenant": b}).status_code == 200
            assert client.get("/", params={"tenant": a}).status_code == 404
            assert len(client.get("/api/sessions").json()["sessions"]) == 2
    finally:
        repository.close()


def test_the_console_metrics_carry_the_tenant_each_page_was_read_as(store: Store) -> None:
    a, b = store.names
    operator = str(make_url(store.operator).username)
    registry = CollectorRegistry()
    observability.enable_metrics(registry)
    repository = open_repository(store.operator, embedder=False)

    def loads(tenant: str) -> float:
        labels = {"backend": repository.backend, "tenant": tenant}
        return registry.get_sample_value("sessionrepo_loads_total", labels) or 0.0

    try:
        with TestClient(
            create_app(repository, metrics=True), base_url="http://127.0.0.1"
        ) as client:
            for tenant in (a, a, b):
                client.get("/session", params={"id": "shared:1", "tenant": tenant})
            assert client.get("/metrics").status_code == 200
            # The console's own connection is watched: the operator's role.
            watched = {"source": "store", "at": repository.display_url, "tenant": operator}
            assert registry.get_sample_value("sessionrepo_watch_up", watched) == 1
        assert loads(b) > 0
        assert loads(a) == 2 * loads(b)  # two pages as a, one as b: each counted as its own
        assert loads(operator) == 0  # nothing was read as the operator itself
    finally:
        repository.close()
        observability.disable_metrics()
