"""The console in a real browser (Chromium, driven by Playwright) against ``sessionrepo
serve`` on each backend: the listing and its filters and pages, a transcript with tool
calls, an image and its chain, search with highlights, and every page staying clean
(no script error, no CSP violation)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from _console_data import LONG, LONG_MESSAGES, NEEDLE, PLAIN, RICH, RICH_PARENT
from conftest import Server, Watched

pytestmark = pytest.mark.slow


def _clean(page: Watched) -> None:
    assert page.errors == []
    assert page.dialogs == []
    assert page.sentinel() == ["untouched", True]


def test_listing_pages_through_every_session_newest_first(page: Watched, console: Server) -> None:
    tab = page.page
    tab.goto(console.url("/"))
    seen: list[str] = []
    while True:
        ids = tab.locator("tr.session-row").evaluate_all("rows => rows.map(r => r.dataset.session)")
        seen += ids
        nxt = tab.locator("#next-page")
        if nxt.count() == 0:
            break
        nxt.click()
        tab.wait_for_load_state()
    total = PLAIN + 5  # the long, rich, its parent, the Agents SDK and the XSS session
    assert len(seen) == total
    assert len(set(seen)) == total  # keyset paging: no repeat, no gap
    assert seen[0].startswith("xss")  # the newest activity
    assert seen[-1] == "plain-000"
    assert tab.locator("#first-page").count() == 1
    _clean(page)


def test_filters_narrow_the_listing(page: Watched, console: Server) -> None:
    tab = page.page
    tab.goto(console.url("/"))
    tab.fill("input[name=source]", "telegram")
    tab.select_option("select[name=status]", "ended")
    tab.click("form.filters button[type=submit]")
    tab.wait_for_load_state()
    rows = tab.locator("tr.session-row")
    ids = rows.evaluate_all("rows => rows.map(r => r.dataset.session)")
    # telegram is every third plain session (number % 3 == 1); ended every fifth.
    expected = {f"plain-{n:03d}" for n in range(PLAIN) if n % 3 == 1 and n % 5 == 0}
    assert set(ids) == expected | {RICH_PARENT}
    assert all(badge == "ended" for badge in tab.locator("span.badge").all_inner_texts())
    # since: only what was active from then on; the user filter.
    tab.goto(console.url("/?user=alice&since=2026-11-01T10:50"))
    ids = tab.locator("tr.session-row").evaluate_all("rows => rows.map(r => r.dataset.session)")
    assert ids == [f"plain-{n:03d}" for n in range(PLAIN - 1, 109, -1) if n % 2]
    assert tab.locator("#next-page").count() == 0
    _clean(page)


def test_a_transcript_pairs_tool_calls_shows_the_image_and_links_the_chain(
    page: Watched, console: Server
) -> None:
    tab = page.page
    tab.goto(console.url("/"))
    tab.click(f"tr[data-session='{RICH}'] a.session-link")
    tab.wait_for_load_state()
    assert (
        tab.locator("#session-title").inner_text() == "Nightly deploy fails at the migration step"
    )
    # Roles styled, the two tool answers inside their calls, not again on their own.
    roles = tab.locator("#transcript > article.message").evaluate_all(
        "els => els.map(e => e.dataset.role)"
    )
    assert roles == ["system", "user", "assistant", "assistant", "user"]
    calls = tab.locator("details.tool-call")
    assert calls.count() == 2
    log_call = tab.locator("details[data-call='call_log']")
    output = log_call.locator(".tool-output article.role-tool pre.text")
    assert not output.is_visible()  # collapsed
    log_call.locator("summary").click()
    assert output.is_visible()
    assert "migration 0042 timed out" in output.inner_text()
    assert '"job": "deploy"' in log_call.locator("pre.arguments").inner_text()
    # The image is drawn (a real PNG, from a data URL).
    image = tab.locator("figure.image img")
    assert image.evaluate("img => img.complete && img.naturalWidth") == 160
    # Reasoning folded; the file named.
    reasoning = tab.locator("details.reasoning")
    assert reasoning.count() == 1
    assert reasoning.get_attribute("open") is None
    assert "deploy.log" in tab.locator("p.file").inner_text()
    # The chain: the parent links back.
    tab.click("a.chain-link")
    tab.wait_for_load_state()
    assert tab.locator("#session-id").inner_text() == RICH_PARENT
    assert tab.locator("#tip-link").inner_text() == RICH
    # Expand all (the one script) opens every fold.
    tab.click("#tip-link")
    tab.wait_for_load_state()
    tab.click("button[data-toggle-details=open]")
    assert tab.locator("#transcript details:not([open])").count() == 0
    _clean(page)


def test_a_long_transcript_pages_by_seq_both_ways(page: Watched, console: Server) -> None:
    tab = page.page
    tab.goto(console.url(f"/session?id={LONG}"))

    def texts() -> list[str]:
        return tab.locator("#transcript pre.text").all_inner_texts()

    first = texts()
    assert first[0] == "long message 0"
    assert len(first) == 100
    tab.click("#next-page")
    tab.wait_for_load_state()
    second = texts()
    assert second == [f"long message {i}" for i in range(100, LONG_MESSAGES)]
    assert tab.locator("#next-page").count() == 0
    tab.click("#previous-page")
    tab.wait_for_load_state()
    assert texts() == first
    _clean(page)


def test_the_export_downloads_the_session_as_json_lines(page: Watched, console: Server) -> None:
    tab = page.page
    tab.goto(console.url(f"/session?id={RICH}"))
    with tab.expect_download() as info:
        tab.click("#export")
    download = info.value
    assert download.suggested_filename == f"session-{RICH}.jsonl"
    lines = Path(download.path()).read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["type"] for r in records] == ["header", "session"] + ["message"] * 7 + ["end"]


def test_search_highlights_matches_and_orders_by_rank_or_time(
    page: Watched, console: Server
) -> None:
    tab = page.page
    tab.goto(console.url("/"))
    tab.fill("header input[name=q]", f'"{NEEDLE}"')
    tab.press("header input[name=q]", "Enter")
    tab.wait_for_load_state()
    hits = tab.locator("li.hit")
    assert hits.count() == 2
    marks = tab.locator("li.hit mark").all_inner_texts()
    assert marks
    assert all(m.lower() == NEEDLE for m in marks)
    tab.select_option("#order", "newest")
    tab.click("form.search button[type=submit]")
    tab.wait_for_load_state()
    seqs = tab.locator("li.hit").evaluate_all("els => els.map(e => Number(e.dataset.seq))")
    assert seqs == sorted(seqs, reverse=True)
    # Filters: only the user's messages; a hit opens the transcript at the message.
    tab.select_option("select[name=role]", "user")
    tab.click("form.search button[type=submit]")
    tab.wait_for_load_state()
    assert tab.locator("li.hit .role").all_inner_texts() == ["user"]
    tab.click("li.hit a.hit-link")
    tab.wait_for_load_state()
    assert tab.locator("#session-id").inner_text() == RICH
    # The syntax help is there; a query with no word says so.
    tab.goto(console.url("/search?q=---"))
    assert tab.locator("#no-hits").is_visible()
    assert tab.locator("details.syntax").count() == 1
    _clean(page)


def test_errors_are_one_line_pages(page: Watched, console: Server) -> None:
    tab = page.page
    response: Any = tab.goto(console.url("/session?id=no-such-session"))
    assert response.status == 404
    assert tab.locator("#error").inner_text() == "no session 'no-such-session'"
    response = tab.goto(console.url("/session?id=x&after=-1"))
    assert response.status == 400
    assert "\n" not in tab.locator("#error").inner_text()
    assert "Traceback" not in tab.content()
    # The browser logs the two error statuses themselves, and nothing else.
    assert [e.split(":")[0] for e in page.errors] == ["Failed to load resource"] * 2
    assert page.sentinel() == ["untouched", True]
