"""Editing a transcript without losing history: rewind, retract, pop, clear, fork, compact.

An edit never deletes a message: it marks it ``superseded`` (``retracted``, or
``compacted`` when a summary took its place), which takes it out of the *live*
transcript (what ``load_transcript`` returns by default, what ``list_sessions`` previews,
what ``search`` finds and what the session's counters count) and keeps it stored
(``load_transcript(include_retracted=True)``, export, import). Its key stays taken: a
re-flush of a superseded message is a duplicate, a no-op, and does not bring it back.

Every edit is one transaction under the session's row lock, the lock appends take
(``BackendDialect.lock_session``), so edits and appends of one session are serialised:
whatever runs concurrently, the transcript is that of some serial order of the calls.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal
from uuid import UUID

from sqlalchemy import Connection, Row, and_, delete, func, insert, literal, select, update

from sessionrepo.contract import TranscriptEditor
from sessionrepo.errors import ConflictError, InvalidArgument, InvalidMessage, NotFound
from sessionrepo.models import EditResult, Message, Session
from sessionrepo.models.message import parse_uuid, utcnow
from sessionrepo.models.tables import (
    messages_table,
    search_backlog_table,
    sessions_table,
)
from sessionrepo.models.transcript import last_step
from sessionrepo.store import codec as _codec
from sessionrepo.store import rollup as _rollup
from sessionrepo.store.arguments import check_instance, check_int, check_session_id
from sessionrepo.store.database import Database
from sessionrepo.store.search_index import SearchIndex

S = sessions_table.c
M = messages_table.c
B = search_backlog_table.c

Superseded = Literal["retracted", "compacted"]

#: How far back ``pop_last`` looks for the start of the last step (a step longer than
#: this, a call with thousands of outputs, is popped in part).
_POP_WINDOW = 512
#: Session fields a fork takes from its source unless given.
_INHERITED = ("source", "user_id", "title", "model", "model_settings", "system_prompt", "metadata")


def _live() -> Any:
    return M.superseded.is_(None)


class SessionEditor(TranscriptEditor):
    """The edits, a component :class:`~sessionrepo.store.repository.SessionRepository`
    holds and delegates to (the contract, :class:`~sessionrepo.contract.TranscriptEditor`,
    says what each edit guarantees), and the editing primitives a unit of work offers
    (:meth:`retract_in`, :meth:`supersede_keys`)."""

    def __init__(
        self, database: Database, search: SearchIndex, index_appends: bool | Literal["immediate"]
    ) -> None:
        self._db = database
        self._search = search
        self._index_appends = index_appends

    # -- the edits --------------------------------------------------------------------

    def rewind(self, /, session_id: str, to_seq: int) -> EditResult:
        sid = check_session_id(session_id)
        to_seq = check_int(to_seq, "to_seq")
        return self._db.write(lambda conn: self._edit(conn, sid, M.seq > to_seq))

    def retract(self, /, session_id: str, keys: Iterable[UUID | str]) -> EditResult:
        sid = check_session_id(session_id)
        wanted = check_keys(keys)

        def work(conn: Connection) -> EditResult:
            self._lock_session(conn, sid)
            return self.retract_in(conn, sid, wanted)

        return self._db.write(work)

    def pop_last(self, /, session_id: str) -> EditResult:
        sid = check_session_id(session_id)

        def work(conn: Connection) -> EditResult:
            self._lock_session(conn, sid)
            tail = _codec.stored_messages(
                conn.execute(
                    select(*_codec.load_columns)
                    .where(M.session_id == sid, _live())
                    .order_by(M.seq.desc())
                    .limit(_POP_WINDOW)
                )
            )
            tail.reverse()
            if not tail:
                return self._edit(conn, sid, literal(False), locked=True)
            first = tail[last_step(list(tail))].seq
            return self._edit(conn, sid, M.seq >= first, locked=True)

        return self._db.write(work)

    def clear_session(self, /, session_id: str) -> EditResult:
        sid = check_session_id(session_id)
        return self._db.write(lambda conn: self._edit(conn, sid, literal(True)))

    def compact(
        self, /, session_id: str, through_seq: int, summary_message: Message | Mapping[str, Any]
    ) -> EditResult:
        sid = check_session_id(session_id)
        through_seq = check_int(through_seq, "through_seq", minimum=1)
        validated, rows = _codec.prepare_messages([summary_message])
        summary, row = validated[0], rows[0]

        def work(conn: Connection) -> EditResult:
            next_seq = self._lock_session(conn, sid)
            if through_seq >= next_seq:
                raise InvalidArgument(
                    "through_seq",
                    f"session {sid!r} has no message {through_seq} (next is {next_seq})",
                )
            held = conn.execute(
                select(M.seq, M.content_hash).where(
                    M.session_id == sid, M.client_msg_uuid == summary.client_msg_uuid
                )
            ).first()
            if held is not None:  # sent again: done already, or a different summary
                if bytes(held.content_hash) != row["content_hash"] or held.seq != through_seq + 1:
                    raise ConflictError(
                        f"session {sid!r}: the summary's key {summary.client_msg_uuid} is "
                        f"stored already, not as this summary after seq {through_seq}",
                        session_id=sid,
                        conflicts=[summary.client_msg_uuid],
                    )
                return EditResult(session_id=sid, message_count=self._count(conn, sid))
            superseded = self._supersede(conn, sid, M.seq <= through_seq, "compacted")
            # The summary goes where the compacted messages were: every message after
            # them moves up one seq (stored seqs stay 1..n), their index entries and
            # backlog rows are renamed accordingly.
            moved = next_seq - 1 - through_seq
            if moved:
                conn.execute(
                    delete(search_backlog_table).where(
                        B.session_id == sid, B.first_seq + B.count > through_seq + 1
                    )
                )
                self._db.dialect.forget_search_entries(
                    conn, sid, list(range(through_seq + 1, next_seq))
                )
                after = and_(M.session_id == sid, M.seq > through_seq)
                conn.execute(update(messages_table).where(after).values(seq=-(M.seq + 1)))
                conn.execute(
                    update(messages_table).where(M.session_id == sid, M.seq < 0).values(seq=-M.seq)
                )
            self._db.dialect.insert_new_messages(conn, sid, through_seq + 1, [row], utcnow())
            conn.execute(update(sessions_table).where(S.id == sid).values(next_seq=next_seq + 1))
            self._enqueue(conn, sid, through_seq + 1, moved + 1)
            return EditResult(
                session_id=sid,
                superseded=superseded,
                inserted=[summary.client_msg_uuid],
                message_count=self._count(conn, sid),
            )

        return self._db.write(work)

    def fork_session(self, /, source_id: str, at_seq: int, new_id: str, **fields: Any) -> Session:
        source = check_session_id(source_id, "source_id")
        at_seq = check_int(at_seq, "at_seq")
        target = check_session_id(new_id, "new_id")
        if target == source:
            raise InvalidArgument("new_id", "a fork needs an id of its own")
        for name in (
            "message_count",
            "tool_call_count",
            "next_seq",
            "last_active_at",
            "forked_from_session_id",
            "forked_from_seq",
        ):
            if name in fields:
                raise InvalidMessage(
                    f"session.{name}",
                    "is derived from the transcript by the store; it cannot be set",
                )
        given = _codec.build_session(target, fields, "session")
        given_row = _codec.session_row(given)

        def work(conn: Connection) -> Session:
            existing = conn.execute(select(sessions_table).where(S.id == target)).first()
            if existing is not None:
                if (existing.forked_from_session_id, existing.forked_from_seq) == (source, at_seq):
                    return _session(existing)  # forked already: a no-op
                raise ConflictError(
                    f"session {target!r} exists, and is not a fork of {source!r} at seq {at_seq}",
                    session_id=target,
                    conflicts=[],
                )
            next_seq = self._lock_session(conn, source)
            if at_seq >= next_seq:
                raise InvalidArgument(
                    "at_seq", f"session {source!r} has no message {at_seq} (next is {next_seq})"
                )
            origin = conn.execute(select(sessions_table).where(S.id == source)).one()
            after = (
                conn.execute(
                    select(M.tool_calls).where(M.session_id == source, M.seq > at_seq, _live())
                )
                .scalars()
                .all()
            )
            row = dict(given_row)
            for name in _INHERITED:
                if name not in fields and not (
                    name == "model_settings" and "model_config" in fields  # its old name
                ):
                    row[name] = origin._mapping[name]
            now = utcnow()
            row |= {
                "message_count": origin.message_count - len(after),
                "tool_call_count": origin.tool_call_count - sum(len(c or ()) for c in after),
                "next_seq": at_seq + 1,
                "last_active_at": now,
                "forked_from_session_id": source,
                "forked_from_seq": at_seq,
            }
            created = conn.execute(
                self._db.dialect.insert_ignoring(sessions_table, ["id"])
                .values(**row)
                .returning(S.id)
            ).first()
            if created is None:  # a concurrent fork to the same id won: the same fork?
                raced = conn.execute(select(sessions_table).where(S.id == target)).one()
                if (raced.forked_from_session_id, raced.forked_from_seq) == (source, at_seq):
                    return _session(raced)
                raise ConflictError(
                    f"session {target!r} was just made, not as a fork of {source!r} at "
                    f"seq {at_seq}",
                    session_id=target,
                    conflicts=[],
                )
            columns = [c.name for c in messages_table.columns]
            copied = select(
                *(
                    literal(target, M.session_id.type).label("session_id")
                    if name == "session_id"
                    else M[name]
                    for name in columns
                )
            ).where(M.session_id == source, M.seq <= at_seq)
            conn.execute(insert(messages_table).from_select(columns, copied))
            _rollup.recount(conn, self._db.dialect, [target])
            self._enqueue(conn, target, 1, at_seq)
            return _session(conn.execute(select(sessions_table).where(S.id == target)).one())

        return self._db.write(work)

    # -- the parts ----------------------------------------------------------------------

    def _lock_session(self, conn: Connection, sid: str) -> int:
        """Lock the session as an append does; its ``next_seq``."""
        next_seq = self._db.dialect.lock_session(conn, sid)
        if next_seq is None:
            raise NotFound(f"no session {sid!r}")
        return next_seq

    def retract_in(self, conn: Connection, sid: str, wanted: Sequence[UUID]) -> EditResult:
        """:meth:`retract` of checked keys, the session locked by the caller."""
        found = set(
            conn.execute(
                select(M.client_msg_uuid).where(M.session_id == sid, M.client_msg_uuid.in_(wanted))
            ).scalars()
        )
        missing = [key for key in wanted if key not in found]
        if missing:
            raise NotFound(
                f"session {sid!r} holds no message {', '.join(map(str, missing))}; "
                "nothing was retracted"
            )
        return self._edit(conn, sid, M.client_msg_uuid.in_(wanted), locked=True)

    def supersede_keys(
        self, conn: Connection, sid: str, keys: Iterable[UUID | str], state: Superseded
    ) -> list[UUID]:
        """Take the live messages with these keys out of the live transcript (keys not
        held live are skipped); the caller holds the lock."""
        return self._supersede(conn, sid, M.client_msg_uuid.in_(check_keys(keys)), state)

    def _edit(self, conn: Connection, sid: str, which: Any, *, locked: bool = False) -> EditResult:
        """Retract the live messages of ``sid`` that ``which`` selects."""
        if not locked:
            self._lock_session(conn, sid)
        superseded = self._supersede(conn, sid, which, "retracted")
        return EditResult(
            session_id=sid, superseded=superseded, message_count=self._count(conn, sid)
        )

    def _supersede(self, conn: Connection, sid: str, which: Any, state: Superseded) -> list[UUID]:
        """Take the live messages ``which`` selects out of the live transcript: marked
        ``state``, out of the counters and the search index. The caller holds the lock."""
        rows = conn.execute(
            select(M.seq, M.client_msg_uuid, M.tool_calls)
            .where(M.session_id == sid, _live(), which)
            .order_by(M.seq)
        ).all()
        if rows:
            tool_calls = sum(len(row.tool_calls or ()) for row in rows)
            self.mark_superseded(conn, sid, [row.seq for row in rows], tool_calls, state)
        return [row.client_msg_uuid for row in rows]

    def mark_superseded(
        self, conn: Connection, sid: str, seqs: Sequence[int], tool_calls: int, state: Superseded
    ) -> None:
        """Mark live messages of ``sid`` (by ``seq``; ``tool_calls`` of them together)
        ``state``: out of the counters and the search index. The caller holds the lock."""
        day = self._db.dialect.utc_day(M.timestamp)
        days: Counter[str] = Counter()
        for start in range(0, len(seqs), 500):
            chosen = and_(M.session_id == sid, M.seq.in_(seqs[start : start + 500]))
            days.update(
                {
                    str(key): int(count)
                    for key, count in conn.execute(
                        select(day, func.count()).where(chosen, _live()).group_by(day)
                    )
                }
            )
            conn.execute(update(messages_table).where(chosen).values(superseded=state))
        _rollup.take_messages(conn, self._db.dialect, sid, days)
        conn.execute(
            update(sessions_table)
            .where(S.id == sid)
            .values(
                message_count=S.message_count - len(seqs),
                tool_call_count=S.tool_call_count - tool_calls,
            )
        )
        self._db.dialect.forget_search_entries(conn, sid, seqs)

    def _enqueue(self, conn: Connection, sid: str, first_seq: int, count: int) -> None:
        """Name messages an edit wrote or moved for the search catch-up (it indexes the
        live ones among them)."""
        if count <= 0:
            return
        if not self._index_appends:
            self._search.mark_stale_in(conn, "edits without indexing (search_index=False)")
            return
        self._search.enqueue_in(conn, sid, first_seq, count)

    def _count(self, conn: Connection, sid: str) -> int:
        return int(conn.execute(select(S.message_count).where(S.id == sid)).scalar_one())


def _session(row: Row[Any]) -> Session:
    return Session.model_construct(**_codec.session_from_row(row))


def check_keys(keys: object) -> list[UUID]:
    """Message keys (``UUID`` or its text), distinct, in order; at least one."""
    if isinstance(keys, str | bytes | UUID) or not isinstance(keys, Iterable):
        raise InvalidArgument("keys", "expected a list of message keys")
    wanted: list[UUID] = []
    for index, key in enumerate(keys):
        if isinstance(key, UUID):
            wanted.append(key)
            continue
        check_instance(key, f"keys[{index}]", str)
        try:
            wanted.append(parse_uuid(key))
        except ValueError:
            raise InvalidArgument(f"keys[{index}]", f"{key[:64]!r} is not a UUID") from None
    if not wanted:
        raise InvalidArgument("keys", "give at least one key")
    return list(dict.fromkeys(wanted))
