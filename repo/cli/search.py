"""``sessionrepo search`` and ``sessionrepo reindex``: full-text search over the
messages, and the rebuild of its index."""

from __future__ import annotations

import json
import os
import sys
from datetime import datetime
from typing import Final, Literal

import click

from sessionrepo.cli._common import (
    count,
    open_store,
    parse_when,
    printable,
    progress,
    progress_to_total,
    when,
)
from sessionrepo.models.message import ROLES
from sessionrepo.models.search import SearchHit
from sessionrepo.store.repository import SessionRepository

#: A search that finds at least this many messages waiting for the index indexes them
#: first with a progress report (on stderr); fewer are the search's own short work.
CATCH_UP_NOTICE: Final = 2000
#: Messages indexed per catch-up call between two progress reports.
CATCH_UP_STEP: Final = 2000


class _QueryCommand(click.Command):
    """A command whose words that start with a single ``-`` are query text, not
    options: ``-dog`` excludes a word, and the command has no short options, so
    ``search '-dog mochi'`` means what it says (``--`` works as well, as everywhere).
    Long options (``--json``) stay options, and an option's value stays its value."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        valued = {
            opt
            for param in self.params
            if isinstance(param, click.Option) and not param.is_flag
            for opt in param.opts
        }
        options: list[str] = []
        words: list[str] = []
        rest = iter(args)
        for arg in rest:
            if arg == "--":
                words += rest
            elif arg.startswith("--"):
                options.append(arg)
                value = next(rest, None) if arg in valued else None
                if value is not None:  # --source VALUE: the value may start with -
                    options.append(value)
            else:
                words.append(arg)
        return super().parse_args(ctx, [*options, "--", *words] if words else options)


@click.command("search", cls=_QueryCommand)
@click.argument("query", nargs=-1, required=True)
@click.option("--session", "session_id", metavar="ID", help="Only this session.")
@click.option("--source", help="Only sessions from this platform.")
@click.option("--role", type=click.Choice(ROLES), help="Only messages of this role.")
@click.option("--user", "user_id", metavar="ID", help="Only this user's sessions.")
@click.option(
    "--since",
    callback=lambda _ctx, _param, value: _moment(value),
    metavar="WHEN",
    help="Only messages made at or after WHEN: a time (RFC 3339, UTC unless it says), "
    "a date (from its start, UTC) or an age such as 7d.",
)
@click.option(
    "--until",
    callback=lambda _ctx, _param, value: _moment(value, until=True),
    metavar="WHEN",
    help="Only messages made before WHEN: a time, a date (that whole day included) or an age.",
)
@click.option(
    "--newest", is_flag=True, help="Newest first instead of best first (cheaper on big stores)."
)
@click.option("--limit", type=click.IntRange(1, 1000), default=20, show_default=True)
@click.option(
    "--mode",
    type=click.Choice(["keyword", "semantic", "hybrid"]),
    default="keyword",
    show_default=True,
    help="keyword: the words; semantic: by meaning (the semantic extra); hybrid: both, fused.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the hits as JSON lines.")
@click.pass_obj
def search_(
    url: str | None,
    *,
    query: tuple[str, ...],
    session_id: str | None,
    source: str | None,
    role: str | None,
    user_id: str | None,
    since: datetime | None,
    until: datetime | None,
    newest: bool,
    limit: int,
    mode: Literal["keyword", "semantic", "hybrid"],
    as_json: bool,
) -> None:
    """Find messages by what they say (or, --mode semantic|hybrid, by what they mean).

    QUERY is words (all must occur), "quoted phrases", prefix* and -excluded words;
    any other character is plain text. It may be one argument or several (joined by
    spaces), and may start with -: `search '-dog mochi'` and `search -- '-dog mochi'`
    are the same query. Exit 1 if the index is stale (run reindex).

    Each hit is a line: session, #seq, time (UTC), role, and an extract with the matches
    shown in bold on a terminal (unless $NO_COLOR is set); otherwise in [brackets], the
    extract's own [, ] and \\ then written \\[, \\] and \\\\, so a bracket is a mark
    only when it is not escaped. Invisible and control characters are escapes (\\u202e).
    --json has the hit's "snippet_parts": [text, is_match] runs.

    \b
    Example:
        sessionrepo search 'mochi "vet visit" -dog'
        sessionrepo search -- '-dog mochi'
        sessionrepo search 'deploy*' --source slack --role user --newest --json
        sessionrepo search invoice --since 2025-01-01 --until 2025-01-31
        sessionrepo search 'error*' --since 7d
        sessionrepo search 'the chat where we planned the Tokyo trip' --mode hybrid
    """
    with open_store(url) as repository:
        _catch_up(repository)
        hits = repository.search(
            " ".join(query),
            session_id=session_id,
            source=source,
            role=role,
            user_id=user_id,
            since=since,
            until=until,
            order="newest" if newest else "rank",
            limit=limit,
            mode=mode,
        )
    bold = stdout_is_terminal() and not os.environ.get("NO_COLOR")
    for hit in hits:
        if as_json:
            click.echo(hit.model_dump_json())
        else:
            role = printable(hit.role or "item", one_line=True)
            click.echo(
                f"{printable(hit.session_id, one_line=True)} #{hit.seq}  "
                f"{when(hit.timestamp)}  {role:<9} {shown_snippet(hit, bold=bold)}"
            )
    if not as_json:
        click.echo(f"{count(len(hits), 'hit')}", err=True)
    notice = getattr(hits, "notice", None)
    if notice:
        click.echo(f"note: {notice}", err=True)


def _moment(value: str | None, *, until: bool = False) -> datetime | None:
    return None if value is None else parse_when(value, until=until)


def stdout_is_terminal() -> bool:
    """Whether the hits go to a terminal (which shows matches in bold)."""
    return sys.stdout.isatty()


#: ANSI bold on and off (the text between is escaped: it cannot hold an escape of its own).
_BOLD, _NORMAL = "\x1b[1m", "\x1b[22m"
_MARKERS = str.maketrans({"\\": "\\\\", "[": "\\[", "]": "\\]"})


def shown_snippet(hit: SearchHit, *, bold: bool) -> str:
    """The hit's extract as one line, matches in bold (``bold``) or else in [brackets],
    with the extract's own brackets and backslashes escaped so that they cannot be taken
    for marks; every run escaped by :func:`~sessionrepo.cli._common.printable`."""
    pieces: list[str] = []
    for run, matched in hit.snippet_parts:
        # Each run is one line already (snippet_parts collapses whitespace).
        text = printable(run if bold else run.translate(_MARKERS))
        if matched:
            pieces.append(f"{_BOLD}{text}{_NORMAL}" if bold else f"[{text}]")
        else:
            pieces.append(text)
    return "".join(pieces)


def _catch_up(repository: SessionRepository) -> None:
    """Index the messages waiting for the index before searching, saying so when they
    are many: a search answers for every message committed before it, and would
    otherwise do this work in silence (seconds for a large backlog)."""
    waiting = repository.search_index_backlog()
    if waiting < CATCH_UP_NOTICE:
        return  # the search's own catch-up: one short transaction
    label = f"indexing {count(waiting, 'message')} appended since the index last caught up"
    with progress(waiting, label) as advance:
        left = waiting
        while left:
            repository.catch_up_search_index(limit=CATCH_UP_STEP)
            now = repository.search_index_backlog()
            if now >= left:
                break  # held by another catch-up, or appends keep coming: search waits
            advance(left - now)
            left = now


@click.command()
@click.option(
    "--semantic",
    is_flag=True,
    help="Re-embed every message for search by meaning instead (after a change of model).",
)
@click.option("--json", "as_json", is_flag=True, help='Print {"indexed": N} as JSON.')
@click.pass_obj
def reindex(url: str | None, semantic: bool, as_json: bool) -> None:
    """Rebuild the full-text search index from the messages.

    After `doctor` reports a stale or broken index, or after upgrading a populated store:
    a store indexed by an older sessionrepo finds what this one indexes more of (tool
    calls by their names and arguments, tool results by their tool) only once rebuilt.
    Transcript writes wait for it (or, through a TranscriptWriter, park in the outbox).

    \b
    Example:
        sessionrepo reindex
        SESSIONREPO_DATABASE_URL=postgresql://app@db/chat sessionrepo reindex
        sessionrepo reindex --semantic
    """
    if semantic:
        with open_store(url) as repository, progress_to_total("embedding") as update:
            embedded = repository.reindex_semantic(progress=update)
        if as_json:
            click.echo(json.dumps({"embedded": embedded}))
        else:
            click.echo(f"embedded {count(embedded, 'message')}; search by meaning is available")
        return
    with open_store(url) as repository, progress_to_total("reindexing") as update:
        indexed = repository.reindex(progress=update)
    if as_json:
        click.echo(json.dumps({"indexed": indexed}))
    else:
        click.echo(f"indexed {count(indexed, 'message')}; search is available")
