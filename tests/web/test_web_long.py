"""Long transcripts and big values in the console: "newest"/"oldest" links besides the
paging, a way back through search results, a cut 5 MB tool output readable whole, a
4 MB inline image not drawn inline (a link, its size), and "Rebuild the index" run in
the background, one at a time, with its progress on the health page."""

from __future__ import annotations

import base64
import os
import re
import struct
import threading
import zlib
from typing import Any

import httpx
import pytest
from _console_data import LONG, LONG_MESSAGES
from conftest import Server, Watched
from starlette.testclient import TestClient

from sessionrepo import Message, SessionRepository, open_repository
from sessionrepo.web import create_app

pytestmark = pytest.mark.slow

BIG = "big-values"
#: The tool output: 5 MB of numbered lines.
OUTPUT = "".join(f"line {n:07d} of the build log\n" for n in range(180_000))


def big_png() -> bytes:
    """A real PNG of about 3 MB (a chunk of random bytes beside a 4 by 4 image)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    rows = b"".join(b"\x00" + bytes(12) for _ in range(4))
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", 4, 4, 8, 2, 0, 0, 0))
        + chunk(b"zzZz", os.urandom(3_000_000))  # an ancillary chunk: skipped by readers
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


def test_newest_and_oldest_links_jump_to_the_ends(page: Watched, console: Server) -> None:
    tab = page.page
    tab.goto(console.url(f"/session?id={LONG}"))
    assert tab.locator("#oldest-page").count() == 0  # the first page
    tab.click("#newest-page")
    tab.wait_for_load_state()
    texts = tab.locator("#transcript pre.text").all_inner_texts()
    assert texts == [f"long message {i}" for i in range(LONG_MESSAGES - 100, LONG_MESSAGES)]
    assert tab.locator("#next-page, #newest-page").count() == 0  # nothing later
    tab.click("#oldest-page")
    tab.wait_for_load_state()
    assert tab.locator("#transcript pre.text").first.inner_text() == "long message 0"
    assert page.errors == []


def test_search_results_page_back_as_well_as_forward(page: Watched, console: Server) -> None:
    tab = page.page
    tab.goto(console.url("/search?q=question&order=newest"))
    assert tab.locator("#previous-page").count() == 0
    first = tab.locator("li.hit a.hit-link").all_inner_texts()
    tab.click("#next-page")
    tab.wait_for_load_state()
    second = tab.locator("li.hit a.hit-link").all_inner_texts()
    assert not set(first) & set(second)
    tab.click("#next-page")
    tab.wait_for_load_state()
    tab.click("#previous-page")
    tab.wait_for_load_state()
    assert tab.locator("li.hit a.hit-link").all_inner_texts() == second
    tab.click("#previous-page")
    tab.wait_for_load_state()
    assert tab.locator("li.hit a.hit-link").all_inner_texts() == first
    assert tab.locator("#previous-page").count() == 0
    assert page.errors == []


@pytest.fixture
def big(database_url: str) -> tuple[str, bytes]:
    png = big_png()
    repository = open_repository(database_url)
    try:
        repository.append(
            BIG,
            [
                Message(
                    role="user",
                    content=[
                        {"type": "text", "text": "the screenshot of the failing build"},
                        {
                            "type": "image_url",
                            "image_url": {
                                "url": "data:image/png;base64," + base64.b64encode(png).decode()
                            },
                        },
                    ],
                ),
                Message(
                    role="assistant",
                    tool_calls=[
                        {
                            "id": "call_log",
                            "type": "function",
                            "function": {"name": "read_log", "arguments": "{}"},
                        }
                    ],
                ),
                Message(role="tool", tool_call_id="call_log", content=OUTPUT),
            ],
            source="cli",
        )
    finally:
        repository.close()
    return database_url, png


def test_a_big_value_is_readable_whole_and_a_big_image_is_a_link(
    big: tuple[str, bytes], serve: Any, page: Watched
) -> None:
    url, png = big
    console: Server = serve(url)
    tab = page.page
    tab.goto(console.url(f"/session?id={BIG}"))
    assert len(tab.content()) < 200_000  # neither the image nor the output drawn whole
    assert tab.locator("figure.image img").count() == 0
    placeholder = tab.locator("p.big-image")
    assert "too big to draw on the page" in placeholder.inner_text()
    assert re.search(r"image \(4,0\d\d,\d{3} characters, about 3\.0 MB\)", placeholder.inner_text())
    image = httpx.get(console.url(placeholder.locator("a").get_attribute("href") or ""))
    assert image.headers["content-type"] == "image/png"
    assert image.content == png
    assert image.headers["x-content-type-options"] == "nosniff"

    call = tab.locator("details[data-call='call_log']")
    call.locator("summary").click()
    shown = call.locator(".tool-output pre.text").inner_text()
    assert len(shown) < 25_000
    assert "more characters: see the whole message" in shown
    whole = call.locator(".tool-output a.whole")
    assert whole.inner_text() == "whole message (cut here)"
    # The whole output, as text (5 MB: Chromium takes long to lay it out; the bytes are
    # what matter).
    answer = httpx.get(console.url(whole.get_attribute("href") or ""))
    assert answer.headers["content-type"] == "text/plain; charset=utf-8"
    assert answer.headers["x-content-type-options"] == "nosniff"
    assert OUTPUT in answer.text
    missing = httpx.get(console.url(f"/session/image?id={BIG}&seq=3&part=0"))
    assert missing.status_code == 404
    assert page.errors == []


def test_rebuilding_the_index_runs_in_the_background_one_at_a_time(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    repository = open_repository(database_url)
    repository.append("s", [Message(role="user", content=f"message {i}") for i in range(5)])
    reached, release = threading.Event(), threading.Event()
    real = SessionRepository.reindex

    def held(self: SessionRepository, **kwargs: Any) -> int:
        # The rebuild reports progress, then waits for the test: a fault injected into a
        # real rebuild, so the test sees it running whatever the machine's speed.
        progress = kwargs["progress"]
        progress(2, 5)
        reached.set()
        assert release.wait(30)
        return real(self, **kwargs)

    monkeypatch.setattr(SessionRepository, "reindex", held)
    app = create_app(repository, url=database_url, allow_writes=True)
    try:
        with TestClient(app, base_url="http://127.0.0.1") as client:
            csrf = re.search(r'name="csrf" value="([^"]+)"', client.get("/health").text)
            assert csrf is not None
            form = {"csrf": csrf.group(1)}
            started = client.post("/actions/reindex", data=form, follow_redirects=False)
            # Answered while the rebuild is held: the request did not wait for it.
            assert started.status_code == 303
            assert started.headers["location"] == "/health?done=reindex-started"
            assert reached.wait(30)
            assert not release.is_set()
            health = client.get("/health").text
            assert (
                'Rebuilding the index: <span id="reindex-done">2</span> of 5 messages (40%)'
                in health
            )
            assert 'data-refresh="2"' in health
            assert 'id="reindex"' not in health  # no second button while one runs
            again = client.post("/actions/reindex", data=form, follow_redirects=False)
            assert again.headers["location"] == "/health?done=reindex-running"
            running = client.get("/api/health").json()["reindex"]
            assert (running["state"], running["done"], running["total"]) == ("running", 2, 5)
            release.set()
            app.state.console.reindexing.wait(30)
            finished = client.get("/api/health").json()["reindex"]
            assert (finished["state"], finished["done"]) == ("done", 5)
            assert "The index was rebuilt: 5 messages" in client.get("/health").text
    finally:
        release.set()
        repository.close()
