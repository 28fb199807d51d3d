"""The usage rollup: what the insights report counts, summed per session, UTC day and model.

``usage_rollup`` holds, per ``(session_id, day, model)`` (:data:`ROLLUP_KEY`), the live
messages of the session's day (on the row of model :data:`ROLLUP_NO_MODEL`) and the
day's model calls of the model with their token sums and reported cost. The report
reads whole UTC days from it and only the partial days at the edges of a range from the
rows themselves; both give the same sums (the tests compare them with the raw records).

It is kept exact by the writes, in the transaction of the rows it sums, never by a
trigger (Citus runs none across shards; the rollup is distributed by session id,
co-located with the messages and usage rows it sums, so each upsert is routed to the
session's shard):

- an append counts its new messages of the session's open day (the newest UTC day it has
  messages on) on the session row, which it rewrites anyway (``sessions.rollup_day`` and
  ``rollup_messages``, migration 0020): no rollup row is written on the common path. The
  first append of a later day moves the count into the rollup; new messages of an older
  day go to the rollup at once. (In the dialects' append statements, and on Citus in the
  append function, since migration 0022; before it, that function added every day to
  the rollup itself.)
  Readers add the sessions' open days to the rollup's (``sessionrepo.ops.insights``);
  :func:`close_open_day` moves one session's into the rollup;
- a usage record adds its call (:func:`add_usage`, from every path that inserts one);
- a write that takes live messages or usage away, or marks them superseded (an edit, an
  erasure of messages, a restore), recounts the sessions it touched from their rows
  (:func:`recount`, which empties the row's count too): a decrement of a float sum would
  drift from the raw sum; an edit that supersedes messages takes them out by day
  (:func:`take_messages`, after :func:`close_open_day`);
- deleting a session deletes its rows (``ON DELETE CASCADE``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC
from typing import Any

from sqlalchemy import (
    Connection,
    Insert,
    Select,
    bindparam,
    delete,
    func,
    insert,
    literal,
    select,
    union_all,
    update,
)

from sessionrepo.dialects.base import BackendDialect
from sessionrepo.models.tables import messages_table, sessions_table
from sessionrepo.models.usage import (
    ROLLUP_COLUMNS,
    ROLLUP_COUNTS,
    ROLLUP_KEY,
    ROLLUP_NO_MODEL,
    ROLLUP_SUMS,
    TOKEN_KINDS,
    Usage,
    rollup_table,
    usage_table,
)

__all__ = [
    "add_usage",
    "close_open_day",
    "counted",
    "held",
    "recount",
    "take_messages",
    "usage_upsert",
]

R = rollup_table.c
M = messages_table.c
S = sessions_table.c
U = usage_table.c


def usage_upsert(dialect: BackendDialect) -> Insert:
    """The upsert that adds rows of the rollup to the stored ones (by :data:`ROLLUP_KEY`)."""
    return dialect.insert_adding(rollup_table, ROLLUP_KEY, ROLLUP_SUMS)


def add_usage(conn: Connection, upsert: Insert, session_id: str, records: Iterable[Usage]) -> None:
    """Add the calls of ``records`` (just inserted) to the session's rollup: one row
    per UTC day and model."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for record in records:
        day = record.occurred_at.astimezone(UTC).date().isoformat()
        model = record.model or ROLLUP_NO_MODEL
        row = rows.get((day, model))
        if row is None:
            row = rows[(day, model)] = {
                "session_id": session_id,
                "day": day,
                "model": model,
                **dict.fromkeys(ROLLUP_COUNTS, 0),
                "reported_cost": 0.0,
            }
        row["calls"] += 1
        for kind in TOKEN_KINDS:
            row[kind] += getattr(record, kind)
        if record.reported_cost is not None:
            row["reported_cost"] += record.reported_cost
    if rows:
        conn.execute(upsert, list(rows.values()))


def close_open_day(conn: Connection, dialect: BackendDialect, session_id: str) -> None:
    """Move the count the session row keeps for its open day into the rollup, so that
    the rollup alone holds every day of the session (before a write takes some out)."""
    row = conn.execute(
        select(S.rollup_day, S.rollup_messages).where(S.id == session_id, S.rollup_messages > 0)
    ).first()  # the caller's transaction holds the session's lock
    if row is None:
        return
    conn.execute(
        usage_upsert(dialect),
        [
            {
                "session_id": session_id,
                "day": row.rollup_day,
                "model": ROLLUP_NO_MODEL,
                **dict.fromkeys(ROLLUP_COUNTS, 0),
                "messages": row.rollup_messages,
                "reported_cost": 0.0,
            }
        ],
    )
    conn.execute(update(sessions_table).where(S.id == session_id).values(rollup_messages=0))


def take_messages(
    conn: Connection, dialect: BackendDialect, session_id: str, days: Mapping[str, int]
) -> None:
    """Take live messages out of the session's rollup: ``days`` counts them per UTC day
    (messages now superseded; an integer count, exact)."""
    if days:
        close_open_day(conn, dialect, session_id)
        conn.execute(
            update(rollup_table)
            .where(
                R.session_id == session_id,
                R.day == bindparam("d"),
                R.model == ROLLUP_NO_MODEL,
            )
            .values(messages=R.messages - bindparam("n")),
            [{"d": day, "n": count} for day, count in days.items()],
        )


def recount(conn: Connection, dialect: BackendDialect, session_ids: Sequence[str] | None) -> None:
    """Count the sessions' rollup again from their messages and usage records (after a
    write that took some away or marked them superseded); ``None``: every session's
    (what migration 0017's backfill does)."""
    if session_ids is not None and not session_ids:
        return
    ids = None if session_ids is None else sorted(set(session_ids))
    gone = delete(rollup_table)
    conn.execute(gone if ids is None else gone.where(R.session_id.in_(ids)))
    emptied = update(sessions_table).where(S.rollup_messages != 0).values(rollup_messages=0)
    conn.execute(emptied if ids is None else emptied.where(S.id.in_(ids)))
    conn.execute(
        insert(rollup_table).from_select(list(ROLLUP_COLUMNS), counted(dialect, session_ids=ids))
    )


def held() -> Select[Any]:
    """The rollup as its readers count it: its rows, with each session's open-day count
    (``sessions.rollup_messages``) added to the messages of its day."""
    still_open = select(
        S.id.label("session_id"),
        S.rollup_day.label("day"),
        literal(ROLLUP_NO_MODEL).label("model"),
        S.rollup_messages.label("messages"),
        *(literal(0).label(name) for name in ROLLUP_COUNTS[1:]),
        literal(0.0).label("reported_cost"),
    ).where(S.rollup_messages > 0)
    both = union_all(select(*(R[name] for name in ROLLUP_COLUMNS)), still_open).subquery()
    return select(
        both.c.session_id,
        both.c.day,
        both.c.model,
        *(func.sum(both.c[name]).label(name) for name in ROLLUP_SUMS),
    ).group_by(both.c.session_id, both.c.day, both.c.model)


def counted(dialect: BackendDialect, *, session_ids: Sequence[str] | None) -> Select[Any]:
    """The rollup's rows as the messages and usage records give them (of ``session_ids``,
    or of every session)."""
    message_day = dialect.utc_day(M.timestamp)
    messages = select(
        M.session_id.label("session_id"),
        message_day.label("day"),
        literal(ROLLUP_NO_MODEL).label("model"),
        func.count().label("messages"),
        *(literal(0).label(name) for name in ROLLUP_COUNTS[1:]),
        literal(0.0).label("reported_cost"),
    ).where(M.superseded.is_(None))
    usage_day = dialect.utc_day(U.occurred_at)
    model = func.coalesce(U.model, ROLLUP_NO_MODEL)
    calls = select(
        U.session_id,
        usage_day,
        model,
        literal(0),
        func.count(),
        *(func.sum(U[kind]) for kind in TOKEN_KINDS),
        func.coalesce(func.sum(U.reported_cost), 0.0),
    )
    if session_ids is not None:
        messages = messages.where(M.session_id.in_(session_ids))
        calls = calls.where(U.session_id.in_(session_ids))
    both = union_all(
        messages.group_by(M.session_id, message_day),
        calls.group_by(U.session_id, usage_day, model),
    ).subquery()
    return select(
        both.c.session_id,
        both.c.day,
        both.c.model,
        *(func.sum(both.c[name]) for name in ROLLUP_SUMS),
    ).group_by(both.c.session_id, both.c.day, both.c.model)
