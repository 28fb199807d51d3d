"""One read of the whole store as of one instant: what a consistent backup reads through.

:func:`read_snapshot` runs its work on one connection, in one read transaction that sees
every table as of one moment, however long it takes and however many gateways write
meanwhile:

- SQLite: one deferred read transaction (``BEGIN``); in WAL mode its snapshot is fixed by
  its first read and writers go on beside it (a checkpoint cannot pass it, so the WAL
  grows while it runs);
- PostgreSQL: ``REPEATABLE READ, READ ONLY``: every statement sees the snapshot of the
  first. On Citus each worker's part is repeatable read, but the workers' snapshots are
  not one distributed snapshot: a transaction committed on two workers may be seen on
  one and not yet on the other (Citus has no distributed snapshot isolation).

:class:`SnapshotReader` is what the work gets: sessions by id and their messages by seq,
decoded as :meth:`SessionRepository.load_transcript` decodes them, their usage records
and ADK sessions, and the ADK app and user states. A rerun (a dropped connection) starts the work
again on a fresh snapshot, so the work must be safe to rerun.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from sqlalchemy import Connection, select

from sessionrepo.contract import SessionSnapshot
from sessionrepo.models import Session, StoredMessage
from sessionrepo.models.message import utcnow
from sessionrepo.models.tables import messages_table, sessions_table
from sessionrepo.models.usage import Usage
from sessionrepo.store import backup_state as _state
from sessionrepo.store import codec as _codec
from sessionrepo.store import tombstones as _tombstones
from sessionrepo.store.arguments import check_limit
from sessionrepo.store.database import Database
from sessionrepo.store.usage import read_usage

T = TypeVar("T")
S = sessions_table.c
M = messages_table.c


class SnapshotReader:
    """Reads on the snapshot's connection (see the module docstring)."""

    def __init__(self, connection: Connection, database: Database) -> None:
        self._conn = connection
        self._db = database
        #: When the snapshot was taken (just before its first read), UTC.
        self.taken_at = utcnow()
        # The first read fixes a SQLite snapshot; PostgreSQL's was set by the caller.
        connection.execute(select(S.id).limit(1)).all()

    @property
    def backend(self) -> str:
        return self._db.backend

    def sessions(self, *, after_id: str | None = None, limit: int = 500) -> list[SessionSnapshot]:
        """A page of sessions, by id, with their ``next_seq`` (all of them, paged)."""
        check_limit(limit, maximum=1000)
        query = select(sessions_table)
        if after_id is not None:
            query = query.where(S.id > _codec.check_session_id(after_id, "after_id"))
        rows = self._conn.execute(query.order_by(S.id).limit(limit)).all()
        return [
            SessionSnapshot(
                Session.model_construct(**_codec.session_from_row(row)), int(row.next_seq)
            )
            for row in rows
        ]

    def messages(
        self, session_id: str, *, after_seq: int, before_seq: int, limit: int = 500
    ) -> list[StoredMessage]:
        """The session's messages with ``after_seq < seq < before_seq``, by seq, at most
        ``limit``: every one stored, those an edit superseded included."""
        check_limit(limit, maximum=1000)
        query = (
            select(*_codec.load_columns)
            .where(M.session_id == session_id, M.seq > after_seq, M.seq < before_seq)
            .order_by(M.seq)
            .limit(limit)
        )
        return _codec.stored_messages(self._conn.execute(query))

    def usage(self, session_id: str) -> list[Usage]:
        """The session's usage records, oldest first (by time, then key)."""
        return read_usage(self._conn, session_id)

    def adk_session(self, session_id: str) -> dict[str, Any] | None:
        """The session's ADK row (names, state, times; ``None``: not an ADK session)."""
        return _state.read_adk_session(self._conn, session_id)

    def adk_states(
        self, kind: _state.StateKind, *, after: tuple[str, ...] | None = None, limit: int = 500
    ) -> list[dict[str, Any]]:
        """A page of the ADK app or user states, by key."""
        check_limit(limit, maximum=1000)
        return _state.read_states(self._conn, kind, after=after, limit=limit)


def read_snapshot(database: Database, work: Callable[[SnapshotReader], T]) -> T:
    """``work(reader)`` in one read transaction that sees the store as of one instant
    (see the module docstring); its result."""

    def run(connection: Connection) -> T:
        database.dialect.begin_snapshot(connection)
        return work(SnapshotReader(connection, database))

    return database.read(run)


def session_erased(database: Database, session_id: str) -> bool:
    """Whether an erasure removed ``session_id`` whole from this store (its tombstone)."""

    def work(connection: Connection) -> bool:
        key = _tombstones.secret(connection, database)
        hashed = _tombstones.session_hash(key, _codec.check_session_id(session_id))
        return _tombstones.erased_at(connection, hashed) is not None

    return database.read(work)
