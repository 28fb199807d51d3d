"""Reading a Hermes home: its ``state.db`` (from a private snapshot) and its spool.

Nothing here writes into the Hermes home; :mod:`sessionrepo.importers.hermes` turns what
is read into sessions and messages. See that module for the formats and the decisions.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sqlite3
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Final

from sessionrepo.importers.hermes.summary import HermesSourceError, Problem, SpoolFile
from sessionrepo.models.message import to_utc

STATE_DB: Final = "state.db"
SPOOL_DIR: Final = "pending_messages"
PROFILES_DIR: Final = "profiles"
#: Spool payload kinds, by the number ``hermes-state-format.md`` gives them.
KIND_NAMES: Final = {
    1: "shutdown_pending",
    2: "overflow_tail",
    3: "transcript_cap_drop",
    4: "agent_history_dump",
}
_CAP_DROP: Final = "transcript_cap_drop"
_HISTORY_DUMP: Final = "shutdown-with-unpersisted-agent-history"
#: A payload the gateway's own database refused (still a payload).
_BAD_SUFFIX: Final = ".json.bad"
#: ``state.db`` rows fetched at a time.
_ROWS_PER_FETCH: Final = 500
#: Side files of ``state.db`` that hold committed data (``-shm`` is only an index).
_DATA_SIDE_FILES: Final = ("-wal", "-journal")
_COPY_ATTEMPTS: Final = 8
#: ``uid IN (...)`` values per query.
_UIDS_PER_QUERY: Final = 500
#: The columns that tell one ``session_model_usage`` row of a session from another
#: (its primary key in version 22 and later; older versions have a prefix of them).
USAGE_KEY_COLUMNS: Final = ("model", "billing_provider", "billing_base_url", "billing_mode", "task")
#: How far a compression chain is followed.
_MAX_CHAIN: Final = 10_000
#: ``async_delegations`` columns, by what they hold: the name version 31 gives it first,
#: then the one older versions had.
_DELEGATION_ID: Final = ("delegation_id", "id")
_DELEGATION_SESSION: Final = ("origin_session", "session_id")
_DELEGATION_STATE: Final = ("state", "status")


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
    """One message of the spool, for the session it goes to.

    ``order`` is ``(group, when, seq, file, index)``: group 0 holds what a Hermes restart
    replays into ``state.db`` (kinds 1 to 3, in Hermes' ``(ts, seq, file)`` order), group 1
    the agent-history dumps (kind 4), which Hermes never replays.
    """

    session: str
    order: tuple[int, float, int, str, int]
    kind: int
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
    bad: bool

    def order(self, group: int, index: int) -> tuple[int, float, int, str, int]:
        seq = self.seq if self.seq is not None else -1
        return (group, self.when, seq, self.name, index)

    def provenance(self, kind: int) -> dict[str, Any]:
        found: dict[str, Any] = {
            "spool_file": self.name,
            "kind": kind,
            "reason": self.reason,
            "ts": self.ts,
            "seq": self.seq,
        }
        if self.bad:
            found["refused_by_gateway_db"] = True
        return found


@dataclasses.dataclass(frozen=True)
class Inbound:
    """A kind 1 or 2 payload: inbound user text the agent had not processed."""

    file: str
    kind: int
    order: tuple[int, float, int, str, int]
    session_id: Any
    session_key: Any
    text: Any
    provenance: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class DumpEntry:
    """A kind-4 entry that ``state.db`` already holds (it is skipped)."""

    file: str
    index: int
    session: str
    message_uid: str | None
    #: ``verified``: its uid is in ``state.db``; ``flag``: only its ``_db_persisted`` says so.
    how: str


@dataclasses.dataclass(frozen=True)
class Delegation:
    """An ``async_delegations`` row whose result was never delivered to its session."""

    #: The column that identifies it (``delegation_id``; ``id`` before version 31) and
    #: its value.
    id_column: str
    id: Any
    #: The Hermes session that delegated it (``origin_session``; ``session_id`` before).
    session: Any
    #: Its ``state`` (``status`` before): ``running``, ``completed``, ...
    state: Any


@dataclasses.dataclass
class _Spool:
    files: list[SpoolFile] = dataclasses.field(default_factory=list)
    messages: dict[str, list[SpoolMessage]] = dataclasses.field(default_factory=dict)
    inbound: list[Inbound] = dataclasses.field(default_factory=list)
    #: Inbound payloads no session could be found for (they stay in the spool).
    undelivered: list[Problem] = dataclasses.field(default_factory=list)
    persisted: list[DumpEntry] = dataclasses.field(default_factory=list)
    notes: list[Problem] = dataclasses.field(default_factory=list)
    #: Elements of a payload that are not messages (they stay in their file).
    rejected: list[Problem] = dataclasses.field(default_factory=list)
    #: Kind-4 entries read before they are sorted out against ``state.db``.
    dumped: list[tuple[_Header, str, int, dict[str, Any], dict[str, Any]]] = dataclasses.field(
        default_factory=list
    )

    @property
    def message_count(self) -> int:
        return sum(len(items) for items in self.messages.values())


class HermesSource:
    """A Hermes home (or a lone ``state.db``), read from a private snapshot.

    Use :func:`open_hermes`; close it (or use it as a context manager) when done: that
    removes the snapshot.
    """

    def __init__(
        self, path: Path, state_db: Path | None, spool_dir: Path | None, profile: str | None
    ) -> None:
        self.path = path
        self.state_db = state_db
        self.spool_dir = spool_dir
        self.profile = profile
        self.spool_not_read: Path | None = None
        self.schema_version: int | None = None
        self.session_columns: list[str] = []
        self.message_columns: list[str] = []
        self.tables: set[str] = set()
        self.rows = 0
        self._conn: sqlite3.Connection | None = None
        self._snapshot: tempfile.TemporaryDirectory[str] | None = None
        self._prompts = False
        self._usage_columns: list[str] | None = None
        self.spool = _Spool()

    @property
    def total_messages(self) -> int:
        """Messages an import goes through: ``state.db`` rows and spool messages."""
        return self.rows + self.spool.message_count

    def __enter__(self) -> HermesSource:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self._snapshot is not None:
            self._snapshot.cleanup()
            self._snapshot = None

    # -- state.db -------------------------------------------------------------------

    def _copy(self, path: Path) -> Path:
        """Copy ``state.db`` and its data side files into a private directory.

        SQLite writes into the ``-shm`` file of a WAL database even on a read-only
        connection (readers register there), and creates ``-wal``/``-shm`` when they are
        missing; an ``immutable`` open would not see the WAL tail of a killed gateway. A
        copy of the database and its WAL, read where nothing else looks, has neither
        problem. The ``-shm`` is not copied: it is an index SQLite rebuilds from the WAL,
        and a running gateway changes it while it is copied. A copy taken while the
        gateway wrote (a file's size or time changed meanwhile) is taken again.
        """
        self._snapshot = tempfile.TemporaryDirectory(prefix="sessionrepo-hermes-")
        target = Path(self._snapshot.name) / STATE_DB
        sources = [path, *(path.with_name(path.name + suffix) for suffix in _DATA_SIDE_FILES)]
        for attempt in range(_COPY_ATTEMPTS):
            before = [_identity(source) for source in sources]
            for source, state in zip(sources, before, strict=True):
                copy = target.with_name(target.name + source.name[len(path.name) :])
                copy.unlink(missing_ok=True)
                if state is not None:
                    try:
                        shutil.copyfile(source, copy)
                    except FileNotFoundError:
                        pass  # checkpointed away meanwhile: the check below retries
                    except OSError as exc:
                        raise HermesSourceError(f"cannot read {source}: {exc}") from exc
            if [_identity(source) for source in sources] == before:
                return target
            time.sleep(0.05 * (attempt + 1))
        raise HermesSourceError(
            f"{path} kept changing while it was copied ({_COPY_ATTEMPTS} attempts): the "
            "gateway is writing heavily; try again in a quieter moment"
        )

    def _open_db(self, path: Path) -> None:
        try:
            copy = self._copy(path)
            conn = sqlite3.connect(copy, timeout=30.0, isolation_level=None)
        except sqlite3.Error as exc:
            self.close()
            raise HermesSourceError(f"cannot open {path}: {exc}") from exc
        except BaseException:
            self.close()
            raise
        self._conn = conn
        conn.text_factory = _decode_text
        try:
            conn.execute("BEGIN")
            self.tables = {
                name
                for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")
            }
            missing = {"sessions", "messages"} - self.tables
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
            if "schema_version" in self.tables:
                row = conn.execute("SELECT max(version) FROM schema_version").fetchone()
                version = row[0] if row else None
                self.schema_version = version if isinstance(version, int) else None
            self._prompts = "system_prompts" in self.tables and {"hash", "prompt"} <= set(
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
        if self._conn is None:
            return iter(())
        return self._query("SELECT * FROM messages WHERE session_id = ? ORDER BY id", (session_id,))

    def model_usage(self, session_id: Any) -> list[dict[str, Any]]:
        """A session's ``session_model_usage`` rows (one per model, provider and task,
        each the running total Hermes keeps), with the columns that exist; ``[]`` when
        the table is not there or lacks ``session_id``."""
        if self._conn is None or "session_model_usage" not in self.tables:
            return []
        if self._usage_columns is None:
            self._usage_columns = self._columns("session_model_usage")
        if "session_id" not in self._usage_columns:
            return []
        order = [name for name in USAGE_KEY_COLUMNS if name in self._usage_columns]
        by = f" ORDER BY {', '.join(order)}" if order else ""
        return list(
            self._query(
                f"SELECT * FROM session_model_usage WHERE session_id = ?{by}", (session_id,)
            )
        )

    def system_prompt(self, prompt_hash: Any) -> str | None:
        if not self._prompts:
            return None
        for row in self._query(
            "SELECT prompt FROM system_prompts WHERE hash = ? LIMIT 1", (prompt_hash,)
        ):
            prompt = row["prompt"]
            return prompt if isinstance(prompt, str) else None
        return None

    def sessions_of_uids(self, uids: Iterable[str]) -> dict[str, set[Any]]:
        """For each of ``uids`` that ``state.db`` holds, the sessions holding it."""
        found: dict[str, set[Any]] = {}
        if self._conn is None or "message_uid" not in self.message_columns:
            return found
        wanted = sorted(set(uids))
        for start in range(0, len(wanted), _UIDS_PER_QUERY):
            chunk = tuple(wanted[start : start + _UIDS_PER_QUERY])
            marks = ", ".join("?" for _ in chunk)
            for row in self._query(
                f"SELECT DISTINCT message_uid, session_id FROM messages "
                f"WHERE message_uid IN ({marks})",
                chunk,
            ):
                found.setdefault(row["message_uid"], set()).add(row["session_id"])
        return found

    def route(self, session_id: Any, session_key: Any) -> str | None:
        """The session Hermes appends an inbound message to: ``session_id``, else the
        session ``session_key`` routes to, followed to the live tip of its compression
        chain (the newest continuation child, again and again)."""
        if self._conn is None:
            return session_id if isinstance(session_id, str) else None
        start: Any = session_id if isinstance(session_id, str) and session_id else None
        if start is None and isinstance(session_key, str):
            start = self._routed(session_key)
        if not isinstance(start, str):
            return None
        if "parent_session_id" not in self.session_columns:
            return start
        order = "started_at DESC, id DESC" if "started_at" in self.session_columns else "id DESC"
        tip, seen = start, {start}
        while len(seen) < _MAX_CHAIN:
            child = next(
                self._query(
                    f"SELECT id FROM sessions WHERE parent_session_id = ? ORDER BY {order} LIMIT 1",
                    (tip,),
                ),
                None,
            )
            if child is None or child["id"] in seen or not isinstance(child["id"], str):
                return tip
            tip = child["id"]
            seen.add(tip)
        return tip

    def _routed(self, session_key: str) -> Any:
        if "gateway_routing" in self.tables and {"session_key", "session_id"} <= set(
            self._columns("gateway_routing")
        ):
            for row in self._query(
                "SELECT session_id FROM gateway_routing WHERE session_key = ? LIMIT 1",
                (session_key,),
            ):
                if isinstance(row["session_id"], str):
                    return row["session_id"]
        if "session_key" not in self.session_columns:
            return None
        order = "started_at DESC, id DESC" if "started_at" in self.session_columns else "id DESC"
        for row in self._query(
            f"SELECT id FROM sessions WHERE session_key = ? ORDER BY {order} LIMIT 1",
            (session_key,),
        ):
            return row["id"]
        return None

    def pending_delegations(self) -> list[Delegation]:
        """``async_delegations`` rows whose result was never delivered to their session,
        in the order Hermes wrote them."""
        if self._conn is None or "async_delegations" not in self.tables:
            return []
        columns = self._columns("async_delegations")
        if "delivered_at" in columns:
            where = "delivered_at IS NULL"
        elif "delivered" in columns:
            where = "coalesce(delivered, 0) = 0"
        elif "status" in columns:
            where = "status IN ('pending', 'running', 'completed', 'complete', 'done')"
        else:
            where = "1"
        id_column = _first(_DELEGATION_ID, columns) or "rowid"
        session, state = _first(_DELEGATION_SESSION, columns), _first(_DELEGATION_STATE, columns)
        return [
            Delegation(
                id_column=id_column,
                id=row.get(id_column),
                session=row.get(session) if session else None,
                state=row.get(state) if state else None,
            )
            for row in self._query(
                f'SELECT rowid AS "rowid", * FROM async_delegations WHERE {where} ORDER BY rowid'
            )
        ]

    # -- pending_messages/ ----------------------------------------------------------

    def _read_spool(self, directory: Path) -> None:
        try:
            entries = sorted(directory.iterdir(), key=lambda entry: entry.name)
        except OSError as exc:
            raise HermesSourceError(f"cannot list {directory}: {exc}") from exc
        for entry in entries:
            if entry.is_dir():
                continue
            if entry.name.startswith(".") and entry.name.endswith(".tmp"):
                self.spool.notes.append(
                    Problem(
                        where=f"{SPOOL_DIR}/{entry.name}",
                        problem="a half-written payload the gateway never finished: not a "
                        "payload, left in place",
                    )
                )
                continue
            self.spool.files.append(self._read_spool_file(entry))

    def _read_spool_file(self, path: Path) -> SpoolFile:
        name = path.name
        bad = name.endswith(_BAD_SUFFIX)
        if not (name.endswith(".json") or bad):
            return SpoolFile(name=name, error="not a pending-*.json payload; left in place")
        try:
            mtime = path.stat().st_mtime
            payload = json.loads(path.read_bytes().decode("utf-8-sig"))
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
            bad=bad,
        )
        if header.reason == _HISTORY_DUMP:
            found = self._history_dump(header, payload)
        elif header.reason == _CAP_DROP:
            found = self._cap_drop(header, payload)
        else:
            found = self._inbound(header, payload)
        return found.model_copy(update={"refused_by_gateway_db": bad})

    def _history_dump(self, header: _Header, payload: dict[str, Any]) -> SpoolFile:
        """Kind 4: the agent's whole history, dumped at shutdown (sorted out later)."""
        name = header.name
        session = payload.get("session_id")
        messages = payload.get("messages")
        if not isinstance(session, str) or not isinstance(messages, list):
            return SpoolFile(name=name, error="agent-history dump without session_id/messages")
        provenance = header.provenance(4) | {"count": payload.get("count")}
        for index, message in enumerate(messages):
            if not isinstance(message, dict):
                self.spool.rejected.append(
                    Problem(
                        where=f"{SPOOL_DIR}/{name} messages[{index}]",
                        problem=f"a JSON {type(message).__name__}, not a message object: "
                        "not stored; it stays in the spool file",
                    )
                )
                continue
            self.spool.dumped.append((header, session, index, message, provenance))
        return SpoolFile(
            name=name, kind=4, kind_name=KIND_NAMES[4], session_id=session, messages=len(messages)
        )

    def _sort_out_dumps(self) -> None:
        """Kind-4 entries ``state.db`` holds are skipped; the rest are messages."""
        uids = [
            uid
            for _, _, _, message, _ in self.spool.dumped
            if isinstance(uid := message.get("message_uid"), str) and uid
        ]
        held = self.sessions_of_uids(uids)
        for header, session, index, message, provenance in self.spool.dumped:
            uid = message.get("message_uid")
            uid = uid if isinstance(uid, str) and uid else None
            flagged = message.get("_db_persisted") is True
            if uid is not None and uid in held:
                self.spool.persisted.append(DumpEntry(header.name, index, session, uid, "verified"))
                continue
            if flagged and uid is None:
                self.spool.persisted.append(DumpEntry(header.name, index, session, None, "flag"))
                continue
            if flagged:
                self.spool.notes.append(
                    Problem(
                        where=f"{SPOOL_DIR}/{header.name} messages[{index}]",
                        session_id=session,
                        problem=f"marked _db_persisted, but state.db has no row with its "
                        f"message_uid {uid!r}: stored",
                    )
                )
            self._add_spool_message(
                SpoolMessage(
                    session=session,
                    order=header.order(1, index),
                    kind=4,
                    file=header.name,
                    path=f"messages[{index}]",
                    index=index,
                    message=message,
                    provenance=provenance | {"index": index},
                    time=header.when,
                )
            )
        self.spool.dumped.clear()

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
                order=header.order(0, 0),
                kind=3,
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
        key = payload.get("session_key")
        provenance = header.provenance(kind) | {"session_key": key}
        provenance["data"] = {name: value for name, value in data.items() if name != "text"}
        self.spool.inbound.append(
            Inbound(
                file=header.name,
                kind=kind,
                order=header.order(0, 0),
                session_id=data.get("session_id"),
                session_key=key,
                text=data.get("text"),
                provenance=provenance,
            )
        )
        session_id = data.get("session_id")
        return SpoolFile(
            name=header.name,
            kind=kind,
            kind_name=KIND_NAMES[kind],
            session_id=session_id if isinstance(session_id, str) else None,
            session_key=key if isinstance(key, str) else None,
            messages=1,
        )

    def _deliver_inbound(self) -> None:
        """Kinds 1 and 2 become user messages of the session Hermes would append them to."""
        for item in self.spool.inbound:
            where = f"{SPOOL_DIR}/{item.file}"
            target = self.route(item.session_id, item.session_key)
            if target is None:
                self.spool.undelivered.append(
                    Problem(
                        where=where,
                        problem=f"no session for session_key {item.session_key!r} (and no "
                        "data.session_id): not delivered; it stays in the spool",
                    )
                )
                continue
            if not isinstance(item.text, str):
                self.spool.undelivered.append(
                    Problem(
                        where=where,
                        session_id=target,
                        field="data.text",
                        problem=f"a {type(item.text).__name__}, not text: not delivered; it "
                        "stays in the spool",
                    )
                )
                continue
            message: dict[str, Any] = {"role": "user", "content": item.text}
            self._add_spool_message(
                SpoolMessage(
                    session=target,
                    order=item.order,
                    kind=item.kind,
                    file=item.file,
                    path="data.text",
                    index=0,
                    message=message,
                    provenance=item.provenance | {"delivered_to": target},
                    time=item.order[1],
                )
            )

    def _add_spool_message(self, item: SpoolMessage) -> None:
        self.spool.messages.setdefault(item.session, []).append(item)


def _first(names: Iterable[str], columns: Iterable[str]) -> str | None:
    """The first of ``names`` that is one of ``columns``."""
    present = set(columns)
    return next((name for name in names if name in present), None)


def _identity(path: Path) -> tuple[int, int, int] | None:
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    return (stat.st_ino, stat.st_size, stat.st_mtime_ns)


def _profile_of(home: Path) -> str | None:
    return home.name if home.parent.name == PROFILES_DIR else None


def hermes_profiles(home: str | os.PathLike[str]) -> list[tuple[str, Path]]:
    """The named profiles of a Hermes home (``profiles/<name>/`` with a ``state.db`` or
    a spool), by name."""
    directory = Path(home).expanduser() / PROFILES_DIR
    if not directory.is_dir():
        return []
    return [
        (entry.name, entry)
        for entry in sorted(directory.iterdir(), key=lambda entry: entry.name)
        if entry.is_dir() and ((entry / STATE_DB).is_file() or (entry / SPOOL_DIR).is_dir())
    ]


def open_hermes(path: str | os.PathLike[str]) -> HermesSource:
    """Open a Hermes home directory (``state.db`` and ``pending_messages/``) or a
    ``state.db`` file, read-only (from a private snapshot of ``state.db``).

    A home's named profiles (``profiles/<name>/``) are homes of their own: see
    :func:`hermes_profiles`.

    Raises:
        HermesSourceError: there is nothing Hermes-like to read at ``path``.
    """
    given = Path(path).expanduser()
    if given.is_dir():
        db = given / STATE_DB
        spool = given / SPOOL_DIR
        source = HermesSource(
            given,
            db if db.is_file() else None,
            spool if spool.is_dir() else None,
            _profile_of(given),
        )
        if source.state_db is None and source.spool_dir is None:
            raise HermesSourceError(
                f"{given} is not a Hermes home: it has neither {STATE_DB} nor {SPOOL_DIR}/"
            )
    elif given.is_file():
        source = HermesSource(given, given, None, _profile_of(given.parent))
        beside = given.parent / SPOOL_DIR
        if beside.is_dir():
            source.spool_not_read = beside
    else:
        raise HermesSourceError(f"{given}: no such file or directory")
    if source.state_db is not None:
        source._open_db(source.state_db)
    try:
        if source.spool_dir is not None:
            source._read_spool(source.spool_dir)
        source._sort_out_dumps()
        source._deliver_inbound()
    except BaseException:
        source.close()
        raise
    for items in source.spool.messages.values():
        items.sort(key=lambda item: item.order)
    return source
