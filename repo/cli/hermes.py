"""``sessionrepo import-hermes``: move a Hermes gateway's history into the store.

A thin shell over :mod:`sessionrepo.importers.hermes` (read its docstring for what goes
where). Registered in the ``sessionrepo`` group by :mod:`sessionrepo.cli`; it also works
on its own, so it takes a ``--url`` of its own and turns library errors into one line
itself.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from sessionrepo.cli._common import one_line, url_option
from sessionrepo.errors import RepoError
from sessionrepo.importers import hermes
from sessionrepo.importers.hermes import HermesImportSummary, Problem
from sessionrepo.store.repository import open_repository

#: The import finished, but something needs an operator's look (see the help).
EXIT_ATTENTION = 3
KIND_LABELS = {
    "shutdown_pending": "shutdown pending slot",
    "overflow_tail": "overflow tail",
    "transcript_cap_drop": "transcript cap drop",
    "agent_history_dump": "agent-history dump",
}
#: Lines of each list shown in the text summary (``--json`` has them all).
SHOWN = 20


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
    "--inbound-report",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FILE",
    help="Where to write the spool's unprocessed inbound user messages (JSON lines) for "
    "re-delivery. Default: ./hermes-inbound-<id>.jsonl, named after the spool files "
    "(written only when there are any).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.pass_context
def import_hermes(
    ctx: click.Context,
    source: Path,
    url: str | None,
    inbound_report: Path | None,
    as_json: bool,
) -> None:
    """Import a Hermes gateway's history: state.db and the pending_messages/ spool.

    HERMES_HOME_OR_STATE_DB is the gateway's home directory (~/.hermes, or
    $HERMES_HOME: state.db and pending_messages/) or a state.db file (then the spool is
    not read). The source is only read, never changed; a gateway may keep running.

    Every session and message comes over, nothing dropped: columns sessionrepo has no
    field for go to metadata["hermes"] / extra["hermes"]; inactive rows (archived by
    compaction, undone by rewind) go to a companion "<id>#history" session; transcript
    messages from the spool join their session. Spooled inbound user messages the agent
    never processed are written to a JSON-lines file for re-delivery. Running it again
    inserts nothing already stored.

    \b
    Exit status:
        0  imported
        1  error (one line on stderr); running it again continues where it stopped
        2  usage error
        3  imported, but look at the summary: unparseable spool files (left in
           place), messages the store holds with different content or refused,
           rows archived since an earlier import

    \b
    Example:
        sessionrepo --url postgresql://app@db/chat migrate
        sessionrepo --url postgresql://app@db/chat import-hermes ~/.hermes
        sessionrepo import-hermes ~/.hermes/state.db --json > import.json
    """
    url = _effective_url(ctx, url)
    try:
        summary = _run(source, url, inbound_report, as_json)
    except RepoError as exc:
        raise click.ClickException(one_line(str(exc), url)) from exc
    if as_json:
        click.echo(summary.model_dump_json(indent=2))
    else:
        _print_summary(summary)
    if summary.needs_attention:
        ctx.exit(EXIT_ATTENTION)


def _effective_url(ctx: click.Context, url: str | None) -> str | None:
    """``--url`` given to this command, else the group's ``--url``, else the environment."""
    parent = ctx.parent.params.get("url") if ctx.parent is not None else None
    if isinstance(parent, str) and ctx.get_parameter_source("url") is not (
        ParameterSource.COMMANDLINE
    ):
        return parent
    return url


def _run(
    path: Path, url: str | None, inbound_report: Path | None, as_json: bool
) -> HermesImportSummary:
    with hermes.open_hermes(path) as source:
        report = inbound_report
        if report is None and source.spool.inbound:
            report = hermes.default_inbound_report(source)
        repository = open_repository(url)
        try:
            label = "" if as_json else f"Importing {source.total_messages:,} messages"
            with click.progressbar(
                length=source.total_messages, label=label, file=sys.stderr
            ) as bar:
                summary = hermes.import_hermes(
                    source, repository, inbound_report=report, progress=bar.update
                )
            return summary.model_copy(update={"target": repository.display_url})
        finally:
            repository.close()


def _print_summary(summary: HermesImportSummary) -> None:
    parts = []
    if summary.state_db is not None:
        version = summary.schema_version
        parts.append(f"state.db schema version {version}" if version else "state.db")
    if summary.spool_dir is not None:
        parts.append(f"{len(summary.files):,} spool files")
    echo = click.echo
    echo(f"Imported {summary.source} ({', '.join(parts)}) in {summary.seconds:.1f} s")
    if summary.target:
        echo(f"into {summary.target}.")
    echo("")
    sessions = [f"{summary.sessions_read:,} in state.db"]
    if summary.sessions_without_row:
        sessions.append(f"{summary.sessions_without_row:,} without a sessions row")
    if summary.sessions_only_in_spool:
        sessions.append(f"{summary.sessions_only_in_spool:,} only in the spool")
    echo(f"  sessions  {', '.join(sessions)}; {summary.sessions_new:,} new in the store")
    if summary.history_sessions:
        count = summary.history_sessions
        echo(
            f"            {count:,} new '<id>#history' {'session' if count == 1 else 'sessions'}"
            " for the inactive rows (active = 0)"
        )
    echo(
        f"  messages  {summary.messages_read:,} read: {summary.rows_read:,} state.db rows "
        f"({summary.inactive_rows:,} inactive), {summary.spool_messages_read:,} from the spool"
    )
    echo(
        f"            {summary.messages_inserted:,} inserted, "
        f"{summary.messages_already_present:,} already present, "
        f"{summary.messages_changed:,} changed, {summary.messages_rejected:,} rejected"
    )
    if summary.spool_files:
        kinds = ", ".join(
            f"{count:,} {KIND_LABELS.get(kind, kind)}"
            for kind, count in summary.spool_files.items()
        )
        echo(f"  spool     {kinds}")
    if summary.inbound_messages:
        where = summary.inbound_report or "not written"
        echo(
            f"  inbound   {summary.inbound_messages:,} user messages the agent never "
            f"processed: {where} (re-deliver them)"
        )
    if summary.spool_not_read:
        echo(f"  note      {summary.spool_not_read} was not read: give the home directory")

    _section(
        "Spool files not imported (left in place, unchanged)",
        [f"{item.name}: {item.error}" for item in summary.unparseable_files],
    )
    _section("Stored earlier with different content (stored row kept)", _lines(summary.changed))
    _section("Not stored (still in the source)", _lines(summary.rejected))
    _section("Archived by Hermes since an earlier import", _lines(summary.archived_since_import))
    _section(
        "Values moved aside (field got the nearest storable value; original kept as repr)",
        _lines(summary.moved_aside),
    )
    _section("Possible duplicates (stored anyway)", _lines(summary.possible_duplicates))
    _section("Notes", _lines(summary.notes))


def _lines(problems: Iterable[Problem]) -> list[str]:
    lines = []
    for problem in problems:
        shown = problem.session_id and problem.session_id not in problem.where
        session = f" (session {problem.session_id})" if shown else ""
        field = f"{problem.field}: " if problem.field else ""
        to = f" -> {problem.stored_as}" if problem.stored_as else ""
        lines.append(f"{problem.where}{session}: {field}{problem.problem}{to}")
    return lines


def _section(title: str, lines: list[Any]) -> None:
    if not lines:
        return
    click.echo("")
    click.echo(f"{title}: {len(lines):,}")
    for line in lines[:SHOWN]:
        click.echo(f"  {line}")
    if len(lines) > SHOWN:
        click.echo(f"  … {len(lines) - SHOWN:,} more (--json lists them all)")
