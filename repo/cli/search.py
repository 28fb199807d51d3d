"""``sessionrepo search`` and ``sessionrepo reindex``: full-text search over the
messages, and the rebuild of its index."""

from __future__ import annotations

import click

from sessionrepo.cli._common import count, open_store, printable, progress_to_total, when


@click.command("search")
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
    with open_store(url) as repository:
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
                f"{hit.session_id} #{hit.seq}  {when(hit.timestamp)}  {hit.role:<9} "
                f"{printable(hit.snippet, one_line=True)}"
            )
    if not as_json:
        click.echo(f"{count(len(hits), 'hit')}", err=True)


@click.command()
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
    with open_store(url) as repository, progress_to_total("reindexing") as update:
        indexed = repository.reindex(progress=update)
    click.echo(f"indexed {count(indexed, 'message')}; search is available")
