"""The ``sessionrepo`` command: a thin shell over the library (parse, call, print).

Library errors (:class:`repo.errors.RepoError`) become one clean line on stderr and exit
status 1. Database URLs are only ever shown with the password masked.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any
from urllib.parse import quote, quote_plus

import click
from alembic import command
from alembic.util.exc import CommandError
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import make_url

from repo import schema
from repo._database import Database
from repo.demo import EXIT_PATHS, DemoResult, run_demo
from repo.errors import RepoError


class _Group(click.Group):
    """Turns a library error raised by any subcommand into ``Error: <one line>``."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except RepoError as exc:
            raise click.ClickException(_one_line(str(exc), ctx.params.get("url"))) from exc


def _one_line(message: str, url: str | None) -> str:
    """The message on one line, with the URL's password masked should a driver echo it."""
    password = _password(url)
    if password:
        for form in {password, quote(password, safe=""), quote_plus(password)}:
            message = message.replace(form, "***")
    return " ".join(message.split())


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
    """Show that concurrent, repeated flushes store every message exactly once.

    Three gateway processes write one embedded SQLite file at the same time, re-flushing
    their whole transcripts from every exit path (end of turn, interrupt, shutdown,
    close), sharing a session, and resuming one another's. The file is then checked
    with plain SQL. Never touches the database that --url or SESSIONREPO_DATABASE_URL
    names. Exits 1 unless every check passes.

    \b
    Example:
        sessionrepo demo
        sessionrepo demo --path /tmp/demo.db --turns 40
    """
    if path is not None and path.exists():
        raise click.BadParameter(f"{path} already exists", param_hint="'--path'")
    result = run_demo(path, turns=turns)
    _print_demo(result)
    if not result.ok:
        ctx.exit(1)


def _print_demo(result: DemoResult) -> None:
    where = str(result.path) if result.kept else "a temporary file, removed afterwards"
    click.echo(f"3 gateway processes wrote one SQLite file at the same time ({where}).")
    click.echo("")
    click.echo(f"  {'gateway':<9} {'sent':>6} {'made':>5} {'inserted':>8} {'skipped':>7}  flushes")
    for gateway in result.gateways:
        flushes = ", ".join(
            f"{path} {gateway.flushes[path]}" for path in EXIT_PATHS if path in gateway.flushes
        )
        click.echo(
            f"  {gateway.name:<9} {gateway.sent:>6,} {gateway.made_count:>5,} "
            f"{gateway.inserted:>8,} {gateway.duplicates:>7,}  {flushes or '-'}"
        )
    click.echo("")
    for label, value in (
        ("attempted sends (re-sends included)", result.attempted),
        ("distinct messages made", result.made),
        ("rows stored", result.stored),
        ("duplicates skipped", result.skipped),
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
    click.echo("Checked against the database with plain SQL:")
    for check in result.checks:
        click.echo(f"  {'ok' if check.ok else 'FAILED':<6}  {check.name} ({check.detail})")
    for gateway in result.gateways:
        if gateway.error:
            click.echo(f"gateway {gateway.name} failed:\n{gateway.error}", err=True)
    click.echo("")
    if result.ok:
        click.echo(f"OK: nothing lost, nothing doubled ({result.seconds:.1f} s)")
    else:
        failed = "; ".join(check.name for check in result.checks if not check.ok)
        click.echo(f"FAILED: {failed}")
