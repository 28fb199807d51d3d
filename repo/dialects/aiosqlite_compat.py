"""aiosqlite's private surface, in one place.

The async SQLite path runs a whole append (or load) as one call on the aiosqlite
connection's own thread, where its ``sqlite3`` connection lives: one hop to that thread,
not one per statement. aiosqlite has no public way to do that, so this module uses its
private ``Connection._execute`` (queue a function for the connection's thread) and
``Connection._conn`` (the ``sqlite3`` connection). Nothing else in sessionrepo touches an
aiosqlite private.

pyproject.toml bounds aiosqlite to the versions checked to have both (0.21 and 0.22), and
``tests/test_aiosqlite_compat.py`` fails when the installed one lacks them: raise the
bound only after that test passes on the new version.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable
from typing import Any, Concatenate, Final, ParamSpec, TypeVar

T = TypeVar("T")
P = ParamSpec("P")

#: The aiosqlite ``Connection`` attributes this module relies on.
REQUIRED: Final = ("_execute", "_conn")


def missing(connection_class: type[Any]) -> list[str]:
    """The attributes of :data:`REQUIRED` that ``connection_class`` (aiosqlite's
    ``Connection``) lacks; empty when this module works with it."""
    return [name for name in REQUIRED if not hasattr(connection_class, name)]


def on_connection_thread(
    connection: Any,
    fn: Callable[Concatenate[sqlite3.Connection, P], T],
    /,
    *args: P.args,
    **kwargs: P.kwargs,
) -> Awaitable[T]:
    """``fn(sqlite3_connection, *args, **kwargs)`` queued on the thread of the aiosqlite
    ``connection`` (a driver connection of SQLAlchemy's aiosqlite dialect), as one call.

    ``fn`` runs after whatever the connection was already running, and nothing else runs
    on that connection meanwhile. Awaiting the result gives ``fn``'s return value or
    raises its exception.
    """
    awaitable: Awaitable[T] = connection._execute(fn, connection._conn, *args, **kwargs)
    return awaitable
