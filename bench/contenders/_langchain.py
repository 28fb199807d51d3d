"""LangChain ``SQLChatMessageHistory`` (``langchain_community.chat_message_histories``).

Used as its docs say, synchronously: ``SQLChatMessageHistory(session_id,
connection=engine)`` over one shared SQLAlchemy ``Engine`` (``postgresql+psycopg`` /
``sqlite``), one history object per conversation made before timing (its constructor runs a
``CREATE TABLE`` check each time). The gateway's dicts become LangChain messages with
``langchain_core.messages.convert_to_messages`` (the key as the message ``id``), timed;
a flush is ``add_messages(messages)`` (ORM, one transaction); load is ``.messages``. Its
table has no sessions, so nothing to list, no index on ``session_id`` and no key: re-adding
stores everything again.

``sessionrepo-langchain`` (:class:`SessionRepoLangChain`): the same workload through
sessionrepo's own ``SessionRepoChatMessageHistory``, so the table shows what the adapter
costs over sessionrepo's ``append`` and what it saves over ``SQLChatMessageHistory``.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

from bench.contenders.base import Call, Contender, Message, sqlite_pragmas, timed, timed_calls


def _wire(message: Message) -> dict[str, Any]:
    converted = {name: value for name, value in message.items() if name != "client_msg_uuid"}
    converted["id"] = message["client_msg_uuid"]
    return converted


class LangChain(Contender):
    key = "langchain"
    label = "LangChain SQLChatMessageHistory"
    packages = ("langchain-community", "langchain-core", "sqlalchemy", "psycopg")
    usage = (
        "`SQLChatMessageHistory(session_id, connection=shared Engine)`; dicts → "
        "`convert_to_messages` (timed); `add_messages(...)`; `.messages`; psycopg 3 / sqlite3, "
        "`synchronous` at SQLite's default"
    )

    def open(self) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the package announces its own sunset
            from langchain_community.chat_message_histories import SQLChatMessageHistory
        from langchain_core.messages import convert_to_messages
        from sqlalchemy import create_engine

        self._history_class = SQLChatMessageHistory
        self._convert = convert_to_messages
        driver = "pysqlite" if self.target.backend == "sqlite" else "psycopg"
        self.engine = create_engine(self.target.sqlalchemy_url(driver))
        self.histories: dict[str, Any] = {}
        self._history("setup")

    def _history(self, session_id: str) -> Any:
        history = self.histories.get(session_id)
        if history is None:
            history = self.histories[session_id] = self._history_class(
                session_id=session_id, connection=self.engine
            )
        return history

    def settings(self) -> dict[str, Any]:
        with self.engine.connect() as connection:
            if self.target.backend == "sqlite":
                values = sqlite_pragmas(connection.connection.dbapi_connection)
            else:
                values = {
                    "synchronous_commit": connection.exec_driver_sql(
                        "SHOW synchronous_commit"
                    ).scalar()
                }
            connection.rollback()
        return values | {"driver": self.engine.dialect.driver}

    def create_sessions(self, session_ids: Sequence[str]) -> None:
        for session_id in session_ids:
            self._history(session_id)

    def _add(self, session_id: str, messages: list[Message]) -> int:
        self._history(session_id).add_messages(messages)
        return 0

    def prepare(self, messages: list[Message]) -> list[Any]:
        """The gateway's dicts as LangChain messages (the key as the message ``id``)."""
        converted: list[Any] = self._convert([_wire(m) for m in messages])
        return converted

    def keys_query(self) -> str:
        key = (
            "json_extract(message, '$.data.id')"
            if self.target.backend == "sqlite"
            else "(message::json -> 'data' ->> 'id')"
        )
        return (
            f"SELECT session_id, {key} FROM message_store WHERE session_id IN ({{sessions}}) "
            "ORDER BY session_id, id"
        )

    def flush(self, calls: Sequence[Call], cap: float) -> dict[str, Any]:
        return timed_calls(calls, cap, self._add)

    def seed_transcript(self, session_id: str, messages: list[Message]) -> None:
        for start in range(0, len(messages), 1000):
            self._add(session_id, self.prepare(messages[start : start + 1000]))

    def load(self, session_id: str) -> dict[str, Any]:
        messages, seconds = timed(lambda: self._history(session_id).messages)
        return {"messages": len(messages), "seconds": seconds}

    def close(self) -> None:
        for history in self.histories.values():
            history.session_maker.remove()
        self.engine.dispose()


class SessionRepoLangChain(Contender):
    """sessionrepo's own LangChain history (``sessionrepo.integrations.langchain``) in
    ``SQLChatMessageHistory``'s place: the same LangChain messages (the gateway's key as
    the message ``id``), one history object per conversation over one shared repository,
    ``add_messages`` and ``.messages``. Each message is stored under a key derived from its
    ``id`` (a re-flush is a no-op); the ``id`` itself is in the row's ``extra``, where the
    checks read it."""

    key = "sessionrepo-langchain"
    label = "sessionrepo SessionRepoChatMessageHistory (LangChain)"
    packages = ("sessionrepo", "langchain-core", "sqlalchemy", "psycopg")
    usage = (
        "`SessionRepoChatMessageHistory(session_id, repository=shared repository)`; dicts → "
        "`convert_to_messages` as for `langchain`; `add_messages(...)` (one `append`); "
        "`.messages`; sessions made before timing, as for `sessionrepo`; its own SQLite "
        "default `synchronous=FULL`"
    )

    def open(self) -> None:
        from langchain_core.messages import convert_to_messages

        from sessionrepo import open_repository
        from sessionrepo.integrations.langchain import SessionRepoChatMessageHistory

        self._history_class = SessionRepoChatMessageHistory
        self._convert = convert_to_messages
        self.repo = open_repository(self.target.location, auto_migrate=True)
        self.histories: dict[str, Any] = {}

    def _history(self, session_id: str) -> Any:
        history = self.histories.get(session_id)
        if history is None:
            history = self.histories[session_id] = self._history_class(
                session_id, repository=self.repo
            )
        return history

    def settings(self) -> dict[str, Any]:
        engine = self.repo.database.engine
        with engine.connect() as connection:
            if self.target.backend == "sqlite":
                values = sqlite_pragmas(connection.connection.dbapi_connection)
            else:
                values = {
                    "synchronous_commit": connection.exec_driver_sql(
                        "SHOW synchronous_commit"
                    ).scalar()
                }
            connection.rollback()
        return values | {"driver": engine.dialect.driver}

    def create_sessions(self, session_ids: Sequence[str]) -> None:
        for session_id in session_ids:
            self.repo.create_session(session_id, source="bench")
            self._history(session_id)

    def prepare(self, messages: list[Message]) -> list[Any]:
        """The gateway's dicts as LangChain messages (the key as the message ``id``)."""
        converted: list[Any] = self._convert([_wire(m) for m in messages])
        return converted

    def _add(self, session_id: str, messages: list[Message]) -> int:
        self._history(session_id).add_messages(messages)
        return 0

    def keys_query(self) -> str:
        # The message id (the gateway's key) is kept in extra["langchain"]["id"].
        key = (
            "json_extract(extra, '$.langchain.id')"
            if self.target.backend == "sqlite"
            else "(extra::json -> 'langchain' ->> 'id')"
        )
        return (
            f"SELECT session_id, {key} FROM messages WHERE session_id IN ({{sessions}}) "
            "ORDER BY session_id, seq"
        )

    def flush(self, calls: Sequence[Call], cap: float) -> dict[str, Any]:
        return timed_calls(calls, cap, self._add)

    def seed_transcript(self, session_id: str, messages: list[Message]) -> None:
        for start in range(0, len(messages), 1000):
            self._add(session_id, self.prepare(messages[start : start + 1000]))

    def load(self, session_id: str) -> dict[str, Any]:
        messages, seconds = timed(lambda: self._history(session_id).messages)
        return {"messages": len(messages), "seconds": seconds}

    def close(self) -> None:
        self.repo.close()
