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

from bench.contenders.base import (
    AsyncContender,
    Call,
    Message,
    atimed,
    atimed_calls,
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

    def count(self, session_id: str) -> int:
        connection = self.target.connect()
        try:
            sql = "SELECT count(*) FROM agent_messages WHERE session_id = "
            sql += "?" if self.target.backend == "sqlite" else "%s"
            return int(connection.execute(sql, (session_id,)).fetchone()[0])
        finally:
            connection.close()

    def load(self, session_id: str) -> dict[str, Any]:
        items, seconds = self.run(atimed(self._session(session_id).get_items()))
        return {"messages": len(items), "seconds": seconds}

    def close(self) -> None:
        self.run(self.engine.dispose())
        super().close()
