"""``insights`` (the library and ``sessionrepo insights``) agrees with plain SQL over the
same data, on both backends; cost comes from the price valid on each call's day."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import create_engine, text

from sessionrepo import InvalidArgument, Message, open_repository
from sessionrepo.cli.root import main
from sessionrepo.ops.insights import insights, prices, set_price

DAY1 = datetime(2026, 11, 1, 10, tzinfo=UTC)
DAY2 = DAY1 + timedelta(days=1)


def _fill(url: str) -> None:
    with open_repository(url) as repo:
        for sid, source, model, day, calls in (
            ("a", "discord", "gpt-4.1", DAY1, [(1000, 100, 500, 1.0), (2000, 200, 0, 3.0)]),
            ("b", "slack", "claude-sonnet-4", DAY2, [(4000, 50, 1000, 2.0)]),
            ("c", "slack", "gpt-4.1", DAY2, [(10, 5, 0, None)]),
        ):
            messages = [
                Message(role="user", content="q", timestamp=day),
                Message(role="assistant", content="a", timestamp=day),
            ]
            usage = [
                {
                    "usage_id": str(uuid.uuid5(uuid.NAMESPACE_URL, f"{sid}/{i}")),
                    "model": model,
                    "input_tokens": tin,
                    "output_tokens": tout,
                    "cache_read_tokens": cached,
                    "latency": latency,
                    "reported_cost": 0.01,
                    "occurred_at": day,
                    "message_uuid": str(messages[1].client_msg_uuid),
                }
                for i, (tin, tout, cached, latency) in enumerate(calls)
            ]
            repo.append(sid, messages, usage=usage, source=source, model=model)
        # gpt-4.1: $2 / $8 per million, from day 2 on $1 / $4; cache reads at $0.5.
        for kind, per_million, valid in (
            ("input_tokens", 2.0, DAY1.date()),
            ("output_tokens", 8.0, DAY1.date()),
            ("input_tokens", 1.0, DAY2.date()),
            ("output_tokens", 4.0, DAY2.date()),
            ("cache_read_tokens", 0.5, DAY1.date()),
        ):
            set_price(
                repo,
                {
                    "model": "gpt-4.1",
                    "token_kind": kind,
                    "per_million": per_million,
                    "valid_from": valid,
                },
            )


def _sql(url: str, statement: str) -> list[tuple[Any, ...]]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return [tuple(row) for row in conn.execute(text(statement))]
    finally:
        engine.dispose()


def test_by_model_agrees_with_sql_and_prices_by_day(database_url: str) -> None:
    _fill(database_url)
    with open_repository(database_url) as repo:
        report = insights(repo, by="model")
        assert len(prices(repo)) == 5
    expected = _sql(
        database_url,
        "SELECT model, count(*), sum(input_tokens), sum(output_tokens), "
        "sum(cache_read_tokens) FROM usage_records GROUP BY model ORDER BY model",
    )
    got = [
        (r.key, r.calls, r.input_tokens, r.output_tokens, r.cache_read_tokens) for r in report.rows
    ]
    assert got == [tuple(int(v) if isinstance(v, int) else v for v in row) for row in expected]
    gpt = next(r for r in report.rows if r.key == "gpt-4.1")
    # Day 1: (500 uncached + 2000) at $2, 500 cached at $0.5, 300 out at $8;
    # day 2: 10 in at $1, 5 out at $4.
    cost = ((2500 * 2 + 500 * 0.5 + 300 * 8) + (10 * 1 + 5 * 4)) / 1e6
    assert gpt.cost == pytest.approx(cost)
    claude = next(r for r in report.rows if r.key == "claude-sonnet-4")
    assert (claude.cost, claude.unpriced_calls) == (None, 1)  # no price: unknown, not 0
    assert report.total.reported_cost == pytest.approx(0.04)
    assert gpt.latency_p50 == 1.0
    assert gpt.latency_p95 == 3.0
    assert report.total.sessions == 3
    assert [s.session_id for s in report.busiest] == ["b", "a", "c"]


def test_by_day_and_source_agree_with_sql(database_url: str) -> None:
    _fill(database_url)
    with open_repository(database_url) as repo:
        days = insights(repo, by="day")
        sources = insights(repo, by="source", since=DAY2 - timedelta(hours=1))
    per_day = {r.key: (r.messages, r.sessions, r.calls) for r in days.rows}
    assert per_day == {"2026-11-01": (2, 1, 2), "2026-11-02": (4, 2, 2)}
    counted = _sql(
        database_url,
        "SELECT s.source, count(*) FROM messages m JOIN sessions s ON s.id = m.session_id "
        "GROUP BY s.source ORDER BY s.source",
    )
    assert counted == [("discord", 2), ("slack", 4)]
    # --since leaves day 1 (discord) out.
    assert [(r.key, r.messages, r.input_tokens) for r in sources.rows] == [("slack", 4, 4010)]


def test_the_command_prints_what_the_library_reports(database_url: str) -> None:
    _fill(database_url)
    runner = CliRunner()
    done = runner.invoke(main, ["--url", database_url, "insights", "--by", "model", "--json"])
    assert done.exit_code == 0, done.output
    printed = json.loads(done.output)
    with open_repository(database_url) as repo:
        report = insights(repo, by="model")
    assert printed == json.loads(report.model_dump_json())
    table = runner.invoke(main, ["--url", database_url, "insights", "--since", "2026-11-02"])
    assert table.exit_code == 0, table.output
    lines = table.output.splitlines()
    assert lines[0].split()[:3] == ["day", "sessions", "messages"]
    assert lines[1].split()[:3] == ["2026-11-02", "2", "4"]
    assert lines[2].startswith("total")


def test_a_bad_price_is_refused(database_url: str) -> None:
    with open_repository(database_url) as repo:
        with pytest.raises(InvalidArgument, match="token_kind"):
            set_price(
                repo,
                {
                    "model": "m",
                    "token_kind": "tokens",
                    "per_million": 1,
                    "valid_from": date(2026, 1, 1),
                },
            )
        assert prices(repo) == []


def test_an_unpriced_model_says_no_price_never_zero(database_url: str) -> None:
    """claude-sonnet-4 has no price: its cost is unknown (null in JSON, "no price" in the
    table), and a day mixing it with a priced model shows the priced part, marked."""
    _fill(database_url)
    with open_repository(database_url) as repo:
        models = insights(repo, by="model")
        days = insights(repo, by="day")
    claude = next(r for r in models.rows if r.key == "claude-sonnet-4")
    assert claude.cost is None
    day2 = next(r for r in days.rows if r.key == "2026-11-02")
    assert (day2.unpriced_calls, day2.calls) == (1, 2)
    assert day2.cost == pytest.approx((10 * 1 + 5 * 4) / 1e6)  # session c's call alone
    busiest = {s.session_id: s for s in models.busiest}
    assert (busiest["b"].cost, busiest["b"].unpriced_calls) == (None, 1)
    assert busiest["a"].cost is not None
    assert busiest["a"].cost > 0
    runner = CliRunner()
    done = runner.invoke(main, ["--url", database_url, "insights", "--by", "model", "--json"])
    assert done.exit_code == 0, done.output
    printed = {row["key"]: row for row in json.loads(done.output)["rows"]}
    assert printed["claude-sonnet-4"]["cost"] is None
    assert printed["gpt-4.1"]["cost"] == pytest.approx(models.rows[1].cost)
    assert next(b["cost"] for b in json.loads(done.output)["busiest"]) is None  # b first
    table = runner.invoke(main, ["--url", database_url, "insights", "--by", "model"])
    assert table.exit_code == 0, table.output
    lines = {line.split()[0]: line for line in table.output.splitlines()}
    assert "no price" in lines["claude-sonnet-4"]
    assert "0.0000" not in lines["claude-sonnet-4"]
    assert "no price" not in lines["gpt-4.1"]
    assert lines["total"].split()[7].endswith("*")  # the total is the priced part
    by_day = runner.invoke(main, ["--url", database_url, "insights"])
    day_lines = {line.split()[0]: line for line in by_day.output.splitlines()}
    assert day_lines["2026-11-02"].split()[7] == f"{day2.cost:.4f}*"
    assert day_lines["2026-11-01"].split()[7].endswith("*") is False
    assert "1 calls have no price" in by_day.output


def test_the_console_page_says_no_price_for_an_unpriced_model(database_url: str) -> None:
    """The /insights page as served (no browser: tests/web draws it in Chromium): the
    unpriced model's cost bar says "no price", draws no bar, and never shows $0."""
    from starlette.testclient import TestClient

    from sessionrepo.web import create_app

    _fill(database_url)
    with (
        open_repository(database_url) as repo,
        TestClient(create_app(repo, url=database_url), base_url="http://127.0.0.1") as client,
    ):
        page = client.get("/insights")
    assert page.status_code == 200
    html = page.text
    claude = html.split('id="chart-cost-model"')[1].split('data-label="claude-sonnet-4"')[1]
    bar = claude.split("</g>")[0]
    assert 'data-value=""' in bar
    assert 'width="0"' in bar
    assert 'class="value">no price</text>' in bar
    assert "$0.0000" not in html.split('id="chart-cost-model"')[1].split("</svg>")[0]
    assert "(priced calls only)" in html
    assert '<span id="total-unpriced">1</span>' in html
    busiest = html.split('id="busiest"')[1]
    assert busiest.count("no price") == 1  # session b, claude's only call
