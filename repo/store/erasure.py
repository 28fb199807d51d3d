"""Erasure: every copy the store holds of a session, a user's or a source's sessions.

:class:`Eraser` is what :meth:`SessionRepository.erase` runs:

1. The sessions the selector names (``sessions.id``, ``user_id`` or ``source``), then,
   until none is new, the sessions made from them: forks (``forked_from_session_id``,
   whose transcript starts as a copy of the source's prefix) and continuations
   (``parent_session_id``, which a compaction's summary of the parent opens).
2. Per session, one unit of work (:meth:`SessionRepository.session_transaction`, under
   the session's lock, so appends and edits of it queue behind): its messages (live,
   retracted, compacted: compaction summaries are messages), their search index entries
   and backlog, its ADK session, its rows in this database's ``pending_outbox``, the
   session row; and in the same transaction its tombstone (:mod:`.tombstones`: keyed
   hashes of its id and of every message key, those parked in the outbox included).
3. The ADK user state of the erased ADK users (``adk_user_states``) that no remaining
   ADK session uses, and for a ``user_id`` selector every ADK user state of that user,
   each leaving its tombstone (:func:`.tombstones.record_user_state`).
   ADK app state is shared by every user of an app: not the user's, not erased.
4. The audit row (content-free: when, who as given, the selector's kind and keyed hash,
   the counts), written first (``started``) and completed at the end.
5. The dialect's scrub (SQLite: FTS merge and WAL truncate; PostgreSQL: ``VACUUM``).

A dry run reads the same sessions and counts; it writes nothing, not even the audit.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from sqlalchemy import Connection, delete, func, or_, select, true

from sessionrepo.errors import InvalidArgument, NotFound
from sessionrepo.models import Session
from sessionrepo.models.adk import adk_sessions_table, adk_user_states_table
from sessionrepo.models.message import utcnow
from sessionrepo.models.privacy import (
    AuditEntry,
    ErasureCounts,
    ErasureReport,
    RetentionPolicy,
    RetentionReport,
    ScrubReport,
    SelectorKind,
    privacy_audit_table,
    retention_policies_table,
)
from sessionrepo.models.tables import (
    embeddings_table,
    messages_table,
    outbox_table,
    search_backlog_table,
    sessions_table,
)
from sessionrepo.models.usage import rollup_table
from sessionrepo.store import tombstones as _tombstones
from sessionrepo.store.arguments import check_bool, check_optional_text, check_session_id
from sessionrepo.store.database import Database
from sessionrepo.store.memory import SentMemory
from sessionrepo.store.transaction import SessionTransaction

S = sessions_table.c
M = messages_table.c
O = outbox_table.c  # noqa: E741
B = search_backlog_table.c
AS = adk_sessions_table.c
AU = adk_user_states_table.c
PA = privacy_audit_table.c

#: Ids per ``IN`` list.
_CHUNK = 500


def check_selector(session_id: object, user_id: object, source: object) -> tuple[SelectorKind, str]:
    """Exactly one of the three, checked: its kind and value."""
    given = [
        (kind, value)
        for kind, value in (("session", session_id), ("user", user_id), ("source", source))
        if value is not None
    ]
    if len(given) != 1:
        raise InvalidArgument(
            "selector", "give exactly one of session_id=, user_id= or source= to erase"
        )
    kind, value = given[0]
    if kind == "session":
        return "session", check_session_id(value)
    text_value = check_optional_text(value, "user_id" if kind == "user" else "source")
    if not text_value:
        raise InvalidArgument(kind if kind == "source" else "user_id", "must not be empty")
    return ("user" if kind == "user" else "source"), text_value


class Eraser:
    """Erasures for one repository (see the module's docstring).

    Args:
        database: the repository's database.
        transaction: makes the unit of work of a session (``create=False``).
        memory: the repository's sent memory (what it remembers of erased sessions is
            dropped).
    """

    def __init__(
        self,
        database: Database,
        transaction: Callable[[str], SessionTransaction],
        memory: SentMemory,
    ) -> None:
        self._db = database
        self._transaction = transaction
        self._memory = memory

    def erase(
        self,
        kind: SelectorKind,
        value: str,
        *,
        dry_run: bool,
        actor: str | None,
        scrub: bool,
        compact: bool,
    ) -> ErasureReport:
        check_bool(dry_run, "dry_run")
        check_bool(scrub, "scrub")
        check_bool(compact, "compact")
        actor = check_optional_text(actor, "actor")
        chosen, derived = self._db.read(lambda conn: _select(conn, kind, value))
        every = chosen + derived
        if dry_run:
            counts = self._db.read(lambda conn: _count_all(conn, every, kind, value))
            return ErasureReport(
                selector_kind=kind,
                dry_run=True,
                session_ids=every,
                counts=counts.model_copy(update={"derived_sessions": len(derived)}),
            )
        audit_id = uuid.uuid4()
        self._db.write(lambda conn: self._audit_start(conn, audit_id, kind, value, actor))
        counts = ErasureCounts()
        erased: list[str] = []
        pairs: set[tuple[str, str]] = set()
        for sid in every:
            done = self._erase_session(sid, audit_id)
            if done is None:
                continue  # gone meanwhile
            session_counts, adk_pairs = done
            counts += session_counts
            pairs |= adk_pairs
            erased.append(sid)
            self._memory.forget_session(sid)
        users = self._db.write(
            lambda conn: _erase_adk_users(conn, self._db, pairs, kind, value, audit_id=audit_id)
        )
        counts = counts.model_copy(
            update={
                "adk_user_states": users,
                "derived_sessions": len([sid for sid in erased if sid in set(derived)]),
            }
        )
        self._db.write(lambda conn: _audit_end(conn, audit_id, counts))
        report = None
        if scrub and (erased or users):
            report = self.scrub(compact=compact)
        return ErasureReport(
            selector_kind=kind,
            dry_run=False,
            session_ids=erased,
            counts=counts,
            audit_id=audit_id,
            scrub=report,
        )

    def scrub(self, *, compact: bool = False) -> ScrubReport:
        """The dialect's steps that take erased bytes out of the files (see
        :meth:`~sessionrepo.dialects.base.ErasureRole.scrub_after_erasure`)."""
        started = time.perf_counter()
        steps, complete = self._db.write_direct(
            lambda driver: self._db.dialect.scrub_after_erasure(driver, compact)
        )
        return ScrubReport(steps=steps, complete=complete, seconds=time.perf_counter() - started)

    def _erase_session(
        self,
        sid: str,
        audit_id: uuid.UUID,
        still: Callable[[Session], bool] | None = None,
    ) -> tuple[ErasureCounts, set[tuple[str, str]]] | None:
        """Erase one session in its unit of work (``None``: it is gone, or ``still``,
        asked under its lock, says it no longer qualifies)."""
        try:
            tx = self._transaction(sid)
            with tx:
                if still is not None and not still(tx.session()):
                    return None
                conn = tx.connection
                self._db.dialect.prepare_erasure(conn)
                counts = _count_session(conn, sid)
                # Its messages' keys and those parked in this database's outbox.
                stored = select(M.client_msg_uuid.label("key")).where(M.session_id == sid)
                parked = select(O.client_msg_uuid.label("key")).where(O.session_id == sid)
                keys = [row[0] for row in conn.execute(stored.union_all(parked))]
                pairs = {
                    (str(app), str(user))
                    for app, user in conn.execute(
                        select(AS.app_name, AS.user_id).where(AS.session_id == sid)
                    )
                }
                self._db.dialect.forget_search_documents(conn, [sid])
                conn.execute(delete(adk_sessions_table).where(AS.session_id == sid))
                conn.execute(delete(messages_table).where(M.session_id == sid))
                conn.execute(delete(rollup_table).where(rollup_table.c.session_id == sid))
                conn.execute(delete(outbox_table).where(O.session_id == sid))
                conn.execute(delete(sessions_table).where(S.id == sid))
                _tombstones.record(conn, self._db, sid, keys, when=utcnow(), audit_id=audit_id)
        except NotFound:
            return None
        return counts, pairs

    # -- retention --------------------------------------------------------------------

    def retention(
        self,
        *,
        now: datetime,
        dry_run: bool,
        actor: str | None,
        on_session: Callable[[str], None] | None,
    ) -> RetentionReport:
        """Apply every stored policy (see :meth:`SessionRepository.apply_retention`)."""
        policies = self._db.read(read_policies)
        plan = self._db.read(lambda conn: _retention_plan(conn, policies, now))
        if dry_run:
            superseded = self._db.read(
                lambda conn: sum(
                    _superseded_keys_count(conn, sid, before) for sid, before in plan.superseded
                )
            )
            counts = self._db.read(lambda conn: _count_all(conn, plan.sessions, "session", ""))
            return RetentionReport(
                dry_run=True,
                session_ids=plan.sessions,
                superseded_messages=superseded,
                counts=counts.model_copy(update={"adk_user_states": 0}),
            )
        audit_id = uuid.uuid4()
        self._db.write(
            lambda conn: self._audit_start(
                conn,
                audit_id,
                "policy",
                ",".join(p.source for p in policies),
                actor,
                action="retention",
            )
        )
        counts = ErasureCounts()
        erased: list[str] = []
        kept: list[str] = []
        pairs: set[tuple[str, str]] = set()
        for sid in plan.sessions:
            cutoff = plan.cutoffs[sid]
            done = self._erase_session(sid, audit_id, still=partial(_qualifies, cutoffs=cutoff))
            if done is None:
                kept.append(sid)
                continue
            counts += done[0]
            pairs |= done[1]
            erased.append(sid)
            self._memory.forget_session(sid)
            if on_session is not None:
                on_session(sid)
        superseded = 0
        for sid, before in plan.superseded:
            superseded += self._erase_superseded(sid, before, audit_id)
        users = self._db.write(
            lambda conn: _erase_adk_users(conn, self._db, pairs, "session", "", audit_id=audit_id)
        )
        counts = counts.model_copy(update={"adk_user_states": users})
        totals = counts.model_copy(
            update={"retracted_messages": counts.retracted_messages, "sessions": len(erased)}
        )
        self._db.write(
            lambda conn: _audit_end(
                conn, audit_id, totals, extra={"superseded_messages": superseded}
            )
        )
        if erased or superseded:
            self.scrub(compact=False)
        return RetentionReport(
            dry_run=False,
            session_ids=erased,
            superseded_messages=superseded,
            counts=counts,
            kept=kept,
            audit_id=audit_id,
        )

    def _erase_superseded(self, sid: str, before: datetime, audit_id: uuid.UUID) -> int:
        """Erase the retracted and compacted messages of ``sid`` made before ``before``."""
        try:
            with self._transaction(sid) as tx:
                conn = tx.connection
                self._db.dialect.prepare_erasure(conn)
                old = (M.session_id == sid) & M.superseded.is_not(None) & (M.timestamp < before)
                keys = [row[0] for row in conn.execute(select(M.client_msg_uuid).where(old))]
                if not keys:
                    return 0
                # Their vectors too (the text's meaning): rows keyed like the messages.
                conn.execute(
                    delete(embeddings_table).where(
                        embeddings_table.c.session_id == sid,
                        embeddings_table.c.seq.in_(select(M.seq).where(old)),
                    )
                )
                conn.execute(delete(messages_table).where(old))
                _tombstones.record(
                    conn, self._db, sid, keys, when=utcnow(), audit_id=audit_id, whole=False
                )
                return len(keys)
        except NotFound:
            return 0

    def _audit_start(
        self,
        conn: Connection,
        audit_id: uuid.UUID,
        kind: str,
        value: str,
        actor: str | None,
        *,
        action: str = "erase",
    ) -> None:
        key = _tombstones.secret(conn, self._db)
        conn.execute(
            privacy_audit_table.insert().values(
                id=audit_id,
                at=utcnow(),
                action=action,
                actor=actor,
                selector_kind=kind,
                selector_hash=_tombstones.value_hash(key, kind, value),
                counts={},
                note="started",
            )
        )


def _audit_end(
    conn: Connection,
    audit_id: uuid.UUID,
    counts: ErasureCounts,
    extra: dict[str, int] | None = None,
) -> None:
    conn.execute(
        privacy_audit_table.update()
        .where(PA.id == audit_id)
        .values(counts=counts.model_dump() | (extra or {}), note=None)
    )


def _select(conn: Connection, kind: SelectorKind, value: str) -> tuple[list[str], list[str]]:
    """The sessions the selector names, and those made from them (forks, continuations),
    each sorted."""
    column = {"session": S.id, "user": S.user_id, "source": S.source}[kind]
    chosen = sorted(str(row[0]) for row in conn.execute(select(S.id).where(column == value)))
    seen = set(chosen)
    frontier = list(chosen)
    derived: list[str] = []
    while frontier:
        found: list[str] = []
        for start in range(0, len(frontier), _CHUNK):
            chunk = frontier[start : start + _CHUNK]
            rows = conn.execute(
                select(S.id).where(
                    S.forked_from_session_id.in_(chunk) | S.parent_session_id.in_(chunk)
                )
            )
            found += [str(row[0]) for row in rows if row[0] not in seen]
        found = sorted(set(found))
        seen.update(found)
        derived += found
        frontier = found
    return chosen, derived


def _count_session(conn: Connection, sid: str) -> ErasureCounts:
    """What the session holds, per kind, in one statement (a round trip, not six)."""

    def count(table: Any, column: Any, *where: Any) -> Any:
        return (
            select(func.count()).select_from(table).where(column == sid, *where).scalar_subquery()
        )

    row = conn.execute(
        select(
            count(messages_table, M.session_id, M.superseded.is_(None)),
            count(messages_table, M.session_id, M.superseded == "retracted"),
            count(messages_table, M.session_id, M.superseded == "compacted"),
            count(search_backlog_table, B.session_id),
            count(adk_sessions_table, AS.session_id),
            count(outbox_table, O.session_id),
        )
    ).one()
    live, retracted, compacted, backlog, adk, outbox = (int(value) for value in row)
    return ErasureCounts(
        sessions=1,
        live_messages=live,
        retracted_messages=retracted,
        compacted_messages=compacted,
        search_backlog=backlog,
        adk_sessions=adk,
        outbox_rows=outbox,
    )


def _count_all(
    conn: Connection, session_ids: Sequence[str], kind: SelectorKind, value: str
) -> ErasureCounts:
    counts = ErasureCounts()
    pairs: set[tuple[str, str]] = set()
    for sid in session_ids:
        counts += _count_session(conn, sid)
        pairs |= {
            (str(app), str(user))
            for app, user in conn.execute(
                select(AS.app_name, AS.user_id).where(AS.session_id == sid)
            )
        }
    users = _adk_user_selection(conn, pairs, kind, value, exclude=session_ids)
    return counts.model_copy(update={"adk_user_states": len(users)})


def _adk_user_selection(
    conn: Connection,
    pairs: set[tuple[str, str]],
    kind: SelectorKind,
    value: str,
    *,
    exclude: Sequence[str] = (),
) -> set[tuple[str, str]]:
    """The ADK user states to erase: the erased ADK users' that no other ADK session
    uses; every one of the user's, for a ``user_id`` selector."""
    chosen: set[tuple[str, str]] = set()
    if kind == "user":
        chosen |= {
            (str(app), str(user))
            for app, user in conn.execute(
                select(AU.app_name, AU.user_id).where(AU.user_id == value)
            )
        }
    for app, user in pairs:
        query = select(func.count()).where(AS.app_name == app, AS.user_id == user)
        if exclude:
            query = query.where(AS.session_id.not_in(list(exclude)))
        if not conn.execute(query).scalar_one():
            present = conn.execute(
                select(AU.app_name).where(AU.app_name == app, AU.user_id == user)
            ).first()
            if present is not None:
                chosen.add((app, user))
    return chosen


def _erase_adk_users(
    conn: Connection,
    database: Database,
    pairs: set[tuple[str, str]],
    kind: SelectorKind,
    value: str,
    *,
    audit_id: uuid.UUID,
) -> int:
    """Delete the chosen ADK user states, each leaving its tombstone (a restore of an
    older backup does not bring it back)."""
    chosen = _adk_user_selection(conn, pairs, kind, value)
    when = utcnow()
    for app, user in sorted(chosen):
        conn.execute(delete(adk_user_states_table).where(AU.app_name == app, AU.user_id == user))
        _tombstones.record_user_state(conn, database, app, user, when=when, audit_id=audit_id)
    return len(chosen)


def read_audit(conn: Connection, limit: int) -> list[AuditEntry]:
    """The newest ``limit`` audit rows, newest first."""
    rows = conn.execute(select(privacy_audit_table).order_by(PA.at.desc(), PA.id).limit(limit))
    return [AuditEntry.model_validate(row._asdict()) for row in rows]


# -- retention policies -------------------------------------------------------------------

RP = retention_policies_table.c
#: The policy of every source without its own.
DEFAULT_SOURCE = "*"


def read_policies(conn: Connection) -> list[RetentionPolicy]:
    rows = conn.execute(select(retention_policies_table).order_by(RP.source))
    return [
        RetentionPolicy(
            source=row.source,
            ended_days=row.ended_days,
            idle_days=row.idle_days,
            superseded_days=row.superseded_days,
        )
        for row in rows
    ]


def write_policy(conn: Connection, policy: RetentionPolicy) -> None:
    values = policy.model_dump() | {"updated_at": utcnow()}
    conn.execute(delete(retention_policies_table).where(RP.source == policy.source))
    conn.execute(retention_policies_table.insert().values(**values))


def drop_policy(conn: Connection, source: str) -> bool:
    done = conn.execute(
        delete(retention_policies_table).where(RP.source == source),
        execution_options={"preserve_rowcount": True},
    )
    return bool(done.rowcount)


@dataclass
class _Plan:
    sessions: list[str] = field(default_factory=list)
    #: Per session: the instant its end and last activity must both be before (ended
    #: sessions) or its last activity (open ones): ``(ended_cutoff, idle_cutoff)``.
    cutoffs: dict[str, tuple[datetime | None, datetime | None]] = field(default_factory=dict)
    superseded: list[tuple[str, datetime]] = field(default_factory=list)


def _qualifies(session: Session, cutoffs: tuple[datetime | None, datetime | None]) -> bool:
    """Whether ``session`` (as it stands under its lock) is still due."""
    ended_cutoff, idle_cutoff = cutoffs
    last = session.last_active_at
    if last is None:
        return False
    if session.ended_at is not None:
        return ended_cutoff is not None and session.ended_at < ended_cutoff and last < ended_cutoff
    return idle_cutoff is not None and last < idle_cutoff


def _retention_plan(conn: Connection, policies: Sequence[RetentionPolicy], now: datetime) -> _Plan:
    plan = _Plan()
    named = [p.source for p in policies if p.source != DEFAULT_SOURCE]
    for policy in policies:
        scope = (
            S.source.not_in(named)
            if policy.source == DEFAULT_SOURCE and named
            else true()
            if policy.source == DEFAULT_SOURCE
            else S.source == policy.source
        )
        ended_cutoff = now - timedelta(days=policy.ended_days) if policy.ended_days else None
        idle_cutoff = now - timedelta(days=policy.idle_days) if policy.idle_days else None
        due = []
        if ended_cutoff is not None:
            due.append(
                S.ended_at.is_not(None)
                & (S.ended_at < ended_cutoff)
                & (S.last_active_at < ended_cutoff)
            )
        if idle_cutoff is not None:
            due.append(S.ended_at.is_(None) & (S.last_active_at < idle_cutoff))
        if due:
            for row in conn.execute(select(S.id).where(scope, or_(*due)).order_by(S.id)):
                plan.sessions.append(str(row[0]))
                plan.cutoffs[str(row[0])] = (ended_cutoff, idle_cutoff)
        if policy.superseded_days:
            before = now - timedelta(days=policy.superseded_days)
            rows = conn.execute(
                select(M.session_id)
                .join(sessions_table, S.id == M.session_id)
                .where(scope, M.superseded.is_not(None), M.timestamp < before)
                .group_by(M.session_id)
                .order_by(M.session_id)
            )
            plan.superseded += [
                (str(row[0]), before) for row in rows if str(row[0]) not in plan.cutoffs
            ]
    plan.sessions.sort()
    return plan


def _superseded_keys_count(conn: Connection, sid: str, before: datetime) -> int:
    return int(
        conn.execute(
            select(func.count()).where(
                M.session_id == sid, M.superseded.is_not(None), M.timestamp < before
            )
        ).scalar_one()
    )
