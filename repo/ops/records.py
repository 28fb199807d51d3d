"""The JSON Lines records an export and a backup share, read and checked once.

An export (:mod:`.export`, read by :mod:`.restore`) and a backup (:mod:`.backup`) hold
the same ``session``, ``message`` and ``usage`` records; what reads them lives here, and
raises the reader's own error (``BadExportFile`` or ``BadBackupFile``) naming the line.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import IO, Any, Final

from pydantic import BaseModel, ConfigDict, ValidationError

from sessionrepo.errors import RepoError
from sessionrepo.models import Session, StoredMessage
from sessionrepo.models.tables import dump_json
from sessionrepo.models.usage import Usage
from sessionrepo.store.codec import invalid_from_validation
from sessionrepo.store.repository import SessionSnapshot

#: Largest ``seq`` (``BIGINT``).
MAX_SEQ: Final = 2**63 - 1

#: The error a reader raises: the file's kind, and the message (with its line).
Bad = Callable[[str], RepoError]


class RestoredCounts(BaseModel):
    """What putting back a file's messages and usage records did (an import's, a
    restore's report)."""

    model_config = ConfigDict(frozen=True)

    messages_inserted: int = 0
    #: Messages whose key the target already had, with the same content.
    messages_present: int = 0
    #: Messages whose key the target had with different content (the target's kept).
    messages_conflicting: int = 0
    #: Messages an erasure removed from the target (its tombstones): not restored.
    messages_erased: int = 0
    #: Usage records (model calls) the target did not have: inserted.
    usage_inserted: int = 0
    #: Usage records whose key the target already had: skipped.
    usage_present: int = 0
    #: Usage records of what an erasure removed from the target (an erased message's,
    #: one made in an erased session before its erasure): not restored.
    usage_erased: int = 0


def line(record: dict[str, Any]) -> bytes:
    """One record as a line of the file."""
    return dump_json(record).encode("utf-8") + b"\n"


def message_record(message: StoredMessage) -> dict[str, Any]:
    """A stored message's ``message`` record."""
    return {
        "type": "message",
        "session_id": message.session_id,
        "seq": message.seq,
        "message": message.model_dump(mode="json", exclude={"session_id", "seq"}),
    }


def usage_record(session_id: str, usage: Usage) -> dict[str, Any]:
    """A usage record of ``session_id`` (its key and message set)."""
    return {"type": "usage", "session_id": session_id, "usage": usage.model_dump(mode="json")}


def json_lines(
    stream: IO[bytes],
    bad: Bad,
    what: str,
    *,
    on_progress: Callable[[int], None] | None = None,
) -> Iterator[tuple[int, bytes, dict[str, Any]]]:
    """Each non-blank line of ``stream`` (split on ``b"\\n"`` only), its number and the
    JSON object it holds.

    Args:
        what: the file's kind, for the first line's error ("not a sessionrepo ...").
        on_progress: called with the length of every line read, blank ones too.
    """
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
            kind = f"not a sessionrepo {what}" if number == 1 else "damaged"
            raise bad(f"line {number}: {kind} (not JSON: {exc})") from None
        if not isinstance(record, dict):
            raise bad(f"line {number}: a record must be a JSON object")
        yield number, raw, record


def read_session(record: dict[str, Any], number: int, bad: Bad) -> SessionSnapshot:
    """A ``session`` record's session and ``next_seq``."""
    next_seq = record.get("next_seq")
    if type(next_seq) is not int or not 1 <= next_seq <= MAX_SEQ:
        raise bad(f"line {number}: next_seq must be a positive integer")
    try:
        session = Session.model_validate(record.get("session"))
    except ValidationError as exc:
        raise bad(f"line {number}: {invalid_from_validation(exc, 'session')}") from None
    return SessionSnapshot(session, next_seq)


def read_message(
    record: dict[str, Any], number: int, snapshot: SessionSnapshot, last_seq: int, bad: Bad
) -> StoredMessage:
    """A ``message`` record of ``snapshot``'s session, after ``last_seq``."""
    sid = snapshot.session.id
    if record.get("session_id") != sid:
        raise bad(
            f"line {number}: a message of session {record.get('session_id')!r} among those "
            f"of {sid!r}"
        )
    seq = record.get("seq")
    if type(seq) is not int or not last_seq < seq < snapshot.next_seq:
        raise bad(
            f"line {number}: seq {seq!r} is out of order (after {last_seq}, before the "
            f"session's next_seq {snapshot.next_seq})"
        )
    body = record.get("message")
    if not isinstance(body, dict):
        raise bad(f"line {number}: the message record has no message object")
    try:
        return StoredMessage.model_validate({**body, "session_id": sid, "seq": seq})
    except ValidationError as exc:
        raise bad(f"line {number}: {invalid_from_validation(exc, 'message')}") from None


def read_usage(record: dict[str, Any], number: int, session_id: str, bad: Bad) -> Usage:
    """A ``usage`` record of ``session_id``, with its key."""
    if record.get("session_id") != session_id:
        raise bad(
            f"line {number}: a usage record of session {record.get('session_id')!r} among "
            f"those of {session_id!r}"
        )
    body = record.get("usage")
    if not isinstance(body, dict):
        raise bad(f"line {number}: the usage record has no usage object")
    try:
        usage = Usage.model_validate(body)
    except ValidationError as exc:
        raise bad(f"line {number}: {invalid_from_validation(exc, 'usage')}") from None
    if usage.usage_id is None:
        raise bad(f"line {number}: usage.usage_id: a usage record needs its key")
    return usage
