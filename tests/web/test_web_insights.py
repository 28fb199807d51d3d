"""The console's ``/insights`` in a real browser, on each backend: server-side SVG
charts whose bars say what the library's report says (labels and values as text, so
readable without colour), the busiest sessions and the latency table, no script error
and no CSP violation."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from conftest import Watched

from sessionrepo import Message, open_repository
from sessionrepo.ops.insights import insights, set_price

pytestmark = pytest.mark.slow

DAY1 = datetime(2026, 11, 1, 9, tzinfo=UTC)


def _fill(url: str) -> None:
    with open_repository(url) as repo:
        for index in range(6):
            day = DAY1 + timedelta(days=index % 3)
            model = "gpt-4.1" if index % 2 else "gemini-2.5-flash"
            messages = [
                Message(role="user", content=f"q{index}", timestamp=day),
                Message(role="assistant", content=f"a{index}", timestamp=day),
            ]
            usage = {
                "model": model,
                "input_tokens": 1000 * (index + 1),
                "output_tokens": 100 * (index + 1),
                "latency": 0.5 + index,
                "occurred_at": day,
            }
            source = "discord" if index < 3 else "slack"
            repo.append(f"s{index}", messages, usage=usage, source=source, model=model)
        for kind, per_million in (("input_tokens", 2.0), ("output_tokens", 8.0)):
            set_price(
                repo,
                {
                    "model": "gpt-4.1",
                    "token_kind": kind,
                    "per_million": per_million,
                    "valid_from": DAY1.date(),
                },
            )


def _bars(tab: Any, chart: str) -> dict[str, str]:
    return dict(
        tab.locator(f"#{chart} g.bar").evaluate_all(
            "bars => bars.map(b => [b.dataset.label, b.querySelector('text.value').textContent])"
        )
    )


def test_the_insights_page_charts_what_the_report_says(
    page: Watched, serve: Any, database_url: str
) -> None:
    _fill(database_url)
    with open_repository(database_url) as repo:
        days = insights(repo, by="day")
        models = insights(repo, by="model")
    server = serve(database_url)
    tab = page.page
    tab.goto(server.url("/insights"))
    assert _bars(tab, "chart-tokens-day") == {
        r.key: f"{r.input_tokens + r.output_tokens:,}" for r in days.rows
    }
    assert _bars(tab, "chart-messages-day") == {r.key: f"{r.messages:,}" for r in days.rows}
    # gemini-2.5-flash has no price: its cost is unknown, said in words with no bar.
    assert _bars(tab, "chart-cost-model") == {
        r.key: "no price" if r.cost is None else f"${r.cost:,.4f}" for r in models.rows
    }
    assert _bars(tab, "chart-cost-model")["gemini-2.5-flash"] == "no price"
    gemini = tab.locator('#chart-cost-model g.bar[data-label="gemini-2.5-flash"] rect')
    assert gemini.get_attribute("width") == "0"
    assert "$0.0000" not in (tab.locator("#chart-cost-model").text_content() or "")
    costs = tab.locator("#busiest tbody tr td:nth-child(5)").all_text_contents()
    assert costs.count("no price") == 3  # the three gemini sessions
    assert "(priced calls only)" in (tab.locator("#total-cost").text_content() or "")
    assert tab.locator("#total-unpriced").text_content() == "3"
    assert set(_bars(tab, "chart-tokens-source")) == {"discord", "slack"}
    assert tab.locator("#total-messages").text_content() == "12"
    assert tab.locator("#busiest tbody tr").count() == 6
    assert tab.locator("#latency tbody tr").count() == 2
    # Each chart is an image with a name, for a screen reader too.
    labels = tab.locator("svg.chart").evaluate_all("s => s.map(e => e.getAttribute('aria-label'))")
    assert "Cost per day" in labels
    # A range narrows it: day 1 only.
    tab.goto(server.url("/insights?since=2026-11-01&until=2026-11-02"))
    assert list(_bars(tab, "chart-tokens-day")) == ["2026-11-01"]
    assert page.errors == []
    assert page.sentinel() == ["untouched", True]
