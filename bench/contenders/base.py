"""What every contender offers the harness, and what it answers.

Each contender runs in its own worker process and does the timing itself, around exactly
the calls a gateway would make (converting its dicts included). Everything else (creating
tables, creating the sessions, seeding data for the load and list steps) is untimed.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, ClassVar, TypeVar

from bench.databases import Target

Message = dict[str, Any]
#: One call: a session id and the messages passed in that call.
Call = tuple[str, list[Message]]

T = TypeVar("T")


class Unsupported(Exception):
    """The contender has no way to do this step (the table says so)."""


def timed_calls(
    calls: Sequence[Call], cap: float, run: Callable[[str, list[Message]], int]
) -> dict[str, Any]:
    """Run ``calls`` through ``run`` (which returns how many messages raised), stopping
    early once ``cap`` seconds have passed; the rate is over what was done."""
    done_calls = done_messages = errors = 0
    start = time.perf_counter()
    for session_id, messages in calls:
        errors += run(session_id, messages)
        done_calls += 1
        done_messages += len(messages)
        if time.perf_counter() - start > cap:
            break
    seconds = time.perf_counter() - start
    return {
        "calls": done_calls,
        "messages": done_messages,
        "errors": errors,
        "seconds": seconds,
        "capped": done_calls < len(calls),
    }


async def atimed_calls(
    calls: Sequence[Call], cap: float, run: Callable[[str, list[Message]], Awaitable[int]]
) -> dict[str, Any]:
    """:func:`timed_calls` for a coroutine ``run``."""
    done_calls = done_messages = errors = 0
    start = time.perf_counter()
    for session_id, messages in calls:
        errors += await run(session_id, messages)
        done_calls += 1
        done_messages += len(messages)
        if time.perf_counter() - start > cap:
            break
    seconds = time.perf_counter() - start
    return {
        "calls": done_calls,
        "messages": done_messages,
        "errors": errors,
        "seconds": seconds,
        "capped": done_calls < len(calls),
    }


class Contender:
    """One session store under test, on one backend."""

    #: Short key used on the command line and in the JSON.
    key: ClassVar[str]
    #: Column heading in the table.
    label: ClassVar[str]
    #: Distributions whose versions the results record.
    packages: ClassVar[tuple[str, ...]] = ()
    #: Whether one call can take a batch; when not, a batch is one call per message.
    batch_api: ClassVar[bool] = True
    #: How it was used, for the notes under the table.
    usage: ClassVar[str] = ""

    def __init__(self, target: Target) -> None:
        self.target = target

    # -- setup (untimed) ------------------------------------------------------------

    def open(self) -> None:
        """Connect and create the schema."""

    def settings(self) -> dict[str, Any]:
        """Durability and driver facts as this contender's own connections see them."""
        return {}

    def create_sessions(self, session_ids: Sequence[str]) -> None:
        """Make the sessions, as a gateway does once per conversation."""

    def seed_transcript(self, session_id: str, messages: list[Message]) -> None:
        """Store a long transcript quickly, for the load step."""
        raise NotImplementedError

    def seed_turn(self, session_id: str, items: list[Any]) -> None:
        """Send the stored part of a turn-flush transcript through the timed write path
        (untimed here), in calls of 1,000: the same objects the turn flush sends again."""
        for start in range(0, len(items), 1000):
            self.flush([(session_id, items[start : start + 1000])], float("inf"))

    def seed_listing(self, total: int) -> int:
        """Add sessions with bulk SQL in this contender's schema until it has ``total``;
        returns how many were added."""
        raise Unsupported("no session listing")

    #: Plain SQL for the checks: the stored messages' keys of the sessions named in
    #: ``{sessions}`` (one placeholder per session), as ``(session_id, key)`` rows in the
    #: contender's own order (``seq``, an autoincrement id, a timestamp). Run through a
    #: plain driver connection, never through the contender's own code.
    keys_sql: ClassVar[str | None] = None

    def keys_query(self) -> str | None:
        """``keys_sql`` for this backend (a peer whose JSON functions differ overrides)."""
        return self.keys_sql

    def prepare(self, messages: list[Message]) -> list[Any]:
        """What the gateway keeps in memory for these dicts, built before the timed call
        (a ``Message``, a LangChain message, an ADK ``Event``; the dict itself for stores
        that take dicts). The default keeps the dicts."""
        return messages

    def stored_keys(self, session_ids: Sequence[str]) -> dict[str, list[str]]:
        """Each session's stored keys in stored order, read with plain SQL (``keys_sql``)
        on the contender's tables: what the checks count, never the contender's own
        reading code."""
        query = self.keys_query()
        if query is None:
            raise Unsupported("no way to read the stored keys")
        found: dict[str, list[str]] = {session_id: [] for session_id in session_ids}
        marker = "?" if self.target.backend == "sqlite" else "%s"
        connection = self.target.connect()
        try:
            ids = list(session_ids)
            for start in range(0, len(ids), 500):
                chunk = ids[start : start + 500]
                sql = query.format(sessions=", ".join([marker] * len(chunk)))
                for session_id, key in connection.execute(sql, chunk).fetchall():
                    found[session_id].append(normal_key(key))
        finally:
            connection.close()
        return found

    def settle(self) -> None:
        """Wait (untimed) until background work this contender started is done, so that it
        does not run inside the next contender's timing."""

    # -- timed ----------------------------------------------------------------------

    def flush(self, calls: Sequence[Call], cap: float) -> dict[str, Any]:
        raise NotImplementedError

    def load(self, session_id: str) -> dict[str, Any]:
        raise NotImplementedError

    def list_newest(self, limit: int) -> dict[str, Any]:
        raise Unsupported("no session listing")

    def close(self) -> None:
        pass


class AsyncContender(Contender):
    """A contender whose API is asyncio: one event loop, and each timed step runs as one
    coroutine (so no loop start-up is counted per call)."""

    def __init__(self, target: Target) -> None:
        super().__init__(target)
        self.loop = asyncio.new_event_loop()

    def run(self, coroutine: Awaitable[T]) -> T:
        return self.loop.run_until_complete(coroutine)

    def close(self) -> None:
        self.loop.close()


def normal_key(value: Any) -> str:
    """A stored key as the canonical UUID text (PostgreSQL ``uuid``, 32 hex digits, text)."""
    text = str(value)
    try:
        return str(uuid.UUID(text))
    except ValueError:
        return text


def timed(function: Callable[[], T]) -> tuple[T, float]:
    start = time.perf_counter()
    value = function()
    return value, time.perf_counter() - start


async def atimed(awaitable: Awaitable[T]) -> tuple[T, float]:
    start = time.perf_counter()
    value = await awaitable
    return value, time.perf_counter() - start


def seed_count(target: Target, table: str, total: int) -> int:
    """How many sessions to add so that ``table`` holds ``total`` rows."""
    connection = target.connect()
    try:
        existing = int(connection.execute(f"SELECT count(*) FROM {table}").fetchone()[0])
    finally:
        connection.close()
    return max(0, total - existing)


def sqlite_pragmas(connection: Any) -> dict[str, Any]:
    """``synchronous`` and ``journal_mode`` as a DB-API SQLite connection has them."""
    names = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}
    level = connection.execute("PRAGMA synchronous").fetchone()[0]
    mode = connection.execute("PRAGMA journal_mode").fetchone()[0]
    return {"synchronous": names.get(int(level), str(level)), "journal_mode": str(mode)}
