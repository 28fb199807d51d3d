"""Import an export (see :mod:`sessionrepo.ops.export` for the format): restore or merge.

A session the target does not have is recreated: its row as exported and every message at
its exported ``seq``, so a model dump read back equals the one exported, field by field.
A session the target already holds *as exported* (a second import, or one resumed after an
interruption) only gets the messages it lacks, at their ``seq``. Both go through
:meth:`SessionRepository.restore_session`, which writes with ``append``'s own insert (its
key-based idempotency, its counters, its search indexing) and then sets the session's
times as exported. The counters (``message_count``, ``tool_call_count``, ``next_seq``) are
derived from the messages restored, not copied: for an export sessionrepo wrote they are
the exported ones.

A session the target holds *differently* (a gateway has written to it since) is merged:
its missing messages are appended after the target's own, through
:meth:`SessionRepository.append`, and its row is left as the target has it. Either way
the message key decides: importing a file twice inserts nothing the second time, and a
key stored with different content is counted as a conflict, never overwritten. Each batch
of at most :data:`MAX_BATCH` messages is one transaction, so an interrupted import keeps
what it committed and a re-run completes it. A damaged line stops the import after what
came before it is committed (the messages of the session being read included).

A session's usage records (version 2 files) follow its messages and are written after
them, keyed like messages (``usage_id``): a record the target has is skipped, so a second
import adds none. A session restored as exported keeps its token totals as exported
(they count its records already); a merged session's totals move by the records it did
not have. The target's tombstones hold for usage as for messages: a record of an erased
message, or made in an erased session before its erasure, is not restored
(``usage_erased``; a session recreated by the import counts its tokens out). A version 1
file has no usage records and imports as before.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any, Final, Literal

from sessionrepo.models import StoredMessage
from sessionrepo.models.usage import Usage
from sessionrepo.ops import records
from sessionrepo.ops.export import EXPORT_FORMAT, EXPORT_VERSION, READABLE_VERSIONS, BadExportFile
from sessionrepo.store.arguments import check_limit
from sessionrepo.store.repository import SessionRepository, SessionSnapshot
from sessionrepo.store.usage import restore_usage

#: Most messages written in one import transaction.
MAX_BATCH: Final = 500


class ImportReport(records.RestoredCounts):
    """What one import did."""

    #: Sessions the target did not have: recreated exactly.
    sessions_restored: int = 0
    #: Sessions the target already had as exported (given only their missing messages).
    sessions_present: int = 0
    #: Sessions the target had with changes of its own: missing messages appended.
    sessions_merged: int = 0
    #: Whether the file ended with its ``end`` record (``False``: it was cut short).
    complete: bool = False

    @property
    def sessions(self) -> int:
        return self.sessions_restored + self.sessions_present + self.sessions_merged


@dataclass
class _Pending:
    """The session being imported and its messages not written yet."""

    snapshot: SessionSnapshot
    #: What its first batch found, once written.
    outcome: Literal["restored", "present", "merged"] | None = None
    last_seq: int = 0
    batch: list[StoredMessage] = field(default_factory=list)
    #: Its usage records read and not written yet (they follow its messages).
    usage: list[Usage] = field(default_factory=list)


class _Importer:
    def __init__(
        self,
        repository: SessionRepository,
        on_written: Callable[[ImportReport], None] | None = None,
    ) -> None:
        self._repository = repository
        self._on_written = on_written
        self.counts: dict[str, int] = {}

    def _add(self, name: str, amount: int = 1) -> None:
        self.counts[name] = self.counts.get(name, 0) + amount

    def flush(self, pending: _Pending) -> None:
        self._flush(pending)
        if self._on_written is not None:
            self._on_written(ImportReport(**self.counts))

    def _flush(self, pending: _Pending) -> None:
        self._flush_messages(pending)
        usage, pending.usage = pending.usage, []
        if not usage:
            return
        sid = pending.snapshot.session.id
        if pending.outcome == "merged":  # the target's totals do not count them yet
            recorded = self._repository.record_usage(sid, usage)
        else:  # the row as exported counts them already
            created = pending.outcome == "restored"
            recorded = restore_usage(self._repository.database, sid, usage, created=created)
        self._add("usage_inserted", len(recorded.inserted))
        self._add("usage_present", len(recorded.duplicates))
        self._add("usage_erased", len(recorded.erased))

    def _flush_messages(self, pending: _Pending) -> None:
        batch, pending.batch = pending.batch, []
        if pending.outcome != "merged":
            restored = self._repository.restore_session(pending.snapshot, batch)
            if restored.outcome != "diverged":
                if pending.outcome is None:
                    pending.outcome = "restored" if restored.outcome == "created" else "present"
                    self._add(f"sessions_{pending.outcome}")
                self._add("messages_inserted", len(restored.inserted))
                self._add("messages_present", len(restored.duplicates))
                self._add("messages_conflicting", len(restored.conflicts))
                self._add("messages_erased", len(restored.erased))
                return
            if pending.outcome is not None:  # restored until now, changed by a writer since
                self._add(f"sessions_{pending.outcome}", -1)
            self._add("sessions_merged")
            pending.outcome = "merged"
        if batch:
            result = self._repository.append(pending.snapshot.session.id, batch)
            self._add("messages_inserted", len(result.inserted))
            self._add("messages_present", len(result.duplicates))
            self._add("messages_conflicting", len(result.conflicts))
            self._add("messages_erased", len(result.erased))


def import_sessions(
    repository: SessionRepository,
    stream: IO[bytes],
    *,
    batch_size: int = MAX_BATCH,
    on_progress: Callable[[int], None] | None = None,
    on_written: Callable[[ImportReport], None] | None = None,
) -> ImportReport:
    """Import an export (see the module docstring). Idempotent: a second import of the
    same file inserts nothing.

    Stops at the first line that is not a valid record, after committing every message
    before it (the session being read included); fix the file and run it again.

    Args:
        stream: the export, as bytes.
        batch_size: messages per transaction, at most :data:`MAX_BATCH`.
        on_progress: called with the number of bytes of each line read.
        on_written: called after each committed batch with the totals so far (what an
            interrupted import can say it got through).

    Raises:
        BadExportFile: the stream is not an export, or a line is damaged.
        InvalidArgument: ``batch_size`` is out of range.
    """
    check_limit(batch_size, "batch_size", maximum=MAX_BATCH)
    importer = _Importer(repository, on_written)
    pending: _Pending | None = None
    seen_sessions = seen_messages = seen_usage = 0
    complete = False
    number = 0
    try:
        for number, _, record in records.json_lines(
            stream, BadExportFile, "export", on_progress=on_progress
        ):
            kind = record.get("type")
            if complete:
                raise BadExportFile(f"line {number}: a record after the end record")
            if number == 1:
                _check_header(record)
                continue
            if kind == "session":
                if pending is not None:
                    importer.flush(pending)
                pending = _Pending(records.read_session(record, number, BadExportFile))
                seen_sessions += 1
            elif kind == "message":
                if pending is None:
                    raise BadExportFile(f"line {number}: a message before any session")
                message = records.read_message(
                    record, number, pending.snapshot, pending.last_seq, BadExportFile
                )
                pending.batch.append(message)
                pending.last_seq = message.seq
                seen_messages += 1
                if len(pending.batch) >= batch_size:
                    importer.flush(pending)
            elif kind == "usage":
                if pending is None:
                    raise BadExportFile(f"line {number}: a usage record before any session")
                sid = pending.snapshot.session.id
                pending.usage.append(records.read_usage(record, number, sid, BadExportFile))
                seen_usage += 1
            elif kind == "end":
                if pending is not None:
                    importer.flush(pending)
                    pending = None
                counted = (record.get("sessions"), record.get("messages"))
                if counted != (seen_sessions, seen_messages):
                    raise BadExportFile(
                        f"line {number}: the end record counts {counted[0]} sessions and "
                        f"{counted[1]} messages, the file holds {seen_sessions} and "
                        f"{seen_messages}"
                    )
                if "usage" in record and record["usage"] != seen_usage:  # version 1: none
                    raise BadExportFile(
                        f"line {number}: the end record counts {record['usage']!r} usage "
                        f"records, the file holds {seen_usage}"
                    )
                complete = True
            else:
                raise BadExportFile(f"line {number}: unknown record type {kind!r}")
    except BadExportFile:
        # What came before the damaged line is kept, the open session's unwritten
        # messages too: a re-run of the mended file then only adds what follows.
        if pending is not None and (pending.batch or pending.usage or pending.outcome is None):
            importer.flush(pending)
        raise
    if number == 0:
        raise BadExportFile("the file is empty, not a sessionrepo export")
    if pending is not None:
        importer.flush(pending)
    return ImportReport(**importer.counts, complete=complete)


def _check_header(record: dict[str, Any]) -> None:
    if record.get("type") != "header" or record.get("format") != EXPORT_FORMAT:
        raise BadExportFile(
            "line 1: not a sessionrepo export (it starts without the "
            f'{{"type": "header", "format": "{EXPORT_FORMAT}"}} record)'
        )
    version = record.get("version")
    if version not in READABLE_VERSIONS:
        raise BadExportFile(
            f"line 1: export format version {version!r}; this sessionrepo reads versions "
            f"{READABLE_VERSIONS[0]} to {EXPORT_VERSION} (a newer sessionrepo wrote it: "
            "upgrade sessionrepo)"
        )
