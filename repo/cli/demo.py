"""``sessionrepo demo``: run :func:`sessionrepo.demo.run_demo` and print what it found."""

from __future__ import annotations

import json
from pathlib import Path

import click
from pydantic import TypeAdapter

from sessionrepo.demo import (
    EXIT_PATHS,
    DemoResult,
    GatewayReport,
    OutageReport,
    run_demo,
)


@click.command()
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
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help='Print the whole DemoResult as JSON (with "ok"); the processes\' errors too.',
)
@click.pass_context
def demo(ctx: click.Context, path: Path | None, turns: int, as_json: bool) -> None:
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
    try:
        result = run_demo(path, turns=turns)
    except FileExistsError as exc:  # raised before anything runs
        raise click.BadParameter(str(exc), param_hint="'--path'") from None
    if as_json:
        record = TypeAdapter(DemoResult).dump_python(result, mode="json")
        click.echo(json.dumps({**record, "ok": result.ok}, indent=2))
    else:
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
        if gateway.logged:
            logged = "; ".join(f'"{line}"' for line in dict.fromkeys(gateway.logged))
            click.echo(f"  {'':<9} its writer logged (expected in an outage): {logged}")
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
