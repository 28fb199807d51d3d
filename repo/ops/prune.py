"""Prune: delete ended sessions older than a cutoff, optionally exporting them first.

Only ended sessions whose end *and* last activity are older than the cutoff are deleted,
with their messages, in bounded batches; an open session is never deleted however old it
is. Each batch is checked again under the sessions' row locks in the deleting transaction
(:meth:`SessionRepository.delete_ended_sessions`), so a session reopened or written to
meanwhile stays. With an export, a batch is written and synced to the file first, and only
sessions still exactly as exported are deleted. Their search index entries go in the same
transaction.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import IO, Final

from pydantic import BaseModel, ConfigDict

from sessionrepo.models import Session
from sessionrepo.ops.export import ExportWriter, snapshot_pages
from sessionrepo.store.arguments import check_aware_time, check_limit
from sessionrepo.store.repository import SessionFilter, SessionRepository

UNITS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86_400}


class PruneReport(BaseModel):
    """What one prune deleted (or, in a dry run, would delete)."""

    model_config = ConfigDict(frozen=True)

    cutoff: datetime
    dry_run: bool
    #: Sessions deleted (dry run: that would be), by id.
    session_ids: list[str]
    messages: int
    #: Sessions written to the export file (``None``: no export).
    exported: int | None = None
    #: Sessions listed but kept: reopened, written to, or changed since they were read.
    kept: list[str]
    #: Rows of ``pending_outbox`` (in this database) whose session was deleted. They are
    #: left in place: they are the only copy of those messages, and a drain would
    #: recreate the session with them.
    outbox_rows: int
    outbox_sessions: list[str]

    @property
    def sessions(self) -> int:
        return len(self.session_ids)


def parse_duration(value: str) -> timedelta:
    """``"90d"``, ``"12h"``, ``"30m"``, ``"45s"`` (a whole number and a unit).

    Raises:
        ValueError: not such a duration.
    """
    text_value = value.strip().lower()
    number, unit = text_value[:-1], text_value[-1:]
    if unit not in UNITS or not number.isdigit():
        raise ValueError(f"{value!r} is not a duration: use a number and s, m, h or d (e.g. 90d)")
    try:
        return timedelta(seconds=int(number) * UNITS[unit])
    except OverflowError:
        raise ValueError(f"{value!r} is too long a duration") from None


def prunable(cutoff: datetime) -> SessionFilter:
    """Ended sessions whose end and last activity are both before ``cutoff``."""
    return SessionFilter(ended_before=cutoff, active_before=cutoff)


def count_prunable(repository: SessionRepository, cutoff: datetime) -> int:
    """How many sessions :func:`prune_sessions` would delete now (for a progress bar)."""
    return repository.count_sessions(prunable(cutoff))


def prune_sessions(
    repository: SessionRepository,
    *,
    cutoff: datetime,
    dry_run: bool = False,
    export_to: IO[bytes] | None = None,
    batch_size: int = 100,
    on_batch: Callable[[list[Session]], None] | None = None,
) -> PruneReport:
    """Delete ended sessions that ended, and were last active, before ``cutoff``.

    Open sessions are never deleted, however old. Runs in batches of ``batch_size``
    sessions, one transaction each, which re-checks every session under its row lock
    (one reopened or written to since it was listed is kept). Messages go with their
    session. Rows the session has in this database's ``pending_outbox`` are left there
    and reported (see :class:`PruneReport`).

    Args:
        cutoff: an aware datetime.
        dry_run: delete nothing; report what would go.
        export_to: write each batch there first (the export format), synced before its
            sessions are deleted; only sessions still exactly as exported are deleted.
            With ``dry_run`` the file is written and nothing deleted.
        on_batch: called with each batch's sessions once deleted (dry run: listed).
    """
    check_aware_time(cutoff, "cutoff")
    check_limit(batch_size, "batch_size", maximum=1000)
    writer = ExportWriter(repository, export_to) if export_to is not None else None
    if writer is not None:
        writer.header()
    deleted: list[str] = []
    kept: list[str] = []
    messages = 0
    outbox: dict[str, int] = {}
    for page in snapshot_pages(repository, prunable(cutoff), batch_size):
        listed = {snapshot.session.id: snapshot for snapshot in page}
        if writer is not None:
            # Sessions deleted meanwhile are neither exported nor ours to report.
            listed = {sid: snap for sid, snap in listed.items() if writer.session(snap) is not None}
            writer.sync()  # on disk before anything it holds is deleted
        if dry_run:
            batch = [snapshot.session for snapshot in listed.values()]
            messages += repository.count_messages(listed)
        else:
            outcome = repository.delete_ended_sessions(
                listed, cutoff=cutoff, unchanged_from=listed if writer is not None else None
            )
            batch = outcome.deleted
            kept += outcome.kept
            messages += outcome.messages
            outbox.update(outcome.parked)
        deleted += [session.id for session in batch]
        if on_batch is not None and batch:
            on_batch(batch)
    if writer is not None:
        writer.trailer()
        writer.sync()
    return PruneReport(
        cutoff=cutoff,
        dry_run=dry_run,
        session_ids=deleted,
        messages=messages,
        exported=writer.sessions if writer is not None else None,
        kept=kept,
        outbox_rows=sum(outbox.values()),
        outbox_sessions=sorted(outbox),
    )
