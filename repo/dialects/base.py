"""The interface every backend implements: :class:`BackendDialect`.

The store asks :func:`sessionrepo.dialects.dialect_for` for its backend's dialect and
calls these methods; it never branches on the backend's name. Each method states what
the store relies on; the implementations (:mod:`.sqlite`, :mod:`.postgresql`) carry only
the reasons for their choices. The few SQL helpers both backends' search shares live
here too.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any, ClassVar, Final, Literal

from sqlalchemy import (
    BigInteger,
    Connection,
    Engine,
    Float,
    Insert,
    Row,
    String,
    Table,
    Text,
    TextClause,
    Uuid,
    bindparam,
    create_engine,
    delete,
    select,
    text,
    tuple_,
)
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.types import TypeEngine

from sessionrepo.errors import RepoError
from sessionrepo.models.doctor import Check
from sessionrepo.models.tables import UTCDateTime, search_backlog_table
from sessionrepo.search.query import Query, SearchFilters

#: Execution option that marks a connection's transactions as read-only, so that
#: SQLite begins them DEFERRED instead of IMMEDIATE.
READ_ONLY: Final = "sessionrepo_read_only"

#: ``(session_id, seq, timestamp, role, document)``: one message's entry in the index.
IndexEntry = tuple[str, int, datetime, str | None, str]

SearchOrder = Literal["rank", "newest"]

#: Keys per ``IN (...)`` list when looking up which of a batch are already stored.
LOOKUP_CHUNK: Final = 500

_B = search_backlog_table.c


class BackendDialect:
    """What one backend does its own way."""

    #: SQLAlchemy's name of the backend (``URL.get_backend_name()``).
    name: ClassVar[str]

    #: The statements that create the search index as the migrations leave it (the
    #: migrations keep their own frozen copy; a test checks that the two agree).
    search_index_ddl: ClassVar[tuple[str, ...]]

    # -- engines, transactions, errors ------------------------------------------------

    def create_engine(
        self, url: URL, options: dict[str, Any], *, asynchronous: bool = False
    ) -> Engine:
        """The engine for ``url`` (as :func:`sessionrepo.dialects.urls.normalize_url`
        gives it); with ``asynchronous``, the synchronous face (``AsyncEngine.sync_engine``)
        of an engine on the backend's asyncio driver.

        Args:
            url: where the database is.
            options: ``open_repository``'s engine options; the dialect takes (pops) its
                own and ignores the other backend's, the rest go to SQLAlchemy.
            asynchronous: build it on the asyncio driver.
        """
        raise NotImplementedError

    def translate(self, exc: sa_exc.DBAPIError) -> RepoError:
        """Turn a driver error into sessionrepo's error, by error code, not by class:
        ``BackendUnavailable`` for the server's or the file's state, ``WriteRejected``
        for a value the database refuses, ``RepoError`` for the rest."""
        raise NotImplementedError

    def is_retryable(self, exc: sa_exc.DBAPIError) -> bool:
        """Whether rerunning the whole transaction at once may succeed (lock contention)."""
        return False

    def is_broken_object(self, exc: sa_exc.DBAPIError) -> bool:
        """Whether a statement failed because an object it reads is missing or damaged
        (rather than the server being away or busy, or a value being refused). For a
        statement of the search index, that means the index needs a rebuild."""
        raise NotImplementedError

    def transaction_alive(self, connection: Connection) -> bool:
        """Whether the transaction survived a failed statement (after its savepoint was
        rolled back). PostgreSQL's does, unless the connection itself is gone."""
        return not connection.invalidated

    def lock_for_migration(self, connection: Connection) -> None:
        """Serialise concurrent migrators for the rest of the current transaction."""

    def limit_transaction_time(self, connection: Connection, seconds: float) -> None:
        """Make the server give up on the current transaction's statements (and lock
        waits) after ``seconds``. SQLite has nothing to give up on: its busy timeout
        bounds lock waits already."""

    def insert_ignoring(self, table: Table, conflict_columns: Sequence[str]) -> Insert:
        """``INSERT ... ON CONFLICT (conflict_columns) DO NOTHING``: only that key may be
        skipped; any other constraint violation still raises."""
        raise NotImplementedError

    # -- the append -------------------------------------------------------------------

    def lock_session(self, connection: Connection, session_id: str) -> int | None:
        """Lock the session's row for the rest of the transaction (appenders to one
        session queue here) and return its ``next_seq``; ``None`` when there is no such
        session."""
        raise NotImplementedError

    def insert_new_messages(
        self,
        connection: Connection,
        session_id: str,
        next_seq: int,
        rows: Sequence[dict[str, Any]],
        now: datetime,
    ) -> dict[uuid.UUID, bytes]:
        """Insert the rows whose key the session does not have yet, numbered from
        ``next_seq`` in order, and move the session's counters for them.

        The caller holds the session row's lock (:meth:`lock_session`) and passes rows
        with distinct keys, encoded by ``sessionrepo.store.codec.message_row`` (the
        columns of :data:`sessionrepo.models.tables.MESSAGE_COLUMNS`, plus
        ``tool_call_total``).

        Returns:
            ``{key: content_hash}`` of the rows that were already stored (not inserted).

        Raises:
            RepoError: fewer rows were inserted than were new (only an appender that
                bypasses the session lock could cause it); nothing was written.
        """
        raise NotImplementedError

    def lock_outbox_session(self, connection: Connection, session_id: str) -> None:
        """Serialise parkers of one session for the rest of the current transaction."""

    # -- the search index -------------------------------------------------------------

    def index_documents(
        self, connection: Connection, session_id: str, seqs: Sequence[int], documents: Sequence[str]
    ) -> int:
        """Add prepared documents (space-separated words, see
        :func:`sessionrepo.search.text.document`) of messages inserted in this
        transaction to the search index; returns how many of them were found and
        indexed."""
        raise NotImplementedError

    def index_entries(self, connection: Connection, entries: Sequence[IndexEntry]) -> None:
        """Index ``(session_id, seq, timestamp, role, document)`` entries."""
        raise NotImplementedError

    def reset_search_index(self, connection: Connection) -> None:
        """Empty the search index, recreating it if it is damaged (a rebuild starts)."""
        raise NotImplementedError

    def finish_search_index(self, connection: Connection) -> None:
        """Complete a rebuild once every entry is in."""

    def search_messages(
        self,
        connection: Connection,
        query: Query,
        filters: SearchFilters,
        *,
        order: SearchOrder,
        limit: int,
        offset: int,
        window: int,
    ) -> list[Row[Any]]:
        """Rows (session_id, seq, client_msg_uuid, role, timestamp, source, user_id,
        content, rank) of the messages matching ``query``, newest first; with
        ``order="rank"``, the newest ``window`` matches ordered by relevance. The
        content is the stored text, cut to what is indexed."""
        raise NotImplementedError

    def forget_search_documents(self, connection: Connection, session_ids: Sequence[str]) -> None:
        """Drop the index entries and backlog rows of sessions being deleted (the index
        has no foreign key to the messages: on PostgreSQL its check locked the message
        row of every insert; the backlog's cascade does not hold on a SQLite connection
        with foreign keys off)."""
        raise NotImplementedError

    def forget_search_entries(
        self, connection: Connection, session_id: str, seqs: Sequence[int]
    ) -> None:
        """Drop the index entries of these messages of one session (an edit took them
        out of the live transcript, or is about to move them)."""
        raise NotImplementedError

    def take_search_backlog(
        self,
        connection: Connection,
        limit: int,
        *,
        wait: bool,
        among: Sequence[tuple[str, int]] | None = None,
    ) -> list[Row[Any]]:
        """Up to ``limit`` backlog rows (session_id, first_seq, messages) in key order, locked
        for the rest of the transaction; only those keyed ``among`` when given. Rows
        another transaction holds are skipped (``FOR UPDATE SKIP LOCKED``: concurrent
        catch-ups never take the same rows) or, with ``wait``, waited for: then a row
        that transaction deleted is left out, so an empty answer means every row visible
        when the statement began is done. SQLite renders no lock clause: the catch-up
        holds the write lock already."""
        # Labelled: a Row's ``count`` is the tuple method.
        query = select(_B.session_id, _B.first_seq, _B.count.label("messages"))
        if among is not None:
            query = query.where(tuple_(_B.session_id, _B.first_seq).in_(among))
        query = query.order_by(_B.session_id, _B.first_seq).limit(limit)
        return list(connection.execute(query.with_for_update(skip_locked=not wait)))

    def _forget_backlog(self, connection: Connection, session_ids: Sequence[str]) -> None:
        # First: on PostgreSQL this waits for a catch-up holding these rows, whose index
        # entries are then committed and deleted below, not left behind.
        connection.execute(delete(search_backlog_table).where(_B.session_id.in_(session_ids)))

    # -- doctor -----------------------------------------------------------------------

    def server_version(self, connection: Connection) -> str:
        """The version of the database software, as its users know it ("3.40.1", "15.4")."""
        raise NotImplementedError

    def settings(self, connection: Connection) -> dict[str, str]:
        """The settings :meth:`judge_settings` judges, as this connection sees them."""
        raise NotImplementedError

    def judge_settings(self, settings: dict[str, str]) -> list[Check]:
        """One :class:`~sessionrepo.models.doctor.Check` per setting of :meth:`settings`
        that durability or correctness depends on (named without the backend prefix)."""
        raise NotImplementedError


def make_engine(url: URL, asynchronous: bool, **options: Any) -> Engine:
    """A SQLAlchemy engine; with ``asynchronous``, an asyncio engine's synchronous face."""
    if asynchronous:
        return create_async_engine(url, **options).sync_engine
    return create_engine(url, **options)


def lock_bypassed(session_id: str, missing: int) -> RepoError:
    """The error of an append that found keys appear under its session lock."""
    # Only an appender that bypasses the session row lock could cause this.
    return RepoError(
        f"session {session_id!r}: {missing} keys appeared while the session was locked; "
        "nothing was written"
    )


#: The stored content of a hit, cut to what is indexed (whole when it is encoded JSON,
#: which cannot be cut).
_CONTENT_HEAD = (
    "CASE WHEN substr(m.content, 1, 1) = '\ufdd0' THEN m.content "
    "ELSE substr(m.content, 1, 100000) END"
)

_SEARCH_COLUMNS: dict[str, TypeEngine[Any]] = {
    "session_id": String(),
    "seq": BigInteger(),
    "client_msg_uuid": Uuid(),
    "role": String(),
    "timestamp": UTCDateTime(),
    "source": String(),
    "user_id": String(),
    "content": Text(),
    "extra": Text(),
    "rank": Float(),
}


def page_of_hits(matches: str, outer_order: str) -> str:
    """Choose the page on the index alone (``matches``: a query of session_id, seq and
    rank), then read the content of those hits only (never carry message text through
    the choice)."""
    return (
        f"SELECT m.session_id, m.seq, m.client_msg_uuid, m.role, m.timestamp, s.source, "
        f"s.user_id, {_CONTENT_HEAD} AS content, m.extra AS extra, top.rank AS rank "
        f"FROM ({matches}) top "
        "JOIN messages m ON m.session_id = top.session_id AND m.seq = top.seq "
        "JOIN sessions s ON s.id = m.session_id "
        f"ORDER BY {outer_order}"
    )


def bind_times(statement: TextClause, params: dict[str, Any]) -> TextClause:
    """``statement`` with the time filters (``:f_since``, ``:f_until``) bound as
    ``UTCDateTime``, so they compare as the stored times do."""
    kinds = {"f_since": UTCDateTime(), "f_until": UTCDateTime()}
    return statement.bindparams(
        *(bindparam(name, type_=kind) for name, kind in kinds.items() if name in params)
    )


def run_search(connection: Connection, sql: str, params: dict[str, Any]) -> list[Row[Any]]:
    """The rows of a :func:`page_of_hits` query, typed as ``search_messages`` returns them."""
    statement = bind_times(text(sql), params).columns(**_SEARCH_COLUMNS)
    return list(connection.execute(statement, params))
