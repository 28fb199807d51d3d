"""The README's pictures: the listing, a transcript, the health page and the usage
report (``/insights``) of the demo's data (``sessionrepo demo``'s gateways, plus the rich
debugging session and a week of model calls), taken in the browser. Every run takes them
(so the pages are checked to draw); ``make screenshots`` sets ``SESSIONREPO_SCREENSHOTS``
to the folder the README shows them from, and writes what they were taken from beside them
(``docs/screenshots.json``, :mod:`_screenshots`).

The console is started in the demo's folder on the relative URL ``sqlite:///demo.db``,
so the pictures show that and not a test run's temporary path."""

from __future__ import annotations

import os
import uuid
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import pytest
from _console_data import _agents, _rich
from _screenshots import DOCS, write_manifest
from conftest import Watched

from sessionrepo import SessionRepository, open_repository
from sessionrepo.demo import run_demo
from sessionrepo.models.message import utcnow
from sessionrepo.models.usage import Usage
from sessionrepo.ops.insights import set_price

pytestmark = [pytest.mark.slow, pytest.mark.sqlite]

SHOTS = (
    *("sessions", "/", "transcript", "/session?id=rich-debug-session", "health", "/health"),
    *("insights", "/insights"),
)

#: (model, input, output, cached input) per call: what the pictured week of calls used.
_CALLS = (
    ("gpt-5-mini", 1800, 420, 600),
    ("gpt-5", 5200, 900, 2400),
    ("claude-sonnet-4", 3100, 700, 0),
)


def _usage(repository: SessionRepository) -> None:
    """A week of model calls over the demo's sessions, with prices for two of the models
    (the third is shown as unpriced)."""
    now = utcnow()
    sessions = [summary.id for summary in repository.list_sessions(limit=20).sessions]
    for index, sid in enumerate(sessions):
        for day in range(7):
            model, tokens_in, tokens_out, cached = _CALLS[(index + day) % len(_CALLS)]
            scale = 1 + (index * 7 + day) % 4
            record = Usage(
                usage_id=uuid.uuid5(uuid.NAMESPACE_URL, f"shot:{sid}:{day}"),
                model=model,
                provider="openai" if model.startswith("gpt") else "anthropic",
                input_tokens=tokens_in * scale,
                output_tokens=tokens_out * scale,
                cache_read_tokens=cached * scale,
                latency=0.4 + 0.3 * scale,
                occurred_at=now - timedelta(days=day, minutes=index),
            )
            repository.record_usage(sid, [record])
    start = date.today() - timedelta(days=30)
    for model, kind, price in (
        ("gpt-5-mini", "input_tokens", 0.25),
        ("gpt-5-mini", "output_tokens", 2.0),
        ("gpt-5", "input_tokens", 1.25),
        ("gpt-5", "output_tokens", 10.0),
        ("gpt-5", "cache_read_tokens", 0.125),
    ):
        set_price(
            repository,
            {"model": model, "token_kind": kind, "valid_from": start, "per_million": price},
        )


def test_screenshots_of_the_demo_data(tmp_path: Path, serve: Any, page: Watched) -> None:
    database = tmp_path / "demo.db"
    run_demo(database, turns=4)
    repository = open_repository(f"sqlite:///{database}")
    try:
        _rich(repository)
        _agents(repository)
        _usage(repository)
    finally:
        repository.close()
    console = serve("sqlite:///demo.db", cwd=tmp_path)
    folder = Path(os.environ.get("SESSIONREPO_SCREENSHOTS") or tmp_path / "shots")
    folder.mkdir(parents=True, exist_ok=True)
    tab = page.page
    tab.set_viewport_size({"width": 1100, "height": 720})
    for name, path in zip(SHOTS[::2], SHOTS[1::2], strict=True):
        tab.goto(console.url(path))
        if name == "transcript":
            tab.locator("details[data-call='call_log']").evaluate("d => d.open = true")
            # From the image on: the picture, then the tool call opened with its answer.
            tab.locator("#m2").evaluate("m => m.scrollIntoView()")
        assert "sqlite:///demo.db" in tab.locator("footer").inner_text()
        assert str(tmp_path) not in tab.content()
        shot = folder / f"console-{name}.png"
        tab.screenshot(path=str(shot))
        assert shot.stat().st_size > 10_000  # a drawn page, not a blank one
    assert page.errors == []
    if folder.resolve() == DOCS.resolve():
        write_manifest([f"console-{name}.png" for name in SHOTS[::2]])
