"""Reading a Hermes home: its ``state.db`` (read-only, one snapshot) and its spool.

Nothing here writes anywhere; :mod:`sessionrepo.importers.hermes` turns what is read into
sessions and messages. See that module for the formats and the decisions.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

from sessionrepo.importers.hermes.summary import HermesSourceError, Problem, SpoolFile
from sessionrepo.models.message import to_utc

STATE_DB: Final = "state.db"
SPOOL_DIR: Final = "pending_messages"
#: Spool payload kinds, by the number ``hermes-state-format.md`` gives them.
KIND_NAMES: Final = {
    1: "shutdown_pending",
    2: "overflow_tail",
    3: "transcript_cap_drop",
    4: "agent_history_dump",
}
_CAP_DROP: Final = "transcript_cap_drop"
_HISTORY_DUMP: Final = "shutdown-with-unpersisted-agent-history"
#: ``state.db`` rows fetched at a time.
_ROWS_PER_FETCH: Final = 500


def epoch_seconds(value: Any) -> float | None:
    """``value`` as epoch seconds a datetime can hold, else ``None``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        to_utc(value, "timestamp")
    except ValueError:
        return None
    return float(value) if isinstance(value, int) else value


def one_line(exc: BaseException) -> str:
    """An exception as one line of text, for a summary."""
    return " ".join(str(exc).split()) or type(exc).__name__


def _decode_text(data: bytes) -> str:
    # Invalid UTF-8 becomes lone surrogates: imported and reported, never an abort.
    return data.decode("utf-8", "surrogateescape")


@dataclasses.dataclass(frozen=True)
class SpoolMessage:
    session: str
    order: tuple[float, int, str, int]
    file: str
    path: str
    index: int
    message: dict[str, Any]
    provenance: dict[str, Any]
    time: float


@dataclasses.dataclass(frozen=True)
class _Header:
    """What orders and describes one spool payload."""

    name: str
    ts: float | None
    seq: int | None
    #: ``ts``, else the file's modification time.
    when: float
    reason: Any

    def order(self, index: int) -> tuple[float, int, str, int]:
        return (self.when, self.seq if self.seq is not None else -1, self.name, index)

    def provenance(self, kind: int) -> dict[str, Any]:
        return {
            "spool_file": self.name,
            "kind": kind,
            "reason": self.reason,
            "ts": self.ts,
            "seq": self.seq,
        }


@dataclasses.dataclass
class _Spool:
    files: list[SpoolFile] = dataclasses.field(default_factory=list)
    messages: dict[str, list[SpoolMessage]] = dataclasses.field(default_factory=dict)
    inbound: list[tuple[tuple[float, int, str, int], dict[str, Any]]] = dataclasses.field(
        default_factory=list
    )
    notes: list[Problem] = dataclasses.field(default_factory=list)
    #: Elements of a payload that are not messages (they stay in their file).
    rejected: list[Problem] = dataclasses.field(default_factory=list)

    @property
    def message_count(self) -> int:
        return sum(len(items) for items in self.messages.values())


class HermesSource:
    """A Hermes home (or a lone ``state.db``), open read-only on one consistent snapshot.

    Use :func:`open_hermes`; close it (or use it as a context manager) when done.
    """

    def __init__(self, path: Path, state_db: Path | None, spool_dir: Path | None) -> None:
        self.path = path
        self.state_db = state_db
        self.spool_dir = spool_dir
        self.spool_not_read: Path | None = None
        self.schema_version: int | None = None
        self.session_columns: list[str] = []
        self.message_columns: list[str] = []
        self.rows = 0
        self._conn: sqlite3.Connection | None = None
        self._prompts = False
        self.spool = _Spool()

    @property
    def total_messages(self) -> int:
        """Messages an import goes through: ``state.db`` rows and spool transcript messages."""
        return self.rows + self.spool.message_count

    def __enter__(self) -> HermesSource:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # -- state.db -------------------------------------------------------------------

    def _open_db(self, path: Path) -> None:
        uri = path.resolve().as_uri() + "?mode=ro"
        try:
            conn = sqlite3.connect(uri, uri=True, timeout=30.0, isolation_level=None)
        except sqlite3.Error as exc:
            raise HermesSourceError(f"cannot open {path}: {exc}") from exc
        self._conn = conn
        conn.text_factory = _decode_text
        try:
            # One read transaction for the whole import: a consistent snapshot.
            conn.execute("BEGIN")
            tables = {
                name
                for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")
            }
            missing = {"sessions", "messages"} - tables
            if missing:
                raise HermesSourceError(
                    f"{path} is not a Hermes state.db: no {' or '.join(sorted(missing))} table"
                )
            self.session_columns = self._columns("sessions")
            self.message_columns = self._columns("messages")
            needed = {"id", "session_id", "role"} - set(self.message_columns)
            if "id" not in self.session_columns or needed:
                raise HermesSourceError(
                    f"{path} is not a Hermes state.db: its messages or sessions table lacks "
                    "the id, session_id or role column"
                )
            if "schema_version" in tables:
                row = conn.execute("SELECT max(version) FROM schema_version").fetchone()
                version = row[0] if row else None
                self.schema_version = version if isinstance(version, int) else None
            self._prompts = "system_prompts" in tables and {"hash", "prompt"} <= set(
                self._columns("system_prompts")
            )
            self.rows = int(conn.execute("SELECT count(*) FROM messages").fetchone()[0])
        except sqlite3.Error as exc:
            self.close()
            raise HermesSourceError(f"cannot read {path}: {exc}") from exc
        except BaseException:
            self.close()
            raise

    def _columns(self, table: str) -> list[str]:
        assert self._conn is not None
        return [str(row[1]) for row in self._conn.execute(f"PRAGMA table_info({table})")]

    def _query(self, sql: str, params: tuple[Any, ...] = ()) -> Iterator[dict[str, Any]]:
        assert self._conn is not None
        try:
            cursor = self._conn.execute(sql, params)
            names = [description[0] for description in cursor.description]
            while chunk := cursor.fetchmany(_ROWS_PER_FETCH):
                for row in chunk:
                    yield dict(zip(names, row, strict=True))
        except sqlite3.Error as exc:
            raise HermesSourceError(f"cannot read {self.state_db}: {exc}") from exc

    def sessions(self) -> Iterator[dict[str, Any]]:
        """Every ``sessions`` row, oldest first."""
        if self._conn is None:
            return iter(())
        order = "started_at, id" if "started_at" in self.session_columns else "id"
        return self._query(f"SELECT * FROM sessions ORDER BY {order}")

    def sessions_without_row(self) -> list[str]:
        """Session ids that have messages but no ``sessions`` row."""
        if self._conn is None:
            return []
        return [
            row["session_id"]
            for row in self._query(
                "SELECT DISTINCT session_id FROM messages WHERE session_id NOT IN "
                "(SELECT id FROM sessions WHERE id IS NOT NULL) ORDER BY session_id"
            )
        ]

    def messages(self, session_id: Any) -> Iterator[dict[str, Any]]:
        """A session's rows in ``id`` order (Hermes' transcript order)."""
        return self._query("SELECT * FROM messages WHERE session_id = ? ORDER BY id", (session_id,))

    def first_uid_rows(self) -> dict[str, int]:
        """For each ``message_uid`` carried by several rows, the lowest row id."""
        if self._conn is None or "message_uid" not in self.message_columns:
            return {}
        return {
            row["uid"]: row["first"]
            for row in self._query(
                "SELECT message_uid AS uid, min(id) AS first FROM messages "
                "WHERE message_uid IS NOT NULL GROUP BY message_uid HAVING count(*) > 1"
            )
        }

    def system_prompt(self, prompt_hash: Any) -> str | None:
        if not self._prompts:
            return None
        for row in self._query(
            "SELECT prompt FROM system_prompts WHERE hash = ? LIMIT 1", (prompt_hash,)
        ):
            prompt = row["prompt"]
            return prompt if isinstance(prompt, str) else None
        return None

    # -- pending_messages/ ----------------------------------------------------------

    def _read_spool(self, directory: Path) -> None:
        try:
            entries = sorted(directory.iterdir(), key=lambda entry: entry.name)
        except OSError as exc:
            raise HermesSourceError(f"cannot list {directory}: {exc}") from exc
        for entry in entries:
            if entry.is_dir():
                continue
            self.spool.files.append(self._read_spool_file(entry))

    def _read_spool_file(self, path: Path) -> SpoolFile:
        name = path.name
        if not name.endswith(".json"):
            return SpoolFile(name=name, error="not a pending-*.json payload; left in place")
        try:
            mtime = path.stat().st_mtime
            payload = json.loads(path.read_bytes().decode("utf-8"))
        except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
            return SpoolFile(name=name, error=f"cannot be parsed: {one_line(exc)}")
        if not isinstance(payload, dict):
            return SpoolFile(name=name, error=f"a JSON {type(payload).__name__}, not an object")
        ts = epoch_seconds(payload.get("ts"))
        if "ts" in payload and ts is None:
            self.spool.notes.append(
                Problem(
                    where=f"{SPOOL_DIR}/{name}",
                    field="ts",
                    problem=f"ts {payload['ts']!r} is not epoch seconds: ordered by the "
                    "file's modification time",
                )
            )
        seq = payload.get("seq")
        header = _Header(
            name=name,
            ts=ts,
            seq=seq if type(seq) is int else None,
            when=ts if ts is not None else mtime,
            reason=payload.get("reason"),
        )
        if header.reason == _HISTORY_DUMP:
            return self._history_dump(header, payload)
        if header.reason == _CAP_DROP:
            return self._cap_drop(header, payload)
        return self._inbound(header, payload)

    def _history_dump(self, header: _Header, payload: dict[str, Any]) -> SpoolFile:
        """Kind 4: the agent's unpersisted history, dumped at shutdown."""
        name = header.name
        session = payload.get("session_id")
        messages = payload.get("messages")
        if not isinstance(session, str) or not isinstance(messages, list):
            return SpoolFile(name=name, error="agent-history dump without session_id/messages")
        provenance = header.provenance(4) | {"count": payload.get("count")}
        stored = 0
        for index, message in enumerate(messages):
            path = f"messages[{index}]"
            if not isinstance(message, dict):
                self.spool.rejected.append(
                    Problem(
                        where=f"{SPOOL_DIR}/{name} {path}",
                        problem=f"a JSON {type(message).__name__}, not a message object: "
                        "not stored; it stays in the spool file",
                    )
                )
                continue
            self._add_spool_message(
                SpoolMessage(
                    session=session,
                    order=header.order(index),
                    file=name,
                    path=path,
                    index=index,
                    message=message,
                    provenance=provenance | {"index": index},
                    time=header.when,
                )
            )
            stored += 1
        return SpoolFile(
            name=name, kind=4, kind_name=KIND_NAMES[4], session_id=session, messages=stored
        )

    def _cap_drop(self, header: _Header, payload: dict[str, Any]) -> SpoolFile:
        """Kind 3: a message evicted from the in-memory queue of writes."""
        data = payload.get("data")
        data = data if isinstance(data, dict) else {}
        session = data.get("session_id")
        if not isinstance(session, str):
            session = payload.get("session_key")
        message = data.get("message")
        if not isinstance(session, str) or not isinstance(message, dict):
            return SpoolFile(
                name=header.name,
                error="transcript cap drop without a session id or data.message",
            )
        self._add_spool_message(
            SpoolMessage(
                session=session,
                order=header.order(0),
                file=header.name,
                path="data.message",
                index=0,
                message=message,
                provenance=header.provenance(3) | {"session_key": payload.get("session_key")},
                time=header.when,
            )
        )
        key = payload.get("session_key")
        return SpoolFile(
            name=header.name,
            kind=3,
            kind_name=KIND_NAMES[3],
            session_id=session,
            session_key=key if isinstance(key, str) else None,
            messages=1,
        )

    def _inbound(self, header: _Header, payload: dict[str, Any]) -> SpoolFile:
        """Kinds 1 and 2: inbound user text the agent had not processed."""
        data = payload.get("data")
        if not isinstance(data, dict) or "text" not in data:
            return SpoolFile(name=header.name, error="not a known payload kind")
        kind = 2 if "seq" in payload else 1
        session_id = data.get("session_id")
        record = {
            "file": header.name,
            "kind": kind,
            "kind_name": KIND_NAMES[kind],
            "session_key": payload.get("session_key"),
            "session_id": session_id,
            "reason": header.reason,
            "ts": payload.get("ts"),
            "seq": payload.get("seq"),
            "text": data.get("text"),
            "payload": payload,
        }
        self.spool.inbound.append((header.order(0), record))
        key = payload.get("session_key")
        return SpoolFile(
            name=header.name,
            kind=kind,
            kind_name=KIND_NAMES[kind],
            session_id=session_id if isinstance(session_id, str) else None,
            session_key=key if isinstance(key, str) else None,
        )

    def _add_spool_message(self, item: SpoolMessage) -> None:
        self.spool.messages.setdefault(item.session, []).append(item)


def open_hermes(path: str | os.PathLike[str]) -> HermesSource:
    """Open a Hermes home directory (``state.db`` and ``pending_messages/``) or a
    ``state.db`` file, read-only.

    Raises:
        HermesSourceError: there is nothing Hermes-like to read at ``path``.
    """
    given = Path(path).expanduser()
    if given.is_dir():
        db = given / STATE_DB
        spool = given / SPOOL_DIR
        source = HermesSource(
            given, db if db.is_file() else None, spool if spool.is_dir() else None
        )
        if source.state_db is None and source.spool_dir is None:
            raise HermesSourceError(
                f"{given} is not a Hermes home: it has neither {STATE_DB} nor {SPOOL_DIR}/"
            )
    elif given.is_file():
        source = HermesSource(given, given, None)
        beside = given.parent / SPOOL_DIR
        if beside.is_dir():
            source.spool_not_read = beside
    else:
        raise HermesSourceError(f"{given}: no such file or directory")
    if source.state_db is not None:
        source._open_db(source.state_db)
    if source.spool_dir is not None:
        try:
            source._read_spool(source.spool_dir)
        except BaseException:
            source.close()
            raise
    for items in source.spool.messages.values():
        items.sort(key=lambda item: item.order)
    source.spool.inbound.sort(key=lambda entry: entry[0])
    return source


def default_inbound_report(source: HermesSource, directory: Path | None = None) -> Path:
    """Where the CLI writes the inbound (kind 1 and 2) messages by default.

    The name is derived from the payload files, so running the import again rewrites the
    same file with the same content, and two Hermes homes never share one.
    """
    names = sorted(record["file"] for _, record in source.spool.inbound)
    digest = hashlib.sha256("\n".join(names).encode()).hexdigest()[:12]
    return (directory or Path.cwd()) / f"hermes-inbound-{digest}.jsonl"
