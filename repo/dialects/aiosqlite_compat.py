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
    return _handed_back(connection, fn, args, kwargs)


async def _handed_back(
    connection: Any, fn: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> T:
    # aiosqlite's thread keeps its last call and that call's result in its locals until
    # the next call arrives, and then frees them there, holding the GIL, before it runs
    # that call: the 10,000 rows of a load cost the connection's next call 2 ms. So the
    # thread gets a call that drops the arguments and leaves the result in a box that
    # the caller empties; nothing of either is left for it to keep.
    pending: list[Callable[[sqlite3.Connection], T]] = [lambda driver: fn(driver, *args, **kwargs)]
    result: list[T] = []

    def run(driver: sqlite3.Connection) -> None:
        result.append(pending.pop()(driver))

    await connection._execute(run, connection._conn)
    return result.pop()
