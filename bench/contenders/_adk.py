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
from typing import Any, ClassVar

from sqlalchemy.util import greenlet_spawn

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
    packages: ClassVar[tuple[str, ...]] = (
        "google-adk",
        "google-genai",
        "sqlalchemy",
        "asyncpg",
        "aiosqlite",
    )
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


_REPO_ADK_PG_SEED = [
    """
    INSERT INTO sessions (id, source, user_id, started_at, last_active_at, next_seq)
    SELECT 'adk:bench:user-' || (g %% 1000) || ':listed-' || g, 'adk:bench',
        'user-' || (g %% 1000), now() - g * interval '1 second',
        now() - g * interval '1 second', 1
    FROM generate_series(1, %(count)s) AS g
    """,
    """
    INSERT INTO adk_sessions (session_id, app_name, user_id, adk_session_id, state,
        update_time, applied_seq)
    SELECT 'adk:bench:user-' || (g %% 1000) || ':listed-' || g, 'bench',
        'user-' || (g %% 1000), 'listed-' || g, '{}',
        extract(epoch FROM now()) - g, 0
    FROM generate_series(1, %(count)s) AS g
    """,
    """
    INSERT INTO adk_user_states (app_name, user_id, state, update_time)
    SELECT 'bench', 'user-' || u, '{}', extract(epoch FROM now())
    FROM generate_series(0, 999) AS u
    ON CONFLICT DO NOTHING
    """,
    "ANALYZE sessions",
    "ANALYZE adk_sessions",
]

_REPO_ADK_SQLITE_SEED = """
WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < {count})
INSERT INTO sessions (id, source, user_id, started_at, last_active_at, next_seq)
SELECT 'adk:bench:user-' || (n % 1000) || ':listed-' || n, 'adk:bench', 'user-' || (n % 1000),
    strftime('%Y-%m-%d %H:%M:%S', 'now', '-' || n || ' seconds') || '.000000',
    strftime('%Y-%m-%d %H:%M:%S', 'now', '-' || n || ' seconds') || '.000000', 1
FROM g;
WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < {count})
INSERT INTO adk_sessions (session_id, app_name, user_id, adk_session_id, state, update_time,
    applied_seq)
SELECT 'adk:bench:user-' || (n % 1000) || ':listed-' || n, 'bench', 'user-' || (n % 1000),
    'listed-' || n, '{{}}', CAST(strftime('%s', 'now') AS REAL) - n, 0
FROM g;
WITH RECURSIVE u(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM u WHERE n < 999)
INSERT OR IGNORE INTO adk_user_states (app_name, user_id, state, update_time)
SELECT 'bench', 'user-' || n, '{{}}', CAST(strftime('%s', 'now') AS REAL) FROM u;
ANALYZE;
"""


class SessionRepoADK(GoogleADK):
    """sessionrepo's ADK session service (``sessionrepo.integrations.adk``), on the same
    workload as ``GoogleADK``: the same ``Event`` objects, ``append_event`` one at a
    time (ADK's interface has no batch call), ``get_session``. Its re-appended events
    are no-ops, so it has the turn flush ADK's own service lacks. The newest 50 sessions
    are one page of ``list_sessions(app_name, page_size=50)`` (its keyset-paged listing),
    where ``DatabaseSessionService`` returns every session. Next to ``sessionrepo-async``
    the rows show what the adapter adds (an ADK event per message, its state, one
    transaction per event)."""

    key = "sessionrepo-adk"
    label = "sessionrepo ADK SessionRepoSessionService"
    packages = ("google-adk", "google-genai", "sessionrepo", "sqlalchemy", "psycopg", "aiosqlite")
    usage = (
        "`SessionRepoSessionService(url=...)`; `create_session` per conversation (untimed); "
        "`await append_event(session, Event)` per message, the same `Event`s as ADK's; "
        "`get_session` loads; `list_sessions(app_name, page_size=50)` lists; SQLite "
        "`synchronous=FULL` (sessionrepo's default)"
    )

    def open(self) -> None:
        from google.adk.events import Event
        from google.genai import types

        from sessionrepo import open_async_repository
        from sessionrepo.integrations.adk import SessionRepoSessionService

        self._event = Event
        self._types = types
        self.arepo = self.run(open_async_repository(self.target.location, auto_migrate=True))
        self.repo_service = SessionRepoSessionService(repository=self.arepo)
        # ADK's own service's type, for the base class's helpers: they drive both alike.
        self.service = self.repo_service  # type: ignore[assignment]
        self.sessions = {}
        self._tool_names = {}
        self._invocation = 0

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

    def keys_query(self) -> str | None:
        event_id = (
            "json_extract(extra, '$.adk_event.id')"
            if self.target.backend == "sqlite"
            else "(extra::jsonb -> 'adk_event' ->> 'id')"
        )
        return (
            f"SELECT session_id, {event_id} FROM messages WHERE session_id IN ({{sessions}}) "
            "ORDER BY session_id, seq"
        )

    def stored_keys(self, session_ids: Sequence[str]) -> dict[str, list[str]]:
        from sessionrepo.integrations.adk import session_key

        names = {session_key(APP, USER, session_id): session_id for session_id in session_ids}
        found = super().stored_keys(list(names))
        return {names[name]: keys for name, keys in found.items()}

    def _bulk(self, session_id: str, messages: list[Message]) -> None:
        """Store events as the service stores them (its own ``event_message``), 1,000 a
        transaction, then let the service catch their (empty) state deltas up, untimed:
        appending 10,000 events one by one would take minutes."""
        from sessionrepo.integrations.adk import event_message, session_key

        sid = session_key(APP, USER, session_id)
        events = [self.to_event(message) for message in messages]
        for start in range(0, len(events), 1000):
            chunk = events[start : start + 1000]
            self.run(self.arepo.append(sid, [event_message(sid, event) for event in chunk]))
        from google.adk.sessions.base_session_service import GetSessionConfig

        self.sessions[session_id] = self.run(
            self.service.get_session(
                app_name=APP,
                user_id=USER,
                session_id=session_id,
                config=GetSessionConfig(num_recent_events=0),
            )
        )

    def seed_transcript(self, session_id: str, messages: list[Message]) -> None:
        self._bulk(session_id, messages)

    def seed_turn(self, session_id: str, items: list[Any]) -> None:
        from sessionrepo.integrations.adk import event_message, session_key

        sid = session_key(APP, USER, session_id)
        for start in range(0, len(items), 1000):
            chunk = items[start : start + 1000]
            self.run(self.arepo.append(sid, [event_message(sid, event) for event in chunk]))
        session = self.run(
            self.service.get_session(app_name=APP, user_id=USER, session_id=session_id)
        )
        self.sessions[session_id] = session

    def seed_listing(self, total: int) -> int:
        count = seed_count(self.target, "adk_sessions", total)
        if not count:
            return 0
        connection = self.target.connect()
        try:
            if self.target.backend == "sqlite":
                connection.executescript(_REPO_ADK_SQLITE_SEED.format(count=int(count)))
            else:
                for statement in _REPO_ADK_PG_SEED:
                    connection.execute(statement, {"count": count})
        finally:
            connection.close()
        return count

    def list_newest(self, limit: int) -> dict[str, Any]:
        async def newest() -> list[Any]:
            response = await self.repo_service.list_sessions(app_name=APP, page_size=limit)
            return list(response.sessions)

        sessions, seconds = self.run(atimed(newest()))
        return {"sessions": len(sessions), "seconds": seconds}

    def close(self) -> None:
        self.run(self.service.close())
        self.run(self.arepo.close())
        AsyncContender.close(self)
