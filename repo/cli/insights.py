"""``sessionrepo insights``: what the conversations cost, as a table or JSON."""

from __future__ import annotations

from datetime import datetime

import click

from sessionrepo.cli._common import open_store, parse_when, printable
from sessionrepo.ops.insights import GROUPINGS, Insights, InsightsRow, insights


def _moment(value: str | None, *, until: bool = False) -> datetime | None:
    return None if value is None else parse_when(value, until=until)


@click.command("insights")
@click.option(
    "--since",
    callback=lambda _ctx, _param, value: _moment(value),
    metavar="WHEN",
    help="From WHEN on: a time (RFC 3339, UTC unless it says), a date or an age (7d).",
)
@click.option(
    "--until",
    callback=lambda _ctx, _param, value: _moment(value, until=True),
    metavar="WHEN",
    help="Before WHEN (a date is included whole).",
)
@click.option(
    "--by", type=click.Choice(GROUPINGS), default="day", show_default=True, help="Group by."
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.pass_obj
def insights_(
    url: str | None,
    *,
    since: datetime | None,
    until: datetime | None,
    by: str,
    as_json: bool,
) -> None:
    """Tokens, cost, sessions and messages per day, model, source or user.

    Cost is computed from the prices in the usage_prices table (per model and token
    kind, valid from a day on); "reported" is what the providers said. Calls of a model
    without a price are counted as unpriced, never guessed: "no price" (null in --json)
    where no call of a group has a price, "*" beside the priced calls' cost where some
    have none.

    \b
    Example:
        sessionrepo insights --since 30d
        sessionrepo insights --by model --since 2026-11-01 --until 2026-11-30 --json
    """
    with open_store(url, read_only=True) as repository:
        report = insights(repository, since=since, until=until, by=by)  # type: ignore[arg-type]
    if as_json:
        click.echo(report.model_dump_json(indent=2))
        return
    click.echo(table(report))


_COLUMNS = (
    ("sessions", "sessions"),
    ("messages", "messages"),
    ("calls", "calls"),
    ("input", "input_tokens"),
    ("output", "output_tokens"),
    ("cached", "cache_read_tokens"),
    ("cost", "cost"),
    ("reported", "reported_cost"),
    ("p50 s", "latency_p50"),
    ("p95 s", "latency_p95"),
)


#: The cost cell of a group none of whose calls has a price: unknown, not zero.
NO_PRICE = "no price"


def _cell(row: InsightsRow, name: str) -> str:
    value = getattr(row, name)
    if name == "cost" and value is None:
        return NO_PRICE
    if value is None:
        return "-"
    if name == "cost" and row.unpriced_calls:
        return f"{value:.4f}*"  # the priced calls' part (the footnote says)
    if name in ("cost", "reported_cost"):
        return f"{value:.4f}"
    if isinstance(value, float):
        return f"{value:.2f}"
    return f"{value:,}"


def table(report: Insights) -> str:
    """The report as a plain-text table, a total line last."""
    header = [report.by, *(title for title, _ in _COLUMNS)]
    lines = [
        [printable(row.key if row.key is not None else "(none)", one_line=True)]
        + [_cell(row, name) for _, name in _COLUMNS]
        for row in report.rows
    ]
    lines.append(["total", *(_cell(report.total, name) for _, name in _COLUMNS)])
    widths = [max(len(line[i]) for line in [header, *lines]) for i in range(len(header))]
    out = [
        "  ".join(
            cell.ljust(widths[i]) if i == 0 else cell.rjust(widths[i])
            for i, cell in enumerate(line)
        )
        for line in [header, *lines]
    ]
    unpriced = report.total.unpriced_calls
    if unpriced:
        out.append(
            f'{unpriced:,} calls have no price (see usage_prices): "{NO_PRICE}" where no call'
            ' of the group has one, "*" where the cost is the priced calls\' alone'
        )
    return "\n".join(out)
