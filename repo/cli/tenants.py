"""``sessionrepo tenants``: the PostgreSQL roles gateways share one store with
(``create``, ``list``, ``drop``). Thin shells over :mod:`sessionrepo.ops.tenants`."""

from __future__ import annotations

import json
import os
from pathlib import Path

import click

from sessionrepo.cli._common import Group, count, printable, rfc3339, when
from sessionrepo.dialects import safe_url
from sessionrepo.ops.tenants import create_tenant, drop_tenant, list_tenants


@click.group(cls=Group)
def tenants() -> None:
    """Tenant roles: several gateways in one PostgreSQL store, none able to read or
    change another's conversations (row-level security, enforced by the server).

    Run them as an administrator the policies do not hold (a superuser, or a role with
    BYPASSRLS and CREATEROLE); connect each gateway with the URL its role was made with.
    A SQLite file is one tenant's: `list` shows whose.

    \b
    Example:
        sessionrepo tenants create discord --url-file discord.url
        sessionrepo tenants list
    """


@tenants.command()
@click.argument("name")
@click.option(
    "--url-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the role's connection URL, with a new random password, to this file "
    "(created 0600; an existing file is refused). Without it the role has no password "
    "(for certificate, peer or trust authentication).",
)
@click.option(
    "--operator",
    is_flag=True,
    help="The operator's role instead: sees every tenant (BYPASSRLS), may act as each.",
)
@click.option("--json", "as_json", is_flag=True, help="The new role as one JSON object.")
@click.pass_obj
def create(
    url: str | None, name: str, url_file: Path | None, operator: bool, as_json: bool
) -> None:
    """Make the login role NAME for one gateway (a tenant) and print its URL.

    The role has only what a gateway needs: its own rows of the conversation tables,
    reading the store-wide ones; no DDL, no TRUNCATE, no BYPASSRLS, owner of nothing.
    The password is never printed: it is in --url-file only.

    \b
    Example:
        sessionrepo tenants create discord --url-file /etc/gateway/discord.url
        sessionrepo tenants create ops --operator --url-file /etc/sessionrepo/ops.url
    """
    if url_file is not None and url_file.exists():
        raise click.ClickException(f"{url_file} exists already: choose a new file")
    created = create_tenant(url, name, password=url_file is not None, operator=operator)
    if url_file is not None:
        descriptor = os.open(url_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as out:
            out.write(created.url.render_as_string(hide_password=False) + "\n")
    kind = "operator" if operator else "tenant"
    if as_json:
        record = {
            "tenant": created.name,
            "kind": kind,
            "url": safe_url(created.url),
            "url_file": None if url_file is None else str(url_file),
        }
        click.echo(json.dumps(record))
        return
    click.echo(f"{kind} {created.name}: {safe_url(created.url)}")
    if url_file is not None:
        click.echo(f"its URL, with the password, is in {url_file} (mode 0600)")


@tenants.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per tenant.")
@click.pass_obj
def list_(url: str | None, as_json: bool) -> None:
    """The store's tenants and how many sessions each holds (on PostgreSQL, as the
    operator or an administrator; a tenant's role sees itself).

    \b
    Example:
        sessionrepo tenants list --json
    """
    for tenant in list_tenants(url):
        if as_json:
            created = None if tenant.created_at is None else rfc3339(tenant.created_at)
            record = {"tenant": tenant.name, "created_at": created, "sessions": tenant.sessions}
            click.echo(json.dumps(record))
        else:
            name = printable(tenant.name, one_line=True)
            click.echo(f"{name}  {when(tenant.created_at)}  {count(tenant.sessions, 'session')}")


@tenants.command()
@click.argument("name")
@click.option(
    "--delete-data",
    is_flag=True,
    help="Delete every row of the tenant first (else a tenant holding sessions is kept).",
)
@click.option("--json", "as_json", is_flag=True, help="What was dropped as one JSON object.")
@click.pass_obj
def drop(url: str | None, name: str, delete_data: bool, as_json: bool) -> None:
    """Drop the tenant role NAME (with --delete-data, all its conversations first, in
    the same transaction).

    \b
    Example:
        sessionrepo tenants drop discord --delete-data
    """
    sessions = drop_tenant(url, name, delete_data=delete_data)
    if as_json:
        click.echo(json.dumps({"tenant": name, "sessions_deleted": sessions}))
        return
    click.echo(
        f"dropped tenant {name}" + (f" and {count(sessions, 'session')}" if sessions else "")
    )
