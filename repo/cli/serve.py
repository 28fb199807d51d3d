"""``sessionrepo serve``: the operator console (see :mod:`sessionrepo.web`)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import click

from sessionrepo.cli._common import masked, one_line, url_option
from sessionrepo.errors import BackendUnavailable, InvalidArgument
from sessionrepo.ops import missing_sqlite_file
from sessionrepo.store.repository import SessionRepository, open_repository


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port", default=8765, show_default=True, type=click.IntRange(1, 65535), help="TCP port."
)
@click.option(
    "--allow-writes",
    is_flag=True,
    help="Offer the write forms: end/reopen a session, retry dead outbox rows, reindex.",
)
@url_option(
    "--outbox-url",
    envvar="SESSIONREPO_OUTBOX_URL",
    help="The gateways' outbox, for the health page (default: the primary's own).",
)
@click.option(
    "--session-hours",
    default=12.0,
    show_default=True,
    type=click.FloatRange(min=0, min_open=True, max=24 * 365),
    help="How long a sign-in lasts (with SESSIONREPO_CONSOLE_TOKEN).",
)
@click.pass_obj
def serve(  # noqa: PLR0917 (click passes every option by keyword, in this order)
    url: str | None,
    host: str,
    port: int,
    allow_writes: bool,
    outbox_url: str | None,
    session_hours: float,
) -> None:
    """Serve the operator console: sessions, transcripts, search, outbox health and
    /metrics, with a JSON API described at /openapi.json.

    It listens on the loopback only, unless SESSIONREPO_CONSOLE_TOKEN is set (a random
    one: at least 24 characters, about 100 bits): then any --host is allowed and every
    client must give the token (the sign-in form, or Authorization: Bearer). It speaks
    plain HTTP: beyond the loopback, put a TLS reverse proxy in front. It is read-only
    unless started with --allow-writes. It starts while the primary is down (the pages
    say so). Needs the web extra: pip install 'sessionrepo[web]'.

    \b
    Example:
        sessionrepo --url postgresql://app@db/chat serve --port 8765
        python -c 'import secrets; print(secrets.token_urlsafe(32))'  # a token
        export SESSIONREPO_CONSOLE_TOKEN=...
        sessionrepo serve --host 10.0.0.5   # behind a TLS reverse proxy
    """
    token = os.environ.get("SESSIONREPO_CONSOLE_TOKEN") or None
    try:
        from sessionrepo.web import check_bind, create_app
        from sessionrepo.web.security import is_loopback
    except ImportError as exc:
        raise click.ClickException(
            f"the console needs the web extra ({exc.name} is missing): "
            "pip install 'sessionrepo[web]'"
        ) from None
    import uvicorn

    try:
        check_bind(host, token)
    except InvalidArgument as exc:
        raise click.UsageError(str(exc)) from None
    if not is_loopback(host):
        click.echo(
            f"warning: serving {host} beyond the loopback over plain HTTP: the token, the "
            "sign-in cookie and every page cross the network unencrypted. Put a TLS reverse "
            "proxy in front of it (see the README's console section), or bind 127.0.0.1 "
            "and reach it through the proxy or an SSH tunnel",
            err=True,
        )
    if outbox_url is not None and missing_sqlite_file(outbox_url) is not None:
        raise click.ClickException(f"no outbox file at {missing_sqlite_file(outbox_url)}")
    metrics = True
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        metrics = False
    with _open_primary(url) as repository:
        outbox = None
        if outbox_url is not None:
            from sessionrepo.outbox.table import Outbox
            from sessionrepo.outbox.writer import open_outbox_database

            outbox = Outbox(open_outbox_database(outbox_url, read_only=not allow_writes))
        app = create_app(
            repository,
            url=url,
            outbox_url=outbox_url,
            outbox=outbox,
            token=token,
            allow_writes=allow_writes,
            metrics=metrics,
            session_lifetime=session_hours * 3600,
        )
        mode = "writes allowed" if allow_writes else "read-only"
        where = f"[{host}]" if ":" in host else host
        click.echo(
            masked(f"serving {repository.display_url} at http://{where}:{port}/ ({mode})", url),
            err=True,
        )
        try:
            uvicorn.run(
                app,
                host=host,
                port=port,
                log_level="warning",
                server_header=False,
                access_log=False,
            )
        finally:
            if outbox is not None:
                outbox.database.dispose()


@contextmanager
def _open_primary(url: str | None) -> Iterator[SessionRepository]:
    """The store, opened even while it cannot be reached: the console is what an operator
    opens during an outage (its pages say the primary is down, the health page shows the
    outbox, and it recovers once the primary answers). A missing SQLite file is still
    refused: opening it would create an empty store."""
    missing = missing_sqlite_file(url)
    if missing is not None:
        raise click.ClickException(
            f"no database file at {missing}; check --url / SESSIONREPO_DATABASE_URL"
        )
    try:
        repository = open_repository(url)
    except BackendUnavailable as exc:
        click.echo(
            one_line(
                f"warning: the primary database cannot be reached now ({exc}); serving anyway: "
                "the pages say so until it answers",
                url,
            ),
            err=True,
        )
        repository = open_repository(url, require_connection=False)
    try:
        yield repository
    finally:
        repository.close()
