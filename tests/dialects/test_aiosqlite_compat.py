"""sessionrepo.dialects.aiosqlite_compat: the installed aiosqlite has the privates the shim
uses, in the version range pyproject.toml allows, and the shim runs a function on the
connection's own thread with its sqlite3 connection."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import tomllib
import weakref
from importlib.metadata import version
from pathlib import Path

import aiosqlite
import pytest
from packaging.requirements import Requirement

from sessionrepo.dialects.aiosqlite_compat import REQUIRED, missing, on_connection_thread

ROOT = Path(__file__).resolve().parents[2]


def test_the_installed_aiosqlite_has_what_the_shim_uses() -> None:
    assert missing(aiosqlite.Connection) == []


def test_the_bound_holds_the_installed_version() -> None:
    """The range in pyproject is the one the shim was checked on: an aiosqlite outside it
    (pip would refuse it; a hand install would not) fails here first."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    [bound] = [
        Requirement(line)
        for line in project["dependencies"]
        if Requirement(line).name == "aiosqlite"
    ]
    assert bound.specifier.contains(version("aiosqlite")), (bound, version("aiosqlite"))
    assert any(spec.operator == "<" for spec in bound.specifier), bound  # an upper bound


def test_missing_names_what_a_connection_class_lacks() -> None:
    class WithoutExecute:
        _conn = None

    assert missing(WithoutExecute) == ["_execute"]
    assert missing(object) == list(REQUIRED)


def test_a_function_runs_on_the_connection_thread_with_its_sqlite3_connection(
    tmp_path: Path,
) -> None:
    def probe(db: sqlite3.Connection, value: int, *, scale: int) -> tuple[int, int, int]:
        (found,) = db.execute("SELECT ? * ?", (value, scale)).fetchone()
        return found, threading.get_ident(), id(db)

    def fails(db: sqlite3.Connection) -> None:
        db.execute("SELECT * FROM no_such_table")

    async def main() -> None:
        async with aiosqlite.connect(tmp_path / "x.db") as connection:
            found, thread, db = await on_connection_thread(connection, probe, 6, scale=7)
            assert found == 42
            assert thread != threading.get_ident()  # not on the event loop's thread
            assert db == id(connection._conn)  # the sqlite3 connection aiosqlite holds
            with pytest.raises(sqlite3.OperationalError, match="no_such_table"):
                await on_connection_thread(connection, fails)

    asyncio.run(main())


class _Value:
    """An argument or a result the test can watch die."""


def test_the_connection_thread_keeps_neither_the_arguments_nor_the_result(
    tmp_path: Path,
) -> None:
    """aiosqlite's thread holds its last call and result until its next call, and frees
    them there, before running it; the shim leaves it nothing to hold."""

    def echo(db: sqlite3.Connection, value: _Value) -> _Value:
        return _Value()

    async def main() -> None:
        async with aiosqlite.connect(tmp_path / "x.db") as connection:
            argument = _Value()
            result = await on_connection_thread(connection, echo, argument)
            watched = weakref.ref(argument), weakref.ref(result)
            del argument, result
            assert [ref() for ref in watched] == [None, None]  # no other call in between

    asyncio.run(main())
