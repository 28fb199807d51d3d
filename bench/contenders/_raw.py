"""The yardstick: the raw driver, one ``executemany`` per call, committed.

Table: the same keys as sessionrepo's ``messages`` (``PRIMARY KEY (session_id, seq)``,
``UNIQUE (session_id, client_msg_uuid)``, a foreign key to ``sessions``) and the columns a
transcript needs. Each call turns the dicts into row tuples (``tool_calls`` as JSON text),
runs ``INSERT ... ON CONFLICT (session_id, client_msg_uuid) DO NOTHING`` through
``executemany`` and commits. On PostgreSQL that is **3 round trips** per 1-message call:
psycopg's implicit ``BEGIN`` (a round trip of its own), the ``INSERT`` (``executemany``
pipelines its rows: one round trip for any number), ``COMMIT``; on SQLite 3 statements
(``BEGIN``, the ``INSERT`` per row, ``COMMIT``). ``python -m bench.profile --budget`` counts
them from the driver's trace. ``RawAutocommit`` is the same rows in one autocommit
statement: 1 round trip. It keeps ``seq`` in
the process, moves no counters and reports nothing about which rows were new: that is the
work sessionrepo does on top.

Load: ``SELECT`` in ``seq`` order and decode each row to a dict (JSON parsed, the key as a
string, the timestamp as a datetime). List: the same query sessionrepo runs (newest
activity first, with the first user message as a preview).
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import psycopg

from bench.contenders.base import (
    Call,
    Contender,
    Message,
    seed_count,
    sqlite_pragmas,
    timed,
    timed_calls,
)

_PG_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    id varchar(255) PRIMARY KEY,
    source varchar(255) NOT NULL,
    user_id varchar(255),
    title text,
    started_at timestamptz NOT NULL,
    last_active_at timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS ix_sessions_last_active_at_id ON sessions (last_active_at, id);
CREATE TABLE IF NOT EXISTS messages (
    session_id varchar(255) NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    seq bigint NOT NULL,
    client_msg_uuid uuid NOT NULL,
    role varchar(16) NOT NULL,
    content text,
    tool_calls text,
    tool_call_id varchar(255),
    "timestamp" timestamptz NOT NULL,
    PRIMARY KEY (session_id, seq),
    UNIQUE (session_id, client_msg_uuid)
);
"""

_SQLITE_SCHEMA = _PG_SCHEMA.replace("timestamptz", "TEXT").replace("uuid NOT NULL", "TEXT NOT NULL")

_PG_INSERT = """
INSERT INTO messages (session_id, seq, client_msg_uuid, role, content, tool_calls,
    tool_call_id, "timestamp")
VALUES (%s, %s, %s, %s, %s, %s, %s, %s)
ON CONFLICT (session_id, client_msg_uuid) DO NOTHING
"""
_SQLITE_INSERT = _PG_INSERT.replace("%s", "?")

_SELECT = """
SELECT client_msg_uuid, role, content, tool_calls, tool_call_id, "timestamp"
FROM messages WHERE session_id = %s ORDER BY seq
"""

_LIST = """
SELECT s.id, s.source, s.user_id, s.title, s.started_at, s.last_active_at,
    (SELECT substr(m.content, 1, 121) FROM messages m
     WHERE m.session_id = s.id AND m.role = 'user' ORDER BY m.seq LIMIT 1) AS preview
FROM sessions s
ORDER BY s.last_active_at DESC, s.id DESC
LIMIT %s
"""

_PG_SEED = """
INSERT INTO sessions (id, source, user_id, started_at, last_active_at)
SELECT 'listed-' || g, 'bench', 'user-' || (g %% 1000),
    now() - g * interval '1 second', now() - g * interval '1 second'
FROM generate_series(1, %(count)s) AS g;
INSERT INTO messages (session_id, seq, client_msg_uuid, role, content, "timestamp")
SELECT 'listed-' || g, 1, gen_random_uuid(), 'user', 'question number ' || g, now()
FROM generate_series(1, %(count)s) AS g;
ANALYZE sessions; ANALYZE messages;
"""

_SQLITE_SEED = """
WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < {count})
INSERT INTO sessions (id, source, user_id, started_at, last_active_at)
SELECT 'listed-' || n, 'bench', 'user-' || (n % 1000),
    strftime('%Y-%m-%dT%H:%M:%S', 'now', '-' || n || ' seconds') || '.000000+00:00',
    strftime('%Y-%m-%dT%H:%M:%S', 'now', '-' || n || ' seconds') || '.000000+00:00'
FROM g;
WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < {count})
INSERT INTO messages (session_id, seq, client_msg_uuid, role, content, "timestamp")
SELECT 'listed-' || n, 1, lower(hex(randomblob(16))), 'user', 'question number ' || n,
    strftime('%Y-%m-%dT%H:%M:%S', 'now') || '.000000+00:00'
FROM g;
ANALYZE;
"""


def _content(value: Any) -> str | None:
    return value if value is None or type(value) is str else json.dumps(value)


class Raw(Contender):
    key = "raw"
    label = "raw driver"
    packages = ("psycopg",)
    usage = (
        "psycopg 3 / sqlite3: `executemany` of `INSERT … ON CONFLICT (session_id, "
        "client_msg_uuid) DO NOTHING` into a table with sessionrepo's keys, one commit per "
        "call: on PostgreSQL 3 round trips per call (psycopg's implicit `BEGIN`, the "
        "pipelined `INSERT`, `COMMIT`), on SQLite 3 statements; `seq` kept in the process; "
        "load = `SELECT` + decode to dicts. The ratio of every cell is to this one"
    )

    keys_sql = (
        "SELECT session_id, client_msg_uuid FROM messages WHERE session_id IN ({sessions}) "
        "ORDER BY session_id, seq"
    )

    def __init__(self, target: Any) -> None:
        super().__init__(target)
        self.sqlite = target.backend == "sqlite"
        self._next_seq: dict[str, int] = {}

    def open(self) -> None:
        if self.sqlite:
            self.connection: Any = sqlite3.connect(
                self.target.location, isolation_level=None, timeout=30
            )
            self.connection.executescript(_SQLITE_SCHEMA)
            self.insert = _SQLITE_INSERT
        else:
            self.connection = psycopg.connect(self.target.location)
            with self.connection.cursor() as cursor:
                cursor.execute(_PG_SCHEMA)
            self.connection.commit()
            self.insert = _PG_INSERT

    def settings(self) -> dict[str, Any]:
        if self.sqlite:
            return sqlite_pragmas(self.connection) | {"driver": f"sqlite3 {sqlite3.sqlite_version}"}
        with self.connection.cursor() as cursor:
            level = cursor.execute("SHOW synchronous_commit").fetchone()[0]
        self.connection.commit()
        return {"synchronous_commit": level, "driver": f"psycopg {psycopg.__version__}"}

    def _begin(self) -> None:
        if self.sqlite:
            self.connection.execute("BEGIN")

    def _commit(self) -> None:
        if self.sqlite:
            self.connection.execute("COMMIT")
        else:
            self.connection.commit()

    def create_sessions(self, session_ids: Sequence[str]) -> None:
        now = datetime.now(UTC)
        stamp: Any = now.isoformat() if self.sqlite else now
        sql = (
            "INSERT INTO sessions (id, source, started_at, last_active_at) VALUES (%s, %s, %s, %s)"
        )
        if self.sqlite:
            sql = sql.replace("%s", "?")
        self._begin()
        with contextlib.closing(self.connection.cursor()) as cursor:
            cursor.executemany(sql, [(sid, "bench", stamp, stamp) for sid in session_ids])
        self._commit()

    def _rows(self, session_id: str, messages: list[Message]) -> list[tuple[Any, ...]]:
        now = datetime.now(UTC)
        stamp: Any = now.isoformat() if self.sqlite else now
        seq = self._next_seq.get(session_id, 1)
        self._next_seq[session_id] = seq + len(messages)
        rows = []
        for index, message in enumerate(messages):
            tool_calls = message.get("tool_calls")
            key = message["client_msg_uuid"]
            rows.append(
                (
                    session_id,
                    seq + index,
                    key if self.sqlite else uuid.UUID(key),
                    message["role"],
                    _content(message.get("content")),
                    None if tool_calls is None else json.dumps(tool_calls),
                    message.get("tool_call_id"),
                    stamp,
                )
            )
        return rows

    def _write(self, session_id: str, messages: list[Message]) -> int:
        rows = self._rows(session_id, messages)
        self._begin()
        with contextlib.closing(self.connection.cursor()) as cursor:
            cursor.executemany(self.insert, rows)
        self._commit()
        return 0

    def flush(self, calls: Sequence[Call], cap: float) -> dict[str, Any]:
        return timed_calls(calls, cap, self._write)

    def seed_transcript(self, session_id: str, messages: list[Message]) -> None:
        for start in range(0, len(messages), 1000):
            self._write(session_id, messages[start : start + 1000])

    def _select(self, session_id: str) -> list[dict[str, Any]]:
        if self.sqlite:
            rows = self.connection.execute(_SELECT.replace("%s", "?"), (session_id,)).fetchall()
        else:
            with self.connection.cursor() as cursor:
                rows = cursor.execute(_SELECT, (session_id,)).fetchall()
            self.connection.commit()
        decoded = []
        for key, role, content, tool_calls, tool_call_id, stamp in rows:
            message: dict[str, Any] = {"role": role, "content": content}
            if tool_calls is not None:
                message["tool_calls"] = json.loads(tool_calls)
            if tool_call_id is not None:
                message["tool_call_id"] = tool_call_id
            message["client_msg_uuid"] = str(key)
            message["timestamp"] = datetime.fromisoformat(stamp) if self.sqlite else stamp
            decoded.append(message)
        return decoded

    def load(self, session_id: str) -> dict[str, Any]:
        messages, seconds = timed(lambda: self._select(session_id))
        return {"messages": len(messages), "seconds": seconds}

    def seed_listing(self, total: int) -> int:
        count = seed_count(self.target, "sessions", total)
        if not count:
            return 0
        if self.sqlite:
            self.connection.executescript(_SQLITE_SEED.format(count=int(count)))
        else:
            with self.connection.cursor() as cursor:
                for statement in _PG_SEED.split(";"):
                    if statement.strip():
                        cursor.execute(statement, {"count": count})
            self.connection.commit()
        return count

    def _list(self, limit: int) -> list[Any]:
        if self.sqlite:
            rows: list[Any] = self.connection.execute(_LIST.replace("%s", "?"), (limit,)).fetchall()
            return rows
        with self.connection.cursor() as cursor:
            rows = cursor.execute(_LIST, (limit,)).fetchall()
        self.connection.commit()
        return rows

    def list_newest(self, limit: int) -> dict[str, Any]:
        rows, seconds = timed(lambda: self._list(limit))
        return {"sessions": len(rows), "seconds": seconds}

    def close(self) -> None:
        self.connection.close()


_PG_UNNEST = """
INSERT INTO messages (session_id, seq, client_msg_uuid, role, content, tool_calls,
    tool_call_id, "timestamp")
SELECT %s, s, k, r, c, t, i, %s
FROM unnest(%s::bigint[], %s::uuid[], %s::text[], %s::text[], %s::text[], %s::text[])
    AS u(s, k, r, c, t, i)
ON CONFLICT (session_id, client_msg_uuid) DO NOTHING
"""
_SQLITE_COLUMNS = (
    "INSERT INTO messages (session_id, seq, client_msg_uuid, role, content, tool_calls, "
    'tool_call_id, "timestamp") VALUES '
)
#: Rows per SQLite statement (8 parameters each, under SQLite's 32,766).
_SQLITE_ROWS = 999


class RawAutocommit(Raw):
    """The same table and rows, each call **one statement** in autocommit: PostgreSQL an
    ``INSERT … SELECT … FROM unnest(arrays)`` (one round trip, its implicit transaction
    committed by the server: no ``BEGIN``, no ``COMMIT``); SQLite one multi-row ``INSERT``
    with no ``BEGIN``/``COMMIT`` statements (a call over 999 rows is split, inside one
    ``BEGIN``)."""

    key = "raw-autocommit"
    label = "raw, one autocommit statement"
    usage = (
        "the same rows as raw in one autocommit statement per call: PostgreSQL `INSERT … "
        "SELECT … FROM unnest(arrays) ON CONFLICT DO NOTHING` (1 round trip), SQLite one "
        "multi-row `INSERT … ON CONFLICT DO NOTHING` (no BEGIN/COMMIT statement)"
    )

    def open(self) -> None:
        super().open()
        if not self.sqlite:
            self.connection.autocommit = True

    def _write(self, session_id: str, messages: list[Message]) -> int:
        rows = self._rows(session_id, messages)
        if self.sqlite:
            chunks = [
                rows[start : start + _SQLITE_ROWS] for start in range(0, len(rows), _SQLITE_ROWS)
            ]
            if len(chunks) > 1:
                self.connection.execute("BEGIN")
            for chunk in chunks:
                sql = (
                    _SQLITE_COLUMNS
                    + ", ".join(["(?, ?, ?, ?, ?, ?, ?, ?)"] * len(chunk))
                    + " ON CONFLICT (session_id, client_msg_uuid) DO NOTHING"
                )
                self.connection.execute(sql, [value for row in chunk for value in row])
            if len(chunks) > 1:
                self.connection.execute("COMMIT")
            return 0
        columns = list(zip(*rows, strict=True))
        self.connection.execute(
            _PG_UNNEST,
            (
                session_id,
                rows[0][7],
                list(columns[1]),
                list(columns[2]),
                list(columns[3]),
                list(columns[4]),
                list(columns[5]),
                list(columns[6]),
            ),
        )
        return 0
