"""What the append path remembers between flushes, bounded in bytes.

A gateway flushes its whole transcript again and again (each turn, each exit path). Two
things make such a re-flush nearly free, and both live here, in one structure with one
lifetime (the repository's), so they cannot disagree about identity:

- **validated once**: what a message (a stamped dict, or a validated ``Message``) was
  validated and encoded into, reused while the dict still equals a copy of itself taken
  then (any change since, deep inside too, is a new message to validate: a re-send with
  other content is still reported as a conflict), or, for a ``Message`` (frozen), for
  that same object. Equality is Python's: a value replaced by an equal one of another
  numeric type (``1`` for ``1.0``) counts as unchanged.
- **acknowledged**: that the database stored that encoded row in a session, so a direct
  append need not send it again while the session's newest remembered row is still
  stored where it was (one probe instead of one per message: the database stays the
  authority).

An entry holds the copy of the dict's containers (sharing its strings), the validated
message and the encoded row: what the caller's message was, kept alive. So the memory is
bounded by the bytes its entries hold (:attr:`SentMemory.limit`), the oldest forgotten
first; ``0`` turns it off. Forgetting costs speed only (a re-flush validates and sends
again; the key keeps it a no-op), never correctness.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterable
from typing import Any, Final
from uuid import UUID

from sessionrepo.models import Message
from sessionrepo.models.tables import ENCODED_MARK, JSONText, messages_table

#: The default bound of :class:`SentMemory`, in bytes.
DEFAULT_MEMORY_BYTES: Final = 64 * 1024 * 1024
#: Bytes an entry costs beyond its text: the dicts, the model, the row, their keys
#: (measured with ``tracemalloc``: about 3 KiB for a chat message).
ENTRY_OVERHEAD: Final = 4096
#: Sessions whose newest acknowledged row is remembered (about 200 bytes each).
MAX_TIPS: Final = 16_384

#: Columns stored as JSON text: the message holds them parsed, several times larger.
_JSON_COLUMNS: Final = frozenset(
    column.name for column in messages_table.columns if isinstance(column.type, JSONText)
)


def entry_size(row: dict[str, Any]) -> int:
    """What remembering ``row`` (with its message and the dict's copy) holds, in bytes,
    estimated from above: the strings once (the three share them), JSON thrice (parsed
    in the message, as text in the row)."""
    size = ENTRY_OVERHEAD
    for name, value in row.items():
        if type(value) is str:
            parsed = name in _JSON_COLUMNS or value.startswith(ENCODED_MARK)
            size += sys.getsizeof(value) * (3 if parsed else 1)
    return size


class _Entry:
    __slots__ = ("ack", "message", "row", "size", "source")

    def __init__(self, source: Any, message: Message, row: dict[str, Any], size: int) -> None:
        #: A copy of the dict's containers, or the validated ``Message`` itself.
        self.source = source
        self.message = message
        self.row = row
        self.size = size
        #: ``(session, era)`` in which the database acknowledged storing ``row``.
        self.ack: tuple[str, int] | None = None


class SentMemory:
    """Validated-once messages and their acknowledgements, bounded in bytes (see the
    module's docstring). Thread-safe; every entry is checked before it is used."""

    def __init__(self, limit: int = DEFAULT_MEMORY_BYTES) -> None:
        #: The bound, in bytes (``0``: nothing is remembered).
        self.limit = limit
        self._lock = threading.Lock()
        #: By the caller's key (the dict's text, the ``Message``'s UUID), oldest first.
        self._entries: dict[Any, _Entry] = {}
        #: The same entries by ``id`` of their row: valid while the entry holds the row.
        self._by_row: dict[int, _Entry] = {}
        #: Per session: ``(seq, key, era)`` of the newest row this process inserted.
        self._tips: dict[str, tuple[int, UUID, int]] = {}
        self._size = 0
        self._eras = 0

    @property
    def size(self) -> int:
        """Bytes held now (estimated as :func:`entry_size` does)."""
        return self._size

    # -- validated once -----------------------------------------------------------------

    def recall(self, key: Any, item: Any) -> tuple[Message, dict[str, Any]] | None:
        """The message and row ``item`` (under ``key``) was made into, if unchanged."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        source = entry.source
        if source is item if isinstance(item, Message) else source == item:
            return entry.message, entry.row
        return None

    def remember(self, key: Any, source: Any, message: Message, row: dict[str, Any]) -> None:
        """Remember what ``source`` (under ``key``) was made into; the oldest entries
        are forgotten past the bound (and an entry larger than the bound is not kept)."""
        size = entry_size(row)
        if size > self.limit:
            return
        entry = _Entry(source, message, row, size)
        with self._lock:
            self._drop(self._entries.pop(key, None))
            self._entries[key] = entry
            self._by_row[id(row)] = entry
            self._size += size
            while self._size > self.limit:
                self._drop(self._entries.pop(next(iter(self._entries))))

    def _drop(self, entry: _Entry | None) -> None:
        if entry is not None:
            self._size -= entry.size
            if self._by_row.get(id(entry.row)) is entry:
                del self._by_row[id(entry.row)]

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._by_row.clear()
            self._tips.clear()
            self._size = 0

    # -- acknowledged -------------------------------------------------------------------

    def tip(self, session_id: str) -> tuple[int, UUID] | None:
        """``(seq, key)`` of the newest row this process inserted in the session."""
        tip = self._tips.get(session_id)
        return None if tip is None else (tip[0], tip[1])

    def acknowledged(
        self, session_id: str, rows: Iterable[dict[str, Any]]
    ) -> tuple[set[int], tuple[int, UUID] | None]:
        """The ``id`` of each of ``rows`` the database acknowledged storing, as it is,
        in the session (since the session's tip was last set), and that tip (``None``
        when none of them is known): one look-up for what a direct append may skip."""
        tip = self._tips.get(session_id)
        if tip is None:
            return set(), None
        ack = (session_id, tip[2])
        by_row = self._by_row
        known = set()
        for row in rows:
            entry = by_row.get(id(row))
            if entry is not None and entry.row is row and entry.ack == ack:
                known.add(id(row))
        return known, (tip[0], tip[1]) if known else None

    def acknowledge(
        self, session_id: str, rows: Iterable[dict[str, Any]], tip: tuple[int, UUID] | None
    ) -> None:
        """The database stored ``rows`` as they are in the session; ``tip``: the newest
        row this append inserted, if any."""
        with self._lock:
            current = self._tips.pop(session_id, None)
            if current is None:
                self._eras += 1
                era = self._eras
            else:
                era = current[2]
            if tip is not None:
                current = (*tip, era)
            if current is not None:
                self._tips[session_id] = current  # most recently used last
                while len(self._tips) > MAX_TIPS:
                    del self._tips[next(iter(self._tips))]
            by_row = self._by_row
            for row in rows:
                entry = by_row.get(id(row))
                if entry is not None and entry.row is row:
                    entry.ack = (session_id, era)

    def forget_session(self, session_id: str) -> None:
        """Forget what was acknowledged in the session (its newest row is gone): the
        next era's acknowledgements do not count the old ones."""
        with self._lock:
            self._tips.pop(session_id, None)
