"""The append path, in one place: which way a batch goes, and what is remembered.

:class:`Appender` is what :meth:`SessionRepository.append` (and ``append_prepared``, the
writer's, the async API's) and a unit of work's ``append`` run. It owns:

- the choice of path: the dialect's one append entry
  (:meth:`~sessionrepo.dialects.base.AppendRole.append`) takes its **direct** statement
  (on the driver connection, one round trip on PostgreSQL, the session created and the
  search backlog named with it) when appends name their messages in the search backlog
  and :attr:`Appender.direct` allows it; else, or when the direct statement cannot
  decide alone (a race with a concurrent first append or re-send), its **locked** path,
  a transaction that locks the session's row and inserts what is new. A unit of work
  runs the locked primitives itself (:meth:`Appender.append_locked`), under the lock it
  holds;
- the :class:`~sessionrepo.store.memory.SentMemory` (validated once, acknowledged rows),
  one per repository.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal
from uuid import UUID

from sqlalchemy import Connection, Insert

import sessionrepo.observability as _observe
import sessionrepo.store.tombstones as _tombstones
from sessionrepo.dialects.base import DirectAppend, DirectResult, conflict_error
from sessionrepo.errors import QueuedBehindOutbox, RepoError
from sessionrepo.models import AppendResult, Message
from sessionrepo.models.message import utcnow
from sessionrepo.models.tables import sessions_table
from sessionrepo.search.text import searchable
from sessionrepo.store import codec as _codec
from sessionrepo.store.codec import PreparedBatch
from sessionrepo.store.database import Database
from sessionrepo.store.memory import SentMemory
from sessionrepo.store.search_index import SearchIndex

S = sessions_table.c

#: The ways appends keep the search index (see :func:`open_repository`).
IndexMode = bool | Literal["immediate"]
OnConflict = Literal["report", "raise"]


class Appender:
    """Appends for one repository (see the module's docstring).

    Args:
        database: the repository's database (a writer's deadline passes a bounded one
            per call).
        search: the repository's search index.
        index_appends: ``open_repository``'s ``search_index``.
        memory: what re-flushes reuse; its bound is ``open_repository``'s
            ``append_memory``.
    """

    def __init__(
        self,
        database: Database,
        search: SearchIndex,
        index_appends: IndexMode,
        memory: SentMemory,
    ) -> None:
        self._db = database
        self._search = search
        self._index_appends = index_appends
        self.memory = memory
        #: Whether the direct path is tried first (the contract suite turns it off to
        #: run every append on the locked path).
        self.direct = index_appends is True
        self.insert_session: Insert = database.dialect.insert_ignoring(sessions_table, ["id"])

    def prepare(
        self, messages: Iterable[Message | Mapping[str, Any]]
    ) -> tuple[list[Message], list[dict[str, Any]]]:
        """Validate and encode (see :func:`~sessionrepo.store.codec.prepare_messages`)."""
        return _codec.prepare_messages(messages)

    def prepare_batch(
        self,
        session_id: str,
        messages: Iterable[Message | Mapping[str, Any]],
        session_defaults: Mapping[str, Any],
    ) -> PreparedBatch:
        """:meth:`prepare`, and the session a first append creates (see
        :func:`~sessionrepo.store.codec.prepare_batch`)."""
        memory = self.memory if self.direct else None
        return _codec.prepare_batch(session_id, messages, session_defaults, memory)

    @property
    def backend(self) -> str:
        """The backend's name: the label of the append's span and metrics."""
        return self._db.backend

    # -- an append of its own -------------------------------------------------------------

    @_observe.instrument_append
    def append(
        self,
        batch: PreparedBatch,
        *,
        database: Database,
        on_conflict: OnConflict,
        behind_outbox: bool,
    ) -> AppendResult:
        """``batch`` appended on ``database`` through the dialect's one append entry
        (its direct statement, or its locked path): every append's one entry (the
        repository's, the writer's, the async API's), so the one that is instrumented.

        Raises:
            QueuedBehindOutbox: ``behind_outbox`` (a writer whose outbox is this
                database) and the session has parked messages: nothing was written,
                the batch queues behind them.
        """
        result = self._screened(batch, database, on_conflict, behind_outbox)
        if result is None:
            raise QueuedBehindOutbox(batch.session_id)
        return result

    def _screened(
        self, batch: PreparedBatch, database: Database, on_conflict: OnConflict, behind_outbox: bool
    ) -> AppendResult | None:
        """``batch`` appended without what an erasure removed (see :mod:`.tombstones`):
        where the dialect's statement screens erasures, it writes nothing for a session
        that was ever erased, whose batch is then screened message by message."""
        if database.dialect.capabilities.screens_erasure:
            try:
                return self._append(batch, database, on_conflict, behind_outbox, probe=True)
            except _SessionErased:
                pass
        return _tombstones.screened(
            database,
            batch,
            lambda kept: self._append(kept, database, on_conflict, behind_outbox, probe=False),
        )

    def _append(
        self,
        batch: PreparedBatch,
        database: Database,
        on_conflict: OnConflict,
        behind_outbox: bool,
        *,
        probe: bool,
    ) -> AppendResult | None:
        """``batch`` through the dialect's append entry; ``probe``: with the session's
        tombstone hash, so that the statement writes nothing for an erased session
        (then ``_SessionErased``)."""
        if not batch.keys:
            return AppendResult(session_id=batch.session_id)
        sid = batch.session_id
        memory = self.memory
        # Messages the memory proved acknowledged, unchanged (batch.pending_rows holds
        # None for them), are not sent again while the session's tip is still stored
        # under its seq (the dialect verifies it, or the probe below): the database
        # stays the authority. A batch made in an older era is sent whole.
        tip = None
        if batch.era is not None:
            tip = memory.tip(sid, batch.era) if self.direct else None
            if tip is None:
                batch.materialize()
        rows = batch.pending_rows
        unique: dict[Any, dict[str, Any]] = {}
        repeated: list[UUID] = []
        for row in rows:
            if row is not None:
                first = unique.setdefault(row["client_msg_uuid"], row)
                if first["content_hash"] != row["content_hash"]:
                    repeated.append(row["client_msg_uuid"])
        if repeated and on_conflict == "raise":  # a conflict within the batch itself
            raise conflict_error(sid, list(dict.fromkeys(repeated)))
        if tip is not None and not unique:
            if database.read_direct(lambda driver: database.dialect.message_at(driver, sid, *tip)):
                return outcome(sid, batch.keys, rows, {}, None)
            memory.forget_session(sid)
            batch.materialize()
            return self._screened(batch, database, on_conflict, behind_outbox)
        append = DirectAppend(
            session_id=sid,
            rows=list(unique.values()),
            new_session=batch.new_session,
            now=utcnow(),
            enqueue=self._index_appends is True,
            refuse_conflicts=on_conflict == "raise",
            behind_outbox=behind_outbox,
            verify=tip,
            erased_probe=_tombstones.session_probe(database, sid) if probe else None,
        )

        def index(conn: Connection, done: DirectResult) -> None:
            stored = outcome(sid, batch.keys, rows, done.stored, done.first_seq)
            self.index_inserted(conn, stored, batch.messages)

        then = None if self._index_appends is True else index
        done = database.dialect.append(database, append, direct=self.direct, then=then)
        if done.queued:
            return None
        if done.erased:
            raise _SessionErased
        if done.lost:  # the newest remembered row is gone: remember nothing, send all
            memory.forget_session(sid)
            batch.materialize()
            return self._screened(batch, database, on_conflict, behind_outbox)
        result = outcome(sid, batch.keys, rows, done.stored, done.first_seq)
        if result.conflicts and on_conflict == "raise":
            raise conflict_error(sid, result.conflicts)
        if self.direct and memory.limit:
            self._acknowledge(sid, batch, append.rows, done)
        return result

    def _acknowledge(
        self, sid: str, batch: PreparedBatch, sent: Sequence[dict[str, Any]], done: DirectResult
    ) -> None:
        """One memory call after the write: what is stored as sent, and the new tip."""
        tip = None
        if done.first_seq is not None:
            inserted = [row for row in sent if row["client_msg_uuid"] not in done.stored]
            tip = (done.first_seq + len(inserted) - 1, inserted[-1]["client_msg_uuid"])
        proofs = batch.proofs
        if not proofs:
            self.memory.acknowledge(sid, (), tip)
            return
        stored = done.stored
        acknowledged = [
            (proof[0], proof[1], row["client_msg_uuid"])
            for proof, row in zip(proofs, batch.pending_rows, strict=True)
            if proof is not None
            and row is not None
            and stored.get(row["client_msg_uuid"], row["content_hash"]) == row["content_hash"]
        ]
        self.memory.acknowledge(sid, acknowledged, tip)

    # -- the locked path (a unit of work runs it too) ---------------------------------------

    def lock(
        self, conn: Connection, sid: str, new_session: dict[str, Any] | None
    ) -> tuple[int | None, bool]:
        """Lock the session's row for the rest of the transaction, creating it from
        ``new_session`` when it is missing (``None``: not); its ``next_seq`` (``None``:
        no such session) and whether this call created it."""
        dialect = self._db.dialect
        next_seq = dialect.lock_session(conn, sid)
        if next_seq is not None or new_session is None:
            return next_seq, False
        # Whoever creates it first, this call or a concurrent appender: the row is then
        # locked by the one that did.
        insert = self.insert_session.values(**new_session).returning(S.id)
        created = conn.execute(insert).first() is not None
        next_seq = dialect.lock_session(conn, sid)
        if next_seq is None:  # pragma: no cover - inserted just above
            raise RepoError(f"session {sid!r} vanished while it was being created")
        return next_seq, created

    def append_locked(
        self,
        conn: Connection,
        sid: str,
        next_seq: int,
        batch: PreparedBatch | Iterable[Message | Mapping[str, Any]],
        *,
        on_conflict: OnConflict,
    ) -> AppendResult:
        """An append in a transaction holding ``sid``'s lock (its ``next_seq``): the
        rows whose key the session lacks inserted, the search index kept. A conflict
        with ``on_conflict="raise"`` raises having written nothing of the batch."""
        if isinstance(batch, PreparedBatch):
            messages, rows = batch.messages, batch.rows  # validates what was taken as known
        else:
            messages, rows = self.prepare(batch)
        messages, rows, erased = _tombstones.screen_locked(conn, self._db, sid, messages, rows)
        if not rows:
            return AppendResult(session_id=sid, erased=erased)
        if on_conflict == "raise":
            # A savepoint: the refused batch leaves nothing; a unit of work goes on.
            with conn.begin_nested():
                result = self.insert_new(conn, sid, next_seq, rows)
                if result.conflicts:
                    raise conflict_error(sid, result.conflicts)
        else:
            result = self.insert_new(conn, sid, next_seq, rows)
        self.index_inserted(conn, result, messages)
        return result.model_copy(update={"erased": erased}) if erased else result

    def insert_new(
        self, conn: Connection, sid: str, next_seq: int, rows: Sequence[dict[str, Any]]
    ) -> AppendResult:
        """The one insert of the locked path (appends, units of work, restores): the
        rows whose key the session lacks, numbered from ``next_seq`` in batch order,
        counters moved. The caller holds the session's lock."""
        # Nobody else can add to this session until we commit, so what is stored now
        # is what the insert would collide with.
        unique: dict[Any, dict[str, Any]] = {}
        for row in rows:
            unique.setdefault(row["client_msg_uuid"], row)
        stored = self._db.dialect.insert_new_messages(
            conn, sid, next_seq, list(unique.values()), utcnow()
        )
        return outcome(sid, [row["client_msg_uuid"] for row in rows], rows, stored, next_seq)

    def index_inserted(
        self, conn: Connection, result: AppendResult, messages: Sequence[Message]
    ) -> None:
        """Keep the search index for what ``result`` inserted, as ``search_index`` says."""
        if result.first_seq is None:
            return
        if not self._index_appends:
            self._search.mark_stale_in(conn, "appends without indexing (search_index=False)")
            return
        if self._index_appends is True:
            # Named for the catch-up in this transaction: the index work (several
            # times this append's) runs later, batched, and a message committed is
            # a message indexed or named (see store/search_index.py).
            self._search.enqueue_in(conn, result.session_id, result.first_seq, len(result.inserted))
            return
        # "immediate": in a savepoint, so a broken index can never make the transcript
        # write fail (its failure marks the index stale instead; see store/search_index.py).
        content = {
            m.client_msg_uuid: searchable(m.content, m.extra, m.tool_calls, m.tool_name)
            for m in messages
        }
        self._search.index_in_transaction(
            conn,
            result.session_id,
            result.first_seq,
            [content[key] for key in result.inserted],
        )


class _SessionErased(Exception):
    """The dialect's statement found the session's tombstone: nothing was written."""


def outcome(
    sid: str,
    keys: Sequence[Any],
    rows: Sequence[dict[str, Any] | None],
    stored: dict[Any, bytes],
    first_seq: int | None,
) -> AppendResult:
    """What an insert of ``rows`` (the batch's, with its ``keys``) did, from the keys
    that were ``stored`` before it (and their content hashes): the first row of each
    other key was inserted, in order from ``first_seq``; every repeat is a duplicate
    or, with other content, a conflict. A row that is ``None`` (acknowledged as stored
    unchanged, so not sent) is a duplicate."""
    stored = dict(stored)
    inserted: list[Any] = []
    duplicates: list[Any] = []
    conflicts: list[Any] = []
    for key, row in zip(keys, rows, strict=True):
        if row is None:
            duplicates.append(key)
            continue
        known_hash = stored.get(key)
        if known_hash is None:
            inserted.append(key)
            stored[key] = row["content_hash"]
            continue
        (duplicates if known_hash == row["content_hash"] else conflicts).append(key)
    # The keys are UUIDs from validated messages: no validation of each again. Every
    # field is given: for one left out, pydantic's model_construct inspects the
    # signature of its default factory on every call (about 0.4 ms an append).
    return AppendResult.model_construct(
        session_id=sid,
        inserted=inserted,
        duplicates=duplicates,
        conflicts=conflicts,
        erased=[],
        first_seq=first_seq if inserted else None,
    )
