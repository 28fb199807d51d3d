"""The usage ledger on the write paths: usage records with their messages, once each.

A usage record (:class:`~sessionrepo.models.usage.Usage`) is keyed like a message:
``(session_id, usage_id)`` is the primary key of ``usage_records`` and it is inserted
``ON CONFLICT DO NOTHING``, so a retry, a re-flush or an outbox replay of the same record
is a no-op. A record given with messages and without a key takes the key of the message
it comes with (the one it names, else the batch's last), so the same message flushed
again with the same usage inserts nothing either.

An append that carries usage runs as one unit of work (the session's row lock, the
messages through the appender's locked path, the usage rows, the session's token
totals moved by what was inserted), so messages and usage land together or not at all.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any, Final, NamedTuple
from uuid import UUID

from pydantic import ValidationError
from sqlalchemy import Connection, Insert, bindparam, case, select, update

import sessionrepo.observability as _observe
from sessionrepo.dialects.base import BackendDialect
from sessionrepo.errors import ArgumentTypeError, InvalidMessage, NotFound, QueuedBehindOutbox
from sessionrepo.models import AppendResult, Message
from sessionrepo.models.outbox_protocol import holds_fifo
from sessionrepo.models.tables import outbox_table, sessions_table
from sessionrepo.models.usage import Usage, UsageResult, usage_table
from sessionrepo.store import rollup as _rollup
from sessionrepo.store import tombstones as _tombstones
from sessionrepo.store.append import Appender, OnConflict
from sessionrepo.store.codec import PreparedBatch
from sessionrepo.store.database import Database

#: Makes the unit of work of an append or a record: ``(database, session id, the row a
#: missing session is created from)``, a ``SessionTransaction`` (the repository's; the
#: transaction module uses this one, so it is handed in rather than imported).
Transactions = Callable[[Database, str, dict[str, Any] | None], AbstractContextManager[Any]]

U = usage_table.c
S = sessions_table.c
O = outbox_table.c  # noqa: E741

#: The key of a usage record (its insert skips a stored one).
USAGE_KEY: Final = ("session_id", "usage_id")

UsageInput = Usage | Mapping[str, Any] | Sequence[Usage | Mapping[str, Any]] | None


def check_usage(usage: UsageInput, messages: Sequence[Message]) -> tuple[Usage, ...]:
    """Validated usage records, each with its key and (when it comes with messages)
    its message; a record repeated in the call (the same key) is kept once.

    Raises:
        InvalidMessage: a record is not valid, or has no key and no message to take
            one from (nothing was written).
    """
    if usage is None:
        return ()
    if isinstance(usage, Usage | Mapping):
        items: list[Any] = [usage]
    elif isinstance(usage, list | tuple):
        items = list(usage)
    else:
        raise ArgumentTypeError(
            "usage", f"a usage record or a list of them, got {type(usage).__name__}"
        )
    last = messages[-1].client_msg_uuid if messages else None
    checked: dict[UUID, Usage] = {}
    for index, item in enumerate(items):
        field = f"usage[{index}]"
        if not isinstance(item, Usage | Mapping):
            raise ArgumentTypeError(field, f"a usage record (a dict), got {type(item).__name__}")
        try:
            record = item if isinstance(item, Usage) else Usage.model_validate(item)
            if isinstance(item, Usage):
                record = Usage.model_validate(item.model_dump())  # model_construct skips checks
        except ValidationError as exc:
            error = exc.errors()[0]
            where = ".".join(str(part) for part in error["loc"])
            raise InvalidMessage(f"{field}.{where}", error["msg"]) from None
        message = record.message_uuid or last
        key = record.usage_id or message
        if key is None:
            raise InvalidMessage(
                f"{field}.usage_id", "needed for usage that comes without a message"
            )
        if record.usage_id != key or record.message_uuid != message:
            record = record.model_copy(update={"usage_id": key, "message_uuid": message})
        checked.setdefault(key, record)
    return tuple(checked.values())


def usage_row(session_id: str, record: Usage) -> dict[str, Any]:
    row = record.model_dump(exclude={"usage_id"})
    row["usage_id"] = record.usage_id
    row["session_id"] = session_id
    return row


class UsageWrites(NamedTuple):
    """The statements that write usage: the records' insert (a stored key skipped) and
    the rollup's upsert."""

    insert: Insert
    rollup: Insert


def usage_writes(dialect: BackendDialect) -> UsageWrites:
    return UsageWrites(
        insert=dialect.insert_ignoring(usage_table, USAGE_KEY).returning(U.usage_id),
        rollup=_rollup.usage_upsert(dialect),
    )


def insert_usage(
    conn: Connection, writes: UsageWrites, session_id: str, records: Sequence[Usage]
) -> UsageResult:
    """Insert the records the session lacks, add them to the rollup and move its token
    totals by them; the caller holds the session's row lock (a unit of work)."""
    if not records:
        return UsageResult(session_id=session_id)
    inserted: set[UUID] = set()
    statement = writes.insert
    for record in records:  # few per call: one model call, or one turn's
        if conn.execute(statement, usage_row(session_id, record)).first() is not None:
            inserted.add(record.usage_id)  # type: ignore[arg-type]
    new = [record for record in records if record.usage_id in inserted]
    if new:
        _rollup.add_usage(conn, writes.rollup, session_id, new)
        conn.execute(
            update(sessions_table)
            .where(S.id == session_id)
            .values(
                input_tokens=S.input_tokens + sum(r.input_tokens for r in new),
                output_tokens=S.output_tokens + sum(r.output_tokens for r in new),
            )
        )
    return UsageResult(
        session_id=session_id,
        inserted=[r.usage_id for r in new],
        duplicates=[r.usage_id for r in records if r.usage_id not in inserted],
    )


def _counted(records: Sequence[Usage], recorded: UsageResult, database: Database) -> None:
    """The metrics of the records ``recorded`` inserted (committed) into ``database``."""
    inserted = set(recorded.inserted)
    if inserted:
        _observe.record_usage([r for r in records if r.usage_id in inserted], database)


class UsageLedger:
    """The ledger's writes for one repository (its appender, units of work, database)."""

    def __init__(self, appender: Appender, transactions: Transactions, database: Database) -> None:
        self._appender = appender
        self._transactions = transactions
        self._db = database
        self.writes = usage_writes(database.dialect)

    def append(
        self,
        batch: PreparedBatch,
        *,
        database: Database,
        on_conflict: OnConflict,
        behind_outbox: bool,
    ) -> AppendResult:
        """``batch`` (which carries usage) appended with its usage, in one unit of work.

        Raises:
            QueuedBehindOutbox: as :meth:`Appender.append` (nothing was written).
        """
        # Screened first, as every append (no session row made for a batch whose every
        # message was erased); the kept messages' usage rides on.
        result = _tombstones.screened(
            database,
            batch,
            lambda kept: self._append(
                kept, database=database, on_conflict=on_conflict, behind_outbox=behind_outbox
            ),
        )
        assert result is not None  # _append raises QueuedBehindOutbox itself
        return result

    def _append(
        self,
        batch: PreparedBatch,
        *,
        database: Database,
        on_conflict: OnConflict,
        behind_outbox: bool,
    ) -> AppendResult:
        sid = batch.session_id
        with self._transactions(database, sid, batch.new_session) as tx:
            if behind_outbox and tx.execute(_PARKED, {"sid": sid}).first() is not None:
                raise QueuedBehindOutbox(sid)
            result = self._appender.append_locked(
                tx.connection, sid, tx.next_seq, batch, on_conflict=on_conflict
            )
            recorded = insert_usage(tx.connection, self.writes, sid, batch.usage)
        _counted(batch.usage, recorded, database)
        return result

    def record(
        self, session_id: str, records: Sequence[Usage], new_session: dict[str, Any] | None
    ) -> UsageResult:
        """Usage without messages, in a unit of work of its own."""
        with self._transactions(self._db, session_id, new_session) as tx:
            recorded = insert_usage(tx.connection, self.writes, session_id, records)
        _counted(records, recorded, self._db)
        return recorded

    def list(self, session_id: str) -> list[Usage]:
        """The session's usage records, oldest first."""
        return self._db.read(lambda conn: read_usage(conn, session_id))


def read_usage(conn: Connection, session_id: str) -> list[Usage]:
    """The session's usage records, oldest first (by time, then key)."""
    query = (
        select(usage_table).where(U.session_id == session_id).order_by(U.occurred_at, U.usage_id)
    )
    return [
        Usage.model_validate({k: v for k, v in row._mapping.items() if k != "session_id"})
        for row in conn.execute(query)
    ]


def restore_usage(
    database: Database, session_id: str, records: Sequence[Usage], *, created: bool = False
) -> UsageResult:
    """Put back the usage records of a session restored as exported (an import of an
    export, a restore of a backup): the records it lacks are inserted, one already
    stored (the same key) is skipped, and its token totals stay as they are: the session
    row restored with them already counts them. (A session that took writes of its own
    since, merged rather than restored, takes its records through
    :meth:`UsageLedger.record`.)

    The tombstones are honoured as for messages: a record of a message an erasure
    removed, or in an erased session one made (``occurred_at``) before the erasure, is
    not inserted but listed in ``erased``; when ``created`` (the session row was made
    by this restore, counting every record) its totals drop by those records'.

    Raises:
        InvalidMessage: a record is invalid or has no key (nothing was written).
        NotFound: no such session (and not every record was erased).
    """
    checked = check_usage(list(records), [])
    if not checked:
        return UsageResult(session_id=session_id)
    writes = usage_writes(database.dialect)

    def work(conn: Connection) -> UsageResult:
        kept, _ = _tombstones.screen_rows(conn, database, session_id, checked, _usage_key)
        held = {r.usage_id for r in kept}
        refused = [r for r in checked if r.usage_id not in held]
        erased = [r.usage_id for r in refused if r.usage_id is not None]
        if not kept:
            return UsageResult(session_id=session_id, erased=erased)
        if conn.execute(select(S.id).where(S.id == session_id)).first() is None:
            raise NotFound(f"no session {session_id!r}")
        inserted: list[UUID] = []
        duplicates: list[UUID] = []
        for record in kept:
            row = usage_row(session_id, record)
            new = conn.execute(writes.insert, row).first() is not None
            (inserted if new else duplicates).append(row["usage_id"])
        new_ones = set(inserted)
        _rollup.add_usage(
            conn, writes.rollup, session_id, [r for r in kept if r.usage_id in new_ones]
        )
        if created and refused:
            less_in = S.input_tokens - sum(r.input_tokens for r in refused)
            less_out = S.output_tokens - sum(r.output_tokens for r in refused)
            conn.execute(
                update(sessions_table)
                .where(S.id == session_id)
                .values(
                    input_tokens=case((less_in < 0, 0), else_=less_in),
                    output_tokens=case((less_out < 0, 0), else_=less_out),
                )
            )
        return UsageResult(
            session_id=session_id, inserted=inserted, duplicates=duplicates, erased=erased
        )

    return database.write(work)


def _usage_key(record: Usage) -> tuple[UUID, datetime]:
    """What the tombstones know a record by: the message it came with (else its own
    key), and when it was made."""
    key = record.message_uuid or record.usage_id
    assert key is not None  # check_usage gives every record its key
    return key, record.occurred_at


#: Whether the session has parked messages (an outbox in this database).
_PARKED = select(O.position).where(O.session_id == bindparam("sid"), holds_fifo(O.state)).limit(1)
