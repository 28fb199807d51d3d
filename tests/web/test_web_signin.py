"""Console sign-in with ``SESSIONREPO_CONSOLE_TOKEN``: a strong token required at start,
a fresh random cookie per sign-in with a bounded lifetime, that sign-out revokes and a
restart invalidates; the operator lands on the page asked for (a local path only: no
open redirect); a warning when serving beyond the loopback over plain HTTP; the 421 and
the CSRF refusal say what is wrong and what to do, and doing it works."""

from __future__ import annotations

import secrets
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from conftest import Server, Watched

from sessionrepo import Message, open_repository
from sessionrepo.cli import main
from sessionrepo.errors import InvalidArgument
from sessionrepo.web import security
from sessionrepo.web.security import COOKIE, MAKE_TOKEN, Guard, check_token, local_path

pytestmark = pytest.mark.slow

TOKEN = secrets.token_urlsafe(32)
ONE_BACKEND = pytest.mark.parametrize("backend", [pytest.param("sqlite", marks=pytest.mark.sqlite)])


@pytest.fixture
def store(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if backend == "sqlite":
        path = tmp_path / "small.db"
        shutil.copyfile(request.getfixturevalue("sqlite_template"), path)
        url = f"sqlite:///{path}"
        cleanup = None
    else:
        server = request.getfixturevalue("postgres_server")
        name = server.new_database()
        url = server.url_for(name)
        cleanup = (server, name)
    repository = open_repository(url)
    try:
        repository.append("sess-a", [Message(role="user", content="hello")], source="cli")
    finally:
        repository.close()
    yield url
    if cleanup is not None:
        cleanup[0].drop(cleanup[1])


@pytest.mark.parametrize(
    "weak",
    ["a" * 16, " " * 20, "a" * 40, "abc" * 12, "a" * 31 + "b", "correct horse battery staple"],
)
def test_a_weak_token_is_refused_saying_how_to_make_one(weak: str, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'x.db'}"
    refused = CliRunner().invoke(
        main, ["--url", url, "serve"], env={"SESSIONREPO_CONSOLE_TOKEN": weak}
    )
    assert refused.exit_code == 2
    assert "too weak" in refused.output
    assert "secrets.token_urlsafe(32)" in refused.output
    if weak.strip():  # never quoted
        assert weak not in refused.output.replace("SESSIONREPO_CONSOLE_TOKEN", "")
    assert not (tmp_path / "x.db").exists()


def test_strong_tokens_pass_the_check() -> None:
    for _ in range(50):
        check_token(secrets.token_urlsafe(32))
        check_token(secrets.token_hex(24))
    with pytest.raises(InvalidArgument, match="too weak"):
        check_token("Aa1" * 10)
    assert MAKE_TOKEN.startswith("python -c")


def test_a_sign_in_expires_after_its_lifetime(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr(security.time, "monotonic", lambda: now[0])
    guard = Guard(token=TOKEN, session_lifetime=60)
    first, second = guard.sign_in(), guard.sign_in()
    assert first != second
    assert guard.signed_in(first)
    assert TOKEN not in first
    now[0] += 59
    assert guard.signed_in(first)
    now[0] += 2
    assert not guard.signed_in(first)
    assert not guard.signed_in(second)
    third = guard.sign_in()
    guard.sign_out(third)
    assert not guard.signed_in(third)
    assert guard.sessions == {}


def test_only_a_local_path_is_a_sign_in_target() -> None:
    assert local_path("/session?id=a%20b#m3") == "/session?id=a%20b#m3"
    assert local_path("/health") == "/health"
    for hostile in (
        None,
        "",
        "//evil.example/x",
        "/\\evil.example",
        "https://evil.example/",
        "javascript:alert(1)",
        "evil.example",
        "/\tx",
        "/\x00",
        " /x",
    ):
        assert local_path(hostile) == "/", hostile


def _cookie(tab: Any) -> dict[str, Any]:
    (cookie,) = [c for c in tab.context.cookies() if c["name"] == COOKIE]
    return dict(cookie)


def _sign_in(tab: Any, console: Server, path: str) -> None:
    tab.goto(console.url(path))
    assert "/login" in tab.url
    tab.fill("input[name=token]", TOKEN)
    tab.click("form.login button[type=submit]")
    tab.wait_for_load_state()


def test_sign_in_lands_on_the_page_asked_for_and_sign_out_revokes(
    store: str, serve: Any, page: Watched, browser: Any, tmp_path: Path
) -> None:
    console: Server = serve(store, "--session-hours", "2", env={"SESSIONREPO_CONSOLE_TOKEN": TOKEN})
    tab = page.page
    _sign_in(tab, console, "/session?id=sess-a")
    assert tab.url == console.url("/session?id=sess-a")
    assert tab.locator("#session-id").inner_text() == "sess-a"
    cookie = _cookie(tab)
    assert cookie["httpOnly"]
    assert cookie["sameSite"] == "Strict"
    assert 2 * 3600 - 120 < cookie["expires"] - time.time() <= 2 * 3600  # bounded lifetime
    # Another sign-in gets another cookie.
    other = browser.new_context()
    try:
        second = other.new_page()
        _sign_in(second, console, "/")
        assert _cookie(second)["value"] != cookie["value"]
    finally:
        other.close()

    def replay(value: str) -> int:
        return httpx.get(console.url("/api/sessions"), cookies={COOKIE: value}).status_code

    assert replay(cookie["value"]) == 200
    tab.click("#sign-out")
    tab.wait_for_load_state()
    assert tab.url.endswith("/login")
    assert [c for c in tab.context.cookies() if c["name"] == COOKIE] == []
    assert replay(cookie["value"]) == 401  # revoked on the server, not only forgotten
    # A restart signs everyone out: the cookie of the first run proves nothing.
    _sign_in(tab, console, "/")
    value = _cookie(tab)["value"]
    console.stop()
    restarted: Server = serve(store, env={"SESSIONREPO_CONSOLE_TOKEN": TOKEN})
    assert httpx.get(restarted.url("/api/sessions"), cookies={COOKIE: value}).status_code == 401
    # Behind a TLS reverse proxy on this machine (X-Forwarded-Proto: https), the cookie
    # is marked Secure; over plain HTTP it cannot be (the browser would drop it).
    signed = [
        httpx.post(
            restarted.url("/login"), data={"token": TOKEN}, headers=headers, follow_redirects=False
        ).headers["set-cookie"]
        for headers in ({"X-Forwarded-Proto": "https"}, {})
    ]
    assert "secure" in signed[0].lower()
    assert "secure" not in signed[1].lower()
    assert "max-age=43200" in signed[1].lower()  # the default lifetime: 12 h
    # No open redirect: a foreign target lands on /.
    for hostile in ("//evil.example/", "https://evil.example/", "/\\evil.example"):
        answer = httpx.post(
            restarted.url("/login"), data={"token": TOKEN, "next": hostile}, follow_redirects=False
        )
        assert (answer.status_code, answer.headers["location"]) == (303, "/")
    assert page.errors == []


@ONE_BACKEND
def test_serving_beyond_the_loopback_warns_about_plain_http(store: str, serve: Any) -> None:
    console: Server = serve(store, env={"SESSIONREPO_CONSOLE_TOKEN": TOKEN}, host="0.0.0.0")
    assert httpx.get(console.url("/api/sessions"), headers={"Authorization": f"Bearer {TOKEN}"})
    log = console.stop()
    assert "plain HTTP" in log
    assert "TLS reverse proxy" in log
    quiet: Server = serve(store, env={"SESSIONREPO_CONSOLE_TOKEN": TOKEN})
    assert "plain HTTP" not in quiet.stop()


@ONE_BACKEND
def test_the_421_says_what_is_wrong_and_what_to_do(store: str, serve: Any) -> None:
    console: Server = serve(store)
    answer = httpx.get(console.url("/"), headers={"Host": "rebound.example"})
    assert answer.status_code == 421
    assert "loopback host names only" in answer.text
    assert "http://127.0.0.1:<port>/" in answer.text
    assert "SESSIONREPO_CONSOLE_TOKEN" in answer.text


def test_the_csrf_refusal_names_an_action_that_fixes_it(
    store: str, serve: Any, page: Watched
) -> None:
    console: Server = serve(store, "--allow-writes")
    tab = page.page
    tab.goto(console.url("/session?id=sess-a"))
    # A page loaded before the console restarted carries an older run's form token.
    tab.locator("form[action='/actions/end'] input[name=csrf]").evaluate(
        "input => input.value = 'a-token-of-an-earlier-run'"
    )
    tab.click("#end")
    tab.wait_for_load_state()
    message = tab.locator("#error").inner_text()
    assert "restarted since the page was loaded" in message
    assert "Load the page again and submit the form from there" in message
    page.errors.clear()  # the 403 status itself
    # Doing what it says works.
    tab.click("#back")
    tab.wait_for_load_state()
    tab.click("#end")
    tab.wait_for_load_state()
    assert tab.locator("#done").inner_text() == "The session was ended."
    # From another site: it says so, and what to do.
    csrf = tab.locator("input[name=csrf]").first.get_attribute("value")
    foreign = httpx.post(
        console.url("/actions/reopen"),
        data={"id": "sess-a", "csrf": csrf},
        headers={"Origin": "http://attacker.example"},
    )
    assert foreign.status_code == 403
    assert "sent from another site" in foreign.text
    assert "pass the Host header through" in foreign.text
    assert page.errors == []
