"""The synchronous repository: SQLAlchemy Core on the hot paths.

:class:`SessionRepository` implements :class:`sessionrepo.contract.SessionStore`, whose
docstrings state the guarantees; its methods check their arguments
(:mod:`.arguments`) before any SQL.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal
from uuid import UUID

from sqlalchemy import (
    ColumnElement,
    Connection,
    Text,
    and_,
    case,
    delete,
    func,
    literal,
    select,
    true,
    tuple_,
    update,
)
from sqlalchemy.engine import URL

import sessionrepo.observability as _observe
from sessionrepo.contract import SessionStore, TranscriptEditor
from sessionrepo.dialects.base import DirectLoad
from sessionrepo.errors import (
    ArgumentTypeError,
    InvalidArgument,
    InvalidMessage,
    NotFound,
    QueuedBehindOutbox,
    RepoError,
)
from sessionrepo.models import (
    AppendResult,
    EditResult,
    Message,
    SearchHit,
    Session,
    SessionPage,
    SessionSummary,
    StoredMessage,
)
from sessionrepo.models._limits import check_identifier
from sessionrepo.models.message import to_utc, utcnow
from sessionrepo.models.session import DERIVED_FIELDS
from sessionrepo.models.tables import (
    ENCODED_MARK,
    decode_text,
    messages_table,
    outbox_table,
    sessions_table,
)
from sessionrepo.search.text import content_text
from sessionrepo.store import codec as _codec
from sessionrepo.store import schema
from sessionrepo.store.append import Appender
from sessionrepo.store.append import PreparedBatch as PreparedBatch  # noqa: PLC0414 - re-exported
from sessionrepo.store.arguments import (
    check_aware_time,
    check_bool,
    check_callable,
    check_choice,
    check_instance,
    check_int,
    check_iterable,
    check_limit,
    check_many,
    check_optional_session_id,
    check_optional_text,
    check_seconds,
    check_seq,
    check_session_id,
    check_session_ids,
)
from sessionrepo.store.database import Database
from sessionrepo.store.editing import SessionEditor
from sessionrepo.store.memory import DEFAULT_MEMORY_BYTES, SentMemory
from sessionrepo.store.search_index import SearchIndex
from sessionrepo.store.transaction import SessionTransaction, fetch_session

S = sessions_table.c
M = messages_table.c
O = outbox_table.c  # noqa: E741

#: Characters of the first user message shown by ``list_sessions``.
PREVIEW_LENGTH = 120
#: A continuation chain longer than this is treated as a cycle.
_MAX_CHAIN = 10_000
#: Most sessions or search hits one call returns.
MAX_PAGE = 1000
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


@dataclass(frozen=True)
class SessionFilter:
    """Which sessions an operator's call is about: the given ids, or every session that
    matches all the filters set (none set: every session)."""

    session_ids: tuple[str, ...] = ()
    source: str | None = None
    user_id: str | None = None
    status: Literal["open", "ended"] | None = None
    #: Only sessions that ended before this instant (so only ended ones).
    ended_before: datetime | None = None
    #: Only sessions whose last activity is before this instant.
    active_before: datetime | None = None

    def _where(self) -> ColumnElement[bool]:
        ids = check_session_ids(self.session_ids, "selection.session_ids")
        if ids:
            filters = (
                self.source,
                self.user_id,
                self.status,
                self.ended_before,
                self.active_before,
            )
            if filters != (None,) * len(filters):
                raise InvalidArgument("selection", "give session ids or filters, not both")
            return S.id.in_(ids)
        check_optional_text(self.source, "selection.source")
        check_optional_text(self.user_id, "selection.user_id")
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
            raise InvalidArgument("status", "must be 'open', 'ended' or None")
        for name, bound, column in (
            ("ended_before", self.ended_before, S.ended_at),
            ("active_before", self.active_before, S.last_active_at),
        ):
            if bound is not None:
                clauses.append(column < check_aware_time(bound, name))
        return and_(true(), *clauses)


@dataclass(frozen=True)
class SessionSnapshot:
    """A session as one read found it, with the ``seq`` its next message would get: its
    messages then were exactly those with ``seq < next_seq`` (messages are never deleted
    but with their session), so the two make one consistent picture of it."""

    session: Session
    next_seq: int


@dataclass(frozen=True)
class RestoreResult:
    """What one :meth:`SessionRepository.restore_session` call did."""

    session_id: str
    #: ``created``: the store did not have the session; ``present``: it held it as the
    #: snapshot describes (what was missing was added); ``diverged``: it holds it
    #: differently, and nothing was written.
    outcome: Literal["created", "present", "diverged"]
    #: Keys stored by this call, each at the ``seq`` it was given.
    inserted: list[UUID] = field(default_factory=list)
    #: Keys already stored with the same content.
    duplicates: list[UUID] = field(default_factory=list)
    #: Keys already stored with different content (the stored row is kept).
    conflicts: list[UUID] = field(default_factory=list)


@dataclass(frozen=True)
class PruneResult:
    """What one :meth:`SessionRepository.delete_ended_sessions` call deleted."""

    #: The sessions deleted, as they were just before, by id.
    deleted: list[Session]
    #: Ids asked for but kept: not (or no longer) prunable, gone, or changed since their
    #: snapshot.
    kept: list[str]
    #: Messages deleted with them.
    messages: int
    #: ``pending_outbox`` rows (in this database) per deleted session that has any. They
    #: are left in place: they are the only copy of those messages.
    parked: dict[str, int]


class SessionRepository(SessionStore, TranscriptEditor):
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
    ) -> None:
        check_instance(database, "database", Database)
        check_choice(search_index, "search_index", _SEARCH_INDEX_MODES)
        check_int(append_memory, "append_memory", minimum=0)
        self._db = database
        self._search = SearchIndex(database)
        self._index_appends = search_index
        self._appender = Appender(database, self._search, search_index, SentMemory(append_memory))
        self._editor = SessionEditor(database, self._search, search_index)

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
        check_optional_text(source, "source")
        check_optional_text(user_id, "user_id")
        if status is not None:
            check_choice(status, "status", ("open", "ended"))
        limit = check_limit(limit, maximum=MAX_PAGE)
        last_page = None if cursor is None else _decode_cursor(cursor)
        first_user_message = (
            select(
                case(
                    # Content parts are stored as JSON: read enough of it to decode.
                    (
                        func.substr(M.content, 1, 1) == ENCODED_MARK,
                        func.substr(M.content, 1, 8192, type_=Text),
                    ),
                    else_=func.substr(M.content, 1, PREVIEW_LENGTH + 1, type_=Text),
                )
            )
            .where(M.session_id == S.id, M.role == "user", M.superseded.is_(None))
            .order_by(M.seq)
            .limit(1)
            .scalar_subquery()
        )
        query = select(sessions_table, first_user_message.label("preview"))
        if source is not None:
            query = query.where(S.source == source)
        if user_id is not None:
            query = query.where(S.user_id == user_id)
        if status == "open":
            query = query.where(S.ended_at.is_(None))
        elif status == "ended":
            query = query.where(S.ended_at.is_not(None))
        if last_page is not None:
            last_active, last_id = last_page
            query = query.where(tuple_(S.last_active_at, S.id) < tuple_(last_active, last_id))
        query = query.order_by(S.last_active_at.desc(), S.id.desc()).limit(limit + 1)

        rows = self._db.read(lambda conn: conn.execute(query).all())
        items = [
            SessionSummary.model_construct(
                **_codec.session_from_row(row, preview=_preview(row.preview))
            )
            for row in rows[:limit]
        ]
        next_cursor = None
        if len(rows) > limit:
            last = items[-1]
            assert last.last_active_at is not None
            next_cursor = _encode_cursor(last.last_active_at, last.id)
        return SessionPage(sessions=items, next_cursor=next_cursor)

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
                if row is None or row.id in seen or len(seen) > _MAX_CHAIN:
                    return tip
                seen.add(row.id)
                tip = Session.model_construct(**_codec.session_from_row(row))

        return self._db.read(work)

    def session_chain(self, session_id: str) -> list[Session]:
        sid = check_session_id(session_id)
        return self._db.read(lambda conn: self._chain(conn, sid))

    def _chain(self, conn: Connection, sid: str) -> list[Session]:
        chain = [self._get(conn, sid)]
        seen = {sid}
        while (parent := chain[-1].parent_session_id) is not None and len(chain) < _MAX_CHAIN:
            if parent in seen:
                raise RepoError(f"session {sid!r}: continuation chain loops at {parent!r}")
            seen.add(parent)
            try:
                chain.append(self._get(conn, parent))
            except NotFound:
                break  # the ancestor was pruned: the chain starts here now
        chain.reverse()
        return chain

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
        **session_defaults: Any,
    ) -> AppendResult:
        check_choice(on_conflict, "on_conflict", _ON_CONFLICT)
        batch = self.prepare(session_id, messages, **session_defaults)
        return self.append_prepared(batch, on_conflict=on_conflict)

    def prepare(
        self,
        session_id: str,
        messages: Iterable[Message | Mapping[str, Any]],
        **session_defaults: Any,
    ) -> PreparedBatch:
        """Validate and encode a batch for :meth:`append_prepared`; nothing is written.

        Raises:
            InvalidMessage: the batch cannot be stored faithfully, or a session default
                is derived (see :meth:`append`).
        """
        sid = check_session_id(session_id)
        check_iterable(messages, "messages")
        _refuse_derived(session_defaults, "session_defaults")
        validated, rows = self._appender.prepare(messages)
        session = _codec.build_session(sid, session_defaults, "session_defaults")
        return PreparedBatch(sid, validated, rows, session)

    @_observe.instrument_append
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
        result = self._appender.append(
            batch,
            database=self._db if timeout is None else self.bounded_database(timeout),
            on_conflict=on_conflict,
            behind_outbox=behind_outbox,
        )
        if result is None:
            raise QueuedBehindOutbox(batch.session_id)
        return result

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
    ) -> list[SearchHit]:
        check_instance(query, "query", str)
        check_optional_session_id(session_id)
        for name, value in (("source", source), ("role", role), ("user_id", user_id)):
            check_optional_text(value, name)
        check_choice(order, "order", ("rank", "newest"))
        limit = check_limit(limit, maximum=MAX_PAGE)
        offset = _search_offset(cursor)
        bounds: dict[str, datetime | None] = {}
        for name, moment in (("since", since), ("until", until)):
            if isinstance(moment, bool) or not isinstance(moment, datetime | int | float | None):
                raise ArgumentTypeError(
                    name, f"must be an aware datetime or epoch seconds, got {type(moment).__name__}"
                )
            try:
                bounds[name] = None if moment is None else to_utc(moment, name)
            except ValueError as exc:
                raise InvalidArgument(name, str(exc).removeprefix(f"{name}: ")) from None
        return self._search.search(
            query,
            session_id=session_id,
            source=source,
            role=role,
            user_id=user_id,
            since=bounds["since"],
            until=bounds["until"],
            order=order,
            limit=limit,
            offset=offset,
        )

    def reindex(self, *, progress: Callable[[int, int], None] | None = None) -> int:
        check_callable(progress, "progress")
        return self._search.reindex(progress=progress)

    @_observe.instrument_catch_up
    def catch_up_search_index(self, *, limit: int | None = None) -> int:
        if limit is not None:
            limit = check_limit(limit)
        return self._search.catch_up(limit)

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
        sid = check_session_id(session_id)
        after_seq = check_seq(after_seq, "after_seq")
        before_seq = check_seq(before_seq, "before_seq")
        if limit is not None:
            limit = check_limit(limit)
        include_ancestors = check_bool(include_ancestors, "include_ancestors")
        if include_ancestors and (after_seq, before_seq, limit) != (None, None, None):
            raise InvalidArgument("include_ancestors", "cannot be combined with a cursor")

        include_retracted = check_bool(include_retracted, "include_retracted")
        transcript = select(*_codec.load_columns).order_by(M.seq)
        if not include_retracted:
            transcript = transcript.where(M.superseded.is_(None))
        query = transcript.where(M.session_id == sid)
        if after_seq is not None:
            query = query.where(M.seq > after_seq)
        if before_seq is not None:
            query = query.where(M.seq < before_seq)
        backwards = before_seq is not None and after_seq is None and limit is not None
        if backwards:
            query = query.order_by(None).order_by(M.seq.desc())
        if limit is not None:
            query = query.limit(limit)

        if not include_ancestors:
            load = DirectLoad(
                sid,
                _codec.LOAD_COLUMNS,
                after_seq,
                before_seq,
                limit,
                backwards,
                live_only=not include_retracted,
            )
            rows = self._db.read_direct(lambda driver: self._db.dialect.load_direct(driver, load))
            if rows:
                messages = _codec.stored_messages(rows)
                if backwards:
                    messages.reverse()
                return messages
            # Nothing (or no such path): below, which tells an empty page from NotFound.

        def work(conn: Connection) -> list[StoredMessage]:
            ancestors: list[StoredMessage] = []
            if include_ancestors:
                for session in self._chain(conn, sid)[:-1]:
                    ancestors += self._messages(conn, transcript.where(M.session_id == session.id))
            messages = self._messages(conn, query)
            if not messages:
                self._get(conn, sid)  # an empty transcript, or NotFound
            if backwards:
                messages.reverse()
            return ancestors + messages

        return self._db.read(work)

    def _messages(self, conn: Connection, query: Any) -> list[StoredMessage]:
        return _codec.stored_messages(conn.execute(query))

    def close(self) -> None:
        self._db.dispose()

    # -- operators: export, restore, prune --------------------------------------------
    # What `sessionrepo.ops` (export, import, prune) and the importers need, so that
    # they never write SQL of their own.

    def count_sessions(self, selection: SessionFilter | None = None) -> int:
        """How many sessions ``selection`` names (default: every session).

        Raises:
            InvalidMessage: ``selection`` mixes ids and filters, or a bound is naive.
        """
        query = select(func.count()).select_from(sessions_table)
        query = query.where(_selection(selection)._where())
        return int(self._db.read(lambda conn: conn.execute(query).scalar_one()))

    def session_snapshots(
        self,
        selection: SessionFilter | None = None,
        *,
        after_id: str | None = None,
        limit: int = 500,
    ) -> list[SessionSnapshot]:
        """A page of the sessions ``selection`` names, by id, with their ``next_seq``.

        Ordered by id, not by activity: a session written to between two pages keeps
        its place. Each page is one read, so each snapshot is consistent (read its
        messages with ``load_transcript(..., before_seq=snapshot.next_seq)``).

        Args:
            after_id: the last id of the previous page (``None``: the first page).
            limit: sessions per page, 1 to 1000.

        Raises:
            InvalidArgument: ``limit`` is out of range, or the selection is invalid.
        """
        check_limit(limit, maximum=1000)
        query = select(sessions_table).where(_selection(selection)._where())
        if after_id is not None:
            query = query.where(S.id > _codec.check_session_id(after_id, "after_id"))
        query = query.order_by(S.id).limit(limit)
        rows = self._db.read(lambda conn: conn.execute(query).all())
        return [_snapshot(row) for row in rows]

    def count_messages(self, session_ids: Iterable[str]) -> int:
        """How many messages the given sessions hold together (every stored one)."""
        ids = check_session_ids(session_ids)
        if not ids:
            return 0
        query = select(func.count()).select_from(messages_table).where(M.session_id.in_(ids))
        return int(self._db.read(lambda conn: conn.execute(query).scalar_one()))

    def delete_ended_sessions(
        self,
        session_ids: Iterable[str],
        *,
        cutoff: datetime,
        unchanged_from: Mapping[str, SessionSnapshot] | None = None,
    ) -> PruneResult:
        """Delete those of ``session_ids`` that ended, and were last active, before
        ``cutoff``, with their messages and search entries; never a live session.

        Atomic: one transaction, which checks every session again under its row lock,
        so a session reopened or written to since the caller listed it is kept. Their
        ``pending_outbox`` rows stay (the only copy of those messages; a drain recreates
        the session) and are counted.

        Args:
            cutoff: an aware datetime.
            unchanged_from: snapshots by id (an export's): such a session is deleted
                only while it is still exactly as its snapshot describes.

        Raises:
            InvalidArgument: ``cutoff`` is naive, or an id is invalid.
        """
        check_aware_time(cutoff, "cutoff")
        ids = sorted(set(check_session_ids(session_ids)))
        if unchanged_from is not None and not isinstance(unchanged_from, Mapping):
            raise ArgumentTypeError(
                "unchanged_from", f"must be a mapping, got {type(unchanged_from).__name__}"
            )
        expected = unchanged_from or {}
        prunable = SessionFilter(ended_before=cutoff, active_before=cutoff)._where()

        def work(conn: Connection) -> PruneResult:
            if not ids:
                return PruneResult(deleted=[], kept=[], messages=0, parked={})
            current = self._db.dialect.select_locked(
                conn, select(sessions_table).where(prunable).order_by(S.id), S.id, ids
            )
            chosen = [
                snapshot
                for snapshot in map(_snapshot, current)
                if expected.get(snapshot.session.id, snapshot) == snapshot
            ]
            gone = [snapshot.session.id for snapshot in chosen]
            kept = sorted(set(ids) - set(gone))
            if not gone:
                return PruneResult(deleted=[], kept=kept, messages=0, parked={})
            # Explicit, not left to ON DELETE CASCADE alone: the count is reported, and
            # it holds on a connection where SQLite's foreign keys were left off.
            removed = conn.execute(
                delete(messages_table).where(M.session_id.in_(gone)),
                execution_options={"preserve_rowcount": True},
            ).rowcount
            conn.execute(delete(sessions_table).where(S.id.in_(gone)))
            self._db.dialect.forget_search_documents(conn, gone)
            parked = conn.execute(
                select(O.session_id, func.count())
                .where(O.session_id.in_(gone))
                .group_by(O.session_id)
            ).all()
            return PruneResult(
                deleted=[snapshot.session for snapshot in chosen],
                kept=kept,
                messages=int(removed),
                parked={sid: int(count) for sid, count in parked},
            )

        return self._db.write(work)

    def restore_session(
        self, snapshot: SessionSnapshot, messages: Sequence[StoredMessage] = ()
    ) -> RestoreResult:
        """Restore (part of) an exported session: each message at its exported ``seq``.

        Meant for importing an export, the one caller that may set a session's times
        from elsewhere. Atomic: one transaction, under the session's row lock. The
        messages go through :meth:`append`'s own insert (its key-based idempotency, its
        counters, its search indexing); only the times are then set as exported.

        - A session the store lacks is created as ``snapshot`` describes it (outcome
          ``created``): every field but the derived ones (``message_count``,
          ``tool_call_count``, ``next_seq``), which count the messages restored.
        - A session the store holds *as the snapshot describes* (every field equal but
          the derived ones, and no message at or past ``snapshot.next_seq``: a second
          import, or one resumed after an interruption) gets the messages it lacks
          (outcome ``present``).
        - Otherwise (a gateway wrote to it, it was ended or renamed since) nothing is
          written (outcome ``diverged``): the caller decides, e.g. ``append`` after the
          store's own messages.

        A message whose key is stored is skipped (a duplicate, or a conflict when its
        content differs), as ``append`` skips it.

        Args:
            snapshot: the session as exported, with its ``next_seq``.
            messages: some of its messages, ``seq`` ascending, each below ``next_seq``.

        Raises:
            InvalidMessage: a message cannot be stored, or does not belong there.
            RepoError: the store holds the session as described but another message
                at one of these ``seq`` (the export and the database disagree); nothing
                was written.
        """
        check_instance(snapshot, "snapshot", SessionSnapshot)
        session = check_instance(snapshot.session, "snapshot.session", Session)
        check_int(snapshot.next_seq, "snapshot.next_seq", minimum=1)
        messages = check_many(messages, "messages", "stored messages")
        sid = _codec.check_session_id(session.id)
        last = 0
        for index, message in enumerate(messages):
            check_instance(message, f"messages[{index}]", StoredMessage)
            if message.session_id != sid:
                raise InvalidMessage(f"messages[{index}].session_id", f"must be {sid!r}")
            if not last < message.seq < snapshot.next_seq:
                raise InvalidMessage(
                    f"messages[{index}].seq",
                    f"must be ascending, after {last} and before next_seq {snapshot.next_seq}",
                )
            last = message.seq
        validated, rows = self._appender.prepare(messages)
        new_row = _codec.session_row(session) | {"message_count": 0, "tool_call_count": 0}
        seqs = [message.seq for message in messages]

        with SessionTransaction(self._appender, self._editor, self._db, sid, new_row) as tx:
            conn, next_seq = tx.connection, tx.next_seq
            if not tx.created and not _restorable(tx.session(), next_seq, snapshot):
                return RestoreResult(session_id=sid, outcome="diverged")
            appender = self._appender
            inserted: list[UUID] = []
            duplicates: list[UUID] = []
            conflicts: list[UUID] = []
            # Below the stored next_seq: what the session already holds, found by key.
            held = [index for index, seq in enumerate(seqs) if seq < next_seq]
            if held:
                found = appender.insert_new(conn, sid, next_seq, [rows[i] for i in held])
                if found.inserted:
                    key = found.inserted[0]
                    seq = next(seqs[i] for i in held if validated[i].client_msg_uuid == key)
                    raise self._disagree(conn, sid, seq, key)
                duplicates += found.duplicates
                conflicts += found.conflicts
            # From there on, runs of consecutive seq, each appended where the export has
            # it (a gap in the export stays a gap).
            for run in _runs(seqs, len(held)):
                start = seqs[run[0]]
                if start != next_seq:
                    conn.execute(update(sessions_table).where(S.id == sid).values(next_seq=start))
                added = appender.insert_new(conn, sid, start, [rows[i] for i in run])
                if len(added.inserted) != len(run):  # a key stored at another seq
                    stored = set(added.duplicates) | set(added.conflicts)
                    index = next(i for i in run if validated[i].client_msg_uuid in stored)
                    raise RepoError(
                        f"session {sid!r}: message {validated[index].client_msg_uuid} is "
                        f"stored here, not at its exported seq {seqs[index]}; the export "
                        "and the database disagree"
                    )
                appender.index_inserted(conn, added, [validated[i] for i in run])
                inserted += added.inserted
                next_seq = start + len(run)
            # What an edit had superseded when it was exported is superseded again.
            states: dict[Literal["retracted", "compacted"], tuple[list[int], int]] = {}
            fresh = set(inserted)
            for message in messages:
                if message.superseded is not None and message.client_msg_uuid in fresh:
                    marked, calls = states.get(message.superseded, ([], 0))
                    marked.append(message.seq)
                    states[message.superseded] = (marked, calls + len(message.tool_calls or ()))
            for state, (marked, calls) in states.items():
                self._editor.mark_superseded(conn, sid, marked, calls, state)
            if inserted:  # the appends stamped the session with the time of now
                conn.execute(
                    update(sessions_table)
                    .where(S.id == sid)
                    .values(last_active_at=new_row["last_active_at"])
                )
            return RestoreResult(
                session_id=sid,
                outcome="created" if tx.created else "present",
                inserted=inserted,
                duplicates=duplicates,
                conflicts=conflicts,
            )

    def _disagree(self, conn: Connection, sid: str, seq: int, key: UUID) -> RepoError:
        holder = conn.execute(
            select(M.client_msg_uuid).where(M.session_id == sid, M.seq == seq)
        ).scalar()
        held = "no message" if holder is None else f"message {holder}"
        return RepoError(
            f"session {sid!r}: seq {seq} holds {held} in this database, not {key}; the "
            "export and the database disagree"
        )

    def backdate_activity(
        self, session_id: str, when: datetime, *, stamped_since: datetime
    ) -> bool:
        """Date a session by the history an importer just stored: its last activity
        becomes ``when`` (the newest imported message, or its end), not the moment of
        the import, so that listings keep the source's order.

        The importer's own appends stamped the session with their time: a stamp from
        ``stamped_since`` (when the import began) on is replaced, and so is one older
        than ``when``; a stamp between the two is real activity newer than the imported
        history, and stays. Atomic (one statement).

        Returns:
            Whether the stamp changed.

        Raises:
            NotFound: no such session.
            InvalidArgument: a time is naive.
        """
        sid = _codec.check_session_id(session_id)
        check_aware_time(when, "when")
        check_aware_time(stamped_since, "stamped_since")
        stamp = S.last_active_at

        def work(conn: Connection) -> bool:
            changed = conn.execute(
                update(sessions_table)
                .where(S.id == sid, (stamp >= stamped_since) | (stamp < when))
                .values(last_active_at=when)
            ).rowcount
            if not changed:
                self._get(conn, sid)  # NotFound, or a newer stamp that stays
            return bool(changed)

        return self._db.write(work)


def _activity(row: Any) -> tuple[datetime, str]:
    return (row.last_active_at, row.id)


def _selection(selection: object) -> SessionFilter:
    """An operator call's ``selection``: ``None`` (every session) or a SessionFilter."""
    if selection is None:
        return SessionFilter()
    return check_instance(selection, "selection", SessionFilter)


def _encode_cursor(last_active_at: datetime, session_id: str) -> str:
    raw = json.dumps([last_active_at.isoformat(), session_id]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_cursor(cursor: object) -> tuple[datetime, str]:
    cursor = check_instance(cursor, "cursor", str)
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        when, sid = json.loads(base64.urlsafe_b64decode(padded))
        last_active = datetime.fromisoformat(when)
        if last_active.tzinfo is None or not isinstance(sid, str):
            raise ValueError("not written by _encode_cursor")
        return last_active, check_identifier(sid, "cursor")
    except (ValueError, TypeError) as exc:
        raise InvalidArgument("cursor", "not a cursor returned by list_sessions") from exc


def _search_offset(cursor: object) -> int:
    """``search``'s cursor (the hits already read: an ``int``, or its digits as text,
    as a command line hands it over) as an offset."""
    if isinstance(cursor, str):
        text = cursor.strip()
        if not text.isascii() or not text.isdigit():
            raise InvalidArgument("cursor", "must be the number of hits already read")
        cursor = int(text)
    return 0 if cursor is None else check_int(cursor, "cursor")


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


def _snapshot(row: Any) -> SessionSnapshot:
    return SessionSnapshot(
        Session.model_construct(**_codec.session_from_row(row)), int(row.next_seq)
    )


#: Session fields that count what the session holds: a restore derives them.
_DERIVED = {"message_count", "tool_call_count"}


def _restorable(current: Session, next_seq: int, snapshot: SessionSnapshot) -> bool:
    """Whether the stored session is ``snapshot``'s, restored in part or whole."""
    described = snapshot.session.model_dump(mode="json", by_alias=True, exclude=_DERIVED)
    stored = current.model_dump(mode="json", by_alias=True, exclude=_DERIVED)
    return next_seq <= snapshot.next_seq and stored == described


def _runs(seqs: Sequence[int], start: int) -> list[list[int]]:
    """Positions from ``start`` on, in runs of consecutive ``seqs``."""
    runs: list[list[int]] = []
    for index in range(start, len(seqs)):
        if runs and seqs[index] == seqs[runs[-1][-1]] + 1:
            runs[-1].append(index)
        else:
            runs.append([index])
    return runs


def _preview(stored: str | None) -> str | None:
    if stored is None:
        return None
    if stored.startswith(ENCODED_MARK):
        try:
            value = decode_text(stored)
            stored = value if isinstance(value, str) else content_text(value)
        except ValueError:  # cut inside the JSON: show its text without the mark
            stored = stored[len(ENCODED_MARK) :]
    text = " ".join(stored.split())
    return text if len(text) <= PREVIEW_LENGTH else text[: PREVIEW_LENGTH - 1] + "…"


def open_repository(
    url: str | URL | None = None,
    *,
    auto_migrate: bool | None = None,
    require_connection: bool = True,
    search_index: bool | Literal["immediate"] = True,
    read_only: bool = False,
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
        **options: engine options: ``pool_size``, ``max_overflow``, ``busy_timeout``
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
    check_open_arguments(auto_migrate, require_connection, search_index, read_only)
    database = Database(url, read_only=read_only, **options)
    schema.check_schema(
        database,
        auto_migrate=False if read_only else auto_migrate,
        require_connection=require_connection,
    )
    return SessionRepository(database, search_index=search_index)


def check_open_arguments(
    auto_migrate: object,
    require_connection: object,
    search_index: object,
    read_only: object = False,
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
