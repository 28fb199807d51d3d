"""The synchronous repository: SQLAlchemy Core on the hot paths.

:class:`SessionRepository` implements :class:`sessionrepo.contract.SessionStore`, whose
docstrings state the guarantees; its methods check their arguments
(:mod:`.arguments`) before any SQL.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Literal
from uuid import UUID

from sqlalchemy import (
    Connection,
    func,
    literal,
    select,
    update,
)
from sqlalchemy.engine import URL

import sessionrepo.observability as _observe

# The operator's value types, re-exported: the operator tools import them from here.
from sessionrepo.contract import PruneResult as PruneResult  # noqa: PLC0414
from sessionrepo.contract import RestoreResult as RestoreResult  # noqa: PLC0414
from sessionrepo.contract import SessionFilter as SessionFilter  # noqa: PLC0414
from sessionrepo.contract import SessionOperations, SessionStore, TranscriptEditor
from sessionrepo.contract import SessionSnapshot as SessionSnapshot  # noqa: PLC0414
from sessionrepo.errors import (
    ArgumentTypeError,
    InvalidArgument,
    InvalidMessage,
)
from sessionrepo.models import (
    AppendResult,
    EditResult,
    Message,
    SearchHit,
    Session,
    SessionPage,
    StoredMessage,
)
from sessionrepo.models._limits import check_identifier
from sessionrepo.models.message import utcnow
from sessionrepo.models.privacy import (
    AuditEntry,
    ErasureReport,
    RetentionPolicy,
    RetentionReport,
    ScrubReport,
)
from sessionrepo.models.session import DERIVED_FIELDS
from sessionrepo.models.tables import (
    messages_table,
    outbox_table,
    sessions_table,
)
from sessionrepo.models.usage import Usage, UsageResult
from sessionrepo.search.embedders import Embedder, check_embedder, default_embedder
from sessionrepo.store import codec as _codec
from sessionrepo.store import schema
from sessionrepo.store.append import Appender
from sessionrepo.store.arguments import (
    check_bool,
    check_callable,
    check_choice,
    check_instance,
    check_int,
    check_iterable,
    check_limit,
    check_optional_text,
    check_seconds,
    check_session_id,
)
from sessionrepo.store.codec import PreparedBatch as PreparedBatch  # noqa: PLC0414 (re-exported)
from sessionrepo.store.database import Database
from sessionrepo.store.editing import SessionEditor
from sessionrepo.store.erasure import (
    Eraser,
    check_selector,
    drop_policy,
    read_audit,
    read_policies,
    write_policy,
)
from sessionrepo.store.listing import MAX_PAGE, SessionListing
from sessionrepo.store.loading import MAX_CHAIN, TranscriptLoader, continuation_chain
from sessionrepo.store.memory import DEFAULT_MEMORY_BYTES, SentMemory
from sessionrepo.store.operations import SessionOperator
from sessionrepo.store.search_index import SearchIndex
from sessionrepo.store.searching import SessionSearch
from sessionrepo.store.semantic import (
    DEFAULT_VECTOR_MEMORY,
    SemanticIndex,
)
from sessionrepo.store.transaction import SessionTransaction, fetch_session
from sessionrepo.store.usage import UsageInput, UsageLedger, check_usage

S = sessions_table.c
M = messages_table.c
O = outbox_table.c  # noqa: E741

#: Longest ``end_reason``.
MAX_REASON_LENGTH = 1024

_FILLABLE = (
    "user_id",
    "title",
    "model",
    "model_settings",
    "system_prompt",
    "parent_session_id",
    "metadata",
)


class SessionRepository(SessionStore, TranscriptEditor, SessionOperations):
    """Sessions and their transcripts on SQLite or PostgreSQL (made by
    :func:`open_repository`).

    Implements :class:`sessionrepo.contract.SessionStore`, whose docstrings state the
    guarantees. Thread-safe: every call runs in its own transaction on a pooled
    connection.
    """

    def __init__(
        self,
        database: Database,
        *,
        search_index: bool | Literal["immediate"] = True,
        append_memory: int = DEFAULT_MEMORY_BYTES,
        embedder: Embedder | bool | None = None,
        semantic_memory: int = DEFAULT_VECTOR_MEMORY,
    ) -> None:
        check_instance(database, "database", Database)
        check_choice(search_index, "search_index", _SEARCH_INDEX_MODES)
        check_int(append_memory, "append_memory", minimum=0)
        check_int(semantic_memory, "semantic_memory", minimum=0)
        self._db = database
        self._search = SearchIndex(database)
        self._listing = SessionListing(database)
        self._loader = TranscriptLoader(database)
        self._semantic = SemanticIndex(database, choose_embedder(embedder), semantic_memory)
        self._searches = SessionSearch(self._search, self._semantic)
        self._index_appends = search_index
        self._appender = Appender(database, self._search, search_index, SentMemory(append_memory))
        self._editor = SessionEditor(database, self._search, search_index)
        self._operator = SessionOperator(database, self._appender, self._editor)
        self._eraser = Eraser(
            database,
            lambda sid: SessionTransaction(self._appender, self._editor, database, sid, None),
            self._appender.memory,
        )
        self._ledger = UsageLedger(
            self._appender,
            lambda db, sid, new: SessionTransaction(self._appender, self._editor, db, sid, new),
            database,
        )

    @property
    def backend(self) -> str:
        return self._db.backend

    def bounded_database(self, seconds: float) -> Database:
        """The pool that :meth:`append_prepared` with ``timeout=seconds`` runs on: the
        same database, connections the server itself holds to ``seconds`` per
        statement and lock wait (see :meth:`Database.bounded`)."""
        return self._db.bounded(check_seconds(seconds, "seconds"))

    @property
    def database(self) -> Database:
        return self._db

    def __enter__(self) -> SessionRepository:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def display_url(self) -> str:
        """The database's URL with any password masked: safe to print or log."""
        return self._db.display_url

    def __repr__(self) -> str:
        return f"SessionRepository({self.display_url})"

    # -- sessions -------------------------------------------------------------------

    # ``self`` positional-only: sessionrepo.aio derives the awaited signature from this one.
    def create_session(self, /, session_id: str, **fields: Any) -> Session:
        sid = check_session_id(session_id)
        _refuse_derived(fields, "session")
        row = _codec.session_row(_codec.build_session(sid, fields, "session"))

        def work(conn: Connection) -> Session:
            insert = self._appender.insert_session.values(**row).returning(S.id)
            created = conn.execute(insert).first()
            if created is None:
                fill: dict[str, Any] = {
                    name: func.coalesce(S[name], literal(row[name], S[name].type))
                    for name in _FILLABLE
                    if row[name] is not None
                }
                if row["source"] != "unknown":
                    fill["source"] = func.coalesce(func.nullif(S.source, "unknown"), row["source"])
                if fill:
                    conn.execute(update(sessions_table).where(S.id == sid).values(**fill))
            return self._get(conn, sid)

        return self._db.write(work)

    def get_session(self, session_id: str) -> Session:
        sid = check_session_id(session_id)
        return self._db.read(lambda conn: self._get(conn, sid))

    def _get(self, conn: Connection, sid: str) -> Session:
        return fetch_session(conn, sid)

    def list_sessions(
        self,
        *,
        source: str | None = None,
        user_id: str | None = None,
        status: Literal["open", "ended"] | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> SessionPage:
        return self._listing.page(
            source=source, user_id=user_id, status=status, limit=limit, cursor=cursor
        )

    def end_session(self, session_id: str, reason: str) -> bool:
        sid = check_session_id(session_id)
        _check_reason(reason)

        def work(conn: Connection) -> bool:
            ended = conn.execute(
                update(sessions_table)
                .where(S.id == sid, S.ended_at.is_(None))
                .values(ended_at=utcnow(), end_reason=reason)
            ).rowcount
            if not ended:
                self._get(conn, sid)  # NotFound, or already ended
            return bool(ended)

        return self._db.write(work)

    def reopen_session(self, session_id: str) -> bool:
        sid = check_session_id(session_id)

        def work(conn: Connection) -> bool:
            reopened = conn.execute(
                update(sessions_table)
                .where(S.id == sid, S.ended_at.is_not(None))
                .values(ended_at=None, end_reason=None)
            ).rowcount
            if not reopened:
                self._get(conn, sid)
            return bool(reopened)

        return self._db.write(work)

    def resolve_tip(self, session_id: str) -> Session:
        sid = check_session_id(session_id)

        def work(conn: Connection) -> Session:
            tip = self._get(conn, sid)
            seen = {tip.id}
            while True:
                # Every child (a session has few), the newest picked here, by the parent
                # index: with ORDER BY and LIMIT (or its statistics, see rare) SQLite's
                # planner would scan a million sessions instead.
                children = conn.execute(
                    select(sessions_table).where(
                        self._db.dialect.rare(S.parent_session_id == tip.id)
                    )
                ).all()
                row = max(
                    children, key=lambda child: (child.last_active_at, child.id), default=None
                )
                if row is None or row.id in seen or len(seen) > MAX_CHAIN:
                    return tip
                seen.add(row.id)
                tip = Session.model_construct(**_codec.session_from_row(row))

        return self._db.read(work)

    def session_chain(self, session_id: str) -> list[Session]:
        sid = check_session_id(session_id)
        return self._db.read(lambda conn: continuation_chain(conn, sid))

    def session_transaction(
        self,
        /,
        session_id: str,
        *,
        create: bool = True,
        timeout: float | None = None,
        **session_defaults: Any,
    ) -> SessionTransaction:
        sid = check_session_id(session_id)
        check_bool(create, "create")
        if timeout is not None:
            check_seconds(timeout, "timeout")
        _refuse_derived(session_defaults, "session_defaults")
        new_session = None
        if create:
            new_session = _codec.session_row(
                _codec.build_session(sid, session_defaults, "session_defaults")
            )
        elif session_defaults:
            raise InvalidArgument(
                "session_defaults", "given with create=False: a missing session is not created"
            )
        database = self._db if timeout is None else self.bounded_database(timeout)
        return SessionTransaction(self._appender, self._editor, database, sid, new_session)

    # -- messages -------------------------------------------------------------------

    def append(
        self,
        session_id: str,
        messages: Iterable[Message | Mapping[str, Any]],
        *,
        on_conflict: Literal["report", "raise"] = "report",
        usage: UsageInput = None,
        **session_defaults: Any,
    ) -> AppendResult:
        check_choice(on_conflict, "on_conflict", _ON_CONFLICT)
        batch = self.prepare(session_id, messages, usage=usage, **session_defaults)
        if batch.usage:
            return self._ledger.append(
                batch, database=self._db, on_conflict=on_conflict, behind_outbox=False
            )
        # Straight to the appender (its entry is the instrumented one): the batch was
        # made here, append_prepared's checks have nothing to check.
        return self._appender.append(
            batch, database=self._db, on_conflict=on_conflict, behind_outbox=False
        )

    def prepare(
        self,
        session_id: str,
        messages: Iterable[Message | Mapping[str, Any]],
        *,
        usage: UsageInput = None,
        **session_defaults: Any,
    ) -> PreparedBatch:
        """Validate and encode a batch for :meth:`append_prepared`; nothing is written.

        Raises:
            InvalidMessage: the batch (or its ``usage``) cannot be stored faithfully, or
                a session default is derived (see :meth:`append`).
        """
        sid = check_session_id(session_id)
        check_iterable(messages, "messages")
        _refuse_derived(session_defaults, "session_defaults")
        batch = self._appender.prepare_batch(sid, messages, session_defaults)
        if usage is None:
            return batch
        records = check_usage(usage, batch.messages)
        if records and not batch.messages:
            raise InvalidMessage("usage", "comes with messages: record_usage takes it alone")
        batch.usage = records
        return batch

    def append_prepared(
        self,
        batch: PreparedBatch,
        *,
        timeout: float | None = None,
        on_conflict: Literal["report", "raise"] = "report",
        behind_outbox: bool = False,
    ) -> AppendResult:
        """:meth:`append` for a batch :meth:`prepare` made.

        Args:
            timeout: seconds the database may spend on it, enforced by the server
                (PostgreSQL's statement and lock timeouts, SQLite's busy timeout) on
                a pool of connections that carry it (:meth:`bounded_database`);
                ``None`` for no limit.
            on_conflict: as for :meth:`append`.
            behind_outbox: for a ``TranscriptWriter`` that parks in this database:
                when the session has parked messages, write nothing and raise
                :class:`QueuedBehindOutbox` (the batch must queue behind them).
        """
        check_instance(batch, "batch", PreparedBatch)
        if timeout is not None:
            check_seconds(timeout, "timeout")
        check_choice(on_conflict, "on_conflict", _ON_CONFLICT)
        check_bool(behind_outbox, "behind_outbox")
        append = self._ledger.append if batch.usage else self._appender.append
        return append(
            batch,
            database=self._db if timeout is None else self.bounded_database(timeout),
            on_conflict=on_conflict,
            behind_outbox=behind_outbox,
        )

    # -- the usage ledger (sessionrepo.store.usage) -----------------------------------

    def record_usage(
        self, /, session_id: str, usage: UsageInput, **session_defaults: Any
    ) -> UsageResult:
        """Record model calls' usage without messages (``append(..., usage=...)`` records
        it with them): each record needs its ``usage_id``; one already stored (the same
        key) is skipped, and the session's token totals move only for those inserted.
        The session is created from ``session_defaults`` when it does not exist.

        Raises:
            InvalidMessage: a record is invalid or has no key (nothing was written).
        """
        sid = check_session_id(session_id)
        _refuse_derived(session_defaults, "session_defaults")
        records = check_usage(usage, [])
        new_session = _codec.session_row(
            _codec.build_session(sid, session_defaults, "session_defaults")
        )
        return self._ledger.record(sid, records, new_session)

    def list_usage(self, session_id: str) -> list[Usage]:
        """The session's usage records, oldest first (``[]`` for none, or no session)."""
        return self._ledger.list(check_session_id(session_id))

    # -- editing (the editor's; the contract, TranscriptEditor, says what each means) -----

    def rewind(self, /, session_id: str, to_seq: int) -> EditResult:
        return self._editor.rewind(session_id, to_seq)

    def retract(self, /, session_id: str, keys: Iterable[UUID | str]) -> EditResult:
        return self._editor.retract(session_id, keys)

    def pop_last(self, /, session_id: str) -> EditResult:
        return self._editor.pop_last(session_id)

    def clear_session(self, /, session_id: str) -> EditResult:
        return self._editor.clear_session(session_id)

    def compact(
        self, /, session_id: str, through_seq: int, summary_message: Message | Mapping[str, Any]
    ) -> EditResult:
        return self._editor.compact(session_id, through_seq, summary_message)

    def fork_session(self, /, source_id: str, at_seq: int, new_id: str, **fields: Any) -> Session:
        return self._editor.fork_session(source_id, at_seq, new_id, **fields)

    # -- search ---------------------------------------------------------------------

    @_observe.instrument_search
    def search(
        self,
        query: str,
        *,
        session_id: str | None = None,
        source: str | None = None,
        role: str | None = None,
        user_id: str | None = None,
        since: datetime | float | None = None,
        until: datetime | float | None = None,
        order: Literal["rank", "newest"] = "rank",
        limit: int = 20,
        cursor: int | str | None = None,
        mode: Literal["keyword", "semantic", "hybrid"] = "keyword",
    ) -> list[SearchHit]:
        return self._searches.search(
            query,
            session_id=session_id,
            source=source,
            role=role,
            user_id=user_id,
            since=since,
            until=until,
            order=order,
            limit=limit,
            cursor=cursor,
            mode=mode,
        )

    def reindex(self, *, progress: Callable[[int, int], None] | None = None) -> int:
        check_callable(progress, "progress")
        return self._search.reindex(progress=progress)

    @_observe.instrument_catch_up
    def catch_up_search_index(self, *, limit: int | None = None) -> int:
        if limit is not None:
            limit = check_limit(limit)
        return self._search.catch_up(limit)

    def catch_up_semantic_index(self, *, limit: int | None = None) -> int:
        """Embed what the semantic index lacks (up to ``limit`` messages); returns how
        many were embedded. A no-op without an embedder (the ``semantic`` extra) or when
        the store's vectors are of another model."""
        if limit is not None:
            limit = check_limit(limit)
        return self._semantic.catch_up(limit).embedded

    def reindex_semantic(self, *, progress: Callable[[int, int], None] | None = None) -> int:
        """Drop every vector and embed every live message again with this repository's
        embedder (after a change of model); ``progress(done, total)`` is called as it
        goes. Returns how many messages were embedded.

        Raises:
            SemanticSearchUnavailable: there is no embedder.
        """
        check_callable(progress, "progress")
        return self._semantic.reindex(progress=progress)

    def semantic_index_state(self) -> dict[str, Any]:
        """The semantic index: the store's model and dimension, the embedder's, and why
        semantic search cannot answer (``None``: it can)."""
        model, dimension, watermark = self._semantic.state()
        embedder = self._semantic.embedder
        return {
            "model": model,
            "dimension": dimension,
            "watermark": watermark,
            "embedder": None if embedder is None else embedder.name,
            "unavailable": self._semantic.unavailable(),
        }

    def search_index_backlog(self) -> int:
        return self._search.backlog()

    def search_index_state(self) -> tuple[str, str | None]:
        return self._search.state()

    @_observe.instrument_load
    def load_transcript(
        self,
        session_id: str,
        *,
        after_seq: int | None = None,
        before_seq: int | None = None,
        limit: int | None = None,
        include_ancestors: bool = False,
        include_retracted: bool = False,
    ) -> list[StoredMessage]:
        return self._loader.messages(
            session_id,
            after_seq=after_seq,
            before_seq=before_seq,
            limit=limit,
            include_ancestors=include_ancestors,
            include_retracted=include_retracted,
        )

    @_observe.instrument_load
    def load_openai(
        self,
        session_id: str,
        *,
        after_seq: int | None = None,
        before_seq: int | None = None,
        limit: int | None = None,
        include_key: bool = False,
        include_retracted: bool = False,
    ) -> list[dict[str, Any]]:
        return self._loader.wire(
            session_id,
            after_seq=after_seq,
            before_seq=before_seq,
            limit=limit,
            include_key=include_key,
            include_retracted=include_retracted,
        )

    def close(self) -> None:
        self._db.dispose()

    # -- erasure ----------------------------------------------------------------------

    def erase(
        self,
        *,
        session_id: str | None = None,
        user_id: str | None = None,
        source: str | None = None,
        dry_run: bool = False,
        actor: str | None = None,
        scrub: bool = True,
        compact: bool = False,
    ) -> ErasureReport:
        """Erase every copy the store holds of one session, of a user's sessions or of
        a source's sessions, and leave tombstones so that nothing erased is stored again.

        Give exactly one selector. Reached too: the forks made from an erased session
        and its continuations (and theirs). Per session, in one transaction under its
        lock: its messages (live, retracted, compacted, compaction summaries), their
        search index entries and backlog, its ADK session, its rows in this database's
        outbox, the session row, and its tombstone (keyed hashes of its id and of its
        message keys, no content). Then the ADK user state no remaining session uses
        (every one of the user's, for ``user_id``), a content-free audit row, and the
        backend's scrub (SQLite: the search index merged, the WAL checkpointed and
        truncated; PostgreSQL: ``VACUUM`` of the tables erased from).

        Afterwards an append, a writer's write, a drain of any outbox (of this process
        or another), an import or a restore of an erased message stores nothing and
        reports it (``AppendResult.erased``, ``DrainReport.erased``,
        ``ImportReport.messages_erased``); new keys are stored as usual.

        Args:
            dry_run: erase nothing, write nothing; report what would go, per kind.
            actor: who asked, kept in the audit as given.
            scrub: run the backend's scrub afterwards (``False``: leave it to a later
                :meth:`scrub_erased`).
            compact: scrub by rewriting the files too (SQLite ``VACUUM``, PostgreSQL
                ``VACUUM FULL``: both take the database, or the tables, exclusively).

        Raises:
            InvalidArgument: not exactly one selector, or an empty one.
        """
        kind, value = check_selector(session_id, user_id, source)
        return self._eraser.erase(
            kind, value, dry_run=dry_run, actor=actor, scrub=scrub, compact=compact
        )

    def scrub_erased(self, *, compact: bool = False) -> ScrubReport:
        """The backend's scrub that :meth:`erase` runs after its deletes (see there)."""
        check_bool(compact, "compact")
        return self._eraser.scrub(compact=compact)

    def privacy_audit(self, *, limit: int = 100) -> list[AuditEntry]:
        """The newest ``limit`` rows of the privacy audit (erasures, retention runs),
        newest first: content-free."""
        check_limit(limit, "limit", maximum=MAX_PAGE)
        return self._db.read(lambda conn: read_audit(conn, limit))

    def retention_policies(self) -> list[RetentionPolicy]:
        """The stored retention policies, by source (``*``: every other source)."""
        return self._db.read(read_policies)

    def set_retention_policy(self, policy: RetentionPolicy) -> None:
        """Store ``policy``, replacing the source's previous one."""
        check_instance(policy, "policy", RetentionPolicy)
        _policy_source(policy.source, "policy.source")
        self._db.write(lambda conn: write_policy(conn, policy))

    def delete_retention_policy(self, source: str) -> bool:
        """Remove the source's policy; whether it had one."""
        _policy_source(source, "source")
        return self._db.write(lambda conn: drop_policy(conn, source))

    def apply_retention(
        self,
        *,
        dry_run: bool = False,
        actor: str | None = None,
        now: datetime | None = None,
        on_session: Callable[[str], None] | None = None,
    ) -> RetentionReport:
        """Erase what the stored policies say is due, through the same path as
        :meth:`erase` (one unit of work per session, tombstones, audit, scrub).

        Per policy (a source's, else ``*``'s): ended sessions whose end and last
        activity are older than ``ended_days``; open sessions idle longer than
        ``idle_days``; retracted and compacted messages made longer than
        ``superseded_days`` ago (the sessions stay). Each session is checked again
        under its lock: one written to or reopened since it was listed is kept.

        Args:
            dry_run: erase nothing; report what would go.
            now: the instant the periods are counted back from (default: now).
            on_session: called with each erased session's id (progress).
        """
        check_bool(dry_run, "dry_run")
        actor = check_optional_text(actor, "actor")  # as erase checks it
        if now is not None:
            check_instance(now, "now", datetime)
            if now.tzinfo is None:
                raise InvalidArgument("now", "must be timezone-aware")
        if on_session is not None:
            check_callable(on_session, "on_session")
        return self._eraser.retention(
            now=now or utcnow(), dry_run=dry_run, actor=actor, on_session=on_session
        )

    # -- operators (the operator's; the contract, SessionOperations, says what each means) --

    def count_sessions(self, selection: SessionFilter | None = None) -> int:
        return self._operator.count_sessions(selection)

    def session_snapshots(
        self,
        selection: SessionFilter | None = None,
        *,
        after_id: str | None = None,
        limit: int = 500,
    ) -> list[SessionSnapshot]:
        return self._operator.session_snapshots(selection, after_id=after_id, limit=limit)

    def count_messages(self, session_ids: Iterable[str]) -> int:
        return self._operator.count_messages(session_ids)

    def delete_ended_sessions(
        self,
        session_ids: Iterable[str],
        *,
        cutoff: datetime,
        unchanged_from: Mapping[str, SessionSnapshot] | None = None,
    ) -> PruneResult:
        return self._operator.delete_ended_sessions(
            session_ids, cutoff=cutoff, unchanged_from=unchanged_from
        )

    def restore_session(
        self, snapshot: SessionSnapshot, messages: Sequence[StoredMessage] = ()
    ) -> RestoreResult:
        return self._operator.restore_session(snapshot, messages)

    def backdate_activity(
        self, session_id: str, when: datetime, *, stamped_since: datetime
    ) -> bool:
        return self._operator.backdate_activity(session_id, when, stamped_since=stamped_since)


def _policy_source(value: object, field: str) -> str:
    if not isinstance(value, str):
        raise ArgumentTypeError(field, f"must be a string, got {type(value).__name__}")
    try:
        return check_identifier(value, field)
    except ValueError as exc:
        raise InvalidArgument(field, str(exc)) from None


def choose_embedder(embedder: object) -> Embedder | None:
    """``open_repository``'s ``embedder``: ``None`` (the default one, when the
    ``semantic`` extra is installed), ``False`` (none), or an :class:`Embedder`."""
    if embedder is None or embedder is True:
        return default_embedder()
    if embedder is False:
        return None
    try:
        return check_embedder(embedder)
    except TypeError as exc:
        raise ArgumentTypeError("embedder", str(exc)) from None


#: The ways appends keep the search index (see :func:`open_repository`).
_SEARCH_INDEX_MODES = (True, False, "immediate")
_ON_CONFLICT = ("report", "raise")


def _refuse_derived(fields: Mapping[str, Any], prefix: str) -> None:
    """The store keeps these from the transcript: a caller setting them would make the
    session lie about its own messages (``message_count=1000`` stored 1001)."""
    for name in DERIVED_FIELDS:
        if name in fields:
            raise InvalidMessage(
                f"{prefix}.{name}", "is derived from the transcript by the store; it cannot be set"
            )


def _check_reason(reason: object) -> str:
    reason = check_instance(reason, "reason", str)
    try:
        return check_identifier(reason, "reason", MAX_REASON_LENGTH)
    except ValueError as exc:
        raise InvalidMessage("reason", str(exc).removeprefix("reason: ")) from None


def open_repository(
    url: str | URL | None = None,
    *,
    auto_migrate: bool | None = None,
    require_connection: bool = True,
    search_index: bool | Literal["immediate"] = True,
    read_only: bool = False,
    append_memory: int = DEFAULT_MEMORY_BYTES,
    embedder: Embedder | bool | None = None,
    semantic_memory: int = DEFAULT_VECTOR_MEMORY,
    **options: Any,
) -> SessionRepository:
    """Open the store at ``url``.

    Args:
        url: a SQLAlchemy URL (``postgresql://…``, ``sqlite:///path.db``) or a file path;
            defaults to ``SESSIONREPO_DATABASE_URL``, else an embedded SQLite file under
            ``$XDG_DATA_HOME/sessionrepo/``.
        auto_migrate: upgrade an out-of-date schema instead of refusing. Defaults to
            ``True`` on SQLite (an embedded store looks after itself) and ``False`` on
            PostgreSQL, where migrating is the operator's step (``sessionrepo migrate``).
        require_connection: with ``False``, a database that cannot be reached now is
            not an error: the schema is checked on the first call that reaches it. A
            gateway writing through ``TranscriptWriter`` wants this, so that it starts
            (and parks messages in its outbox) while the primary is down.
        search_index: how appends keep the full-text index. ``True`` (the default):
            an append names its messages in the search backlog, in its own transaction,
            and they are indexed later, batched (by ``search``, which first indexes
            everything committed before it, by a ``TranscriptWriter``'s drainer, or by
            ``catch_up_search_index``): appends stay as fast as without an index.
            ``"immediate"``: an append indexes its messages in its own transaction
            (the index is complete at every commit; appends are several times slower).
            ``False``: appends do not maintain the index (a bulk load); the index is
            then marked stale, and search refuses until ``reindex``.
        read_only: open it for reading only (what the CLI's read commands and
            ``doctor`` do): never migrated, never created, a SQLite file opened
            ``mode=ro`` with its journal mode left alone, every PostgreSQL
            transaction ``READ ONLY``. Every call that writes raises
            :class:`RepoError`; ``search`` answers from the index as the last
            catch-up left it (it cannot index the backlog itself).
        append_memory: bytes this repository may hold to make re-flushes nearly free
            (default 64 MiB; ``0``: none): what each message sent was validated and
            encoded into, and that the database acknowledged it, so that the same dict
            (or ``Message``) sent again is neither validated nor sent again. The oldest
            is forgotten first; nothing of a message is kept beyond the bound, and a
            forgotten one costs only speed (it is validated and sent again, a no-op by
            its key). See :mod:`sessionrepo.store.memory`.
        embedder: what ``search(..., mode="semantic" | "hybrid")`` embeds with: ``None``
            (the default: Universal Sentence Encoder multilingual, when the
            ``semantic`` extra is installed; else semantic search is unavailable),
            ``False`` (none), or any :class:`~sessionrepo.search.embedders.Embedder`.
        semantic_memory: bytes this repository may hold to keep the store's vectors in
            memory between semantic searches (default 128 MiB, about 200,000 vectors of
            512 dimensions; ``0``: none): a query then costs a matrix-vector product and
            a read of its best rows, not a read of every vector. A store whose vectors
            do not fit is not kept (each query reads them). See
            :class:`sessionrepo.store.semantic.VectorCache`.
        **options: engine options: ``tenant`` (the tenant the store must serve this
            connection as; default ``$SESSIONREPO_TENANT``; see README, "Several
            gateways, one store"), ``pool_size``, ``max_overflow``, ``busy_timeout``
            (SQLite, seconds), ``sqlite_synchronous`` (default ``"FULL"``),
            ``connect_timeout`` (PostgreSQL, seconds), ``search_config`` (PostgreSQL
            text search configuration, default ``simple``), ``attempts`` (lock-race
            retries).

    Raises:
        SchemaOutOfDate: the database is not at this code's schema revision.
        BackendUnavailable: the database cannot be reached.
        NotARepository: a SQLite file that is not a sessionrepo store (another
            application's database), or, ``read_only``, no file at all.
        InvalidArgument: an argument or option is invalid or unknown (nothing was
            opened; :class:`~sessionrepo.errors.ArgumentTypeError`: of the wrong type).
    """
    check_open_arguments(auto_migrate, require_connection, search_index, read_only, append_memory)
    check_int(semantic_memory, "semantic_memory", minimum=0)
    embedder = choose_embedder(embedder) or False  # checked before anything is opened
    database = Database(url, read_only=read_only, **with_tenant(options))
    schema.check_schema(
        database,
        auto_migrate=False if read_only else auto_migrate,
        require_connection=require_connection,
    )
    return SessionRepository(
        database,
        search_index=search_index,
        append_memory=append_memory,
        embedder=embedder,
        semantic_memory=semantic_memory,
    )


def with_tenant(options: dict[str, Any]) -> dict[str, Any]:
    """The engine options, with ``tenant`` from ``SESSIONREPO_TENANT`` when not given (as
    the URL comes from ``SESSIONREPO_DATABASE_URL``): every command and the console then
    act as that tenant (an operator's role as one of them)."""
    if "tenant" not in options and os.environ.get("SESSIONREPO_TENANT"):
        return {**options, "tenant": os.environ["SESSIONREPO_TENANT"]}
    return options


def check_open_arguments(
    auto_migrate: object,
    require_connection: object,
    search_index: object,
    read_only: object = False,
    append_memory: object = DEFAULT_MEMORY_BYTES,
) -> None:
    """The arguments :func:`open_repository` and ``open_async_repository`` share, checked
    before anything is opened."""
    check_bool(read_only, "read_only")
    if auto_migrate is not None:
        check_bool(auto_migrate, "auto_migrate")
        if auto_migrate and read_only:
            raise InvalidArgument("auto_migrate", "a read-only repository is never migrated")
    check_bool(require_connection, "require_connection")
    check_choice(search_index, "search_index", _SEARCH_INDEX_MODES)
    check_int(append_memory, "append_memory", minimum=0)
