"""The dialect package: its registry, the one source of the search index DDL, the one
declaration of a message's columns, and search-index failures attributed by statement."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from datetime import timedelta, timezone
from typing import Any

import pytest
from sqlalchemy import Connection
from sqlalchemy import exc as sa_exc

from sessionrepo import (
    BackendUnavailable,
    Message,
    SearchIndexUnavailable,
    SessionRepository,
    StoredMessage,
    open_repository,
)
from sessionrepo.dialects import dialect_for
from sessionrepo.models.message import WIRE_FIELDS
from sessionrepo.models.tables import HASHED_COLUMNS, MESSAGE_COLUMNS, MESSAGE_PLACE, MESSAGE_STATE
from sessionrepo.store.codec import LOAD_COLUMNS
from sessionrepo.store.database import Database
from sessionrepo.store.schema import upgrade


def test_an_unknown_dialect_raises_naming_itself() -> None:
    with pytest.raises(Exception, match="'oracle'"):
        dialect_for("oracle")


# -- the search index DDL: one live source, the migrations agreeing with it ----------


def _search_objects(conn: Connection) -> list[tuple[Any, ...]]:
    """What the database says the search index is made of."""
    if conn.dialect.name == "sqlite":
        return [
            tuple(row)
            for row in conn.exec_driver_sql(
                "SELECT type, name, tbl_name, sql FROM sqlite_master "
                "WHERE name LIKE 'messages_fts%' ORDER BY name"
            )
        ]
    columns = conn.exec_driver_sql(
        "SELECT 'column', column_name, data_type, is_nullable, ordinal_position "
        "FROM information_schema.columns WHERE table_name = 'message_search' "
        "ORDER BY ordinal_position"
    )
    indexes = conn.exec_driver_sql(
        "SELECT 'index', indexname, indexdef FROM pg_indexes "
        "WHERE tablename = 'message_search' ORDER BY indexname"
    )
    constraints = conn.exec_driver_sql(
        "SELECT 'constraint', conname, pg_get_constraintdef(oid) FROM pg_constraint "
        "WHERE conrelid = 'message_search'::regclass ORDER BY conname"
    )
    return [tuple(row) for result in (columns, indexes, constraints) for row in result]


@pytest.fixture
def migrated(empty_database_url: str) -> Iterator[Database]:
    database = Database(empty_database_url)
    upgrade(database)
    yield database
    database.dispose()


def test_the_migrated_search_index_is_what_the_dialect_creates(migrated: Database) -> None:
    made_by_migrations = migrated.read(_search_objects)
    assert made_by_migrations  # the query finds the index at all

    def recreate(conn: Connection) -> list[tuple[Any, ...]]:
        table = "messages_fts" if conn.dialect.name == "sqlite" else "message_search"
        conn.exec_driver_sql(f"DROP TABLE {table}")
        for statement in migrated.dialect.search_index_ddl:
            conn.exec_driver_sql(statement)
        return _search_objects(conn)

    assert migrated.write(recreate) == made_by_migrations


def test_a_reindex_leaves_the_search_index_as_the_migrations_made_it(migrated: Database) -> None:
    made_by_migrations = migrated.read(_search_objects)
    repository = SessionRepository(migrated)
    repository.append("s", [Message(role="user", content="hello there")])
    assert repository.reindex() == 1
    assert migrated.read(_search_objects) == made_by_migrations
    assert [hit.seq for hit in repository.search("hello")] == [1]


# -- one declaration of a message's columns --------------------------------------------


def test_every_message_field_has_its_column_in_field_order() -> None:
    stored = tuple(name for name in MESSAGE_COLUMNS if name != "content_hash")
    assert stored == tuple(Message.model_fields)
    assert tuple(StoredMessage.model_fields) == LOAD_COLUMNS
    assert (*stored, *MESSAGE_PLACE, *MESSAGE_STATE) == LOAD_COLUMNS
    assert set(WIRE_FIELDS) <= set(HASHED_COLUMNS) <= set(stored)
    assert WIRE_FIELDS[:2] == ("role", "content")  # to_openai writes these first


def test_the_append_statements_write_every_declared_column(database_url: str) -> None:
    repository = open_repository(database_url)
    try:
        message = Message(
            role="assistant",
            content="c",
            tool_calls=[{"id": "1"}],
            tool_call_id="t",
            tool_name="n",
            reasoning="r",
            finish_reason="stop",
            token_count=3,
            platform_message_id="p",
            extra={"k": "v"},
            openai_keys=(*WIRE_FIELDS, "k"),
        )
        repository.append("s", [message])
        [loaded] = repository.load_transcript("s")
        for name in Message.model_fields:
            assert getattr(loaded, name) == getattr(message, name), name
    finally:
        repository.close()


# -- a failure is the index's because of which statement failed ------------------------


class _DriverError(Exception):
    """A driver error as both backends' drivers describe theirs (code attributes)."""

    def __init__(self, text: str, *, sqlite_code: int, sqlstate: str) -> None:
        super().__init__(text)
        self.sqlite_errorcode = sqlite_code
        self.sqlite_errorname = f"code {sqlite_code}"
        self.sqlstate = sqlstate


def _failure(text: str, *, sqlite_code: int, sqlstate: str) -> sa_exc.DBAPIError:
    orig = _DriverError(text, sqlite_code=sqlite_code, sqlstate=sqlstate)
    return sa_exc.OperationalError("statement", {}, orig)


#: Damage, described by a message that names nothing of the index.
_DAMAGED = {"text": "boom", "sqlite_code": sqlite3.SQLITE_CORRUPT, "sqlstate": "XX002"}
#: An outage (a full disk), described by a message that names everything of the index.
_OUTAGE = {
    "text": "messages_fts fts5 message_search",
    "sqlite_code": sqlite3.SQLITE_FULL,
    "sqlstate": "53100",
}


def test_a_search_statement_that_finds_the_index_damaged_marks_it_stale(
    indexed: SessionRepository, monkeypatch: pytest.MonkeyPatch
) -> None:
    def damaged(*args: Any, **kwargs: Any) -> None:
        raise _failure(**_DAMAGED)

    monkeypatch.setattr(indexed.database.dialect, "search_messages", damaged)
    with pytest.raises(SearchIndexUnavailable, match="reindex"):
        indexed.search("hello")
    assert indexed.search_index_state()[0] == "stale"
    indexed.append("s", [Message(role="user", content="still written")])
    assert len(indexed.load_transcript("s")) == 2


def test_an_outage_during_a_search_is_an_outage_whatever_its_text(
    indexed: SessionRepository, monkeypatch: pytest.MonkeyPatch
) -> None:
    def outage(*args: Any, **kwargs: Any) -> None:
        raise _failure(**_OUTAGE)

    monkeypatch.setattr(indexed.database.dialect, "search_messages", outage)
    with pytest.raises(BackendUnavailable) as raised:
        indexed.search("hello")
    assert not isinstance(raised.value, SearchIndexUnavailable)
    assert indexed.search_index_state() == ("ok", None)


@pytest.mark.parametrize(("failure", "stale"), [(_DAMAGED, True), (_OUTAGE, False)])
def test_a_catch_up_that_loses_its_transaction_is_attributed_by_its_statement(
    indexed: SessionRepository,
    monkeypatch: pytest.MonkeyPatch,
    failure: dict[str, Any],
    stale: bool,
) -> None:
    dialect = indexed.database.dialect

    def fails(*args: Any, **kwargs: Any) -> None:
        raise _failure(**failure)

    indexed.append("s", [Message(role="user", content="hello again")])
    monkeypatch.setattr(dialect, "index_entries", fails)
    # As SQLite does on I/O errors: the failure took the whole transaction with it.
    monkeypatch.setattr(dialect, "transaction_alive", lambda conn: False)
    expected = SearchIndexUnavailable if stale else BackendUnavailable
    with pytest.raises(expected):
        indexed.catch_up_search_index()
    assert (indexed.search_index_state()[0] == "stale") is stale
    assert indexed.search_index_backlog() == 1  # rolled back: the row stays
    indexed.append("s", [Message(role="user", content="appends go on")])
    assert len(indexed.load_transcript("s")) == 3


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
@pytest.mark.parametrize("statement", ["_sqlite_search", "_sqlite_index_entries"])
def test_sqlite_fts5_out_of_memory_on_a_damaged_record_is_the_index_s_failure(
    indexed: SessionRepository, monkeypatch: pytest.MonkeyPatch, statement: str
) -> None:
    """A garbled length in a damaged FTS5 record makes SQLite fail with SQLITE_NOMEM,
    which Python's sqlite3 raises as a bare MemoryError (seen with randomised index data):
    it must come out as the index's failure, not escape the API."""
    import sessionrepo.dialects.sqlite.search as module

    def out_of_memory(*args: Any, **kwargs: Any) -> None:
        raise MemoryError

    indexed.append("s", [Message(role="user", content="hello again")])
    monkeypatch.setattr(module, statement, out_of_memory)
    with pytest.raises(SearchIndexUnavailable, match="reindex"):
        indexed.search("hello")
    assert indexed.search_index_state()[0] == "stale"
    indexed.append("s", [Message(role="user", content="appends go on")])
    assert len(indexed.load_transcript("s")) == 3


# -- the async SQLite pool: a rollback on return only when a transaction is open -------


def test_an_async_sqlite_connection_is_rolled_back_on_return_only_when_in_a_transaction(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On aiosqlite a rollback is a hop to the connection's thread: the pool does it only
    for a connection returned with its transaction open (whose writes it undoes), not
    after a one-call append that committed."""
    import asyncio

    import aiosqlite
    from sqlalchemy.util import greenlet_spawn

    from sessionrepo import open_async_repository

    rollbacks: list[bool] = []
    original = aiosqlite.Connection.rollback

    async def counted(self: aiosqlite.Connection) -> None:
        rollbacks.append(self.in_transaction)
        await original(self)

    monkeypatch.setattr(aiosqlite.Connection, "rollback", counted)

    async def main() -> None:
        repository = await open_async_repository(f"sqlite:///{tmp_path}/x.db")
        try:
            await repository.append("s", [{"role": "user", "content": "hello"}])
            rollbacks.clear()
            for index in range(3):
                await repository.append("s", [{"role": "user", "content": f"again {index}"}])
            assert rollbacks == []  # each committed in its one call: nothing to reset
            engine = repository.database.engine

            def left_open() -> None:
                pooled = engine.raw_connection()
                try:
                    cursor = pooled.cursor()
                    cursor.execute("BEGIN IMMEDIATE")
                    cursor.execute("DELETE FROM messages")
                    cursor.close()
                finally:
                    pooled.close()  # returned with the transaction open: rolled back

            await greenlet_spawn(left_open)
            assert rollbacks == [True]
            assert len(await repository.load_transcript("s")) == 4
        finally:
            await repository.close()

    asyncio.run(main())


def test_a_direct_select_binds_times_as_stored_and_keeps_percent_signs(database_url: str) -> None:
    """``select_direct``: ``:name`` parameters on both backends, a ``%`` in the SQL
    text left as it is, an aware time compared with the stored column as SQLAlchemy
    would bind it (SQLite: its text form, whatever the time's zone)."""
    repository = open_repository(database_url)
    try:
        repository.append("s", [{"role": "user", "content": "a"}])
        [stored] = repository.load_transcript("s")
        database = repository._db
        sql = (
            "SELECT seq, 'x%y' FROM messages WHERE session_id = :sid "
            "AND timestamp >= :since AND timestamp <= :until"
        )
        east = timezone(timedelta(hours=3))
        at = stored.timestamp.astimezone(east)
        for since, until, expected in (
            (at, at, [(1, "x%y")]),
            (at + timedelta(microseconds=1), at + timedelta(hours=1), []),
        ):
            params = {"sid": "s", "since": since, "until": until}
            rows = database.read_direct(
                lambda driver, params=params: database.dialect.select_direct(driver, sql, params)
            )
            assert rows is not None
            assert [tuple(row) for row in rows] == expected
    finally:
        repository.close()
