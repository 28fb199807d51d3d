"""Import a Hermes gateway's history: its ``state.db`` and its ``pending_messages/`` spool.

The formats are described in ``hermes-state-format.md``. :mod:`.source` reads them,
this module turns what it read into sessions and messages and writes them through the
public methods of :class:`~sessionrepo.store.repository.SessionRepository` (no SQL of its
own), and :mod:`.summary` holds what an import reports. What it decides, and why:

**The source is never modified.** ``state.db`` is opened with SQLite's ``mode=ro`` URI (not
``immutable=1``: a gateway may be writing it) and read in one read transaction, so the
import sees one consistent snapshot however busy the gateway is. Nothing under the Hermes
home is written, renamed or deleted. One caveat, SQLite's own: a *WAL-mode* database that
no process has open gets its ``state.db-wal`` / ``state.db-shm`` side files created by any
reader (they hold SQLite's shared-memory index; Hermes' own read-only opens do the same),
and a read-only connection cannot remove them again. ``state.db`` itself is untouched.
Text is decoded with ``surrogateescape``, so a row holding invalid UTF-8 is imported (and
reported, see below) instead of aborting the import.

**Schema versions.** Columns are found with ``PRAGMA table_info``; whatever exists is read,
nothing is assumed beyond ``sessions.id``, ``messages.id``, ``messages.session_id`` and
``messages.role``. The ``messages_fts`` index and other tables are ignored.

**Sessions.** Each Hermes session becomes a session with the same id (created with
``create_session``, which is idempotent). Mapped to fields: ``source``, ``user_id``,
``title``, ``model``, ``model_config`` (JSON text parsed to a dict), ``system_prompt`` (or,
when it is NULL, the prompt that ``system_prompt_hash`` names in ``system_prompts``),
``parent_session_id`` (continuation links, compression chains included), ``started_at`` /
``ended_at`` (epoch seconds to aware UTC), ``end_reason``, ``input_tokens`` /
``output_tokens`` (Hermes' usage totals: nothing in sessionrepo derives them). Every
other non-NULL column goes to ``metadata["hermes"]``, under its column name, together
with Hermes' own ``message_count`` / ``tool_call_count`` / token counters (sessionrepo
counts the messages it stores itself) and the exact ``started_at`` / ``ended_at`` REALs.
A ``model_config`` that is not a JSON object stays in ``metadata["hermes"]["model_config"]``
as the text it was. Sessions are imported oldest first, so that listing the store by
latest activity keeps Hermes' order.

**Messages.** Rows are read in ``id`` order (Hermes' transcript order). Mapped to fields:
``role``, ``content`` (the ``"\\x00json:"`` form becomes the JSON content parts it
encodes), ``tool_calls`` (JSON text to a list), ``tool_call_id``, ``tool_name``,
``reasoning``, ``finish_reason``, ``token_count``, ``timestamp`` (epoch seconds to aware
UTC), ``platform_message_id``. Every other non-NULL column goes to ``extra["hermes"]``
under its column name (``reasoning_content``, ``reasoning_details``, ``codex_*``,
``observed``, ``active``, ``compacted``, ``api_content``, ``display_kind``,
``display_metadata``, ``message_uid``, and any column a later Hermes adds), plus the
source row's ``id`` and its exact ``timestamp`` REAL. JSON-valued Hermes columns are kept
as the text Hermes stored. ``extra["hermes"]`` is import provenance: ``to_openai()``
includes it, so drop that key before sending a loaded transcript to a provider.

**Inactive rows** (``active = 0``: archived by compaction or undone by rewind) are not part
of the conversation a user or an agent resumes, but they must not be lost. They are
stored, in ``id`` order, in a companion session ``"<id>#history"`` (same source and user,
ended, ``metadata["hermes"]["history_of"]`` naming the live session, no
``parent_session_id`` so that it is never taken for a continuation). So
``load_transcript(id)`` is exactly the live transcript Hermes would load, and the archive
is one call away. Each row keeps its Hermes ``id`` in ``extra["hermes"]["id"]``, so the
two can be merged back into Hermes' original order.

**Keys** are deterministic, so that running the import again inserts nothing:

- a row whose ``message_uid`` is set gets ``uuid5(NAMESPACE, "message_uid:" + uid)``
  (:func:`uid_key`), a gateway that knows the uid can compute it. In-place compaction
  copies a row with its uid; the uid then stays the key of its *first* row (the lowest
  ``id``, the original) and the later copies are keyed as rows without a uid. Keying only
  uids that are unique at import time would not be stable: a compaction between two
  imports would change the original's key and store it twice.
- any other row gets :func:`row_key`, a uuid5 of its session id, row ``id``, exact
  ``timestamp`` and ``role``. This is the row's identity without naming its database: a
  path is not stable across copies, and a "database identity" taken from some first row
  changes when Hermes deletes that session. These values never change for a stored row,
  are equal in every copy or backup of the file, and do not repeat across gateways (a row
  ``id`` is unique in its file; another gateway's row with the same session id and ``id``
  would also need the same timestamp to the last bit).
- a spool message gets :func:`spool_key` of its file name (``pending-<uuid4>.json``,
  unique per payload) and its index in the file, unless its dict carries its own
  ``client_msg_uuid``.

**The spool** is read, never changed; unparseable or unrecognised files are reported and
stay where they are.

- Kind 3 (transcript cap drop) and kind 4 (agent-history dump) hold OpenAI-format message
  dicts that never reached ``state.db``. They are stored in their session with every key of
  the dict (``tool_calls``, ``tool_call_id``, ``reasoning`` and unknown keys alike, so
  ``to_openai()`` gives the dict back plus ``"hermes"``), after that session's
  ``state.db`` rows, in replay order ``(ts, seq, file name)`` then index in the file. A
  kind 4 payload has no ``ts``; its file's modification time (when the gateway wrote it at
  shutdown) stands in. Their true place among the stored rows cannot be recovered (clocks
  regress), so they are kept together and carry their provenance in ``extra["hermes"]``
  (file, kind, reason, ts, seq, index). A spool message equal in role, content and
  tool-call id to a stored row of its session (the gateway's replay inserted it and then
  crashed before deleting the file) is still stored, and listed as a possible duplicate.
  Its timestamp is the dict's own ``"timestamp"`` when that is epoch seconds, else the
  payload's ``ts``, else the file time.
- Kinds 1 and 2 (shutdown pending slot, overflow tail) are inbound user text the agent had
  not processed yet: not messages of any transcript, and not for the outbox (which only
  replays transcript messages). They are counted in the summary and, when a path is
  given (the CLI always gives one), written one JSON object per line in replay order to a
  report file the operator re-delivers from; the spool files stay where they are. The
  CLI's default name (:func:`default_inbound_report`) is derived from the payload files,
  so a re-run rewrites the same file with the same content.

**Values that cannot be stored faithfully** (a lone surrogate, invalid UTF-8, a control
character in an id, NaN, JSON that does not parse, a number where text belongs) never
abort the import. The field gets the nearest storable value (lone surrogates become
U+FFFD; an unusable id, ``tool_calls`` or count becomes NULL) and the original goes, as its
``repr()``, to ``extra["hermes"]["moved_aside"][field]`` (``metadata["hermes"]["moved_aside"]``
for sessions); the summary lists each one. A session id that cannot be an id is replaced by
``hermes-<uuid5>`` with the original in ``metadata["hermes"]["moved_aside"]["id"]``.

**Writes** go straight to the primary with ``SessionRepository.append``, in batches of at
most 500 messages per transaction, not through ``TranscriptWriter``: an import is a one-off
an operator watches, and the summary must say exactly what was inserted, already present,
or stored with different content. A database failure stops the import with an error that
says how far it got; running it again continues (keys make the repeat a no-op). A message
the store rejects for its size is reported and the rest of its batch is stored.

**Running it again** on an unchanged source inserts nothing. Rows Hermes changed in place
since an earlier import (``active`` flipped by compaction, an edit) have the same key and
different content: the stored row is kept (append-only) and the summary lists them;
rows archived since an earlier import are listed too (they are then in the live session,
from the earlier run, and in the history session).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
import time
import uuid
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any, Final, Literal, get_args

from pydantic import ValidationError

from sessionrepo.errors import InvalidMessage, NotFound, RepoError
from sessionrepo.importers.hermes.source import (
    KIND_NAMES,
    SPOOL_DIR,
    STATE_DB,
    HermesSource,
    SpoolMessage,
    default_inbound_report,
    epoch_seconds,
    one_line,
    open_hermes,
)
from sessionrepo.importers.hermes.summary import (
    HermesImportError,
    HermesImportSummary,
    HermesSourceError,
    Problem,
    SpoolFile,
)
from sessionrepo.models import Message
from sessionrepo.models._limits import MAX_ID_LENGTH, check_identifier, check_json, check_text
from sessionrepo.models.message import KEY_FIELD, Role, to_utc, utcnow
from sessionrepo.store.repository import SessionRepository

__all__ = [
    "BATCH_SIZE",
    "HISTORY_END_REASON",
    "HISTORY_SUFFIX",
    "JSON_CONTENT_MARK",
    "KIND_NAMES",
    "NAMESPACE",
    "SPOOL_DIR",
    "STATE_DB",
    "HermesImportError",
    "HermesImportSummary",
    "HermesSource",
    "HermesSourceError",
    "Problem",
    "SpoolFile",
    "default_inbound_report",
    "import_hermes",
    "open_hermes",
    "row_key",
    "spool_key",
    "uid_key",
]

#: The uuid5 namespace of every key this importer makes (see :func:`uid_key`).
NAMESPACE: Final = uuid.UUID("0b4f6c1e-8a57-5d0c-9e3a-6d2f1b7c4a90")
#: Suffix of the companion session holding a session's ``active = 0`` rows.
HISTORY_SUFFIX: Final = "#history"
#: ``end_reason`` of a companion history session.
HISTORY_END_REASON: Final = "hermes_history"
#: Most messages written per transaction.
BATCH_SIZE: Final = 500
#: How Hermes marks a ``content`` value that is JSON (multimodal parts).
JSON_CONTENT_MARK: Final = "\x00json:"
_ROLES: Final = frozenset(get_args(Role))
#: ``sessions`` columns that become ``Session`` fields and are not kept in metadata too.
_SESSION_FIELDS: Final = frozenset(
    {
        "id",
        "source",
        "user_id",
        "title",
        "model",
        "system_prompt",
        "parent_session_id",
        "end_reason",
    }
)
_SURROGATES: Final = re.compile("[\ud800-\udfff]")
_BATCH_INDEX: Final = re.compile(r"^messages\[(\d+)\]")


def uid_key(message_uid: str) -> uuid.UUID:
    """The key of the first row carrying a Hermes ``message_uid``."""
    return uuid.uuid5(NAMESPACE, "message_uid:" + message_uid)


def row_key(session_id: Any, row_id: Any, timestamp: Any, role: Any) -> uuid.UUID:
    """The key of a ``messages`` row without a usable uid: its immutable columns.

    ``repr`` keeps it deterministic for any value SQLite can hold (lone surrogates too).
    """
    return uuid.uuid5(NAMESPACE, f"row:{session_id!r}:{row_id!r}:{timestamp!r}:{role!r}")


def spool_key(file_name: str, index: int) -> uuid.UUID:
    """The key of the ``index``-th message of a spool file."""
    return uuid.uuid5(NAMESPACE, f"spool:{file_name!r}:{index}")


# -- turning values into fields -----------------------------------------------------------


class _Aside:
    """Collects the values of one row that could not be stored in their field."""

    def __init__(self, where: str, session_id: str | None, prefix: str) -> None:
        self.where = where
        #: May be set later (a session's id is known only once its id was checked).
        self.session_id = session_id
        self.prefix = prefix
        #: ``{field: repr(original)}``, what goes to ``moved_aside``.
        self.moved: dict[str, str] = {}
        self._problems: list[tuple[str, str]] = []

    def move(self, field: str, original: Any, problem: str) -> None:
        self.moved[field] = repr(original)
        self._problems.append((field, problem))

    @property
    def problems(self) -> list[Problem]:
        return [
            Problem(
                where=self.where,
                session_id=self.session_id,
                field=field,
                problem=problem,
                stored_as=f"{self.prefix}.{field}",
            )
            for field, problem in self._problems
        ]


def _problem(exc: ValueError, field: str) -> str:
    text = str(exc)
    return text[len(field) + 2 :] if text.startswith(f"{field}: ") else text


def _clean_text(value: str) -> str:
    return _SURROGATES.sub("\ufffd", value)


def _clean_json(value: Any, depth: int = 0) -> Any:
    """The nearest value that ``check_json`` accepts."""
    if isinstance(value, str):
        return _clean_text(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, bool | int | float):
        return str(value) if type(value) is int and value.bit_length() > 256 else value
    if depth < 60 and isinstance(value, list | tuple):
        return [_clean_json(item, depth + 1) for item in value]
    if depth < 60 and isinstance(value, dict):
        return {_clean_text(str(key)): _clean_json(item, depth + 1) for key, item in value.items()}
    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else repr(value)
    return _clean_text(text)


def _json_value(value: Any, field: str, aside: _Aside) -> Any:
    try:
        return check_json(value, field)
    except ValueError as exc:
        aside.move(field, value, _problem(exc, field))
        return _clean_json(value)
    except RecursionError:
        aside.move(field, value, "nested too deeply")
        return _clean_json(value)


def _text(value: Any, field: str, aside: _Aside) -> str | None:
    if value is None:
        return None
    if type(value) is str:
        try:
            return check_text(value, field)
        except ValueError as exc:
            aside.move(field, value, _problem(exc, field))
            return _clean_text(value)
    aside.move(field, value, f"a {type(value).__name__}, not text")
    cleaned = _clean_json(value)
    return cleaned if isinstance(cleaned, str) else json.dumps(cleaned)


def _identifier(value: Any, field: str, aside: _Aside, max_length: int = MAX_ID_LENGTH) -> Any:
    if value is None:
        return None
    if type(value) is not str:
        aside.move(field, value, f"a {type(value).__name__}, not text")
        return None
    try:
        return check_identifier(value, field, max_length)
    except ValueError as exc:
        aside.move(field, value, _problem(exc, field))
        return None


def _role(value: Any, aside: _Aside) -> str:
    if isinstance(value, str) and value in _ROLES:
        return value
    aside.move("role", value, f"{value!r} is not a role sessionrepo stores: stored as 'system'")
    return "system"


def _content(value: Any, aside: _Aside) -> Any:
    if value is None or type(value) is str:
        return _text(value, "content", aside)
    if type(value) is list or type(value) is dict:
        return _json_value(value, "content", aside)
    aside.move("content", value, f"a {type(value).__name__} is not content: stored as text")
    cleaned = _clean_json(value)
    return cleaned if isinstance(cleaned, str) else json.dumps(cleaned)


def _tool_calls(value: Any, aside: _Aside) -> list[Any] | None:
    if value is None:
        return None
    if type(value) is not list:
        aside.move("tool_calls", value, f"a {type(value).__name__}, not a list of tool calls")
        return None
    result: list[Any] = _json_value(value, "tool_calls", aside)
    return result


def _count(value: Any, field: str, aside: _Aside) -> int | None:
    if value is None:
        return None
    if type(value) is int and -(2**63) <= value < 2**63:
        return value
    aside.move(field, value, f"{value!r} is not a 64-bit integer")
    return None


def _role_field(value: Any, field: str, aside: _Aside) -> str:
    return _role(value, aside)


def _content_field(value: Any, field: str, aside: _Aside) -> Any:
    return _content(value, aside)


def _tool_calls_field(value: Any, field: str, aside: _Aside) -> list[Any] | None:
    return _tool_calls(value, aside)


#: How a source value becomes a ``Message`` field, by name, in the order a row's fields
#: are converted (the order of what ``moved_aside`` records). A field of the model not
#: named here (one added since) is taken as a JSON value, checked like ``extra``; what
#: the model then refuses is reported as rejected, never dropped silently.
_CONVERTERS: Final[dict[str, Callable[[Any, str, _Aside], Any]]] = {
    "role": _role_field,
    "content": _content_field,
    "tool_calls": _tool_calls_field,
    "tool_call_id": _identifier,
    "tool_name": _identifier,
    "finish_reason": _identifier,
    "platform_message_id": _identifier,
    "reasoning": _text,
    "token_count": _count,
}
#: ``Message`` fields the importer makes itself (the key, the time, ``extra`` and the key
#: order): never taken from a column or a dict key of that name.
_OWN_FIELDS: Final = frozenset({KEY_FIELD, "timestamp", "extra", "openai_keys"})
#: Every other field of the model (its own list, so a field added to it is read too): a
#: ``messages`` column or a spool dict key of that name becomes it.
_MESSAGE_FIELDS: Final = tuple(
    sorted(
        (name for name in Message.model_fields if name not in _OWN_FIELDS),
        key=lambda name: list(_CONVERTERS).index(name) if name in _CONVERTERS else len(_CONVERTERS),
    )
)
#: ``messages`` columns that become ``Message`` fields (``id`` and ``session_id`` place it);
#: every other one goes to ``extra["hermes"]``.
_ROW_FIELDS: Final = frozenset({"id", "session_id", "timestamp", *_MESSAGE_FIELDS})


def _convert(name: str, value: Any, aside: _Aside) -> Any:
    return _CONVERTERS.get(name, _json_value)(value, name, aside)


def _parse_json_text(value: Any, field: str, aside: _Aside) -> tuple[bool, Any]:
    """Parse a JSON text column: ``(True, value)``, or ``(False, None)`` after moving it aside."""
    if not isinstance(value, str):
        aside.move(field, value, f"a {type(value).__name__}, not JSON text")
        return False, None
    try:
        return True, json.loads(value)
    except (ValueError, RecursionError) as exc:
        aside.move(field, value, f"not valid JSON ({one_line(exc)})")
        return False, None


def _fingerprint(role: Any, content: Any, tool_call_id: Any) -> bytes:
    text = json.dumps([role, content, tool_call_id], ensure_ascii=True, default=repr)
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


# -- the import -------------------------------------------------------------------------


@dataclasses.dataclass
class _Pending:
    """Messages waiting to be appended to one stored session, with where each came from."""

    session_id: str
    messages: list[Message] = dataclasses.field(default_factory=list)
    wheres: list[str] = dataclasses.field(default_factory=list)


class _Importer:
    def __init__(
        self,
        source: HermesSource,
        repository: SessionRepository,
        *,
        batch_size: int,
        progress: Callable[[int], None] | None,
    ) -> None:
        if not 1 <= batch_size <= BATCH_SIZE:
            raise ValueError(f"batch_size must be between 1 and {BATCH_SIZE}")
        self.source = source
        self.repo = repository
        self.batch_size = batch_size
        self._began = utcnow()
        #: Newest timestamp of the messages this import stored, per session.
        self._newest: dict[str, datetime] = {}
        self.progress = progress
        self.counts = {
            "sessions_read": 0,
            "sessions_new": 0,
            "sessions_without_row": 0,
            "sessions_only_in_spool": 0,
            "history_sessions": 0,
            "rows_read": 0,
            "inactive_rows": 0,
            "spool_messages_read": 0,
            "messages_inserted": 0,
            "messages_already_present": 0,
            "messages_changed": 0,
            "messages_rejected": len(source.spool.rejected),
        }
        self.lists: dict[str, list[Problem]] = {
            "moved_aside": [],
            "changed": [],
            "rejected": list(source.spool.rejected),
            "possible_duplicates": [],
            "archived_since_import": [],
            "notes": list(source.spool.notes),
        }
        self.first_uid_rows = source.first_uid_rows()
        self.inbound_report: Path | None = None
        self.started = time.monotonic()

    # -- driving ------------------------------------------------------------------------

    def run(self, inbound_report: Path | None) -> HermesImportSummary:
        try:
            done: set[Any] = set()
            for row in self.source.sessions():
                self._import_session(row["id"], row, "row")
                done.add(row["id"])
            for raw in self.source.sessions_without_row():
                self._import_session(raw, None, "no-row")
                done.add(raw)
            for raw in sorted(set(self.source.spool.messages) - done):
                self._import_session(raw, None, "spool")
        except (HermesSourceError, HermesImportError):
            raise
        except RepoError as exc:
            raise HermesImportError(
                f"the import stopped after {self.counts['messages_inserted']:,} messages "
                f"inserted ({self.counts['messages_already_present']:,} already stored): "
                f"{exc}; run it again to continue (what is stored is not written twice)",
                self.summary(),
            ) from exc
        self._write_inbound(inbound_report)
        return self.summary()

    def summary(self) -> HermesImportSummary:
        source = self.source
        files = source.spool.files
        by_kind: dict[str, int] = {}
        for kind in (*KIND_NAMES.values(), "unparseable"):
            count = sum((item.kind_name or "unparseable") == kind for item in files)
            if count:
                by_kind[kind] = count
        unparseable = [item for item in files if item.kind is None]
        inbound = len(source.spool.inbound)
        counts = self.counts
        attention = bool(
            unparseable
            or counts["messages_changed"]
            or counts["messages_rejected"]
            or self.lists["archived_since_import"]
            or (inbound and self.inbound_report is None)
        )
        return HermesImportSummary(
            source=str(source.path),
            state_db=str(source.state_db) if source.state_db else None,
            schema_version=source.schema_version,
            spool_dir=str(source.spool_dir) if source.spool_dir else None,
            spool_not_read=str(source.spool_not_read) if source.spool_not_read else None,
            messages_read=counts["rows_read"] + counts["spool_messages_read"],
            spool_files=by_kind,
            files=files,
            unparseable_files=unparseable,
            inbound_messages=inbound,
            inbound_report=str(self.inbound_report) if self.inbound_report else None,
            needs_attention=attention,
            seconds=round(time.monotonic() - self.started, 3),
            **counts,
            **self.lists,
        )

    # -- sessions -------------------------------------------------------------------------

    def _session_id(self, raw: Any, aside: _Aside | None) -> str:
        """The stored id of a Hermes session id: the same id when it can be one, else a
        uuid5 of it (recorded in ``aside``)."""
        try:
            return check_identifier(raw, "id") if type(raw) is str else self._mapped(raw, aside)
        except ValueError:
            return self._mapped(raw, aside)

    @staticmethod
    def _mapped(raw: Any, aside: _Aside | None) -> str:
        sid = f"hermes-{uuid.uuid5(NAMESPACE, f'session:{raw!r}')}"
        if aside is not None:
            aside.move("id", raw, f"{raw!r} cannot be a session id: stored as {sid!r}")
        return sid

    def _import_session(
        self, raw: Any, row: dict[str, Any] | None, origin: Literal["row", "no-row", "spool"]
    ) -> None:
        """Import one session: its ``sessions`` row (if any), its messages, its spool."""
        where = f"state.db sessions.id={raw!r}" if row is not None else f"session {raw!r}"
        aside = _Aside(where, None, "metadata.hermes.moved_aside")
        sid = self._session_id(raw, aside)
        aside.session_id = sid
        spooled = self.source.spool.messages.get(raw, []) if isinstance(raw, str) else []
        fields: dict[str, Any] = {}
        if row is not None:
            self.counts["sessions_read"] += 1
            fields = self._session_fields(row, sid, aside)
        elif origin == "no-row":
            self.counts["sessions_without_row"] += 1
            self.lists["notes"].append(
                Problem(
                    where=where,
                    session_id=sid,
                    problem="messages without a sessions row in state.db: the session was "
                    "created from its first message",
                )
            )
        else:
            self.counts["sessions_only_in_spool"] += 1
            fields = {"started_at": spooled[0].time}
        if row is None and aside.moved:
            fields["metadata"] = {"hermes": {"moved_aside": aside.moved}}
        self.lists["moved_aside"] += aside.problems
        existed = self._exists(sid)
        if not existed:
            self.counts["sessions_new"] += 1
        if origin != "no-row":
            self.repo.create_session(sid, **fields)
        self._import_messages(raw, sid, fields, existed, spooled, create=origin == "no-row")

    def _exists(self, sid: str) -> bool:
        try:
            self.repo.get_session(sid)
        except NotFound:
            return False
        return True

    def _session_fields(self, row: dict[str, Any], sid: str, aside: _Aside) -> dict[str, Any]:
        hermes: dict[str, Any] = {}
        for name, value in row.items():
            if name not in _SESSION_FIELDS and value is not None:
                hermes[name] = value
        fields: dict[str, Any] = {}
        source = _identifier(row.get("source"), "source", aside)
        if source is not None:
            fields["source"] = source
        for name in ("user_id", "model"):
            value = _identifier(row.get(name), name, aside)
            if value is not None:
                fields[name] = value
        title = _text(row.get("title"), "title", aside)
        if title is not None:
            fields["title"] = title
        config = row.get("model_config")
        if config is not None:
            parsed: Any = None
            try:
                parsed = json.loads(config) if isinstance(config, str) else None
            except (ValueError, RecursionError):
                parsed = None
            if isinstance(parsed, dict):
                fields["model_config"] = _json_value(parsed, "model_config", aside)
                del hermes["model_config"]
            else:
                self.lists["notes"].append(
                    Problem(
                        where=aside.where,
                        session_id=sid,
                        field="model_config",
                        problem="not a JSON object: kept as it was",
                        stored_as="metadata.hermes.model_config",
                    )
                )
        prompt = _text(row.get("system_prompt"), "system_prompt", aside)
        prompt_hash = row.get("system_prompt_hash")
        if prompt is None and prompt_hash is not None:
            prompt = _text(self.source.system_prompt(prompt_hash), "system_prompt", aside)
            if prompt is None:
                self.lists["notes"].append(
                    Problem(
                        where=aside.where,
                        session_id=sid,
                        field="system_prompt_hash",
                        problem=f"{prompt_hash!r} is not in system_prompts: no system prompt",
                        stored_as="metadata.hermes.system_prompt_hash",
                    )
                )
        if prompt is not None:
            fields["system_prompt"] = prompt
        parent = row.get("parent_session_id")
        if parent is not None:
            fields["parent_session_id"] = self._session_id(parent, None)
            if fields["parent_session_id"] != parent:
                aside.move(
                    "parent_session_id",
                    parent,
                    f"cannot be a session id: stored as {fields['parent_session_id']!r}",
                )
        started = epoch_seconds(row.get("started_at"))
        if started is None:
            ended = epoch_seconds(row.get("ended_at"))
            started = ended if ended is not None else 0.0
            aside.move("started_at", row.get("started_at"), "not epoch seconds")
        fields["started_at"] = started
        if row.get("ended_at") is not None:
            ended = epoch_seconds(row.get("ended_at"))
            if ended is None:
                aside.move("ended_at", row.get("ended_at"), "not epoch seconds: left open")
            else:
                fields["ended_at"] = ended
        reason = _identifier(row.get("end_reason"), "end_reason", aside, 1024)
        if reason is not None:
            fields["end_reason"] = reason
        for name in ("input_tokens", "output_tokens"):
            count = _count(row.get(name), name, aside)
            if count is not None:
                fields[name] = count
        cleaned = {name: _json_value(value, name, aside) for name, value in hermes.items()}
        if aside.moved:
            cleaned["moved_aside"] = aside.moved
        fields["metadata"] = {"hermes": cleaned}
        return fields

    # -- messages -------------------------------------------------------------------------

    def _import_messages(
        self,
        raw: Any,
        sid: str,
        fields: Mapping[str, Any],
        existed: bool,
        spooled: list[SpoolMessage],
        *,
        create: bool,
    ) -> None:
        live = _Pending(sid)
        history: _Pending | None = None
        history_inserted: dict[uuid.UUID, str] = {}
        prints: set[bytes] = set()
        last_time = fields.get("started_at")
        created = not create
        for row in self.source.messages(raw) if self.source.state_db else ():
            self.counts["rows_read"] += 1
            built = self._row_message(row, raw, sid, last_time)
            if built is None:
                continue
            message, active, where = built
            last_time = message.timestamp
            if not created:
                # Messages without a sessions row: the session starts with its first one.
                self.repo.create_session(sid, **{**fields, "started_at": message.timestamp})
                created = True
            if active:
                if spooled:
                    prints.add(_fingerprint(message.role, message.content, message.tool_call_id))
                self._add(live, message, where)
                continue
            self.counts["inactive_rows"] += 1
            if history is None:
                history = _Pending(self._history_session(sid, fields, message))
            inserted = self._add(history, message, where)
            history_inserted |= inserted
        for item in spooled:
            self.counts["spool_messages_read"] += 1
            spooled_message = self._spool_message(item, sid)
            if spooled_message is None:
                continue
            where = f"{SPOOL_DIR}/{item.file} {item.path}"
            fingerprint = _fingerprint(
                spooled_message.role, spooled_message.content, spooled_message.tool_call_id
            )
            if fingerprint in prints:
                self.lists["possible_duplicates"].append(
                    Problem(
                        where=where,
                        session_id=sid,
                        problem="same role, content and tool_call_id as a state.db row of "
                        "this session (a replay that inserted it and crashed before deleting "
                        "the file?): stored anyway",
                    )
                )
            self._add(live, spooled_message, where)
        self._flush(live)
        if not existed:
            self._settle_activity(sid, fields)
        if history is not None:
            history_inserted |= self._flush(history)
            self._settle_activity(history.session_id, fields)
        if existed and history_inserted:
            self._check_archived(sid, history_inserted)

    def _settle_activity(self, sid: str, fields: Mapping[str, Any]) -> None:
        """Date a session this import created by its own history: its last activity is
        its newest message (or its end), not the moment of the import, so that listings
        keep the Hermes gateway's order. It replaces the stamp this import's appends set
        (the import's own time), or moves an older one forward."""
        known = [when for when in [self._newest.pop(sid, None)] if when is not None]
        for name in ("started_at", "ended_at"):
            if fields.get(name) is not None:
                known.append(to_utc(fields[name], name))  # a spool file's time is epoch
        if not known:
            return
        self.repo.backdate_activity(sid, max(known), stamped_since=self._began)

    def _history_session(self, sid: str, fields: Mapping[str, Any], first: Message) -> str:
        if len(sid) + len(HISTORY_SUFFIX) <= MAX_ID_LENGTH:
            history = sid + HISTORY_SUFFIX
        else:
            history = f"hermes-history-{uuid.uuid5(NAMESPACE, f'history:{sid}')}"
        if not self._exists(history):
            self.counts["history_sessions"] += 1
        values = {name: fields[name] for name in ("source", "user_id", "model") if name in fields}
        self.repo.create_session(
            history,
            **values,
            started_at=fields.get("started_at", first.timestamp),
            ended_at=fields.get("ended_at", first.timestamp),
            end_reason=HISTORY_END_REASON,
            metadata={
                "hermes": {
                    "history_of": sid,
                    "holds": "rows with active = 0 (archived by compaction or undone by "
                    "rewind), in id order",
                }
            },
        )
        return history

    def _row_message(
        self, row: dict[str, Any], raw_session: Any, sid: str, last_time: Any
    ) -> tuple[Message, bool, str] | None:
        row_id = row["id"]
        where = f"state.db messages.id={row_id}"
        aside = _Aside(where, sid, "extra.hermes.moved_aside")
        hermes: dict[str, Any] = {"id": row_id}
        raw_time = row.get("timestamp")
        if raw_time is not None:
            hermes["timestamp"] = raw_time
        for name, value in row.items():
            if name not in _ROW_FIELDS and value is not None:
                hermes[name] = value

        fields: dict[str, Any] = {}
        content = row.get("content")
        if isinstance(content, str) and content.startswith(JSON_CONTENT_MARK):
            try:
                parsed = json.loads(content[len(JSON_CONTENT_MARK) :])
            except (ValueError, RecursionError) as exc:
                parsed = content
                self.lists["notes"].append(
                    Problem(
                        where=where,
                        session_id=sid,
                        field="content",
                        problem=f"marked as JSON but not valid JSON ({one_line(exc)}): "
                        "stored as the text it was",
                    )
                )
            else:
                hermes["content_encoding"] = "json"
            content = parsed
        for name in _MESSAGE_FIELDS:
            value = content if name == "content" else row.get(name)
            if name == "tool_calls" and value is not None:  # JSON text in a column
                ok, value = _parse_json_text(value, name, aside)
                if not ok:
                    fields[name] = None
                    continue
            fields[name] = _convert(name, value, aside)
        if "content" in aside.moved:
            aside.moved["content"] = repr(row.get("content"))  # the column, as it was
        when = epoch_seconds(raw_time)
        if when is None:
            aside.move("timestamp", raw_time, "not epoch seconds: the previous row's time is used")
            when = last_time if last_time is not None else 0.0

        uid = row.get("message_uid")
        if isinstance(uid, str) and uid and self.first_uid_rows.get(uid, row_id) == row_id:
            key = uid_key(uid)
        else:
            key = row_key(raw_session, row_id, raw_time, row.get("role"))
        cleaned = {name: _json_value(value, name, aside) for name, value in hermes.items()}
        if aside.moved:
            cleaned["moved_aside"] = aside.moved
        active = row.get("active") not in (0, "0")
        message = self._message(
            where,
            sid,
            aside,
            client_msg_uuid=key,
            timestamp=when,
            extra={"hermes": cleaned},
            **fields,
        )
        return None if message is None else (message, active, where)

    def _spool_message(self, item: SpoolMessage, sid: str) -> Message | None:
        where = f"{SPOOL_DIR}/{item.file} {item.path}"
        provenance_key = "hermes"
        while provenance_key in item.message:
            provenance_key += "_import"
        aside = _Aside(where, sid, f"extra.{provenance_key}.moved_aside")
        key = spool_key(item.file, item.index)
        fields: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        keys: list[str] = []
        for name, value in item.message.items():
            if name == KEY_FIELD:
                try:
                    key = uuid.UUID(str(value))
                except ValueError:
                    aside.move(KEY_FIELD, value, "not a UUID: the spool key is used")
                continue
            keys.append(name)
            if name in _MESSAGE_FIELDS:
                fields[name] = _convert(name, value, aside)
            else:
                clean_name = _clean_text(name)
                if clean_name != name:
                    aside.move(clean_name, name, "a key that is not valid Unicode")
                    keys[-1] = clean_name
                extra[clean_name] = _json_value(value, clean_name, aside)
        if "role" not in fields:
            fields["role"] = _role(None, aside)
            keys.insert(0, "role")
        provenance = dict(item.provenance)
        if aside.moved:
            provenance["moved_aside"] = aside.moved
        extra[provenance_key] = _clean_json(provenance)
        keys.append(provenance_key)
        own_time = item.message.get("timestamp")
        when = epoch_seconds(own_time)
        if when is None and isinstance(own_time, str):
            when = _iso_epoch(own_time)
        if when is None:
            when = item.time  # the payload's ts, else its file's modification time
        return self._message(
            where,
            sid,
            aside,
            client_msg_uuid=key,
            timestamp=when,
            extra=extra,
            openai_keys=tuple(keys),
            **fields,
        )

    def _message(self, where: str, sid: str, aside: _Aside, **values: Any) -> Message | None:
        self.lists["moved_aside"] += aside.problems
        try:
            return Message(**values)
        except ValidationError as exc:  # every field was checked: a gap in the checks above
            self.counts["messages_rejected"] += 1
            self.lists["rejected"].append(
                Problem(
                    where=where,
                    session_id=sid,
                    problem=f"cannot be stored: {one_line(exc)}; it stays in the source",
                )
            )
            if self.progress is not None:
                self.progress(1)
            return None

    # -- writing --------------------------------------------------------------------------

    def _add(self, pending: _Pending, message: Message, where: str) -> dict[uuid.UUID, str]:
        pending.messages.append(message)
        pending.wheres.append(where)
        if len(pending.messages) >= self.batch_size:
            return self._flush(pending)
        return {}

    def _flush(self, pending: _Pending) -> dict[uuid.UUID, str]:
        """Append what is pending; the keys inserted, with where each came from."""
        messages, wheres = pending.messages, pending.wheres
        pending.messages, pending.wheres = [], []
        total = len(messages)
        inserted: dict[uuid.UUID, str] = {}
        while messages:
            try:
                result = self.repo.append(pending.session_id, messages)
            except InvalidMessage as exc:
                match = _BATCH_INDEX.match(exc.field)
                if match is None:
                    raise
                index = int(match.group(1))
                self.counts["messages_rejected"] += 1
                self.lists["rejected"].append(
                    Problem(
                        where=wheres[index],
                        session_id=pending.session_id,
                        field=exc.field.partition(".")[2] or None,
                        problem=f"{exc.reason}: not stored; it stays in the source",
                    )
                )
                del messages[index], wheres[index]
                continue
            where_of = dict(zip((m.client_msg_uuid for m in messages), wheres, strict=True))
            for key in result.inserted:
                inserted[key] = where_of[key]
            if result.inserted:
                newest = max(message.timestamp for message in messages)
                known = self._newest.get(pending.session_id)
                self._newest[pending.session_id] = newest if known is None else max(known, newest)
            self.counts["messages_inserted"] += len(result.inserted)
            self.counts["messages_already_present"] += len(result.duplicates)
            self.counts["messages_changed"] += len(result.conflicts)
            for key in result.conflicts:
                self.lists["changed"].append(
                    Problem(
                        where=where_of[key],
                        session_id=pending.session_id,
                        problem=f"stored earlier (key {key}) with different content: the "
                        "source changed since; the stored message was kept",
                    )
                )
            break
        if self.progress is not None and total:
            self.progress(total)
        return inserted

    def _check_archived(self, sid: str, history_inserted: dict[uuid.UUID, str]) -> None:
        live = {message.client_msg_uuid for message in self.repo.load_transcript(sid)}
        for key, where in history_inserted.items():
            if key in live:
                self.lists["archived_since_import"].append(
                    Problem(
                        where=where,
                        session_id=sid,
                        field="active",
                        problem="stored as live by an earlier import, archived by Hermes "
                        "since (active = 0): the live copy is kept (append-only) and the "
                        "row is in the history session too",
                    )
                )

    # -- inbound (kinds 1 and 2) ----------------------------------------------------------

    def _write_inbound(self, path: Path | None) -> None:
        inbound = self.source.spool.inbound
        if not inbound or path is None:
            return
        lines = []
        for _, record in inbound:
            try:
                lines.append(json.dumps(record, ensure_ascii=False) + "\n")
                lines[-1].encode("utf-8")
            except UnicodeEncodeError:
                lines[-1] = json.dumps(record, ensure_ascii=True) + "\n"
        path = path.expanduser().absolute()
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            with open(temporary, "w", encoding="utf-8") as handle:
                handle.writelines(lines)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temporary, path)
        except OSError as exc:
            temporary.unlink(missing_ok=True)
            raise RepoError(f"cannot write the inbound report {path}: {exc}") from exc
        self.inbound_report = path


def _iso_epoch(text: str) -> float | None:
    from datetime import datetime

    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    if parsed.tzinfo is None:
        return None
    return epoch_seconds(parsed.timestamp())


def import_hermes(
    source: HermesSource | str | os.PathLike[str],
    repository: SessionRepository,
    *,
    inbound_report: str | os.PathLike[str] | None = None,
    progress: Callable[[int], None] | None = None,
    batch_size: int = BATCH_SIZE,
) -> HermesImportSummary:
    """Import a Hermes home (or ``state.db``) into ``repository``; see the module docstring.

    Safe to run again: what is already stored is not written twice.

    Args:
        source: an open :class:`HermesSource` (left open), or a path to open (and close).
        repository: the store to write to.
        inbound_report: where to write the inbound user messages of spool kinds 1 and 2
            (JSON lines) for re-delivery; ``None`` writes nothing (they are counted, and
            stay in the spool). See :func:`default_inbound_report`.
        progress: called with the number of messages just processed (a progress bar's
            ``update``); the calls add up to ``source.total_messages``.
        batch_size: messages per transaction, at most 500.

    Raises:
        HermesSourceError: the source cannot be read.
        HermesImportError: the store failed part-way (``.summary`` says how far it got).
    """
    opened = source if isinstance(source, HermesSource) else open_hermes(source)
    try:
        importer = _Importer(opened, repository, batch_size=batch_size, progress=progress)
        report = Path(inbound_report) if inbound_report is not None else None
        return importer.run(report)
    finally:
        if opened is not source:
            opened.close()
