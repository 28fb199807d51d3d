"""``sessionrepo sessions``: list sessions, read a transcript, end, reopen, rewind, clear
or fork a session.

Over the repository's public reads (``list_sessions``, ``get_session``,
``load_transcript``), ``end_session``, ``reopen_session`` and the edits (``rewind``,
``clear_session``, ``fork_session``); what is here is how a transcript is shown on a
terminal.
"""

from __future__ import annotations

import json
import shutil
import textwrap
from collections.abc import Iterator
from typing import Any, Literal

import click

from sessionrepo.cli._common import Group, count, open_store, printable, quoted, rfc3339, when
from sessionrepo.models import EditResult, Session, StoredMessage
from sessionrepo.store.repository import SessionRepository

#: Messages read per transcript page by ``sessions show``.
TRANSCRIPT_PAGE = 500
MAX_SEQ = 2**63 - 1


@click.group(cls=Group)
def sessions() -> None:
    """List sessions, read a transcript, end, reopen, rewind, clear or fork a session.

    \b
    Example:
        sessionrepo sessions list --source discord --status open
        sessionrepo sessions show discord:1234
        sessionrepo sessions end discord:1234 --reason user_left
        sessionrepo sessions reopen discord:1234
        sessionrepo sessions rewind discord:1234 --to-seq 40
        sessionrepo sessions fork discord:1234 --at-seq 40 --new-id discord:1234-b
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
    with open_store(url, read_only=True) as repository:
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
            _clip(printable(s.id, one_line=True), 40),
            _clip(printable(s.source, one_line=True), 16),
            _clip(printable(s.user_id or "-", one_line=True), 20),
            "open" if s.ended_at is None else "ended",
            f"{s.message_count:,}",
            when(s.last_active_at),
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
        preview = "preview" if summary is None else printable(summary.preview or "", one_line=True)
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
@click.option(
    "--include-retracted",
    is_flag=True,
    help="Also the messages an edit took out of the live transcript (marked).",
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
    include_retracted: bool,
) -> None:
    """Print a session's transcript, oldest first.

    Each message shows its seq, time (UTC) and role, then its content wrapped to the
    terminal (long messages cut after --lines lines unless --full); tool calls are
    summarised as name(arguments) and tool results name the call they answer. Control
    characters are shown as escapes. The transcript is read a page at a time.

    With --json, each line is one message as a JSON object: {"seq": …, "timestamp": …,
    "message": {…}}, where "message" is the OpenAI-format dict exactly as stored
    (to_openai(include_key=True): its client_msg_uuid included, so it can be flushed
    again without duplicating anything). --include-retracted shows the history an edit
    (rewind, clear, compact) took out of the live transcript too, each such message marked
    (JSON: "superseded": "retracted" or "compacted").

    \b
    Example:
        sessionrepo sessions show discord:1234 --tail 20
        sessionrepo sessions show discord:1234 --json | jq -c .message
    """
    if tail is not None and (after_seq is not None or limit is not None):
        raise click.UsageError("--tail cannot be combined with --after or --limit")
    with open_store(url, read_only=True) as repository:
        if not as_json:
            _print_session_header(repository.get_session(session_id))
        wrap = width or shutil.get_terminal_size((100, 24)).columns
        pages = _transcript_pages(
            repository, session_id, after_seq, limit, tail, include_retracted=include_retracted
        )
        for message in pages:
            if as_json:
                record: dict[str, Any] = {
                    "seq": message.seq,
                    "timestamp": rfc3339(message.timestamp),
                    "message": message.to_openai(include_key=True),
                }
                if include_retracted:
                    record["superseded"] = message.superseded
                click.echo(json.dumps(record, ensure_ascii=False))
            else:
                _print_message(message, wrap, None if full else lines)


def _transcript_pages(
    repository: SessionRepository,
    session_id: str,
    after_seq: int | None,
    limit: int | None,
    tail: int | None,
    *,
    include_retracted: bool = False,
) -> Iterator[StoredMessage]:
    if tail is not None:
        yield from repository.load_transcript(
            session_id, before_seq=MAX_SEQ, limit=tail, include_retracted=include_retracted
        )
        return
    after = after_seq or 0
    left = limit
    while left is None or left > 0:
        size = TRANSCRIPT_PAGE if left is None else min(left, TRANSCRIPT_PAGE)
        page = repository.load_transcript(
            session_id, after_seq=after, limit=size, include_retracted=include_retracted
        )
        yield from page
        if len(page) < size:
            return
        after = page[-1].seq
        if left is not None:
            left -= len(page)


def _print_session_header(session: Session) -> None:
    status = (
        "open"
        if session.ended_at is None
        else f"ended {when(session.ended_at)} ({_one_line(session.end_reason or '-')})"
    )
    click.echo(
        f"session {_one_line(session.id)} · source {_one_line(session.source)}"
        f" · user {_one_line(session.user_id or '-')}"
    )
    click.echo(
        f"started {when(session.started_at)} · last active {when(session.last_active_at)}"
        f" · {count(session.message_count, 'message')}"
        f" · {count(session.tool_call_count, 'tool call')}"
        f" · {status}"
    )
    details = [
        f"model {_one_line(session.model)}" if session.model else "",
        f"title {_one_line(session.title)}" if session.title else "",
        f"continues {_one_line(session.parent_session_id)}" if session.parent_session_id else "",
    ]
    if any(details):
        click.echo(" · ".join(detail for detail in details if detail))
    click.echo("")


def _print_message(message: StoredMessage, width: int, max_lines: int | None) -> None:
    about = ""
    if message.role == "tool":
        named = (message.tool_name, message.tool_call_id)
        about = f"  ({_one_line(', '.join(v for v in named if v))})"
    kind = message.role or f"item {_one_line(message.item_type or '?')}"
    state = f"  [{message.superseded}]" if message.superseded else ""
    click.echo(f"#{message.seq}  {when(message.timestamp)}  {kind}{about}{state}")
    indent = "    "
    lines: list[str] = []
    for paragraph in printable(_content_text(message.content)).split("\n"):
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
        return f"→ {_one_line(json.dumps(call, ensure_ascii=False))}"
    function = call.get("function")
    if not isinstance(function, dict):
        function = {}
    name = function.get("name") or call.get("type") or "?"
    arguments = function.get("arguments", "")
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    ident = f"  [{_one_line(str(call['id']))}]" if call.get("id") else ""
    shown = _one_line(f"{name}({_clip(arguments, 200)})")
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
    with open_store(url) as repository:
        ended = repository.end_session(session_id, reason)
        session = repository.get_session(session_id)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "session_id": session.id,
                    "ended": ended,
                    "ended_at": rfc3339(session.ended_at) if session.ended_at else None,
                    "end_reason": session.end_reason,
                }
            )
        )
    elif ended:
        click.echo(f"ended session {quoted(session.id)} (reason: {_one_line(reason)})")
    else:
        click.echo(
            f"session {quoted(session.id)} had already ended at {when(session.ended_at)} "
            f"(reason: {_one_line(session.end_reason or '-')}); nothing changed"
        )


@sessions.command()
@click.argument("session_id", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")
@click.pass_obj
def reopen(url: str | None, session_id: str, as_json: bool) -> None:
    """Reopen an ended session: it is open again, its end time and reason cleared (the
    next `end` records a reason anew). Reopening an open session changes nothing, and says
    so (exit 0 either way; --json has "reopened": true only when this call reopened it).

    \b
    Example:
        sessionrepo sessions reopen discord:1234
        sessionrepo sessions reopen discord:1234 --json
    """
    with open_store(url) as repository:
        reopened = repository.reopen_session(session_id)
        session = repository.get_session(session_id)
    if as_json:
        click.echo(json.dumps({"session_id": session.id, "reopened": reopened}))
    elif reopened:
        click.echo(f"reopened session {quoted(session.id)}")
    else:
        click.echo(f"session {quoted(session.id)} is open; nothing changed")


def _print_edit(result: EditResult, what: str, as_json: bool) -> None:
    if as_json:
        click.echo(result.model_dump_json())
    elif result.superseded:
        click.echo(
            f"session {quoted(result.session_id)}: "
            f"{count(len(result.superseded), 'message')} {what} "
            f"(kept as history: sessions show --include-retracted); "
            f"{count(result.message_count, 'message')} live"
        )
    else:
        click.echo(f"session {quoted(result.session_id)}: nothing to take back; nothing changed")


@sessions.command()
@click.argument("session_id", metavar="ID")
@click.option(
    "--to-seq",
    type=click.IntRange(min=0, max=MAX_SEQ),
    required=True,
    help="Keep the messages up to this seq; later ones leave the live transcript.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the EditResult as JSON.")
@click.pass_obj
def rewind(url: str | None, session_id: str, to_seq: int, as_json: bool) -> None:
    """Rewind a session: the messages after --to-seq leave its live transcript (they stay
    stored, shown by `show --include-retracted`, exported). Running it again changes
    nothing.

    \b
    Example:
        sessionrepo sessions rewind discord:1234 --to-seq 40
    """
    with open_store(url) as repository:
        result = repository.rewind(session_id, to_seq)
    _print_edit(result, "rewound", as_json)


@sessions.command()
@click.argument("session_id", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="Print the EditResult as JSON.")
@click.pass_obj
def clear(url: str | None, session_id: str, as_json: bool) -> None:
    """Empty a session's live transcript (history kept; `prune` deletes for real).

    \b
    Example:
        sessionrepo sessions clear discord:1234
    """
    with open_store(url) as repository:
        result = repository.clear_session(session_id)
    _print_edit(result, "cleared", as_json)


@sessions.command()
@click.argument("session_id", metavar="ID")
@click.option(
    "--at-seq",
    type=click.IntRange(min=0, max=MAX_SEQ),
    required=True,
    help="The fork's transcript starts as the source's messages 1..this seq.",
)
@click.option("--new-id", required=True, metavar="ID", help="The new session's id.")
@click.option("--title", help="The fork's title (default: the source's).")
@click.option("--json", "as_json", is_flag=True, help="Print the new Session as JSON.")
@click.pass_obj
def fork(
    url: str | None,
    session_id: str,
    *,
    at_seq: int,
    new_id: str,
    title: str | None,
    as_json: bool,
) -> None:
    """Fork a session at a seq: a new session whose transcript starts as the source's
    prefix, recording where it came from. Running it again changes nothing.

    \b
    Example:
        sessionrepo sessions fork discord:1234 --at-seq 40 --new-id discord:1234-b
    """
    fields = {} if title is None else {"title": title}
    with open_store(url) as repository:
        session = repository.fork_session(session_id, at_seq, new_id, **fields)
    if as_json:
        click.echo(session.model_dump_json(by_alias=True))
    else:
        click.echo(
            f"session {quoted(session.id)}: forked from {quoted(session_id)} at seq {at_seq} "
            f"({count(session.message_count, 'message')} live)"
        )


def _one_line(value: str) -> str:
    return printable(value, one_line=True)


def _clip(value: str, width: int) -> str:
    return value if len(value) <= width else value[: max(width - 1, 0)] + "…"
