"""The key of every Hermes message: one per logical message, whatever route it took.

A message with a ``message_uid`` gets :func:`uid_key` (and its compaction copies
:func:`copy_key`); one without gets :func:`content_key`. :class:`SessionKeys` hands them
out for one session in transcript order (rows in ``id`` order, then the spool in replay
order), which is what keeps a content key stable across a Hermes restart.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import uuid
from typing import Any, Final, Literal

#: The uuid5 namespace of every key this importer makes (see :func:`uid_key`).
NAMESPACE: Final = uuid.UUID("0b4f6c1e-8a57-5d0c-9e3a-6d2f1b7c4a90")

#: What a key was derived from: ``uid``, ``content``; ``replayed``: the key of the spool
#: message an earlier import stored, which a Hermes restart turned into this row;
#: ``duplicate``: a second live row of one uid (not stored).
KeyKind = Literal["uid", "content", "replayed", "duplicate"]


def uid_key(message_uid: str) -> uuid.UUID:
    """The key of the message a Hermes ``message_uid`` names (its first row)."""
    return uuid.uuid5(NAMESPACE, "message_uid:" + message_uid)


def copy_key(message_uid: str, rank: int) -> uuid.UUID:
    """The key of the ``rank``-th later row of a session carrying ``message_uid`` (a copy
    made by compaction; the first row has :func:`uid_key`)."""
    return uuid.uuid5(NAMESPACE, f"message_uid:{message_uid}:copy:{rank}")


def content_key(session_id: Any, role: Any, content: Any, occurrence: int) -> uuid.UUID:
    """The key of a message without a uid: the ``occurrence``-th message (from 0) of its
    session with this role and content, in transcript order.

    ``content`` is the decoded value (text, or the JSON content parts). ``repr`` and
    ASCII-escaped JSON keep it deterministic for any value (lone surrogates too).
    """
    text = json.dumps(content, ensure_ascii=True, default=repr)
    return uuid.uuid5(NAMESPACE, f"content:{session_id!r}:{role!r}:{occurrence}:{text}")


def fingerprint(role: Any, content: Any) -> str:
    """What two messages must share to count as equal for :func:`content_key`."""
    return json.dumps([role, content], ensure_ascii=True, default=repr)


@dataclasses.dataclass
class SessionKeys:
    """How one Hermes session's messages are keyed, in transcript order (rows in ``id``
    order, then the spool in replay order)."""

    raw_session: Any
    #: Rows kept so far per ``message_uid`` (the first one is the message, later ones copies).
    uid_rows: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    #: ``message_uid``s a live row of the session carries so far.
    live_uids: set[str] = dataclasses.field(default_factory=set)
    #: Messages seen so far per (role, content).
    seen: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    #: (role, content) of the rows, for spotting a spool message equal to a row.
    row_prints: set[str] = dataclasses.field(default_factory=set)

    def count(self, role: Any, content: Any) -> int:
        """How many messages with this role and content came before; counts this one."""
        seen_as = fingerprint(role, content)
        occurrence = self.seen[seen_as]
        self.seen[seen_as] += 1
        return occurrence

    def for_row(
        self, uid: Any, role: Any, content: Any, *, live: bool
    ) -> tuple[uuid.UUID, KeyKind, uuid.UUID]:
        """The key of a row, and its kind: ``uid``, ``content``, or ``duplicate`` (a second
        live row of a uid whose earlier row is still live: not a compaction copy, which
        replaces an archived row, but the same message stored twice, as Hermes' own spool
        replay does when it crashed between its insert and deleting the file); last, the
        key the row would have without its uid (what a spool message in its place had)."""
        occurrence = self.count(role, content)  # a duplicate too: the spool copy counted
        self.row_prints.add(fingerprint(role, content))
        by_content = content_key(self.raw_session, role, content, occurrence)
        if isinstance(uid, str) and uid:
            if live and uid in self.live_uids:
                return uid_key(uid), "duplicate", by_content
            if live:
                self.live_uids.add(uid)
            rank = self.uid_rows[uid]
            self.uid_rows[uid] += 1
            return (uid_key(uid) if rank == 0 else copy_key(uid, rank)), "uid", by_content
        return by_content, "content", by_content

    def for_spool(self, uid: Any, role: Any, content: Any) -> tuple[uuid.UUID, KeyKind]:
        """The key of a spool message, and its kind (``uid`` or ``content``)."""
        occurrence = self.count(role, content)
        if isinstance(uid, str) and uid:
            # Never a copy: a spooled message whose uid a row has is that row (a replay
            # that crashed before deleting its file).
            return uid_key(uid), "uid"
        return content_key(self.raw_session, role, content, occurrence), "content"
