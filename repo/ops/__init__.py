"""Operators' maintenance: export, import and prune sessions; the checks behind ``doctor``.

Export format
-------------

JSON Lines: UTF-8, one JSON object per line, each line ending in ``"\\n"`` (JSON escapes
every control character inside strings, so a line break is always a record boundary;
readers must split on ``"\\n"`` only, not on U+2028 and friends). Every record has a
``type``; they come in this order::

    {"type": "header", "format": "sessionrepo-export", "version": 1,
     "exported_at": "2026-11-29T11:38:45.052864Z"}
    {"type": "session", "next_seq": 3, "session": {"id": "discord:42", "source": "discord",
     ..., "model_config": {...}, ..., "metadata": {...}, "last_active_at": "..."}}
    {"type": "message", "session_id": "discord:42", "seq": 1, "message": {
     "client_msg_uuid": "0193…", "role": "user", "content": "hi", ..., "timestamp": "…Z",
     ..., "extra": {...}, "openai_keys": ["role", "content"]}}
    {"type": "message", "session_id": "discord:42", "seq": 2, "message": {...}}
    {"type": "session", ...}                     (the next session, then its messages)
    {"type": "end", "sessions": 1, "messages": 2}

- ``session`` is :class:`models.Session` dumped with ``model_dump(mode="json",
  by_alias=True)``: every field, the counters, ``ended_at``/``end_reason`` and
  ``last_active_at`` included. ``next_seq`` is the ``seq`` the session's next message
  would get. A session's messages follow it, ``seq`` ascending: exactly those with
  ``seq < next_seq`` when the session was read, so the record and its messages are one
  consistent snapshot even while gateways keep writing.
- ``message`` is :class:`models.Message` dumped with ``model_dump(mode="json")``: the key,
  every wire field, ``timestamp`` (UTC, microseconds), ``extra`` (key order kept) and
  ``openai_keys`` (the key order ``to_openai()`` gives back), beside its ``seq``.
- ``end`` closes the file with its totals. A file without it was cut short (a full disk,
  a killed process); :func:`import_sessions` imports what it holds and says so.

Import restores: a session the target does not have is recreated exactly, its row as
exported (counters, times, ``next_seq``) and every message at its exported ``seq``, so a
model dump read back equals the one exported, field by field. A session the target
already holds *as exported* (a second import, or one resumed after an interruption) only
gets the messages it lacks, at their ``seq``. A session the target holds *differently*
(a gateway has written to it since) is merged: its missing messages are appended after
the target's own, through :meth:`SessionRepository.append`, and its row is left as the
target has it. Either way the message key decides: importing a file twice inserts
nothing the second time, and a key stored with different content is counted as a
conflict, never overwritten. Each batch of at most :data:`MAX_BATCH` messages is one
transaction, so an interrupted import keeps what it committed and a re-run completes it.
Restored messages are indexed for search after their batch commits, as ``append``
indexes its own (a failure there marks the index stale, never fails the import).

Prune deletes ended sessions whose end *and* last activity are older than a cutoff, with
their messages, in bounded batches; an open session is never deleted however old it is.
Each batch is re-checked under the sessions' row locks in the deleting transaction, so a
session reopened or written to meanwhile stays. With an export, a batch is written and
synced to the file first, and only sessions still exactly as exported are deleted.
Their search index entries go in the same transaction.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial
from pathlib import Path
from typing import IO, Any, Final, Literal

from alembic.script import ScriptDirectory
from pydantic import BaseModel, ConfigDict, ValidationError
from sqlalchemy import (
    ColumnElement,
    Connection,
    Row,
    Select,
    and_,
    delete,
    func,
    select,
    true,
)
from sqlalchemy.engine import URL

from sessionrepo.dialects import BackendDialect, normalize_url, safe_url
from sessionrepo.errors import InvalidMessage, NotFound, RepoError
from sessionrepo.models import Message, Session, StoredMessage
from sessionrepo.models.doctor import Check
from sessionrepo.models.message import utcnow
from sessionrepo.models.tables import (
    MESSAGE_COLUMNS,
    dump_json,
    messages_table,
    outbox_table,
    sessions_table,
)
from sessionrepo.outbox.table import Outbox
from sessionrepo.store import codec as _codec
from sessionrepo.store import schema
from sessionrepo.store.database import Database
from sessionrepo.store.repository import SessionRepository
from sessionrepo.store.search_index import SearchIndex

S = sessions_table.c
M = messages_table.c
O = outbox_table.c  # noqa: E741

EXPORT_FORMAT: Final = "sessionrepo-export"
EXPORT_VERSION: Final = 1
#: Most messages written in one import transaction.
MAX_BATCH: Final = 500
#: Sessions read per page while exporting; messages read per page of a transcript.
_PAGE: Final = 500
#: Largest ``seq`` (``BIGINT``): the upper bound of an unbounded transcript read.
_MAX_SEQ: Final = 2**63 - 1


class BadExportFile(RepoError):
    """The file is not a sessionrepo export, or is damaged at the line named."""


# -- selection ------------------------------------------------------------------------


@dataclass(frozen=True)
class Selection:
    """Which sessions to export: given ids, or those matching every filter set."""

    session_ids: tuple[str, ...] = ()
    source: str | None = None
    user_id: str | None = None
    status: Literal["open", "ended"] | None = None
    #: Only sessions that ended before this instant (so only ended ones).
    ended_before: datetime | None = None

    def where(self) -> ColumnElement[bool]:
        if self.session_ids:
            if (self.source, self.user_id, self.status, self.ended_before) != (None,) * 4:
                raise InvalidMessage("selection", "give session ids or filters, not both")
            return S.id.in_(self.session_ids)
        clauses: list[ColumnElement[bool]] = []
        if self.source is not None:
            clauses.append(S.source == self.source)
        if self.user_id is not None:
            clauses.append(S.user_id == self.user_id)
        if self.status == "open":
            clauses.append(S.ended_at.is_(None))
        elif self.status == "ended":
            clauses.append(S.ended_at.is_not(None))
        elif self.status is not None:
            raise InvalidMessage("status", "must be 'open', 'ended' or None")
        if self.ended_before is not None:
            clauses.append(S.ended_at < self.ended_before)
        return and_(true(), *clauses)


def count_sessions(repository: SessionRepository, selection: Selection) -> int:
    """How many sessions ``selection`` names (for a progress bar).

    Raises:
        NotFound: a session id given in the selection does not exist.
    """
    query = select(func.count()).select_from(sessions_table).where(selection.where())
    found = int(repository.database.read(lambda conn: conn.execute(query).scalar_one()))
    if selection.session_ids and found < len(set(selection.session_ids)):
        present_query = select(S.id).where(selection.where())
        present = set(repository.database.read(lambda c: c.execute(present_query).scalars().all()))
        missing = sorted(set(selection.session_ids) - present)
        raise NotFound(f"no session {', '.join(repr(m) for m in missing)}")
    return found


def _session_pages(
    database: Database, where: ColumnElement[bool], page: int
) -> Iterator[list[Row[Any]]]:
    """Session rows matching ``where``, by id (a session written to meanwhile keeps its
    place, which newest-activity order would not), a page per read transaction."""
    last: str | None = None
    while True:
        query = select(sessions_table).where(where).order_by(S.id).limit(page)
        if last is not None:
            query = query.where(S.id > last)
        rows = database.read(partial(_all, query))
        if not rows:
            return
        yield rows
        last = rows[-1].id
        if len(rows) < page:
            return


def _all(query: Select[Any], conn: Connection) -> list[Row[Any]]:
    return list(conn.execute(query).all())


def _session(row: Row[Any]) -> Session:
    return Session.model_construct(**_codec.session_from_row(row))


def _snapshot(session: Session, next_seq: int) -> tuple[dict[str, Any], int]:
    """What must be equal for a stored session to be the one a record describes."""
    return session.model_dump(mode="json", by_alias=True), next_seq


# -- export ---------------------------------------------------------------------------


class ExportReport(BaseModel):
    """What one export wrote."""

    model_config = ConfigDict(frozen=True)

    sessions: int = 0
    messages: int = 0
    #: Sessions deleted between being listed and being read (not in the file).
    vanished: int = 0


class _ExportWriter:
    """Writes the records of the format above to a binary stream."""

    def __init__(self, repository: SessionRepository, out: IO[bytes]) -> None:
        self._repository = repository
        self._out = out
        self.sessions = 0
        self.messages = 0
        self.vanished = 0

    def _write(self, record: dict[str, Any]) -> None:
        self._out.write(dump_json(record).encode("utf-8") + b"\n")

    def header(self) -> None:
        self._write(
            {
                "type": "header",
                "format": EXPORT_FORMAT,
                "version": EXPORT_VERSION,
                "exported_at": utcnow().isoformat().replace("+00:00", "Z"),
            }
        )

    def session(self, row: Row[Any]) -> Session | None:
        """Write one session and its messages; ``None`` when it was deleted meanwhile."""
        session = _session(row)
        next_seq = int(row.next_seq)
        after = 0
        written = False
        while True:
            try:
                page = self._repository.load_transcript(
                    session.id, after_seq=after, before_seq=next_seq, limit=_PAGE
                )
            except NotFound:
                if not written:
                    self.vanished += 1
                    return None
                raise RepoError(
                    f"session {session.id!r} was deleted while it was being exported"
                ) from None
            if not written:
                self._write(
                    {
                        "type": "session",
                        "next_seq": next_seq,
                        "session": session.model_dump(mode="json", by_alias=True),
                    }
                )
                written = True
            for message in page:
                self._write(_message_record(message))
            self.messages += len(page)
            if len(page) < _PAGE:
                break
            after = page[-1].seq
        self.sessions += 1
        return session

    def trailer(self) -> None:
        self._write({"type": "end", "sessions": self.sessions, "messages": self.messages})

    def sync(self) -> None:
        """Make what was written durable (a file), or at least handed on (a pipe)."""
        self._out.flush()
        # A pipe, a terminal, an in-memory buffer: nothing to sync.
        with contextlib.suppress(OSError, ValueError, AttributeError):
            os.fsync(self._out.fileno())

    def report(self) -> ExportReport:
        return ExportReport(sessions=self.sessions, messages=self.messages, vanished=self.vanished)


def _message_record(message: StoredMessage) -> dict[str, Any]:
    return {
        "type": "message",
        "session_id": message.session_id,
        "seq": message.seq,
        "message": message.model_dump(mode="json", exclude={"session_id", "seq"}),
    }


def export_sessions(
    repository: SessionRepository,
    out: IO[bytes],
    selection: Selection | None = None,
    *,
    on_session: Callable[[Session], None] | None = None,
) -> ExportReport:
    """Write the selected sessions and their messages to ``out`` (see the module
    docstring), streaming: a page of sessions and a page of messages at a time.

    Args:
        out: a binary stream; it is flushed (and synced when it is a file) at the end.
        selection: which sessions (default: all).
        on_session: called after each session is written (progress).

    Raises:
        NotFound: a session id given in the selection does not exist.
    """
    selection = selection or Selection()
    if selection.session_ids:
        count_sessions(repository, selection)  # refuse a missing id before writing
    writer = _ExportWriter(repository, out)
    writer.header()
    for rows in _session_pages(repository.database, selection.where(), _PAGE):
        for row in rows:
            session = writer.session(row)
            if session is not None and on_session is not None:
                on_session(session)
    writer.trailer()
    writer.sync()
    return writer.report()


# -- import ---------------------------------------------------------------------------


class ImportReport(BaseModel):
    """What one import did."""

    model_config = ConfigDict(frozen=True)

    #: Sessions the target did not have: recreated exactly.
    sessions_restored: int = 0
    #: Sessions the target already had as exported (given only their missing messages).
    sessions_present: int = 0
    #: Sessions the target had with changes of its own: missing messages appended.
    sessions_merged: int = 0
    messages_inserted: int = 0
    #: Messages whose key the target already had, with the same content.
    messages_present: int = 0
    #: Messages whose key the target had with different content (the target's kept).
    messages_conflicting: int = 0
    #: Whether the file ended with its ``end`` record (``False``: it was cut short).
    complete: bool = False

    @property
    def sessions(self) -> int:
        return self.sessions_restored + self.sessions_present + self.sessions_merged


@dataclass
class _Pending:
    """The session being imported and its messages not written yet."""

    session: Session
    next_seq: int
    #: ``restored`` / ``present`` / ``merged`` once its first batch is written.
    outcome: str | None = None
    last_seq: int = 0
    batch: list[tuple[int, Message]] = field(default_factory=list)


@dataclass(frozen=True)
class _Restored:
    """What one restore transaction did (counted only once it has committed)."""

    created: bool
    #: ``(seq, content)`` of each message inserted, in ``seq`` order.
    inserted: list[tuple[int, Any]] = field(default_factory=list)
    present: int = 0
    conflicting: int = 0


class _Importer:
    def __init__(self, repository: SessionRepository) -> None:
        self._repository = repository
        self._database = repository.database
        dialect = self._database.dialect
        self._insert_session = dialect.insert_ignoring(sessions_table, ["id"])
        self._insert_messages = dialect.insert_ignoring(
            _codec.encoded_messages,  # type: ignore[arg-type]
            ["session_id", "client_msg_uuid"],
        )
        self._search = SearchIndex(self._database)
        self.counts: dict[str, int] = {}

    def _add(self, name: str, amount: int = 1) -> None:
        self.counts[name] = self.counts.get(name, 0) + amount

    def flush(self, pending: _Pending) -> None:
        batch, pending.batch = pending.batch, []
        if pending.outcome != "merged":
            restored = self._database.write(partial(self._restore, pending, batch))
            if restored is not None:
                if pending.outcome is None:
                    pending.outcome = "restored" if restored.created else "present"
                    self._add(f"sessions_{pending.outcome}")
                self._add("messages_inserted", len(restored.inserted))
                self._add("messages_present", restored.present)
                self._add("messages_conflicting", restored.conflicting)
                return
            if pending.outcome is not None:  # restored until now, changed by a writer since
                self._add(f"sessions_{pending.outcome}", -1)
            self._add("sessions_merged")
            pending.outcome = "merged"
        if batch:
            result = self._repository.append(pending.session.id, [m for _, m in batch])
            self._add("messages_inserted", len(result.inserted))
            self._add("messages_present", len(result.duplicates))
            self._add("messages_conflicting", len(result.conflicts))

    def _index(self, conn: Connection, session_id: str, inserted: list[tuple[int, Any]]) -> None:
        """Index restored messages as ``append`` indexes its own: in the same transaction,
        in runs of consecutive ``seq`` (a failure marks the index stale, never fails the
        restore)."""
        start = 0
        for end in range(1, len(inserted) + 1):
            if end == len(inserted) or inserted[end][0] != inserted[end - 1][0] + 1:
                run = inserted[start:end]
                self._search.index_in_transaction(
                    conn, session_id, run[0][0], [content for _, content in run]
                )
                start = end

    def _restore(
        self, pending: _Pending, batch: list[tuple[int, Message]], conn: Connection
    ) -> _Restored | None:
        """Write the batch at its exported ``seq`` when the stored session is the one
        exported; ``None`` (nothing written) when it differs."""
        session = pending.session
        sid = session.id
        row = _codec.session_row(session) | {"next_seq": pending.next_seq}
        created = conn.execute(self._insert_session.values(**row).returning(S.id)).first()
        # Locked as an appender locks it: nobody adds to the session until we commit.
        current = conn.execute(select(sessions_table).where(S.id == sid).with_for_update()).one()
        if _snapshot(_session(current), int(current.next_seq)) != _snapshot(
            session, pending.next_seq
        ):
            return None
        if not batch:
            return _Restored(created=created is not None)
        _, rows = _codec.prepare_messages([message for _, message in batch])
        keys = [encoded["client_msg_uuid"] for encoded in rows]
        seqs = [seq for seq, _ in batch]
        stored = conn.execute(
            select(M.client_msg_uuid, M.content_hash, M.seq).where(
                M.session_id == sid, M.client_msg_uuid.in_(keys) | M.seq.in_(seqs)
            )
        ).all()
        hashes = {key: digest for key, digest, _ in stored}
        taken = {seq: key for key, _, seq in stored}
        fresh = []
        inserted = []
        present = conflicting = 0
        for (seq, message), encoded in zip(batch, rows, strict=True):
            key = encoded["client_msg_uuid"]
            if key in hashes:
                if hashes[key] == encoded["content_hash"]:
                    present += 1
                else:
                    conflicting += 1
            elif seq in taken:
                raise RepoError(
                    f"session {sid!r}: seq {seq} already holds message {taken[seq]} in this "
                    f"database, not {key}; the export and the database disagree"
                )
            else:
                fresh.append(
                    {name: encoded[name] for name in MESSAGE_COLUMNS}
                    | {"session_id": sid, "seq": seq}
                )
                inserted.append((seq, message.content))
        if fresh:
            result = conn.execute(
                self._insert_messages, fresh, execution_options={"preserve_rowcount": True}
            )
            if result.rowcount != len(fresh):
                raise RepoError(f"session {sid!r}: a message was stored while it was locked")
            self._index(conn, sid, inserted)
        return _Restored(
            created=created is not None,
            inserted=inserted,
            present=present,
            conflicting=conflicting,
        )


def import_sessions(
    repository: SessionRepository,
    stream: IO[bytes],
    *,
    batch_size: int = MAX_BATCH,
    on_progress: Callable[[int], None] | None = None,
) -> ImportReport:
    """Import an export (see the module docstring). Idempotent: a second import of the
    same file inserts nothing.

    Stops at the first line that is not a valid record (what came before stays
    imported; fix the file and run it again).

    Args:
        stream: the export, as bytes.
        batch_size: messages per transaction, at most :data:`MAX_BATCH`.
        on_progress: called with the number of bytes of each line read.

    Raises:
        BadExportFile: the stream is not an export, or a line is damaged.
        InvalidMessage: ``batch_size`` is out of range.
    """
    if not 1 <= batch_size <= MAX_BATCH:
        raise InvalidMessage("batch_size", f"must be between 1 and {MAX_BATCH}")
    importer = _Importer(repository)
    pending: _Pending | None = None
    seen_sessions = seen_messages = 0
    complete = False
    number = 0
    for number, record in _records(stream, on_progress):
        kind = record.get("type")
        if complete:
            raise BadExportFile(f"line {number}: a record after the end record")
        if number == 1:
            _check_header(record)
            continue
        if kind == "session":
            if pending is not None:
                importer.flush(pending)
            pending = _session_record(record, number)
            seen_sessions += 1
        elif kind == "message":
            if pending is None:
                raise BadExportFile(f"line {number}: a message before any session")
            seq, message = _message_from_record(record, number, pending)
            pending.batch.append((seq, message))
            pending.last_seq = seq
            seen_messages += 1
            if len(pending.batch) >= batch_size:
                importer.flush(pending)
        elif kind == "end":
            if pending is not None:
                importer.flush(pending)
                pending = None
            if (record.get("sessions"), record.get("messages")) != (seen_sessions, seen_messages):
                raise BadExportFile(
                    f"line {number}: the end record counts {record.get('sessions')} sessions "
                    f"and {record.get('messages')} messages, the file holds {seen_sessions} "
                    f"and {seen_messages}"
                )
            complete = True
        else:
            raise BadExportFile(f"line {number}: unknown record type {kind!r}")
    if number == 0:
        raise BadExportFile("the file is empty, not a sessionrepo export")
    if pending is not None:
        importer.flush(pending)
    return ImportReport(**importer.counts, complete=complete)


def _records(
    stream: IO[bytes], on_progress: Callable[[int], None] | None
) -> Iterator[tuple[int, dict[str, Any]]]:
    number = 0
    for raw in stream:  # a binary stream splits on b"\n" only
        number += 1
        if on_progress is not None:
            on_progress(len(raw))
        if not raw.strip():
            continue
        try:
            record = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            what = "not a sessionrepo export" if number == 1 else "damaged"
            raise BadExportFile(f"line {number}: {what} (not JSON: {exc})") from None
        if not isinstance(record, dict):
            raise BadExportFile(f"line {number}: a record must be a JSON object")
        yield number, record


def _check_header(record: dict[str, Any]) -> None:
    if record.get("type") != "header" or record.get("format") != EXPORT_FORMAT:
        raise BadExportFile(
            "line 1: not a sessionrepo export (it starts without the "
            f'{{"type": "header", "format": "{EXPORT_FORMAT}"}} record)'
        )
    version = record.get("version")
    if version != EXPORT_VERSION:
        raise BadExportFile(
            f"line 1: export format version {version!r}; this sessionrepo reads version "
            f"{EXPORT_VERSION} (a newer sessionrepo wrote it: upgrade sessionrepo)"
        )


def _session_record(record: dict[str, Any], number: int) -> _Pending:
    next_seq = record.get("next_seq")
    if type(next_seq) is not int or not 1 <= next_seq <= _MAX_SEQ:
        raise BadExportFile(f"line {number}: next_seq must be a positive integer")
    try:
        session = Session.model_validate(record.get("session"))
    except ValidationError as exc:
        problem = _codec.invalid_from_validation(exc, "session")
        raise BadExportFile(f"line {number}: {problem}") from None
    return _Pending(session=session, next_seq=next_seq)


def _message_from_record(
    record: dict[str, Any], number: int, pending: _Pending
) -> tuple[int, Message]:
    sid = pending.session.id
    if record.get("session_id") != sid:
        raise BadExportFile(
            f"line {number}: a message of session {record.get('session_id')!r} among "
            f"those of {sid!r}"
        )
    seq = record.get("seq")
    if type(seq) is not int or not pending.last_seq < seq < pending.next_seq:
        raise BadExportFile(
            f"line {number}: seq {seq!r} is out of order (after {pending.last_seq}, before "
            f"the session's next_seq {pending.next_seq})"
        )
    body = record.get("message")
    if not isinstance(body, dict):
        raise BadExportFile(f"line {number}: the message record has no message object")
    try:
        message = Message.model_validate(body)
    except ValidationError as exc:
        problem = _codec.invalid_from_validation(exc, "message")
        raise BadExportFile(f"line {number}: {problem}") from None
    return seq, message


# -- prune ----------------------------------------------------------------------------


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


UNITS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86_400}


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


def prunable(cutoff: datetime) -> ColumnElement[bool]:
    """Ended sessions whose end and last activity are both before ``cutoff``."""
    return and_(S.ended_at.is_not(None), S.ended_at < cutoff, S.last_active_at < cutoff)


def count_prunable(repository: SessionRepository, cutoff: datetime) -> int:
    """How many sessions :func:`prune_sessions` would delete now (for a progress bar)."""
    query = select(func.count()).select_from(sessions_table).where(prunable(cutoff))
    return int(repository.database.read(lambda conn: conn.execute(query).scalar_one()))


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
    if cutoff.tzinfo is None:
        raise InvalidMessage("cutoff", "must be timezone-aware")
    if not 1 <= batch_size <= 1000:
        raise InvalidMessage("batch_size", "must be between 1 and 1000")
    database = repository.database
    writer = _ExportWriter(repository, export_to) if export_to is not None else None
    if writer is not None:
        writer.header()
    deleted: list[str] = []
    kept: list[str] = []
    messages = 0
    outbox: dict[str, int] = {}
    for rows in _session_pages(database, prunable(cutoff), batch_size):
        listed = {row.id: row for row in rows}
        if writer is not None:
            # Sessions deleted meanwhile are neither exported nor ours to report.
            listed = {row.id: row for row in rows if writer.session(row) is not None}
            writer.sync()  # on disk before anything it holds is deleted
        if dry_run:
            batch = [_session(row) for row in listed.values()]
            messages += database.read(partial(_count_messages, list(listed)))
        else:
            outcome = database.write(
                partial(_delete_batch, database.dialect, listed, cutoff, exact=writer is not None)
            )
            batch = outcome.sessions
            kept += outcome.kept
            messages += outcome.messages
            outbox.update(outcome.outbox)
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


def _count_messages(ids: Sequence[str], conn: Connection) -> int:
    if not ids:
        return 0
    query = select(func.count()).select_from(messages_table).where(M.session_id.in_(ids))
    return int(conn.execute(query).scalar_one())


@dataclass(frozen=True)
class _Deleted:
    sessions: list[Session]
    #: Listed, but no longer prunable (or changed since exported): kept.
    kept: list[str]
    messages: int
    #: ``pending_outbox`` rows per deleted session that has any.
    outbox: dict[str, int]


def _delete_batch(
    dialect: BackendDialect,
    listed: dict[str, Row[Any]],
    cutoff: datetime,
    conn: Connection,
    *,
    exact: bool,
) -> _Deleted:
    """Delete the listed sessions still prunable (and, if ``exact``, unchanged)."""
    if not listed:
        return _Deleted([], [], 0, {})
    current = conn.execute(
        select(sessions_table)
        .where(S.id.in_(list(listed)), prunable(cutoff))
        .order_by(S.id)
        .with_for_update()
    ).all()
    chosen = [
        row
        for row in current
        if not exact
        or _snapshot(_session(row), int(row.next_seq))
        == _snapshot(_session(listed[row.id]), int(listed[row.id].next_seq))
    ]
    ids = [row.id for row in chosen]
    kept = sorted(set(listed) - set(ids))
    if not ids:
        return _Deleted([], kept, 0, {})
    # Explicit, not left to ON DELETE CASCADE alone: the count is reported, and it holds
    # on a connection where SQLite's foreign keys were left off.
    removed = conn.execute(
        delete(messages_table).where(M.session_id.in_(ids)),
        execution_options={"preserve_rowcount": True},
    ).rowcount
    conn.execute(delete(sessions_table).where(S.id.in_(ids)))
    dialect.forget_search_documents(conn, ids)
    parked = conn.execute(
        select(O.session_id, func.count()).where(O.session_id.in_(ids)).group_by(O.session_id)
    ).all()
    return _Deleted(
        sessions=[_session(row) for row in chosen],
        kept=kept,
        messages=int(removed),
        outbox={sid: int(count) for sid, count in parked},
    )


# -- doctor ---------------------------------------------------------------------------


class DoctorReport(BaseModel):
    """Everything ``doctor`` found, and its verdict."""

    model_config = ConfigDict(frozen=True)

    database: str
    backend: str | None
    #: Where the outbox that was checked lives (``"primary"``: its ``pending_outbox``).
    outbox: str
    checks: list[Check]

    @property
    def failures(self) -> list[Check]:
        return [check for check in self.checks if check.status == "fail"]

    @property
    def warnings(self) -> list[Check]:
        return [check for check in self.checks if check.status == "warn"]

    @property
    def healthy(self) -> bool:
        return not self.failures


@dataclass
class _Probe:
    """What the checks share, filled in as they run."""

    url: URL
    outbox_url: str | None
    max_outbox_age: float
    database: Database | None = None
    #: The schema revision (``None``: empty); meaningful once ``schema`` has run.
    connected: bool = False
    revision: str | None = None
    extra: list[Database] = field(default_factory=list)


def missing_sqlite_file(url: str | URL | None) -> Path | None:
    """The path of a SQLite database file that does not exist (opening would create
    it, empty); ``None`` for an existing file or another backend."""
    parsed = normalize_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    path = Path(parsed.database)
    return None if path.exists() else path


def _check_connection(probe: _Probe) -> Iterator[Check]:
    missing = missing_sqlite_file(probe.url)
    if missing is not None:
        yield Check(
            name="connection",
            status="fail",
            detail=f"no database file at {missing}",
            fix="check --url / SESSIONREPO_DATABASE_URL; `sessionrepo migrate` creates a new "
            "store there",
        )
        return
    database = Database(probe.url)
    probe.database = database
    started = time.perf_counter()
    version = database.read(database.dialect.server_version)
    elapsed = (time.perf_counter() - started) * 1000
    probe.connected = True
    name = "SQLite" if database.backend == "sqlite" else "PostgreSQL"
    yield Check(name="connection", status="ok", detail=f"{name} {version}, {elapsed:.0f} ms")


_MIGRATE_FIX: Final = "run `sessionrepo migrate` with the same --url / SESSIONREPO_DATABASE_URL"


def _check_schema(probe: _Probe) -> Iterator[Check]:
    assert probe.database is not None
    head = schema.head_revision()
    current = schema.current_revision(probe.database)
    probe.revision = current
    if current == head:
        yield Check(name="schema", status="ok", detail=f"at revision {head} (head)")
    elif current is None:
        yield Check(
            name="schema",
            status="fail",
            detail=f"empty database (no schema); this sessionrepo needs revision {head}",
            fix=_MIGRATE_FIX,
        )
    elif current not in _known_revisions():
        yield Check(
            name="schema",
            status="fail",
            detail=f"at revision {current}, unknown to this sessionrepo (its head is {head}): "
            "a newer sessionrepo migrated it",
            fix="upgrade sessionrepo",
        )
    else:
        yield Check(
            name="schema",
            status="fail",
            detail=f"at revision {current}; this sessionrepo needs {head} (out of date: "
            "gateways on PostgreSQL refuse to open it)",
            fix=_MIGRATE_FIX,
        )


def _known_revisions() -> set[str]:
    scripts = ScriptDirectory.from_config(schema.alembic_config())
    return {script.revision for script in scripts.walk_revisions()}


def _check_settings(probe: _Probe) -> Iterator[Check]:
    assert probe.database is not None
    dialect = probe.database.dialect
    settings = probe.database.read(dialect.settings)
    for check in dialect.judge_settings(settings):
        yield check.model_copy(update={"name": f"{dialect.name}.{check.name}"})


def _check_outbox(probe: _Probe) -> Iterator[Check]:
    if probe.outbox_url is None:
        if probe.database is None or not probe.connected:
            yield Check(name="outbox", status="skip", detail="no connection")
            return
        if probe.revision is None:
            yield Check(name="outbox", status="skip", detail="no schema, so no outbox table")
            return
        database = probe.database
    else:
        missing = missing_sqlite_file(probe.outbox_url)
        if missing is not None:
            yield Check(
                name="outbox",
                status="fail",
                detail=f"no outbox file at {missing}",
                fix="check --outbox-url / SESSIONREPO_OUTBOX_URL (a TranscriptWriter "
                "creates the file when it starts)",
            )
            return
        database = Database(probe.outbox_url)
        probe.extra.append(database)
        if schema.current_revision(database) is None:
            yield Check(
                name="outbox",
                status="fail",
                detail="not a sessionrepo outbox (no schema)",
                fix="check --outbox-url / SESSIONREPO_OUTBOX_URL",
            )
            return
    try:
        health = Outbox(database).status(limit=1)
    except RepoError:
        if probe.outbox_url is None and probe.revision != schema.head_revision():
            yield Check(name="outbox", status="skip", detail="unreadable until migrated")
            return
        raise
    age = _duration(health.oldest_pending_age)
    detail = f"{health.pending:,} pending, {health.dead:,} dead"
    if health.pending:
        detail += f" (oldest {age} old)"
    if health.dead:
        yield Check(
            name="outbox",
            status="fail",
            detail=detail,
            fix="see `sessionrepo outbox status`; fix the cause, then "
            "`sessionrepo outbox retry-dead`",
        )
    elif health.pending and health.oldest_pending_age > probe.max_outbox_age:
        yield Check(
            name="outbox",
            status="fail",
            detail=f"{detail}: older than {_duration(probe.max_outbox_age)}",
            fix="is a gateway's drainer running and the primary reachable? "
            "`sessionrepo outbox drain` replays by hand",
        )
    elif health.pending:
        yield Check(
            name="outbox",
            status="warn",
            detail=f"{detail}: messages waiting for the primary",
            fix="they replay on their own; `sessionrepo outbox status` shows why they wait",
        )
    else:
        yield Check(name="outbox", status="ok", detail=detail)


def _duration(seconds: float) -> str:
    whole = max(int(seconds), 0)
    for unit, size in (("d", 86_400), ("h", 3600), ("m", 60)):
        if whole >= size:
            return f"{whole // size}{unit}"
    return f"{whole}s"


#: The checks ``doctor`` runs, in order; each yields its findings. A check that needs the
#: connection is skipped when ``connection`` failed; an error raised by a check becomes a
#: ``fail`` finding under its name.
#:
#: Issue 4 (search): add the search-index health check here, after "outbox"
#: (``repo.search.SearchIndex(database).state()``: ``stale`` fails, fix ``reindex``).
def _check_search_index(probe: _Probe) -> Iterator[Check]:
    assert probe.database is not None
    if probe.revision != schema.head_revision():
        yield Check(name="search", status="skip", detail="schema not at head")
        return
    index = SearchIndex(probe.database)
    state, reason = index.state()
    backlog = index.backlog()
    if state != "ok":
        yield Check(
            name="search",
            status="fail",
            detail=f"full-text index is {state}: {reason} (search refuses; writes are fine)",
            fix="sessionrepo reindex",
        )
    elif backlog:
        # Normal between catch-ups; each search indexes it first, so nothing is missed.
        yield Check(
            name="search",
            status="ok",
            detail=f"full-text index in step; {backlog:,} messages wait for indexing "
            "(the next search or drainer round indexes them)",
        )
    else:
        yield Check(name="search", status="ok", detail="full-text index in step, backlog empty")


DOCTOR_CHECKS: Final[list[tuple[str, Callable[[_Probe], Iterable[Check]], bool]]] = [
    # (name, check, needs the connection)
    ("connection", _check_connection, False),
    ("schema", _check_schema, True),
    ("settings", _check_settings, True),
    ("outbox", _check_outbox, False),
    ("search", _check_search_index, True),
]


def run_doctor(
    url: str | URL | None = None,
    *,
    outbox_url: str | None = None,
    max_outbox_age: float = 3600.0,
) -> DoctorReport:
    """Check a store's health; never changes it (no migration, no file created).

    Args:
        url: the primary database (default: as :func:`repo.open_repository`).
        outbox_url: a separate outbox (a gateway's ``TranscriptWriter(outbox_url=...)``);
            ``None`` checks the primary's ``pending_outbox``.
        max_outbox_age: seconds a pending outbox row may wait before it is a failure.
    """
    probe = _Probe(url=normalize_url(url), outbox_url=outbox_url, max_outbox_age=max_outbox_age)
    checks: list[Check] = []
    try:
        for name, check, needs_connection in DOCTOR_CHECKS:
            if needs_connection and not probe.connected:
                checks.append(Check(name=name, status="skip", detail="no connection"))
                continue
            try:
                checks.extend(check(probe))
            except RepoError as exc:
                checks.append(Check(name=name, status="fail", detail=" ".join(str(exc).split())))
    finally:
        for database in [probe.database, *probe.extra]:
            if database is not None:
                database.dispose()
    return DoctorReport(
        database=safe_url(probe.url),
        backend=probe.url.get_backend_name(),
        outbox="primary" if outbox_url is None else safe_url(normalize_url(outbox_url)),
        checks=checks,
    )
