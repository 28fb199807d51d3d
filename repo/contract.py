"""The contract every sessionrepo store and writer keeps, whatever the backend.

The guarantees are stated here once; the implementations (:class:`SessionRepository`,
:class:`TranscriptWriter`) inherit these protocols explicitly, so ``help()`` shows this
text on their methods and mypy holds their signatures to it, and they carry only "why"
comments. The asyncio classes (``AsyncSessionRepository``, ``AsyncTranscriptWriter``)
offer the same methods awaited, with these docstrings. The contract test suite
(``tests/``) holds every implementation to them, on every backend.

Errors common to every method (see :mod:`sessionrepo.errors`): an argument of the wrong
type raises :class:`~sessionrepo.errors.ArgumentTypeError` (a ``TypeError``), one out of
range :class:`~sessionrepo.errors.InvalidArgument` (a ``ValueError``), both before any
SQL, identically on every backend; :class:`~sessionrepo.errors.BackendUnavailable` when the
database cannot do the work now. Nothing else escapes: every error is a
:class:`~sessionrepo.errors.RepoError`, and reads never raise
:class:`~sessionrepo.errors.WriteRejected`. Session ids are 1-255 characters without
control characters (one that is not a string raises ``ArgumentTypeError``, a string that
cannot be one :class:`~sessionrepo.errors.InvalidMessage`, as when storing); a ``seq`` is
an ``int`` (not a bool) in ``0..2**63-1``; limits are positive ``int`` values.

It sits just above the models: it names their types, and defines the few value types
of its own that the operator methods take and return, and nothing else of sessionrepo.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, Protocol
from uuid import UUID

from sessionrepo.models import (
    AppendResult,
    EditResult,
    Message,
    SearchHit,
    Session,
    SessionPage,
    StoredMessage,
)
from sessionrepo.models.outbox import DrainReport, OutboxStatus, WriteResult


class SessionStore(Protocol):
    """Conversation transcripts, stored once each, in order, with every field."""

    @property
    def backend(self) -> str:
        """``"sqlite"`` or ``"postgresql"``."""
        ...

    def create_session(self, /, session_id: str, **fields: Any) -> Session:
        """Create a session, idempotently.

        Creating a session that exists changes no value already set: it fills in the
        fields that are still empty (``None``, or source ``"unknown"``), which is how a
        session first created by :meth:`append` gets its real attributes later.

        Args:
            session_id: the gateway's own id for the conversation.
            **fields: :class:`~sessionrepo.models.Session` fields (``source``,
                ``user_id``, ``title``, ``model``, ``model_settings``, ``metadata``,
                ``started_at``, ...). The fields the store derives from the transcript
                (``message_count``, ``tool_call_count``, ``next_seq``,
                ``last_active_at``) cannot be set.

        Returns:
            The stored session.

        Raises:
            InvalidMessage: a field is unknown, derived, or cannot be stored (its
                ``field`` names it, ``session.<name>``); nothing was written.
        """
        ...

    def get_session(self, session_id: str) -> Session:
        """The stored session.

        Raises:
            NotFound: no such session.
        """
        ...

    def list_sessions(
        self,
        *,
        source: str | None = None,
        user_id: str | None = None,
        status: Literal["open", "ended"] | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> SessionPage:
        """Sessions, newest activity first, a page at a time (keyset cursor: a session
        created while paging never shifts or repeats the pages after it).

        Args:
            source: only sessions from this platform.
            user_id: only this user's sessions.
            status: ``"open"`` or ``"ended"`` sessions only (``None``: both).
            limit: sessions per page, 1 to 1000.
            cursor: ``next_cursor`` of the previous page; ``None`` (the default) asks
                for the first page. The last page's ``next_cursor`` is ``None`` (and a
                full last page has none after it), so a loop pages until it is ``None``:
                passing that ``None`` back would start again at the first page.

        Raises:
            InvalidArgument: a filter, the limit or the cursor is invalid (a cursor not
                returned by this method, say).
        """
        ...

    def end_session(self, session_id: str, reason: str) -> bool:
        """End a session. The first reason wins: returns ``True`` when this call ended it,
        ``False`` (changing nothing) when it was already ended.

        Args:
            reason: why it ended (``"compression"``, ``"user_left"``...): a non-empty
                string of at most 1024 characters without control characters.

        Raises:
            ArgumentTypeError: ``reason`` is not a string (``None`` included).
            InvalidMessage: ``reason`` is empty or cannot be stored.
            NotFound: no such session.
        """
        ...

    def reopen_session(self, session_id: str) -> bool:
        """Undo an end: returns ``True`` when the session was ended and is now open,
        ``False`` (changing nothing) when it was open.

        Raises:
            NotFound: no such session.
        """
        ...

    def resolve_tip(self, session_id: str) -> Session:
        """The live end of the continuation chain ``session_id`` belongs to: follow the
        most recently active child (``parent_session_id``) until there is none.

        Raises:
            NotFound: no such session.
        """
        ...

    def session_chain(self, session_id: str) -> list[Session]:
        """The session and its ancestors (``parent_session_id``), oldest first. An
        ancestor that was pruned ends the chain.

        Raises:
            NotFound: no such session.
        """
        ...

    def session_transaction(
        self,
        /,
        session_id: str,
        *,
        create: bool = True,
        timeout: float | None = None,
        **session_defaults: Any,
    ) -> AbstractContextManager[SessionUnitOfWork]:
        """A unit of work on one session: one transaction under the session's lock.

        ``with store.session_transaction(sid) as tx:`` begins a write transaction and
        locks the session's row, as :meth:`append` does: appends, edits and other units
        of work of that session wait for it; other sessions' do not. A missing session
        is created from ``session_defaults`` (``tx.created`` says so), or, with
        ``create=False``, raises :class:`NotFound` having written nothing. Inside,
        :class:`SessionUnitOfWork` offers the session, its next ``seq``, ``append``,
        ``retract`` and ``supersede``; an implementation may add a door for an
        extension's own statements in the same transaction (``SessionTransaction``:
        ``execute`` and ``connection``). The block's normal end commits all of it; an
        exception leaving the block rolls all of it back, and is raised as it was
        (database errors as the :class:`RepoError` they mean). A lost lock race while
        the lock is taken is retried; inside the block, the body is the caller's and is
        never rerun: a lost race there raises :class:`BackendUnavailable` (nothing
        committed; the whole block may be run again).

        The object cannot outlive its transaction: used before its ``with`` or after,
        it raises :class:`RepoError`. Asyncio: ``async with`` and each method awaited.

        Args:
            session_id: the session to lock.
            create: create the session when it is missing (the default).
            timeout: seconds the database may spend on each statement and lock wait
                (as for a writer's deadline); ``None``: no limit.
            **session_defaults: the :meth:`create_session` fields of a session this
                call creates (the derived ones refused).

        Raises:
            InvalidMessage: a session default cannot be stored, or is derived.
            InvalidArgument: ``session_defaults`` given with ``create=False``.
            NotFound: (on entry) ``create=False`` and there is no such session.
            BackendUnavailable: (on entry, or at the commit) the database could not
                take the transaction now.
        """
        ...

    def append(
        self,
        session_id: str,
        messages: Iterable[Message | Mapping[str, Any]],
        *,
        on_conflict: Literal["report", "raise"] = "report",
        usage: Any = None,
        **session_defaults: Any,
    ) -> AppendResult:
        """Append messages to a session's transcript, atomically and idempotently.

        - The whole batch lands or none of it.
        - A message whose ``client_msg_uuid`` is already stored in the session is skipped:
          listed in ``duplicates`` when its content is the same, in ``conflicts`` when it
          differs (the stored row is never changed). Identity is the key, never content.
        - Inserted messages get the next ``seq`` numbers, in batch order. Appenders to one
          session are serialised by the database (its ``sessions`` row lock); appenders
          to different sessions do not wait for each other.
        - The session row is created (from ``session_defaults``) if it does not exist.
        - Counters move only for inserted messages.

        Args:
            session_id: the session to append to.
            messages: :class:`~sessionrepo.models.Message` objects or OpenAI-format
                dicts (a dict without ``client_msg_uuid`` is stamped in place, so that
                flushing it again inserts nothing).
            on_conflict: ``"report"`` lists conflicting keys in the result;
                ``"raise"`` (a strict append, for imports and migrations that must not
                diverge silently) raises :class:`ConflictError` instead and writes
                nothing of the batch.
            usage: what the model calls behind these messages used
                (:class:`~sessionrepo.models.usage.Usage` records or dicts, one or a
                list), stored in the usage ledger in the same transaction. A record
                without ``message_uuid`` belongs to the batch's last message; without
                ``usage_id`` it takes its message's key, so flushing the same message
                with the same usage again counts nothing twice (a stored key is
                skipped). The session's token totals move only for inserted records.
            **session_defaults: the :meth:`create_session` fields of a session this
                call creates (the derived ones refused just the same).

        Raises:
            InvalidMessage: a message, a usage record or a session default cannot be
                stored faithfully, or is derived (nothing was written).
            ConflictError: ``on_conflict="raise"`` and a key is stored with other
                content (nothing was written).
            BackendUnavailable: the database could not take the batch right now.
            WriteRejected: the database refused the data itself.
        """
        ...

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
        """Messages in ``seq`` order (the order they were appended, never by clock).

        ``after_seq``/``limit`` page forward; ``before_seq``/``limit`` page backward (the
        ``limit`` messages just before ``before_seq``, still in ascending order).
        ``include_ancestors`` prepends the transcripts of the session's ancestors.
        The live transcript only, unless ``include_retracted``: then the messages an
        edit superseded too (``StoredMessage.superseded`` says which and why).

        Args:
            after_seq: only messages after this ``seq`` (an ``int``, ``0..2**63-1``).
            before_seq: only messages before this ``seq`` (the same range).
            limit: at most this many messages (a positive ``int``).
            include_ancestors: not combinable with a cursor or a limit.

        Raises:
            NotFound: no such session.
            InvalidArgument: a cursor or the limit is out of range, or combined with
                ``include_ancestors`` (:class:`ArgumentTypeError`: not an ``int``).
        """
        ...

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
        """The live transcript as the OpenAI wire dicts a gateway sends to the model, in
        ``seq`` order, decoded straight from the stored columns (no ``StoredMessage`` is
        built): each equals ``to_openai(include_key=include_key)`` of the message
        ``load_transcript`` returns at its place, and is the caller's to change. The
        cursors page as ``load_transcript``'s do (``before_seq``/``limit``: the
        ``limit`` newest before it, still in ascending order).

        Args:
            after_seq: only messages after this ``seq``.
            before_seq: only messages before this ``seq``.
            limit: at most this many messages.
            include_key: add ``client_msg_uuid`` (a re-flush of the dicts then stores
                nothing).
            include_retracted: the messages an edit superseded too, in their places (as
                ``load_transcript``'s; a wire dict does not say which they are).

        Raises:
            NotFound: no such session.
            InvalidArgument: a cursor or the limit is out of range.
        """
        ...

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
        """Messages whose content matches ``query``, best first (or newest first).

        ``query`` is words (all must occur), "quoted phrases", ``prefix*`` and
        ``-excluded`` words; any other character is literal text, so no input is a
        syntax error. Only the live transcript is searched; every hit is checked against
        the message's text. Messages appended before the call are found: search first
        indexes what appends left in the search backlog.

        Args:
            query: what to look for.
            session_id: only this session's messages.
            source: only sessions from this platform.
            role: only messages of this role.
            user_id: only this user's sessions.
            since: only messages made at or after this instant (an aware datetime or
                epoch seconds).
            until: only messages made before this instant.
            order: ``"rank"`` (relevance) or ``"newest"``.
            limit: hits per page, 1 to 1000.
            cursor: the number of hits already read (``cursor=len(previous_hits)``).
            mode: ``"keyword"`` (the words, as above), ``"semantic"`` (the messages
                nearest in meaning, by the repository's embedder; ``order`` does not
                apply) or ``"hybrid"`` (both rankings fused by reciprocal rank). The
                last two return a :class:`~sessionrepo.models.SearchResults`, whose
                ``complete`` and ``notice`` say when vectors were missing or of another
                model; hybrid then still returns every keyword hit. Vectors are made by
                a catch-up (this call does up to 500 messages first), never by appends.

        Raises:
            SearchIndexUnavailable: the index is stale or broken (``reindex`` fixes it).
            SemanticSearchUnavailable: ``mode="semantic"`` without an embedder, or with
                vectors of another model (``reindex --semantic`` fixes it).
            InvalidArgument: a filter, the order, the limit, the cursor or the mode is
                invalid.
        """
        ...

    def reindex(self, *, progress: Callable[[int, int], None] | None = None) -> int:
        """Rebuild the search index from the messages (after corruption, or an upgrade
        over existing messages), in one transaction that also empties the search
        backlog; returns how many messages were indexed. Appends wait for it, or park
        through a ``TranscriptWriter``.

        Args:
            progress: called with ``(done, total)`` messages after each batch, inside
                the rebuild's transaction: if it raises, the rebuild is rolled back and
                its error is raised chained to a :class:`RepoError`.
        """
        ...

    def catch_up_search_index(self, *, limit: int | None = None) -> int:
        """Index messages appended since the last catch-up (``search`` does this first,
        and a ``TranscriptWriter``'s drainer every round); returns how many were indexed.

        Safe to run from several processes at once: no message is indexed twice. An
        indexing failure marks the index stale instead of raising (``reindex`` repairs
        it) and never affects appends.

        Args:
            limit: stop after about this many messages (``None``: the whole backlog).

        Raises:
            BackendUnavailable: the database cannot be reached (nothing is lost: the
                backlog stays for the next catch-up).
        """
        ...

    def search_index_backlog(self) -> int:
        """How many appended messages wait for the catch-up to index them."""
        ...

    def search_index_state(self) -> tuple[str, str | None]:
        """``("ok", None)``, or ``("stale", why)`` when search refuses until a reindex."""
        ...

    def close(self) -> None:
        """Release the connection pool. The store is unusable afterwards."""
        ...


class SessionUnitOfWork(Protocol):
    """What a unit of work (:meth:`SessionStore.session_transaction`) offers, inside its
    block, while it holds the session's lock. Each write is part of the one transaction:
    none is visible to others before the block commits, all are undone if it rolls back.
    """

    @property
    def session_id(self) -> str:
        """The session this unit of work holds."""
        ...

    @property
    def created(self) -> bool:
        """Whether this unit of work created the session (it was missing on entry)."""
        ...

    @property
    def next_seq(self) -> int:
        """The ``seq`` the next appended message gets (it moves as this unit appends)."""
        ...

    def session(self) -> Session:
        """The session as it stands inside this transaction."""
        ...

    def append(
        self,
        messages: Iterable[Message | Mapping[str, Any]],
        *,
        on_conflict: Literal["report", "raise"] = "report",
    ) -> AppendResult:
        """:meth:`SessionStore.append` inside the transaction, with the same validation
        (before anything is written), key-based skipping, conflict reporting, counters
        and search indexing; the messages get the next ``seq`` numbers, in order.

        Raises:
            InvalidMessage: a message cannot be stored; nothing of the batch was written.
            ConflictError: ``on_conflict="raise"`` and a key is stored with other
                content; nothing of the batch was written (the transaction goes on
                unless the error leaves the block).
        """
        ...

    def retract(self, keys: Iterable[Any]) -> EditResult:
        """:meth:`TranscriptEditor.retract` inside the transaction.

        Raises:
            NotFound: a key the session does not hold (nothing was retracted).
        """
        ...

    def supersede(
        self, keys: Iterable[Any], state: Literal["retracted", "compacted"] = "retracted"
    ) -> list[Any]:
        """Take the live messages with these keys (at least one; ``UUID`` or its text)
        out of the live transcript, marked ``state``: out of the counters, the preview
        and search, still stored, as the edits do. Keys the session does not hold live
        are skipped. Returns the keys taken out, in ``seq`` order."""
        ...


class TranscriptEditor(Protocol):
    """Taking things back without losing history (see :mod:`sessionrepo.store.editing`).

    An edit marks messages *superseded*: they leave the live transcript (the default
    ``load_transcript``), the session's counters, ``list_sessions``' preview and
    ``search``, and stay stored (``load_transcript(include_retracted=True)``, export,
    import). A superseded key stays taken: re-sending that message is a duplicate and
    does not bring it back. ``seq`` stays gap-free over what is stored. Every edit is one
    transaction under the session's lock, serialised with appends to the session.
    """

    def rewind(self, /, session_id: str, to_seq: int) -> EditResult:
        """Take every live message after ``to_seq`` out of the live transcript
        (``to_seq=0``: all of them). Sending it again changes nothing.

        Raises:
            NotFound: no such session.
        """
        ...

    def retract(self, /, session_id: str, keys: Iterable[Any]) -> EditResult:
        """Take the messages with these keys (``UUID`` or its text) out of the live
        transcript; keys already out of it are left as they are.

        Raises:
            NotFound: no such session, or a key the session does not hold (nothing was
                retracted).
        """
        ...

    def pop_last(self, /, session_id: str) -> EditResult:
        """Rewind by one *logical* step: the last live message, with what cannot stay
        without it (tool outputs take their call and its other outputs; a reasoning
        item left last goes too), so the transcript left is valid to send
        (:func:`sessionrepo.is_sendable`) if it was before. An empty transcript: nothing.

        Raises:
            NotFound: no such session.
        """
        ...

    def clear_session(self, /, session_id: str) -> EditResult:
        """Empty the live transcript (history kept; deleting for real is ``prune``).

        Raises:
            NotFound: no such session.
        """
        ...

    def compact(
        self, /, session_id: str, through_seq: int, summary_message: Message | Mapping[str, Any]
    ) -> EditResult:
        """Replace the live messages up to ``through_seq`` by ``summary_message``,
        atomically: they are marked ``compacted`` (kept as history), the summary is
        stored at ``through_seq + 1`` and every message after it moves up one ``seq``
        (its key, content and order unchanged). Sending the same compaction again (the
        same summary key and content) is a no-op.

        Raises:
            NotFound: no such session.
            InvalidArgument: ``through_seq`` is past the last message.
            InvalidMessage: the summary cannot be stored.
            ConflictError: the summary's key is stored already as something else.
        """
        ...

    def fork_session(self, /, source_id: str, at_seq: int, new_id: str, **fields: Any) -> Session:
        """A new session whose transcript starts as ``source_id``'s messages 1..``at_seq``
        (copied with their keys, ``seq`` and superseded state; live counters to
        match), recording ``forked_from_session_id`` and ``forked_from_seq``. Its other
        fields are the source's unless given in ``fields``. Appends to either session
        are independent. Forking again to ``new_id`` at the same point returns the fork
        and writes nothing.

        Raises:
            NotFound: no session ``source_id``.
            InvalidArgument: ``at_seq`` is past the source's last message, or ``new_id``
                is the source's.
            ConflictError: ``new_id`` exists and is not this fork.
        """
        ...


# -- the operator methods ---------------------------------------------------------------


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
    #: differently, and nothing was written; ``erased``: every message given was erased
    #: from the session (its tombstone), and nothing was written.
    outcome: Literal["created", "present", "diverged", "erased"]
    #: Keys stored by this call, each at the ``seq`` it was given.
    inserted: list[UUID] = field(default_factory=list)
    #: Keys already stored with the same content.
    duplicates: list[UUID] = field(default_factory=list)
    #: Keys already stored with different content (the stored row is kept).
    conflicts: list[UUID] = field(default_factory=list)
    #: Keys an erasure removed from the session: not restored.
    erased: list[UUID] = field(default_factory=list)


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


class SessionOperations(Protocol):
    """What the operator tools (``sessionrepo.ops``: export, import, prune) and the
    importers need of a store, so that they never write SQL of their own: counts and
    consistent snapshots, restoring an export, pruning, backdating an import."""

    def count_sessions(self, selection: SessionFilter | None = None) -> int:
        """How many sessions ``selection`` names (default: every session).

        Raises:
            InvalidMessage: ``selection`` mixes ids and filters, or a bound is naive.
        """
        ...

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
        ...

    def count_messages(self, session_ids: Iterable[str]) -> int:
        """How many messages the given sessions hold together (every stored one)."""
        ...

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
        ...

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
        ...

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
        ...


class ResilientWriter(Protocol):
    """The write path a gateway calls: nothing acknowledged is lost, nothing is written
    twice, and a transcript never comes back reordered, whatever the primary store does.

    ``write`` stores a batch in the primary store or, when the primary cannot take it for
    an operational reason, parks it in a durable pending outbox; ``drain`` replays parked
    batches later, in order, per session. Replay is idempotent by the message key, so a
    crash at any instant (between the primary's commit and the outbox's delete included)
    loses nothing and duplicates nothing.
    """

    def write(
        self,
        /,
        session_id: str,
        messages: Iterable[Message | Mapping[str, Any]],
        *,
        usage: Any = None,
        **session_defaults: Any,
    ) -> WriteResult:
        """Store a batch durably, in the primary or in the outbox.

        - Returns only after a durable commit: in the primary (``status="stored"``, with
          what :meth:`SessionStore.append` reports), or in the outbox
          (``status="parked"``, with why). A durable outbox is one that survives a power
          cut (a SQLite outbox runs WAL with ``synchronous=FULL``).
        - Parks only for operational reasons (down, locked, disk or I/O error, read-only,
          a broken search index, no answer within the writer's deadline), decided by
          SQLSTATE / SQLite result code. Returns within the deadline even when the
          primary hangs; the abandoned attempt may still commit later, and the key makes
          its replay a no-op.
        - Per-session FIFO: while a session has parked messages, new ones for it are
          parked behind them, so replay can never reorder its transcript.
        - Invalid input is never parked.
        - ``usage`` (as for :meth:`SessionStore.append`) goes with its messages: stored
          with them, or parked with them and replayed with them, counted once.

        Raises:
            InvalidMessage: bad input (never parked; nothing was written).
            WriteRejected: the primary refused this data itself (never parked).
            BackendUnavailable: neither the primary nor the outbox could take the batch;
                nothing was acknowledged and the caller still holds the messages.
            RepoError: the writer is closed.
        """
        ...

    def drain(self, *, session_id: str | None = None, ignore_backoff: bool = False) -> DrainReport:
        """Replay parked messages, oldest first per session, until none is due.

        A row leaves the outbox only after the primary has committed its message. A
        session whose replay fails keeps its rows (attempts, last error, next retry with
        exponential backoff and jitter) and does not hold up the others. A message the
        primary *rejects* a bounded number of times (``max_attempts``) is set aside as
        dead (kept, visible in :meth:`status`, retryable with :meth:`retry_dead`; never
        deleted); outages never make a message dead. Several drainers, in several
        processes, never replay the same row at the same time: a session another
        process's drainer holds is left to it (``remaining`` counts its rows), while a
        batch this writer's own background drainer is replaying is waited for.

        Args:
            session_id: drain only this session.
            ignore_backoff: try rows now even if their next retry is later (an operator
                who has just repaired the primary).
        """
        ...

    def pending(self, session_id: str | None = None) -> int:
        """Messages waiting in the outbox (dead ones not counted), of one session or of
        all."""
        ...

    def status(self) -> OutboxStatus:
        """What the outbox holds: pending and dead counts, the oldest pending row's age,
        and the sessions with the oldest rows."""
        ...

    def retry_dead(self, session_id: str | None = None) -> int:
        """Put messages set aside as dead back in line (attempts reset), of one session
        or of all; the next drain tries them. Returns how many."""
        ...

    def start(self, *, interval: float = 1.0) -> None:
        """Run :meth:`drain` in the background until :meth:`stop` or :meth:`close`: at
        once (startup recovery: whatever an earlier run left parked goes first), then
        whenever a batch is parked or a retry falls due, and at least every ``interval``
        seconds. Each round also indexes a bounded part of the search backlog. A running
        drainer is left as it is."""
        ...

    def stop(self, timeout: float | None = 30.0) -> None:
        """Stop the background drainer; the round in progress finishes first (each of
        its steps is bounded by the deadline), waited for up to ``timeout`` seconds
        (``None``: as long as it takes)."""
        ...

    def close(self) -> None:
        """Stop the drainer and release the outbox; later writes raise. The repository
        stays open (it is the caller's). Parked messages stay parked for the next
        writer: nothing acknowledged is lost by closing. Writes abandoned past their
        deadline are not waited for (their key makes them harmless)."""
        ...
