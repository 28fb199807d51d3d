"""Responses-API / Agents-SDK items in a transcript, as the OpenAI Agents adapter stores
them, shown like their chat equivalents: a ``function_call`` folded with its
``function_call_output`` inside it, a ``reasoning`` item's summary as text and its
reasoning folded, a provider-run call folded with what it did; every item styled by a
fixed class, never by its raw type."""

from __future__ import annotations

from typing import Any

import pytest
from _console_data import AGENTS
from conftest import Server, Watched

from sessionrepo import Message
from sessionrepo.models import StoredMessage
from sessionrepo.models.transcript import OUTPUT_TYPES
from sessionrepo.web.views import ROLE_CLASSES, message_view, pair_tool_outputs

from support.responses_items import RESPONSES_ITEMS

pytestmark = pytest.mark.slow


def test_items_are_folded_and_shown_like_chat_messages(page: Watched, console: Server) -> None:
    tab = page.page
    tab.goto(console.url(f"/session?id={AGENTS}"))
    articles = tab.locator("#transcript > article.message")
    # The output is shown inside its call, not again on its own.
    assert articles.evaluate_all("els => els.map(e => e.dataset.role)") == [
        "user",
        "reasoning",
        "function_call",
        "web_search_call",
        "assistant",
    ]
    classes = tab.locator("article.message").evaluate_all(
        "els => els.map(e => [...e.classList].filter(c => c.startsWith('role-')))"
    )
    assert all(len(found) == 1 for found in classes)
    assert {c[0].removeprefix("role-") for c in classes} <= ROLE_CLASSES
    assert tab.locator("[class*=':'], [class*='_call']").count() == 0

    # The reasoning item: its summary is the text, its reasoning folded.
    reasoning = tab.locator("article[data-role=reasoning]")
    assert reasoning.locator(":scope > pre.text").inner_text() == (
        "The user wants Kyoto's weather: call the tool."
    )
    folded = reasoning.locator("details.reasoning")
    assert folded.get_attribute("open") is None
    folded.locator("summary").click()
    assert folded.locator("pre").inner_text() == "get_weather takes a city and a unit."

    # The function call: folded like a chat tool call, its output inside it.
    call = tab.locator("details.tool-call[data-call='call_fn_01']")
    assert "get_weather" in call.locator("summary").inner_text()
    assert "answered in #5" in call.locator("summary").inner_text()
    call.locator("summary").click()
    assert '"city": "Kyoto"' in call.locator("pre.arguments").inner_text()
    output = call.locator(".tool-output article.role-tool")
    assert output.get_attribute("data-role") == "function_call_output"
    assert '"temperature": 21.5' in output.locator("pre.text").inner_text()

    # A provider-run call: what it did folded the same way; the message item as text.
    search = tab.locator("details.tool-call[data-call='ws_01']")
    search.locator("summary").click()
    assert "Kyoto weather tomorrow" in search.locator("pre.arguments").inner_text()
    answer = tab.locator("#transcript > article[data-role=assistant] pre.text")
    assert answer.inner_text() == "21.5 °C and clear in Kyoto."
    assert page.errors == []
    assert page.sentinel() == ["untouched", True]


def test_every_responses_item_gets_a_fixed_class_and_outputs_pair_with_their_calls() -> None:
    stored = [
        StoredMessage(**Message.from_openai(item).model_dump(), session_id="s", seq=n)
        for n, (_, item) in enumerate(RESPONSES_ITEMS, 1)
    ]
    views = pair_tool_outputs([message_view(m) for m in stored])
    assert {v.css for v in views} <= ROLE_CLASSES
    by_type: dict[str | None, Any] = {}
    for message, view in zip(stored, views, strict=True):
        if message.role is None:
            by_type.setdefault(message.item_type, view)  # the first of each type
    # Each client-run call's first output sits inside its call (made before it).
    for kind in OUTPUT_TYPES & by_type.keys():
        assert by_type[kind].paired, kind
    assert by_type["function_call"].tool_calls[0].name == "get_weather"
    assert by_type["reasoning"].parts[0].text == "The user wants the vet date; look in the file."
    assert by_type["reasoning"].reasoning == "Search the vet file first."
