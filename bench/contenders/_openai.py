"""OpenAI Agents SDK ``SQLAlchemySession`` (``agents.extensions.memory.sqlalchemy_session``).

Used as its docstring says: one ``SQLAlchemySession(session_id, engine=engine)`` per
conversation over one shared ``AsyncEngine`` (``postgresql+asyncpg`` /
``sqlite+aiosqlite``, the drivers its docs name), ``create_tables=True`` once at setup.
Items are the gateway's dicts as they are (the SDK stores any JSON-able item with
``json.dumps``); a flush is ``await session.add_items(dicts)``; load is
``await session.get_items()``. It has no call that lists sessions, and no key: re-adding
items stores them again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bench.contenders._sessionrepo_async import SessionRepoAsync
from bench.contenders.base import (
    AsyncContender,
    Call,
    Message,
    Unsupported,
    atimed,
    atimed_calls,
    sqlite_pragmas,
)
from bench.peers_compat import sqlite_session_connection


def _keys_sql(backend: str) -> str:
    """The key each item carries in its JSON (the SDK stores the dict as it is)."""
    key = (
        "json_extract(message_data, '$.client_msg_uuid')"
        if backend == "sqlite"
        else "(message_data::json ->> 'client_msg_uuid')"
    )
    return (
        f"SELECT session_id, {key} FROM agent_messages WHERE session_id IN ({{sessions}}) "
        "ORDER BY session_id, id"
    )


class OpenAIAgents(AsyncContender):
    key = "openai"
    label = "OpenAI Agents SQLAlchemySession"
    packages = ("openai-agents", "sqlalchemy", "asyncpg", "aiosqlite")
    usage = (
        "`SQLAlchemySession(session_id, engine=shared AsyncEngine)`; `await "
        "add_items(dicts)`; `await get_items()`; asyncpg / aiosqlite (its docs' drivers); "
        "on SQLite it sets WAL itself and leaves `synchronous` at SQLite's default"
    )

    def open(self) -> None:
        from agents.extensions.memory.sqlalchemy_session import SQLAlchemySession
        from sqlalchemy.ext.asyncio import create_async_engine

        self._session_class = SQLAlchemySession
        driver = "aiosqlite" if self.target.backend == "sqlite" else "asyncpg"
        self.engine = create_async_engine(self.target.sqlalchemy_url(driver))
        self.sessions: dict[str, Any] = {}
        setup = SQLAlchemySession("setup", engine=self.engine, create_tables=True)
        self.run(setup.get_items())

    def _session(self, session_id: str) -> Any:
        session = self.sessions.get(session_id)
        if session is None:
            session = self.sessions[session_id] = self._session_class(
                session_id, engine=self.engine
            )
        return session

    def settings(self) -> dict[str, Any]:
        async def read() -> dict[str, Any]:
            async with self.engine.connect() as connection:
                if self.target.backend == "sqlite":
                    level = (await connection.exec_driver_sql("PRAGMA synchronous")).scalar()
                    mode = (await connection.exec_driver_sql("PRAGMA journal_mode")).scalar()
                    names = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}
                    return {
                        "synchronous": names.get(
                            level if isinstance(level, int) else -1, str(level)
                        ),
                        "journal_mode": mode,
                    }
                level = (await connection.exec_driver_sql("SHOW synchronous_commit")).scalar()
                return {"synchronous_commit": level}

        return self.run(read()) | {"driver": self.engine.dialect.driver}

    def create_sessions(self, session_ids: Sequence[str]) -> None:
        for session_id in session_ids:
            self._session(session_id)

    async def _add(self, session_id: str, messages: list[Message]) -> int:
        await self._session(session_id).add_items(messages)
        return 0

    def flush(self, calls: Sequence[Call], cap: float) -> dict[str, Any]:
        return self.run(atimed_calls(calls, cap, self._add))

    def seed_transcript(self, session_id: str, messages: list[Message]) -> None:
        session = self._session(session_id)
        for start in range(0, len(messages), 1000):
            self.run(session.add_items(messages[start : start + 1000]))

    def keys_query(self) -> str:
        return _keys_sql(self.target.backend)

    def load(self, session_id: str) -> dict[str, Any]:
        items, seconds = self.run(atimed(self._session(session_id).get_items()))
        return {"messages": len(items), "seconds": seconds}

    def close(self) -> None:
        self.run(self.engine.dispose())
        super().close()


class OpenAISQLite(AsyncContender):
    """OpenAI Agents SDK ``SQLiteSession`` (``agents.memory``): its own ``sqlite3`` store, one
    file, SQLite only. One ``SQLiteSession(session_id, db_path)`` per conversation on the
    same file (the SDK serializes the sessions of one file behind a lock and gives each
    thread its own connection); ``await add_items(dicts)`` runs ``INSERT OR IGNORE`` of the
    session row, an ``executemany`` of the items and an ``UPDATE`` of the session's
    ``updated_at`` in one transaction, on a worker thread; ``await get_items()``."""

    key = "openai-sqlite"
    label = "OpenAI Agents SQLiteSession"
    packages = ("openai-agents",)
    usage = (
        "`SQLiteSession(session_id, db_path)` per conversation on one file (SQLite only); "
        "`await add_items(dicts)`; `await get_items()`; bare `sqlite3` on a worker thread, "
        "WAL set by itself, `synchronous` at SQLite's default"
    )

    def open(self) -> None:
        if self.target.backend != "sqlite":
            raise Unsupported("SQLiteSession is SQLite only")
        from agents.memory import SQLiteSession

        self._session_class = SQLiteSession
        self.sessions: dict[str, Any] = {}
        self.run(self._session("setup").get_items())

    def _session(self, session_id: str) -> Any:
        session = self.sessions.get(session_id)
        if session is None:
            session = self.sessions[session_id] = self._session_class(
                session_id, db_path=self.target.location
            )
        return session

    def settings(self) -> dict[str, Any]:
        session = self._session("setup")

        def read() -> dict[str, Any]:
            with sqlite_session_connection(session) as connection:
                return sqlite_pragmas(connection)

        return read() | {"driver": "sqlite3"}

    def create_sessions(self, session_ids: Sequence[str]) -> None:
        for session_id in session_ids:
            self._session(session_id)

    async def _add(self, session_id: str, messages: list[Message]) -> int:
        await self._session(session_id).add_items(messages)
        return 0

    def flush(self, calls: Sequence[Call], cap: float) -> dict[str, Any]:
        return self.run(atimed_calls(calls, cap, self._add))

    def seed_transcript(self, session_id: str, messages: list[Message]) -> None:
        session = self._session(session_id)
        for start in range(0, len(messages), 1000):
            self.run(session.add_items(messages[start : start + 1000]))

    def keys_query(self) -> str:
        return _keys_sql("sqlite")

    def load(self, session_id: str) -> dict[str, Any]:
        items, seconds = self.run(atimed(self._session(session_id).get_items()))
        return {"messages": len(items), "seconds": seconds}

    def close(self) -> None:
        for session in self.sessions.values():
            session.close()
        super().close()


class SessionRepoOpenAIAgents(SessionRepoAsync):
    """sessionrepo's OpenAI Agents SDK ``Session`` (``sessionrepo.integrations.openai_agents``):
    the same calls as the two SDK rows above (one ``SessionRepoSession(session_id,
    repository=...)`` per conversation over one shared async repository, ``await
    add_items(dicts)``, ``await get_items()``), next to ``sessionrepo-async`` (the native
    API under it): what the adapter costs. The workload's dicts carry their
    ``client_msg_uuid``, which the adapter takes as the key, so a turn's re-flush stores
    nothing again."""

    key = "sessionrepo-openai-agents"
    label = "sessionrepo SessionRepoSession (OpenAI Agents)"
    packages = (*SessionRepoAsync.packages, "openai-agents")
    usage = (
        "`SessionRepoSession(session_id, repository=shared async repository)` per "
        "conversation; `await add_items(dicts)`; `await get_items()`; on "
        "`open_async_repository(url)` (aiosqlite / psycopg async, SQLite `synchronous=FULL`)"
    )

    def open(self) -> None:
        from sessionrepo.integrations.openai_agents import SessionRepoSession

        super().open()
        self._session_class = SessionRepoSession
        self.sessions: dict[str, Any] = {}

    def _session(self, session_id: str) -> Any:
        session = self.sessions.get(session_id)
        if session is None:
            session = self.sessions[session_id] = self._session_class(
                session_id, repository=self.arepo
            )
        return session

    def prepare(self, messages: list[Message]) -> list[Any]:
        return messages  # the SDK's items are dicts

    def create_sessions(self, session_ids: Sequence[str]) -> None:
        super().create_sessions(session_ids)
        for session_id in session_ids:
            self._session(session_id)

    async def _aappend(self, session_id: str, messages: list[Message]) -> int:
        await self._session(session_id).add_items(messages)
        return 0

    def seed_transcript(self, session_id: str, messages: list[Message]) -> None:
        session = self._session(session_id)
        for start in range(0, len(messages), 1000):
            self.run(session.add_items(messages[start : start + 1000]))

    def load(self, session_id: str) -> dict[str, Any]:
        items, seconds = self.run(atimed(self._session(session_id).get_items()))
        return {"messages": len(items), "seconds": seconds}

    def list_newest(self, limit: int) -> dict[str, Any]:
        raise Unsupported("the SDK's Session has no call that lists sessions")

    def close(self) -> None:
        self.run(self._close_sessions())
        super().close()

    async def _close_sessions(self) -> None:
        for session in self.sessions.values():
            await session.aclose()  # the repository is the contender's: closed after
