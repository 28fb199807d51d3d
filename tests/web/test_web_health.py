"""The health page during a real outage: the primary's write lock is held (SQLite: a
``BEGIN EXCLUSIVE`` connection; PostgreSQL: ``LOCK TABLE sessions``), a gateway's
writer parks its batch in its outbox file, the page (and ``/metrics``) shows the parked
rows; the lock goes, the writer drains, and they are gone."""

from __future__ import annotations

import re
import shutil
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from conftest import Server, Watched
from sqlalchemy.engine import make_url

from sessionrepo import Message, TranscriptWriter, open_repository

pytestmark = pytest.mark.slow


@pytest.fixture
def primary(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if backend == "sqlite":
        path = tmp_path / "primary.db"
        shutil.copyfile(request.getfixturevalue("sqlite_template"), path)
        yield f"sqlite:///{path}"
        return
    server = request.getfixturevalue("postgres_server")
    name = server.new_database()
    yield server.url_for(name)
    server.drop(name)


@contextmanager
def write_lock(url: str) -> Iterator[None]:
    """The primary cannot take writes while this holds its lock (reads go on)."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        conn = sqlite3.connect(parsed.database or "", isolation_level=None)
        conn.execute("BEGIN EXCLUSIVE")
        try:
            yield
        finally:
            conn.execute("ROLLBACK")
            conn.close()
        return
    conninfo = parsed.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(conninfo) as conn:
        conn.execute("LOCK TABLE sessions IN ACCESS EXCLUSIVE MODE")
        yield
        conn.rollback()


def _gauge(console: Server, name: str) -> float:
    text = httpx.get(console.url("/metrics")).text
    found = re.search(rf"^{name}\{{[^}}]*\}} (\S+)$", text, re.MULTILINE)
    assert found is not None, text
    return float(found.group(1))


def test_parked_rows_appear_during_an_outage_and_go_after_the_drain(
    primary: str, tmp_path: Path, serve: Any, page: Watched
) -> None:
    outbox_file = tmp_path / "gateway-outbox.db"
    repository = open_repository(primary, busy_timeout=0.2, attempts=1)
    writer = TranscriptWriter(repository, outbox_url=str(outbox_file), deadline=1.0)
    try:
        console: Server = serve(primary, "--outbox-url", str(outbox_file))
        tab = page.page
        tab.goto(console.url("/health"))
        assert tab.locator("#outbox-pending").inner_text() == "0"
        assert tab.locator("#outbox").count() == 0

        with write_lock(primary):
            parked = writer.write(
                "sess-outage",
                [Message(role="user", content=f"during the outage {i}") for i in range(3)],
            )
            assert parked.status == "parked"
            tab.reload()
            assert tab.locator("#outbox-pending").inner_text() == "3"
            row = tab.locator("tr.backlog[data-session='sess-outage'] td")
            assert row.all_inner_texts()[:3] == ["sess-outage", "3", "0"]
            assert _gauge(console, "sessionrepo_outbox_pending") == 3
            checks = dict(
                zip(
                    tab.locator("#checks td:first-child").all_inner_texts(),
                    tab.locator("#checks td:nth-child(2)").all_inner_texts(),
                    strict=True,
                )
            )
            assert checks["outbox"] in ("ok", "warn")

        report = writer.drain(ignore_backoff=True)
        assert (report.replayed, report.remaining) == (3, 0)
        tab.reload()
        assert tab.locator("#outbox-pending").inner_text() == "0"
        assert tab.locator("tr.backlog").count() == 0
        assert _gauge(console, "sessionrepo_outbox_pending") == 0
        tab.goto(console.url("/session?id=sess-outage"))
        assert tab.locator("#transcript pre.text").all_inner_texts() == [
            f"during the outage {i}" for i in range(3)
        ]
        assert page.errors == []
    finally:
        writer.close()
        repository.close()
