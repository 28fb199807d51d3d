"""Builders that *make* Hermes gateway homes for the importer's tests.

A Hermes home is a ``state.db`` (SQLite, schema version 2 for old installs, 31 for
current ones) plus a ``pending_messages/`` spool of JSON files and, for a multi-profile
user, ``profiles/<name>/`` homes; the formats are described in ``hermes-state-format.md``.
:class:`HermesDB` creates a database with the column set of a version (31: every column,
the FTS triggers, the ``display_order`` trigger, a BLOB ``display_identity``, a uid on
every row) and records every row it inserts, so a test can check that each one arrived
with every column. :class:`Spool` writes the four payload kinds. :func:`hermes_view` is
what Hermes' own reader presents of a session, :func:`hermes_restart` what Hermes does
with its spool when it starts, :func:`kill_a_writing_gateway` leaves the WAL of a killed
gateway behind. :func:`build_modern_home` and :func:`build_v2_state_db` put together the
scenarios the tests import.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sqlite3
import subprocess
import sys
import textwrap
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

#: Columns of Hermes' schema version 2.
V2_SESSIONS = """
CREATE TABLE sessions (
    id TEXT PRIMARY KEY,
    source TEXT NOT NULL,
    user_id TEXT,
    model TEXT,
    model_config TEXT,
    system_prompt TEXT,
    parent_session_id TEXT,
    started_at REAL NOT NULL,
    ended_at REAL,
    end_reason TEXT,
    message_count INTEGER DEFAULT 0,
    tool_call_count INTEGER DEFAULT 0,
    input_tokens INTEGER DEFAULT 0,
    output_tokens INTEGER DEFAULT 0,
    FOREIGN KEY (parent_session_id) REFERENCES sessions(id)
)"""
V2_MESSAGES = """
CREATE TABLE messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT NOT NULL REFERENCES sessions(id),
    role TEXT NOT NULL,
    content TEXT,
    tool_call_id TEXT,
    tool_calls TEXT,
    tool_name TEXT,
    timestamp REAL NOT NULL,
    token_count INTEGER,
    finish_reason TEXT
)"""

#: Columns later versions added (the importer must not assume any of them).
MODERN_SESSION_COLUMNS = (
    "title TEXT",
    "title_source TEXT",
    "cache_read_tokens INTEGER DEFAULT 0",
    "cache_write_tokens INTEGER DEFAULT 0",
    "reasoning_tokens INTEGER DEFAULT 0",
    "api_call_count INTEGER DEFAULT 0",
    "estimated_cost_usd REAL",
    "actual_cost_usd REAL",
    "billing_provider TEXT",
    "session_key TEXT",
    "chat_id TEXT",
    "chat_type TEXT",
    "thread_id TEXT",
    "display_name TEXT",
    "profile_name TEXT",
    "cwd TEXT",
    "git_branch TEXT",
    "archived INTEGER NOT NULL DEFAULT 0",
    "pinned INTEGER NOT NULL DEFAULT 0",
    "hidden INTEGER NOT NULL DEFAULT 0",
    "last_activity_at REAL",
    "system_prompt_hash TEXT",
    # A column no Hermes version documented yet: it must land in metadata too.
    "zz_future_flag TEXT",
)
MODERN_MESSAGE_COLUMNS = (
    "reasoning TEXT",
    "reasoning_content TEXT",
    "reasoning_details TEXT",
    "codex_reasoning_items TEXT",
    "codex_message_items TEXT",
    "platform_message_id TEXT",
    "observed INTEGER",
    "active INTEGER NOT NULL DEFAULT 1",
    "compacted INTEGER NOT NULL DEFAULT 0",
    "api_content TEXT",
    "display_kind TEXT",
    "display_metadata TEXT",
    "message_uid TEXT",
    "_compressed_summary INTEGER NOT NULL DEFAULT 0",
)
#: What version 31 added on top (with ``sessions.auto_archived``).
V31_MESSAGE_COLUMNS = (
    "display_identity BLOB",
    "display_order INTEGER",
    "effect_disposition TEXT",
    "absorbed_message_uids TEXT",
    "tool_call_uids TEXT",
    "tool_call_uid TEXT",
)
V31_TABLES = """
CREATE TRIGGER messages_display_order AFTER INSERT ON messages
WHEN new.display_order IS NULL BEGIN
    UPDATE messages SET display_order = new.id WHERE id = new.id;
END;
CREATE TABLE gateway_routing (session_key TEXT PRIMARY KEY, session_id TEXT NOT NULL);
CREATE TABLE async_delegations (
    delegation_id TEXT PRIMARY KEY,
    origin_session TEXT NOT NULL,
    origin_ui_session_id TEXT NOT NULL DEFAULT '',
    parent_session_id TEXT,
    state TEXT NOT NULL,
    dispatched_at REAL NOT NULL,
    completed_at REAL,
    updated_at REAL NOT NULL,
    event_json TEXT,
    result_json TEXT,
    delivery_state TEXT NOT NULL DEFAULT 'pending',
    delivery_attempts INTEGER NOT NULL DEFAULT 0,
    delivered_at REAL,
    owner_pid INTEGER,
    owner_started_at INTEGER,
    task_json TEXT,
    delivery_claim TEXT,
    delivery_claimed_at REAL
);
CREATE TABLE session_model_usage (session_id TEXT, model TEXT, input_tokens INTEGER);
"""
FTS = """
CREATE VIRTUAL TABLE messages_fts USING fts5(content, content=messages, content_rowid=id);
CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages BEGIN
    INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content);
END;
CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages BEGIN
    INSERT INTO messages_fts(messages_fts, rowid, content) VALUES ('delete', old.id, old.content);
END;
CREATE TRIGGER messages_fts_update AFTER UPDATE OF content ON messages BEGIN
    INSERT INTO messages_fts(messages_fts, rowid, content) VALUES ('delete', old.id, old.content);
    INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content);
END;
"""

JSON_MARK = "\x00json:"


def uid() -> str:
    """A Hermes ``message_uid``: a uuid4 hex string."""
    return uuid.uuid4().hex


def encode_content(content: Any) -> Any:
    """``content`` as Hermes stores it: lists and dicts as ``"\\x00json:"`` + JSON."""
    if isinstance(content, list | dict):
        return JSON_MARK + json.dumps(content)
    return content


class HermesDB:
    """A Hermes ``state.db`` made for a test, recording every row it inserts.

    Args:
        path: the file to create.
        version: 2 (the old column set), 30 (extra columns, an FTS index and a
            ``system_prompts`` table) or 31 (today's: the identity columns too, a
            ``message_uid`` on every row unless one is given as ``None``).
        wal: put the database in WAL mode, as a running gateway does.
    """

    def __init__(self, path: Path, *, version: int = 31, wal: bool = True) -> None:
        self.path = path
        self.version = version
        self.conn = sqlite3.connect(path, isolation_level=None)
        # Rows a test writes with invalid UTF-8 must still read back.
        self.conn.text_factory = lambda data: data.decode("utf-8", "surrogateescape")
        if wal:
            self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
        self.conn.execute("INSERT INTO schema_version VALUES (?)", (version,))
        self.conn.execute(V2_SESSIONS)
        self.conn.execute(V2_MESSAGES)
        if version > 2:
            for column in MODERN_SESSION_COLUMNS:
                self.conn.execute(f"ALTER TABLE sessions ADD COLUMN {column}")
            for column in MODERN_MESSAGE_COLUMNS:
                self.conn.execute(f"ALTER TABLE messages ADD COLUMN {column}")
            self.conn.execute("CREATE TABLE system_prompts (hash TEXT PRIMARY KEY, prompt TEXT)")
            self.conn.executescript(FTS)
            self.conn.execute("CREATE TABLE state_meta (key TEXT PRIMARY KEY, value TEXT)")
        if version >= 31:
            self.conn.execute(
                "ALTER TABLE sessions ADD COLUMN auto_archived INTEGER NOT NULL DEFAULT 0"
            )
            for column in V31_MESSAGE_COLUMNS:
                self.conn.execute(f"ALTER TABLE messages ADD COLUMN {column}")
            self.conn.executescript(V31_TABLES)
        self.conn.execute("CREATE INDEX idx_messages_session ON messages(session_id, timestamp)")
        self.clock = 1_735_722_000.123456
        #: Every inserted messages row, as read back from the database (``id`` included).
        self.rows: list[dict[str, Any]] = []
        self.sessions: dict[str, dict[str, Any]] = {}

    def tick(self, seconds: float = 1.25) -> float:
        self.clock += seconds
        return self.clock

    def system_prompt(self, prompt: str) -> str:
        digest = hashlib.sha256(prompt.encode()).hexdigest()
        self.conn.execute("INSERT OR IGNORE INTO system_prompts VALUES (?, ?)", (digest, prompt))
        return digest

    def session(self, session_id: str, **columns: Any) -> str:
        values = {"id": session_id, "source": "cli", "started_at": self.tick()} | columns
        self._insert("sessions", values)
        self.sessions[session_id] = self._read("sessions", "id", session_id)
        return session_id

    def message(self, session_id: str, role: str, content: Any = None, **columns: Any) -> int:
        """Insert a messages row; lists and dicts in ``content`` / ``tool_calls`` /
        ``*_metadata`` are stored as Hermes stores them. Returns the row id."""
        values: dict[str, Any] = {
            "session_id": session_id,
            "role": role,
            "content": encode_content(content),
            "timestamp": columns.pop("timestamp", None) or self.tick(),
        }
        if self.version >= 31:
            columns.setdefault("message_uid", uid())
        for name, value in columns.items():
            values[name] = json.dumps(value) if isinstance(value, list | dict) else value
        if self.version >= 31:
            values["display_identity"] = display_identity(values)
        row_id = self._insert("messages", values)
        self.rows.append(self._read("messages", "id", row_id))
        return row_id

    def execute(self, sql: str, *params: Any) -> None:
        self.conn.execute(sql, params)

    def refresh(self) -> None:
        """Read the recorded rows again (after a test changed them with ``execute``)."""
        self.rows = [self._read("messages", "id", row["id"]) for row in self.rows]
        self.sessions = {sid: self._read("sessions", "id", sid) for sid in self.sessions}

    def raw_message(self, session_id: str, role: str, content_sql: str) -> int:
        """Insert a row whose content is an SQL expression (e.g. invalid UTF-8 bytes)."""
        cursor = self.conn.execute(
            "INSERT INTO messages (session_id, role, content, timestamp) "
            f"VALUES (?, ?, {content_sql}, ?)",
            (session_id, role, self.tick()),
        )
        assert cursor.lastrowid is not None
        self.rows.append(self._read("messages", "id", cursor.lastrowid))
        return cursor.lastrowid

    def close(self) -> None:
        self.conn.close()

    def _insert(self, table: str, values: dict[str, Any]) -> int:
        names = ", ".join(values)
        marks = ", ".join("?" for _ in values)
        cursor = self.conn.execute(
            f"INSERT INTO {table} ({names}) VALUES ({marks})", tuple(values.values())
        )
        assert cursor.lastrowid is not None
        return cursor.lastrowid

    def _read(self, table: str, key: str, value: Any) -> dict[str, Any]:
        cursor = self.conn.execute(f"SELECT * FROM {table} WHERE {key} = ?", (value,))
        names = [description[0] for description in cursor.description]
        return dict(zip(names, cursor.fetchone(), strict=True))


def display_identity(values: dict[str, Any]) -> bytes:
    """The BLOB the Hermes UI derives from role, content, timestamp and tool fields."""
    parts = [values.get(name) for name in ("role", "content", "timestamp", "tool_call_id")]
    return hashlib.blake2b(repr(parts).encode(), digest_size=16).digest()


def decoded(content: Any) -> Any:
    if isinstance(content, str) and content.startswith(JSON_MARK):
        return json.loads(content[len(JSON_MARK) :])
    return content


def hermes_view(db_path: Path, session_id: str) -> list[dict[str, Any]]:
    """What Hermes' own reader presents of a session: its live rows (``active = 1``, no
    ``session_meta``, nothing ``hidden``) in ``id`` order, content decoded, as the
    fields a conversation has."""
    conn = sqlite3.connect(f"{db_path.as_uri()}?mode=ro", uri=True)
    conn.text_factory = lambda data: data.decode("utf-8", "surrogateescape")
    try:
        columns = {row[1] for row in conn.execute("PRAGMA table_info(messages)")}
        where = "session_id = ?"
        if "active" in columns:
            where += " AND active = 1"
        where += " AND role != 'session_meta'"
        if "display_kind" in columns:
            where += " AND coalesce(display_kind, '') != 'hidden'"
        cursor = conn.execute(f"SELECT * FROM messages WHERE {where} ORDER BY id", (session_id,))
        names = [d[0] for d in cursor.description]
        rows = [dict(zip(names, row, strict=True)) for row in cursor]
    finally:
        conn.close()
    return [conversation(row) for row in rows]


def conversation(row: dict[str, Any]) -> dict[str, Any]:
    """The conversation fields of a row (or a stored message's ``to_openai`` dict, whose
    ``timestamp`` the caller sets)."""
    calls = row.get("tool_calls")
    if isinstance(calls, str):
        with contextlib.suppress(ValueError):  # else Hermes keeps what it was given
            calls = json.loads(calls)
    when = row.get("timestamp")
    return {
        "role": row["role"],
        "content": decoded(row.get("content")),
        "tool_calls": calls,
        "tool_call_id": row.get("tool_call_id"),
        "timestamp": datetime.fromtimestamp(when, UTC) if isinstance(when, int | float) else when,
    }


def hermes_restart(home: Path) -> list[str]:
    """What Hermes does with its spool when it starts: kinds 1 and 2 become ``user`` rows
    (``timestamp = ts``) of ``data.session_id``, else the session ``session_key`` routes
    to, followed to the tip of its compression chain; kind 3 is appended to
    ``data.session_id`` with the whole message dict (the columns Hermes has: a
    ``client_msg_uuid`` key is not one); in ``(ts, seq, file)`` order; each file is
    deleted once its row is in. From version 31 every row has a uid: a replayed message
    keeps its own, one without gets a fresh one. Kind 4, ``.bad`` and unreadable files
    stay. Returns the names of the files it replayed."""
    spool = home / "pending_messages"
    conn = sqlite3.connect(home / "state.db", isolation_level=None)
    (version,) = conn.execute("SELECT max(version) FROM schema_version").fetchone()
    replay = []
    for path in sorted(spool.glob("pending-*.json")):
        try:
            payload = json.loads(path.read_bytes().decode("utf-8-sig"))
        except ValueError:
            continue
        if not isinstance(payload, dict) or not isinstance(payload.get("data"), dict):
            continue
        data = payload["data"]
        if payload.get("reason") == "transcript_cap_drop":
            target = data.get("session_id") or payload.get("session_key")
            message = dict(data["message"])
        elif "text" in data:
            target = data.get("session_id") or _route(conn, payload.get("session_key"))
            target = _tip(conn, target)
            message = {"role": "user", "content": data["text"], "timestamp": payload["ts"]}
        else:
            continue
        order = (payload.get("ts"), payload.get("seq", -1), path.name)
        replay.append((order, path, target, message, payload))
    replay.sort(key=lambda entry: entry[0])
    for _, path, target, message, payload in replay:
        stamp = message.get("timestamp")
        values = {
            "session_id": target,
            "role": message["role"],
            "content": encode_content(message.get("content")),
            "timestamp": stamp if isinstance(stamp, int | float) else payload["ts"],
            "tool_calls": json.dumps(message["tool_calls"]) if message.get("tool_calls") else None,
            "tool_call_id": message.get("tool_call_id"),
            "tool_name": message.get("name"),
            "reasoning": message.get("reasoning"),
            "finish_reason": message.get("finish_reason"),
            "message_uid": message.get("message_uid") or (uid() if version >= 31 else None),
        }
        values["display_identity"] = display_identity(values)
        columns = {row[1] for row in conn.execute("PRAGMA table_info(messages)")}
        values = {name: value for name, value in values.items() if name in columns}
        names = ", ".join(values)
        marks = ", ".join("?" for _ in values)
        conn.execute(f"INSERT INTO messages ({names}) VALUES ({marks})", tuple(values.values()))
        path.unlink()
    conn.close()
    return [path.name for _, path, _, _, _ in replay]


def _route(conn: sqlite3.Connection, session_key: str) -> str:
    tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master")}
    row = None
    if "gateway_routing" in tables:
        row = conn.execute(
            "SELECT session_id FROM gateway_routing WHERE session_key = ?", (session_key,)
        ).fetchone()
    if row is None:
        row = conn.execute(
            "SELECT id FROM sessions WHERE session_key = ? ORDER BY started_at DESC LIMIT 1",
            (session_key,),
        ).fetchone()
    return str(row[0])


def _tip(conn: sqlite3.Connection, session_id: str) -> str:
    while True:
        row = conn.execute(
            "SELECT id FROM sessions WHERE parent_session_id = ? ORDER BY started_at DESC LIMIT 1",
            (session_id,),
        ).fetchone()
        if row is None:
            return session_id
        session_id = row[0]


def kill_a_writing_gateway(db_path: Path, session_id: str, contents: list[str]) -> None:
    """A gateway process that writes rows to ``session_id`` and is killed (SIGKILL) before
    any checkpoint: the rows are only in ``state.db-wal``, beside its ``-shm``."""
    script = textwrap.dedent(
        """
        import json, os, signal, sqlite3, sys, time, uuid
        path, session_id, contents = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA wal_autocheckpoint=0")
        for text in contents:
            conn.execute(
                "INSERT INTO messages (session_id, role, content, timestamp, message_uid) "
                "VALUES (?, 'assistant', ?, ?, ?)",
                (session_id, text, time.time(), uuid.uuid4().hex),
            )
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(db_path), session_id, json.dumps(contents)],
        check=False,
    )
    assert done.returncode == -9, done


class Spool:
    """A ``pending_messages/`` folder; each payload in its own ``pending-<hex>.json``."""

    def __init__(self, home: Path) -> None:
        self.path = home / "pending_messages"
        self.path.mkdir(mode=0o700, exist_ok=True)

    def write(self, payload: Any, name: str | None = None, *, bom: bool = False) -> str:
        """As Hermes writes one: ``indent=2``, ``ensure_ascii=False``."""
        name = name or f"pending-{uuid.uuid4().hex}.json"
        data = json.dumps(payload, indent=2, ensure_ascii=False).encode()
        self.raw(name, (b"\xef\xbb\xbf" if bom else b"") + data)
        return name

    def raw(self, name: str, data: bytes) -> str:
        path = self.path / name
        path.write_bytes(data)
        os.chmod(path, 0o600)
        return name

    def shutdown_pending(
        self, session_key: str, text: str, ts: int, *, reason: str = "shutdown", **data: Any
    ) -> str:
        """Kind 1."""
        return self.write(
            {"session_key": session_key, "reason": reason, "ts": ts, "data": {"text": text} | data}
        )

    def overflow_tail(self, session_key: str, text: str, ts: int, seq: int, **data: Any) -> str:
        """Kind 2."""
        return self.write(
            {
                "session_key": session_key,
                "reason": "adapter_shutdown",
                "ts": ts,
                "seq": seq,
                "data": {"text": text} | data,
            }
        )

    def cap_drop(
        self,
        session_id: str,
        message: dict[str, Any],
        ts: int,
        seq: int,
        name: str | None = None,
        *,
        bom: bool = False,
    ) -> str:
        """Kind 3."""
        return self.write(
            {
                "session_key": session_id,
                "reason": "transcript_cap_drop",
                "ts": ts,
                "seq": seq,
                "data": {"session_id": session_id, "message": message},
            },
            name,
            bom=bom,
        )

    def history_dump(
        self, session_id: str, messages: list[dict[str, Any]], name: str | None = None
    ) -> str:
        """Kind 4."""
        return self.write(
            {
                "reason": "shutdown-with-unpersisted-agent-history",
                "session_id": session_id,
                "count": len(messages),
                "messages": messages,
            },
            name,
        )


def snapshot(home: Path) -> dict[str, tuple[bytes, int, int]]:
    """Every file under ``home``: its bytes, modification time (ns) and mode."""
    found: dict[str, tuple[bytes, int, int]] = {}
    for path in sorted(home.rglob("*")):
        if path.is_file():
            stat = path.stat()
            found[str(path.relative_to(home))] = (path.read_bytes(), stat.st_mtime_ns, stat.st_mode)
    return found


# -- scenarios ----------------------------------------------------------------------------


@dataclass
class ModernHome:
    """What :func:`build_modern_home` made, for the tests to check against."""

    home: Path
    db: HermesDB
    spool: Spool
    #: Session ids: ``a`` -> ``b`` -> ``c`` is a compression chain (``c`` the open tip).
    a: str = "20250101_090000_a1b2c3"
    b: str = "20250101_100000_d4e5f6"
    c: str = "20250101_110000_0a0b0c"
    cron: str = "cron_daily_digest_20250102"
    #: Messages whose session has no sessions row.
    ghost: str = "20250102_070000_999999"
    spool_only: str = "20250103_080000_ffffff"
    prompt: str = "You are Hermes, a helpful assistant. (shared prompt)"
    #: Row ids by name.
    ids: dict[str, int] = field(default_factory=dict)
    uids: dict[str, str] = field(default_factory=dict)
    #: Spool file names by name.
    files: dict[str, str] = field(default_factory=dict)
    #: The message dicts written to the spool, by name.
    spooled: dict[str, dict[str, Any]] = field(default_factory=dict)


def build_modern_home(home: Path, *, junk: bool = True) -> ModernHome:
    """A current (version 31) Hermes home: every column kind, a compression chain,
    in-place compaction (inactive rows and a copied ``message_uid``), a rewind, a
    ``session_meta`` row and a hidden one, multimodal content, tool calls, values
    sessionrepo cannot store as they are, an undelivered delegation result, and a spool
    with all four payload kinds (the agent-history dump with persisted entries), a
    ``.json.bad`` payload, a BOM, a half-written ``.tmp``; with ``junk``, also two files
    that are not payloads (they need a person)."""
    home.mkdir(parents=True, exist_ok=True)
    db = HermesDB(home / "state.db", version=31)
    spool = Spool(home)
    s = ModernHome(home=home, db=db, spool=spool)
    prompt_hash = db.system_prompt(s.prompt)
    ids, uids = s.ids, s.uids
    for name in ("u1", "u2", "u3", "u4", "u5", "u6", "u7"):
        uids[name] = uid()

    # -- a: compacted in place, then rotated by compression -----------------------------
    db.session(
        s.a,
        source="telegram",
        user_id="42",
        model="anthropic/claude-sonnet-4",
        model_config=json.dumps({"temperature": 0.2, "max_tokens": 4096, "top_p": None}),
        system_prompt=None,
        system_prompt_hash=prompt_hash,
        title="Trip planning",
        title_source="llm",
        cache_read_tokens=1200,
        cache_write_tokens=80,
        reasoning_tokens=64,
        api_call_count=5,
        estimated_cost_usd=0.01234,
        billing_provider="openrouter",
        session_key="agent:main:telegram:dm:42",
        chat_id="42",
        chat_type="dm",
        display_name="Ana",
        profile_name="default",
        cwd="/home/ana",
        pinned=1,
        last_activity_at=db.clock + 100.5,
        message_count=9,
        tool_call_count=1,
        input_tokens=1500,
        output_tokens=320,
        zz_future_flag="kept",
    )
    ids["a_user"] = db.message(s.a, "user", "Plan a trip to Lisbon", message_uid=uids["u1"])
    ids["a_call"] = db.message(
        s.a,
        "assistant",
        None,
        tool_calls=[
            {
                "id": "call_lisbon",
                "type": "function",
                "function": {"name": "web_search", "arguments": '{"q": "Lisbon in May"}'},
            }
        ],
        reasoning="I should search first.",
        reasoning_details=[{"type": "reasoning.text", "text": "search", "signature": "sig=="}],
        finish_reason="tool_calls",
        token_count=55,
        message_uid=uids["u2"],
    )
    ids["a_tool"] = db.message(
        s.a,
        "tool",
        "Lisbon in May: 24°C, sunny",
        tool_call_id="call_lisbon",
        tool_name="web_search",
        message_uid=uids["u3"],
    )
    multimodal = [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
    ]
    ids["a_image"] = db.message(s.a, "user", multimodal, message_uid=uids["u4"])
    # In-place compaction: the rows above are archived, a summary and a copy of the last
    # user message (same message_uid) become the live transcript.
    db.execute("UPDATE messages SET active = 0, compacted = 1 WHERE session_id = ?", s.a)
    ids["a_summary"] = db.message(
        s.a,
        "assistant",
        "Summary: Ana is planning a trip to Lisbon in May.",
        display_kind="compaction_summary",
        api_content="[CONTEXT SUMMARY] Ana is planning a trip to Lisbon in May.",
        _compressed_summary=1,
        message_uid=uids["u6"],
    )
    ids["a_image_copy"] = db.message(s.a, "user", multimodal, message_uid=uids["u4"])
    ids["a_answer"] = db.message(
        s.a,
        "assistant",
        "That is a Lisbon tram (line 28).",
        platform_message_id="tg-1001",
        display_kind="markdown",
        display_metadata={"edited": False, "chunks": [1, 2]},
        codex_reasoning_items=[{"id": "rs_1", "summary": []}],
        observed=1,
        finish_reason="stop",
        token_count=12,
        message_uid=uids["u5"],
    )
    # Undone by /rewind: kept as history.
    ids["a_undone"] = db.message(s.a, "user", "oops, wrong chat", active=0, message_uid=uid())
    ids["a_last"] = db.message(s.a, "user", "Book the tram tour", message_uid=uids["u7"])
    # Bookkeeping Hermes strips before the model sees the history.
    ids["a_meta"] = db.message(s.a, "session_meta", json.dumps({"event": "title_set"}))
    db.execute(
        "UPDATE sessions SET ended_at = ?, end_reason = 'compression' WHERE id = ?",
        db.tick(),
        s.a,
    )

    # -- b: continuation of a, also rotated; a model_config that is not JSON --------------
    db.session(
        s.b,
        source="telegram",
        user_id="42",
        model="anthropic/claude-sonnet-4",
        model_config="{temperature: 0.2",  # not JSON: kept as text in metadata
        system_prompt="Inline system prompt of b",
        parent_session_id=s.a,
        title="Trip planning #2",
        session_key="agent:main:telegram:dm:42",
        input_tokens=900,
        output_tokens=210,
    )
    ids["b_user"] = db.message(s.b, "user", "Which museums?")
    ids["b_calls"] = db.message(
        s.b,
        "assistant",
        "Let me look both up.",
        tool_calls=[
            {
                "id": "call_a",
                "type": "function",
                "function": {"name": "web_search", "arguments": '{"q": "MAAT"}'},
            },
            {
                "id": "call_b",
                "type": "function",
                "function": {"name": "web_search", "arguments": '{"q": "Gulbenkian"}'},
            },
        ],
        reasoning_content="two searches in parallel",
        finish_reason="tool_calls",
    )
    ids["b_tool_a"] = db.message(
        s.b, "tool", "MAAT: open 10-19", tool_call_id="call_a", tool_name="web_search"
    )
    ids["b_tool_b"] = db.message(
        s.b, "tool", "Gulbenkian: open 10-18", tool_call_id="call_b", tool_name="web_search"
    )
    # Values sessionrepo cannot store as they are: a control character in an id, a lone
    # surrogate (JSON escapes make one) in multimodal content and in tool_calls, and
    # tool_calls text that is not JSON.
    ids["b_bad_id"] = db.message(
        s.b, "tool", "result with a bad id", tool_call_id="call\x07bad", tool_name="web_search"
    )
    ids["b_surrogate"] = db.message(
        s.b, "user", JSON_MARK + '[{"type": "text", "text": "bad \\ud800 half"}]'
    )
    ids["b_bad_calls"] = db.message(s.b, "assistant", "hm", tool_calls="[{broken")
    ids["b_final"] = db.message(
        s.b,
        "assistant",
        "Both are open until at least 18:00.",
        reasoning="Compare the two.",
        reasoning_content="compare",
        codex_message_items=[{"type": "message", "id": "msg_1"}],
        finish_reason="stop",
        token_count=31,
        platform_message_id="tg-1002",
    )
    db.execute(
        "UPDATE sessions SET ended_at = ?, end_reason = 'compression' WHERE id = ?",
        db.tick(),
        s.b,
    )

    # -- c: the open tip of the chain -----------------------------------------------------
    db.session(
        s.c,
        source="telegram",
        user_id="42",
        parent_session_id=s.b,
        system_prompt_hash=prompt_hash,
        session_key="agent:main:telegram:dm:42",
    )
    ids["c_user"] = db.message(s.c, "user", "Thanks! And dinner?")
    ids["c_hidden"] = db.message(s.c, "assistant", "(tool budget note)", display_kind="hidden")
    db.execute("INSERT INTO gateway_routing VALUES (?, ?)", "agent:main:telegram:dm:42", s.a)
    # One delegated result delivered to its session, one never delivered.
    for delegation, delivered in (("dlg-0", db.clock + 2), ("dlg-1", None)):
        db.execute(
            "INSERT INTO async_delegations (delegation_id, origin_session, state, "
            "dispatched_at, completed_at, updated_at, result_json, delivery_state, "
            "delivered_at) VALUES (?, ?, 'completed', ?, ?, ?, ?, ?, ?)",
            delegation,
            s.c,
            db.clock,
            db.clock + 1,
            db.clock + 1,
            json.dumps({"summary": "found 3 places"}),
            "pending" if delivered is None else "delivered",
            delivered,
        )

    # -- a cron session, ended, with a plain exchange -------------------------------------
    db.session(s.cron, source="cron", model="gpt-4o-mini")
    ids["cron_user"] = db.message(s.cron, "user", "Daily digest, please.")
    ids["cron_answer"] = db.message(s.cron, "assistant", "Nothing new today.")
    # Bytes that are not UTF-8 (a broken writer): imported, and reported.
    ids["cron_bad_utf8"] = db.raw_message(s.cron, "assistant", "CAST(X'6869FF21' AS TEXT)")
    db.execute(
        "UPDATE sessions SET ended_at = ?, end_reason = 'cron_complete' WHERE id = ?",
        db.tick(),
        s.cron,
    )
    ids["ghost"] = db.message(s.ghost, "user", "a message whose session row is gone")
    db.refresh()

    # -- the spool --------------------------------------------------------------------------
    base = int(db.clock) + 1000
    files = s.files
    files["pending"] = spool.shutdown_pending(
        "agent:main:telegram:dm:42",
        "are you still there?",
        base + 5,
        session_id=s.c,
        platform="telegram",
        sender_id="42",
        sender_name="Ana",
        reply_to="tg-1002",
        raw_event={"update_id": 777},
    )
    files["tail_1"] = spool.overflow_tail(
        "agent:main:telegram:dm:42", "second queued line", base + 6, seq=1, platform="telegram"
    )
    files["tail_0"] = spool.overflow_tail(
        "agent:main:telegram:dm:42", "first queued line", base + 6, seq=0, platform="telegram"
    )
    s.spooled["drop_call"] = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_dinner",
                "type": "function",
                "function": {"name": "web_search", "arguments": '{"q": "dinner Alfama"}'},
            }
        ],
        "reasoning": "look for restaurants",
        "reasoning_details": [{"type": "reasoning.text", "text": "restaurants"}],
        "message_uid": uid(),
    }
    s.spooled["drop_result"] = {
        "role": "tool",
        "content": "Alfama: Taberna X",
        "tool_call_id": "call_dinner",
        "name": "web_search",
        "message_uid": uid(),
    }
    # File names sort the other way round from the payloads' ts: order must come from ts.
    files["drop_result"] = spool.cap_drop(
        s.c, s.spooled["drop_result"], base + 2, seq=8, name="pending-0000result.json"
    )
    files["drop_call"] = spool.cap_drop(
        s.c, s.spooled["drop_call"], base + 1, seq=7, name="pending-ffffcall.json"
    )
    s.spooled["dump_answer"] = {
        "role": "assistant",
        "content": "Try Taberna X in Alfama.",
        "refusal": None,
        "finish_reason": "stop",
        "timestamp": base + 3.5,
        "message_uid": uid(),
    }
    s.spooled["dump_user"] = {"role": "user", "content": "Great, thanks!", "message_uid": uid()}
    # The agent's whole conversation: what state.db has carries _db_persisted.
    c_row = next(row for row in db.rows if row["id"] == ids["c_user"])
    persisted = {
        "role": "user",
        "content": c_row["content"],
        "_db_persisted": True,
        "message_uid": c_row["message_uid"],
    }
    files["dump"] = spool.history_dump(
        s.c,
        [persisted, s.spooled["dump_answer"], s.spooled["dump_user"]],
        name="pending-1111dump.json",
    )
    # A kind-3 file for a session state.db does not have.
    s.spooled["orphan"] = {"role": "user", "content": "hello from a lost session"}
    files["orphan"] = spool.cap_drop(s.spool_only, s.spooled["orphan"], base, seq=1, bom=True)
    # Also in state.db: the gateway's own replay stored it, then crashed before deleting.
    cron_row = next(row for row in db.rows if row["id"] == ids["cron_user"])
    s.spooled["replayed"] = {
        "role": "user",
        "content": "Daily digest, please.",
        "message_uid": cron_row["message_uid"],
    }
    files["replayed"] = spool.cap_drop(s.cron, s.spooled["replayed"], base, seq=2)
    # A payload the gateway's own database refused: still a payload.
    s.spooled["refused"] = {"role": "assistant", "content": "digest: 0 items", "message_uid": uid()}
    files["refused"] = spool.cap_drop(
        s.cron, s.spooled["refused"], base + 7, seq=3, name="pending-0bad.json.bad"
    )
    files["tmp"] = spool.raw(".pending-half.tmp", b'{"session_key": ')
    if junk:
        files["broken"] = spool.raw("pending-deadbeef.json", b'{"session_key": "x", "data": ')
        files["unknown"] = spool.write({"what": "is this"}, "pending-0123unknown.json")
    os.utime(spool.path / files["dump"], (base + 4, base + 4))  # written at shutdown
    return s


@dataclass
class V2Home:
    path: Path
    db: HermesDB
    parent: str = "20240301_120000_aaaaaa"
    child: str = "20240301_130000_bbbbbb"
    ids: dict[str, int] = field(default_factory=dict)


def build_v2_state_db(home: Path) -> V2Home:
    """An old (schema version 2) ``state.db``: no title, no active, no message_uid, no
    ``system_prompts``; a rollback-journal database, as old installs had."""
    home.mkdir(parents=True, exist_ok=True)
    db = HermesDB(home / "state.db", version=2, wal=False)
    v2 = V2Home(path=home / "state.db", db=db)
    db.session(
        v2.parent,
        source="discord",
        user_id="u-7",
        model="gpt-4o",
        model_config=json.dumps({"temperature": 1}),
        system_prompt="You are an old Hermes.",
        message_count=4,
        tool_call_count=1,
        input_tokens=100,
        output_tokens=50,
    )
    v2.ids["user"] = db.message(v2.parent, "user", "What's the weather?")
    v2.ids["call"] = db.message(
        v2.parent,
        "assistant",
        None,
        tool_calls=[
            {"id": "call_w", "type": "function", "function": {"name": "weather", "arguments": "{}"}}
        ],
        finish_reason="tool_calls",
        token_count=9,
    )
    v2.ids["tool"] = db.message(
        v2.parent, "tool", '{"temp": 21}', tool_call_id="call_w", tool_name="weather"
    )
    v2.ids["answer"] = db.message(v2.parent, "assistant", "21°C.", finish_reason="stop")
    db.execute(
        "UPDATE sessions SET ended_at = ?, end_reason = 'compression' WHERE id = ?",
        db.tick(),
        v2.parent,
    )
    db.session(v2.child, source="discord", user_id="u-7", parent_session_id=v2.parent)
    v2.ids["child_user"] = db.message(v2.child, "user", "And tomorrow?")
    db.refresh()
    return v2


def build_profile(home: Path, name: str) -> HermesDB:
    """A named profile ``profiles/<name>/`` of ``home``: a home of its own, with one
    session and a spooled inbound message for it."""
    root = home / "profiles" / name
    root.mkdir(parents=True, exist_ok=True)
    db = HermesDB(root / "state.db")
    session = db.session(f"{name}_20250105_0900", source="slack", session_key=f"agent:{name}:dm:1")
    db.message(session, "user", f"hello from the {name} profile")
    db.message(session, "assistant", f"hi, {name} here")
    db.refresh()
    Spool(root).shutdown_pending(f"agent:{name}:dm:1", f"queued for {name}", int(db.clock) + 60)
    return db
