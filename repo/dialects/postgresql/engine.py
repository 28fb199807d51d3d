"""PostgreSQL's engine: psycopg 3 (its async mode for asyncio), every session in UTC, the
server's own time bounds; errors classified by SQLSTATE, described without the values
or statements their messages may quote."""

from __future__ import annotations

import math
import os
import re
import socket
from collections.abc import Sequence
from datetime import timedelta
from typing import Any, Final

import psycopg
import psycopg.errors
from sqlalchemy import (
    Connection,
    Engine,
    Insert,
    Interval,
    Select,
    Table,
    event,
    func,
    literal,
    literal_column,
    select,
    text,
)
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import URL
from sqlalchemy.sql.elements import ColumnElement

from sessionrepo.dialects.base import EngineRole, make_engine
from sessionrepo.dialects.postgresql.tenancy import TENANT_COLUMN, TENANT_TABLES, regrant
from sessionrepo.errors import BackendUnavailable, RepoError, TenantMismatch, WriteRejected

#: What the server answers a start-up ``role`` the login role is no member of.
_SET_ROLE_REFUSED: Final = "permission denied to set role"

#: Key of the PostgreSQL advisory lock held while migrating ("sessrepo" in ASCII).
MIGRATION_LOCK_KEY: Final = 0x7365737372657070 & 0x7FFFFFFFFFFFFFFF

#: A microsecond, multiplied by a count of them: exact (a timestamp counts microseconds).
_MICROSECOND: Final = literal_column("interval '1 microsecond'", Interval())


class PostgresEngine(EngineRole):
    """PostgreSQL through psycopg 3: a pool whose dead connections are replaced on use,
    every session in UTC."""

    # SQLSTATE classes and codes that describe the server's state, not the data.
    _TRANSIENT_CLASSES: Final = ("08", "53", "57", "58", "40")
    _TRANSIENT_CODES: Final = {
        "55P03",  # lock_not_available (lock_timeout)
        "55006",  # object_in_use
        "25006",  # read_only_sql_transaction (a standby, or default_transaction_read_only)
        "XX001",  # data_corrupted
        "XX002",  # index_corrupted
    }
    _REJECT_CLASSES: Final = ("22", "54")  # data_exception, program_limit_exceeded

    #: Set from the ``search_config`` engine option (the search role reads it).
    search_config: str

    def create_engine(
        self, url: URL, options: dict[str, Any], *, asynchronous: bool = False
    ) -> Engine:
        self.search_config = str(options.pop("search_config", "simple"))
        # SQLite's options: they mean nothing to a server (one URL, one set of options).
        options.pop("busy_timeout", None)
        options.pop("sqlite_synchronous", None)
        connect_args: dict[str, Any] = {"options": "-c timezone=UTC"}
        tenant = options.pop("tenant", None)
        if tenant is not None:
            # The connection acts as the tenant's role from its start (an operator's
            # too: the policies then hold it); a role that may not fails to connect.
            connect_args["options"] += f" -c role={tenant}"
        read_only = bool(options.pop("read_only", False))
        connect_timeout = options.pop("connect_timeout", 10)
        server_timeout = options.pop("server_timeout", None)
        if server_timeout is not None:
            milliseconds = max(1, int(server_timeout * 1000))
            connect_args["options"] += (
                f" -c statement_timeout={milliseconds} -c lock_timeout={milliseconds}"
            )
            seconds = max(1, math.ceil(server_timeout))
            connect_timeout = seconds if connect_timeout is None else min(connect_timeout, seconds)
        if connect_timeout is not None:
            # libpq takes whole seconds and reads 0 as "wait forever": round a fraction up.
            connect_args["connect_timeout"] = max(1, math.ceil(connect_timeout))
        # No ping before each checkout (a round trip per transaction): a dead connection
        # is detected on use and the transaction rerun (see Database._run).
        options.setdefault("pool_pre_ping", False)
        # psycopg 3 serves both: SQLAlchemy picks its async dialect for an async engine.
        engine = make_engine(url, asynchronous, connect_args=connect_args, **options)
        if read_only:
            # Every transaction is BEGIN READ ONLY: the server itself refuses any write
            # or DDL (the session's default_transaction_read_only, which doctor reports
            # as the server's, is left alone).
            @event.listens_for(engine, "connect")
            def _read_only(dbapi_connection: Any, record: Any) -> None:
                engine.dialect.set_readonly(dbapi_connection, True)  # type: ignore[attr-defined]

        return engine

    def begin_snapshot(self, connection: Connection) -> None:
        # The transaction's first statement: every later one sees its snapshot. (On
        # Citus, each worker's part: there is no distributed snapshot.)
        connection.exec_driver_sql("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")

    def insert_ignoring(self, table: Table, conflict_columns: Sequence[str]) -> Insert:
        return postgresql.insert(table).on_conflict_do_nothing(
            index_elements=list(self.unique_key(table.name, conflict_columns))
        )

    def insert_adding(
        self, table: Table, conflict_columns: Sequence[str], added: Sequence[str]
    ) -> Insert:
        statement = postgresql.insert(table)
        return statement.on_conflict_do_update(
            index_elements=list(self.unique_key(table.name, conflict_columns)),
            set_={name: table.c[name] + statement.excluded[name] for name in added},
        )

    def nearest_ranks(self, values: Select[Any], shares: Sequence[tuple[int, int]]) -> Select[Any]:
        # percentile_disc is the nearest rank: the first value whose position reaches
        # ceil(share * n) (computed in float8, as Python's math.ceil(share * n)).
        return self._ranks(values.subquery(), shares)

    @staticmethod
    def _ranks(given: Any, shares: Sequence[tuple[int, int]]) -> Select[Any]:
        return select(
            given.c.key,
            *(
                func.percentile_disc(a / b).within_group(given.c.value).label(f"p{index}")
                for index, (a, b) in enumerate(shares)
            ),
        ).group_by(given.c.key)

    def unique_key(self, table: str, columns: Sequence[str]) -> tuple[str, ...]:
        return (*columns, TENANT_COLUMN) if table in TENANT_TABLES else tuple(columns)

    def utc_day(self, value: ColumnElement[Any]) -> ColumnElement[str]:
        # Whatever the connection's TimeZone setting is.
        day: ColumnElement[str] = func.to_char(func.timezone("UTC", value), "YYYY-MM-DD")
        return day

    def activity(self, at: ColumnElement[Any], lag_us: ColumnElement[Any]) -> ColumnElement[Any]:
        result: ColumnElement[Any] = at + lag_us * _MICROSECOND
        return result

    def time_before(self, at: ColumnElement[Any], by: timedelta) -> ColumnElement[Any]:
        result: ColumnElement[Any] = at - literal(by, Interval())
        return result

    def text_after(self, value: ColumnElement[Any], part: str, length: int) -> ColumnElement[str]:
        # split_part and left() work in bytes up to the cut; substr(value, strpos(...))
        # would count characters through the whole value twice.
        result: ColumnElement[str] = func.left(func.split_part(value, part, 2), length)
        return result

    def after_migration(self, connection: Connection) -> None:
        regrant(connection)

    def lock_for_migration(self, connection: Connection) -> None:
        connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY})

    def sever(self, driver: Any) -> None:
        # Shut the socket down under libpq: the blocked read fails at once (a frozen
        # server cannot act on a cancel request, nor time out its own statement).
        descriptor = os.dup(driver.pgconn.socket)
        with socket.socket(fileno=descriptor) as connection:
            connection.shutdown(socket.SHUT_RDWR)

    def connection_lost(self, driver: Any) -> bool:
        return bool(driver.closed or driver.broken)

    def lock_outbox_session(self, connection: Connection, session_id: str) -> None:
        connection.execute(
            text("SELECT pg_advisory_xact_lock(hashtextextended(:key, 0))"),
            {"key": f"sessionrepo.outbox:{session_id}"},
        )

    @staticmethod
    def _sqlstate(exc: sa_exc.DBAPIError) -> str | None:
        return getattr(exc.orig, "sqlstate", None)

    #: SQLSTATE classes whose messages may quote a value or the statement (data
    #: exceptions: ``invalid input syntax for type integer: "..."``; syntax errors and
    #: access rules: ``syntax error at or near "..."``; PL/pgSQL's ``RAISE``): described
    #: by their condition and the objects named apart instead.
    _QUOTING_CLASSES: Final = ("22", "42", "P0")
    #: Of those, the conditions whose message names only objects and types (``relation
    #: "x" does not exist``, ``operator does not exist: timestamp with time zone > text``).
    #: Not an undefined column: any stray word of a statement reads as a column name.
    _NAMING_STATES: Final = ("42P01", "42P07", "42704", "42501", "42883", "42804")

    def describe(self, exc: sa_exc.DBAPIError) -> str:
        state = self._sqlstate(exc)
        if state is None:
            # Raised before a statement reached the server (connecting, adapting a
            # value): the driver's own words, which name neither the statement nor a value.
            return f"PostgreSQL: {' '.join(str(exc.orig).split())}"
        diag = getattr(exc.orig, "diag", None)
        primary = getattr(diag, "message_primary", None)
        if primary and (state[:2] not in self._QUOTING_CLASSES or state in self._NAMING_STATES):
            return f"PostgreSQL [{state}]: {primary}"
        # Never the message's other lines either: "LINE 1: <the statement>", "DETAIL:
        # Failing row contains (<the values>)".
        named = [
            f"{label} {value}"
            for label, value in (
                ("table", getattr(diag, "table_name", None)),
                ("column", getattr(diag, "column_name", None)),
                ("constraint", getattr(diag, "constraint_name", None)),
                ("type", getattr(diag, "datatype_name", None)),
            )
            if value
        ]
        return f"PostgreSQL [{state}]: {_condition(state)}" + (
            f" ({', '.join(named)})" if named else ""
        )

    def translate(self, exc: sa_exc.DBAPIError) -> RepoError:
        state = self._sqlstate(exc)
        detail = self.describe(exc)
        if state is None:
            # No SQLSTATE: the connection failed before the server could answer (or it
            # refused the start-up options: the tenant's ``role``).
            if _SET_ROLE_REFUSED in str(exc.orig):
                return TenantMismatch(
                    "the role this URL logs in as may not act as the tenant the store was "
                    "opened for (permission denied to set role): connect with the "
                    "tenant's own URL"
                )
            if isinstance(exc, sa_exc.OperationalError | sa_exc.InterfaceError):
                return BackendUnavailable(detail)
            return RepoError(detail)
        if state[:2] in self._TRANSIENT_CLASSES or state in self._TRANSIENT_CODES:
            return BackendUnavailable(detail, code=state)
        if state[:2] in self._REJECT_CLASSES:
            return WriteRejected(detail, code=state)
        return RepoError(detail)

    def is_retryable(self, exc: sa_exc.DBAPIError) -> bool:
        return self._sqlstate(exc) in ("40001", "40P01")

    #: An object missing or not usable as a statement needs it: undefined table,
    #: column or object (a text search configuration), a privilege taken away. Not the
    #: rest of class 42 (a syntax error, an operator for other types: the statement's
    #: own fault, or a value of the wrong type), which no rebuild of an index repairs.
    _MISSING_OBJECT: Final = ("42P01", "42703", "42704", "42501")
    _DAMAGED: Final = ("XX001", "XX002")  # data_corrupted, index_corrupted

    def is_broken_object(self, exc: sa_exc.DBAPIError) -> bool:
        state = self._sqlstate(exc)
        return state in self._MISSING_OBJECT or state in self._DAMAGED

    def is_damaged(self, exc: sa_exc.DBAPIError) -> bool:
        return self._sqlstate(exc) in self._DAMAGED


def _condition(state: str) -> str:
    """The condition a SQLSTATE names, in words (``42P01``: "undefined table")."""
    try:
        name = psycopg.errors.lookup(state).__name__
    except KeyError:
        return "error"
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", name).lower()
