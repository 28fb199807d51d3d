"""The README's pictures: the listing, a transcript and the health page of the demo's
data (``sessionrepo demo``'s gateways, plus the rich debugging session), taken in the
browser. Every run takes them (so the pages are checked to draw); ``make screenshots``
sets ``SESSIONREPO_SCREENSHOTS`` to the folder the README shows them from, and writes
what they were taken from beside them (``docs/screenshots.json``, :mod:`_screenshots`).

The console is started in the demo's folder on the relative URL ``sqlite:///demo.db``,
so the pictures show that and not a test run's temporary path."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from _console_data import _agents, _rich
from _screenshots import DOCS, write_manifest
from conftest import Watched

from sessionrepo import open_repository
from sessionrepo.demo import run_demo

pytestmark = [pytest.mark.slow, pytest.mark.sqlite]

SHOTS = ("sessions", "/", "transcript", "/session?id=rich-debug-session", "health", "/health")


def test_screenshots_of_the_demo_data(tmp_path: Path, serve: Any, page: Watched) -> None:
    database = tmp_path / "demo.db"
    run_demo(database, turns=4)
    repository = open_repository(f"sqlite:///{database}")
    try:
        _rich(repository)
        _agents(repository)
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
