"""The README's screenshots are as new as the pages and the schema they show: the
templates, static files and migrations hash as they did when ``make screenshots`` took
them (``docs/screenshots.json``), and the pictures are the ones it took."""

from __future__ import annotations

from _screenshots import MANIFEST, inputs, pictures, read_manifest

FIX = "run `make screenshots` (and commit docs/)"


def test_the_screenshots_are_not_older_than_the_templates_or_the_schema() -> None:
    assert MANIFEST.exists(), f"no {MANIFEST.name}: {FIX}"
    taken = read_manifest()
    now = inputs()
    changed = sorted(
        path
        for path in taken["inputs"].keys() | now.keys()
        if taken["inputs"].get(path) != now.get(path)
    )
    assert changed == [], f"changed since the screenshots were taken: {changed}; {FIX}"
    names = sorted(taken["screenshots"])
    assert names == [
        "console-health.png",
        "console-insights.png",
        "console-sessions.png",
        "console-transcript.png",
    ]
    assert pictures(names) == taken["screenshots"], f"a picture is not the one taken; {FIX}"
