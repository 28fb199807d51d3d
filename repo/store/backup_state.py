"""ADK state in backups: read as of the snapshot, restored under the tombstones.

A backup (:mod:`sessionrepo.ops.backup`) holds, beside each session's messages and usage
records, its ADK session (``adk_sessions``: the ADK names, the session-scoped state,
``update_time`` and ``applied_seq``), and once for the store the ADK app and user states
(``adk_app_states``, ``adk_user_states``). Here is what reads them on the snapshot's
connection and what puts them back:

- a row the target lacks is inserted as the backup has it (``ON CONFLICT DO NOTHING``:
  a restore run twice inserts nothing the second time);
- a row the target holds is kept as it is: ``present`` when equal to the backup's,
  ``conflicting`` when not (the target wrote since: its state is the newer);
- a row an erasure removed from the target is not restored (``erased``): an ADK session
  whose session was erased after the row's ``update_time`` (the state is that of events
  made before the erasure), a user state whose own tombstone
  (:func:`~sessionrepo.store.tombstones.record_user_state`) is newer than its
  ``update_time``. App state is shared by every user of an app: no erasure removes it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from sqlalchemy import Connection, Table, select, tuple_

from sessionrepo.models.adk import adk_app_states_table, adk_sessions_table, adk_user_states_table
from sessionrepo.store import tombstones as _tombstones
from sessionrepo.store.database import Database

Outcome = Literal["inserted", "present", "conflicting", "erased"]
StateKind = Literal["adk_app_state", "adk_user_state"]

AS = adk_sessions_table.c


@dataclass(frozen=True)
class _Scope:
    table: Table
    #: The primary key: the conflict target of the restore's insert, and the order read.
    key: tuple[str, ...]


#: What a backup holds of each ADK table, by its record type.
ADK_SESSION: Final = _Scope(adk_sessions_table, ("session_id",))
SCOPES: Final[dict[StateKind, _Scope]] = {
    "adk_app_state": _Scope(adk_app_states_table, ("app_name",)),
    "adk_user_state": _Scope(adk_user_states_table, ("app_name", "user_id")),
}


def read_adk_session(connection: Connection, session_id: str) -> dict[str, Any] | None:
    """The session's ADK row without its ``session_id`` (``None``: not an ADK session)."""
    row = connection.execute(select(adk_sessions_table).where(AS.session_id == session_id)).first()
    if row is None:
        return None
    return {k: v for k, v in row._mapping.items() if k != "session_id"}


def read_states(
    connection: Connection, kind: StateKind, *, after: tuple[str, ...] | None, limit: int
) -> list[dict[str, Any]]:
    """A page of the app or user states, by key, after ``after`` (a key)."""
    scope = SCOPES[kind]
    key = tuple_(*(scope.table.c[name] for name in scope.key))
    query = select(scope.table).order_by(*(scope.table.c[name] for name in scope.key))
    if after is not None:
        query = query.where(key > tuple_(*after))
    return [dict(row._mapping) for row in connection.execute(query.limit(limit))]


def restore_adk_session(database: Database, session_id: str, row: Mapping[str, Any]) -> Outcome:
    """Put back a restored session's ADK row (see the module docstring); the session
    must be there (restored first)."""
    values = dict(row) | {"session_id": session_id}

    def work(conn: Connection) -> Outcome:
        key = _tombstones.secret(conn, database)
        erased = _tombstones.erased_at(conn, _tombstones.session_hash(key, session_id))
        if erased is not None and float(values["update_time"]) <= erased.timestamp():
            return "erased"
        return _insert_or_compare(conn, database, ADK_SESSION, values)

    return database.write(work)


def restore_state(database: Database, kind: StateKind, row: Mapping[str, Any]) -> Outcome:
    """Put back an app or user state (see the module docstring)."""
    scope = SCOPES[kind]
    values = dict(row)

    def work(conn: Connection) -> Outcome:
        if kind == "adk_user_state":
            key = _tombstones.secret(conn, database)
            hashed = _tombstones.user_state_hash(key, values["app_name"], values["user_id"])
            erased = _tombstones.erased_at(conn, hashed)
            if erased is not None and float(values["update_time"]) <= erased.timestamp():
                return "erased"
        return _insert_or_compare(conn, database, scope, values)

    return database.write(work)


def _insert_or_compare(
    conn: Connection, database: Database, scope: _Scope, values: dict[str, Any]
) -> Outcome:
    table = scope.table
    insert = database.dialect.insert_ignoring(table, list(scope.key))
    first = table.c[scope.key[0]]
    if conn.execute(insert.values(**values).returning(first)).first() is not None:
        return "inserted"
    held = conn.execute(
        select(table).where(*(table.c[name] == values[name] for name in scope.key))
    ).one()
    return "present" if dict(held._mapping) == values else "conflicting"
