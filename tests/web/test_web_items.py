"""Responses-API / Agents-SDK items in a transcript, as the OpenAI Agents adapter stores
them, shown like their chat equivalents: a ``function_call`` folded with its
``function_call_output`` inside it, a ``reasoning`` item's summary as text and its
reasoning folded, a provider-run call folded with what it did; every item styled by a
fixed class, never by its raw type."""

from __future__ import annotations

import pytest
from _console_data import AGENTS
from conftest import Server, Watched

from sessionrepo.web.views import ROLE_CLASSES

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
