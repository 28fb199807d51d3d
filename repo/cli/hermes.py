"""``sessionrepo import-hermes``: move a Hermes gateway's history into the store.

A thin shell over :mod:`sessionrepo.importers.hermes` (read its docstring for what goes
where). Registered in the ``sessionrepo`` group by :mod:`sessionrepo.cli`; it also works
on its own, so it takes a ``--url`` of its own and turns library errors into one line
itself.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Iterable
from pathlib import Path

import click
from click.core import ParameterSource

from sessionrepo.cli._common import one_line, progress, url_option
from sessionrepo.errors import RepoError
from sessionrepo.importers import hermes
from sessionrepo.importers.hermes import HermesImportReport, HermesImportSummary, Problem
from sessionrepo.ops.export import create_private_file
from sessionrepo.store.repository import SessionRepository, open_repository

#: The import finished, but something needs a person's look (see the help).
EXIT_ATTENTION = 3
KIND_LABELS = {
    "shutdown_pending": "shutdown pending slot",
    "overflow_tail": "overflow tail",
    "transcript_cap_drop": "transcript cap drop",
    "agent_history_dump": "agent-history dump",
    "unparseable": "unparseable",
}
#: Examples of each list shown in the text summary (``--json``/``--report`` have them all).
SHOWN = 3


@click.command("import-hermes")
@click.argument(
    "source",
    metavar="HERMES_HOME_OR_STATE_DB",
    type=click.Path(exists=True, path_type=Path),
)
@url_option(
    "--url",
    envvar="SESSIONREPO_DATABASE_URL",
    help="The store to import into (postgresql://… or sqlite:///path.db). Default: the "
    "group's --url, else $SESSIONREPO_DATABASE_URL, else the embedded SQLite file.",
)
@click.option(
    "--profiles/--no-profiles",
    default=True,
    show_default=True,
    help="Also import the home's named profiles (profiles/<name>/). With --no-profiles "
    "they are listed, each with the command that imports it.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the whole report as JSON.")
@click.option(
    "--report",
    "report_file",
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
    metavar="FILE",
    help="Also write the whole report (every item of every list) as JSON to FILE.",
)
@click.pass_context
def import_hermes(
    ctx: click.Context,
    *,
    source: Path,
    url: str | None,
    profiles: bool,
    as_json: bool,
    report_file: Path | None,
) -> None:
    """Import a Hermes gateway's history: state.db and the pending_messages/ spool.

    HERMES_HOME_OR_STATE_DB is the gateway's home directory (~/.hermes, or
    $HERMES_HOME: state.db, pending_messages/ and profiles/<name>/) or a state.db
    file (then neither the spool nor profiles are read). Nothing in the gateway's home
    is created or changed, not even SQLite's -wal/-shm files: state.db is read from a
    private copy, so a gateway may keep running.

    Every session and message comes over once, whatever route it took (a state.db row,
    a spooled payload, the shutdown agent-history dump); inbound user messages the agent
    never processed are appended to the session Hermes would give them to. Rows that are
    not conversation (archived, rewound, hidden, session_meta) are stored in their
    session, in Hermes' order, and retracted (kept, out of the live transcript and
    search); one an earlier import stored live is retracted now. Running it again, or
    after Hermes restarted and replayed its spool, inserts nothing already stored.

    \b
    Exit status:
        0  imported, nothing needs a person
        1  error (one line on stderr); running it again continues where it stopped
        2  usage error
        3  imported, but something needs a person: unparseable spool files (left in
           place), messages stored earlier with other content or refused by the
           store, inbound messages no session takes, a session id in two profiles

    \b
    Example:
        sessionrepo --url postgresql://app@db/chat migrate
        sessionrepo --url postgresql://app@db/chat import-hermes ~/.hermes
        sessionrepo import-hermes ~/.hermes --report ~/hermes-import.json
    """
    url = _effective_url(ctx, url)
    try:
        report = _run(source, url, profiles, quiet=as_json)
        if report_file is not None:
            _write_report(report, report_file)
    except RepoError as exc:
        raise click.ClickException(one_line(str(exc), url)) from exc
    if as_json:
        click.echo(report.model_dump_json(indent=2))
    else:
        _print_report(report, report_file)
    if report.needs_attention:
        ctx.exit(EXIT_ATTENTION)


def _effective_url(ctx: click.Context, url: str | None) -> str | None:
    """``--url`` given to this command, else the group's ``--url``, else the environment."""
    parent = ctx.parent.params.get("url") if ctx.parent is not None else None
    if isinstance(parent, str) and ctx.get_parameter_source("url") is not (
        ParameterSource.COMMANDLINE
    ):
        return parent
    return url


def _homes(path: Path, profiles: bool) -> tuple[list[Path], list[tuple[str, str]]]:
    """The homes to import and the profiles left out (with the command for each)."""
    if not path.is_dir():
        return [path], []
    found = hermes.hermes_profiles(path)
    if profiles:
        return [path, *(home for _, home in found)], []
    return [path], [
        (name, f"sessionrepo import-hermes {shlex.quote(str(home))}") for name, home in found
    ]


def _run(path: Path, url: str | None, profiles: bool, *, quiet: bool) -> HermesImportReport:
    homes, left_out = _homes(path, profiles)
    repository = open_repository(url)
    try:
        summaries: list[HermesImportSummary] = []
        seen: dict[str, str] = {}
        shared: set[str] = set()
        for home in homes:
            summary, ids = _import_one(home, repository, quiet=quiet)
            summaries.append(summary.model_copy(update={"target": repository.display_url}))
            for sid in ids:
                if seen.setdefault(sid, summary.profile or "") != summary.profile:
                    shared.add(sid)
        return HermesImportReport(
            homes=summaries, profiles_not_imported=left_out, shared_session_ids=sorted(shared)
        )
    finally:
        repository.close()


def _import_one(
    home: Path, repository: SessionRepository, *, quiet: bool
) -> tuple[HermesImportSummary, list[str]]:
    with hermes.open_hermes(home) as source:
        ids = [row["id"] for row in source.sessions() if isinstance(row["id"], str)]
        label = f"importing {source.total_messages:,} messages from {home}"
        with progress(source.total_messages, label, unit="messages") as advance:
            summary = hermes.import_hermes(source, repository, progress=advance)
        return summary, ids


def _write_report(report: HermesImportReport, path: Path) -> None:
    path = path.expanduser().absolute()
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with create_private_file(temporary) as handle:  # 0600: it names sessions
            handle.write((report.model_dump_json(indent=2) + "\n").encode())
        os.replace(temporary, path)
    except OSError as exc:
        temporary.unlink(missing_ok=True)
        raise RepoError(f"cannot write the report {path}: {exc}") from exc


# -- the text summary -----------------------------------------------------------------


def _print_report(report: HermesImportReport, report_file: Path | None) -> None:
    for index, summary in enumerate(report.homes):
        if index:
            click.echo("")
        _print_summary(summary)
    if report.shared_session_ids:
        click.echo("")
        _section(
            "Session ids found in more than one profile (their messages share one session)",
            report.shared_session_ids,
        )
    if report.profiles_not_imported:
        click.echo("")
        click.echo(f"Profiles not imported: {len(report.profiles_not_imported)}")
        for name, command in report.profiles_not_imported:
            click.echo(f"  {name}: {command}")
    click.echo("")
    if report_file is not None:
        click.echo(f"The whole report is in {report_file}.")
    elif _truncated(report):
        click.echo("Every item of every list: --json, or --report FILE.")


def _attention(summary: HermesImportSummary) -> list[tuple[str, list[str]]]:
    return [
        (
            "spool files not imported (left in place, unchanged)",
            [f"{item.name}: {item.error}" for item in summary.unparseable_files],
        ),
        ("messages stored earlier with other content (stored one kept)", _lines(summary.changed)),
        ("messages the store refused (still in the source)", _lines(summary.rejected)),
        ("inbound messages no session takes", _lines(summary.inbound_undelivered)),
    ]


def _information(summary: HermesImportSummary) -> list[tuple[str, list[str]]]:
    return [
        (
            "values stored as the nearest storable value (original kept as repr)",
            _lines(summary.moved_aside),
        ),
        (
            "agent-history dump entries already in state.db (skipped)",
            _lines(summary.dump_entries_persisted),
        ),
        (
            "spool messages equal to a row, without a uid (stored)",
            _lines(summary.possible_duplicates),
        ),
        ("rows Hermes stored twice (kept once)", _lines(summary.duplicate_rows)),
        (
            "rows taken out of the conversation since an earlier import (retracted now)",
            _lines(summary.archived_since_import),
        ),
        ("delegation results never delivered", _lines(summary.pending_delegations)),
        ("notes", _lines(summary.notes)),
    ]


def _truncated(report: HermesImportReport) -> bool:
    return any(
        len(lines) > SHOWN
        for summary in report.homes
        for _, lines in (*_attention(summary), *_information(summary))
    )


def _print_summary(summary: HermesImportSummary) -> None:
    echo = click.echo
    parts = []
    if summary.state_db is not None:
        version = summary.schema_version
        parts.append(f"state.db schema version {version}" if version else "state.db")
    if summary.spool_dir is not None:
        parts.append(f"{len(summary.files):,} spool files")
    profile = f" [profile {summary.profile}]" if summary.profile else ""
    echo(f"Imported {summary.source}{profile} ({', '.join(parts)}) in {summary.seconds:.1f} s")
    if summary.target:
        echo(f"into {summary.target}.")

    attention = [(title, lines) for title, lines in _attention(summary) if lines]
    total = sum(len(lines) for _, lines in attention)
    echo(f"  needs a person   {total:,}" + ("" if total else " (nothing)"))
    for title, lines in attention:
        _section(title, lines, indent="    ")

    sessions = [f"{summary.sessions_read:,} in state.db"]
    if summary.sessions_without_row:
        sessions.append(f"{summary.sessions_without_row:,} without a sessions row")
    if summary.sessions_only_in_spool:
        sessions.append(f"{summary.sessions_only_in_spool:,} only in the spool")
    echo(f"  sessions         {', '.join(sessions)}; {summary.sessions_new:,} new in the store")
    echo(
        f"  messages         {summary.messages_read:,} read ({summary.rows_read:,} state.db "
        f"rows, {summary.spool_messages_read:,} from the spool): "
        f"{summary.messages_inserted:,} inserted, "
        f"{summary.messages_already_present:,} already present"
        + (
            f" ({summary.messages_seen_by_another_route:,} of them stored earlier by another route)"
            if summary.messages_seen_by_another_route
            else ""
        )
        + f", {summary.messages_changed:,} changed, {summary.messages_rejected:,} rejected"
    )
    if summary.usage_rows_read or summary.usage_records_inserted:
        echo(
            f"  usage            {summary.usage_rows_read:,} session_model_usage rows read: "
            f"{summary.usage_records_inserted:,} usage records added (what Hermes counted "
            "since the last import)"
        )
    if summary.set_aside_rows:
        kept = ", ".join(f"{count:,} {state}" for state, count in summary.set_aside_rows.items())
        echo(f"  not conversation {kept}: stored in their sessions, retracted")
    if summary.spool_files:
        kinds = ", ".join(
            f"{count:,} {KIND_LABELS.get(kind, kind)}"
            for kind, count in summary.spool_files.items()
        )
        echo(f"  spool            {kinds}")
    if summary.inbound_messages:
        undelivered = len(summary.inbound_undelivered)
        delivered = summary.inbound_messages - undelivered
        echo(
            f"  inbound          {summary.inbound_messages:,} user messages the agent never "
            f"processed: {delivered:,} in their sessions ({summary.inbound_inserted:,} "
            f"appended now), {undelivered:,} undelivered"
        )
    if summary.spool_not_read:
        echo(f"  note             {summary.spool_not_read} was not read: give the home directory")
    for title, lines in _information(summary):
        if lines:
            _section(title, lines, indent="  ")


def _lines(problems: Iterable[Problem]) -> list[str]:
    lines = []
    for problem in problems:
        shown = problem.session_id and problem.session_id not in problem.where
        session = f" (session {problem.session_id})" if shown else ""
        field = f"{problem.field}: " if problem.field else ""
        to = f" -> {problem.stored_as}" if problem.stored_as else ""
        lines.append(f"{problem.where}{session}: {field}{problem.problem}{to}")
    return lines


def _section(title: str, lines: list[str], indent: str = "") -> None:
    click.echo(f"{indent}{title}: {len(lines):,}")
    for line in lines[:SHOWN]:
        click.echo(f"{indent}  {line}")
    if len(lines) > SHOWN:
        click.echo(f"{indent}  … {len(lines) - SHOWN:,} more")
