"""The top-level ``sessionrepo`` group (its ``--url`` reaches every command as the click
context's object) and the list of its commands."""

from __future__ import annotations

import click

# The modules, not their commands: ``sessionrepo.cli.sessions`` stays the module (a
# command of the same name imported here would shadow it).
from sessionrepo.cli import (
    backup,
    demo,
    hermes,
    insights,
    ops,
    outbox,
    privacy,
    search,
    serve,
    sessions,
    tenants,
)
from sessionrepo.cli._common import Group, share_url_options, url_option


@click.group(name="sessionrepo", cls=Group)
@url_option(
    "--url",
    envvar="SESSIONREPO_DATABASE_URL",
    help=(
        "Database URL (postgresql://… or sqlite:///path.db, or a file path). "
        "Default: $SESSIONREPO_DATABASE_URL, else the embedded SQLite file "
        "($XDG_DATA_HOME/sessionrepo/sessionrepo.db). May also be given after the "
        "command (sessionrepo migrate --url URL)."
    ),
)
@click.version_option(package_name="sessionrepo")
@click.pass_context
def main(ctx: click.Context, url: str | None) -> None:
    """Idempotent, ordered storage of AI-agent chat transcripts on PostgreSQL or SQLite.

    \b
    Conventions, on every command:
      --url URL, --outbox-url URL  before or after the command name (a later one wins)
      passwords                    never shown (user:***@, ?password=***, $PGPASSWORD)
      --json                       the report as JSON; times RFC 3339 UTC with Z
      progress                     on stderr: a bar on a terminal, else a line every 5 s
      --                           ends the options: search -- '-dog mochi'
      prune --yes                  needed to delete more than 100 sessions unasked

    \b
    Example:
        sessionrepo --url postgresql://app@db.internal/chat migrate
        sessionrepo demo
    """
    ctx.obj = url


main.add_command(ops.migrate)
main.add_command(ops.doctor)
main.add_command(sessions.sessions)
main.add_command(search.search_)
main.add_command(search.reindex)
main.add_command(outbox.outbox)
main.add_command(ops.export_)
main.add_command(ops.import_)
main.add_command(ops.prune)
main.add_command(privacy.erase)
main.add_command(privacy.verify_erased_)
main.add_command(privacy.audit)
main.add_command(privacy.retention)
main.add_command(backup.backup)
main.add_command(backup.restore_backup_)
main.add_command(hermes.import_hermes)
main.add_command(demo.demo)
main.add_command(serve.serve)
main.add_command(insights.insights_)
main.add_command(tenants.tenants)
# After the last command: each gets the group's URL options (demo opens none of them).
share_url_options(main, skip={"demo"})
