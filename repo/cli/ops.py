"""The operator's commands: ``migrate``, ``doctor``, ``export``, ``import`` and ``prune``.

Each is a thin shell over :mod:`sessionrepo.ops` (or, for ``migrate``,
:mod:`sessionrepo.store.schema`): it parses its options, calls one function and prints the
report that function returns.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import IO, Literal

import click

from sessionrepo.cli._common import (
    count,
    masked,
    open_store,
    parse_when,
    printable,
    progress,
    quoted,
    url_option,
    when,
)
from sessionrepo.cli.privacy import prune_by_policy
from sessionrepo.errors import RepoError
from sessionrepo.models import Session
from sessionrepo.models.message import utcnow
from sessionrepo.ops import (
    MAX_BATCH,
    DoctorReport,
    ExportReport,
    ImportReport,
    PruneReport,
    Selection,
    count_prunable,
    count_sessions,
    export_sessions,
    import_sessions,
    parse_duration,
    prune_sessions,
    run_doctor,
)
from sessionrepo.ops.export import create_private_file
from sessionrepo.store import schema
from sessionrepo.store.repository import SessionRepository, open_repository


@click.command()
@click.option(
    "--sql",
    is_flag=True,
    help="Print the SQL that would upgrade an empty database instead of running it; "
    "the database is not touched (only its URL's dialect is used).",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help='Print what was done as JSON: {"url", "before", "after", "head", "changed"}.',
)
@click.pass_obj
def migrate(url: str | None, sql: bool, as_json: bool) -> None:
    """Upgrade the database to this sessionrepo's schema (Alembic head).

    Does nothing when the schema is already current, and is safe to run from several
    processes at once.

    \b
    Example:
        SESSIONREPO_DATABASE_URL=postgresql://app@db/chat sessionrepo migrate
        sessionrepo --url postgresql://app@db/chat migrate --sql > schema.sql
    """
    if sql:
        if as_json:
            raise click.UsageError("--json cannot be combined with --sql (stdout carries the SQL)")
        click.echo(schema.upgrade_script(url), nl=False)
        return
    done = schema.migrate(url)
    if as_json:
        record = {**dataclasses.asdict(done), "changed": done.changed}
        click.echo(json.dumps(record, indent=2))
        return
    head = "head" if done.after == done.head else f"head is {done.head}"
    at = f"{done.after} ({head})"
    if done.changed:
        click.echo(
            f"{done.url}: upgraded from {done.before or 'an empty database'} to revision {at}"
        )
    else:
        click.echo(f"{done.url}: at revision {at}")


# -- doctor ---------------------------------------------------------------------------

#: ``prune`` asks (or, with no terminal, refuses) before deleting more sessions than this.
PRUNE_CONFIRM_ABOVE = 100

#: ``doctor``: a check failed (or, with ``--strict``, warned).
EXIT_UNHEALTHY = 1


@click.command()
@url_option(
    "--outbox-url",
    envvar="SESSIONREPO_OUTBOX_URL",
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
                check.model_copy(update={"detail": masked(check.detail, *urls)})
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
        detail = printable(check.detail, one_line=True)
        click.echo(f"  {labels[check.status]:<5} {check.name:<{width}}  {detail}")
        if check.fix and check.status in ("warn", "fail"):
            click.echo(f"  {'':<5} {'':<{width}}  fix: {printable(check.fix, one_line=True)}")
    if report.failures:
        names = ", ".join(check.name for check in report.failures)
        click.echo(f"verdict: UNHEALTHY ({names})")
    elif report.warnings:
        names = ", ".join(check.name for check in report.warnings)
        click.echo(f"verdict: healthy, with warnings ({names})")
    else:
        click.echo("verdict: healthy")


# -- export, import, prune --------------------------------------------------------


def _parse_ended_before(
    ctx: click.Context, param: click.Parameter, value: str | None
) -> datetime | None:
    return None if value is None else parse_when(value)


def _parse_older_than(
    ctx: click.Context, param: click.Parameter, value: str | None
) -> timedelta | None:
    if value is None:
        return None
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


@click.command("export")
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
    with open_store(url, read_only=True) as repository:
        total = count_sessions(repository, selection)
        with (
            _export_interrupted(output, total) as done,
            progress(total, "exporting sessions") as advance,
        ):

            def exported(session: Session) -> None:
                done.append(session.id)
                advance(1)

            if output == "-":
                report = export_sessions(
                    repository, sys.stdout.buffer, selection, on_session=exported
                )
            else:
                report = _export_to_file(repository, Path(output), selection, exported)
    if as_json:
        click.echo(report.model_dump_json(indent=2))
        return
    where = "stdout" if output == "-" else output
    click.echo(
        f"exported {count(report.sessions, 'session')} with "
        f"{count(report.messages, 'message')} to {where}",
        err=output == "-",
    )


@contextmanager
def _export_interrupted(output: str, total: int) -> Iterator[list[str]]:
    """Says what an export stopped by Ctrl-C leaves (exit 130, as an interrupted import):
    a file is removed, whole or not at all; what went to stdout lacks its end record.
    Yields the list the export adds each written session's id to."""
    done: list[str] = []
    try:
        yield done
    except KeyboardInterrupt:
        how_far = f"after {len(done):,} of {count(total, 'session')}"
        if output == "-":
            left = (
                "what went to stdout lacks the end record (`sessionrepo import` of it "
                "imports those sessions and says it was cut short)"
            )
        else:
            left = f"{output} was removed (an export is written whole or not at all)"
        click.echo(f"Error: export interrupted {how_far}: {left}; run it again", err=True)
        raise click.exceptions.Exit(130) from None


def _export_to_file(
    repository: SessionRepository,
    path: Path,
    selection: Selection,
    on_session: Callable[[Session], None],
) -> ExportReport:
    out = _create(path, "FILE")
    try:
        with out:
            return export_sessions(repository, out, selection, on_session=on_session)
    except BaseException:
        path.unlink(missing_ok=True)  # half an export is worse than none
        raise


def _create(path: Path, param: str) -> IO[bytes]:
    try:
        return create_private_file(path)
    except FileExistsError:
        raise click.BadParameter(
            f"{path} already exists; choose a new file", param_hint=repr(param)
        ) from None
    except OSError as exc:
        raise click.BadParameter(f"{path}: {exc.strerror}", param_hint=repr(param)) from None


@click.command("import")
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
    line, after importing everything before it (the messages of the session it is in
    included): mend the file and run it again. A PostgreSQL database must be migrated
    first (`sessionrepo migrate`); a new SQLite file is created.

    Exit status: 0 when the whole file was imported; 1 on an error, or when the
    file was cut short (it lacks its end record: what it held was imported).

    \b
    Example:
        sessionrepo --url postgresql://app@db/chat migrate
        sessionrepo import backup.jsonl
        gunzip -c discord-1234.jsonl.gz | sessionrepo import -
    """
    url: str | None = ctx.obj
    where = "stdin" if source == "-" else source
    size = None if source == "-" else Path(source).stat().st_size
    with (
        open_repository(url) as repository,
        _import_position(where) as position,
        click.open_file(source, "rb") as stream,
        progress(size, "importing", unit="bytes") as advance,
    ):

        def read(length: int) -> None:
            position.lines += 1
            advance(length)

        report = import_sessions(
            repository, stream, batch_size=batch_size, on_progress=read, on_written=position.written
        )
    if as_json:
        click.echo(report.model_dump_json(indent=2))
    else:
        click.echo(
            f"imported {count(report.sessions, 'session')} ({report.sessions_restored:,} new, "
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
            f"Error: {where} was cut short after line {position.lines:,} (it lacks the end "
            "record): what it held was imported; import the complete file to finish (what "
            "is stored already is skipped)",
            err=True,
        )
        ctx.exit(1)


class _ImportPosition:
    """How far an import got: the lines read and the totals of its last committed batch."""

    def __init__(self) -> None:
        self.lines = 0
        self.report = ImportReport()

    def written(self, report: ImportReport) -> None:
        self.report = report

    def progress(self, where: str) -> str:
        done = self.report
        return (
            f"{self.lines:,} of {where}: {count(done.messages_inserted, 'message')} inserted "
            f"and {done.messages_present:,} already present, in "
            f"{count(done.sessions, 'session')}, were committed before it; run the same "
            "import again to finish (what is stored already is skipped)"
        )


@contextmanager
def _import_position(where: str) -> Iterator[_ImportPosition]:
    """Says how far an import got when it stops half-way (Ctrl-C, a damaged line, the
    database gone), then lets the error go on: what was committed stays, and running
    the same import again finishes it (what is stored already is skipped)."""
    position = _ImportPosition()
    try:
        yield position
    except KeyboardInterrupt:
        click.echo(f"Error: import interrupted at line {position.progress(where)}", err=True)
        raise click.exceptions.Exit(130) from None
    except RepoError as exc:
        if not position.report.sessions:
            raise  # nothing was committed: the error is all there is to say
        raise RepoError(f"{exc} (stopped at line {position.progress(where)})") from exc


@click.command()
@click.option(
    "--older-than",
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
@click.option(
    "--yes",
    "-y",
    is_flag=True,
    help=f"Delete without asking, however many go (asked above {PRUNE_CONFIRM_ABOVE} sessions).",
)
@click.option(
    "--policy",
    is_flag=True,
    help="Apply the stored retention policies instead (see `sessionrepo retention`): "
    "erased with tombstones and audited, as `erase` does.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the PruneReport as JSON.")
@click.pass_obj
def prune(
    url: str | None,
    *,
    older_than: timedelta | None,
    policy: bool,
    dry_run: bool,
    export_path: Path | None,
    batch_size: int,
    yes: bool,
    as_json: bool,
) -> None:
    """Delete ended sessions, with their messages, once they are old enough.

    Only sessions that have ended, and whose end and last activity are both older
    than AGE, are deleted; an open session never is, however old. Each batch is
    checked again as it is deleted, so a session reopened or written to meanwhile
    stays. With --export, each batch is written and synced to FILE before it is
    deleted (with --dry-run too, then nothing is deleted). Messages a pruned session
    still has waiting in this database's pending_outbox are left there and reported.

    A prune that would delete more than 100 sessions asks first; without a terminal
    to ask on (a script, cron) it refuses, exit 1, deleting nothing, unless --yes is
    given. Progress goes to stderr.

    \b
    Example:
        sessionrepo prune --older-than 90d --dry-run
        sessionrepo prune --older-than 90d --export pruned-2025-06.jsonl --yes
        sessionrepo prune --policy --dry-run
    """
    if policy:
        if older_than is not None:
            raise click.UsageError("give --older-than or --policy, not both")
        prune_by_policy(url, dry_run=dry_run, as_json=as_json)
        return
    if older_than is None:
        raise click.UsageError("give --older-than AGE (or --policy)")
    cutoff = utcnow() - older_than
    with open_store(url) as repository:
        total = None if dry_run else count_prunable(repository, cutoff)
        if total is not None and total > PRUNE_CONFIRM_ABOVE and not yes:
            _confirm_prune(total)
        out = _create(export_path, "--export") if export_path is not None else None
        try:
            report = _prune(
                repository,
                cutoff,
                total,
                out=out,
                batch_size=batch_size,
                as_json=as_json,
            )
        finally:
            if out is not None:
                out.close()
    if as_json:
        click.echo(report.model_dump_json(indent=2))
        return
    _print_prune(report, export_path)


def _confirm_prune(total: int) -> None:
    what = f"this deletes {count(total, 'ended session')} with their messages"
    if not stdin_is_terminal():
        raise click.ClickException(
            f"{what} (more than {PRUNE_CONFIRM_ABOVE}): nothing was deleted; run it again "
            "with --yes to confirm, or with --dry-run to list them"
        )
    if not click.confirm(f"{what.capitalize()}. Continue?", err=True):
        raise click.ClickException("nothing was deleted")


def stdin_is_terminal() -> bool:
    """Whether a person can answer a question (stdin is a terminal)."""
    return sys.stdin.isatty()


def _prune(
    repository: SessionRepository,
    cutoff: datetime,
    total: int | None,
    *,
    out: IO[bytes] | None,
    batch_size: int,
    as_json: bool,
) -> PruneReport:
    def listed(batch: list[Session]) -> None:
        for session in batch:
            reason = printable(session.end_reason or "-", one_line=True)
            click.echo(
                f"would prune {printable(session.id, one_line=True)}  "
                f"ended {when(session.ended_at)} ({reason})  "
                f"last active {when(session.last_active_at)}  "
                f"{count(session.message_count, 'message')}"
            )

    if total is None:  # a dry run
        return prune_sessions(
            repository,
            cutoff=cutoff,
            dry_run=True,
            export_to=out,
            batch_size=batch_size,
            on_batch=None if as_json else listed,
        )
    with progress(total, "pruning", unit="sessions") as advance:
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
        f"{verb} {count(report.sessions, 'session')} with "
        f"{count(report.messages, 'message')} (ended and last active before "
        f"{when(report.cutoff)} UTC)"
    )
    if export_path is not None and report.exported is not None:
        click.echo(f"exported {count(report.exported, 'session')} to {export_path} first")
    if report.kept:
        click.echo(
            f"kept {count(len(report.kept), 'session')} changed while pruning (reopened "
            f"or written to): {', '.join(map(quoted, report.kept[:10]))}"
            + (" …" if len(report.kept) > 10 else "")
        )
    if report.outbox_rows:
        click.echo(
            f"note: {count(report.outbox_rows, 'message')} of "
            f"{count(len(report.outbox_sessions), 'pruned session')} still wait in "
            "pending_outbox; they were left there, and a drain will recreate those "
            "sessions with them (see `sessionrepo outbox status`)"
        )
