"""The console's test harness: a seeded store per backend, ``sessionrepo serve`` started
as a real process on a free loopback port, and Debian's Chromium driven by Playwright
(never a browser Playwright downloads)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from _console_data import seed

from sessionrepo import open_repository

CHROMIUM = Path("/usr/bin/chromium")
SESSIONREPO = Path(sys.executable).with_name("sessionrepo")
#: Seconds a console may take to answer after it was started.
START_TIMEOUT = 30.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Server:
    """A running ``sessionrepo serve``."""

    process: subprocess.Popen[str]
    base: str
    log: Path

    def url(self, path: str) -> str:
        return self.base + path

    def stop(self) -> str:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        return self.log.read_text()


def start_server(
    url: str,
    tmp: Path,
    *options: str,
    env: dict[str, str] | None = None,
    host: str = "127.0.0.1",
    cwd: Path | None = None,
) -> Server:
    port = free_port()
    log = tmp / f"serve-{port}.log"
    environment = {k: v for k, v in os.environ.items() if not k.startswith("SESSIONREPO_")}
    environment.update(env or {})
    with log.open("w") as out:
        process = subprocess.Popen(
            [
                str(SESSIONREPO),
                "--url",
                url,
                "serve",
                "--host",
                host,
                "--port",
                str(port),
                *options,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=environment,
            text=True,
            cwd=cwd,
        )
    server = Server(process, f"http://127.0.0.1:{port}", log)
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"serve exited {process.returncode}: {log.read_text()}")
        try:
            with urllib.request.urlopen(server.url("/static/console.css"), timeout=2):
                return server
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(0.1)
    server.stop()
    raise AssertionError(f"serve did not answer within {START_TIMEOUT}s: {log.read_text()}")


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Any]:
    """Start consoles (``serve(url, *options, env=...)``); all are stopped afterwards."""
    started: list[Server] = []

    def start(url: str, *options: str, **kwargs: Any) -> Server:
        server = start_server(url, tmp_path, *options, **kwargs)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def _new_store(backend: str, request: pytest.FixtureRequest, tmp: Path) -> tuple[str, Any]:
    """A fresh migrated database of ``backend`` and its cleanup."""
    if backend == "sqlite":
        path = tmp / "console.db"
        shutil.copyfile(request.getfixturevalue("sqlite_template"), path)
        return f"sqlite:///{path}", lambda: None
    server = request.getfixturevalue("postgres_server")
    name = server.new_database()
    return server.url_for(name), lambda: server.drop(name)


@pytest.fixture(
    scope="session",
    params=[
        pytest.param("sqlite", marks=pytest.mark.sqlite),
        pytest.param("postgres", marks=pytest.mark.postgres),
    ],
)
def seeded(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, str]]:
    """``(backend, url)`` of a store holding the test data, one per backend for the run
    (the pages over it only read)."""
    tmp = tmp_path_factory.mktemp("seeded")
    url, cleanup = _new_store(request.param, request, tmp)
    repository = open_repository(url)
    try:
        seed(repository)
    finally:
        repository.close()
    yield request.param, url
    cleanup()


@pytest.fixture(scope="session")
def console(seeded: tuple[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A read-only console over the seeded store."""
    server = start_server(seeded[1], tmp_path_factory.mktemp("console"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    if not CHROMIUM.exists():
        pytest.fail("Debian's Chromium is missing: apt-get install chromium chromium-driver")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        yield launched
        launched.close()


@dataclass
class Watched:
    """A page with what it reported: console messages of type error, uncaught errors,
    dialogs (``alert``) and CSP violations."""

    page: Any
    errors: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)

    def sentinel(self) -> Any:
        return self.page.evaluate("() => [window.__sentinel, window.__pwned === undefined]")


SENTINEL_SCRIPT = """
window.__sentinel = "untouched";
document.addEventListener("securitypolicyviolation", (event) => {
  console.error("CSP violation: " + event.violatedDirective + " " + event.blockedURI);
});
"""


@pytest.fixture
def page(browser: Any) -> Iterator[Watched]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.add_init_script(SENTINEL_SCRIPT)
    tab = context.new_page()
    watched = Watched(tab)
    tab.on("console", lambda m: watched.errors.append(m.text) if m.type == "error" else None)
    tab.on("pageerror", lambda e: watched.errors.append(str(e)))

    def dialog(d: Any) -> None:
        watched.dialogs.append(d.message)
        d.dismiss()

    tab.on("dialog", dialog)
    tab.set_default_timeout(10_000)
    yield watched
    context.close()
