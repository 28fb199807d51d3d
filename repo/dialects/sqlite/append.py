"""SQLite's append: the locked path's statements on SQLAlchemy's connection, and the
whole append in one ``BEGIN IMMEDIATE`` transaction on the sqlite3 connection itself.

The append runs its own SQL through the driver: compiling and binding through SQLAlchemy
cost more than SQLite itself (the values are stored exactly as SQLAlchemy's column types
would store them: see :func:`_sqlite_time`).
"""

from __future__ import annotations

import sqlite3
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from functools import partial
from operator import itemgetter
from typing import Any, Final, Protocol

from sqlalchemy import Connection, Uuid
from sqlalchemy.dialects import sqlite
from sqlalchemy.util import await_

from sessionrepo.dialects.aiosqlite_compat import on_connection_thread
from sessionrepo.dialects.base import (
    LOOKUP_CHUNK,
    NEW_SESSION_COLUMNS,
    AppendRole,
    DirectAppend,
    DirectLoad,
    DirectResult,
    lock_bypassed,
)
from sessionrepo.errors import RepoError
from sessionrepo.models.outbox_protocol import parked_rows_sql
from sessionrepo.models.tables import (
    ACTIVITY_GRANULARITY,
    MESSAGE_COLUMNS,
    MESSAGE_PLACE,
    UTCDateTime,
    messages_table,
    sessions_table,
)
from sessionrepo.models.usage import ROLLUP_MESSAGES_ZEROS, ROLLUP_NO_MODEL, rollup_messages


class SQLiteAppend(AppendRole):
    """The append's statements, on SQLAlchemy's connection or the sqlite3 one."""

    # The append path runs its own SQL through the driver: compiling and binding through
    # SQLAlchemy cost more than SQLite itself (the values are stored exactly as
    # SQLAlchemy's column types would store them: see _sqlite_time).

    def lock_session(self, connection: Connection, session_id: str) -> int | None:
        # BEGIN IMMEDIATE took the database's write lock: reading is enough.
        row = connection.exec_driver_sql(_SQLITE_NEXT_SEQ, (session_id,)).first()
        return None if row is None else int(row[0])

    def insert_new_messages(
        self,
        connection: Connection,
        session_id: str,
        next_seq: int,
        rows: Sequence[dict[str, Any]],
        now: datetime,
    ) -> dict[uuid.UUID, bytes]:
        stored, fresh = _sqlite_stored(connection.exec_driver_sql, session_id, rows)
        if not fresh:
            return stored
        execute = partial(connection.exec_driver_sql, execution_options={"preserve_rowcount": True})
        values, days = _sqlite_values(session_id, next_seq, fresh)
        _sqlite_insert(execute, session_id, values)
        row = connection.exec_driver_sql(_SQLITE_NEXT_SEQ, (session_id,)).one()
        _sqlite_count(execute, session_id, fresh, row, days=days, now=now)
        return stored

    driver_error = sqlite3.Error

    def append_direct(self, driver: Any, append: DirectAppend) -> DirectResult | None:
        # The statements on the sqlite3 connection itself: SQLAlchemy's compiling,
        # binding and result handling cost more than SQLite's work. On aiosqlite, the
        # whole append runs in its thread as one call (one hop, not one per statement).
        if isinstance(driver, sqlite3.Connection):
            return _sqlite_append(driver, append)
        result: DirectResult = await_(on_connection_thread(driver, _sqlite_append, append))
        return result

    def message_at(self, driver: Any, session_id: str, seq: int, key: uuid.UUID) -> bool:
        params = (session_id, seq, _sqlite_key(key))
        if isinstance(driver, sqlite3.Connection):
            return driver.execute(_SQLITE_AT, params).fetchone() is not None
        found: list[Any] = await_(on_connection_thread(driver, _fetch_all, _SQLITE_AT, params))
        return bool(found)

    def load_direct(self, driver: Any, load: DirectLoad) -> list[Sequence[Any]] | None:
        sql, params = load.statement(lambda name: f":{name}")
        if isinstance(driver, sqlite3.Connection):
            return driver.execute(sql, params).fetchall()
        rows: list[Sequence[Any]] = await_(on_connection_thread(driver, _fetch_all, sql, params))
        return rows

    def select_direct(
        self, driver: Any, sql: str, params: Mapping[str, Any]
    ) -> list[Sequence[Any]] | None:
        bound = {
            name: _sqlite_time(value) if isinstance(value, datetime) else value
            for name, value in params.items()
        }
        if isinstance(driver, sqlite3.Connection):
            return driver.execute(sql, bound).fetchall()
        rows: list[Sequence[Any]] = await_(on_connection_thread(driver, _fetch_all, sql, bound))
        return rows


_SQLITE_NEXT_SEQ = "SELECT next_seq, last_active_at, rollup_day FROM sessions WHERE id = ?"
_SQLITE_LOOKUP = (
    "SELECT client_msg_uuid, content_hash FROM messages "
    "WHERE session_id = ? AND client_msg_uuid IN "
)
#: A message's stored columns (its place first), quoted: ``timestamp`` is a keyword.
_INSERT_COLUMNS = ", ".join(f'"{name}"' for name in (*MESSAGE_PLACE, *MESSAGE_COLUMNS))
_SQLITE_INSERT = (
    f"INSERT INTO messages ({_INSERT_COLUMNS}) "
    f"VALUES ({', '.join('?' * (len(MESSAGE_PLACE) + len(MESSAGE_COLUMNS)))}) "
    "ON CONFLICT (session_id, client_msg_uuid) DO NOTHING"
)
#: An encoded row's values in :data:`MESSAGE_COLUMNS` order.
_pick_columns = itemgetter(*MESSAGE_COLUMNS)
#: Where the stored time is in an insert's values (after the place).
_TIMESTAMP: Final = len(MESSAGE_PLACE) + MESSAGE_COLUMNS.index("timestamp")
#: New messages of a UTC day other than the session's open day (``rollup_day``) added
#: to the rollup.
_ROLLUP = rollup_messages()
_SQLITE_ROLLUP = (
    f"{_ROLLUP[0]}VALUES (?, ?, '{ROLLUP_NO_MODEL}', ?, {ROLLUP_MESSAGES_ZEROS}){_ROLLUP[1]}"
)
#: The open day's count moved to the rollup, when a later day becomes the open one.
_SQLITE_CLOSE_DAY = (
    f"{_ROLLUP[0]}SELECT id, rollup_day, '{ROLLUP_NO_MODEL}', rollup_messages, "
    f"{ROLLUP_MESSAGES_ZEROS} FROM sessions "
    f"WHERE id = ? AND rollup_day IS NOT NULL AND rollup_messages > 0 {_ROLLUP[1]}"
)


_SQLITE_COUNTS = (
    "UPDATE sessions SET next_seq = next_seq + ?, message_count = message_count + ?, "
    "tool_call_count = tool_call_count + ?, "
)
#: The activity moved past the granularity: ``last_active_at`` rewritten, with the
#: listing's four indexes.
_SQLITE_MOVED = "last_active_at = ?, last_active_lag_us = 0, "
#: The activity within the granularity: the lag alone.
_SQLITE_LAG = "last_active_lag_us = ?, "
#: The open day's count: added to on the same day (no indexed column is set, so with the
#: lag SQLite touches no index page: it skips an index none of whose columns is
#: assigned), started anew on a later day (``rollup_day`` and its index move).
_SQLITE_SAME_DAY = "rollup_messages = rollup_messages + ? WHERE id = ?"
_SQLITE_NEW_DAY = "rollup_day = ?, rollup_messages = ? WHERE id = ?"
#: The counters' statement by (activity moved, day moved).
_SQLITE_COUNTERS: Final = {
    (moved, new_day): _SQLITE_COUNTS
    + (_SQLITE_MOVED if moved else _SQLITE_LAG)
    + (_SQLITE_NEW_DAY if new_day else _SQLITE_SAME_DAY)
    for moved in (False, True)
    for new_day in (False, True)
}
_GRANULARITY_US: Final = ACTIVITY_GRANULARITY // timedelta(microseconds=1)


def _sqlite_activity(stored: str, now: datetime) -> tuple[bool, str | int]:
    """For an append at ``now`` to a session whose ``last_active_at`` is ``stored`` (as
    SQLite holds it): whether ``last_active_at`` moves, and the activity parameter: the
    lag in microseconds when ``now`` is within the granularity after ``stored``, else
    ``now`` itself (a clock behind the stored time also rewrites it, as before)."""
    moment = _sqlite_time(now)
    held = datetime.fromisoformat(stored)
    if held.tzinfo is not None:  # written with an offset by something else than sessionrepo
        held = held.astimezone(UTC).replace(tzinfo=None)
    lag = (datetime.fromisoformat(moment) - held) // timedelta(microseconds=1)
    if 0 <= lag <= _GRANULARITY_US:
        return False, lag
    return True, moment


def _open_day(held: str | None, days: Mapping[str, int]) -> tuple[str | None, dict[str, int]]:
    """The session's open day (``rollup_day``, whose live messages the session row counts)
    after an append of new messages on ``days`` (a count per UTC day) to a session whose
    open day is ``held``: the newest of them all. Returns it and the days whose new
    messages the rollup counts instead (older ones: an import's, a clock's behind)."""
    newest = max(days, default=None)
    day = held if newest is None or (held is not None and held >= newest) else newest
    return day, {other: count for other, count in days.items() if other != day}


def _sqlite_count(
    execute: _Execute,
    session_id: str,
    fresh: Sequence[dict[str, Any]],
    session: Sequence[Any],
    *,
    days: Mapping[str, int],
    now: datetime,
) -> None:
    """Move the counters of a session that exists (``session``: its ``next_seq``,
    ``last_active_at`` and ``rollup_day``) for the ``fresh`` rows just inserted, whose
    UTC days are ``days``: the open day's count on the row, other days in the rollup."""
    held = session[2]
    day, elsewhere = _open_day(held, days)
    new_day = day != held
    if new_day and held is not None:
        execute(_SQLITE_CLOSE_DAY, (session_id,))
    moved, activity = _sqlite_activity(session[1], now)
    tool_calls = sum(row["tool_call_total"] for row in fresh)
    counted = days.get(day, 0) if day is not None else 0
    parameters: tuple[Any, ...] = (len(fresh), len(fresh), tool_calls, activity)
    parameters += (day, counted, session_id) if new_day else (counted, session_id)
    execute(_SQLITE_COUNTERS[(moved, new_day)], parameters)
    _sqlite_roll(execute, session_id, elsewhere)


def _sqlite_roll(execute: _Execute, session_id: str, days: Mapping[str, int]) -> None:
    """Add new messages of days other than the open one to the rollup (an import of
    older messages; rare)."""
    for day, count in days.items():
        execute(_SQLITE_ROLLUP, (session_id, day, count))


class _Rows(Protocol):
    """What a statement returns on either connection: a ``sqlite3.Cursor`` or a
    SQLAlchemy ``CursorResult``."""

    @property
    def rowcount(self) -> int: ...

    def __iter__(self) -> Iterator[Sequence[Any]]: ...


#: Runs one statement (``sqlite3.Connection.execute``, ``Connection.exec_driver_sql``).
_Execute = Callable[[str, Sequence[Any]], _Rows]
#: Runs one statement for each parameter tuple (``sqlite3.Connection.executemany``, or
#: ``exec_driver_sql`` with a list of tuples).
_ExecuteMany = Callable[[str, list[tuple[Any, ...]]], _Rows]


def _sqlite_stored(
    execute: _Execute, session_id: str, rows: Sequence[dict[str, Any]]
) -> tuple[dict[uuid.UUID, bytes], list[dict[str, Any]]]:
    """The batch's keys the session stores (with their stored content hash), and the
    rows whose key it does not store, in batch order. Both append paths look up through
    this, on the sqlite3 connection or on SQLAlchemy's, under the write lock."""
    # Keys are stored as SQLAlchemy's Uuid stores them without a native type.
    by_hex = {row["client_msg_uuid"].hex: row["client_msg_uuid"] for row in rows}
    hexes = list(by_hex)
    stored: dict[uuid.UUID, bytes] = {}
    for start in range(0, len(hexes), LOOKUP_CHUNK):
        chunk = hexes[start : start + LOOKUP_CHUNK]
        found = execute(f"{_SQLITE_LOOKUP}({', '.join('?' * len(chunk))})", (session_id, *chunk))
        stored.update((by_hex[key], bytes(digest)) for key, digest in found)
    return stored, [row for row in rows if row["client_msg_uuid"] not in stored]


def _sqlite_values(
    session_id: str, next_seq: int, fresh: Sequence[dict[str, Any]]
) -> tuple[list[tuple[Any, ...]], Counter[str]]:
    """The insert's values of ``fresh`` numbered from ``next_seq``, and how many of them
    each UTC day has."""
    values = []
    for index, row in enumerate(fresh):
        value = list(_pick_columns(row))
        for position, convert in _CONVERTED:
            value[position] = convert(value[position])
        values.append((session_id, next_seq + index, *value))
    return values, Counter(value[_TIMESTAMP][:10] for value in values)  # UTC text: its day


def _sqlite_insert(
    executemany: _ExecuteMany, session_id: str, values: list[tuple[Any, ...]]
) -> None:
    """Insert the rows in one ``executemany``. Its rowcount must be every row: a key the
    lookup did not see means a writer bypassed the lock."""
    inserted = executemany(_SQLITE_INSERT, values).rowcount
    if inserted != len(values):
        raise lock_bypassed(session_id, len(values) - inserted)


def _sqlite_time(value: datetime) -> str:
    """An aware time as ``UTCDateTime`` stores it on SQLite: the UTC wall time as
    SQLAlchemy's SQLite text ("2026-11-29 12:00:00.000000"), which sorts as time does."""
    if value.tzinfo is not UTC:
        if value.tzinfo is None or value.utcoffset() is None:
            raise RepoError("naive datetime reached the database layer")
        value = value.astimezone(UTC)
    return value.isoformat(" ", "microseconds")[:26]


def _sqlite_key(key: uuid.UUID) -> str:
    """A key as SQLAlchemy's ``Uuid`` stores it without a native type: 32 hex digits."""
    return key.hex


def _converter(column_type: object) -> Callable[[Any], Any] | None:
    if isinstance(column_type, Uuid):
        return _sqlite_key
    if isinstance(column_type, UTCDateTime):
        return _sqlite_time
    return None


#: ``(position, convert)`` of the encoded row's values that the driver takes in another
#: form than the codec gives (the key, times), found by the column's type.
_CONVERTED: Final = tuple(
    (position, convert)
    for position, name in enumerate(MESSAGE_COLUMNS)
    if (convert := _converter(messages_table.c[name].type)) is not None
)


#: A new session's columns (:data:`NEW_SESSION_COLUMNS`) converted as SQLAlchemy would
#: for SQLite (JSON as text, times as SQLAlchemy writes them).
_SESSION_BINDS: Final = tuple(
    sessions_table.c[name].type.bind_processor(sqlite.dialect()) for name in NEW_SESSION_COLUMNS
)
_SQLITE_CREATE = (
    "INSERT INTO sessions ("
    + ", ".join(f'"{name}"' for name in NEW_SESSION_COLUMNS)
    + ", message_count, tool_call_count, next_seq, last_active_at, rollup_day, "
    + "rollup_messages) VALUES ("
    + ", ".join("?" * (len(NEW_SESSION_COLUMNS) + 6))
    + ")"
)
_SQLITE_PARKED = parked_rows_sql("?")
_SQLITE_AT = "SELECT 1 FROM messages WHERE session_id = ? AND seq = ? AND client_msg_uuid = ?"
_SQLITE_BACKLOG = "INSERT INTO search_backlog (session_id, first_seq, count) VALUES (?, ?, ?)"
#: The erasure probe and the session's row in one statement (always one row: whether
#: the session's tombstone is there, then ``next_seq``, ``last_active_at`` and
#: ``rollup_day``, NULL for a session that does not exist).
_SQLITE_PROBED_SESSION = (
    "SELECT erased.session_hash IS NOT NULL, sessions.next_seq, sessions.last_active_at, "
    "sessions.rollup_day "
    "FROM (SELECT ? AS hash, ? AS id) AS asked "
    "LEFT JOIN erased_sessions AS erased ON erased.session_hash = asked.hash "
    "LEFT JOIN sessions ON sessions.id = asked.id"
)


def _sqlite_append(db: sqlite3.Connection, append: DirectAppend) -> DirectResult:
    """An append in one ``BEGIN IMMEDIATE`` transaction on the sqlite3 connection: the
    write lock serialises appenders, so what the lookup finds is what the insert would
    collide with."""
    sid = append.session_id
    db.execute("BEGIN IMMEDIATE")
    try:
        result = _sqlite_append_locked(db, append, sid)
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise
    if result.first_seq is None:
        db.execute("ROLLBACK")  # nothing written: no commit to wait for
    else:
        db.execute("COMMIT")
    return result


def _sqlite_append_locked(db: sqlite3.Connection, append: DirectAppend, sid: str) -> DirectResult:
    if append.verify is not None:
        seq, key = append.verify
        if db.execute(_SQLITE_AT, (sid, seq, _sqlite_key(key))).fetchone() is None:
            return DirectResult(stored={}, first_seq=None, lost=True)
    # Under the write lock: an erasure (its tombstone and its deletions in one
    # transaction) is wholly before this append or wholly after it.
    probe = append.erased_probe
    session: Sequence[Any] | None
    if probe is None:
        session = db.execute(_SQLITE_NEXT_SEQ, (sid,)).fetchone()
    else:
        erased, *found = db.execute(_SQLITE_PROBED_SESSION, (probe, sid)).fetchone()
        if erased:
            return DirectResult(stored={}, first_seq=None, erased=True)
        session = None if found[0] is None else found
    if append.behind_outbox and db.execute(_SQLITE_PARKED, (sid,)).fetchone() is not None:
        return DirectResult(stored={}, first_seq=None, queued=True)
    rows = append.rows
    if session is None:
        stored: dict[uuid.UUID, bytes] = {}
        fresh = list(rows)  # a session that does not exist yet stores none of them
    else:
        stored, fresh = _sqlite_stored(db.execute, sid, rows)
    refused = append.refuse_conflicts and any(
        stored.get(row["client_msg_uuid"], row["content_hash"]) != row["content_hash"]
        for row in rows
    )
    if not fresh or refused:
        return DirectResult(stored=stored, first_seq=None)
    next_seq = 1 if session is None else int(session[0])
    values, days = _sqlite_values(sid, next_seq, fresh)
    if session is None:
        columns = [
            value if bind is None else bind(value)
            for name, bind in zip(NEW_SESSION_COLUMNS, _SESSION_BINDS, strict=True)
            for value in (append.new_session.get(name),)
        ]
        tool_calls = sum(row["tool_call_total"] for row in fresh)
        day, elsewhere = _open_day(None, days)
        created = (len(fresh), tool_calls, 1 + len(fresh), _sqlite_time(append.now))
        db.execute(_SQLITE_CREATE, (*columns, *created, day, days[day] if day else 0))
        _sqlite_roll(db.execute, sid, elsewhere)
    else:
        _sqlite_count(db.execute, sid, fresh, session, days=days, now=append.now)
    _sqlite_insert(db.executemany, sid, values)
    if append.enqueue:
        db.execute(_SQLITE_BACKLOG, (sid, next_seq, len(fresh)))
    return DirectResult(stored=stored, first_seq=next_seq)


def _fetch_all(db: sqlite3.Connection, sql: str, params: Any) -> list[Any]:
    return db.execute(sql, params).fetchall()
