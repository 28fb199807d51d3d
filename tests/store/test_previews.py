"""``list_sessions``' preview is the first user message's text, whatever else it carries:
a photo of megabytes beside the text (content JSON far past what a listing reads) never
turns it into raw JSON. And ``sessions list`` shows that text."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner

from sessionrepo import SessionStore, open_repository
from sessionrepo.cli import main

pytestmark = pytest.mark.contract  # every repo test runs on the sync and async API

#: A real photo's size as a data URL (200 KB), far past the head a listing reads.
PHOTO = {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64," + "QUJD" * 50_000}}


def _text(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def _previews(repo: SessionStore) -> dict[str, str | None]:
    return {s.id: s.preview for s in repo.list_sessions().sessions}


def test_the_preview_is_the_text_beside_a_real_size_image(repo: SessionStore) -> None:
    repo.append("before", [{"role": "user", "content": [_text("what is in this picture?"), PHOTO]}])
    repo.append("after", [{"role": "user", "content": [PHOTO, _text("and in this one?")]}])
    repo.append(
        "escaped",
        [{"role": "user", "content": [PHOTO, _text('a "quoted"\nline\tand\x01 more')]}],
    )
    repo.append("two", [{"role": "user", "content": [_text("first part"), _text("second")]}])

    previews = _previews(repo)
    assert previews["before"] == "what is in this picture?"
    assert previews["after"] == "and in this one?"
    assert previews["escaped"] == 'a "quoted" line and\x01 more'
    assert previews["two"] == "first part second"


def test_a_long_text_part_is_cut_and_an_image_alone_previews_empty(repo: SessionStore) -> None:
    repo.append("long", [{"role": "user", "content": [PHOTO, _text("é\\" * 5_000)]}])
    repo.append("image", [{"role": "user", "content": [PHOTO]}])
    repo.append("nul", [{"role": "user", "content": "a\x00b " + "x" * 20_000}])

    previews = _previews(repo)
    assert previews["long"] == "é\\" * 59 + "é…"
    assert previews["image"] == ""  # as a small image alone: no text, never its JSON
    nul = previews["nul"]
    assert nul is not None
    assert nul.startswith("a\x00b xxx")
    assert len(nul) == 120


def test_sessions_list_shows_the_text_not_json(database_url: str) -> None:
    with open_repository(database_url) as repo:
        repo.append("photo", [{"role": "user", "content": [PHOTO, _text("look at my cat")]}])
    listing = CliRunner().invoke(main, ["--url", database_url, "sessions", "list"])
    assert listing.exit_code == 0, listing.output
    assert "look at my cat" in listing.stdout
    assert "image_url" not in listing.stdout
    assert "base64" not in listing.stdout
