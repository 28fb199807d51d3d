"""The console's access rules, against ``sessionrepo serve`` itself: loopback only
without a token; with ``SESSIONREPO_CONSOLE_TOKEN`` every client must give it (bearer or
the sign-in cookie); read-only unless ``--allow-writes``, and then only through forms
that pass the CSRF check; the security headers on every answer; no password shown."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from conftest import Server, Watched
from sqlalchemy.engine import make_url

from sessionrepo import Message, open_repository
from sessionrepo.cli import main
from sessionrepo.web.security import CONTENT_SECURITY_POLICY

pytestmark = pytest.mark.slow

#: The guards act on HTTP requests before any store is read: one backend shows them (the
#: writes and the password test, which read and change the store, run on both).
GUARDS_ONLY = pytest.mark.parametrize("backend", [pytest.param("sqlite", marks=pytest.mark.sqlite)])

TOKEN = "t0ken-for-the-console-tests-0123456789"
PASSWORD = "s3cret-in-the-url"


@pytest.fixture
def store(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A small store; on PostgreSQL its URL carries a password (the server trusts
    loopback, so it is accepted and must never be shown)."""
    if backend == "sqlite":
        path = tmp_path / "small.db"
        shutil.copyfile(request.getfixturevalue("sqlite_template"), path)
        url = f"sqlite:///{path}"
        cleanup = None
    else:
        server = request.getfixturevalue("postgres_server")
        name = server.new_database()
        url = (
            make_url(server.url_for(name))
            .set(password=PASSWORD)
            .render_as_string(hide_password=False)
        )
        cleanup = (server, name)
    repository = open_repository(url)
    try:
        repository.append(
            "sess-a", [Message(role="user", content="hello")], source="cli", title="A session"
        )
    finally:
        repository.close()
    yield url
    if cleanup is not None:
        cleanup[0].drop(cleanup[1])


def _run(*args: str, env: dict[str, str] | None = None) -> Any:
    return CliRunner().invoke(main, list(args), env=env or {"SESSIONREPO_CONSOLE_TOKEN": ""})


def test_a_bind_beyond_the_loopback_needs_a_token(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'x.db'}"
    refused = _run("--url", url, "serve", "--host", "0.0.0.0")
    assert refused.exit_code == 2
    assert "needs a token: set SESSIONREPO_CONSOLE_TOKEN" in refused.output
    weak = _run("--url", url, "serve", env={"SESSIONREPO_CONSOLE_TOKEN": "short"})
    assert weak.exit_code == 2
    assert "at least 24 characters" in weak.output
    assert "short" not in weak.output.replace("SESSIONREPO", "")


@GUARDS_ONLY
def test_without_a_token_only_loopback_names_are_answered(store: str, serve: Any) -> None:
    console: Server = serve(store)
    answer = httpx.get(console.url("/api/sessions"))
    assert answer.status_code == 200
    for name, value in answer.headers.items():
        if name == "content-security-policy":
            assert value == CONTENT_SECURITY_POLICY
    assert answer.headers["x-content-type-options"] == "nosniff"
    assert "'unsafe-inline'" not in CONTENT_SECURITY_POLICY
    # A page that rebinds its DNS name to 127.0.0.1 sends its own Host: refused.
    rebound = httpx.get(console.url("/api/sessions"), headers={"Host": "attacker.example"})
    assert rebound.status_code == 421
    # Read-only: no write form, and a forged POST is refused.
    page = httpx.get(console.url("/session?id=sess-a"))
    assert "/actions/end" not in page.text
    forged = httpx.post(console.url("/actions/end"), data={"id": "sess-a", "csrf": "x"})
    assert forged.status_code == 403
    assert httpx.get(console.url("/api/session?id=sess-a")).json()["session"]["ended_at"] is None


@GUARDS_ONLY
def test_with_a_token_every_client_must_give_it(store: str, serve: Any, page: Watched) -> None:
    console: Server = serve(store, env={"SESSIONREPO_CONSOLE_TOKEN": TOKEN})
    assert httpx.get(console.url("/api/sessions")).status_code == 401
    assert httpx.get(console.url("/metrics")).status_code == 401
    assert httpx.get(console.url("/openapi.json")).status_code == 401
    wrong = httpx.get(console.url("/api/sessions"), headers={"Authorization": "Bearer " + "x" * 38})
    assert wrong.status_code == 401
    right = httpx.get(console.url("/api/sessions"), headers={"Authorization": f"Bearer {TOKEN}"})
    assert right.status_code == 200
    assert [s["id"] for s in right.json()["sessions"]] == ["sess-a"]
    # With a token, any Host is answered (the token is what protects it).
    other = httpx.get(
        console.url("/api/sessions"),
        headers={"Authorization": f"Bearer {TOKEN}", "Host": "console.internal"},
    )
    assert other.status_code == 200

    tab = page.page
    tab.goto(console.url("/"))
    assert tab.url.endswith("/login")
    tab.fill("input[name=token]", "not-the-token-at-all")
    tab.click("button[type=submit]")
    assert tab.locator("#error").inner_text() == "That token is not the console's."
    page.errors.clear()  # the 401 status itself
    tab.fill("input[name=token]", TOKEN)
    tab.click("button[type=submit]")
    tab.wait_for_load_state()
    assert tab.locator("tr.session-row").count() == 1
    assert tab.evaluate("document.cookie") == ""  # HttpOnly: no script can read it
    cookies = tab.context.cookies()
    assert TOKEN not in str(cookies)  # the cookie is a MAC of the token, not the token
    assert TOKEN not in tab.content()
    assert page.errors == []


def test_allow_writes_offers_csrf_checked_forms(store: str, serve: Any, page: Watched) -> None:
    console: Server = serve(store, "--allow-writes")
    tab = page.page
    tab.goto(console.url("/session?id=sess-a"))
    tab.fill("input[name=reason]", "operator-closed")
    tab.click("#end")
    tab.wait_for_load_state()
    assert tab.locator("#done").inner_text() == "The session was ended."
    assert tab.locator("#session-status").inner_text().startswith("ended")
    tab.click("#reopen")
    tab.wait_for_load_state()
    assert tab.locator("#session-status").inner_text() == "open"
    tab.goto(console.url("/health"))
    tab.click("#reindex")
    tab.wait_for_load_state()
    assert tab.locator("#done").inner_text().startswith("The search index is being rebuilt")
    # The health page reloads itself while the rebuild runs, until it is done.
    tab.wait_for_selector("#reindex-status.done", timeout=60_000)
    assert tab.locator("#reindex-status").inner_text().startswith("The index was rebuilt")
    assert page.errors == []

    # The forms' CSRF token is required, and a foreign Origin is refused even with it.
    csrf = tab.locator("input[name=csrf]").first.get_attribute("value")
    assert httpx.post(console.url("/actions/end"), data={"id": "sess-a"}).status_code == 403
    foreign = httpx.post(
        console.url("/actions/end"),
        data={"id": "sess-a", "csrf": csrf},
        headers={"Origin": "http://attacker.example"},
    )
    assert foreign.status_code == 403
    assert httpx.get(console.url("/api/session?id=sess-a")).json()["session"]["ended_at"] is None


def test_no_page_shows_the_database_password(store: str, serve: Any) -> None:
    console: Server = serve(store, "--allow-writes")
    for path in ("/", "/session?id=sess-a", "/search?q=hello", "/health", "/api/health"):
        answer = httpx.get(console.url(path))
        assert answer.status_code == 200, path
        assert PASSWORD not in answer.text
    assert PASSWORD not in console.stop()  # nor the server's own output
