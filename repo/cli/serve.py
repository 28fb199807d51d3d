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
@click.pass_obj
def serve(
    url: str | None, host: str, port: int, allow_writes: bool, outbox_url: str | None
) -> None:
    """Serve the operator console: sessions, transcripts, search, outbox health and
    /metrics, with a JSON API described at /openapi.json.

    It listens on the loopback only, unless SESSIONREPO_CONSOLE_TOKEN is set (at least
    16 characters): then any --host is allowed and every client must give the token
    (the sign-in form, or Authorization: Bearer). It is read-only unless started with
    --allow-writes. Needs the web extra: pip install 'sessionrepo[web]'.

    \b
    Example:
        sessionrepo --url postgresql://app@db/chat serve --port 8765
        SESSIONREPO_CONSOLE_TOKEN=$(openssl rand -hex 24) sessionrepo serve --host 0.0.0.0
    """
    token = os.environ.get("SESSIONREPO_CONSOLE_TOKEN") or None
    try:
        from sessionrepo.web import check_bind, create_app
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
