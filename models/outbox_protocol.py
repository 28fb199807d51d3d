"""The outbox's protocol, defined once: the states a parked row can be in, and the
question every write path asks before it stores a session's messages: *has this session
rows in the outbox that a new write must queue behind?* (the per-session FIFO).

The outbox (``sessionrepo.outbox``), the store's append and the dialects' hand-written
append statements all ask it through the names here, in SQLAlchemy Core
(:func:`holds_fifo`) or as SQL text (:func:`parked_rows_sql`). So a new state cannot be
added without saying whether it holds its session's FIFO (the member will not build
without it), and every place that asks then answers for it.

It lives in the models, below the store and the dialects that use it, and imports no
table: :mod:`sessionrepo.models.tables` may build its ``CHECK`` constraint from it.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

from sqlalchemy import ColumnElement


class OutboxState(StrEnum):
    """The ``state`` of a ``pending_outbox`` row, and whether it holds the session's FIFO.

    A row in a state that holds the FIFO (:attr:`holds_fifo`) is waiting to be replayed:
    while its session has one, a new write of that session is parked behind it, so that
    replay can never reorder the transcript. A row that does not hold it is kept for a
    person to look at and never holds its session up.
    """

    holds_fifo: bool

    def __new__(cls, value: str, holds_fifo: bool) -> OutboxState:
        member = str.__new__(cls, value)
        member._value_ = value
        member.holds_fifo = holds_fifo
        return member

    #: Waiting for the primary; replayed, oldest first, by the drainer.
    PENDING = "pending", True
    #: Set aside after the primary rejected it ``max_attempts`` times: kept, visible,
    #: retryable (``retry_dead`` makes it pending again), never replayed by itself.
    DEAD = "dead", False


#: The states whose rows a new write of their session queues behind.
FIFO_STATES: Final = tuple(state for state in OutboxState if state.holds_fifo)

#: The outbox's table, as the dialects' SQL text names it.
OUTBOX_TABLE: Final = "pending_outbox"


def _in_sql(states: tuple[OutboxState, ...]) -> str:
    # One state: ``=``, the plan an equality gets on both backends (as ``IN`` of one does).
    values = ", ".join(f"'{state.value}'" for state in states)
    return f"state = {values}" if len(states) == 1 else f"state IN ({values})"


#: The condition, as SQL text over the outbox's ``state`` column: the row holds its
#: session's FIFO.
FIFO_STATE_SQL: Final = _in_sql(FIFO_STATES)

#: The table's ``CHECK`` constraint: the states a row may be in.
STATE_CHECK_SQL: Final = "state IN (" + ", ".join(f"'{s.value}'" for s in OutboxState) + ")"


def holds_fifo(state: ColumnElement[str]) -> ColumnElement[bool]:
    """The condition in SQLAlchemy Core, over the outbox's ``state`` column: the row
    holds its session's FIFO (``outbox_table.c.state``)."""
    if len(FIFO_STATES) == 1:
        return state == FIFO_STATES[0].value
    return state.in_([s.value for s in FIFO_STATES])


def parked_rows_sql(session_parameter: str, *, also: str | None = None) -> str:
    """The question as SQL text, for a driver's own statements: a row (``1``) when the
    session named by the bind parameter ``session_parameter`` (``?`` for sqlite3,
    ``%(sid)s`` for psycopg) has a row that holds its FIFO. ``also``: a further
    condition that must hold (SQL text; e.g. a parameter that turns the question off)."""
    where = f"{also} AND " if also else ""
    return (
        f"SELECT 1 FROM {OUTBOX_TABLE} "
        f"WHERE {where}session_id = {session_parameter} AND {FIFO_STATE_SQL} LIMIT 1"
    )


__all__ = [
    "FIFO_STATES",
    "FIFO_STATE_SQL",
    "OUTBOX_TABLE",
    "STATE_CHECK_SQL",
    "OutboxState",
    "holds_fifo",
    "parked_rows_sql",
]
