"""The pending outbox: messages the primary store could not take, kept until it can.

A table (``pending_outbox``) in the primary database or in a small local SQLite file.
Rows are keyed like messages, ``(session_id, client_msg_uuid)``, so parking a message
twice is a no-op, and ordered per session by ``position``, so replay keeps each
transcript's order. A row leaves only after the primary has committed its message.

Claims: a drainer takes a session's oldest rows under a lease (``claimed_by``,
``claimed_until``) set in a short write transaction. On PostgreSQL that transaction
first locks the session's head row ``FOR UPDATE SKIP LOCKED``, so concurrent drainers
skip a session being claimed instead of waiting; on SQLite the write lock serialises
claims. The lease is short (seconds) and the live drainer renews it while it replays
(:meth:`Outbox.renew`, from a heartbeat of its own), so a drainer that dies, however it
dies, lets go of its sessions within one lease. A lock that dies with its holder (an
advisory lock, a lock file) would do that too, but differently on each backend, with a
file or a connection held for every claim; the lease is the same on both, kept in the
rows themselves. A dead drainer's rows are replayed again, and the message key makes
that replay a no-op.

A full disk: a claim is an ``UPDATE`` that makes rows longer, and so may need a new page
the file cannot get (``SQLITE_FULL``), while a ``DELETE`` never does. So when a claim is
refused for a full disk, :meth:`Outbox.replay_holding_lock` claims without writing: it
reads the rows inside a write transaction, whose lock (SQLite's write lock, or the head
row's ``FOR UPDATE`` on PostgreSQL) is the claim and ends with its holder, has them
replayed, and deletes them in the same transaction, which frees space.
"""

from __future__ import annotations

import os
import socket
import sqlite3
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Final

from pydantic import ValidationError
from sqlalchemy import Connection, Select, case, delete, func, select, update

from sessionrepo.dialects import database_file
from sessionrepo.errors import BackendUnavailable, RepoError
from sessionrepo.models import Message, Session
from sessionrepo.models.message import utcnow
from sessionrepo.models.outbox import OutboxStatus, SessionBacklog
from sessionrepo.models.outbox_protocol import OutboxState, holds_fifo, parked_rows_sql
from sessionrepo.models.tables import outbox_table
from sessionrepo.models.usage import Usage
from sessionrepo.store.database import Database
from sessionrepo.store.repository import SessionRepository

# The result models live in sessionrepo.models.outbox (the contract names them); they
# stay importable from here.
__all__ = [
    "DEAD",
    "PENDING",
    "ClaimedBatch",
    "Outbox",
    "OutboxStatus",
    "SessionBacklog",
    "drainer_id",
]

O = outbox_table.c  # noqa: E741

#: The states a row is parked in and set aside in (the protocol's, named here as before).
PENDING: Final = OutboxState.PENDING
DEAD: Final = OutboxState.DEAD


@dataclass(frozen=True)
class ClaimedBatch:
    """Rows of one session, oldest first, leased to this drainer."""

    session_id: str
    positions: list[int]
    messages: list[Message]
    #: Row positions whose payload no longer validates (kept apart, never replayed).
    unreadable: list[int]
    session_defaults: dict[str, Any]
    attempts: list[int]
    rejections: list[int]
    #: The usage records parked with each message (``positions``' order).
    usage: list[list[Usage]] = field(default_factory=list)


def drainer_id() -> str:
    """Who holds a claim: host, process and a random part (threads, forks)."""
    return f"{socket.gethostname()[:40]}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Outbox:
    """The ``pending_outbox`` table and the operations on it."""

    def __init__(self, database: Database) -> None:
        self.database = database
        self._insert = database.dialect.insert_ignoring(
            outbox_table, ["session_id", "client_msg_uuid"]
        )
        path = database_file(database.url)
        self._parked = None if path is None else _ParkedSessions(str(path))

    @classmethod
    def of(cls, repository: SessionRepository) -> Outbox:
        """The outbox in ``repository``'s own database: where a :class:`TranscriptWriter`
        without an ``outbox_url`` parks (for reading it, e.g. ``sessionrepo outbox status``)."""
        return cls(repository.database)

    @property
    def display_url(self) -> str:
        """Where this outbox lives, any password masked."""
        return self.database.display_url

    def has_pending(self, session_id: str) -> bool:
        """Whether the session has parked messages a new write must queue behind.

        On a SQLite file, answered from memory while nobody changed the file: SQLite's
        ``data_version`` moves whenever any other connection, in this process or
        another, commits to it, and then the answers are read again, one session at a
        time, as asked. So the answer is the file's, whoever parked or drained.
        """
        if self._parked is not None and self.database.checked:
            return self._parked.has(session_id)
        query = select(O.position).where(O.session_id == session_id, holds_fifo(O.state)).limit(1)
        return self.database.read(lambda conn: conn.execute(query).first() is not None)

    def any_pending(self, session_id: str | None = None) -> bool:
        """Whether anything (of the session) waits in the outbox: a read, so that a
        drain with nothing to do never takes the write lock."""
        query = select(O.position).where(holds_fifo(O.state)).limit(1)
        if session_id is not None:
            query = query.where(O.session_id == session_id)
        return self.database.read(lambda conn: conn.execute(query).first() is not None)

    def close(self) -> None:
        if self._parked is not None:
            self._parked.close()
        self.database.dispose()

    def park(
        self,
        session_id: str,
        messages: Sequence[Message],
        session: Session,
        *,
        reason: str,
        error_code: str | None = None,
        usage: Sequence[Usage] = (),
    ) -> int:
        """Store messages for later replay, after any the session already has parked;
        each ``usage`` record rides on the row of its message (of the batch's last
        message when its own is not in the batch) and is replayed with it.

        Returns:
            How many rows were added (a message already parked is not added twice).
        """
        now = utcnow()
        defaults = session.model_dump(mode="json", by_alias=True, exclude_defaults=True)
        defaults.pop("id", None)
        riding: dict[uuid.UUID, list[dict[str, Any]]] = {}
        keys = {message.client_msg_uuid for message in messages}
        for record in usage:
            home = record.message_uuid if record.message_uuid in keys else None
            if home is None:
                home = messages[-1].client_msg_uuid
            riding.setdefault(home, []).append(record.model_dump(mode="json"))

        def work(conn: Connection) -> int:
            self.database.dialect.lock_outbox_session(conn, session_id)
            last, backoff = conn.execute(
                select(
                    func.max(O.position), func.max(case((holds_fifo(O.state), O.next_attempt_at)))
                ).where(O.session_id == session_id)
            ).one()
            start = (last or 0) + 1
            # Behind a session that is backing off, new rows wait with it.
            retry_at = max(now, _aware(backoff)) if backoff is not None else now
            rows = [
                {
                    "session_id": session_id,
                    "position": start + index,
                    "client_msg_uuid": message.client_msg_uuid,
                    "message": message.model_dump(mode="json"),
                    "session_defaults": defaults or None,
                    "usage": riding.get(message.client_msg_uuid),
                    "reason": reason[:2000],
                    "state": PENDING,
                    "attempts": 0,
                    "rejections": 0,
                    "last_error": None,
                    "last_error_code": error_code,
                    "next_attempt_at": retry_at,
                    "created_at": now,
                }
                for index, message in enumerate(messages)
            ]
            result = conn.execute(self._insert, rows, execution_options={"preserve_rowcount": True})
            return int(result.rowcount)

        return self.database.write(work)

    def claim(
        self,
        owner: str,
        *,
        limit: int,
        lease: float,
        session_id: str | None = None,
        skip: frozenset[str] = frozenset(),
        ignore_backoff: bool = False,
    ) -> ClaimedBatch | None:
        """Lease the oldest due rows of one session that nobody else holds
        (``ignore_backoff``: rows waiting for their next retry count as due)."""
        now = utcnow()
        due_by = now + timedelta(days=36500) if ignore_backoff else now
        candidates = self._candidates(now, due_by, limit=len(skip) + 16, session_id=session_id)

        def work(conn: Connection) -> ClaimedBatch | None:
            return self._claim_first(
                conn,
                candidates,
                skip,
                owner=owner,
                now=now,
                due_by=due_by,
                limit=limit,
                lease=lease,
            )

        return self.database.write(work)

    def replay_holding_lock(
        self,
        replay: Callable[[ClaimedBatch], Sequence[uuid.UUID]],
        *,
        limit: int,
        session_id: str | None = None,
        skip: frozenset[str] = frozenset(),
        ignore_backoff: bool = False,
    ) -> tuple[ClaimedBatch, list[uuid.UUID]] | None:
        """:meth:`claim` for an outbox whose disk is full: the oldest rows of one due
        session, read in a write transaction and never marked, handed to ``replay``
        (which stores them in the primary, in order, and returns the keys it stored),
        then those rows deleted, in the same transaction. The transaction's lock is the
        claim, so nobody else replays the session meanwhile, and it ends with its holder.

        ``replay`` must not use the outbox itself: on SQLite this transaction holds the
        file's write lock until it returns. A replay that stops part way returns the keys
        it stored so far; should it raise, nothing is deleted (the rows are replayed
        again later, and their keys make that a no-op).

        Returns:
            The batch and the keys deleted, or ``None`` when no session was due.
        """
        now = utcnow()
        due_by = now + timedelta(days=36500) if ignore_backoff else now
        candidates = self._candidates(now, due_by, limit=len(skip) + 16, session_id=session_id)

        def work(conn: Connection) -> tuple[ClaimedBatch, list[uuid.UUID]] | None:
            claimed = self._claim_first(
                conn, candidates, skip, owner=None, now=now, due_by=due_by, limit=limit, lease=0
            )
            if claimed is None:
                return None
            stored = list(replay(claimed))
            if stored:
                conn.execute(
                    delete(outbox_table).where(
                        O.session_id == claimed.session_id, O.client_msg_uuid.in_(stored)
                    )
                )
            return claimed, stored

        return self.database.write(work)

    def renew(self, owner: str, session_ids: Sequence[str], *, lease: float) -> int:
        """Extend ``owner``'s claims on ``session_ids`` by ``lease`` seconds from now: the
        heartbeat of a live drainer. A claim that has expired already is not renewed (it
        may have been taken over). Returns how many rows were renewed."""
        if not session_ids:
            return 0
        now = utcnow()
        query = (
            update(outbox_table)
            .where(
                O.session_id.in_(list(session_ids)),
                O.claimed_by == owner,
                O.claimed_until > now,
            )
            .values(claimed_until=now + timedelta(seconds=lease))
        )
        return int(self.database.write(lambda conn: conn.execute(query).rowcount))

    def _candidates(
        self, now: datetime, due_by: datetime, *, limit: int, session_id: str | None
    ) -> Select[Any]:
        """Sessions with due pending rows that nobody holds (at ``now``), oldest first."""
        leased_now = func.max(case((O.claimed_until > now, 1), else_=0))
        candidates = (
            select(O.session_id)
            .where(holds_fifo(O.state))
            .group_by(O.session_id)
            .having(leased_now == 0)
            .having(func.min(O.next_attempt_at) <= due_by)
            .order_by(func.min(O.created_at))
            .limit(limit)
        )
        if session_id is not None:
            candidates = candidates.where(O.session_id == session_id)
        return candidates

    def _claim_first(
        self,
        conn: Connection,
        candidates: Select[Any],
        skip: frozenset[str],
        *,
        owner: str | None,
        now: datetime,
        due_by: datetime,
        limit: int,
        lease: float,
    ) -> ClaimedBatch | None:
        for sid in conn.execute(candidates).scalars():
            if sid in skip:
                continue
            claimed = self._claim_session(
                conn, sid, owner=owner, now=now, due_by=due_by, limit=limit, lease=lease
            )
            if claimed is not None:
                return claimed
        return None

    def _claim_session(
        self,
        conn: Connection,
        sid: str,
        *,
        owner: str | None,
        now: datetime,
        due_by: datetime,
        limit: int,
        lease: float,
    ) -> ClaimedBatch | None:
        # ``owner`` None: read only, the caller's transaction is the claim.
        # Every claimer of a session locks its head row first: SKIP LOCKED makes a
        # concurrent claimer move on to another session instead of queueing here. The
        # head is named exactly: "the first pending row I can lock" would let a second
        # claimer lock the row behind a locked head and lease the same rows.
        head_position = (
            select(func.min(O.position))
            .where(O.session_id == sid, holds_fifo(O.state))
            .scalar_subquery()
        )
        head = conn.execute(
            select(O.position, O.next_attempt_at)
            .where(O.session_id == sid, O.position == head_position, holds_fifo(O.state))
            .with_for_update(skip_locked=True)
        ).first()
        if head is None or head.next_attempt_at > due_by:
            return None
        leased = conn.execute(
            select(func.count())
            .select_from(outbox_table)
            .where(O.session_id == sid, O.claimed_until > now)
        ).scalar_one()
        if leased:
            return None
        rows = conn.execute(
            select(O.position, O.message, O.session_defaults, O.attempts, O.rejections, O.usage)
            .where(O.session_id == sid, holds_fifo(O.state))
            .order_by(O.position)
            .limit(limit)
        ).all()
        if owner is not None:
            conn.execute(
                update(outbox_table)
                .where(O.session_id == sid, O.position.in_([row.position for row in rows]))
                .values(claimed_by=owner, claimed_until=now + timedelta(seconds=lease))
            )
        messages: list[Message] = []
        usage: list[list[Usage]] = []
        unreadable: list[int] = []
        for row in rows:
            try:
                message = Message.model_validate(row.message)
                records = [Usage.model_validate(record) for record in row.usage or ()]
            except ValidationError:
                unreadable.append(row.position)
                continue
            messages.append(message)
            usage.append(records)
        readable = [row for row in rows if row.position not in unreadable]
        return ClaimedBatch(
            session_id=sid,
            positions=[row.position for row in readable],
            messages=messages,
            unreadable=unreadable,
            session_defaults=rows[0].session_defaults or {},
            attempts=[row.attempts for row in readable],
            rejections=[row.rejections for row in readable],
            usage=usage,
        )

    def complete(self, session_id: str, keys: Sequence[uuid.UUID]) -> None:
        """Remove the rows of messages the primary has committed.

        By key, not by position: positions are reused once a session's rows are all
        gone, so a drainer that outlived its lease could otherwise delete messages
        parked since, which nobody has stored.
        """
        if not keys:
            return
        self.database.write(
            lambda conn: conn.execute(
                delete(outbox_table).where(
                    O.session_id == session_id, O.client_msg_uuid.in_(list(keys))
                )
            )
        )

    def scrub(self) -> bool:
        """Take deleted rows out of a SQLite outbox file's bytes: every connection
        deletes with ``secure_delete`` (the row zeroed in its page, freed pages too),
        but the WAL keeps the pages as they were before the delete until it is
        checkpointed and truncated, which this does; whether that completed (a reader
        holding the WAL defers it to a later checkpoint). For a drain that refused
        parked copies of erased messages: with their rows deleted, no copy stays in
        the file. Nothing to do on a server."""
        if self._parked is None:
            return True
        database = self.database
        return database.write_direct(database.dialect.truncate_wal)

    def fail(
        self,
        session_id: str,
        positions: Sequence[int],
        *,
        owner: str,
        error: str,
        code: str | None,
        retry_at: datetime,
        rejected: bool,
        dead: bool,
    ) -> None:
        """Record a failed replay: count the attempt, release the lease, and either
        schedule the next try or set the rows aside as dead. Only rows ``owner`` still
        holds are touched: a lease that expired and was taken over is no longer ours."""
        if not positions:
            return
        values: dict[str, Any] = {
            "attempts": O.attempts + 1,
            "rejections": O.rejections + (1 if rejected else 0),
            "last_error": error[:2000],
            "last_error_code": code,
            "next_attempt_at": retry_at,
            "claimed_by": None,
            "claimed_until": None,
        }
        if dead:
            values["state"] = DEAD

        def work(conn: Connection) -> None:
            failed = conn.execute(
                update(outbox_table)
                .where(
                    O.session_id == session_id,
                    O.position.in_(list(positions)),
                    O.claimed_by == owner,
                )
                .values(**values)
            ).rowcount
            if not failed:
                return
            # The whole session backs off: its later rows must not overtake these.
            conn.execute(
                update(outbox_table)
                .where(O.session_id == session_id, holds_fifo(O.state))
                .values(next_attempt_at=retry_at)
            )

        self.database.write(work)

    def release(self, session_id: str, positions: Sequence[int], *, owner: str) -> None:
        """Give a claim back untouched (for rows not tried in this round)."""
        if not positions:
            return
        self.database.write(
            lambda conn: conn.execute(
                update(outbox_table)
                .where(
                    O.session_id == session_id,
                    O.position.in_(list(positions)),
                    O.claimed_by == owner,
                )
                .values(claimed_by=None, claimed_until=None)
            )
        )

    def count(self, session_id: str | None = None, *, state: str = PENDING) -> int:
        query = select(func.count()).select_from(outbox_table).where(O.state == state)
        if session_id is not None:
            query = query.where(O.session_id == session_id)
        return int(self.database.read(lambda conn: conn.execute(query).scalar_one()))

    def next_due(self) -> datetime | None:
        """When the earliest pending row may be tried (``None``: nothing pending)."""
        query = select(func.min(O.next_attempt_at)).where(holds_fifo(O.state))
        due: datetime | None = self.database.read(lambda conn: conn.execute(query).scalar())
        return due

    def retry_dead(self, session_id: str | None = None) -> int:
        """Put dead rows back in line (attempts reset). Returns how many."""
        query = (
            update(outbox_table)
            .where(O.state == DEAD)
            .values(state=PENDING, attempts=0, rejections=0, next_attempt_at=utcnow())
        )
        if session_id is not None:
            query = query.where(O.session_id == session_id)
        return int(self.database.write(lambda conn: conn.execute(query).rowcount))

    def status(self, *, limit: int = 100) -> OutboxStatus:
        """Pending and dead counts, overall and for the sessions with the oldest rows."""
        is_pending = case((O.state == PENDING, 1), else_=0)
        is_dead = case((O.state == DEAD, 1), else_=0)
        per_session = (
            select(
                O.session_id,
                func.sum(is_pending).label("pending"),
                func.sum(is_dead).label("dead"),
                func.min(O.created_at).label("oldest"),
                func.min(case((O.state == PENDING, O.next_attempt_at))).label("next_attempt"),
            )
            .group_by(O.session_id)
            .order_by(func.min(O.created_at))
            .limit(limit)
        )
        totals = select(
            func.coalesce(func.sum(is_pending), 0),
            func.coalesce(func.sum(is_dead), 0),
            func.min(case((O.state == PENDING, O.created_at))),
        )

        def work(conn: Connection) -> OutboxStatus:
            pending, dead, oldest = conn.execute(totals).one()
            sessions = []
            for row in conn.execute(per_session):
                last_error = conn.execute(
                    select(O.last_error)
                    .where(O.session_id == row.session_id, O.last_error.is_not(None))
                    .order_by(O.position)
                    .limit(1)
                ).scalar()
                sessions.append(
                    SessionBacklog(
                        session_id=row.session_id,
                        pending=int(row.pending),
                        dead=int(row.dead),
                        oldest=_aware(row.oldest),
                        next_attempt_at=_aware(row.next_attempt) if row.next_attempt else None,
                        last_error=last_error,
                    )
                )
            age = (utcnow() - _aware(oldest)).total_seconds() if oldest is not None else 0.0
            return OutboxStatus(
                pending=int(pending),
                dead=int(dead),
                oldest_pending_age=max(age, 0.0),
                sessions=sessions,
            )

        return self.database.read(work)


def _aware(value: Any) -> datetime:
    """Aggregates bypass column types on SQLite: turn stored UTC text back into time."""
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=utcnow().tzinfo)
    if isinstance(value, str):
        parsed = datetime.fromisoformat(value)
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=utcnow().tzinfo)
    raise RepoError(f"unexpected time value {value!r} in pending_outbox")


class _ParkedSessions:
    """Which sessions of a SQLite outbox file have parked messages, kept in memory.

    A connection of its own asks ``PRAGMA data_version`` (no transaction, no lock: it
    reads the shared WAL index). While the number stays, nobody has committed to the
    file since the answers were read, so they still hold; when it moves, they are
    forgotten and read again as asked, by the primary key's prefix.
    """

    _QUERY = parked_rows_sql("?")

    def __init__(self, path: str) -> None:
        self._path = path
        self._connection: sqlite3.Connection | None = None
        self._version: int | None = None
        self._answers: dict[str, bool] = {}
        self._lock = threading.Lock()

    def has(self, session_id: str) -> bool:
        with self._lock:
            try:
                if self._connection is None:
                    # Never creating the file: the writer's outbox made it.
                    uri = f"{Path(self._path).resolve().as_uri()}?mode=rw"
                    self._connection = sqlite3.connect(uri, uri=True, check_same_thread=False)
                connection = self._connection
                version = connection.execute("PRAGMA data_version").fetchone()[0]
                if version != self._version:
                    self._answers.clear()
                    self._version = version
                answer = self._answers.get(session_id)
                if answer is None:
                    found = connection.execute(self._QUERY, (session_id,)).fetchone()
                    answer = self._answers[session_id] = found is not None
                    if len(self._answers) > _PARKED_ANSWERS:
                        self._answers.clear()
                        self._answers[session_id] = answer
                return answer
            except sqlite3.Error as exc:
                self.close_locked()
                raise BackendUnavailable(f"the outbox file could not be read: {exc}") from exc

    def close_locked(self) -> None:
        if self._connection is not None:
            self._connection.close()
        self._connection, self._version = None, None
        self._answers.clear()

    def close(self) -> None:
        with self._lock:
            self.close_locked()


#: Sessions whose answer :class:`_ParkedSessions` keeps (a gateway's open sessions).
_PARKED_ANSWERS: Final = 100_000
