"""The ``sessionrepo`` command: a thin shell over the library (parse, call, print).

Library errors (:class:`repo.errors.RepoError`) become one clean line on stderr and exit
status 1. Database URLs are only ever shown with the password masked. The outbox commands
add exit statuses a monitoring script can act on (3, 4: see ``sessionrepo outbox --help``).
"""

from __future__ import annotations

import io
import json
import re
import shutil
import sys
import textwrap
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, Any, Literal
from urllib.parse import quote, quote_plus

import click
from alembic import command
from alembic.util.exc import CommandError
from sqlalchemy import exc as sa_exc
from sqlalchemy import func, select
from sqlalchemy.engine import make_url

from sessionrepo.demo import (
    EXIT_PATHS,
    DemoResult,
    GatewayReport,
    OutageReport,
    outbox_paths,
    run_demo,
)
from sessionrepo.dialects import normalize_url
from sessionrepo.errors import RepoError
from sessionrepo.models import Session, StoredMessage
from sessionrepo.models.message import utcnow
from sessionrepo.models.tables import messages_table
from sessionrepo.ops import (
    MAX_BATCH,
    DoctorReport,
    ExportReport,
    PruneReport,
    Selection,
    count_prunable,
    count_sessions,
    export_sessions,
    import_sessions,
    missing_sqlite_file,
    parse_duration,
    prune_sessions,
    run_doctor,
)
from sessionrepo.outbox.table import Outbox, OutboxStatus
from sessionrepo.outbox.writer import DrainReport, TranscriptWriter, open_outbox_database
from sessionrepo.store import schema
from sessionrepo.store.database import Database
from sessionrepo.store.repository import SessionRepository, open_repository


class _Group(click.Group):
    """Turns a library error raised by any subcommand into ``Error: <one line>``."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except RepoError as exc:
            raise click.ClickException(_one_line(str(exc), *_urls(ctx))) from exc


def _urls(ctx: click.Context | None) -> list[str | None]:
    """The URLs given to this command and the groups above it (``--url``, ``--outbox-url``)."""
    urls: list[str | None] = []
    while ctx is not None:
        urls += [value for name, value in ctx.params.items() if name.endswith("url")]
        ctx = ctx.parent
    return urls


def _one_line(message: str, *urls: str | None) -> str:
    """The message on one line, with the URLs' passwords masked should a driver echo them."""
    return " ".join(_masked(message, *urls).split())


def _masked(message: str, *urls: str | None) -> str:
    for url in urls:
        password = _password(url)
        if password:
            for form in {password, quote(password, safe=""), quote_plus(password)}:
                message = message.replace(form, "***")
    return message


def _password(url: str | None) -> str | None:
    if not url or "://" not in url:
        return None
    try:
        return make_url(url).password
    except (sa_exc.ArgumentError, ValueError):
        return None


def _check_url(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if not value:
        return None  # the library's default: the embedded SQLite file
    if "://" in value:
        try:
            make_url(value)
        except (sa_exc.ArgumentError, ValueError) as exc:
            # Not echoed: a URL that does not parse may still hold a password.
            raise click.BadParameter(
                f"not a database URL ({type(exc).__name__}); expected e.g. "
                "postgresql://user@host/dbname or sqlite:///path/to/file.db"
            ) from None
    return value


@click.group(name="sessionrepo", cls=_Group)
@click.option(
    "--url",
    envvar="SESSIONREPO_DATABASE_URL",
    callback=_check_url,
    metavar="URL",
    help=(
        "Database URL (postgresql://… or sqlite:///path.db, or a file path). "
        "Default: $SESSIONREPO_DATABASE_URL, else the embedded SQLite file "
        "($XDG_DATA_HOME/sessionrepo/sessionrepo.db)."
    ),
)
@click.version_option(package_name="sessionrepo")
@click.pass_context
def main(ctx: click.Context, url: str | None) -> None:
    """Idempotent, ordered storage of AI-agent chat transcripts on PostgreSQL or SQLite.

    \b
    Example:
        sessionrepo --url postgresql://app@db.internal/chat migrate
        sessionrepo demo
    """
    ctx.obj = url


@main.command()
@click.option(
    "--sql",
    is_flag=True,
    help="Print the SQL that would upgrade an empty database instead of running it; "
    "the database is not touched (only its URL's dialect is used).",
)
@click.pass_obj
def migrate(url: str | None, sql: bool) -> None:
    """Upgrade the database to this sessionrepo's schema (Alembic head).

    Does nothing when the schema is already current, and is safe to run from several
    processes at once.

    \b
    Example:
        SESSIONREPO_DATABASE_URL=postgresql://app@db/chat sessionrepo migrate
        sessionrepo --url postgresql://app@db/chat migrate --sql > schema.sql
    """
    if sql:
        click.echo(_upgrade_sql(url), nl=False)
        return
    before, after, where = _upgrade(url)
    head = schema.head_revision()
    at = f"{after} (head)" if after == head else f"{after} (head is {head})"
    if before == after:
        click.echo(f"{where}: at revision {at}")
    else:
        click.echo(f"{where}: upgraded from {before or 'an empty database'} to revision {at}")


def _upgrade(url: str | None) -> tuple[str | None, str | None, str]:
    """Upgrade to head; the revisions before and after, and the masked URL."""
    database = Database(url)
    try:
        before = schema.current_revision(database)
        schema.upgrade(database)
        return before, schema.current_revision(database), database.display_url
    finally:
        database.dispose()


def _upgrade_sql(url: str | None) -> str:
    """Alembic's offline upgrade script for ``url``'s dialect."""
    config = schema.alembic_config()
    if url is not None:
        # migrations/env.py reads it in offline mode; ConfigParser needs "%" doubled.
        config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    buffer = io.StringIO()
    config.output_buffer = buffer
    try:
        command.upgrade(config, "head", sql=True)
    except CommandError as exc:
        raise RepoError(f"migration failed: {exc}") from exc
    return buffer.getvalue()


@main.command()
@click.option(
    "--path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="SQLite file to create and keep (must not exist). "
    "Default: a temporary file, removed afterwards.",
)
@click.option(
    "--turns",
    type=click.IntRange(min=2),
    default=20,
    show_default=True,
    help="Conversation turns per session and gateway.",
)
@click.pass_context
def demo(ctx: click.Context, path: Path | None, turns: int) -> None:
    """Show that concurrent, repeated flushes and an outage store every message exactly once.

    Three gateway processes write one embedded SQLite file at the same time, re-flushing
    their whole transcripts from every exit path (end of turn, interrupt, shutdown,
    close), sharing a session, and resuming one another's. Half-way, a fourth process
    locks the file for a while: the gateways' writes are parked in their local outbox
    files, then drained into the primary once the lock is released. The files are then
    checked with plain SQL. Never touches the database that --url or
    SESSIONREPO_DATABASE_URL names. Exits 1 unless every check passes.

    \b
    Example:
        sessionrepo demo
        sessionrepo demo --path /tmp/demo.db --turns 40
    """
    if path is not None:
        taken = [p for p in (path, *outbox_paths(path).values()) if p.exists()]
        if taken:
            raise click.BadParameter(f"{taken[0]} already exists", param_hint="'--path'")
    result = run_demo(path, turns=turns)
    _print_demo(result)
    if not result.ok:
        ctx.exit(1)


def _print_demo(result: DemoResult) -> None:
    if result.kept:
        where = f"{result.path}; outboxes beside it, kept"
    else:
        where = "in a temporary directory, removed afterwards"
    click.echo(
        f"{len(result.gateways)} gateway processes wrote one SQLite file at the same time, "
        f"each through its own outbox file ({where})."
    )
    click.echo("")
    click.echo(
        f"  {'gateway':<9} {'sent':>6} {'made':>5} {'inserted':>8} {'skipped':>7} "
        f"{'parked':>6} {'drained':>7} {'left':>4}  flushes"
    )
    for gateway in result.gateways:
        flushes = ", ".join(
            f"{path} {gateway.flushes[path]}" for path in EXIT_PATHS if path in gateway.flushes
        )
        left = "?" if gateway.outbox_left is None else f"{gateway.outbox_left:,}"
        click.echo(
            f"  {gateway.name:<9} {gateway.sent:>6,} {gateway.made_count:>5,} "
            f"{gateway.inserted:>8,} {gateway.duplicates:>7,} {gateway.parked_writes:>6,} "
            f"{gateway.drained:>7,} {left:>4}  {flushes or '-'}"
        )
    click.echo('  (parked: writes answered "parked"; drained and left: messages)')
    click.echo("")
    outage = result.outage
    click.echo(
        f"Outage: another process held the primary's write lock (BEGIN EXCLUSIVE) for "
        f"{outage.seconds:.2f} s while every gateway flushed one turn:"
    )
    for gateway in result.gateways:
        click.echo(
            f"  {gateway.name:<9} {gateway.outage_parked} of {gateway.outage_writes} writes "
            f"parked ({sum(map(len, gateway.parked_keys.values())):,} distinct messages "
            "in its outbox); after the release its drains "
            f"replayed {gateway.replayed:,} new and found {gateway.drained - gateway.replayed:,} "
            "already stored"
        )
    click.echo("")
    for label, value in (
        ("attempted sends (re-sends included)", result.attempted),
        ("distinct messages made", result.made),
        ("rows stored", result.stored),
        ("duplicates skipped", result.skipped),
        ("writes parked in an outbox", result.parked_writes),
        ("parked messages drained", result.drained),
        ("messages left in the outboxes", result.outbox_left),
    ):
        click.echo(f"  {label:<37} {value:>7,}")
    click.echo("")
    click.echo("  rows per session: " + ", ".join(f"{s} {n}" for s, n in result.sessions.items()))
    for session_id, count in result.alternations.items():
        click.echo(f"  {session_id}: the writer changes {count} times along its seq")
    click.echo(
        f"  all {len(result.gateways)} processes were flushing at once for {result.overlap:.2f} s"
    )
    click.echo("")
    click.echo("Checked against the database and the outbox files with plain SQL:")
    for check in result.checks:
        click.echo(f"  {'ok' if check.ok else 'FAILED':<6}  {check.name} ({check.detail})")
    processes: list[GatewayReport | OutageReport] = [*result.gateways, result.outage]
    for process in processes:
        if process.error:
            click.echo(f"process {process.name} failed:\n{process.error}", err=True)
    click.echo("")
    if result.ok:
        click.echo(
            f"OK: nothing lost, nothing doubled, the outage drained ({result.seconds:.1f} s)"
        )
    else:
        failed = "; ".join(check.name for check in result.checks if not check.ok)
        click.echo(f"FAILED: {failed}")


# -- outbox ---------------------------------------------------------------------------

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


@main.group(cls=_Group)
@click.option(
    "--outbox-url",
    envvar="SESSIONREPO_OUTBOX_URL",
    callback=_check_url,
    metavar="URL",
    help=(
        "Where the gateways park messages: a SQLite file (sqlite:////var/lib/gw/outbox.db "
        "or a path) or a database URL. Default: $SESSIONREPO_OUTBOX_URL, else the "
        "primary database (--url) itself."
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
def _open_outbox(target: _OutboxTarget) -> Iterator[Outbox]:
    """The outbox alone: its own store, or the primary (schema checked) when it lives there."""
    if target.outbox_url is not None:
        _require_outbox_file(target.outbox_url)
        database = open_outbox_database(target.outbox_url)
        try:
            yield Outbox(database)
        finally:
            database.dispose()
        return
    repository = open_repository(target.url)
    try:
        yield Outbox(repository.database)
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
    url = normalize_url(outbox_url)
    if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
        return
    if not Path(url.database).exists():
        raise click.ClickException(
            f"no outbox file at {url.database} (a TranscriptWriter creates it when it "
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
    with _open_outbox(target) as box:
        where = box.database.display_url
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
        backlog.model_copy(update={"last_error": _masked(backlog.last_error, *target.urls)})
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
    header = ("session", "pending", "dead", "oldest", "next attempt", "last error")
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
@click.pass_obj
def retry_dead(target: _OutboxTarget, session_id: str | None) -> None:
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
    scope = f" of session {session_id!r}" if session_id is not None else ""
    click.echo(f"{_rows(count, 'dead ')}{scope} put back in line")


def _rows(count: int, kind: str = "") -> str:
    return f"{count:,} {kind}{'row' if count == 1 else 'rows'}"


# -- doctor ---------------------------------------------------------------------------

#: ``doctor``: a check failed (or, with ``--strict``, warned).
EXIT_UNHEALTHY = 1


@main.command()
@click.option(
    "--outbox-url",
    envvar="SESSIONREPO_OUTBOX_URL",
    callback=_check_url,
    metavar="URL",
    help="The gateways' separate outbox (as for `sessionrepo outbox`). Default: "
    "$SESSIONREPO_OUTBOX_URL, else the primary database's pending_outbox table.",
)
@click.option(
    "--max-outbox-age",
    type=click.FloatRange(min=0),
    default=3600.0,
    show_default=True,
    metavar="SECONDS",
    help="A pending outbox row older than this is a failure, not a warning.",
)
@click.option("--strict", is_flag=True, help="Exit 1 on warnings too.")
@click.option("--json", "as_json", is_flag=True, help="Print the DoctorReport as JSON.")
@click.pass_context
def doctor(
    ctx: click.Context,
    outbox_url: str | None,
    max_outbox_age: float,
    strict: bool,
    as_json: bool,
) -> None:
    """Check that the store is healthy, and say what to fix when it is not.

    Checks, in order: the connection; the schema revision against this sessionrepo's
    head; the backend's settings as a gateway's connection sees them (SQLite:
    journal_mode, synchronous, foreign_keys, busy_timeout; PostgreSQL: server version,
    synchronous_commit, fsync, full_page_writes, the session's time zone, read-only);
    the outbox's backlog and dead rows. Changes nothing: no migration, no file created.

    \b
    Exit status:
        0  healthy (warnings, if any, are printed)
        1  a check failed (with --strict: or warned); each says how to fix it
        2  usage error

    \b
    Example:
        sessionrepo doctor
        SESSIONREPO_DATABASE_URL=postgresql://app@db/chat sessionrepo doctor --json
        sessionrepo doctor --outbox-url /var/lib/gateway/outbox.db --max-outbox-age 600
    """
    report = run_doctor(ctx.obj, outbox_url=outbox_url, max_outbox_age=max_outbox_age)
    urls = (ctx.obj, outbox_url)
    report = report.model_copy(
        update={
            "checks": [
                check.model_copy(update={"detail": _masked(check.detail, *urls)})
                for check in report.checks
            ]
        }
    )
    if as_json:
        click.echo(report.model_dump_json(indent=2))
    else:
        _print_doctor(report)
    if report.failures or (strict and report.warnings):
        ctx.exit(EXIT_UNHEALTHY)


def _print_doctor(report: DoctorReport) -> None:
    outbox = "its pending_outbox" if report.outbox == "primary" else report.outbox
    click.echo(f"database {report.database} (outbox: {outbox})")
    width = max(len(check.name) for check in report.checks)
    labels = {"ok": "ok", "warn": "WARN", "fail": "FAIL", "skip": "skip"}
    for check in report.checks:
        click.echo(f"  {labels[check.status]:<5} {check.name:<{width}}  {check.detail}")
        if check.fix and check.status in ("warn", "fail"):
            click.echo(f"  {'':<5} {'':<{width}}  fix: {check.fix}")
    if report.failures:
        names = ", ".join(check.name for check in report.failures)
        click.echo(f"verdict: UNHEALTHY ({names})")
    elif report.warnings:
        names = ", ".join(check.name for check in report.warnings)
        click.echo(f"verdict: healthy, with warnings ({names})")
    else:
        click.echo("verdict: healthy")


# -- sessions -------------------------------------------------------------------------

# Control characters (but newline and tab) and bidirectional overrides: printed as
# escapes, so a transcript cannot drive the terminal or disguise what it shows.
_UNPRINTABLE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _printable(value: str, *, one_line: bool = False) -> str:
    value = _UNPRINTABLE.sub(lambda match: ascii(match.group())[1:-1], value)
    return " ".join(value.split()) if one_line else value


def _clip(value: str, width: int) -> str:
    return value if len(value) <= width else value[: max(width - 1, 0)] + "…"


def _when(value: datetime | None) -> str:
    return "-" if value is None else value.strftime("%Y-%m-%d %H:%M:%S")


@contextmanager
def _open_store(url: str | None) -> Iterator[SessionRepository]:
    """The repository at ``url``; a SQLite file must exist (opening would create it)."""
    missing = missing_sqlite_file(url)
    if missing is not None:
        raise click.ClickException(
            f"no database file at {missing}; check --url / SESSIONREPO_DATABASE_URL"
        )
    repository = open_repository(url)
    try:
        yield repository
    finally:
        repository.close()


@main.group(cls=_Group)
def sessions() -> None:
    """List sessions, read a transcript, end a session.

    \b
    Example:
        sessionrepo sessions list --source discord --status open
        sessionrepo sessions show discord:1234
        sessionrepo sessions end discord:1234 --reason user_left
    """


@sessions.command("list")
@click.option("--source", help="Only sessions from this platform (discord, telegram, cli…).")
@click.option("--user", "user_id", metavar="ID", help="Only this user's sessions.")
@click.option("--status", type=click.Choice(["open", "ended"]), help="Only open or ended ones.")
@click.option(
    "--limit", type=click.IntRange(1, 1000), default=20, show_default=True, help="Page size."
)
@click.option("--cursor", help="The next-page cursor a previous listing printed.")
@click.option("--json", "as_json", is_flag=True, help="Print the SessionPage as JSON.")
@click.pass_obj
def list_(
    url: str | None,
    *,
    source: str | None,
    user_id: str | None,
    status: Literal["open", "ended"] | None,
    limit: int,
    cursor: str | None,
    as_json: bool,
) -> None:
    """List sessions, most recently active first, a page at a time.

    The last line gives the cursor of the next page (pass it back with --cursor and
    the same filters); --json has it as "next_cursor" (null on the last page).

    \b
    Example:
        sessionrepo sessions list --source discord --status open --limit 50
        sessionrepo sessions list --json | jq -r '.sessions[].id'
    """
    with _open_store(url) as repository:
        page = repository.list_sessions(
            source=source, user_id=user_id, status=status, limit=limit, cursor=cursor
        )
    if as_json:
        click.echo(page.model_dump_json(indent=2, by_alias=True))
        return
    if not page.sessions:
        click.echo("no sessions")
        return
    header = ("session", "source", "user", "status", "messages", "last active (UTC)")
    rows = [
        (
            _clip(_printable(s.id, one_line=True), 40),
            _clip(s.source, 16),
            _clip(s.user_id or "-", 20),
            "open" if s.ended_at is None else "ended",
            f"{s.message_count:,}",
            _when(s.last_active_at),
        )
        for s in page.sessions
    ]
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]
    total = shutil.get_terminal_size((120, 24)).columns
    room = max(total - sum(widths) - 2 * len(widths) - 2, 20)
    for row, summary in zip((header, *rows), (None, *page.sessions), strict=True):
        cells = [
            cell.rjust(width) if i == 4 else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        preview = "preview" if summary is None else _printable(summary.preview or "", one_line=True)
        click.echo(("  ".join([*cells, _clip(preview, room)])).rstrip())
    if page.next_cursor is not None:
        click.echo(f"next page: --cursor {page.next_cursor}")


@sessions.command()
@click.argument("session_id", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="JSON lines, one message each (see above).")
@click.option(
    "--after", "after_seq", type=click.IntRange(min=0), metavar="SEQ", help="Start after this seq."
)
@click.option("--limit", type=click.IntRange(min=1), help="Show at most this many messages.")
@click.option("--tail", type=click.IntRange(min=1), metavar="N", help="Only the last N messages.")
@click.option(
    "--lines",
    type=click.IntRange(min=1),
    default=12,
    show_default=True,
    help="Lines of content shown per message.",
)
@click.option("--full", is_flag=True, help="Show every line of every message.")
@click.option(
    "--width", type=click.IntRange(min=40), help="Wrap at this width (default: the terminal's)."
)
@click.pass_obj
def show(
    url: str | None,
    session_id: str,
    *,
    as_json: bool,
    after_seq: int | None,
    limit: int | None,
    tail: int | None,
    lines: int,
    full: bool,
    width: int | None,
) -> None:
    """Print a session's transcript, oldest first.

    Each message shows its seq, time (UTC) and role, then its content wrapped to the
    terminal (long messages cut after --lines lines unless --full); tool calls are
    summarised as name(arguments) and tool results name the call they answer. Control
    characters are shown as escapes. The transcript is read a page at a time.

    With --json, each line is one message as a JSON object: {"seq": …, "timestamp": …,
    "message": {…}}, where "message" is the OpenAI-format dict exactly as stored
    (to_openai(include_key=True): its client_msg_uuid included, so it can be flushed
    again without duplicating anything).

    \b
    Example:
        sessionrepo sessions show discord:1234 --tail 20
        sessionrepo sessions show discord:1234 --json | jq -c .message
    """
    if tail is not None and (after_seq is not None or limit is not None):
        raise click.UsageError("--tail cannot be combined with --after or --limit")
    with _open_store(url) as repository:
        if not as_json:
            _print_session_header(repository.get_session(session_id))
        wrap = width or shutil.get_terminal_size((100, 24)).columns
        for message in _transcript_pages(repository, session_id, after_seq, limit, tail):
            if as_json:
                record = {
                    "seq": message.seq,
                    "timestamp": message.timestamp.isoformat().replace("+00:00", "Z"),
                    "message": message.to_openai(include_key=True),
                }
                click.echo(json.dumps(record, ensure_ascii=False))
            else:
                _print_message(message, wrap, None if full else lines)


def _transcript_pages(
    repository: SessionRepository,
    session_id: str,
    after_seq: int | None,
    limit: int | None,
    tail: int | None,
) -> Iterator[StoredMessage]:
    if tail is not None:
        yield from repository.load_transcript(session_id, before_seq=MAX_SEQ, limit=tail)
        return
    after = after_seq or 0
    left = limit
    while left is None or left > 0:
        size = TRANSCRIPT_PAGE if left is None else min(left, TRANSCRIPT_PAGE)
        page = repository.load_transcript(session_id, after_seq=after, limit=size)
        yield from page
        if len(page) < size:
            return
        after = page[-1].seq
        if left is not None:
            left -= len(page)


#: Messages read per transcript page by ``sessions show``.
TRANSCRIPT_PAGE = 500
MAX_SEQ = 2**63 - 1


def _print_session_header(session: Session) -> None:
    status = (
        "open"
        if session.ended_at is None
        else f"ended {_when(session.ended_at)} ({_printable(session.end_reason or '-')})"
    )
    click.echo(f"session {session.id} · source {session.source} · user {session.user_id or '-'}")
    click.echo(
        f"started {_when(session.started_at)} · last active {_when(session.last_active_at)}"
        f" · {_count(session.message_count, 'message')}"
        f" · {_count(session.tool_call_count, 'tool call')}"
        f" · {status}"
    )
    details = [
        f"model {session.model}" if session.model else "",
        f"title {_printable(session.title, one_line=True)!s}" if session.title else "",
        f"continues {session.parent_session_id}" if session.parent_session_id else "",
    ]
    if any(details):
        click.echo(" · ".join(detail for detail in details if detail))
    click.echo("")


def _print_message(message: StoredMessage, width: int, max_lines: int | None) -> None:
    about = ""
    if message.role == "tool":
        about = f"  ({', '.join(v for v in (message.tool_name, message.tool_call_id) if v)})"
    click.echo(f"#{message.seq}  {_when(message.timestamp)}  {message.role}{about}")
    indent = "    "
    lines: list[str] = []
    for paragraph in _printable(_content_text(message.content)).split("\n"):
        lines += textwrap.wrap(
            paragraph, width=max(width - len(indent), 20), replace_whitespace=False
        ) or [""]
    while lines and not lines[-1].strip():
        lines.pop()
    if max_lines is not None and len(lines) > max_lines:
        hidden = len(lines) - max_lines
        lines = [*lines[:max_lines], f"… {hidden:,} more lines (--full shows them)"]
    for line in lines:
        click.echo(indent + line)
    if message.reasoning:
        click.echo(f"{indent}(reasoning: {len(message.reasoning):,} characters)")
    for call in message.tool_calls or []:
        click.echo(indent + _clip(_tool_call(call), max(width - len(indent), 20)))
    click.echo("")


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, dict) and "type" in part:
                parts.append(f"[{part['type']}]")
            else:
                parts.append(json.dumps(part, ensure_ascii=False))
        return "\n".join(parts)
    return json.dumps(content, ensure_ascii=False)


def _tool_call(call: Any) -> str:
    """``→ name(arguments)  [id]`` for an OpenAI-format tool call."""
    if not isinstance(call, dict):
        return f"→ {_printable(json.dumps(call, ensure_ascii=False), one_line=True)}"
    function = call.get("function")
    if not isinstance(function, dict):
        function = {}
    name = function.get("name") or call.get("type") or "?"
    arguments = function.get("arguments", "")
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    ident = f"  [{_printable(str(call['id']), one_line=True)}]" if call.get("id") else ""
    shown = _printable(f"{name}({_clip(arguments, 200)})", one_line=True)
    return f"→ {shown}{ident}"


@sessions.command()
@click.argument("session_id", metavar="ID")
@click.option("--reason", required=True, help="Why it ended (kept if it had ended already).")
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")
@click.pass_obj
def end(url: str | None, session_id: str, reason: str, as_json: bool) -> None:
    """End a session. The first reason wins: ending an ended session changes nothing,
    and says so (exit 0 either way; --json has "ended": true only when this call
    ended it).

    \b
    Example:
        sessionrepo sessions end discord:1234 --reason user_left
        sessionrepo sessions end discord:1234 --reason cleanup --json
    """
    with _open_store(url) as repository:
        ended = repository.end_session(session_id, reason)
        session = repository.get_session(session_id)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "session_id": session.id,
                    "ended": ended,
                    "ended_at": session.ended_at.isoformat() if session.ended_at else None,
                    "end_reason": session.end_reason,
                }
            )
        )
    elif ended:
        click.echo(f"ended session {session.id!r} (reason: {_printable(reason)})")
    else:
        click.echo(
            f"session {session.id!r} had already ended at {_when(session.ended_at)} "
            f"(reason: {_printable(session.end_reason or '-')}); nothing changed"
        )


# -- export, import, prune ------------------------------------------------------------


def _parse_ended_before(
    ctx: click.Context, param: click.Parameter, value: str | None
) -> datetime | None:
    if value is None:
        return None
    try:
        return utcnow() - parse_duration(value)
    except ValueError:
        pass
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise click.BadParameter(
            f"{value!r} is neither a duration (90d, 12h) nor a date (2025-01-31, "
            "2025-01-31T12:00:00+00:00)"
        ) from None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def _parse_older_than(ctx: click.Context, param: click.Parameter, value: str) -> timedelta:
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


@contextmanager
def _progress(length: int | None, label: str) -> Iterator[Callable[[int], None]]:
    """A progress bar on stderr (only drawn on a terminal); yields its ``update``."""
    if length is None or not sys.stderr.isatty():
        yield lambda _: None
        return
    with click.progressbar(length=length, label=label, file=sys.stderr) as bar:
        yield bar.update


@main.command("export")
@click.argument("output", metavar="FILE", type=click.Path(dir_okay=False, allow_dash=True))
@click.option(
    "--session", "session_ids", multiple=True, metavar="ID", help="This session (repeatable)."
)
@click.option("--source", help="Only sessions from this platform.")
@click.option("--user", "user_id", metavar="ID", help="Only this user's sessions.")
@click.option("--status", type=click.Choice(["open", "ended"]), help="Only open or ended ones.")
@click.option(
    "--ended-before",
    callback=_parse_ended_before,
    metavar="WHEN",
    help="Only sessions that ended before WHEN: a date/time (UTC unless it says) or an "
    "age such as 90d.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.pass_obj
def export_(
    url: str | None,
    output: str,
    *,
    session_ids: tuple[str, ...],
    source: str | None,
    user_id: str | None,
    status: Literal["open", "ended"] | None,
    ended_before: datetime | None,
    as_json: bool,
) -> None:
    """Export sessions and their messages to a JSON Lines file (or - for stdout).

    One session (--session), those matching filters, or everything. Streamed: a page
    of sessions and of messages at a time, with a progress bar on stderr. The file
    holds a header, then each session followed by its messages in seq order, then an
    end record; `sessionrepo import` recreates them exactly. Open sessions are
    exported as they are at that moment. FILE must not exist yet.

    \b
    Example:
        sessionrepo export backup.jsonl
        sessionrepo export --source discord --ended-before 2025-01-01 old-discord.jsonl
        sessionrepo export --session discord:1234 - | gzip > discord-1234.jsonl.gz
    """
    if session_ids and (source, user_id, status, ended_before) != (None,) * 4:
        raise click.UsageError("--session cannot be combined with the filters")
    if as_json and output == "-":
        raise click.UsageError("--json needs FILE: with -, stdout carries the export")
    selection = Selection(
        session_ids=session_ids,
        source=source,
        user_id=user_id,
        status=status,
        ended_before=ended_before,
    )
    with _open_store(url) as repository:
        total = count_sessions(repository, selection)
        with _progress(total, "exporting sessions") as advance:
            if output == "-":
                report = export_sessions(
                    repository,
                    sys.stdout.buffer,
                    selection,
                    on_session=lambda _: advance(1),
                )
            else:
                report = _export_to_file(repository, Path(output), selection, advance)
    if as_json:
        click.echo(report.model_dump_json(indent=2))
        return
    where = "stdout" if output == "-" else output
    click.echo(
        f"exported {_count(report.sessions, 'session')} with "
        f"{_count(report.messages, 'message')} to {where}",
        err=output == "-",
    )


def _export_to_file(
    repository: SessionRepository,
    path: Path,
    selection: Selection,
    advance: Callable[[int], None],
) -> ExportReport:
    out = _create(path, "FILE")
    try:
        with out:
            return export_sessions(repository, out, selection, on_session=lambda _: advance(1))
    except BaseException:
        path.unlink(missing_ok=True)  # half an export is worse than none
        raise


def _create(path: Path, param: str) -> IO[bytes]:
    try:
        return path.open("xb")
    except FileExistsError:
        raise click.BadParameter(
            f"{path} already exists; choose a new file", param_hint=repr(param)
        ) from None
    except OSError as exc:
        raise click.BadParameter(f"{path}: {exc.strerror}", param_hint=repr(param)) from None


def _count(number: int, noun: str) -> str:
    return f"{number:,} {noun}{'' if number == 1 else 's'}"


@main.command("import")
@click.argument(
    "source",
    metavar="FILE",
    type=click.Path(exists=True, dir_okay=False, allow_dash=True),
)
@click.option(
    "--batch-size",
    type=click.IntRange(1, MAX_BATCH),
    default=MAX_BATCH,
    show_default=True,
    help="Messages written per transaction.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the ImportReport as JSON.")
@click.pass_context
def import_(ctx: click.Context, source: str, batch_size: int, as_json: bool) -> None:
    """Import a file written by `sessionrepo export` (or - for stdin).

    Idempotent: a message whose key the database holds is skipped, so importing the
    same file again inserts nothing, and an interrupted import is completed by running
    it again. A session the database lacks is recreated exactly (same fields, same
    counters, same seq for every message); one it holds with changes of its own gets
    only the missing messages, appended after its own. Stops at the first damaged
    line (what came before is kept). A PostgreSQL database must be migrated first
    (`sessionrepo migrate`); a new SQLite file is created.

    Exit status: 0 when the whole file was imported; 1 on an error, or when the
    file was cut short (it lacks its end record: what it held was imported).

    \b
    Example:
        sessionrepo --url postgresql://app@db/chat migrate
        sessionrepo import backup.jsonl
        gunzip -c discord-1234.jsonl.gz | sessionrepo import -
    """
    url: str | None = ctx.obj
    with open_repository(url) as repository:
        if source == "-":
            report = import_sessions(repository, sys.stdin.buffer, batch_size=batch_size)
        else:
            path = Path(source)
            with path.open("rb") as stream, _progress(path.stat().st_size, "importing") as advance:
                report = import_sessions(
                    repository, stream, batch_size=batch_size, on_progress=advance
                )
    if as_json:
        click.echo(report.model_dump_json(indent=2))
    else:
        click.echo(
            f"imported {_count(report.sessions, 'session')} ({report.sessions_restored:,} new, "
            f"{report.sessions_present:,} already present, {report.sessions_merged:,} merged "
            f"into changed sessions); messages: {report.messages_inserted:,} inserted, "
            f"{report.messages_present:,} already present, "
            f"{report.messages_conflicting:,} conflicting"
        )
        if report.messages_conflicting:
            click.echo(
                "Conflicting messages have a key this database holds with different "
                "content: the stored ones were kept."
            )
    if not report.complete:
        click.echo(
            f"Error: {source} was cut short (it lacks the end record): what it held was "
            "imported; import the complete file to finish",
            err=True,
        )
        ctx.exit(1)


@main.command()
@click.option(
    "--older-than",
    required=True,
    callback=_parse_older_than,
    metavar="AGE",
    help="Prune sessions that ended, and were last active, longer ago than this: a whole "
    "number and s, m, h or d (90d, 12h).",
)
@click.option("--dry-run", is_flag=True, help="Delete nothing; list what would go.")
@click.option(
    "--export",
    "export_path",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FILE",
    help="First export what is pruned to this new file (the `sessionrepo export` "
    "format); only sessions written there are deleted.",
)
@click.option(
    "--batch-size",
    type=click.IntRange(1, 1000),
    default=100,
    show_default=True,
    help="Sessions deleted per transaction.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the PruneReport as JSON.")
@click.pass_obj
def prune(
    url: str | None,
    *,
    older_than: timedelta,
    dry_run: bool,
    export_path: Path | None,
    batch_size: int,
    as_json: bool,
) -> None:
    """Delete ended sessions, with their messages, once they are old enough.

    Only sessions that have ended, and whose end and last activity are both older
    than AGE, are deleted; an open session never is, however old. Each batch is
    checked again as it is deleted, so a session reopened or written to meanwhile
    stays. With --export, each batch is written and synced to FILE before it is
    deleted (with --dry-run too, then nothing is deleted). Messages a pruned session
    still has waiting in this database's pending_outbox are left there and reported.

    \b
    Example:
        sessionrepo prune --older-than 90d --dry-run
        sessionrepo prune --older-than 90d --export pruned-2025-06.jsonl
    """
    cutoff = utcnow() - older_than
    with _open_store(url) as repository:
        out = _create(export_path, "--export") if export_path is not None else None
        try:
            report = _prune(
                repository, cutoff, dry_run=dry_run, out=out, batch_size=batch_size, as_json=as_json
            )
        finally:
            if out is not None:
                out.close()
    if as_json:
        click.echo(report.model_dump_json(indent=2))
        return
    _print_prune(report, export_path)


def _prune(
    repository: SessionRepository,
    cutoff: datetime,
    *,
    dry_run: bool,
    out: IO[bytes] | None,
    batch_size: int,
    as_json: bool,
) -> PruneReport:
    def listed(batch: list[Session]) -> None:
        for session in batch:
            reason = _printable(session.end_reason or "-", one_line=True)
            click.echo(
                f"would prune {session.id}  ended {_when(session.ended_at)} ({reason})  "
                f"last active {_when(session.last_active_at)}  "
                f"{_count(session.message_count, 'message')}"
            )

    if dry_run:
        return prune_sessions(
            repository,
            cutoff=cutoff,
            dry_run=True,
            export_to=out,
            batch_size=batch_size,
            on_batch=None if as_json else listed,
        )
    with _progress(count_prunable(repository, cutoff), "pruning") as advance:
        return prune_sessions(
            repository,
            cutoff=cutoff,
            export_to=out,
            batch_size=batch_size,
            on_batch=lambda batch: advance(len(batch)),
        )


def _print_prune(report: PruneReport, export_path: Path | None) -> None:
    verb = "would prune" if report.dry_run else "pruned"
    click.echo(
        f"{verb} {_count(report.sessions, 'session')} with "
        f"{_count(report.messages, 'message')} (ended and last active before "
        f"{_when(report.cutoff)} UTC)"
    )
    if export_path is not None and report.exported is not None:
        click.echo(f"exported {_count(report.exported, 'session')} to {export_path} first")
    if report.kept:
        click.echo(
            f"kept {_count(len(report.kept), 'session')} changed while pruning (reopened "
            f"or written to): {', '.join(report.kept[:10])}"
            + (" …" if len(report.kept) > 10 else "")
        )
    if report.outbox_rows:
        click.echo(
            f"note: {_count(report.outbox_rows, 'message')} of "
            f"{_count(len(report.outbox_sessions), 'pruned session')} still wait in "
            "pending_outbox; they were left there, and a drain will recreate those "
            "sessions with them (see `sessionrepo outbox status`)"
        )


# -- search ---------------------------------------------------------------------------


@main.command("search")
@click.argument("query")
@click.option("--session", "session_id", metavar="ID", help="Only this session.")
@click.option("--source", help="Only sessions from this platform.")
@click.option("--role", type=click.Choice(["system", "user", "assistant", "tool"]))
@click.option("--user", "user_id", metavar="ID", help="Only this user's sessions.")
@click.option(
    "--newest", is_flag=True, help="Newest first instead of best first (cheaper on big stores)."
)
@click.option("--limit", type=click.IntRange(1, 1000), default=20, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the hits as JSON lines.")
@click.pass_obj
def search_(
    url: str | None,
    *,
    query: str,
    session_id: str | None,
    source: str | None,
    role: str | None,
    user_id: str | None,
    newest: bool,
    limit: int,
    as_json: bool,
) -> None:
    """Find messages by what they say.

    QUERY is words (all must occur), "quoted phrases", prefix* and -excluded words;
    any other character is plain text. Exit 1 if the index is stale (run reindex).

    \b
    Example:
        sessionrepo search 'mochi "vet visit" -dog'
        sessionrepo search 'deploy*' --source slack --role user --newest --json
    """
    with _open_store(url) as repository:
        hits = repository.search(
            query,
            session_id=session_id,
            source=source,
            role=role,
            user_id=user_id,
            order="newest" if newest else "rank",
            limit=limit,
        )
    for hit in hits:
        if as_json:
            click.echo(hit.model_dump_json())
        else:
            click.echo(
                f"{hit.session_id} #{hit.seq}  {_when(hit.timestamp)}  {hit.role:<9} "
                f"{_printable(hit.snippet, one_line=True)}"
            )
    if not as_json:
        click.echo(f"{_count(len(hits), 'hit')}", err=True)


@main.command()
@click.pass_obj
def reindex(url: str | None) -> None:
    """Rebuild the full-text search index from the messages.

    After `doctor` reports a stale or broken index, or after upgrading a populated store.
    Transcript writes wait for it (or, through a TranscriptWriter, park in the outbox).

    \b
    Example:
        sessionrepo reindex
        SESSIONREPO_DATABASE_URL=postgresql://app@db/chat sessionrepo reindex
    """
    with _open_store(url) as repository:
        total = repository.database.read(_message_total)
        with _progress(total, "reindexing") as update:
            done = [0]

            def progress(indexed: int, _total: int) -> None:
                update(indexed - done[0])
                done[0] = indexed

            count = repository.reindex(progress=progress)
    click.echo(f"indexed {_count(count, 'message')}; search is available")


def _message_total(connection: Any) -> int:
    return int(connection.execute(select(func.count()).select_from(messages_table)).scalar_one())


from sessionrepo.cli.hermes import import_hermes  # noqa: E402  (it borrows helpers defined above)

main.add_command(import_hermes)
