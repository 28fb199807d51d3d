"""The listing's preview of a session whose first user message carries a real-size
image (its content JSON far past 8 KB) is the message's text, not raw JSON, on both
backends; the image is not in the listing."""

from __future__ import annotations

import base64
import os
from typing import Any

import pytest
from conftest import Server, Watched

from sessionrepo import Message, open_repository

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("image_bytes", [600, 300_000])
def test_the_listing_previews_the_text_beside_an_image_of_any_size(
    image_bytes: int, database_url: str, serve: Any, page: Watched
) -> None:
    url = "data:image/jpeg;base64," + base64.b64encode(os.urandom(image_bytes)).decode()
    repository = open_repository(database_url)
    try:
        repository.append(
            "photo-session",
            [
                Message(
                    role="user",
                    content=[
                        {"type": "text", "text": "What breed is the cat in this photo?"},
                        {"type": "image_url", "image_url": {"url": url}},
                    ],
                ),
                Message(role="assistant", content="A British Shorthair."),
            ],
            source="telegram",
        )
    finally:
        repository.close()
    console: Server = serve(database_url)
    tab = page.page
    tab.goto(console.url("/"))
    preview = tab.locator("tr[data-session='photo-session'] td.preview").inner_text()
    assert preview.startswith("What breed is the cat in this photo?")
    assert "image_url" not in preview
    assert "base64" not in preview
    assert page.errors == []
