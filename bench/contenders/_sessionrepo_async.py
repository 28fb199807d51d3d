"""sessionrepo's asyncio API, used as an asyncio gateway uses it:
``await open_async_repository(url)``, then ``await repo.append(session_id, dicts)`` (aiosqlite
/ psycopg async). The same workload and timing as the sync contender, one event loop."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from sqlalchemy.util import greenlet_spawn

from bench.contenders._sessionrepo import SessionRepo, _as_messages
from bench.contenders.base import AsyncContender, Call, Message, atimed, atimed_calls


class SessionRepoAsync(AsyncContender, SessionRepo):
    key = "sessionrepo-async"
    label = "sessionrepo async append"
    packages: ClassVar[tuple[str, ...]] = (
        "sessionrepo",
        "sqlalchemy",
        "pydantic",
        "psycopg",
        "aiosqlite",
        "greenlet",
    )
    usage = (
        "`await open_async_repository(url)`; `await repo.append(session_id, messages)` of the "
        "same `Message` objects as sessionrepo append; `await load_transcript`; "
        "`await list_sessions(limit=50)`; "
        "aiosqlite / psycopg async, one event loop; SQLite `synchronous=FULL`"
    )

    def open(self) -> None:
        from sessionrepo import open_async_repository

        self.arepo = self.run(open_async_repository(self.target.location, auto_migrate=True))
        self.repo = self.arepo  # type: ignore[assignment]  # for the base class's untimed helpers that only read

    def prepare(self, messages: list[Message]) -> list[Any]:
        return _as_messages(messages)

    def settings(self) -> dict[str, Any]:
        def read(connection: Any) -> dict[str, Any]:
            if self.target.backend == "sqlite":
                names = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}
                level = connection.exec_driver_sql("PRAGMA synchronous").scalar()
                mode = connection.exec_driver_sql("PRAGMA journal_mode").scalar()
                return {"synchronous": names.get(int(level), str(level)), "journal_mode": mode}
            return {
                "synchronous_commit": connection.exec_driver_sql("SHOW synchronous_commit").scalar()
            }

        database = self.arepo.database
        # The async repository's connections need a greenlet to run sync code on the loop,
        # as its own calls do (SQLAlchemy's bridge).
        values: dict[str, Any] = self.run(greenlet_spawn(database.read, read))
        return values | {"driver": database.engine.dialect.driver}

    def create_sessions(self, session_ids: Sequence[str]) -> None:
        async def create() -> None:
            for session_id in session_ids:
                await self.arepo.create_session(session_id, source="bench")

        self.run(create())

    async def _aappend(self, session_id: str, messages: list[Message]) -> int:
        await self.arepo.append(session_id, messages)
        return 0

    def flush(self, calls: Sequence[Call], cap: float) -> dict[str, Any]:
        return self.run(atimed_calls(calls, cap, self._aappend))

    def seed_transcript(self, session_id: str, messages: list[Message]) -> None:
        for start in range(0, len(messages), 1000):
            self.run(self.arepo.append(session_id, messages[start : start + 1000]))

    def load(self, session_id: str) -> dict[str, Any]:
        messages, seconds = self.run(atimed(self.arepo.load_transcript(session_id)))
        return {"messages": len(messages), "seconds": seconds}

    def list_newest(self, limit: int) -> dict[str, Any]:
        page, seconds = self.run(atimed(self.arepo.list_sessions(limit=limit)))
        return {"sessions": len(page.sessions), "seconds": seconds}

    def close(self) -> None:
        self.run(self.arepo.close())
        AsyncContender.close(self)
