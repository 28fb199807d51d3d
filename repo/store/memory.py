"""What the append path remembers between flushes, bounded in bytes, holding no content.

A gateway flushes its whole transcript again and again (each turn, each exit path). What
makes such a re-flush nearly free lives here: **which messages the database acknowledged
storing in a session, as they are now**, so a re-flush neither validates, encodes nor
sends them again while the session's newest remembered row is still stored where it was
(one probe, or the dialect's check inside its statement, instead of one per message: the
database stays the authority).

"As they are now" is proved without keeping the caller's content:

- a message dict by a **digest** (BLAKE2b, 16 bytes) of its pickled form, taken before it
  was validated and compared with the dict's digest at the next flush: any change since,
  deep inside too, a value of another type (``1`` for ``1.0``) or a reordered key, is a
  new digest, so the message is validated again and a re-send with other content is
  still reported as a conflict;
- a validated ``Message`` (frozen) by a **weak reference**: that same object, while the
  caller keeps it.

An entry is the key, its proof, the UUID and the session's era: about 300 bytes
(:data:`ENTRY_BYTES`, measured with ``tracemalloc``) whatever the message's size. Each
session's newest acknowledged row (its tip, :data:`TIP_BYTES`) counts too. The bound
(:attr:`SentMemory.limit`, ``open_repository(append_memory=...)``) is over both; past it
the oldest entries (or, when tips hold more, the oldest tips) are forgotten first; ``0``
turns it off. Forgetting costs speed only (a re-flush validates and sends again; the key
keeps it a no-op), never correctness.
"""

from __future__ import annotations

import hashlib
import pickle
import threading
import weakref
from collections.abc import Iterable
from typing import Any, Final
from uuid import UUID

from sessionrepo.models import Message

#: The default bound of :class:`SentMemory`, in bytes.
DEFAULT_MEMORY_BYTES: Final = 64 * 1024 * 1024
#: Bytes an entry holds (its place in the table, the key it shares with the caller, the
#: digest or weak reference, the UUID, the era), measured with ``tracemalloc`` over
#: 100,000 entries (``tests/store/test_memory.py`` checks it from above).
ENTRY_BYTES: Final = 320
#: Bytes a session's tip holds (its id, seq, key and era), measured likewise.
TIP_BYTES: Final = 320

#: A proof that a message is unchanged: a digest of a dict, a weak reference to a Message.
Proof = bytes | weakref.ReferenceType[Message]


def digest(item: dict[str, Any]) -> bytes | None:
    """The proof of a message dict's content: equal only for a dict pickled the same (its
    keys in order, every value of the same type and value); ``None`` when it cannot be
    pickled (such a dict is not remembered)."""
    try:
        return hashlib.blake2b(pickle.dumps(item, 5), digest_size=16).digest()
    except Exception:  # anything a value's own __reduce__ raises
        return None


def proof_of(item: Any) -> Proof | None:
    """What proves ``item`` unchanged at a later flush (see :func:`digest`), if anything."""
    if type(item) is dict:
        return digest(item)
    if type(item) is Message:
        return weakref.ref(item)
    return None


class SentMemory:
    """Acknowledged messages and per-session tips, bounded in bytes (see the module's
    docstring). Thread-safe for its writers; readers check every entry they use."""

    def __init__(self, limit: int = DEFAULT_MEMORY_BYTES) -> None:
        #: The bound, in bytes (``0``: nothing is remembered).
        self.limit = limit
        self._lock = threading.Lock()
        #: By the caller's key (a dict's ``client_msg_uuid`` text, a Message's UUID),
        #: oldest first: ``(proof, uuid, era)``.
        self.entries: dict[Any, tuple[Proof, UUID, int]] = {}
        #: Per session, least recently acknowledged first: ``(seq, key, era)`` of the
        #: newest row this process inserted (read by the codec's one pass).
        self.tips_by_session: dict[str, tuple[int, UUID, int]] = {}
        self._eras = 0

    @property
    def size(self) -> int:
        """Bytes held now (entries and tips, as :data:`ENTRY_BYTES` and :data:`TIP_BYTES`)."""
        return len(self.entries) * ENTRY_BYTES + len(self.tips_by_session) * TIP_BYTES

    @property
    def tips(self) -> int:
        """Sessions whose tip is remembered."""
        return len(self.tips_by_session)

    def clear(self) -> None:
        with self._lock:
            self.entries.clear()
            self.tips_by_session.clear()

    # -- before a write -----------------------------------------------------------------

    def era(self, session_id: str) -> int | None:
        """The session's era: entries acknowledged in it count for the session (``None``:
        nothing is remembered of it)."""
        tip = self.tips_by_session.get(session_id)
        return None if tip is None else tip[2]

    def tip(self, session_id: str, era: int) -> tuple[int, UUID] | None:
        """``(seq, key)`` of the session's tip, when its era is still ``era``."""
        tip = self.tips_by_session.get(session_id)
        return None if tip is None or tip[2] != era else (tip[0], tip[1])

    # -- after a write --------------------------------------------------------------------

    def acknowledge(
        self,
        session_id: str,
        stored: Iterable[tuple[Any, Proof, UUID]],
        tip: tuple[int, UUID] | None,
    ) -> None:
        """The database stored the ``(key, proof, uuid)`` messages as they are in the
        session; ``tip``: the newest row this append inserted, if any."""
        if not self.limit:
            return
        with self._lock:
            current = self.tips_by_session.pop(session_id, None)
            if current is None:
                if tip is None:
                    return  # nothing of the session to check a later flush against
                self._eras += 1
                era = self._eras
            else:
                era = current[2]
            self.tips_by_session[session_id] = (*tip, era) if tip is not None else current  # type: ignore[assignment]
            entries = self.entries
            for key, proof, uuid in stored:
                entries.pop(key, None)
                entries[key] = (proof, uuid, era)
            self._evict()

    def _evict(self) -> None:
        entries, tips, limit = self.entries, self.tips_by_session, self.limit
        while len(entries) * ENTRY_BYTES + len(tips) * TIP_BYTES > limit:
            # From whichever holds more: a gateway of many short sessions keeps its
            # newest sessions' tips, one of long transcripts their messages.
            if entries and len(entries) * ENTRY_BYTES >= len(tips) * TIP_BYTES:
                del entries[next(iter(entries))]
            else:
                del tips[next(iter(tips))]

    def forget_session(self, session_id: str) -> None:
        """Forget what was acknowledged in the session (its newest row is gone): the
        next era's acknowledgements do not count the old ones."""
        with self._lock:
            self.tips_by_session.pop(session_id, None)
