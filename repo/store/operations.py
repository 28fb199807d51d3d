"""The operator methods (:class:`sessionrepo.contract.SessionOperations`): a component
:class:`~sessionrepo.store.repository.SessionRepository` holds and delegates to.

What ``sessionrepo.ops`` (export, import, prune) and the importers need, so that they
never write SQL of their own; the contract's docstrings state what each guarantees.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Literal
from uuid import UUID

from sqlalchemy import ColumnElement, Connection, and_, delete, func, select, true, update

from sessionrepo.contract import (
    PruneResult,
    RestoreResult,
    SessionFilter,
    SessionOperations,
    SessionSnapshot,
)
from sessionrepo.errors import ArgumentTypeError, InvalidArgument, InvalidMessage, RepoError
from sessionrepo.models import Session, StoredMessage
from sessionrepo.models.tables import messages_table, outbox_table, sessions_table
from sessionrepo.models.usage import rollup_table
from sessionrepo.store import codec as _codec
from sessionrepo.store import tombstones as _tombstones
from sessionrepo.store.append import Appender
from sessionrepo.store.arguments import (
    check_aware_time,
    check_instance,
    check_int,
    check_limit,
    check_many,
    check_optional_text,
    check_session_ids,
)
from sessionrepo.store.database import Database
from sessionrepo.store.editing import SessionEditor
from sessionrepo.store.transaction import SessionTransaction, fetch_session

S = sessions_table.c
M = messages_table.c
O = outbox_table.c  # noqa: E741


class SessionOperator(SessionOperations):
    """The operator methods of one repository (see the module's docstring)."""

    def __init__(self, database: Database, appender: Appender, editor: SessionEditor) -> None:
        self._db = database
        self._appender = appender
        self._editor = editor

    def count_sessions(self, selection: SessionFilter | None = None) -> int:
        query = select(func.count()).select_from(sessions_table)
        query = query.where(filter_where(_selection(selection)))
        return int(self._db.read(lambda conn: conn.execute(query).scalar_one()))

    def session_snapshots(
        self,
        selection: SessionFilter | None = None,
        *,
        after_id: str | None = None,
        limit: int = 500,
    ) -> list[SessionSnapshot]:
        check_limit(limit, maximum=1000)
        query = select(sessions_table).where(filter_where(_selection(selection)))
        if after_id is not None:
            query = query.where(S.id > _codec.check_session_id(after_id, "after_id"))
        query = query.order_by(S.id).limit(limit)
        rows = self._db.read(lambda conn: conn.execute(query).all())
        return [_snapshot(row) for row in rows]

    def count_messages(self, session_ids: Iterable[str]) -> int:
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
        check_aware_time(cutoff, "cutoff")
        ids = sorted(set(check_session_ids(session_ids)))
        if unchanged_from is not None and not isinstance(unchanged_from, Mapping):
            raise ArgumentTypeError(
                "unchanged_from", f"must be a mapping, got {type(unchanged_from).__name__}"
            )
        expected = unchanged_from or {}
        prunable = filter_where(SessionFilter(ended_before=cutoff, active_before=cutoff))

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
            conn.execute(delete(rollup_table).where(rollup_table.c.session_id.in_(gone)))
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
        messages, erased = _tombstones.screen_stored(self._db, sid, messages)
        if erased and not messages:
            return RestoreResult(session_id=sid, outcome="erased", erased=erased)
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
                    .values(last_active_at=new_row["last_active_at"], last_active_lag_us=0)
                )
            return RestoreResult(
                session_id=sid,
                outcome="created" if tx.created else "present",
                inserted=inserted,
                duplicates=duplicates,
                conflicts=conflicts,
                erased=erased,
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
        sid = _codec.check_session_id(session_id)
        check_aware_time(when, "when")
        check_aware_time(stamped_since, "stamped_since")
        stamp = S.last_active_at

        def work(conn: Connection) -> bool:
            changed = conn.execute(
                update(sessions_table)
                .where(S.id == sid, (stamp >= stamped_since) | (stamp < when))
                .values(last_active_at=when, last_active_lag_us=0)
            ).rowcount
            if not changed:
                fetch_session(conn, sid)  # NotFound, or a newer stamp that stays
            return bool(changed)

        return self._db.write(work)


def filter_where(selection: SessionFilter) -> ColumnElement[bool]:
    """``selection`` as a ``WHERE`` clause on ``sessions``, its fields checked."""
    ids = check_session_ids(selection.session_ids, "selection.session_ids")
    if ids:
        filters = (
            selection.source,
            selection.user_id,
            selection.status,
            selection.ended_before,
            selection.active_before,
        )
        if filters != (None,) * len(filters):
            raise InvalidArgument("selection", "give session ids or filters, not both")
        return S.id.in_(ids)
    check_optional_text(selection.source, "selection.source")
    check_optional_text(selection.user_id, "selection.user_id")
    clauses: list[ColumnElement[bool]] = []
    if selection.source is not None:
        clauses.append(S.source == selection.source)
    if selection.user_id is not None:
        clauses.append(S.user_id == selection.user_id)
    if selection.status == "open":
        clauses.append(S.ended_at.is_(None))
    elif selection.status == "ended":
        clauses.append(S.ended_at.is_not(None))
    elif selection.status is not None:
        raise InvalidArgument("status", "must be 'open', 'ended' or None")
    for name, bound, column in (
        ("ended_before", selection.ended_before, S.ended_at),
        ("active_before", selection.active_before, S.last_active_at),
    ):
        if bound is not None:
            clauses.append(column < check_aware_time(bound, name))
    return and_(true(), *clauses)


def _selection(selection: object) -> SessionFilter:
    """An operator call's ``selection``: ``None`` (every session) or a SessionFilter."""
    if selection is None:
        return SessionFilter()
    return check_instance(selection, "selection", SessionFilter)


def _snapshot(row: Any) -> SessionSnapshot:
    return SessionSnapshot(
        Session.model_construct(**_codec.session_from_row(row)), int(row.next_seq)
    )


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


#: Session fields that count what the session holds: a restore derives them.
_DERIVED = {"message_count", "tool_call_count"}
