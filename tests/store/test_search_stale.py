"""The search index is marked stale (for every caller, in the database) only for a
failure of the index itself, and no error, nor the stale reason stored, carries a
statement, its parameters or a user's query.

The faults are real statements on the real backends: a statement badly put together
(an undefined column in a query of the index), the index's table gone, driver errors
whose own text quotes the statement and a value.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import pytest
from sqlalchemy import Connection, bindparam, create_engine, select, text
from sqlalchemy import exc as sa_exc

from sessionrepo import Message, SessionRepository, open_repository
from sessionrepo.errors import (
    ArgumentTypeError,
    BackendUnavailable,
    RepoError,
    SearchIndexUnavailable,
)
from sessionrepo.models.tables import UTCDateTime, sessions_table

#: In every statement, parameter and query below: it must never reach an error's text.
MARKER = "zq7marker"

#: What only a statement's text has (SQLAlchemy's "[SQL: ...]", PostgreSQL's "LINE 1:").
SQL_SIGNS = ("SELECT", "INSERT", "[SQL:", "[parameters:", "LINE 1", "DETAIL")


def _assert_clean(text: str | None) -> None:
    assert text is not None
    assert MARKER not in text.lower(), text
    for sign in SQL_SIGNS:
        assert sign not in text, text


def _index_table(repo: SessionRepository) -> str:
    return "messages_fts" if repo.backend == "sqlite" else "message_search"


def test_a_failing_search_statement_that_is_not_the_index_s_fault_leaves_search_available(
    indexed: SessionRepository, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A statement of the index badly put together (as a wrong-typed value reaching SQL
    would make it): the database refuses it with the very codes a missing table gets
    (SQLITE_ERROR, PostgreSQL 42703), but the index's own probe reads fine."""
    table = _index_table(indexed)
    dialect = indexed.database.dialect

    def badly_put_together(conn: Connection, *args: Any, **kwargs: Any) -> list[Any]:
        statement = text(f"SELECT {MARKER}_column FROM {table} WHERE seq = :seq")
        conn.execute(statement, {"seq": MARKER})
        raise AssertionError("the statement was expected to fail")

    monkeypatch.setattr(dialect, "search_messages", badly_put_together)
    with pytest.raises(RepoError) as raised:
        indexed.search(f"hello {MARKER}")
    assert not isinstance(raised.value, SearchIndexUnavailable)
    cause = raised.value.__cause__
    assert isinstance(cause, sa_exc.DBAPIError)  # the fault happened, in the database
    assert dialect.is_broken_object(cause)
    assert f"{MARKER}_column" in str(cause)
    _assert_clean(str(raised.value))

    assert indexed.search_index_state() == ("ok", None)
    monkeypatch.undo()
    assert [hit.seq for hit in indexed.search("hello")] == [1]


def test_a_missing_index_table_marks_the_index_stale_with_a_reason_free_of_sql(
    indexed: SessionRepository, database_url: str
) -> None:
    table = _index_table(indexed)
    engine = create_engine(database_url)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(f"ALTER TABLE {table} RENAME TO gone_{table}")
        with pytest.raises(SearchIndexUnavailable, match="reindex") as raised:
            indexed.search(f"hello {MARKER}")
        _assert_clean(str(raised.value))
        state, reason = indexed.search_index_state()
        assert state == "stale"
        _assert_clean(reason)
        with engine.begin() as conn:
            conn.exec_driver_sql(f"ALTER TABLE gone_{table} RENAME TO {table}")
    finally:
        engine.dispose()
    # Marked in the database: every caller sees it until the rebuild.
    with open_repository(database_url) as other, pytest.raises(SearchIndexUnavailable):
        other.search("hello")
    assert indexed.reindex() == 1
    assert [hit.seq for hit in indexed.search("hello")] == [1]


def _undefined_column(conn: Connection) -> None:
    conn.execute(text(f"SELECT {MARKER}_column FROM sessions WHERE id = :p"), {"p": MARKER})


def _value_refused_by_a_check(conn: Connection) -> None:
    # PostgreSQL's text adds "DETAIL: Failing row contains (<the value>)".
    conn.exec_driver_sql(
        f"CREATE TEMP TABLE t_checked (a TEXT CONSTRAINT ck_t CHECK (a <> '{MARKER}'))"
    )
    conn.exec_driver_sql(f"INSERT INTO t_checked VALUES ('{MARKER}')")


def _value_a_type_refuses(conn: Connection) -> None:
    # Refused by the column type before the driver: SQLAlchemy's text has the statement
    # and the parameters.
    when = bindparam("when", type_=UTCDateTime())
    conn.execute(
        select(sessions_table.c.id).where(sessions_table.c.started_at > when), {"when": MARKER}
    )


@pytest.mark.parametrize(
    "fault", [_undefined_column, _value_refused_by_a_check, _value_a_type_refuses]
)
def test_errors_carry_no_statement_parameters_or_values(database_url: str, fault: Any) -> None:
    with open_repository(database_url) as repo:
        with pytest.raises(RepoError) as raised:
            repo.database.write(fault)
        cause = raised.value.__cause__
        assert cause is not None
        assert MARKER in str(cause)  # the driver's (or SQLAlchemy's) text has it
        _assert_clean(str(raised.value))


def test_a_wrong_typed_filter_is_refused_before_sql_and_search_stays_available(
    indexed: SessionRepository,
) -> None:
    """The reported case: ``until="2020-01-01"`` once failed inside SQLAlchemy, was taken
    for a broken index, and disabled search for every process until a reindex."""
    for _ in range(2):
        with pytest.raises(ArgumentTypeError, match="until"):
            indexed.search("hello", until="2020-01-01")  # type: ignore[arg-type]
    assert indexed.search_index_state() == ("ok", None)
    assert [hit.seq for hit in indexed.search("hello")] == [1]


class _DriverError(Exception):
    """A driver error as both backends' drivers describe theirs (their code attributes)."""

    def __init__(self, text: str, *, sqlite_code: int, sqlstate: str) -> None:
        super().__init__(text)
        self.sqlite_errorcode = sqlite_code
        self.sqlite_errorname = f"code {sqlite_code}"
        self.sqlstate = sqlstate


def _outage(*args: Any, **kwargs: Any) -> None:
    """An outage inside the index's statement, its transaction alive (SQLite: the disk
    full; PostgreSQL: the statement timed out), its text naming the index."""
    orig = _DriverError(
        "out of room for messages_fts message_search",
        sqlite_code=sqlite3.SQLITE_FULL,
        sqlstate="57014",
    )
    raise sa_exc.OperationalError(f"INSERT INTO message_search {MARKER}", {}, orig)


def test_an_outage_while_catching_up_keeps_the_backlog_and_the_index_ok(
    indexed: SessionRepository, monkeypatch: pytest.MonkeyPatch
) -> None:
    indexed.append("s", [Message(role="user", content="hello again")])
    monkeypatch.setattr(indexed.database.dialect, "index_entries", _outage)
    with pytest.raises(BackendUnavailable) as raised:
        indexed.catch_up_search_index()
    assert isinstance(raised.value.__cause__, sa_exc.OperationalError)  # the injected one
    _assert_clean(str(raised.value))
    assert indexed.search_index_state() == ("ok", None)
    assert indexed.search_index_backlog() == 1  # rolled back: indexed by the next round
    monkeypatch.undo()
    assert sorted(hit.seq for hit in indexed.search("hello")) == [1, 2]


def test_an_outage_while_indexing_an_append_fails_the_append_not_the_index(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with open_repository(database_url, search_index="immediate") as repo:
        repo.append("s", [Message(role="user", content="hello there")])
        monkeypatch.setattr(repo.database.dialect, "index_documents", _outage)
        with pytest.raises(BackendUnavailable) as raised:  # a writer parks it
            repo.append("s", [Message(role="user", content="hello again")])
        assert isinstance(raised.value.__cause__, sa_exc.OperationalError)
        assert len(repo.load_transcript("s")) == 1
        assert repo.search_index_state() == ("ok", None)
        monkeypatch.undo()
        repo.append("s", [Message(role="user", content="hello again")])
        assert sorted(hit.seq for hit in repo.search("hello")) == [1, 2]
