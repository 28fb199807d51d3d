"""Full-text search over message content, the same on SQLite and PostgreSQL.

The index (FTS5 on SQLite, a ``tsvector`` table with a GIN index on PostgreSQL; the SQL
lives in :mod:`sessionrepo.dialects`) is kept *beside* the transcript, never inside its
write.
An append records what it inserted in ``search_backlog`` (one row, in its own
transaction: a committed message is always either indexed or named there), and
:meth:`SearchIndex.catch_up` indexes the backlog later, in transactions of its own that
index a batch of rows and delete them. Indexing costs several times what storing a
message does (an FTS5 segment, GIN maintenance); batched, off the append, it costs the
writer nothing and costs less in all. ``search`` catches up first, so its answers
include every message committed before it was called; a ``TranscriptWriter``'s drainer
catches up every round, so the backlog stays small. With ``search_index="immediate"``,
an append indexes its messages itself, in a savepoint of its own transaction.

Whatever goes wrong while indexing (a corrupt FTS5 file, a missing table, an oversized
document) rolls back the indexing only, marks the index ``stale`` in
``search_index_state``, and the append (or the catch-up's removal of its rows) still
commits. A stale index refuses to answer (``SearchIndexUnavailable``) until ``reindex``
rebuilds it from the messages, emptying the backlog in the same transaction. A failure is
the index's because of which statement failed and what it found: this module runs the
index's statements and attributes their failures (an outage stays an outage; a missing
object is the index's only when the index's own objects fail the dialect's probe, so a
caller's mistake that reached SQL never marks it stale), never by the error's text.

The text is prepared and queries are parsed in Python, identically for both backends
(:mod:`sessionrepo.search`); this module is the part that runs transactions.

What a query costs does not grow with how common its words are. ``order="newest"`` walks
the index from the newest message (SQLite: the FTS5 rowid is derived from the message
time; PostgreSQL: a b-tree on the time, or the GIN index for a rare query, chosen by a
probe) and stops after a page. ``order="rank"`` orders by relevance the newest
``RANK_WINDOW`` matches only (see there), and every hit is checked against the message
text, which also yields its snippet: an index that names a message not saying what was
asked raises ``SearchIndexUnavailable`` instead of answering wrongly.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from typing import Any, Final

from sqlalchemy import Connection, Row, bindparam, delete, exists, func, select, tuple_
from sqlalchemy import exc as sa_exc

from sessionrepo.dialects.base import BackendDialect, IndexEntry, SearchOrder
from sessionrepo.errors import BackendUnavailable, RepoError, SearchIndexUnavailable
from sessionrepo.models.message import utcnow
from sessionrepo.models.search import SearchHit
from sessionrepo.models.tables import (
    decode_text,
    messages_table,
    search_backlog_table,
    search_state_table,
)
from sessionrepo.search.query import Query, SearchFilters, parse_query
from sessionrepo.search.snippets import bracketed, snippet_parts
from sessionrepo.search.text import INDEX_CHARS, content_text, document, searchable
from sessionrepo.store.database import Database

#: ``order="rank"`` orders by relevance the newest ``RANK_WINDOW`` messages that match
#: (after the filters), not every match: a word found in most of a million messages
#: would otherwise cost seconds to rank, and in a chat history the best matches among
#: the recent ones are what is looked for. Pages past the window are empty; older
#: matches are reached with ``order="newest"`` or ``until=``.
RANK_WINDOW: Final = 200

#: Backlog rows one catch-up transaction takes, and the messages it stops adding rows
#: at: a transaction holds SQLite's write lock (appends wait) for a bounded time.
CATCH_UP_ROWS: Final = 200
CATCH_UP_MESSAGES: Final = 2000

_INDEX_NAME: Final = "messages"
M = messages_table.c
#: The columns :func:`~sessionrepo.search.text.searchable` reads, in its order.
SEARCHED_COLUMNS: Final = (M.content, M.extra, M.tool_calls, M.tool_name)
ST = search_state_table.c
B = search_backlog_table.c


# -- index maintenance ---------------------------------------------------------------


class SearchIndex:
    """Index maintenance and queries for one database."""

    def __init__(self, database: Database) -> None:
        self.database = database

    @property
    def dialect(self) -> BackendDialect:
        # Asked each time: the first connection may refine it (a Citus coordinator).
        return self.database.dialect

    def index_in_transaction(
        self, conn: Connection, session_id: str, first_seq: int, contents: Sequence[Any]
    ) -> None:
        """Index messages just inserted in ``conn``'s transaction, inside a savepoint:
        if indexing fails, only the savepoint is rolled back, the index is marked stale
        in the same transaction, and the messages still commit.

        Raises:
            sqlalchemy.exc.DBAPIError: the failure took the whole transaction with it
                (SQLite rolls back by itself on I/O errors or a full disk), or was an
                outage (a lock or statement timeout: the index is not at fault); then
                the append fails as a whole and is retried or parked like any other.
        """
        if not contents:
            return
        seqs = list(range(first_seq, first_seq + len(contents)))
        documents = [document(content) for content in contents]
        try:
            with conn.begin_nested():
                indexed = self.dialect.index_documents(conn, session_id, seqs, documents)
        except sa_exc.DBAPIError as exc:
            if (
                exc.connection_invalidated
                or not self.dialect.transaction_alive(conn)
                or self._outage(exc)
            ):
                raise
            reason = (
                f"indexing session {session_id!r} seq {seqs[0]}..{seqs[-1]} failed: "
                f"{self.dialect.describe(exc)}"
            )
            self._set_state(conn, "stale", reason)
            return
        if indexed != len(seqs):  # messages not found where the caller said they were
            reason = (
                f"indexing session {session_id!r} seq {seqs[0]}..{seqs[-1]}: "
                f"{indexed} of {len(seqs)} messages found"
            )
            self._set_state(conn, "stale", reason)

    def enqueue_in(self, conn: Connection, session_id: str, first_seq: int, count: int) -> None:
        """Name ``count`` messages just inserted in ``conn``'s transaction (``seq``
        ``first_seq`` onwards) for the catch-up: committed with them, or not at all."""
        conn.execute(
            search_backlog_table.insert().values(
                session_id=session_id, first_seq=first_seq, count=count
            )
        )

    def backlog(self) -> int:
        """Messages appended and not indexed yet."""
        return int(
            self.database.read(
                lambda conn: conn.execute(select(func.coalesce(func.sum(B.count), 0))).scalar_one()
            )
        )

    def catch_up(
        self, limit: int | None = None, *, wait: bool = False, session_id: str | None = None
    ) -> int:
        """Index the backlog, in transactions of up to ``CATCH_UP_ROWS`` rows (and about
        ``CATCH_UP_MESSAGES`` messages) that each index their rows' messages and delete
        the rows; returns how many messages were indexed.

        Concurrent catch-ups never index the same rows: on PostgreSQL they skip rows
        another holds (``FOR UPDATE SKIP LOCKED``), on SQLite the write lock serialises
        them. With ``wait``, the call does the rows that were in the backlog when it began
        (rows another catch-up holds are waited for instead of skipped), so that on return
        every message committed before the call is indexed (or the index is stale): what
        ``search`` needs, without chasing appends that keep coming. A failure to index
        marks the index stale and still deletes the rows (``reindex`` indexes every
        message; until then search refuses); appends are never affected. While the index
        is stale, rows are deleted without indexing, for the same reason.

        Args:
            limit: stop after the transaction that reaches this many messages
                (``None``: until the backlog is empty, or with ``wait`` until the rows
                of the call's start are done).
            session_id: with ``wait``, only that session's rows (what a search within
                one session needs: on Citus, statements routed to its shard alone).

        Raises:
            SearchIndexUnavailable: indexing found the index too damaged for its
                transaction to survive; the index is marked stale (the rows stay, and the
                next catch-up deletes them).
            RepoError: the database failed the transaction as a whole (it is rolled
                back; the rows stay for the next catch-up).
        """
        scope = session_id if wait else None
        if not self.database.read(lambda conn: _backlog_exists(conn, scope)):
            return 0  # the common case, without the write lock
        # With ``wait``: the rows of this moment, a slice at a time; each slice is done
        # when taking from it finds nothing (its rows indexed, here or by another).
        slices: list[list[tuple[str, int]] | None] = [None]
        if wait:
            keys = self.database.read(lambda conn: _backlog_keys(conn, scope))
            slices = [keys[i : i + CATCH_UP_ROWS] for i in range(0, len(keys), CATCH_UP_ROWS)]
        indexed = done = 0
        for among in slices:

            def batch(
                conn: Connection, among: list[tuple[str, int]] | None = among
            ) -> tuple[int, int]:
                return self._catch_up_batch(conn, wait, among)

            while limit is None or done < limit:
                try:
                    taken, count = self.database.write(batch)
                except _Suspect as suspect:
                    raise self._judge(suspect.cause, suspect.what) from suspect.cause
                if not taken:
                    break
                done += taken
                indexed += count
        return indexed

    def _catch_up_batch(
        self, conn: Connection, wait: bool, among: list[tuple[str, int]] | None
    ) -> tuple[int, int]:
        """One catch-up transaction: (messages taken off the backlog, messages indexed)."""
        rows = self.dialect.take_search_backlog(conn, CATCH_UP_ROWS, wait=wait, among=among)
        chosen: list[Row[Any]] = []
        total = 0
        for row in rows:
            if chosen and total + row.messages > CATCH_UP_MESSAGES:
                break  # the rest stay for the next transaction (locks end at commit)
            chosen.append(row)
            total += row.messages
        if not chosen:
            return 0, 0
        conn.execute(
            delete(search_backlog_table).where(
                B.session_id == bindparam("sid"), B.first_seq == bindparam("first")
            ),
            [{"sid": row.session_id, "first": row.first_seq} for row in chosen],
        )
        # Read after the rows are locked: a rebuild that emptied the backlog before them
        # has committed by now, and its "ok" is seen (PostgreSQL: a new statement).
        state = conn.execute(select(ST.state).where(ST.name == _INDEX_NAME)).scalar()
        if state == "stale":
            return total, 0  # the reindex that repairs the index indexes these too
        entries: list[IndexEntry] = []
        for row in chosen:
            messages = conn.execute(
                select(M.seq, M.timestamp, M.role, *SEARCHED_COLUMNS).where(
                    M.session_id == row.session_id,
                    M.seq >= row.first_seq,
                    M.seq < row.first_seq + row.messages,
                    M.superseded.is_(None),  # an edit took it out of the transcript since
                )
            )
            entries += [
                (row.session_id, seq, timestamp, role, document(searchable(*searched)))
                for seq, timestamp, role, *searched in messages
            ]
        first = chosen[0]
        try:
            with conn.begin_nested():
                self.dialect.index_entries(conn, entries)
        except sa_exc.DBAPIError as exc:
            what = (
                f"indexing {total} messages from session {first.session_id!r} seq "
                f"{first.first_seq} onwards"
            )
            if exc.connection_invalidated or not self.dialect.transaction_alive(conn):
                # The whole transaction is gone: only the index's objects make it the
                # index's failure (an outage is retried or reported as one), judged
                # after this transaction (see _judge).
                if self._suspect(exc):
                    raise _Suspect(exc, what) from exc
                raise
            if self._outage(exc):
                raise  # a lock or statement timeout: the rows stay for the next round
            # The rows' messages cannot be indexed: the index is incomplete without them.
            self._set_state(conn, "stale", f"{what} failed: {self.dialect.describe(exc)}")
            return total, 0
        return total, len(entries)

    def mark_stale_in(self, conn: Connection, reason: str) -> None:
        """Mark the index stale in ``conn``'s transaction (once: an index already stale is
        not written again, so concurrent appenders do not queue on its row)."""
        self._set_state(conn, "stale", reason)

    def mark_stale(self, reason: str) -> None:
        # If the database refuses even that, the next search finds the index broken
        # itself, and `sessionrepo doctor` reports it.
        with contextlib.suppress(RepoError):
            self.database.write(lambda conn: self._set_state(conn, "stale", reason))

    def _set_state(self, conn: Connection, state: str, reason: str | None) -> None:
        values = {
            "state": state,
            "reason": reason[:2000] if reason else None,
            "updated_at": utcnow(),
        }
        update = search_state_table.update().where(ST.name == _INDEX_NAME).values(**values)
        if state == "stale":
            update = update.where(ST.state != "stale")  # keep the first reason; no write
        updated = conn.execute(update).rowcount
        if not updated and state == "stale":
            exists = conn.execute(select(ST.name).where(ST.name == _INDEX_NAME)).first()
            if exists is not None:
                return
        if not updated:
            conn.execute(search_state_table.insert().values(name=_INDEX_NAME, **values))

    def state(self) -> tuple[str, str | None]:
        """``("ok", None)`` or ``("stale", reason)``."""
        row = self.database.read(
            lambda conn: conn.execute(
                select(ST.state, ST.reason).where(ST.name == _INDEX_NAME)
            ).first()
        )
        return ("ok", None) if row is None else (row.state, row.reason)

    def reindex(self, *, progress: Callable[[int, int], None] | None = None) -> int:
        """Rebuild the whole index from the messages; returns how many were indexed.

        Runs in one transaction, which also empties the backlog: appends and catch-ups
        wait for it (appends through a ``TranscriptWriter`` park in the outbox) and
        nothing is indexed twice or missed.
        """

        def work(conn: Connection) -> int:
            self.dialect.reset_search_index(conn)
            # After the reset: on PostgreSQL it locks out appends and catch-ups first.
            conn.execute(delete(search_backlog_table))
            total = conn.execute(
                select(func.count()).select_from(messages_table).where(M.superseded.is_(None))
            ).scalar_one()
            done = 0
            for batch in _message_batches(conn):
                self.dialect.index_entries(
                    conn,
                    [
                        (session_id, seq, timestamp, role, document(searchable(*searched)))
                        for session_id, seq, timestamp, role, *searched in batch
                    ],
                )
                done += len(batch)
                if progress is not None:
                    progress(done, total)
            self.dialect.finish_search_index(conn)
            self._set_state(conn, "ok", None)
            return done

        return self.database.write(work)

    # -- queries ----------------------------------------------------------------------

    def search(
        self,
        query: str,
        *,
        session_id: str | None,
        source: str | None,
        role: str | None,
        user_id: str | None,
        since: datetime | None,
        until: datetime | None,
        order: SearchOrder,
        limit: int,
        offset: int,
    ) -> list[SearchHit]:
        # The arguments were checked by SessionRepository.search, the public entry point.
        parsed = parse_query(query)
        if not parsed.positive:
            return []  # nothing to look for (only exclusions, or no words at all)
        state, reason, behind = self.database.read(
            lambda conn: _state_and_backlog(conn, session_id)
        )
        if behind and state == "ok" and not self.database.read_only:
            # Complete answers: index what was committed before this call (waiting for
            # catch-ups that hold some of it; of the session alone, when the search is
            # within one), then read the state that left. (Read-only: the index as the
            # last catch-up left it.)
            self._catch_up_for_search(session_id)
            state, reason = self.state()
        if state != "ok":
            raise SearchIndexUnavailable(
                f"the search index is stale ({reason}); run `sessionrepo reindex`"
            )
        filters = SearchFilters(
            session_id=session_id,
            source=source,
            role=role,
            user_id=user_id,
            since=since,
            until=until,
        )

        def work(conn: Connection) -> list[SearchHit]:
            try:
                rows = self.dialect.search_messages(
                    conn,
                    parsed,
                    filters,
                    order=order,
                    limit=limit,
                    offset=offset,
                    window=RANK_WINDOW,
                )
            except sa_exc.DBAPIError as exc:
                if self._suspect(exc):
                    raise _Suspect(exc, "search") from exc
                raise
            return [self._hit(parsed, row) for row in rows]

        try:
            return self.database.read(work)
        except _Suspect as suspect:
            raise self._judge(suspect.cause, suspect.what) from suspect.cause
        except SearchIndexUnavailable as exc:
            self.mark_stale(str(exc))
            raise

    def _catch_up_for_search(self, session_id: str | None = None) -> None:
        self.catch_up(wait=True, session_id=session_id)  # a broken index raises, marked stale

    def _suspect(self, exc: sa_exc.DBAPIError) -> bool:
        """Whether ``exc``, the failure of one of the index's own statements, has a code
        that may mean the index's objects are missing or damaged (see :meth:`_judge`);
        else it is re-raised for ``Database`` to retry or translate (a lost connection,
        a busy database)."""
        return not exc.connection_invalidated and self.dialect.is_broken_object(exc)

    def _outage(self, exc: sa_exc.DBAPIError) -> bool:
        """Whether ``exc`` is the database's state (a timeout, a full disk), not the
        index's: damage is the index's even where the code also counts as an outage."""
        return not self.dialect.is_damaged(exc) and isinstance(
            self.dialect.translate(exc), BackendUnavailable
        )

    def _judge(self, exc: sa_exc.DBAPIError, what: str) -> RepoError:
        """The error for ``exc``, a suspect failure of the index's statement ``what``.

        The index's own failure (its data damaged, or its objects failing the dialect's
        probe, a fixed statement that reads them all) marks it stale and is
        :class:`SearchIndexUnavailable`. Anything else (a statement badly put together,
        a value it was wrongly given) leaves the index as it is, shared by every caller,
        and is the translated error: one caller's mistake never disables search for
        the others. The probe runs in a read of its own (a failed statement aborts a
        PostgreSQL transaction)."""
        found = "its data is damaged"
        if not self.dialect.is_damaged(exc):
            try:
                self.database.read(self.dialect.probe_search_index)
            except RepoError as failed:
                probe = failed.__cause__
                if not (
                    isinstance(probe, sa_exc.DBAPIError) and self.dialect.is_broken_object(probe)
                ):
                    return failed  # could not look (an outage): that, not a verdict
                found = "its own objects are missing or unreadable"
            else:
                return self.dialect.translate(exc)
        error = SearchIndexUnavailable(
            f"the search index is broken ({what} failed: {self.dialect.describe(exc)}; "
            f"{found}); run `sessionrepo reindex`"
        )
        self.mark_stale(str(error))
        return error

    def _hit(self, parsed: Query, row: Row[Any]) -> SearchHit:
        content = decode_text(row.content) if row.content is not None else None
        extra = json.loads(row.extra) if row.extra is not None else None
        calls = json.loads(row.tool_calls) if row.tool_calls is not None else None
        text = content_text(searchable(content, extra, calls, row.tool_name))[:INDEX_CHARS]
        parts = snippet_parts(text, parsed)
        if parts is None:
            # The index named a message that does not say what was asked: it is out of
            # step with the messages, and its answers cannot be trusted.
            raise SearchIndexUnavailable(
                f"the search index is out of sync with the messages (session "
                f"{row.session_id!r} seq {row.seq}); run `sessionrepo reindex`"
            )
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
            rank=float(row.rank),
        )


class _Suspect(RepoError):
    """A suspect failure of one of the index's statements, carried out of the
    transaction it failed in (which ``Database`` passes through, a ``RepoError``) to be
    judged by :meth:`SearchIndex._judge`; never leaves this module."""

    def __init__(self, cause: sa_exc.DBAPIError, what: str) -> None:
        super().__init__(what)
        self.cause = cause
        self.what = what


def _backlog_keys(conn: Connection, session_id: str | None = None) -> list[tuple[str, int]]:
    query = select(B.session_id, B.first_seq).order_by(B.session_id, B.first_seq)
    if session_id is not None:
        query = query.where(B.session_id == session_id)
    return [(session_id, first_seq) for session_id, first_seq in conn.execute(query)]


def _backlog_exists(conn: Connection, session_id: str | None = None) -> bool:
    query = select(B.session_id)
    if session_id is not None:
        query = query.where(B.session_id == session_id)
    return bool(conn.execute(select(exists(query))).scalar())


def _state_and_backlog(
    conn: Connection, session_id: str | None = None
) -> tuple[str, str | None, bool]:
    """Whether the backlog has rows (of ``session_id`` alone, when given), then the index
    state. In this order: on PostgreSQL each statement sees its own moment, and an empty
    backlog proves the index complete only with the state of that moment or later (a
    failed catch-up marks the index stale as it deletes its rows)."""
    behind = _backlog_exists(conn, session_id)
    row = conn.execute(select(ST.state, ST.reason).where(ST.name == _INDEX_NAME)).first()
    state, reason = ("ok", None) if row is None else (row.state, row.reason)
    return state, reason, behind


def _message_batches(conn: Connection, size: int = 5000) -> Iterator[list[tuple[Any, ...]]]:
    """Every live message's (session_id, seq, timestamp, role, *SEARCHED_COLUMNS), in
    key order, a batch at a time (an edit's superseded messages are not searched)."""
    after: tuple[str, int] | None = None
    columns = (M.session_id, M.seq, M.timestamp, M.role, *SEARCHED_COLUMNS)
    while True:
        query = (
            select(*columns).where(M.superseded.is_(None)).order_by(M.session_id, M.seq).limit(size)
        )
        if after is not None:
            query = query.where(tuple_(M.session_id, M.seq) > tuple_(*after))
        rows = [tuple(row) for row in conn.execute(query)]
        if not rows:
            return
        yield rows
        after = (rows[-1][0], rows[-1][1])
