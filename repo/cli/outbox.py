"""``sessionrepo outbox``: inspect and replay the messages gateways parked in their
pending outbox (``status``, ``drain``, ``retry-dead``).

Over :class:`sessionrepo.outbox.table.Outbox` (which needs only the outbox) and
:class:`sessionrepo.outbox.writer.TranscriptWriter` (which replays into the primary). Adds
the exit statuses a monitoring script acts on.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime

import click

from sessionrepo.cli._common import Group, masked, url_option
from sessionrepo.models.message import utcnow
from sessionrepo.models.outbox_protocol import OutboxState
from sessionrepo.ops import missing_sqlite_file
from sessionrepo.outbox.table import Outbox, OutboxStatus
from sessionrepo.outbox.writer import DrainReport, TranscriptWriter, open_outbox_database
from sessionrepo.store.repository import open_repository

#: ``outbox status``: dead rows exist (an operator must look, then ``retry-dead``).
EXIT_DEAD = 3
#: ``outbox status --max-age``: a pending row is older than that (and none is dead).
EXIT_STALE = 4
#: ``outbox drain``: some rows failed or were set aside as dead; they stay parked.
EXIT_INCOMPLETE = 3

#: Characters of a last error shown in the ``status`` table (``--json`` has it whole).
ERROR_WIDTH = 120


@dataclass(frozen=True)
class _OutboxTarget:
    url: str | None
    outbox_url: str | None

    @property
    def urls(self) -> tuple[str | None, str | None]:
        return self.url, self.outbox_url


@click.group(cls=Group)
@url_option(
    "--outbox-url",
    envvar="SESSIONREPO_OUTBOX_URL",
    help=(
        "Where the gateways park messages: a SQLite file (sqlite:////var/lib/gw/outbox.db "
        "or a path) or a database URL. Default: $SESSIONREPO_OUTBOX_URL, else the "
        "primary database (--url) itself. May also be given after the command "
        "(outbox status --outbox-url URL)."
    ),
)
@click.pass_context
def outbox(ctx: click.Context, outbox_url: str | None) -> None:
    """Inspect and replay the pending outbox: messages a gateway's TranscriptWriter
    parked because the primary database could not take them.

    Point it at the same outbox the gateways use. A SQLite outbox file must exist
    already (a TranscriptWriter creates it when it starts): a mistyped path is an
    error, never an empty outbox.

    \b
    Exit status, for every outbox command:
        0  as described by the command
        1  error: the outbox could not be read (one line on stderr)
        2  usage error
        3  status: dead rows exist; drain: rows failed or went dead this run
        4  status --max-age: a pending row is older than that

    \b
    Example:
        SESSIONREPO_OUTBOX_URL=/var/lib/gateway/outbox.db sessionrepo outbox status
        sessionrepo --url postgresql://app@db/chat outbox --outbox-url /var/lib/gw/outbox.db drain
    """
    ctx.obj = _OutboxTarget(url=ctx.obj, outbox_url=outbox_url)


@contextmanager
def _open_outbox(target: _OutboxTarget, *, read_only: bool = False) -> Iterator[Outbox]:
    """The outbox alone: its own store, or the primary (schema checked) when it lives there
    (``read_only``: for ``status``, which writes nothing, never migrates)."""
    if target.outbox_url is not None:
        _require_outbox_file(target.outbox_url)
        database = open_outbox_database(target.outbox_url, read_only=read_only)
        try:
            yield Outbox(database)
        finally:
            database.dispose()
        return
    repository = open_repository(target.url, read_only=read_only)
    try:
        yield Outbox.of(repository)
    finally:
        repository.close()


@contextmanager
def _open_writer(target: _OutboxTarget) -> Iterator[TranscriptWriter]:
    """A writer on the primary (which may be down: the rows then stay parked)."""
    if target.outbox_url is not None:
        _require_outbox_file(target.outbox_url)
    repository = open_repository(target.url, require_connection=False)
    try:
        writer = TranscriptWriter(repository, outbox_url=target.outbox_url)
        try:
            yield writer
        finally:
            writer.close()
    finally:
        repository.close()


def _require_outbox_file(outbox_url: str) -> None:
    # Opening would create an empty outbox: a monitor would then see "all clear" forever.
    missing = missing_sqlite_file(outbox_url)
    if missing is not None:
        raise click.ClickException(
            f"no outbox file at {missing} (a TranscriptWriter creates it when it "
            "starts); check --outbox-url / SESSIONREPO_OUTBOX_URL"
        )


@outbox.command()
@click.option("--json", "as_json", is_flag=True, help="Print the OutboxStatus as JSON.")
@click.option(
    "--max-age",
    type=click.FloatRange(min=0),
    metavar="SECONDS",
    help="Exit 4 when the oldest pending row is older than this (a drainer that is not "
    "running, or a primary that stays down).",
)
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help="Sessions listed, those with the oldest rows first (the totals count all).",
)
@click.pass_context
def status(ctx: click.Context, as_json: bool, max_age: float | None, limit: int) -> None:
    """Show what the outbox holds: totals, then one line per session.

    Per session: pending and dead rows, the oldest row's age, when the next replay is
    due, and the last error on one line (--json has it whole, with exact times).
    Needs only the outbox, not the primary.

    Exit status: 0 when no row is dead; 3 when dead rows exist (they are kept until
    `sessionrepo outbox retry-dead`); with --max-age, 4 when no row is dead but the
    oldest pending row is older than SECONDS; 1 when the outbox cannot be read.
    Pending rows alone are normal while a primary is briefly down: use --max-age to
    alert on them.

    \b
    Example:
        sessionrepo outbox status
        sessionrepo outbox status --json --max-age 600 || page-the-on-call
    """
    target: _OutboxTarget = ctx.obj
    with _open_outbox(target, read_only=True) as box:
        where = box.display_url
        health = box.status(limit=limit)
    health = _masked_status(health, target)
    if as_json:
        click.echo(health.model_dump_json(indent=2))
    else:
        _print_status(where, health)
    if health.dead:
        ctx.exit(EXIT_DEAD)
    if max_age is not None and health.pending and health.oldest_pending_age > max_age:
        ctx.exit(EXIT_STALE)


def _masked_status(health: OutboxStatus, target: _OutboxTarget) -> OutboxStatus:
    sessions = [
        backlog.model_copy(update={"last_error": masked(backlog.last_error, *target.urls)})
        if backlog.last_error
        else backlog
        for backlog in health.sessions
    ]
    return health.model_copy(update={"sessions": sessions})


def _print_status(where: str, health: OutboxStatus) -> None:
    if not health.pending and not health.dead:
        click.echo(f"outbox {where}: empty (nothing pending, nothing dead)")
        return
    oldest = f" (oldest {_age(health.oldest_pending_age)} old)" if health.pending else ""
    click.echo(f"outbox {where}: {health.pending:,} pending{oldest}, {health.dead:,} dead")
    now = utcnow()
    header = (
        "session",
        OutboxState.PENDING,
        OutboxState.DEAD,
        "oldest",
        "next attempt",
        "last error",
    )
    rows = [
        (
            backlog.session_id,
            f"{backlog.pending:,}",
            f"{backlog.dead:,}",
            _age((now - backlog.oldest).total_seconds()),
            _next_attempt(backlog.next_attempt_at, now),
            _short(backlog.last_error),
        )
        for backlog in health.sessions
    ]
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header) - 1)]
    click.echo("")
    for row in (header, *rows):
        cells = [
            cell.rjust(width) if i in (1, 2) else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=False))
        ]
        click.echo("  " + "  ".join([*cells, row[-1]]).rstrip())
    listed = sum(backlog.pending + backlog.dead for backlog in health.sessions)
    if listed < health.pending + health.dead:
        click.echo(f"  … {health.pending + health.dead - listed:,} rows in sessions not listed")
    if health.dead:
        click.echo("")
        click.echo(
            "Dead rows are kept, never replayed on their own: fix the cause, then run "
            "`sessionrepo outbox retry-dead`."
        )


def _age(seconds: float) -> str:
    """A duration for people: ``45s``, ``12m 05s``, ``3h 07m``, ``2d 04h``."""
    whole = max(int(seconds), 0)
    days, rest = divmod(whole, 86_400)
    hours, rest = divmod(rest, 3_600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours:02d}h"
    if hours:
        return f"{hours}h {minutes:02d}m"
    if minutes:
        return f"{minutes}m {secs:02d}s"
    return f"{secs}s"


def _next_attempt(when: datetime | None, now: datetime) -> str:
    if when is None:
        return "-"  # only dead rows
    wait = (when - now).total_seconds()
    return "due" if wait <= 0 else f"in {_age(wait + 0.999)}"


def _short(error: str | None) -> str:
    if not error:
        return "-"
    line = " ".join(error.split())
    return line if len(line) <= ERROR_WIDTH else line[: ERROR_WIDTH - 1] + "…"


@outbox.command()
@click.option("--session", "session_id", metavar="ID", help="Replay only this session's rows.")
@click.option(
    "--now",
    is_flag=True,
    help="Also try rows that are backing off after a failure (e.g. once the primary is "
    "repaired), instead of waiting for their next retry time.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the DrainReport as JSON.")
@click.pass_context
def drain(ctx: click.Context, session_id: str | None, now: bool, as_json: bool) -> None:
    """Replay parked messages into the primary once, oldest first per session.

    What a gateway's background drainer does, run by hand (e.g. after an outage, or
    for a gateway that is gone). A row leaves the outbox only after the primary has
    committed its message; one already stored is simply removed. Rows whose retry
    time has not come yet (backing off after a failure) are left for later unless
    --now is given; rows another drainer holds are always left to it. "remaining"
    counts the whole outbox's pending rows.

    Exit status: 0 when every row that was due has been replayed (the rows still
    pending, if any, are not due yet); 3 when rows failed (e.g. the primary is
    unreachable) or were set aside as dead in this run: they stay in the outbox,
    and `sessionrepo outbox status` shows why; 1 when the outbox itself cannot be
    reached (so also when it lives in a primary that is down).

    \b
    Example:
        sessionrepo --url postgresql://app@db/chat outbox --outbox-url /var/lib/gw/outbox.db drain
        sessionrepo outbox drain --session discord:1234 --now --json
    """
    target: _OutboxTarget = ctx.obj
    with _open_writer(target) as writer:
        report = writer.drain(session_id=session_id, ignore_backoff=now)
        left = writer.pending(session_id) if session_id is not None else report.remaining
    if as_json:
        click.echo(report.model_dump_json(indent=2))
    else:
        _print_drain(report, left, session_id)
    if report.failed or report.dead:
        click.echo(
            f"Error: drain incomplete: {report.failed:,} failed, {report.dead:,} set aside as "
            f"dead, {report.remaining:,} still pending; see `sessionrepo outbox status`",
            err=True,
        )
        ctx.exit(EXIT_INCOMPLETE)


def _print_drain(report: DrainReport, left: int, session_id: str | None) -> None:
    click.echo(
        f"replayed {report.replayed:,}, already stored {report.duplicates:,}, "
        f"conflicting {report.conflicts:,}, failed {report.failed:,}, "
        f"dead {report.dead:,}, remaining {report.remaining:,}"
    )
    if report.conflicts:
        click.echo(
            "Conflicting rows had a key the primary holds with different content: the "
            "stored message was kept and the parked one dropped (see the log)."
        )
    if left and not (report.failed or report.dead):
        scope = f"of session {session_id!r} " if session_id is not None else ""
        click.echo(
            f"{_rows(left)} {scope}still pending: not due yet (backing off after an "
            "earlier failure) or held by another drainer; see `sessionrepo outbox status`."
        )


@outbox.command("retry-dead")
@click.option("--session", "session_id", metavar="ID", help="Only this session's dead rows.")
@click.option(
    "--json", "as_json", is_flag=True, help='Print {"retried": N, "session_id": ...} as JSON.'
)
@click.pass_obj
def retry_dead(target: _OutboxTarget, session_id: str | None, as_json: bool) -> None:
    """Put dead rows back in line, with their attempts reset.

    Rows go dead when the primary kept rejecting them; fix the cause first. The next
    drain (a gateway's drainer, or `sessionrepo outbox drain`) replays them in their
    original place in the session's queue.

    \b
    Example:
        sessionrepo outbox retry-dead --session discord:1234
        sessionrepo outbox retry-dead && sessionrepo outbox drain
    """
    with _open_outbox(target) as box:
        count = box.retry_dead(session_id)
    if as_json:
        click.echo(json.dumps({"retried": count, "session_id": session_id}))
        return
    scope = f" of session {session_id!r}" if session_id is not None else ""
    click.echo(f"{_rows(count, 'dead ')}{scope} put back in line")


def _rows(count: int, kind: str = "") -> str:
    return f"{count:,} {kind}{'row' if count == 1 else 'rows'}"
