"""Google ADK ``DatabaseSessionService`` (``google.adk.sessions``).

Used as its docs say: ``DatabaseSessionService(db_url=...)`` with the async drivers it asks
for (``postgresql+asyncpg``, ``sqlite+aiosqlite``), ``create_session`` once per
conversation, then ``await append_event(session, event)`` for each message (it has no batch
call: a batch of 10 is 10 calls). Each gateway dict becomes an ADK ``Event`` (the key as
the event id; text as a ``Part``; tool calls as ``function_call`` parts; tool outputs as
``function_response`` parts), built before the timed call as an ADK gateway holds them.
Load is ``get_session`` (every event, validated back into ``Event`` objects).
``list_sessions(app_name=...)`` has no limit: it returns every session of the app, oldest
first, and the newest 50 are its last 50.
Re-appending an event id raises ``IntegrityError``.

SQLite: the service sets ``foreign_keys`` only; the file is in WAL (made so by the harness)
and ``synchronous`` is SQLite's default.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from bench.contenders.base import (
    AsyncContender,
    Call,
    Message,
    Unsupported,
    atimed,
    atimed_calls,
    seed_count,
)

APP = "bench"
USER = "gateway"

_PG_SEED = [
    """
    INSERT INTO user_states (app_name, user_id, state, update_time)
    SELECT 'bench', 'user-' || u, '{}'::jsonb, now() AT TIME ZONE 'UTC'
    FROM generate_series(0, 999) AS u
    ON CONFLICT DO NOTHING
    """,
    """
    INSERT INTO sessions (app_name, user_id, id, state, create_time, update_time)
    SELECT 'bench', 'user-' || (g %% 1000), 'listed-' || g, '{}'::jsonb,
        (now() - g * interval '1 second') AT TIME ZONE 'UTC',
        (now() - g * interval '1 second') AT TIME ZONE 'UTC'
    FROM generate_series(1, %(count)s) AS g
    """,
    "ANALYZE sessions",
]

_SQLITE_SEED = """
WITH RECURSIVE u(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM u WHERE n < 999)
INSERT OR IGNORE INTO user_states (app_name, user_id, state, update_time)
SELECT 'bench', 'user-' || n, '{{}}', strftime('%Y-%m-%d %H:%M:%S', 'now') || '.000000' FROM u;
WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < {count})
INSERT INTO sessions (app_name, user_id, id, state, create_time, update_time)
SELECT 'bench', 'user-' || (n % 1000), 'listed-' || n, '{{}}',
    strftime('%Y-%m-%d %H:%M:%S', 'now', '-' || n || ' seconds') || '.000000',
    strftime('%Y-%m-%d %H:%M:%S', 'now', '-' || n || ' seconds') || '.000000'
FROM g;
ANALYZE;
"""


class GoogleADK(AsyncContender):
    key = "adk"
    label = "Google ADK DatabaseSessionService"
    packages = ("google-adk", "google-genai", "sqlalchemy", "asyncpg", "aiosqlite")
    batch_api = False
    usage = (
        "`DatabaseSessionService(db_url)`; `create_session` per conversation (untimed); "
        "`await append_event(session, Event)` per message (no batch call), the dict → `Event` "
        "conversion before timing; `get_session` loads; `list_sessions(app_name)` returns all"
    )

    def open(self) -> None:
        from google.adk.events import Event
        from google.adk.sessions import DatabaseSessionService
        from google.genai import types

        self._event = Event
        self._types = types
        driver = "aiosqlite" if self.target.backend == "sqlite" else "asyncpg"
        self.service = DatabaseSessionService(db_url=self.target.sqlalchemy_url(driver))
        self.run(self.service.prepare_tables())
        self.sessions: dict[str, Any] = {}
        self._tool_names: dict[str, str] = {}
        self._invocation = 0

    def settings(self) -> dict[str, Any]:
        engine = self.service.db_engine

        async def read() -> dict[str, Any]:
            async with engine.connect() as connection:
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

        return self.run(read()) | {"driver": engine.dialect.driver}

    def create_sessions(self, session_ids: Sequence[str]) -> None:
        async def create() -> None:
            for session_id in session_ids:
                self.sessions[session_id] = await self.service.create_session(
                    app_name=APP, user_id=USER, session_id=session_id
                )

        self.run(create())

    def to_event(self, message: Message) -> Any:
        """The gateway's dict as an ADK event (what an ADK-based gateway would store)."""
        types = self._types
        role = message["role"]
        content = message.get("content")
        parts = []
        if role == "tool":
            call_id = message["tool_call_id"]
            parts.append(
                types.Part(
                    function_response=types.FunctionResponse(
                        id=call_id,
                        name=self._tool_names.get(call_id, "tool"),
                        response={"output": content},
                    )
                )
            )
        elif content is not None:
            parts.append(types.Part(text=content))
        for call in message.get("tool_calls") or ():
            function = call["function"]
            self._tool_names[call["id"]] = function["name"]
            parts.append(
                types.Part(
                    function_call=types.FunctionCall(
                        id=call["id"], name=function["name"], args=json.loads(function["arguments"])
                    )
                )
            )
        if role == "user":
            self._invocation += 1
        return self._event(
            id=message["client_msg_uuid"],
            invocation_id=f"inv-{self._invocation}",
            author="user" if role == "user" else "agent",
            content=types.Content(role="model" if role == "assistant" else "user", parts=parts),
        )

    keys_sql = (
        "SELECT session_id, id FROM events WHERE session_id IN ({sessions}) "
        "ORDER BY session_id, timestamp"
    )

    def prepare(self, messages: list[Message]) -> list[Any]:
        """The gateway's dicts as ADK events, built before the timed call (as an ADK
        gateway holds them)."""
        return [self.to_event(message) for message in messages]

    def seed_turn(self, session_id: str, items: list[Any]) -> None:
        raise Unsupported("re-appending an event id raises: no whole-transcript re-flush")

    async def _append(self, session_id: str, events: list[Any]) -> int:
        session = self.sessions[session_id]
        errors = 0
        for event in events:
            try:
                await self.service.append_event(session, event)
            except Exception:
                errors += 1  # a re-appended event id: IntegrityError
        return errors

    def flush(self, calls: Sequence[Call], cap: float) -> dict[str, Any]:
        if len(calls) == 1:
            # One long call (the re-flush step): stop inside it at the cap, so that the
            # slowest contender does not hold up the run; the rate is over what it did.
            session_id, messages = calls[0]
            singles = [(session_id, [message]) for message in messages]
            result = self.run(atimed_calls(singles, cap, self._append))
            result["calls"] = 1
            return result
        return self.run(atimed_calls(calls, cap, self._append))

    def seed_transcript(self, session_id: str, messages: list[Message]) -> None:
        """Bulk insert through ADK's own ORM rows (``StorageEvent.from_event``), in one
        transaction: appending 10,000 events one by one would take minutes."""
        from google.adk.sessions.schemas.v1 import StorageEvent

        session = self.sessions[session_id]

        async def seed() -> None:
            async with self.service.database_session_factory() as sql:
                for start in range(0, len(messages), 1000):
                    sql.add_all(
                        StorageEvent.from_event(session, self.to_event(message))
                        for message in messages[start : start + 1000]
                    )
                    await sql.flush()
                await sql.commit()

        self.run(seed())

    def load(self, session_id: str) -> dict[str, Any]:
        session, seconds = self.run(
            atimed(self.service.get_session(app_name=APP, user_id=USER, session_id=session_id))
        )
        return {"messages": len(session.events) if session else 0, "seconds": seconds}

    def seed_listing(self, total: int) -> int:
        count = seed_count(self.target, "sessions", total)
        if not count:
            return 0
        connection = self.target.connect()
        try:
            if self.target.backend == "sqlite":
                connection.executescript(_SQLITE_SEED.format(count=int(count)))
            else:
                for statement in _PG_SEED:
                    connection.execute(statement, {"count": count})
        finally:
            connection.close()
        return count

    def list_newest(self, limit: int) -> dict[str, Any]:
        async def newest() -> list[Any]:
            response = await self.service.list_sessions(app_name=APP)
            return response.sessions[-limit:][::-1]

        sessions, seconds = self.run(atimed(newest()))
        return {"sessions": len(sessions), "seconds": seconds}

    def close(self) -> None:
        self.run(self.service.close())
        super().close()
