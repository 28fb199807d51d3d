"""The privacy commands: ``erase``, ``verify-erased``, ``audit`` and ``retention``
(and what ``prune --policy`` runs).

Thin shells over :meth:`SessionRepository.erase`, :func:`sessionrepo.ops.erase.verify_erased`
and :meth:`SessionRepository.privacy_audit`: parse, call one function, print.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from sessionrepo.cli._common import count, open_store, printable, progress, when
from sessionrepo.models.privacy import ErasureReport, RetentionPolicy
from sessionrepo.ops.erase import verify_erased


@click.command()
@click.option("--session", "session_id", metavar="ID", help="Erase this session.")
@click.option("--user", "user_id", metavar="ID", help="Erase every session of this user.")
@click.option("--source", metavar="NAME", help="Erase every session of this platform.")
@click.option("--dry-run", is_flag=True, help="Erase nothing; count what would go, per kind.")
@click.option("--actor", metavar="NAME", help="Who asks (kept in the audit as given).")
@click.option(
    "--compact",
    is_flag=True,
    help="Also rewrite the files (SQLite VACUUM, PostgreSQL VACUUM FULL): takes the "
    "database (or the tables) exclusively while it runs.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the ErasureReport as JSON.")
@click.pass_obj
def erase(
    url: str | None,
    *,
    session_id: str | None,
    user_id: str | None,
    source: str | None,
    dry_run: bool,
    actor: str | None,
    compact: bool,
    as_json: bool,
) -> None:
    """Erase every copy the store holds of a session, a user's or a source's sessions.

    Give exactly one of --session, --user, --source. Forks and continuations of an
    erased session go too. Each session goes in one transaction with its messages
    (retracted and compacted ones too), search index entries, ADK state and this
    database's outbox rows; a content-free tombstone stays, so no re-flush, drain of
    any gateway's outbox, import or restore stores an erased message again. Exports
    and backups taken before are not reached.

    \b
    Example:
        sessionrepo erase --user 12345 --dry-run
        sessionrepo erase --user 12345 --actor "ticket 881"
    """
    with open_store(url) as repository:
        report = repository.erase(
            session_id=session_id,
            user_id=user_id,
            source=source,
            dry_run=dry_run,
            actor=actor,
            compact=compact,
        )
    if as_json:
        click.echo(report.model_dump_json(indent=2))
        return
    _print_erase(report)


def _print_erase(report: ErasureReport) -> None:
    verb = "would erase" if report.dry_run else "erased"
    counts = report.counts
    click.echo(
        f"{verb} {count(counts.sessions, 'session')} "
        f"({counts.derived_sessions} forks or continuations) with "
        f"{count(counts.messages, 'message')}"
    )
    for name, value in counts.model_dump().items():
        click.echo(f"  {name:20} {value}")
    for sid in report.session_ids[:20]:
        click.echo(f"  {verb} {printable(sid, one_line=True)}")
    if len(report.session_ids) > 20:
        click.echo(f"  … and {len(report.session_ids) - 20} more")
    if report.audit_id is not None:
        click.echo(f"audit record {report.audit_id}")
    if report.scrub is not None:
        state = "complete" if report.scrub.complete else "INCOMPLETE"
        click.echo(f"scrub {state}: {'; '.join(report.scrub.steps)}")


@click.command("verify-erased")
@click.option(
    "--text",
    "texts",
    multiple=True,
    required=True,
    metavar="STRING",
    help="A string that must be gone (repeatable).",
)
@click.option(
    "--file",
    "files",
    multiple=True,
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    metavar="FILE",
    help="Also scan this file's bytes (a gateway's outbox file; its -wal too).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the VerifyReport as JSON.")
@click.pass_obj
def verify_erased_(
    url: str | None, *, texts: tuple[str, ...], files: tuple[Path, ...], as_json: bool
) -> None:
    """Look for strings that must be gone; exit 1 when any is found.

    Looks in every text column of the store's rows and in its search index; on
    SQLite also in the bytes of the database file and its WAL (and of each --file).
    What is found is reported by the string's position and place, never quoted.

    \b
    Example:
        sessionrepo verify-erased --text "my passport number" --file /var/lib/gw/outbox.db
    """
    with open_store(url, read_only=True) as repository:
        try:
            report = verify_erased(repository, texts, files=files)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--text") from None
    if as_json:
        click.echo(report.model_dump_json(indent=2))
    else:
        click.echo(f"scanned: {', '.join(report.scanned)}")
        for finding in report.findings:
            click.echo(f"FOUND text #{finding.text + 1} in {finding.where} ({finding.count})")
        if report.clean:
            click.echo(f"none of the {count(report.texts, 'string')} found")
    if not report.clean:
        raise SystemExit(1)


@click.command()
@click.option(
    "--limit", type=click.IntRange(1, 1000), default=50, show_default=True, help="Rows shown."
)
@click.option("--json", "as_json", is_flag=True, help="Print the entries as JSON.")
@click.pass_obj
def audit(url: str | None, *, limit: int, as_json: bool) -> None:
    """List the privacy audit: every erase and retention run, newest first.

    Content-free: when, who as given, the selector's kind and keyed hash, the counts.

    \b
    Example:
        sessionrepo audit --limit 10
    """
    with open_store(url, read_only=True) as repository:
        entries = repository.privacy_audit(limit=limit)
    if as_json:
        click.echo(json.dumps([entry.model_dump(mode="json") for entry in entries], indent=2))
        return
    for entry in entries:
        counts = entry.counts
        click.echo(
            f"{when(entry.at)}  {entry.action:9} {entry.selector_kind:8} "
            f"{entry.selector_hash[:16]}  by {printable(entry.actor or '-', one_line=True)}  "
            f"{counts.get('sessions', 0)} sessions, "
            f"{sum(counts.get(k, 0) for k in counts if k.endswith('_messages'))} messages"
            + (f"  ({entry.note})" if entry.note else "")
        )
    if not entries:
        click.echo("no erasures recorded")


@click.group()
def retention() -> None:
    """Show and set retention policies (per source; `*` for every other source).

    Policies are applied by `sessionrepo prune --policy` (dry run with --dry-run), through
    the same path as `erase`: tombstones, audit, scrub.

    \b
    Example:
        sessionrepo retention set discord --ended-days 30 --idle-days 90
        sessionrepo retention set '*' --superseded-days 14
        sessionrepo prune --policy --dry-run
    """


@retention.command("show")
@click.option("--json", "as_json", is_flag=True, help="Print the policies as JSON.")
@click.pass_obj
def retention_show(url: str | None, *, as_json: bool) -> None:
    """List the stored policies.

    \b
    Example:
        sessionrepo retention show --json
    """
    with open_store(url, read_only=True) as repository:
        policies = repository.retention_policies()
    if as_json:
        click.echo(json.dumps([p.model_dump() for p in policies], indent=2))
        return
    for p in policies:
        click.echo(
            f"{printable(p.source, one_line=True):20} ended: {_days(p.ended_days)}  "
            f"idle: {_days(p.idle_days)}  retracted/compacted: {_days(p.superseded_days)}"
        )
    if not policies:
        click.echo("no retention policy: everything is kept")


def _days(value: int | None) -> str:
    return "kept" if value is None else f"{value}d"


@retention.command("set")
@click.argument("source")
@click.option("--ended-days", type=click.IntRange(min=1), help="Erase ended sessions after N days.")
@click.option("--idle-days", type=click.IntRange(min=1), help="Erase open sessions idle N days.")
@click.option(
    "--superseded-days",
    type=click.IntRange(min=1),
    help="Erase retracted and compacted messages N days after they were made.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the policy set as JSON.")
@click.pass_obj
def retention_set(
    url: str | None,
    source: str,
    *,
    ended_days: int | None,
    idle_days: int | None,
    superseded_days: int | None,
    as_json: bool,
) -> None:
    """Set SOURCE's policy (replacing its previous one; an omitted period keeps forever).

    \b
    Example:
        sessionrepo retention set discord --ended-days 30 --idle-days 90
    """
    policy = RetentionPolicy(
        source=source, ended_days=ended_days, idle_days=idle_days, superseded_days=superseded_days
    )
    with open_store(url) as repository:
        repository.set_retention_policy(policy)
    if as_json:
        click.echo(policy.model_dump_json(indent=2))
        return
    click.echo(f"retention of {printable(source, one_line=True)} set")


@retention.command("clear")
@click.argument("source")
@click.option("--json", "as_json", is_flag=True, help='Print {"source", "removed"} as JSON.')
@click.pass_obj
def retention_clear(url: str | None, source: str, *, as_json: bool) -> None:
    """Remove SOURCE's policy.

    \b
    Example:
        sessionrepo retention clear discord
    """
    with open_store(url) as repository:
        removed = repository.delete_retention_policy(source)
    if as_json:
        click.echo(json.dumps({"source": source, "removed": removed}))
        return
    click.echo(f"{printable(source, one_line=True)}: {'removed' if removed else 'had no policy'}")


def prune_by_policy(url: str | None, *, dry_run: bool, as_json: bool) -> None:
    """What `sessionrepo prune --policy` runs."""
    with open_store(url) as repository:
        if not repository.retention_policies():
            raise click.ClickException(
                "no retention policy is stored: set one with `sessionrepo retention set`"
            )
        with progress(None, "erasing", unit="sessions") as advance:
            report = repository.apply_retention(
                dry_run=dry_run, actor="sessionrepo prune --policy", on_session=lambda _: advance(1)
            )
    if as_json:
        click.echo(report.model_dump_json(indent=2))
        return
    verb = "would erase" if report.dry_run else "erased"
    click.echo(
        f"{verb} {count(len(report.session_ids), 'session')} with "
        f"{count(report.counts.messages, 'message')}, and "
        f"{count(report.superseded_messages, 'retracted or compacted message')} of sessions kept"
    )
    for sid in report.session_ids[:20]:
        click.echo(f"  {verb} {printable(sid, one_line=True)}")
    if report.kept:
        click.echo(f"kept {count(len(report.kept), 'session')} written to since listed")
