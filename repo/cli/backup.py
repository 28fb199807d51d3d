"""The backup commands: ``backup`` and ``restore-backup``.

Thin shells over :func:`sessionrepo.ops.backup.backup_store` and
:func:`sessionrepo.ops.backup.restore_backup`: parse, call one function, print.
"""

from __future__ import annotations

from pathlib import Path

import click

from sessionrepo.cli._common import count, open_store, printable, progress, rfc3339
from sessionrepo.models import Session
from sessionrepo.ops.backup import (
    PAGE,
    RestoreBackupReport,
    backup_store,
    restore_backup,
    verify_backup_file,
)
from sessionrepo.store.repository import open_repository

#: ``restore-backup``: a restored session does not match the backup.
EXIT_MISMATCH = 1


@click.command()
@click.argument("output", metavar="FILE", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the BackupReport as JSON.")
@click.pass_obj
def backup(url: str | None, output: Path, as_json: bool) -> None:
    """Write a consistent backup of the whole store to FILE (a new file).

    Every session, every stored message (edited history too), every usage record and
    the ADK state (sessions, users, apps) as of one instant,
    read in one transaction (SQLite: one read transaction; PostgreSQL: REPEATABLE
    READ, READ ONLY) while gateways go on writing: a message committed after that
    instant is not in it, and none is there in part. One JSON Lines file with a
    checksum per session and one over the file, readable by its owner only, written
    under a temporary name and renamed when complete. A backup is a copy an erase
    cannot reach: one taken before an erase still holds what was erased.

    \b
    Example:
        sessionrepo backup /var/backups/chat-2026-12-02.jsonl
        SESSIONREPO_DATABASE_URL=postgresql://app@db/chat sessionrepo backup chat.jsonl --json
    """
    with open_store(url, read_only=True) as repository:
        total = repository.count_sessions()  # about: the snapshot is taken after
        with progress(total, "backing up", unit="sessions") as advance:

            def written(session: Session) -> None:
                advance(1)

            report = backup_store(repository, output, on_session=written)
    if as_json:
        click.echo(report.model_dump_json(indent=2))
        return
    click.echo(
        f"backed up {count(report.sessions, 'session')} with "
        f"{count(report.messages, 'message')}, {count(report.usage, 'usage record')} and "
        f"{count(report.adk_sessions + report.adk_states, 'ADK state')} as of "
        f"{rfc3339(report.taken_at)} to "
        f"{report.path} ({report.bytes:,} bytes, sha256 {report.sha256})"
    )


@click.command("restore-backup")
@click.argument(
    "source", metavar="FILE", type=click.Path(exists=True, dir_okay=False, path_type=Path)
)
@click.option(
    "--batch-size",
    type=click.IntRange(1, 1000),
    default=PAGE,
    show_default=True,
    help="Messages written per transaction.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the RestoreBackupReport as JSON.")
@click.pass_context
def restore_backup_(ctx: click.Context, source: Path, batch_size: int, as_json: bool) -> None:
    """Load a file written by `sessionrepo backup` into this store, then verify it.

    Either backend, whichever wrote the file. The whole file is checked first (every
    record and checksum): a damaged file is refused before anything is written. Each
    session is then restored at its seq (idempotent: restoring the same file again
    inserts nothing) and read back: its message count and checksum must be the
    backup's, and so must its usage records. Messages this store's erasures removed
    are not restored (counted as erased), nor their usage, nor the ADK state of an
    erased session or user. A PostgreSQL database must be migrated first (`sessionrepo migrate`); a
    new SQLite file is created.

    \b
    Exit status:
        0  restored, and every session matches the backup
        1  a session does not match (listed), or an error (nothing written when the
           file is damaged)

    \b
    Example:
        sessionrepo restore-backup chat-2026-12-02.jsonl --json
        SESSIONREPO_DATABASE_URL=postgresql://app@db/chat sessionrepo migrate
        SESSIONREPO_DATABASE_URL=postgresql://app@db/chat sessionrepo restore-backup chat.jsonl
    """
    url: str | None = ctx.obj
    checked = verify_backup_file(source)  # before the store is opened (or created)
    with (
        open_repository(url) as repository,
        progress(checked.sessions, "restoring", unit="sessions") as advance,
    ):
        report = restore_backup(
            repository,
            source,
            batch_size=batch_size,
            on_session=lambda sid: advance(1),
            checked=checked,
        )
    if as_json:
        click.echo(report.model_dump_json(indent=2))
    else:
        _print_restore(report)
    if not report.verified:
        ctx.exit(EXIT_MISMATCH)


def _print_restore(report: RestoreBackupReport) -> None:
    click.echo(
        f"restored {count(report.sessions, 'session')} backed up on {report.source_backend} "
        f"at {rfc3339(report.taken_at)} ({report.sessions_restored:,} new, "
        f"{report.sessions_present:,} already present, {report.sessions_diverged:,} changed "
        f"here since and left as they are, {report.sessions_erased:,} erased here); "
        f"messages: {report.messages_inserted:,} inserted, {report.messages_present:,} "
        f"already present, {report.messages_conflicting:,} conflicting, "
        f"{report.messages_erased:,} erased here (not restored); usage records: "
        f"{report.usage_inserted:,} inserted, {report.usage_present:,} already present, "
        f"{report.usage_erased:,} erased here; ADK sessions: {report.adk_sessions_inserted:,} "
        f"inserted, {report.adk_sessions_present:,} present, "
        f"{report.adk_sessions_conflicting:,} newer here (kept), "
        f"{report.adk_sessions_erased:,} erased here; ADK app and user states: "
        f"{report.adk_states_inserted:,} inserted, {report.adk_states_present:,} present, "
        f"{report.adk_states_conflicting:,} newer here (kept), "
        f"{report.adk_states_erased:,} erased here"
    )
    if report.verified:
        click.echo(
            f"verified: {count(report.sessions_verified, 'session')} match the backup "
            "(message and usage counts and checksums)"
        )
        return
    click.echo(
        f"MISMATCH: {count(len(report.mismatches), 'session')} of "
        f"{report.sessions_verified:,} do not match the backup:",
        err=True,
    )
    for miss in report.mismatches[:20]:
        click.echo(
            f"  {printable(miss.session_id, one_line=True)}: {miss.found_messages:,} "
            f"{'usage records' if miss.part == 'usage' else 'messages'} "
            f"(backup: {miss.expected_messages:,}), sha256 {miss.found_sha256[:16]}… "
            f"(backup: {miss.expected_sha256[:16]}…)",
            err=True,
        )
    if len(report.mismatches) > 20:
        click.echo(f"  … and {len(report.mismatches) - 20} more", err=True)
