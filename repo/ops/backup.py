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

JSON Lines, as the export (:mod:`sessionrepo.ops.export`), with its ``session``,
``message`` and ``usage`` records unchanged, a session's ADK session after its usage, a
``checksum`` record closing each session, the ADK app and user states after the last
session, and an ``end`` record that covers the whole file::

    {"type": "header", "format": "sessionrepo-backup", "version": 2,
     "taken_at": "2026-12-02T05:40:00.123456Z", "backend": "postgresql",
     "checksum": "sha256"}
    {"type": "session", "next_seq": 3, "session": {...}}      (as in an export)
    {"type": "message", "session_id": "adk:a:u:1", "seq": 1, "message": {...}}
    {"type": "message", "session_id": "adk:a:u:1", "seq": 2, "message": {...}}
    {"type": "usage", "session_id": "adk:a:u:1", "usage": {...}}   (as in an export)
    {"type": "adk_session", "session_id": "adk:a:u:1", "adk_session": {"app_name": "a",
     "user_id": "u", "adk_session_id": "1", "state": {...}, "update_time": 1764654000.5,
     "applied_seq": 2}}
    {"type": "checksum", "session_id": "adk:a:u:1", "messages": 2, "sha256": "9f2c…",
     "usage": 1, "usage_sha256": "77ab…", "adk_session": "c3d1…"}
    {"type": "session", ...}                 (the next session by id, its messages, ...)
    {"type": "adk_app_state", "adk_app_state": {"app_name": "a", "state": {...},
     "update_time": 1764654000.5}}
    {"type": "adk_user_state", "adk_user_state": {"app_name": "a", "user_id": "u", ...}}
    {"type": "end", "sessions": 1, "messages": 2, "usage": 1, "adk_sessions": 1,
     "adk_states": 2, "sha256": "41d0…"}

- A session's ``sha256`` is the SHA-256 of its ``message`` lines, in seq order, exactly
  as they are in the file (each with its ``"\\n"``): a line is :func:`message_line` of
  the stored message, so the same messages give the same bytes whichever backend holds
  them, and a restored session is verified by reading it back and hashing it again.
  ``messages`` counts them; ``usage`` and ``usage_sha256`` are the same for its usage
  records (oldest first), ``adk_session`` the SHA-256 of its ``adk_session`` line
  (``null``: not an ADK session).
- The ``end`` record's ``sha256`` is that of every byte before its line: a file damaged
  anywhere (a session's fields, a state included) is refused before anything is
  restored.
- Every record is one line, written as sessionrepo writes it (a line that does not read
  back to the same bytes is refused): a line break is always a record boundary (JSON
  escapes control characters in strings).
- Version 1 files (no usage, no ADK state; a checksum record with ``messages`` and
  ``sha256`` only) are read and restored as they are.

What a backup holds: every session row (all fields and counters), every stored message
(key, seq, every field, ``superseded``), every usage record, every ADK session (its
state and names) and the ADK app and user states. Not in it: the search index (rebuilt
from the messages on restore), the usage prices, retention policies, the audit, the
tombstones, and any outbox's rows (what gateways parked is not yet stored).

A backup is a copy an erasure cannot reach: one taken before an erase still holds what
was erased. :func:`restore_backup` honours the target's tombstones: a message an
erasure removed there is not restored, but counted (``messages_erased``), and neither
is what went with it: the usage records of erased messages (and, in an erased session,
those made before its erasure), the ADK session of a session erased since its state was
written, a user's ADK state erased since (see :mod:`sessionrepo.store.backup_state`).
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import IO, Any, Final, Literal
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field

from sessionrepo.errors import InvalidArgument, NotFound, RepoError
from sessionrepo.models import Session, StoredMessage
from sessionrepo.models.usage import Usage
from sessionrepo.ops import records
from sessionrepo.ops.export import create_private_file
from sessionrepo.store import backup_state
from sessionrepo.store.arguments import check_limit
from sessionrepo.store.repository import SessionRepository, SessionSnapshot
from sessionrepo.store.snapshot import SnapshotReader, read_snapshot, session_erased
from sessionrepo.store.tombstones import screen_stored
from sessionrepo.store.usage import restore_usage

BACKUP_FORMAT: Final = "sessionrepo-backup"
BACKUP_VERSION: Final = 2
#: The versions :func:`restore_backup` reads (1: no usage records, no ADK state).
READABLE_VERSIONS: Final = (1, 2)
#: Sessions and messages read per page while backing up; messages per restore transaction.
PAGE: Final = 500

#: The fields of the ADK records and their JSON types, as the tables have them.
_ADK_FIELDS: Final[dict[str, dict[str, type]]] = {
    "adk_session": {
        "app_name": str,
        "user_id": str,
        "adk_session_id": str,
        "state": dict,
        "update_time": float,
        "applied_seq": int,
    },
    "adk_app_state": {"app_name": str, "state": dict, "update_time": float},
    "adk_user_state": {"app_name": str, "user_id": str, "state": dict, "update_time": float},
}
_STATE_KINDS: Final[tuple[backup_state.StateKind, ...]] = ("adk_app_state", "adk_user_state")


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
    #: Usage records (model calls).
    usage: int = 0
    #: ADK sessions (a session's ADK names and state), and ADK app and user states.
    adk_sessions: int = 0
    adk_states: int = 0
    bytes: int = 0
    #: The file's checksum (its ``end`` record's).
    sha256: str = ""


class SessionMismatch(BaseModel):
    """A restored session that does not hold what the backup says it should: its
    messages, or (``part="usage"``) its usage records."""

    model_config = ConfigDict(frozen=True)

    session_id: str
    part: Literal["messages", "usage"] = "messages"
    expected_messages: int
    found_messages: int
    expected_sha256: str
    found_sha256: str


class RestoreBackupReport(records.RestoredCounts):
    """What one restore did, and what its verification found. (Its usage counts are
    also those of the sessions not restored: their records were refused too.)"""

    #: When the backup was taken, and on which backend.
    taken_at: datetime
    source_backend: str
    #: Sessions the target did not have: recreated.
    sessions_restored: int = 0
    #: Sessions the target held as the backup has them (what they lacked was added).
    sessions_present: int = 0
    #: Sessions the target holds with changes of its own: left as they are, their usage
    #: and ADK session too (verified: a mismatch when their messages differ from the
    #: backup's).
    sessions_diverged: int = 0
    #: Sessions not restored at all: every message of theirs (or, with none, the
    #: session itself) was erased from the target.
    sessions_erased: int = 0
    #: ADK sessions inserted, already there as backed up, held with a state of the
    #: target's own (kept), and refused (their session erased since).
    adk_sessions_inserted: int = 0
    adk_sessions_present: int = 0
    adk_sessions_conflicting: int = 0
    adk_sessions_erased: int = 0
    #: ADK app and user states, likewise (a user's state erased since: refused).
    adk_states_inserted: int = 0
    adk_states_present: int = 0
    adk_states_conflicting: int = 0
    adk_states_erased: int = 0
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
    return records.line(records.message_record(message))


def usage_line(session_id: str, usage: Usage) -> bytes:
    """A usage record's ``usage`` line, as a backup (and an export) writes it."""
    return records.line(records.usage_record(session_id, usage))


def _adk_session_line(session_id: str, row: dict[str, Any]) -> bytes:
    return records.line({"type": "adk_session", "session_id": session_id, "adk_session": row})


def _state_line(kind: str, row: dict[str, Any]) -> bytes:
    return records.line({"type": kind, kind: row})


def _stamp(when: datetime) -> str:
    return when.isoformat().replace("+00:00", "Z")


def _sha256(lines: list[bytes]) -> str:
    return hashlib.sha256(b"".join(lines)).hexdigest()


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
        self.counts: dict[str, int] = {}

    def _write(self, data: bytes) -> None:
        self._out.write(data)
        self._file.update(data)
        self.counts["bytes"] = self.counts.get("bytes", 0) + len(data)

    def _add(self, name: str, amount: int = 1) -> None:
        self.counts[name] = self.counts.get(name, 0) + amount

    def run(self, reader: SnapshotReader) -> BackupReport:
        # A rerun (a dropped connection) starts again from an empty file.
        self._out.seek(0)
        self._out.truncate()
        self._file = hashlib.sha256()
        self.counts = {}
        header = {
            "type": "header",
            "format": BACKUP_FORMAT,
            "version": BACKUP_VERSION,
            "taken_at": _stamp(reader.taken_at),
            "backend": reader.backend,
            "checksum": "sha256",
        }
        self._write(records.line(header))
        after: str | None = None
        while True:
            batch = reader.sessions(after_id=after, limit=self._page)
            for snapshot in batch:
                self._session(reader, snapshot)
            if len(batch) < self._page:
                break
            after = batch[-1].session.id
        for kind in _STATE_KINDS:
            self._states(reader, kind)
        digest = self._file.hexdigest()
        totals = {
            name: self.counts.get(name, 0)
            for name in ("sessions", "messages", "usage", "adk_sessions", "adk_states")
        }
        end = records.line({"type": "end", **totals, "sha256": digest})
        self._out.write(end)
        return BackupReport(
            path="",
            taken_at=reader.taken_at,
            backend=reader.backend,
            **totals,
            bytes=self.counts["bytes"] + len(end),
            sha256=digest,
        )

    def _session(self, reader: SnapshotReader, snapshot: SessionSnapshot) -> None:
        session = snapshot.session
        sid = session.id
        self._write(
            records.line(
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
                sid, after_seq=after, before_seq=snapshot.next_seq, limit=self._page
            )
            for message in page:
                line = message_line(message)
                digest.update(line)
                self._write(line)
            count += len(page)
            if len(page) < self._page:
                break
            after = page[-1].seq
        usage = [usage_line(sid, record) for record in reader.usage(sid)]
        for line in usage:
            self._write(line)
        adk = reader.adk_session(sid)
        adk_digest = None
        if adk is not None:
            line = _adk_session_line(sid, adk)
            self._write(line)
            adk_digest = _sha256([line])
            self._add("adk_sessions")
        self._write(
            records.line(
                {
                    "type": "checksum",
                    "session_id": sid,
                    "messages": count,
                    "sha256": digest.hexdigest(),
                    "usage": len(usage),
                    "usage_sha256": _sha256(usage),
                    "adk_session": adk_digest,
                }
            )
        )
        self._add("sessions")
        self._add("messages", count)
        self._add("usage", len(usage))
        if self._on_session is not None:
            self._on_session(session)

    def _states(self, reader: SnapshotReader, kind: backup_state.StateKind) -> None:
        key = backup_state.SCOPES[kind].key
        after: tuple[str, ...] | None = None
        while True:
            page = reader.adk_states(kind, after=after, limit=self._page)
            for row in page:
                self._write(_state_line(kind, row))
            self._add("adk_states", len(page))
            if len(page) < self._page:
                return
            after = tuple(page[-1][name] for name in key)


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
    version: int


@dataclass
class _Session:
    snapshot: SessionSnapshot
    messages: list[tuple[StoredMessage, bytes]]


@dataclass
class _SessionEnd:
    session_id: str
    messages: int
    sha256: str
    #: Its usage records (and their lines), its ADK session's row (and line).
    usage: list[tuple[Usage, bytes]] = field(default_factory=list)
    adk: tuple[dict[str, Any], bytes] | None = None


@dataclass
class _State:
    kind: backup_state.StateKind
    row: dict[str, Any]


@dataclass
class _End:
    sha256: str


def _lines(stream: IO[bytes]) -> Iterator[tuple[int, bytes, dict[str, Any]]]:
    for number, raw, record in records.json_lines(stream, BadBackupFile, "backup"):
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
    if version not in READABLE_VERSIONS:
        raise BadBackupFile(
            f"line 1: backup format version {version!r}; this sessionrepo reads versions "
            f"{READABLE_VERSIONS[0]} to {BACKUP_VERSION} (a newer sessionrepo wrote it: "
            "upgrade sessionrepo)"
        )
    if record.get("checksum") != "sha256":
        raise BadBackupFile(f"line 1: unknown checksum {record.get('checksum')!r}")
    try:
        taken_at = datetime.fromisoformat(str(record.get("taken_at")))
    except ValueError:
        raise BadBackupFile("line 1: taken_at is not a time") from None
    return _Header(taken_at=taken_at, backend=str(record.get("backend")), version=int(version))


def _adk_row(record: dict[str, Any], number: int, kind: str) -> dict[str, Any]:
    """The row of an ADK record, its fields checked against the table's."""
    row = record.get(kind)
    fields = _ADK_FIELDS[kind]
    if not isinstance(row, dict) or set(row) != set(fields):
        raise BadBackupFile(f"line {number}: the {kind} record must hold {sorted(fields)}")
    for name, wanted in fields.items():
        value = row[name]
        if type(value) is not wanted:
            raise BadBackupFile(f"line {number}: {kind}.{name} must be a {wanted.__name__}")
        if isinstance(value, float) and not math.isfinite(value):
            raise BadBackupFile(f"line {number}: {kind}.{name} must be a number")
    return row


class _Reader:
    """Checks the records of one file as they come (see :func:`_items`)."""

    def __init__(self, page: int) -> None:
        self.page = page
        self.version = BACKUP_VERSION
        self.whole = hashlib.sha256()
        self.current: _Session | None = None
        self.ending: _SessionEnd | None = None
        self.digest = hashlib.sha256()
        self.last_seq = 0
        self.counts = {"sessions": 0, "messages": 0, "usage": 0, "adk_sessions": 0, "adk_states": 0}

    def message(self, record: dict[str, Any], raw: bytes, number: int) -> Iterator[_Session]:
        current = self._open(number, "a message")
        message = records.read_message(
            record, number, current.snapshot, self.last_seq, BadBackupFile
        )
        if message_line(message) != raw:
            raise BadBackupFile(
                f"line {number}: the message does not read back as written (damaged, "
                "or not written by sessionrepo backup)"
            )
        assert self.ending is not None
        if self.ending.usage or self.ending.adk is not None:
            raise BadBackupFile(f"line {number}: a message after the session's usage")
        self.digest.update(raw)
        self.ending.messages += 1
        self.last_seq = message.seq
        current.messages.append((message, raw))
        if len(current.messages) >= self.page:
            yield current
            self.current = _Session(snapshot=current.snapshot, messages=[])

    def usage(self, record: dict[str, Any], raw: bytes, number: int) -> None:
        current = self._open(number, "a usage record")
        sid = current.snapshot.session.id
        usage = records.read_usage(record, number, sid, BadBackupFile)
        assert self.ending is not None
        if usage_line(sid, usage) != raw or self.ending.adk is not None:
            raise BadBackupFile(f"line {number}: the usage record is not as a backup writes it")
        self.ending.usage.append((usage, raw))

    def adk_session(self, record: dict[str, Any], raw: bytes, number: int) -> None:
        current = self._open(number, "an ADK session")
        sid = current.snapshot.session.id
        row = _adk_row(record, number, "adk_session")
        assert self.ending is not None
        if (
            record.get("session_id") != sid
            or _adk_session_line(sid, row) != raw
            or self.ending.adk is not None
        ):
            raise BadBackupFile(f"line {number}: the adk_session record is not its session's")
        self.ending.adk = (row, raw)

    def checksum(self, record: dict[str, Any], number: int) -> Iterator[_Session | _SessionEnd]:
        current, ending = self.current, self.ending
        if current is None or ending is None or record.get("session_id") != ending.session_id:
            raise BadBackupFile(f"line {number}: a checksum record outside its session")
        expected: dict[str, Any] = {"messages": ending.messages, "sha256": self.digest.hexdigest()}
        if self.version >= 2:
            expected |= {
                "usage": len(ending.usage),
                "usage_sha256": _sha256([raw for _, raw in ending.usage]),
                "adk_session": None if ending.adk is None else _sha256([ending.adk[1]]),
            }
        if {name: record.get(name) for name in expected} != expected:
            raise BadBackupFile(
                f"line {number}: session {ending.session_id!r} holds records whose counts or "
                "checksums do not match its checksum record (damaged)"
            )
        ending.sha256 = self.digest.hexdigest()
        self.counts["sessions"] += 1
        self.counts["messages"] += ending.messages
        self.counts["usage"] += len(ending.usage)
        self.counts["adk_sessions"] += ending.adk is not None
        self.current = self.ending = None
        yield current
        yield ending

    def session(self, record: dict[str, Any], number: int) -> None:
        if self.current is not None:
            raise BadBackupFile(f"line {number}: a session before the last one's checksum")
        if self.counts["adk_states"]:
            raise BadBackupFile(f"line {number}: a session after the ADK states")
        snapshot = records.read_session(record, number, BadBackupFile)
        self.current = _Session(snapshot=snapshot, messages=[])
        self.ending = _SessionEnd(snapshot.session.id, 0, "")
        self.digest = hashlib.sha256()
        self.last_seq = 0

    def state(self, record: dict[str, Any], raw: bytes, number: int) -> _State:
        kind: backup_state.StateKind = record["type"]
        if self.current is not None:
            raise BadBackupFile(f"line {number}: an ADK state inside a session")
        row = _adk_row(record, number, kind)
        if _state_line(kind, row) != raw:
            raise BadBackupFile(f"line {number}: the {kind} record is not as a backup writes it")
        self.counts["adk_states"] += 1
        return _State(kind, row)

    def end(self, record: dict[str, Any], number: int) -> _End:
        if self.current is not None:
            raise BadBackupFile(f"line {number}: the last session has no checksum record")
        names = list(self.counts) if self.version >= 2 else ["sessions", "messages"]
        counted = {name: record.get(name) for name in names}
        if counted != {name: self.counts[name] for name in names}:
            raise BadBackupFile(
                f"line {number}: the end record counts {counted}, the file holds "
                f"{ {name: self.counts[name] for name in names} }"
            )
        if record.get("sha256") != self.whole.hexdigest():
            raise BadBackupFile(
                f"line {number}: the file's checksum does not match its end record "
                "(the file is damaged)"
            )
        return _End(str(record["sha256"]))

    def _open(self, number: int, what: str) -> _Session:
        if self.current is None:
            raise BadBackupFile(f"line {number}: {what} outside a session")
        return self.current


#: The record types of each version, besides the header and the end.
_KINDS: Final = {
    1: frozenset({"session", "message", "checksum"}),
    2: frozenset({"session", "message", "checksum", "usage", "adk_session", *_STATE_KINDS}),
}


def _items(
    stream: IO[bytes], page: int
) -> Iterator[_Header | _Session | _SessionEnd | _State | _End]:
    """The header; then each session in parts of at most ``page`` messages (each part
    with the same snapshot object; the last may be empty), then its ``_SessionEnd``
    (its usage and ADK session) once its checksum record matched; then the ADK states;
    last the ``_End``, once the end record's totals and the file's checksum matched.
    Every record is checked as it is read.

    Raises:
        BadBackupFile: at the first record that is not what the format says.
    """
    reader = _Reader(page)
    ended = False
    number = 0
    for number, raw, record in _lines(stream):
        kind = record.get("type")
        if ended:
            raise BadBackupFile(f"line {number}: a record after the end record")
        if number == 1:
            reader.whole.update(raw)
            header = _header(record)
            reader.version = header.version
            yield header
            continue
        if kind == "end":
            ended = True
            yield reader.end(record, number)
            continue
        reader.whole.update(raw)
        if kind not in _KINDS[reader.version]:
            raise BadBackupFile(f"line {number}: unknown record type {kind!r}")
        if kind == "session":
            reader.session(record, number)
        elif kind == "message":
            yield from reader.message(record, raw, number)
        elif kind == "usage":
            reader.usage(record, raw, number)
        elif kind == "adk_session":
            reader.adk_session(record, raw, number)
        elif kind == "checksum":
            yield from reader.checksum(record, number)
        else:
            yield reader.state(record, raw, number)
    if number == 0:
        raise BadBackupFile("the file is empty, not a sessionrepo backup")
    if not ended:
        raise BadBackupFile(f"the file was cut short after line {number} (no end record)")


def verify_backup_file(path: str | os.PathLike[str]) -> BackupReport:
    """Check a backup file whole (every record, count and checksum) without restoring
    anything; what it holds.

    Raises:
        BadBackupFile: the file is not a backup, or is damaged (the line is named).
    """
    target = Path(path)
    header: _Header | None = None
    counts = {"sessions": 0, "messages": 0, "usage": 0, "adk_sessions": 0, "adk_states": 0}
    digest = ""
    with target.open("rb") as stream:
        for item in _items(stream, PAGE):
            if isinstance(item, _Header):
                header = item
            elif isinstance(item, _SessionEnd):
                counts["sessions"] += 1
                counts["messages"] += item.messages
                counts["usage"] += len(item.usage)
                counts["adk_sessions"] += item.adk is not None
            elif isinstance(item, _State):
                counts["adk_states"] += 1
            elif isinstance(item, _End):
                digest = item.sha256
    assert header is not None  # _items yields it first or raises
    return BackupReport(
        path=str(target),
        taken_at=header.taken_at,
        backend=header.backend,
        **counts,
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
        self._expected: list[bytes] = []

    def _add(self, name: str, amount: int = 1) -> None:
        self.counts[name] = self.counts.get(name, 0) + amount

    def part(self, part: _Session) -> None:
        """Restore one page of a session's messages (the first creates the session)."""
        snapshot = part.snapshot
        sid = snapshot.session.id
        if self._outcome is None:
            self._expected = []
        batch = [message for message, _ in part.messages]
        erased: set[UUID] = set()
        database = self._repository.database
        if self._outcome == "diverged":
            erased = set(screen_stored(database, sid, batch)[1])
        elif not batch and self._outcome is None and session_erased(database, sid):
            self._outcome = "erased"  # an empty session an erasure removed: not again
        elif batch or self._outcome is None:
            result = self._repository.restore_session(snapshot, batch)
            erased = set(result.erased)
            if result.outcome == "diverged":
                erased = set(screen_stored(database, sid, batch)[1])
                self._outcome = "diverged"
            elif result.outcome != "erased" and self._outcome in (None, "erased"):
                self._outcome = "restored" if result.outcome == "created" else "present"
            elif self._outcome is None:
                self._outcome = "erased"
            self._add("messages_inserted", len(result.inserted))
            self._add("messages_present", len(result.duplicates))
            self._add("messages_conflicting", len(result.conflicts))
        self._add("messages_erased", len(erased))
        self._expected += [
            raw for message, raw in part.messages if message.client_msg_uuid not in erased
        ]

    def end(self, ending: _SessionEnd, next_seq: int) -> None:
        """The session's last page is written: its usage and ADK session, then verify
        what the target holds."""
        sid = ending.session_id
        outcome, self._outcome = self._outcome or "erased", None
        self._add(f"sessions_{outcome}")
        usage = [record for record, _ in ending.usage]
        if outcome == "erased":  # not restored: neither is what goes with it
            self._add("usage_erased", len(usage))
            self._add("adk_sessions_erased", ending.adk is not None)
        elif outcome != "diverged":  # a diverged session is left as the target has it
            self._restore_extras(sid, ending, created=outcome == "restored")
        found, digest = _held(self._repository, sid, next_seq)
        self._add("sessions_verified")
        self._check(sid, "messages", self._expected, found, digest)

    def _restore_extras(self, sid: str, ending: _SessionEnd, *, created: bool) -> None:
        database = self._repository.database
        usage = [record for record, _ in ending.usage]
        recorded = restore_usage(database, sid, usage, created=created)
        self._add("usage_inserted", len(recorded.inserted))
        self._add("usage_present", len(recorded.duplicates))
        self._add("usage_erased", len(recorded.erased))
        if ending.adk is not None:
            adk = backup_state.restore_adk_session(database, sid, ending.adk[0])
            self._add(f"adk_sessions_{adk}")
        refused = set(recorded.erased)
        expected = [raw for record, raw in ending.usage if record.usage_id not in refused]
        wanted = {record.usage_id for record in usage} - refused
        held = {
            record.usage_id: usage_line(sid, record)
            for record in self._repository.list_usage(sid)
            if record.usage_id in wanted
        }
        there = [held[r.usage_id] for r in usage if r.usage_id in held]
        self._check(sid, "usage", expected, len(there), _sha256(there))

    def _check(
        self,
        sid: str,
        part: Literal["messages", "usage"],
        expected: list[bytes],
        found: int,
        digest: str,
    ) -> None:
        wanted = _sha256(expected)
        if (found, digest) != (len(expected), wanted):
            self.mismatches.append(
                SessionMismatch(
                    session_id=sid,
                    part=part,
                    expected_messages=len(expected),
                    found_messages=found,
                    expected_sha256=wanted,
                    found_sha256=digest,
                )
            )

    def state(self, state: _State) -> None:
        outcome = backup_state.restore_state(self._repository.database, state.kind, state.row)
        self._add(f"adk_states_{outcome}")


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
    ``next_seq`` must be the backup's (count and checksum), and so must its usage
    records, less what the target's tombstones refused. Mismatches are reported, not
    raised (see ``verified``).

    The whole file is checked first (every record, count and checksum): a damaged
    file raises before anything is written. Then each session is restored as
    :meth:`SessionRepository.restore_session` does (at its seq, idempotent: a second
    restore of the same file inserts nothing), ``batch_size`` messages a transaction,
    then its usage records and its ADK session; last the ADK app and user states. A
    session the target holds differently (a gateway wrote to it since) is left as it
    is, and its messages verified like the others'. What an erasure removed from the
    target is not restored, but counted (``messages_erased``, ``usage_erased``,
    ``adk_sessions_erased``, ``adk_states_erased``); a session none of whose messages
    may come back is not recreated (``sessions_erased``). An ADK row the target holds
    with other content is the target's newer state: kept, counted as conflicting.

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
        for item in _items(stream, batch_size):
            if isinstance(item, _Session):
                if last is None or item.messages or last.snapshot is not item.snapshot:
                    restorer.part(item)
                last = item
            elif isinstance(item, _SessionEnd):
                assert last is not None
                restorer.end(item, last.snapshot.next_seq)
                last = None
                if on_session is not None:
                    on_session(item.session_id)
            elif isinstance(item, _State):
                restorer.state(item)
    return RestoreBackupReport(
        taken_at=checked.taken_at,
        source_backend=checked.backend,
        **restorer.counts,
        mismatches=restorer.mismatches,
    )
