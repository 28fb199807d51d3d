"""Consistent backups: the whole store as of one instant, in one file, verified on restore.

:func:`backup_store` reads every session and every stored message (those edits
superseded too) in one read transaction (:func:`sessionrepo.store.snapshot.read_snapshot`:
SQLite's read transaction, PostgreSQL's ``REPEATABLE READ, READ ONLY``), so a backup
taken while gateways keep writing holds each session exactly as it was at that instant:
a message committed after it is absent, a batch is there whole or not at all. The file
is written to a temporary name beside ``path`` (mode 0600, as an export), synced, and
renamed to ``path`` when complete: ``path`` never holds half a backup.
:func:`restore_backup` loads it into either backend, then checks every session it holds
against the file (counts and checksums).

Backup format
-------------

JSON Lines, as the export (:mod:`sessionrepo.ops.export`), with its ``session`` and
``message`` records unchanged, a ``checksum`` record after each session's messages, and
an ``end`` record that covers the whole file::

    {"type": "header", "format": "sessionrepo-backup", "version": 1,
     "taken_at": "2026-12-02T05:40:00.123456Z", "backend": "postgresql",
     "checksum": "sha256"}
    {"type": "session", "next_seq": 3, "session": {...}}      (as in an export)
    {"type": "message", "session_id": "discord:42", "seq": 1, "message": {...}}
    {"type": "message", "session_id": "discord:42", "seq": 2, "message": {...}}
    {"type": "checksum", "session_id": "discord:42", "messages": 2, "sha256": "9f2c…"}
    {"type": "session", ...}                 (the next session by id, its messages, ...)
    {"type": "end", "sessions": 1, "messages": 2, "sha256": "41d0…"}

- A session's ``sha256`` is the SHA-256 of its ``message`` lines, in seq order, exactly
  as they are in the file (each with its ``"\\n"``): a line is
  :func:`message_line` of the stored message, so the same messages give the same bytes
  whichever backend holds them, and a restored session is verified by reading it back
  and hashing it again. ``messages`` counts them.
- The ``end`` record's ``sha256`` is that of every byte before its line: a file damaged
  anywhere (a session's fields included) is refused before anything is restored.
- Every record is one line: a line break is always a record boundary (JSON escapes
  control characters in strings).

What a backup holds: every session row (all fields and counters) and every stored
message (key, seq, every field, ``superseded``). Not in it: the search index (rebuilt
from the messages on restore), usage records, ADK state, retention policies, the audit,
the tombstones, and any outbox's rows (what gateways parked is not yet stored).

A backup is a copy an erasure cannot reach: one taken before an erase still holds what
was erased. :func:`restore_backup` honours the target's tombstones: a message an erasure
removed there is not restored, but counted (``messages_erased``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import IO, Any, Final
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sessionrepo.errors import InvalidArgument, NotFound, RepoError
from sessionrepo.models import Session, StoredMessage
from sessionrepo.models.tables import dump_json
from sessionrepo.ops.export import create_private_file
from sessionrepo.store.arguments import check_limit
from sessionrepo.store.codec import invalid_from_validation
from sessionrepo.store.repository import SessionRepository, SessionSnapshot
from sessionrepo.store.snapshot import SnapshotReader, read_snapshot, session_erased
from sessionrepo.store.tombstones import screen_stored

BACKUP_FORMAT: Final = "sessionrepo-backup"
BACKUP_VERSION: Final = 1
#: Sessions and messages read per page while backing up; messages per restore transaction.
PAGE: Final = 500
#: Largest ``seq`` (``BIGINT``).
_MAX_SEQ: Final = 2**63 - 1


class BadBackupFile(RepoError):
    """The file is not a sessionrepo backup, or is damaged (at the line named)."""


class BackupReport(BaseModel):
    """What one backup wrote."""

    model_config = ConfigDict(frozen=True)

    path: str
    #: The instant the backup holds the store as of (just before its first read), UTC.
    taken_at: datetime
    backend: str
    sessions: int = 0
    messages: int = 0
    bytes: int = 0
    #: The file's checksum (its ``end`` record's).
    sha256: str = ""


class SessionMismatch(BaseModel):
    """A restored session that does not hold what the backup says it should."""

    model_config = ConfigDict(frozen=True)

    session_id: str
    expected_messages: int
    found_messages: int
    expected_sha256: str
    found_sha256: str


class RestoreBackupReport(BaseModel):
    """What one restore did, and what its verification found."""

    model_config = ConfigDict(frozen=True)

    #: When the backup was taken, and on which backend.
    taken_at: datetime
    source_backend: str
    #: Sessions the target did not have: recreated.
    sessions_restored: int = 0
    #: Sessions the target held as the backup has them (what they lacked was added).
    sessions_present: int = 0
    #: Sessions the target holds with changes of its own: left as they are (verified:
    #: a mismatch when their messages differ from the backup's).
    sessions_diverged: int = 0
    #: Sessions not restored at all: every message of theirs (or, with none, the
    #: session itself) was erased from the target.
    sessions_erased: int = 0
    messages_inserted: int = 0
    #: Messages whose key the target already had, with the same content.
    messages_present: int = 0
    #: Messages whose key the target had with different content (the target's kept).
    messages_conflicting: int = 0
    #: Messages an erasure removed from the target (its tombstones): not restored.
    messages_erased: int = 0
    #: Sessions whose count and checksum were checked, and those that did not match.
    sessions_verified: int = 0
    mismatches: list[SessionMismatch] = Field(default_factory=list)

    @property
    def sessions(self) -> int:
        return (
            self.sessions_restored
            + self.sessions_present
            + self.sessions_diverged
            + self.sessions_erased
        )

    @property
    def verified(self) -> bool:
        """Whether every restored session matched the backup."""
        return not self.mismatches


def message_line(message: StoredMessage) -> bytes:
    """A stored message's ``message`` line, as a backup (and an export) writes it."""
    record = {
        "type": "message",
        "session_id": message.session_id,
        "seq": message.seq,
        "message": message.model_dump(mode="json", exclude={"session_id", "seq"}),
    }
    return _line(record)


def _line(record: dict[str, Any]) -> bytes:
    return dump_json(record).encode("utf-8") + b"\n"


def _stamp(when: datetime) -> str:
    return when.isoformat().replace("+00:00", "Z")


# -- writing ---------------------------------------------------------------------------


class _Writer:
    """Writes one snapshot to ``out``, hashing as it goes."""

    def __init__(
        self, out: IO[bytes], on_session: Callable[[Session], None] | None, page: int
    ) -> None:
        self._out = out
        self._on_session = on_session
        self._page = page
        self._file = hashlib.sha256()
        self.sessions = self.messages = self.bytes = 0

    def _write(self, data: bytes) -> None:
        self._out.write(data)
        self._file.update(data)
        self.bytes += len(data)

    def run(self, reader: SnapshotReader) -> BackupReport:
        # A rerun (a dropped connection) starts again from an empty file.
        self._out.seek(0)
        self._out.truncate()
        self._file = hashlib.sha256()
        self.sessions = self.messages = self.bytes = 0
        header = {
            "type": "header",
            "format": BACKUP_FORMAT,
            "version": BACKUP_VERSION,
            "taken_at": _stamp(reader.taken_at),
            "backend": reader.backend,
            "checksum": "sha256",
        }
        self._write(_line(header))
        after: str | None = None
        while True:
            batch = reader.sessions(after_id=after, limit=self._page)
            for snapshot in batch:
                self._session(reader, snapshot)
            if len(batch) < self._page:
                break
            after = batch[-1].session.id
        digest = self._file.hexdigest()
        end = _line(
            {"type": "end", "sessions": self.sessions, "messages": self.messages, "sha256": digest}
        )
        self._out.write(end)
        self.bytes += len(end)
        return BackupReport(
            path="",
            taken_at=reader.taken_at,
            backend=reader.backend,
            sessions=self.sessions,
            messages=self.messages,
            bytes=self.bytes,
            sha256=digest,
        )

    def _session(self, reader: SnapshotReader, snapshot: SessionSnapshot) -> None:
        session = snapshot.session
        self._write(
            _line(
                {
                    "type": "session",
                    "next_seq": snapshot.next_seq,
                    "session": session.model_dump(mode="json", by_alias=True),
                }
            )
        )
        digest = hashlib.sha256()
        count = 0
        after = 0
        while True:
            page = reader.messages(
                session.id, after_seq=after, before_seq=snapshot.next_seq, limit=self._page
            )
            for message in page:
                line = message_line(message)
                digest.update(line)
                self._write(line)
            count += len(page)
            if len(page) < self._page:
                break
            after = page[-1].seq
        self._write(
            _line(
                {
                    "type": "checksum",
                    "session_id": session.id,
                    "messages": count,
                    "sha256": digest.hexdigest(),
                }
            )
        )
        self.sessions += 1
        self.messages += count
        if self._on_session is not None:
            self._on_session(session)


def backup_store(
    repository: SessionRepository,
    path: str | os.PathLike[str],
    *,
    on_session: Callable[[Session], None] | None = None,
    page: int = PAGE,
) -> BackupReport:
    """Write a consistent backup of the whole store to the new file ``path`` (see the
    module docstring for the format): every session as of one instant, however many
    gateways write meanwhile.

    Written to a temporary file beside ``path`` (readable by its owner only), synced,
    then renamed to ``path``; on any failure the temporary file is removed and
    ``path`` is not created.

    Args:
        on_session: called after each session is written, inside the snapshot (progress).
        page: sessions and messages read per statement, 1 to 1000.

    Raises:
        InvalidArgument: something is at ``path`` already, or its folder is missing.
    """
    check_limit(page, "page", maximum=1000)
    target = Path(path)
    if target.exists() or target.is_symlink():
        raise InvalidArgument("path", f"{target} already exists; choose a new file")
    if not target.parent.is_dir():
        raise InvalidArgument("path", f"{target.parent} is not a folder")
    temporary = target.with_name(f".{target.name}.{os.getpid()}.partial")
    try:
        out = create_private_file(temporary)
    except OSError as exc:
        raise InvalidArgument("path", f"{temporary}: {exc.strerror}") from None
    try:
        with out:
            writer = _Writer(out, on_session, page)
            report = read_snapshot(repository.database, writer.run)
            out.flush()
            os.fsync(out.fileno())
        _rename_new(temporary, target)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    _sync_folder(target.parent)
    return report.model_copy(update={"path": str(target)})


def _rename_new(temporary: Path, target: Path) -> None:
    """``temporary`` renamed to ``target``, never over a file that appeared there."""
    try:
        os.link(temporary, target)  # fails if target exists, unlike a rename
    except FileExistsError:
        raise InvalidArgument(
            "path", f"{target} was created while the backup was written; choose a new file"
        ) from None
    except OSError:  # a file system without hard links
        if target.exists():
            raise InvalidArgument("path", f"{target} already exists") from None
        os.replace(temporary, target)
        return
    temporary.unlink()


def _sync_folder(folder: Path) -> None:
    with contextlib.suppress(OSError):
        descriptor = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)


# -- reading ---------------------------------------------------------------------------


@dataclass
class _Header:
    taken_at: datetime
    backend: str


@dataclass
class _Session:
    snapshot: SessionSnapshot
    messages: list[tuple[StoredMessage, bytes]]


def _records(stream: IO[bytes]) -> Iterator[tuple[int, bytes, dict[str, Any]]]:
    for number, raw in enumerate(stream, start=1):
        try:
            record = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            what = "not a sessionrepo backup" if number == 1 else "damaged"
            raise BadBackupFile(f"line {number}: {what} (not JSON: {exc})") from None
        if not isinstance(record, dict):
            raise BadBackupFile(f"line {number}: a record must be a JSON object")
        if not raw.endswith(b"\n"):
            raise BadBackupFile(f"line {number}: the file was cut short (no end record)")
        yield number, raw, record


def _header(record: dict[str, Any]) -> _Header:
    if record.get("type") != "header" or record.get("format") != BACKUP_FORMAT:
        raise BadBackupFile(
            "line 1: not a sessionrepo backup (it starts without the "
            f'{{"type": "header", "format": "{BACKUP_FORMAT}"}} record)'
        )
    version = record.get("version")
    if version != BACKUP_VERSION:
        raise BadBackupFile(
            f"line 1: backup format version {version!r}; this sessionrepo reads version "
            f"{BACKUP_VERSION} (a newer sessionrepo wrote it: upgrade sessionrepo)"
        )
    if record.get("checksum") != "sha256":
        raise BadBackupFile(f"line 1: unknown checksum {record.get('checksum')!r}")
    try:
        taken_at = datetime.fromisoformat(str(record.get("taken_at")))
    except ValueError:
        raise BadBackupFile("line 1: taken_at is not a time") from None
    return _Header(taken_at=taken_at, backend=str(record.get("backend")))


def _sessions(stream: IO[bytes], page: int) -> Iterator[_Header | _Session | _SessionEnd | _End]:
    """The header; then each session in parts of at most ``page`` messages (each part
    with the same snapshot object; the last may be empty), then its ``_SessionEnd``
    once its checksum record matched; last the ``_End``, once the end record's totals
    and the file's checksum matched. Every record is checked as it is read.

    Raises:
        BadBackupFile: at the first record that is not what the format says.
    """
    whole = hashlib.sha256()
    current: _Session | None = None
    digest = hashlib.sha256()
    count = last_seq = 0
    sessions = messages = 0
    ended = False
    number = 0
    for number, raw, record in _records(stream):
        kind = record.get("type")
        if ended:
            raise BadBackupFile(f"line {number}: a record after the end record")
        if number == 1:
            whole.update(raw)
            yield _header(record)
            continue
        if kind == "end":
            if current is not None:
                raise BadBackupFile(f"line {number}: the last session has no checksum record")
            counted = (record.get("sessions"), record.get("messages"))
            if counted != (sessions, messages):
                raise BadBackupFile(
                    f"line {number}: the end record counts {counted[0]} sessions and "
                    f"{counted[1]} messages, the file holds {sessions} and {messages}"
                )
            if record.get("sha256") != whole.hexdigest():
                raise BadBackupFile(
                    f"line {number}: the file's checksum does not match its end record "
                    "(the file is damaged)"
                )
            ended = True
            yield _End(str(record["sha256"]))
            continue
        whole.update(raw)
        if kind == "session":
            if current is not None:
                raise BadBackupFile(f"line {number}: a session before the last one's checksum")
            current = _Session(snapshot=_session_record(record, number), messages=[])
            digest = hashlib.sha256()
            count = last_seq = 0
        elif kind == "message":
            if current is None:
                raise BadBackupFile(f"line {number}: a message outside a session")
            message = _message_record(record, number, current.snapshot, last_seq)
            if message_line(message) != raw:
                raise BadBackupFile(
                    f"line {number}: the message does not read back as written (damaged, "
                    "or not written by sessionrepo backup)"
                )
            digest.update(raw)
            count += 1
            last_seq = message.seq
            current.messages.append((message, raw))
            if len(current.messages) >= page:
                yield current
                current = _Session(snapshot=current.snapshot, messages=[])
        elif kind == "checksum":
            if current is None or record.get("session_id") != current.snapshot.session.id:
                raise BadBackupFile(f"line {number}: a checksum record outside its session")
            if record.get("messages") != count or record.get("sha256") != digest.hexdigest():
                raise BadBackupFile(
                    f"line {number}: session {current.snapshot.session.id!r} holds {count} "
                    "messages whose checksum does not match its checksum record (damaged)"
                )
            sessions += 1
            messages += count
            yield current
            yield _SessionEnd(current.snapshot.session.id, count, digest.hexdigest())
            current = None
        else:
            raise BadBackupFile(f"line {number}: unknown record type {kind!r}")
    if number == 0:
        raise BadBackupFile("the file is empty, not a sessionrepo backup")
    if not ended:
        raise BadBackupFile(f"the file was cut short after line {number} (no end record)")


@dataclass
class _SessionEnd:
    session_id: str
    messages: int
    sha256: str


@dataclass
class _End:
    sha256: str


def _session_record(record: dict[str, Any], number: int) -> SessionSnapshot:
    next_seq = record.get("next_seq")
    if type(next_seq) is not int or not 1 <= next_seq <= _MAX_SEQ:
        raise BadBackupFile(f"line {number}: next_seq must be a positive integer")
    try:
        session = Session.model_validate(record.get("session"))
    except ValidationError as exc:
        raise BadBackupFile(f"line {number}: {invalid_from_validation(exc, 'session')}") from None
    return SessionSnapshot(session, next_seq)


def _message_record(
    record: dict[str, Any], number: int, snapshot: SessionSnapshot, last_seq: int
) -> StoredMessage:
    sid = snapshot.session.id
    if record.get("session_id") != sid:
        raise BadBackupFile(
            f"line {number}: a message of session {record.get('session_id')!r} among those "
            f"of {sid!r}"
        )
    seq = record.get("seq")
    if type(seq) is not int or not last_seq < seq < snapshot.next_seq:
        raise BadBackupFile(
            f"line {number}: seq {seq!r} is out of order (after {last_seq}, before the "
            f"session's next_seq {snapshot.next_seq})"
        )
    body = record.get("message")
    if not isinstance(body, dict):
        raise BadBackupFile(f"line {number}: the message record has no message object")
    try:
        return StoredMessage.model_validate({**body, "session_id": sid, "seq": seq})
    except ValidationError as exc:
        raise BadBackupFile(f"line {number}: {invalid_from_validation(exc, 'message')}") from None


def verify_backup_file(path: str | os.PathLike[str]) -> BackupReport:
    """Check a backup file whole (every record, count and checksum) without restoring
    anything; what it holds.

    Raises:
        BadBackupFile: the file is not a backup, or is damaged (the line is named).
    """
    target = Path(path)
    header: _Header | None = None
    sessions = messages = 0
    digest = ""
    with target.open("rb") as stream:
        for item in _sessions(stream, PAGE):
            if isinstance(item, _Header):
                header = item
            elif isinstance(item, _SessionEnd):
                sessions += 1
                messages += item.messages
            elif isinstance(item, _End):
                digest = item.sha256
    assert header is not None  # _sessions yields it first or raises
    return BackupReport(
        path=str(target),
        taken_at=header.taken_at,
        backend=header.backend,
        sessions=sessions,
        messages=messages,
        bytes=target.stat().st_size,
        sha256=digest,
    )


# -- restoring -------------------------------------------------------------------------


class _Restorer:
    def __init__(self, repository: SessionRepository) -> None:
        self._repository = repository
        self.counts: dict[str, int] = {}
        self.mismatches: list[SessionMismatch] = []
        self._outcome: str | None = None
        self._expected = hashlib.sha256()
        self._expected_count = 0

    def _add(self, name: str, amount: int = 1) -> None:
        self.counts[name] = self.counts.get(name, 0) + amount

    def part(self, part: _Session) -> None:
        """Restore one page of a session's messages (the first creates the session)."""
        snapshot = part.snapshot
        sid = snapshot.session.id
        if self._outcome is None:
            self._expected = hashlib.sha256()
            self._expected_count = 0
        batch = [message for message, _ in part.messages]
        erased: set[UUID] = set()
        if self._outcome == "diverged":
            erased = set(screen_stored(self._repository.database, sid, batch)[1])
        elif not batch and self._outcome is None and session_erased(self._repository.database, sid):
            self._outcome = "erased"  # an empty session an erasure removed: not again
        elif batch or self._outcome is None:
            result = self._repository.restore_session(snapshot, batch)
            erased = set(result.erased)
            if result.outcome == "diverged":
                erased = set(screen_stored(self._repository.database, sid, batch)[1])
                self._outcome = "diverged"
            elif result.outcome != "erased" and self._outcome in (None, "erased"):
                self._outcome = "restored" if result.outcome == "created" else "present"
            elif self._outcome is None:
                self._outcome = "erased"
            self._add("messages_inserted", len(result.inserted))
            self._add("messages_present", len(result.duplicates))
            self._add("messages_conflicting", len(result.conflicts))
        self._add("messages_erased", len(erased))
        for message, raw in part.messages:
            if message.client_msg_uuid not in erased:
                self._expected.update(raw)
                self._expected_count += 1

    def end(self, sid: str, next_seq: int) -> None:
        """The session's last page is written: verify what the target holds."""
        outcome, self._outcome = self._outcome or "erased", None
        self._add(f"sessions_{outcome}")
        found, digest = _held(self._repository, sid, next_seq)
        self._add("sessions_verified")
        expected = self._expected.hexdigest()
        if (found, digest) != (self._expected_count, expected):
            self.mismatches.append(
                SessionMismatch(
                    session_id=sid,
                    expected_messages=self._expected_count,
                    found_messages=found,
                    expected_sha256=expected,
                    found_sha256=digest,
                )
            )


def _held(repository: SessionRepository, sid: str, next_seq: int) -> tuple[int, str]:
    """How many messages the store holds in ``sid`` below ``next_seq``, and their
    checksum (as a backup computes it); none for a session it lacks."""
    digest = hashlib.sha256()
    count = after = 0
    while True:
        try:
            page = repository.load_transcript(
                sid, after_seq=after, before_seq=next_seq, limit=PAGE, include_retracted=True
            )
        except NotFound:
            break
        for message in page:
            digest.update(message_line(message))
        count += len(page)
        if len(page) < PAGE:
            break
        after = page[-1].seq
    return count, digest.hexdigest()


def restore_backup(
    repository: SessionRepository,
    path: str | os.PathLike[str],
    *,
    batch_size: int = PAGE,
    on_session: Callable[[str], None] | None = None,
    checked: BackupReport | None = None,
) -> RestoreBackupReport:
    """Load a backup into ``repository`` (either backend, whichever wrote it), then
    verify every session it holds: the messages the target holds below the session's
    ``next_seq`` must be the backup's (count and checksum), less what the target's
    tombstones refused. Mismatches are reported, not raised (see ``verified``).

    The whole file is checked first (every record, count and checksum): a damaged
    file raises before anything is written. Then each session is restored as
    :meth:`SessionRepository.restore_session` does (at its seq, idempotent: a second
    restore of the same file inserts nothing), ``batch_size`` messages a transaction.
    A session the target holds differently (a gateway wrote to it since) is left as
    it is, and verified like the others. A message an erasure removed from the target
    is not restored, but counted (``messages_erased``); a session none of whose
    messages may come back is not recreated (``sessions_erased``).

    Args:
        on_session: called with each session's id once it is restored and verified.
        checked: what :func:`verify_backup_file` returned for ``path`` (its pass over
            the file is then not run again; every record is still checked as it is
            restored).

    Raises:
        BadBackupFile: the file is not a backup, or is damaged (nothing was written).
        InvalidArgument: ``batch_size`` is out of range.
    """
    check_limit(batch_size, "batch_size", maximum=1000)
    source = Path(path)
    if checked is None:
        checked = verify_backup_file(source)
    restorer = _Restorer(repository)
    last: _Session | None = None
    with source.open("rb") as stream:
        for item in _sessions(stream, batch_size):
            if isinstance(item, _Session):
                if last is None or item.messages or last.snapshot is not item.snapshot:
                    restorer.part(item)
                last = item
            elif isinstance(item, _SessionEnd):
                assert last is not None
                restorer.end(item.session_id, last.snapshot.next_seq)
                last = None
                if on_session is not None:
                    on_session(item.session_id)
    return RestoreBackupReport(
        taken_at=checked.taken_at,
        source_backend=checked.backend,
        **restorer.counts,
        mismatches=restorer.mismatches,
    )
