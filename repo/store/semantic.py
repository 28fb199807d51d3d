"""Search by meaning: message vectors kept beside the messages, and the searches on them.

Vectors live in ``message_embeddings``, one row per message the catch-up has looked at,
keyed like the message (``session_id``, ``seq``), with the message's ``content_hash`` at
the time it was embedded and the vector as int8 bytes (NULL: nothing worth embedding, or
out of the live transcript). ``semantic_index_state`` names the model (name and
dimension) the vectors are of, so that a store never compares vectors of two models, and
holds the catch-up's watermark.

The append never embeds (its speed does not change): :meth:`SemanticIndex.catch_up` does,
called by ``search`` (a bounded amount), by a ``TranscriptWriter``'s drainer beside the
keyword catch-up, and on demand. It looks at the sessions active since its watermark (the
sessions' ``last_active_at``, less a slack for transactions that commit late) whose
newest message has no row yet, reads each one's messages that have no row or a row of
other content, embeds them *outside* any transaction, and upserts the rows in short
transactions of their own. An edit that changes a message (compaction moves seqs) leaves
a row whose hash is not the message's: searches ignore it, and the session's next
catch-up embeds it again. Superseded messages get a NULL vector.

A search reads the vectors that pass the filters and are current (the message live, its
hash the row's), scores them by int8 dot product (brute force, numpy), and returns the
best with a snippet. Hybrid fuses the keyword and semantic rankings by reciprocal rank
fusion.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import Any, Final

from sqlalchemy import Connection, and_, bindparam, delete, func, or_, select, text

from sessionrepo.errors import SemanticSearchUnavailable
from sessionrepo.models.message import utcnow
from sessionrepo.models.search import SearchHit
from sessionrepo.models.tables import (
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

# The same statement on SQLite (3.24+) and PostgreSQL: a row per (session_id, seq).
_UPSERT: Final = text(
    "INSERT INTO message_embeddings (session_id, seq, content_hash, vector) "
    "VALUES (:session_id, :seq, :content_hash, :vector) "
    "ON CONFLICT (session_id, seq) DO UPDATE SET "
    "content_hash = excluded.content_hash, vector = excluded.vector"
)


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


@dataclass(frozen=True)
class CatchUp:
    """What one catch-up did: messages embedded, and whether work was left."""

    embedded: int
    pending: bool


class SemanticIndex:
    """The vectors of one database, for one embedder (``None``: none installed)."""

    def __init__(self, database: Database, embedder: Embedder | None) -> None:
        self.database = database
        self.embedder = embedder
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

    def state(self) -> tuple[str | None, int | None, datetime | None]:
        """``(model, dimension, watermark)`` of the store (all ``None`` before any)."""
        row = self.database.read(
            lambda conn: conn.execute(
                select(ST.model, ST.dimension, ST.watermark).where(ST.name == _STATE_NAME)
            ).first()
        )
        return (None, None, None) if row is None else (row.model, row.dimension, row.watermark)

    def unavailable(self) -> str | None:
        """Why semantic search cannot answer now, or ``None``."""
        if self.embedder is None:
            return (
                "no embedder: install the semantic extra (pip install 'sessionrepo[semantic]') "
                "or open the repository with embedder=..."
            )
        model, dimension, _ = self.state()
        if model is not None and (model, dimension) != (
            self.embedder.name,
            self.embedder.dimension,
        ):
            return (
                f"the store's vectors are of {model!r} ({dimension} dimensions), the embedder "
                f"is {self.embedder.name!r} ({self.embedder.dimension}); run "
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
            conn.execute(delete(embeddings_table))
            conn.execute(
                semantic_state_table.update()
                .where(ST.name == _STATE_NAME)
                .values(watermark=None, **values)
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
        model, dimension, _ = self.state()
        if model is not None and (model, dimension) != (embedder.name, embedder.dimension):
            return CatchUp(0, False)
        if model is None and not self.database.write(
            lambda conn: self._claim_model(conn, embedder, reset=False)
        ):
            return CatchUp(0, False)  # read first: an idle catch-up takes no write lock
        batch = _Batch(self.database, embedder, progress)
        while True:
            started = utcnow()
            _, _, watermark = self.state()
            sessions = self.database.read(partial(_sessions_behind, watermark=watermark))
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

        Raises:
            SemanticSearchUnavailable: see :meth:`unavailable`.
        """
        import numpy as np

        reason = self.unavailable()
        if reason is not None:
            raise SemanticSearchUnavailable(f"semantic search is unavailable: {reason}")
        embedder = self.embedder
        assert embedder is not None
        wanted = offset + limit
        if not query.strip() or wanted == 0:
            return []
        target = np.frombuffer(self._query_vector(embedder, query), dtype=np.int8).astype(np.int32)
        keys, blob = self.database.read(lambda conn: _vectors(conn, filters))
        if not keys:
            return []
        matrix = np.frombuffer(blob, dtype=np.int8).reshape(len(keys), embedder.dimension)
        scores = matrix.astype(np.int32) @ target
        count = min(wanted, len(keys))
        top = np.argpartition(-scores, count - 1)[:count]
        ranked = sorted(top.tolist(), key=lambda i: (-int(scores[i]), keys[i]))[offset:]
        chosen = [(keys[i], float(scores[i]) / (SCALE * SCALE)) for i in ranked]
        parsed = parse_query(query)
        rows = self.database.read(lambda conn: _hit_rows(conn, [key for key, _ in chosen]))
        hits = []
        for key, score in chosen:
            row = rows.get(key)
            if row is not None:  # erased or edited since: not an answer any more
                hits.append(_hit(row, parsed, score))
        return hits


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
        self.database.write(lambda conn: conn.execute(_UPSERT, values))
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
    newest = select(func.coalesce(func.max(E.seq), 0)).where(E.session_id == S.id).scalar_subquery()
    query = select(S.id, S.last_active_at).where(S.next_seq - 1 > newest)
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


def _vectors(conn: Connection, filters: SearchFilters) -> tuple[list[tuple[str, int]], bytes]:
    """The current vectors that pass ``filters``: their keys, and the vectors as one
    run of bytes (a row per key). Plain SQL text: without SQLAlchemy's per-row type
    processing, this read (the whole cost of a brute-force query) takes about half."""
    sql = [
        "SELECT e.session_id, e.seq, e.vector FROM message_embeddings e "
        "JOIN messages m ON m.session_id = e.session_id AND m.seq = e.seq"
    ]
    if filters.source is not None or filters.user_id is not None:
        sql.append(" JOIN sessions s ON s.id = m.session_id")
    sql.append(
        " WHERE e.vector IS NOT NULL AND m.superseded IS NULL AND m.content_hash = e.content_hash"
    )
    params: dict[str, Any] = {}
    for column, name, value in (
        ("m.session_id =", "f_session", filters.session_id),
        ("m.role =", "f_role", filters.role),
        ("s.source =", "f_source", filters.source),
        ("s.user_id =", "f_user", filters.user_id),
        ("m.timestamp >=", "f_since", filters.since),
        ("m.timestamp <", "f_until", filters.until),
    ):
        if value is not None:
            sql.append(f" AND {column} :{name}")
            params[name] = value
    statement = text("".join(sql))
    for name in ("f_since", "f_until"):
        if name in params:  # bound as the column's type (SQLite stores its own text form)
            statement = statement.bindparams(bindparam(name, type_=M.timestamp.type))
    rows = conn.execute(statement, params).all()
    return [(row[0], row[1]) for row in rows], b"".join(bytes(row[2]) for row in rows)


def _hit_rows(conn: Connection, keys: list[tuple[str, int]]) -> dict[tuple[str, int], Any]:
    if not keys:
        return {}
    join = messages_table.join(sessions_table, S.id == M.session_id).join(
        embeddings_table, and_(E.session_id == M.session_id, E.seq == M.seq)
    )
    found: dict[tuple[str, int], Any] = {}
    for session_id in sorted({sid for sid, _ in keys}):
        seqs = [seq for sid, seq in keys if sid == session_id]
        query = (
            select(
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
            )
            .select_from(join)
            .where(
                M.session_id == session_id,
                M.seq.in_(seqs),
                M.superseded.is_(None),
                M.content_hash == E.content_hash,
            )
        )
        for row in conn.execute(query):
            found[(row.session_id, row.seq)] = row
    return found


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
