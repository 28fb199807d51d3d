"""The interface every backend implements: :class:`BackendDialect`, one abstract class
per role.

A dialect does four jobs, and each backend's package has one module per job:

- :class:`EngineRole` (``engine``): the engine, transactions and locks, and the driver's
  errors classified by their code;
- :class:`AppendRole` (``append``): the append's SQL, on SQLAlchemy's connection and on
  the driver's own;
- :class:`SearchRole` (``search``): the search index's DDL and queries;
- :class:`ProbeRole` (``probes``): what ``sessionrepo doctor`` reads and judges.

:class:`BackendDialect` joins the four with the backend's name and its declared
:class:`Capabilities`: the store asks :func:`sessionrepo.dialects.dialect_for` for its
backend's dialect, calls these methods and reads the capabilities; it never branches on
the backend's name. Each method states what the store relies on; the implementations
carry only the reasons for their choices.
"""

from __future__ import annotations

import functools
import re
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, ClassVar, Final, Literal, NamedTuple, Protocol, TypeVar

from sqlalchemy import (
    Connection,
    Engine,
    Insert,
    Row,
    Select,
    Table,
    bindparam,
    create_engine,
    delete,
    literal,
    select,
    tuple_,
)
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.sql.elements import ColumnElement

from sessionrepo.errors import ConflictError, RepoError
from sessionrepo.models.doctor import Check
from sessionrepo.models.outbox_protocol import holds_fifo
from sessionrepo.models.privacy import erased_sessions_table
from sessionrepo.models.tables import (
    messages_table,
    outbox_table,
    search_backlog_table,
    sessions_table,
)
from sessionrepo.search.query import Query, SearchFilters

#: Execution option that marks a connection's transactions as read-only, so that
#: SQLite begins them DEFERRED instead of IMMEDIATE.
READ_ONLY: Final = "sessionrepo_read_only"

#: ``(session_id, seq, timestamp, role, document)``: one message's entry in the index.
IndexEntry = tuple[str, int, datetime, str | None, str]

SearchOrder = Literal["rank", "newest"]

#: ``((session_id, seq), content_hash, vector)``: a stored vector near a query's, as
#: :meth:`SearchRole.nearest_vectors` finds it (the vector: its int8 bytes).
NearVector = tuple[tuple[str, int], bytes, bytes]

#: Keys per ``IN (...)`` list when looking up which of a batch are already stored.
LOOKUP_CHUNK: Final = 500

_B = search_backlog_table.c
_M = messages_table.c
_T = TypeVar("_T")

#: A tenant's name (``open_repository(tenant=...)``): a PostgreSQL role name that needs no
#: quoting anywhere, the same rule on SQLite (a store can move between backends).
TENANT_NAME: Final = re.compile(r"^[a-z][a-z0-9_]{0,62}$")


#: A new session's columns that an append sets from the session's defaults; the
#: counters, ``next_seq`` and the activity (``last_active_at``, its lag) come from the batch.
NEW_SESSION_COLUMNS: Final = tuple(
    column.name
    for column in sessions_table.c
    if column.name
    not in (
        "message_count",
        "tool_call_count",
        "next_seq",
        "last_active_at",
        "last_active_lag_us",
        "rollup_day",
        "rollup_messages",
    )
)


@dataclass(frozen=True, slots=True)
class DirectAppend:
    """What :meth:`AppendRole.append` stores (either path): a batch with distinct keys,
    encoded by ``sessionrepo.store.codec.message_row``, for one session."""

    session_id: str
    rows: Sequence[dict[str, Any]]
    #: Column values of the session's row, for when it has to be created.
    new_session: dict[str, Any]
    now: datetime
    #: Name the inserted messages in the search backlog.
    enqueue: bool
    #: Insert nothing when any key is stored with other content (``on_conflict="raise"``).
    refuse_conflicts: bool
    #: Insert nothing when the session has messages parked in this database's outbox
    #: (``pending_outbox``): a writer's batch queues behind them.
    behind_outbox: bool = False
    #: ``(seq, key)`` that must still be stored (the newest row the caller remembers
    #: as stored, and so did not send again): when it is not, nothing is written and
    #: the result says ``lost``.
    verify: tuple[int, uuid.UUID] | None = None
    #: The session's tombstone hash (``sessionrepo.store.tombstones.session_hash``),
    #: for a backend whose statements screen erasures (:attr:`Capabilities.
    #: screens_erasure`): when ``erased_sessions`` holds it, under the session's lock,
    #: nothing is written and the result says ``erased`` (the store then screens the
    #: batch message by message). ``None``: not checked.
    erased_probe: bytes | None = None


@dataclass(frozen=True, slots=True)
class DirectLoad:
    """What :meth:`BackendDialect.load_direct` reads: ``columns`` of one session's
    messages with ``after_seq < seq < before_seq``, at most ``limit`` (the live ones
    only, unless ``live_only`` is false)."""

    session_id: str
    columns: Sequence[str]
    after_seq: int | None
    before_seq: int | None
    limit: int | None
    backwards: bool
    #: Only the live transcript: no message an edit superseded.
    live_only: bool = True

    def statement(self, placeholder: Callable[[str], str]) -> tuple[str, dict[str, Any]]:
        """The SELECT, with each parameter written by ``placeholder(name)``."""
        names = ", ".join(f'"{name}"' for name in self.columns)
        sql = f"SELECT {names} FROM messages WHERE session_id = {placeholder('sid')}"
        params: dict[str, Any] = {"sid": self.session_id}
        if self.live_only:
            sql += " AND superseded IS NULL"
        if self.after_seq is not None:
            sql += f" AND seq > {placeholder('after')}"
            params["after"] = self.after_seq
        if self.before_seq is not None:
            sql += f" AND seq < {placeholder('before')}"
            params["before"] = self.before_seq
        sql += " ORDER BY seq DESC" if self.backwards else " ORDER BY seq"
        if self.limit is not None:
            sql += f" LIMIT {placeholder('limit')}"
            params["limit"] = self.limit
        return sql, params


class DirectResult(NamedTuple):
    """What an :meth:`BackendDialect.append_direct` did.

    A named tuple rather than a dataclass: built once an append, on the hot path, and
    a tuple is built without running an ``__init__`` of this module."""

    #: ``{key: content_hash}`` of the rows that were already stored (not inserted).
    stored: dict[uuid.UUID, bytes]
    #: The ``seq`` of the first inserted row; ``None`` when nothing was inserted.
    first_seq: int | None
    #: Nothing was written: the session has parked messages (``behind_outbox``).
    queued: bool = False
    #: Nothing was written: the row ``verify`` names is not stored (any more).
    lost: bool = False
    #: Nothing was written: the session was erased (``erased_probe`` found).
    erased: bool = False


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a backend does that the layers above it decide by: they read these, never the
    backend's name."""

    #: A repository opened without ``auto_migrate`` upgrades its schema itself: the
    #: embedded store has one owner, a server's schema is its operator's to upgrade
    #: (``sessionrepo migrate``).
    migrates_on_open: bool
    #: A new connection goes over the network: its connect can hang on a server that does
    #: not answer, before there is a connection to sever (:meth:`EngineRole.sever`).
    connect_may_hang: bool
    #: A retryable error (:meth:`EngineRole.is_retryable`) under a per-statement time
    #: bound comes only after the whole bound has passed (SQLite's busy timeout): a rerun
    #: would wait it again, past a writer's deadline. PostgreSQL's deadlock and
    #: serialization failures come at once.
    retry_waits_out_bound: bool
    #: The append's statements check :attr:`DirectAppend.erased_probe` under the
    #: session's lock (in the direct statement, and in :meth:`AppendRole.append_locked`):
    #: an append costs no separate read of the tombstones, and one racing an erasure
    #: finds its tombstone. Else the store reads them before the append.
    screens_erasure: bool = False
    #: A tenant is the role a connection logs in as, its rows kept apart by the server's
    #: row-level security (``sessionrepo tenants``). Else the file is the tenant: one a
    #: store (:mod:`sessionrepo.store.tenancy`).
    tenant_roles: bool = False
    #: A correlated subquery in a select list may read the rows of a subquery in the
    #: ``FROM`` clause (Citus's planner refuses it), so that ``list_sessions`` reads the
    #: previews of its page's rows only. Else they are read for the candidates.
    correlates_into_subqueries: bool = True


class EngineRole(ABC):
    """The engine, transactions and locks, and errors classified by code."""

    @abstractmethod
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

    @abstractmethod
    def begin_snapshot(self, connection: Connection) -> None:
        """Make the read transaction just begun on ``connection`` (nothing read yet) see
        the whole database as of one instant, for as long as it lasts (a consistent
        backup)."""

    @abstractmethod
    def translate(self, exc: sa_exc.DBAPIError) -> RepoError:
        """Turn a driver error into sessionrepo's error, by error code, not by class:
        ``BackendUnavailable`` for the server's or the file's state, ``WriteRejected``
        for a value the database refuses, ``RepoError`` for the rest."""

    @abstractmethod
    def describe(self, exc: sa_exc.DBAPIError) -> str:
        """What failed, for an error message or a stored reason: the error code and what
        the driver says, without the statement or its parameters (``str(exc)`` has both,
        and some servers' messages quote them, so a user's query or message would end up
        in a log or a stored reason). The exception chain keeps the whole story."""

    def is_retryable(self, exc: sa_exc.DBAPIError) -> bool:
        """Whether rerunning the whole transaction at once may succeed (lock contention)."""
        return False

    @abstractmethod
    def is_broken_object(self, exc: sa_exc.DBAPIError) -> bool:
        """Whether a statement failed with a code that may mean an object it reads is
        missing or damaged (rather than the server being away or busy, or a value being
        refused). Codes are coarse (SQLite's ``SQLITE_ERROR`` also means a statement
        badly put together): for a statement of the search index, :meth:`is_damaged`
        or :meth:`SearchRole.probe_search_index` decides whether the index needs a
        rebuild."""

    @abstractmethod
    def is_damaged(self, exc: sa_exc.DBAPIError) -> bool:
        """Whether the code says the data a statement read is corrupt (a damaged page,
        FTS5 record or index): for a statement of the search index, the index's own
        failure whatever else is true."""

    def configure_connection(self, dbapi_connection: Any) -> None:
        """Settings of a new driver connection (its transaction is committed after), once
        the server is known (:func:`sessionrepo.dialects.for_server`). The default sets
        nothing."""
        return

    def transaction_alive(self, connection: Connection) -> bool:
        """Whether the transaction survived a failed statement (after its savepoint was
        rolled back). PostgreSQL's does, unless the connection itself is gone."""
        return not connection.invalidated

    def lock_for_migration(self, connection: Connection) -> None:
        """Serialise concurrent migrators for the rest of the current transaction. The
        default does nothing: SQLite's migration transaction holds the write lock."""
        return

    def after_migration(self, connection: Connection) -> None:
        """Last in the migration's transaction (after the revisions, ran or not). The
        default does nothing; PostgreSQL grants the tenant roles their rights on every
        table (a revision's new tables too)."""
        return

    @abstractmethod
    def insert_ignoring(self, table: Table, conflict_columns: Sequence[str]) -> Insert:
        """``INSERT ... ON CONFLICT (conflict_columns) DO NOTHING``: only that key may be
        skipped; any other constraint violation still raises. ``conflict_columns`` is the
        key as the model declares it (:meth:`unique_key` makes it the backend's)."""

    def unique_key(self, table: str, columns: Sequence[str]) -> tuple[str, ...]:
        """A unique key of ``table``, as the model declares it (``columns``), as it is on
        this backend: what an ``ON CONFLICT`` names. The models' exactly by default;
        PostgreSQL's tenant tables end every key with the database's ``tenant``."""
        return tuple(columns)

    @abstractmethod
    def insert_adding(
        self, table: Table, conflict_columns: Sequence[str], added: Sequence[str]
    ) -> Insert:
        """``INSERT ... ON CONFLICT (conflict_columns) DO UPDATE``: the stored row's
        ``added`` columns each grow by the inserted row's value (a counter's upsert)."""

    @abstractmethod
    def nearest_ranks(self, values: Select[Any], shares: Sequence[tuple[int, int]]) -> Select[Any]:
        """Per ``key`` of ``values`` (a query of ``key`` and ``value``): one row of the
        ``key`` and, for each share ``(a, b)``, the nearest-rank percentile ``a/b`` of
        its values (the value at rank ``ceil(a/b * n)`` in ascending order), computed by
        the database."""

    def rare(self, condition: ColumnElement[bool]) -> ColumnElement[bool]:
        """``condition``, marked for the planner as true of few rows (SQLite's statistics
        count a column's NULLs as one value: ``parent_session_id = ?`` looks like it
        matches nearly every session, and the index is passed over for a full scan)."""
        return condition

    @abstractmethod
    def utc_day(self, value: ColumnElement[Any]) -> ColumnElement[str]:
        """The UTC day of a stored time, as ``YYYY-MM-DD`` text (the insights' day)."""

    @abstractmethod
    def activity(self, at: ColumnElement[Any], lag_us: ColumnElement[Any]) -> ColumnElement[Any]:
        """A stored time ``at`` plus ``lag_us`` microseconds, exactly, as a value that
        orders and compares as the time does (not necessarily a time: SQLite's is an
        integer of microseconds). Only ever compared with another ``activity``."""

    @abstractmethod
    def time_before(self, at: ColumnElement[Any], by: timedelta) -> ColumnElement[Any]:
        """A stored time ``at`` less ``by``, or a little earlier (never later): a value
        the stored column compares with, in its index too; ``NULL`` for ``NULL``."""

    @abstractmethod
    def text_after(self, value: ColumnElement[Any], part: str, length: int) -> ColumnElement[str]:
        """Up to ``length`` characters of ``value`` after the first ``part`` (``''`` when
        ``part`` is not in it), without counting characters up to there where the
        backend can (PostgreSQL counts them slowly: a photo in a message is megabytes)."""

    def sever(self, driver: Any) -> None:
        """From another thread: make the call blocked on ``driver`` (a DBAPI connection)
        fail now, for a server that does not answer at all. The default does nothing."""
        return

    def connection_lost(self, driver: Any) -> bool:
        """Whether the driver connection is unusable after an error (the pool discards it)."""
        return False

    def lock_outbox_session(self, connection: Connection, session_id: str) -> None:
        """Serialise parkers of one session for the rest of the current transaction. The
        default does nothing: SQLite's write transaction serialises every parker."""
        return

    def select_locked(
        self,
        connection: Connection,
        query: Select[Any],
        session_column: ColumnElement[Any],
        session_ids: Sequence[str],
    ) -> list[Row[Any]]:
        """The rows of ``query`` whose ``session_column`` is one of ``session_ids``
        (sorted), locked for the rest of the transaction (``FOR UPDATE``)."""
        return list(
            connection.execute(query.where(session_column.in_(session_ids)).with_for_update())
        )


class AppendRunner(Protocol):
    """What runs a dialect's append: the store's ``Database`` (its transactions, their
    reruns on a lost lock race, its error translation)."""

    def write(self, work: Callable[[Connection], _T], /) -> _T:
        """``work(connection)`` in a write transaction, committed when it returns."""
        ...

    def write_direct(self, work: Callable[[Any], _T], /) -> _T:
        """``work(driver)`` on a pooled connection's own driver connection, idle."""
        ...


class AppendRole(ABC):
    """The append's SQL: :meth:`append`, its one entry, which takes the direct path on the
    driver's own connection where the backend has one and the locked path on
    SQLAlchemy's connection otherwise (or when the direct one cannot decide alone)."""

    def append(
        self,
        run: AppendRunner,
        append: DirectAppend,
        *,
        direct: bool = True,
        then: Callable[[Connection, DirectResult], None] | None = None,
    ) -> DirectResult:
        """Append ``append.rows`` to the session, committed when it returns: the direct
        statement (:meth:`append_direct`) unless ``direct`` is false or ``then`` is
        given, else the locked path (:meth:`append_locked`) in a transaction of its own.

        Args:
            run: runs the statements (the store's database).
            direct: try the direct statement first.
            then: more work for the locked path's transaction once the rows are in (a
                search index kept another way than by the backlog); not called when
                nothing was written (``queued``, ``lost`` or ``erased``).

        Raises:
            ConflictError: ``append.refuse_conflicts`` and a key is stored with other
                content (nothing was written).
        """
        if direct and then is None:
            # A partial, not a lambda: the database calls the backend's statement itself.
            done = run.write_direct(functools.partial(self.append_direct, append=append))
            if done is not None:
                return done

        def locked(connection: Connection) -> DirectResult:
            done = self.append_locked(connection, append)
            if then is not None and not (done.queued or done.lost or done.erased):
                then(connection, done)
            return done

        return run.write(locked)

    def append_locked(self, connection: Connection, append: DirectAppend) -> DirectResult:
        """:meth:`append_direct`'s work on SQLAlchemy's connection, in the caller's
        transaction: the session's row locked (created from ``append.new_session`` when
        it is missing), then :meth:`insert_new_messages` and, with ``append.enqueue``,
        the inserted messages named in the search backlog.

        Raises:
            ConflictError: ``append.refuse_conflicts`` and a key is stored with other
                content (raised in the transaction, which rolls back).
        """
        sid = append.session_id
        if append.behind_outbox and connection.execute(_PARKED, {"sid": sid}).first():
            return DirectResult({}, None, queued=True)
        next_seq = self.lock_session(connection, sid)
        # Under the lock (or with none to take: an erasure deletes the row it locked,
        # and commits its tombstone with the deletion), so an erasure that committed
        # while this append waited is seen here.
        if (
            append.erased_probe is not None
            and connection.execute(_ERASED, {"probe": append.erased_probe}).first()
        ):
            return DirectResult({}, None, erased=True)
        if next_seq is None:
            connection.execute(_insert_session(self).values(**append.new_session))
            next_seq = self.lock_session(connection, sid)
            if next_seq is None:  # pragma: no cover - inserted just above
                raise RepoError(f"session {sid!r} vanished while it was being created")
        if append.verify is not None:
            seq, key = append.verify
            if connection.execute(_HELD, {"sid": sid, "seq": seq, "key": key}).first() is None:
                return DirectResult({}, None, lost=True)
        stored = self.insert_new_messages(connection, sid, next_seq, append.rows, append.now)
        if append.refuse_conflicts:
            refused = [
                row["client_msg_uuid"]
                for row in append.rows
                if stored.get(row["client_msg_uuid"], row["content_hash"]) != row["content_hash"]
            ]
            if refused:
                raise conflict_error(sid, refused)
        inserted = len(append.rows) - len(stored)
        if append.enqueue and inserted:
            connection.execute(
                search_backlog_table.insert().values(
                    session_id=sid, first_seq=next_seq, count=inserted
                )
            )
        return DirectResult(stored, next_seq if inserted else None)

    @abstractmethod
    def lock_session(self, connection: Connection, session_id: str) -> int | None:
        """Lock the session's row for the rest of the transaction (appenders to one
        session queue here) and return its ``next_seq``; ``None`` when there is no such
        session."""

    @abstractmethod
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

    #: The driver's own exception root (``psycopg.Error``, ``sqlite3.Error``): what a
    #: :meth:`append_direct` raises, translated as a SQLAlchemy error would be.
    driver_error: ClassVar[type[Exception]] = Exception

    def append_direct(self, driver: Any, append: DirectAppend) -> DirectResult | None:
        """An append on the driver's own connection (``driver``: the pooled psycopg or
        sqlite3 connection, idle, outside any transaction), in as few round trips as the
        backend allows, committed when it returns: :meth:`lock_session` and
        :meth:`insert_new_messages` in one, with the session created when it is missing
        and the inserted messages named in the search backlog.

        Returns ``None``, having written nothing, when it cannot decide alone (a race
        with a concurrent first append of the session, or a concurrent re-send of the
        same keys): the caller then runs the locked path in a transaction of its own.
        The default runs nothing and returns ``None``.
        """
        return None

    @abstractmethod
    def message_at(self, driver: Any, session_id: str, seq: int, key: uuid.UUID) -> bool:
        """Whether the session stores the message ``key`` at ``seq`` (a read on the
        driver's own connection). Only called where :meth:`append_direct` exists."""

    def load_direct(self, driver: Any, load: DirectLoad) -> list[Sequence[Any]] | None:
        """A page of a transcript on the driver's own connection, in one statement
        (its own read transaction): the rows of ``load.columns``, in ``seq`` order (or
        newest first, ``load.backwards``), as the driver returns them. The default
        returns ``None``: the caller reads through SQLAlchemy."""
        return None

    def select_direct(
        self, driver: Any, sql: str, params: Mapping[str, Any]
    ) -> list[Sequence[Any]] | None:
        """One ``SELECT`` (SQL text both backends run, parameters written ``:name``) on
        the driver's own connection, its own read transaction: one round trip, no
        ``BEGIN``/``COMMIT`` around it. An aware ``datetime`` parameter is bound as the
        column stores it; the rows come as the driver returns them (on SQLite a time is
        its stored text, on PostgreSQL an aware ``datetime``). The default returns
        ``None``: the caller reads through SQLAlchemy."""
        return None


class SearchRole(ABC):
    """The search index: its DDL, its entries, its queries."""

    #: The statements that create the search index as the migrations leave it (the
    #: migrations keep their own frozen copy; a test checks that the two agree).
    search_index_ddl: ClassVar[tuple[str, ...]]

    @abstractmethod
    def probe_search_index(self, connection: Connection) -> None:
        """Run a fixed statement that reads every column of the search index's table and
        its entries (with arguments of its own, never a caller's): it raises when the
        index itself is missing or unreadable, so a failure of another statement of the
        index that this one does not share was not the index's."""

    @abstractmethod
    def index_documents(
        self, connection: Connection, session_id: str, seqs: Sequence[int], documents: Sequence[str]
    ) -> int:
        """Add prepared documents (space-separated words, see
        :func:`sessionrepo.search.text.document`) of messages inserted in this
        transaction to the search index; returns how many of them were found and
        indexed."""

    @abstractmethod
    def index_entries(self, connection: Connection, entries: Sequence[IndexEntry]) -> None:
        """Index ``(session_id, seq, timestamp, role, document)`` entries."""

    @abstractmethod
    def reset_search_index(self, connection: Connection) -> None:
        """Empty the search index, recreating it if it is damaged (a rebuild starts)."""

    def finish_search_index(self, connection: Connection) -> None:
        """Complete a rebuild once every entry is in. The default does nothing."""
        return

    @abstractmethod
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

    def nearest_vectors(
        self, connection: Connection, target: bytes, depth: int, filters: SearchFilters
    ) -> list[NearVector] | None:
        """At least ``depth`` of the stored vectors (``message_embeddings``) nearest to
        ``target`` (int8 bytes; nearest: the largest int8 dot product) whose messages
        pass ``filters``, in no particular order, by an extension over them (pgvector's
        index: approximate; sqlite-vec's scan: exact up to its distance's order),
        whatever their messages' state (the caller scores and checks each). Fewer than
        ``depth``: all there are. ``None``: no such extension for vectors of this size
        and these filters here (the default), or an index's answer came short, so the
        caller scans them."""
        return None

    @abstractmethod
    def forget_search_documents(self, connection: Connection, session_ids: Sequence[str]) -> None:
        """Drop the index entries and backlog rows of sessions being deleted (the index
        has no foreign key to the messages: on PostgreSQL its check locked the message
        row of every insert; the backlog's cascade does not hold on a SQLite connection
        with foreign keys off)."""

    @abstractmethod
    def forget_search_entries(
        self, connection: Connection, session_id: str, seqs: Sequence[int]
    ) -> None:
        """Drop the index entries of these messages of one session (an edit took them
        out of the live transcript, or is about to move them)."""

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


class ProbeRole(ABC):
    """What ``sessionrepo doctor`` reads of the server and judges."""

    @abstractmethod
    def server_version(self, connection: Connection) -> str:
        """The version of the database software, as its users know it ("3.40.1", "15.4")."""

    @abstractmethod
    def settings(self, connection: Connection) -> dict[str, str]:
        """The settings :meth:`judge_settings` judges, as this connection sees them."""

    @abstractmethod
    def judge_settings(self, settings: dict[str, str]) -> list[Check]:
        """One :class:`~sessionrepo.models.doctor.Check` per setting of :meth:`settings`
        that durability or correctness depends on (named without the backend prefix)."""


class ErasureRole(ABC):
    """What an erasure does so the erased bytes leave the files, where the backend
    allows it (``sessionrepo.store.erasure``)."""

    @abstractmethod
    def prepare_erasure(self, connection: Connection) -> None:
        """Set up an erasing transaction (SQLite: deletes overwrite what they delete)."""

    @abstractmethod
    def scrub_after_erasure(self, driver: Any, compact: bool) -> tuple[list[str], bool]:
        """On an idle driver connection, after the erasures committed: what removes
        their bytes (search index merge, WAL checkpoint, vacuum); ``compact`` rewrites
        the files too. The steps run, in words, and whether every one completed."""

    def truncate_wal(self, driver: Any) -> bool:
        """On an idle driver connection: checkpoint a file's write-ahead log into it and
        truncate the log, so no page as it was before a delete stays in it; whether that
        completed. Nothing to do on a server (its WAL is its own)."""
        return True


class BackendDialect(EngineRole, AppendRole, SearchRole, ProbeRole, ErasureRole):
    """What one backend does its own way: the five roles, its name and what it can do.

    A backend's class joins its role classes (``SQLiteEngine``, ``SQLiteAppend``, …)
    with this one; an abstract method left unimplemented makes it uninstantiable."""

    #: SQLAlchemy's name of the backend (``URL.get_backend_name()``); shown, never
    #: compared outside this package (the :attr:`capabilities` say what differs).
    name: ClassVar[str]
    #: The backend as its users call it ("SQLite", "PostgreSQL").
    display_name: ClassVar[str]
    capabilities: ClassVar[Capabilities]


def make_engine(url: URL, asynchronous: bool, **options: Any) -> Engine:
    """A SQLAlchemy engine; with ``asynchronous``, an asyncio engine's synchronous face."""
    if asynchronous:
        return create_async_engine(url, **options).sync_engine
    return create_engine(url, **options)


def conflict_error(session_id: str, conflicts: list[uuid.UUID]) -> ConflictError:
    """The error of a strict append (``on_conflict="raise"``) that found ``conflicts``."""
    return ConflictError(
        f"session {session_id!r}: stored with other content under the same key: "
        f"{', '.join(map(str, conflicts))}; nothing was written",
        session_id=session_id,
        conflicts=conflicts,
    )


def _insert_session(dialect: object) -> Insert:
    # Every BackendDialect is an EngineRole too: its own INSERT ... ON CONFLICT DO NOTHING.
    assert isinstance(dialect, EngineRole)
    return dialect.insert_ignoring(sessions_table, ["id"])


#: Whether the session has messages parked in this database's own outbox.
_PARKED: Final = (
    select(outbox_table.c.position)
    .where(outbox_table.c.session_id == bindparam("sid"), holds_fifo(outbox_table.c.state))
    .limit(1)
)
#: Whether the session was erased (its tombstone hash is in ``erased_sessions``).
_ERASED: Final = select(literal(1)).where(
    erased_sessions_table.c.session_hash == bindparam("probe")
)
#: Whether the session stores message ``key`` at ``seq``.
_HELD: Final = select(literal(1)).where(
    _M.session_id == bindparam("sid"),
    _M.seq == bindparam("seq"),
    _M.client_msg_uuid == bindparam("key"),
)


def lock_bypassed(session_id: str, missing: int) -> RepoError:
    """The error of an append that found keys appear under its session lock."""
    # Only an appender that bypasses the session row lock could cause this.
    return RepoError(
        f"session {session_id!r}: {missing} keys appeared while the session was locked; "
        "nothing was written"
    )
