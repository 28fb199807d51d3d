"""``sessionrepo serve`` while the primary is down, which is when an operator opens it:
it starts, the health page says the primary is unreachable and shows the outbox file,
every other page says the primary is down (a page of its own, not an error), and it
recovers once the primary answers. On PostgreSQL the primary is a closed port that a
forwarder to the real server later opens; on SQLite a path that cannot be opened (a
directory) that later becomes the store."""

from __future__ import annotations

import contextlib
import shutil
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import Server, Watched, free_port
from sqlalchemy.engine import make_url

from sessionrepo import Message, TranscriptWriter, open_repository

pytestmark = pytest.mark.slow


class Forwarder:
    """A TCP port that forwards every connection to ``target``, once started."""

    def __init__(self, port: int, target: tuple[str, int]) -> None:
        self.port = port
        self.target = target
        self.listener: socket.socket | None = None

    def start(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        assert self.listener is not None
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # closed
            server = socket.create_connection(self.target)
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            # Either side closing ends both directions.
            for end in (source, sink):
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)
                end.close()

    def close(self) -> None:
        if self.listener is not None:
            self.listener.close()


@pytest.fixture
def down(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[str, Callable[[], None]]]:
    """``(url, bring_up)``: a primary that cannot be reached, and what makes it answer
    (a store holding the session ``sess-a``)."""
    if backend == "sqlite":
        path = tmp_path / "primary.db"
        store = tmp_path / "store.db"
        shutil.copyfile(request.getfixturevalue("sqlite_template"), store)
        _seed(f"sqlite:///{store}")
        path.mkdir()  # SQLITE_CANTOPEN: a directory is not a database file

        def bring_up_file() -> None:
            path.rmdir()
            store.rename(path)

        yield f"sqlite:///{path}", bring_up_file
        return
    server = request.getfixturevalue("postgres_server")
    name = server.new_database()
    real = make_url(server.url_for(name))
    _seed(real.render_as_string(hide_password=False))
    forwarder = Forwarder(free_port(), (real.host or "127.0.0.1", real.port or 5432))
    try:
        yield real.set(port=forwarder.port).render_as_string(hide_password=False), forwarder.start
    finally:
        forwarder.close()
        server.drop(name)


def _seed(url: str) -> None:
    repository = open_repository(url)
    try:
        repository.append("sess-a", [Message(role="user", content="hello")], source="cli")
    finally:
        repository.close()


def _park(url: str, outbox: Path) -> None:
    """A gateway's writer parks two messages in its outbox file: the primary is down."""
    repository = open_repository(url, require_connection=False)
    writer = TranscriptWriter(repository, outbox_url=str(outbox), deadline=2.0)
    try:
        result = writer.write(
            "sess-outage", [Message(role="user", content=f"m{i}") for i in (1, 2)]
        )
        assert result.status == "parked"
    finally:
        writer.close()
        repository.close()


def test_serve_starts_with_the_primary_down_and_recovers(
    down: tuple[str, Callable[[], None]], tmp_path: Path, serve: Any, page: Watched
) -> None:
    url, bring_up = down
    outbox = tmp_path / "gateway-outbox.db"
    _park(url, outbox)
    console: Server = serve(url, "--outbox-url", str(outbox))
    tab = page.page

    tab.goto(console.url("/health"))
    down_text = tab.locator("#primary-down").inner_text()
    assert "The primary database is unreachable" in down_text
    assert "The outbox below is a separate file" in down_text
    assert tab.locator("#outbox-pending").inner_text() == "2"
    assert tab.locator("tr.backlog[data-session='sess-outage'] td").nth(1).inner_text() == "2"
    for path in ("/", "/session?id=sess-a", "/search?q=hello"):
        response: Any = tab.goto(console.url(path))
        assert response.status == 503, path
        assert tab.locator("h1").inner_text() == "The primary database is down"
        assert tab.locator("#down").inner_text() != ""
        assert tab.locator("#down-help a[href='/health']").count() == 1
    api = httpx.get(console.url("/api/sessions"))
    assert api.status_code == 503
    assert "error" in api.json()
    assert httpx.get(console.url("/api/health")).json()["primary_error"]
    metrics = httpx.get(console.url("/metrics"))  # a scrape answers during the outage
    assert metrics.status_code == 200
    assert "sessionrepo_outbox_pending" in metrics.text

    bring_up()
    tab.goto(console.url("/"))
    assert tab.locator("tr.session-row").evaluate_all("rs => rs.map(r => r.dataset.session)") == [
        "sess-a"
    ]
    tab.goto(console.url("/health"))
    assert tab.locator("#primary-down").count() == 0
    assert tab.locator("#outbox-pending").inner_text() == "2"
    assert httpx.get(console.url("/api/health")).json()["primary_error"] is None
    assert "cannot be reached now" in console.stop()
    # What the browser logged: the 503 answers themselves, nothing else.
    assert {e.split(":")[0] for e in page.errors} <= {"Failed to load resource"}
