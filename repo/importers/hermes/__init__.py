"""Import a Hermes gateway's history: its ``state.db`` and its ``pending_messages/`` spool.

The formats are described in ``hermes-state-format.md``. :mod:`.source` reads them,
this module turns what it read into sessions and messages and writes them through the
public methods of :class:`~sessionrepo.store.repository.SessionRepository` (no SQL of its
own), and :mod:`.summary` holds what an import reports. What it decides, and why:

**The source is never modified.** ``state.db`` is not opened where it lies: SQLite writes
into the ``-shm`` file of a WAL database even on a read-only connection, creates
``-wal``/``-shm`` when they are missing, and an ``immutable`` open would miss the WAL tail
of a killed gateway. :mod:`.source` copies ``state.db`` and its ``-wal`` (or ``-journal``)
into a private temporary directory, again when a file changed while it was copied, and
reads the copy (SQLite rebuilds the ``-shm`` index there). So the gateway's home stays
byte-for-byte the same, whether a gateway is running, was killed, or stopped cleanly; the
import sees one consistent snapshot. Nothing under the Hermes home is written, renamed or
deleted, spool files included. Text is decoded with ``surrogateescape``, so a row holding
invalid UTF-8 is imported (and reported) instead of aborting the import.

**Schema versions.** Columns are found with ``PRAGMA table_info``; whatever exists is read
(version 2 to 31 and later), nothing is assumed beyond ``sessions.id``, ``messages.id``,
``messages.session_id`` and ``messages.role``. ``messages_fts`` and other tables are
ignored, except ``system_prompts`` (the prompt a session's ``system_prompt_hash`` names),
``gateway_routing`` (where inbound messages go) and ``async_delegations`` (results never
delivered are reported).

**Profiles.** A named profile (``profiles/<name>/``) is a Hermes home of its own; the CLI
imports the root home and every profile (:func:`hermes_profiles`), and each session's
``metadata["hermes"]["profile"]`` names its profile (``"default"`` for the root home).

**Sessions.** Each Hermes session becomes a session with the same id. Mapped to fields:
``source``, ``user_id``, ``title``, ``model``, ``model_settings`` (Hermes'
``model_config``, JSON text parsed to a dict), ``system_prompt`` (or the prompt
``system_prompt_hash`` names), ``parent_session_id``, ``started_at`` / ``ended_at``,
``end_reason``, ``input_tokens`` / ``output_tokens``. Every other non-NULL column goes to
``metadata["hermes"]`` under its column name.

**Messages.** Rows are read in ``id`` order (Hermes' transcript order). Mapped to fields:
``role``, ``content`` (the ``"\\x00json:"`` form becomes the JSON content parts it
encodes), ``tool_calls``, ``tool_call_id``, ``tool_name``, ``reasoning``,
``finish_reason``, ``token_count``, ``timestamp``, ``platform_message_id``. Every other
non-NULL column goes to ``extra["hermes"]`` under its column name, plus the row's ``id``
and exact ``timestamp`` REAL. JSON-valued columns are kept as the text Hermes stored; a
BLOB (``display_identity``) as ``{"base64": "<its bytes>"}``, which gives the bytes back
exactly. ``extra["hermes"]`` is import provenance: drop it before sending a loaded
transcript to a provider.

**Rows that are not conversation** are kept, out of the live transcript, the way Hermes
keeps them out of the model's history: ``active = 0`` (``archived`` by compaction, or
``rewound``), ``display_kind = 'hidden'`` and ``role = 'session_meta'`` bookkeeping rows
(stored with role ``system``, the Hermes role in ``extra["hermes"]["role"]``). Each has its
state in ``extra["hermes"]["state"]``. They are stored in their own session, in ``id``
order with the other rows (each ``seq`` where Hermes had it), and retracted there
(``superseded == "retracted"``; the store's ``compacted`` state is only set by its own
``compact``, which writes a summary, so an archived row is retracted too and says
``archived`` in its state): :meth:`_Importer._set_aside` is the one place that decides
it. So ``load_transcript(id)`` is the conversation Hermes' own reader presents,
``load_transcript(id, include_retracted=True)`` every row, and ``search`` finds none of
these. A row an earlier import stored live that Hermes took out of the conversation since
is retracted by the next import (listed in ``archived_since_import``).

**Keys: one per logical message, whatever route it took.** A message can be read as a
``state.db`` row, as a kind-3 payload (and, after a Hermes restart replayed it, as a row),
or in a kind-4 dump. Keys never depend on a path or a row ``id``:

- a message with a ``message_uid`` gets :func:`uid_key` (a gateway that knows the uid can
  compute it), by whichever route it comes. Copies a compaction made (a later row of the
  same session with the same uid) get :func:`copy_key` of the uid and their rank among the
  copies: distinct rows, and stable (compaction only adds rows). A later *live* row of a
  uid whose earlier row is live too is not a copy but the message stored twice (Hermes'
  spool replay is not idempotent): it is kept once and listed.
- a message without a uid gets :func:`content_key`: its session, role, content and how many
  messages of that session with the same role and content come before it (rows in ``id``
  order, then the spool in the order a Hermes restart replays it). A restart appends the
  replayed messages after the rows in that same order, so each keeps its key. Should the
  restart give a replayed inbound message a uid of its own, the row is recognised (a
  ``user`` row dated to the payload's integer ``ts``, whose content key an earlier import
  stored from the spool) and keeps that key.

The same message read by another route is *already present*, not a conflict: when the key
is stored with other provenance (a spool payload then, a row now) and the same role and
content (for a content key, the same timestamp too), it is counted as already present.

**The spool** is read, never changed; unparseable or unrecognised files are reported and
stay where they are. Files are read as ``utf-8-sig`` (a BOM is fine); ``.json.bad`` files
(a payload the gateway's database refused) are payloads; ``.pending-*.tmp`` files are
half-written and noted, not read.

- Kinds 1 and 2 (inbound user text the agent never processed) become ``user`` messages,
  ``timestamp = ts``, of the session Hermes would append them to: ``data.session_id``, else
  the session ``session_key`` routes to (``gateway_routing``, else the newest session with
  that ``session_key``), followed to the live tip of its compression chain. One that no
  session can be found for is listed (it needs a person) and stays in the spool.
- Kind 3 (transcript cap drop) is stored in its session with every key of the dict
  (``tool_calls``, ``tool_call_id``, ``reasoning``, ``message_uid`` and unknown keys alike).
  Its timestamp is the dict's own ``"timestamp"``, else the payload's ``ts``.
- Kinds 1 to 3 join their session after its rows in Hermes' replay order
  ``(ts, seq, file name)``; provenance in ``extra["hermes"]`` (file, kind, reason, ts, seq).
- Kind 4 (agent-history dump) holds the agent's whole conversation: an entry whose
  ``message_uid`` ``state.db`` holds, or that says ``_db_persisted`` without a uid, is
  skipped and counted as already persisted; the rest are stored after the replayed kinds
  (Hermes never replays kind 4), dated by their own ``"timestamp"``, else the file's time.

**Values that cannot be stored faithfully** (a lone surrogate, invalid UTF-8, a control
character in an id, NaN, JSON that does not parse) never abort the import. The field gets
the nearest storable value and the original goes, as its ``repr()``, to
``extra["hermes"]["moved_aside"][field]`` (``metadata["hermes"]["moved_aside"]`` for
sessions); the summary lists each one.

**Writes** go straight to the primary with ``SessionRepository.append``, in batches of at
most 500 messages per transaction. A database failure stops the import with an error that
says how far it got; running it again continues. A message the store rejects for its size
is reported and the rest of its batch is stored.

**Running it again** on an unchanged source inserts nothing, and neither does a run after a
Hermes restart replayed the spool into ``state.db``. A row Hermes changed in place since an
earlier import has the same key and different content: the stored row is kept
(append-only) and listed; a row archived since an earlier import is listed too.
"""

from __future__ import annotations

import base64
import collections
import dataclasses
import json
import math
import os
import re
import time
import uuid
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, Final, Literal, get_args

from pydantic import ValidationError

from sessionrepo.errors import InvalidMessage, NotFound, RepoError
from sessionrepo.importers.hermes.source import (
    KIND_NAMES,
    PROFILES_DIR,
    SPOOL_DIR,
    STATE_DB,
    HermesSource,
    SpoolMessage,
    epoch_seconds,
    hermes_profiles,
    one_line,
    open_hermes,
)
from sessionrepo.importers.hermes.summary import (
    HermesImportError,
    HermesImportReport,
    HermesImportSummary,
    HermesSourceError,
    Problem,
    SpoolFile,
)
from sessionrepo.models import Message, StoredMessage
from sessionrepo.models._limits import MAX_ID_LENGTH, check_identifier, check_json, check_text
from sessionrepo.models.message import KEY_FIELD, Role, to_utc, utcnow
from sessionrepo.store.repository import SessionRepository

__all__ = [
    "BATCH_SIZE",
    "DEFAULT_PROFILE",
    "JSON_CONTENT_MARK",
    "KIND_NAMES",
    "NAMESPACE",
    "PROFILES_DIR",
    "SPOOL_DIR",
    "STATE_DB",
    "HermesImportError",
    "HermesImportReport",
    "HermesImportSummary",
    "HermesSource",
    "HermesSourceError",
    "Problem",
    "SpoolFile",
    "content_key",
    "copy_key",
    "hermes_profiles",
    "import_hermes",
    "open_hermes",
    "row_state",
    "uid_key",
]

#: The uuid5 namespace of every key this importer makes (see :func:`uid_key`).
NAMESPACE: Final = uuid.UUID("0b4f6c1e-8a57-5d0c-9e3a-6d2f1b7c4a90")
#: ``metadata["hermes"]["profile"]`` of the sessions of a root Hermes home.
DEFAULT_PROFILE: Final = "default"
#: Most messages written per transaction.
BATCH_SIZE: Final = 500
#: How Hermes marks a ``content`` value that is JSON (multimodal parts).
JSON_CONTENT_MARK: Final = "\x00json:"
#: Hermes' bookkeeping role: not part of the conversation.
SESSION_META: Final = "session_meta"
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
    """The key of the message a Hermes ``message_uid`` names (its first row)."""
    return uuid.uuid5(NAMESPACE, "message_uid:" + message_uid)


def copy_key(message_uid: str, rank: int) -> uuid.UUID:
    """The key of the ``rank``-th later row of a session carrying ``message_uid`` (a copy
    made by compaction; the first row has :func:`uid_key`)."""
    return uuid.uuid5(NAMESPACE, f"message_uid:{message_uid}:copy:{rank}")


def content_key(session_id: Any, role: Any, content: Any, occurrence: int) -> uuid.UUID:
    """The key of a message without a uid: the ``occurrence``-th message (from 0) of its
    session with this role and content, in transcript order.

    ``content`` is the decoded value (text, or the JSON content parts). ``repr`` and
    ASCII-escaped JSON keep it deterministic for any value (lone surrogates too).
    """
    text = json.dumps(content, ensure_ascii=True, default=repr)
    return uuid.uuid5(NAMESPACE, f"content:{session_id!r}:{role!r}:{occurrence}:{text}")


def row_state(row: Mapping[str, Any]) -> str | None:
    """Why a ``messages`` row is not part of the conversation, else ``None``:
    ``archived`` (compaction), ``rewound``, ``session_meta`` or ``hidden``."""
    if row.get("active") in (0, "0"):
        return "archived" if row.get("compacted") in (1, "1") else "rewound"
    if row.get("role") == SESSION_META:
        return SESSION_META
    if row.get("display_kind") == "hidden":
        return "hidden"
    return None


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


def _column(value: Any, field: str, aside: _Aside) -> Any:
    """A column kept in ``extra``/``metadata``: a BLOB as ``{"base64": ...}`` (Hermes keeps
    JSON as text, so a dict there can only be one), anything else checked as JSON."""
    if isinstance(value, bytes):
        return {"base64": base64.b64encode(value).decode("ascii")}
    return _json_value(value, field, aside)


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
    if value == SESSION_META:  # kept in extra["hermes"]["role"]; the row is set aside
        return "system"
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


def _fingerprint(role: Any, content: Any) -> str:
    return json.dumps([role, content], ensure_ascii=True, default=repr)


# -- the import -------------------------------------------------------------------------


@dataclasses.dataclass
class _Pending:
    """Messages waiting to be appended to one stored session, with where each came from
    and what kind of key each has (``uid`` or ``content``)."""

    session_id: str
    messages: list[Message] = dataclasses.field(default_factory=list)
    wheres: list[str] = dataclasses.field(default_factory=list)
    kinds: list[str] = dataclasses.field(default_factory=list)
    #: Keys of the rows that are not conversation, to retract once the writes are done
    #: (a row the store rejected is taken out again).
    marked: dict[uuid.UUID, str] = dataclasses.field(default_factory=dict)
    #: Keys this run inserted.
    inserted: set[uuid.UUID] = dataclasses.field(default_factory=set)


@dataclasses.dataclass
class _Keys:
    """How one Hermes session's messages are keyed, in transcript order (rows in ``id``
    order, then the spool in replay order)."""

    raw_session: Any
    #: Rows kept so far per ``message_uid`` (the first one is the message, later ones copies).
    uid_rows: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    #: ``message_uid``s a live row of the session carries so far.
    live_uids: set[str] = dataclasses.field(default_factory=set)
    #: Messages seen so far per (role, content).
    seen: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    #: (role, content) of the rows, for spotting a spool message equal to a row.
    row_prints: set[str] = dataclasses.field(default_factory=set)

    def count(self, role: Any, content: Any) -> int:
        """How many messages with this role and content came before; counts this one."""
        fingerprint = _fingerprint(role, content)
        occurrence = self.seen[fingerprint]
        self.seen[fingerprint] += 1
        return occurrence

    def for_row(
        self, uid: Any, role: Any, content: Any, live: bool
    ) -> tuple[uuid.UUID, str, uuid.UUID]:
        """The key of a row, and its kind: ``uid``, ``content``, or ``duplicate`` (a second
        live row of a uid whose earlier row is still live: not a compaction copy, which
        replaces an archived row, but the same message stored twice, as Hermes' own spool
        replay does when it crashed between its insert and deleting the file); last, the
        key the row would have without its uid."""
        occurrence = self.count(role, content)  # a duplicate too: the spool copy counted
        self.row_prints.add(_fingerprint(role, content))
        by_content = content_key(self.raw_session, role, content, occurrence)
        if isinstance(uid, str) and uid:
            if live and uid in self.live_uids:
                return uid_key(uid), "duplicate", by_content
            if live:
                self.live_uids.add(uid)
            rank = self.uid_rows[uid]
            self.uid_rows[uid] += 1
            return (uid_key(uid) if rank == 0 else copy_key(uid, rank)), "uid", by_content
        return by_content, "content", by_content

    def for_spool(self, uid: Any, role: Any, content: Any) -> tuple[uuid.UUID, str]:
        occurrence = self.count(role, content)
        if isinstance(uid, str) and uid:
            # Never a copy: a spooled message whose uid a row has is that row (a replay
            # that crashed before deleting its file).
            return uid_key(uid), "uid"
        return content_key(self.raw_session, role, content, occurrence), "content"


def _route(message: Message) -> str:
    """``spool`` when a message was stored from a spool payload, else ``row``."""
    for value in message.extra.values():
        if isinstance(value, dict) and "spool_file" in value:
            return "spool"
    return "row"


def _spool_kind(message: Message) -> Any:
    for value in message.extra.values():
        if isinstance(value, dict) and "spool_file" in value:
            return value.get("kind")
    return None


#: The ``extra["hermes"]`` columns that say whether a row is part of the conversation.
_STATE_COLUMNS: Final = ("active", "compacted", "state")


def _same_but_state(new: Message, stored: StoredMessage) -> bool:
    """The same row, stored earlier: only whether it is part of the conversation
    (``extra.hermes.active/compacted/state``) changed since."""
    if _route(new) != "row" or _route(stored) != "row":
        return False
    mine = new.model_dump(exclude={"extra"})
    theirs = stored.model_dump(include=set(mine) | {"extra"})
    extra = theirs.pop("extra")
    if mine != theirs or set(extra) != set(new.extra):
        return False
    return all(
        _stateless(value) == _stateless(extra[name]) if name == "hermes" else value == extra[name]
        for name, value in new.extra.items()
    )


def _stateless(hermes: Any) -> Any:
    if not isinstance(hermes, dict):
        return hermes
    return {name: value for name, value in hermes.items() if name not in _STATE_COLUMNS}


def _same_message(new: Message, stored: StoredMessage, kind: str) -> bool:
    """The same logical message read by another route (spool then, row now, or back)."""
    if _route(new) == _route(stored):
        return False
    if (new.role, new.content) != (stored.role, stored.content):
        return False
    return kind == "uid" or new.timestamp == stored.timestamp


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
        self.profile = source.profile or DEFAULT_PROFILE
        self._began = utcnow()
        #: Newest timestamp of the messages this import stored, per session.
        self._newest: dict[str, datetime] = {}
        #: Keys of the inbound (kind 1 and 2) messages, to count what was delivered.
        self._inbound_keys: set[uuid.UUID] = set()
        #: Sessions stored before this run, and their stored inbound keys (read lazily).
        self._existed: set[str] = set()
        self._stored_inbound: dict[str, set[uuid.UUID]] = {}
        self.progress = progress
        spool = source.spool
        self.counts = {
            "sessions_read": 0,
            "sessions_new": 0,
            "sessions_without_row": 0,
            "sessions_only_in_spool": 0,
            "rows_read": 0,
            "inactive_rows": 0,
            "spool_messages_read": 0,
            "messages_inserted": 0,
            "messages_already_present": 0,
            "messages_seen_by_another_route": 0,
            "messages_changed": 0,
            "messages_rejected": len(spool.rejected),
            "inbound_messages": len(spool.inbound),
            "inbound_inserted": 0,
        }
        self.set_aside: collections.Counter[str] = collections.Counter()
        self.lists: dict[str, list[Problem]] = {
            "moved_aside": [],
            "changed": [],
            "rejected": list(spool.rejected),
            "inbound_undelivered": list(spool.undelivered),
            "archived_since_import": [],
            "dump_entries_persisted": [
                Problem(
                    where=f"{SPOOL_DIR}/{entry.file} messages[{entry.index}]",
                    session_id=entry.session,
                    problem=(
                        f"already in state.db (message_uid {entry.message_uid}): skipped"
                        if entry.how == "verified"
                        else "marked _db_persisted (no message_uid to check): skipped"
                    ),
                )
                for entry in spool.persisted
            ],
            "possible_duplicates": [],
            "duplicate_rows": [],
            "pending_delegations": self._delegations(),
            "notes": list(spool.notes),
        }
        self.started = time.monotonic()

    def _delegations(self) -> list[Problem]:
        found = []
        for row in self.source.pending_delegations():
            status = row.get("status")
            found.append(
                Problem(
                    where=f"state.db async_delegations id={row.get('id')!r}",
                    session_id=row.get("session_id")
                    if isinstance(row.get("session_id"), str)
                    else None,
                    problem="a delegated task whose result was never delivered to its session"
                    + (f" (status {status!r})" if status is not None else "")
                    + ": it is not part of any transcript; Hermes delivers it on its next run",
                )
            )
        return found

    # -- driving ------------------------------------------------------------------------

    def run(self) -> HermesImportSummary:
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
        counts = self.counts
        lists = self.lists
        attention = bool(
            unparseable
            or counts["messages_changed"]
            or counts["messages_rejected"]
            or lists["inbound_undelivered"]
        )
        return HermesImportSummary(
            source=str(source.path),
            profile=self.profile,
            state_db=str(source.state_db) if source.state_db else None,
            schema_version=source.schema_version,
            spool_dir=str(source.spool_dir) if source.spool_dir else None,
            spool_not_read=str(source.spool_not_read) if source.spool_not_read else None,
            messages_read=counts["rows_read"] + counts["spool_messages_read"],
            set_aside_rows=dict(sorted(self.set_aside.items())),
            spool_files=by_kind,
            files=files,
            unparseable_files=unparseable,
            needs_attention=attention,
            seconds=round(time.monotonic() - self.started, 3),
            **counts,
            **lists,
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
        if row is None:
            hermes: dict[str, Any] = {"profile": self.profile}
            if aside.moved:
                hermes["moved_aside"] = aside.moved
            fields["metadata"] = {"hermes": hermes}
        self.lists["moved_aside"] += aside.problems
        existed = self._exists(sid)
        if existed:
            self._existed.add(sid)
        else:
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
                fields["model_settings"] = _json_value(parsed, "model_config", aside)
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
        cleaned = {name: _column(value, name, aside) for name, value in hermes.items()}
        cleaned["profile"] = self.profile
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
        keys = _Keys(raw)
        last_time = fields.get("started_at")
        created = not create
        for row in self.source.messages(raw):
            self.counts["rows_read"] += 1
            built = self._row_message(row, sid, last_time, keys)
            if built is None:
                continue
            message, kind, state, where = built
            last_time = message.timestamp
            if not created:
                # Messages without a sessions row: the session starts with its first one.
                self.repo.create_session(sid, **{**fields, "started_at": message.timestamp})
                created = True
            if state is None:
                self._add(live, message, where, kind)
                continue
            self.set_aside[state] += 1
            if row.get("active") in (0, "0"):
                self.counts["inactive_rows"] += 1
            self._set_aside(live, message, where, kind)
        for item in spooled:
            self.counts["spool_messages_read"] += 1
            built_spool = self._spool_message(item, sid, keys)
            if built_spool is None:
                continue
            message, kind = built_spool
            where = f"{SPOOL_DIR}/{item.file} {item.path}"
            if (
                kind == "content"
                and _fingerprint(item.message.get("role"), item.message.get("content"))
                in keys.row_prints
            ):
                self.lists["possible_duplicates"].append(
                    Problem(
                        where=where,
                        session_id=sid,
                        problem="same role and content as a state.db row of this session, "
                        "and no message_uid to tell them apart (a replay that inserted it and "
                        "crashed before deleting the file?): stored",
                    )
                )
            if item.kind in (1, 2):
                self._inbound_keys.add(message.client_msg_uuid)
            self._add(live, message, where, kind)
        self._flush(live)
        if live.marked:
            if existed:
                self._check_archived(sid, live.marked, live.inserted)
            self.repo.retract(sid, list(live.marked))
        if not existed:
            self._settle_activity(sid, fields)

    def _replayed_inbound(self, sid: str, role: Any, timestamp: Any, by_content: uuid.UUID) -> bool:
        """Whether a row is inbound text an earlier import delivered from the spool, which
        Hermes' restart then appended as a row with a uid of its own: the row keeps the
        spool message's key. Only a ``user`` row dated to the second (Hermes dates a
        replayed inbound message by the payload's integer ``ts``; a live message is dated
        to the microsecond) of a session stored before this run can be one; the session's
        stored inbound keys are read once."""
        if role != "user" or not isinstance(timestamp, int | float) or sid not in self._existed:
            return False
        if isinstance(timestamp, float) and not timestamp.is_integer():
            return False
        known = self._stored_inbound.get(sid)
        if known is None:
            known = {
                message.client_msg_uuid
                for message in self.repo.load_transcript(sid, include_retracted=True)
                if _route(message) == "spool" and _spool_kind(message) in (1, 2)
            }
            self._stored_inbound[sid] = known
        return by_content in known

    def _set_aside(self, pending: _Pending, message: Message, where: str, kind: str) -> None:
        """Keep a non-conversation row out of the live transcript.

        The one place that decides where such rows go: appended to their own session in
        ``id`` order with the other rows (so its ``seq`` is where Hermes had it), and
        retracted once the session's writes are done (``_import_messages``). Retracted,
        not ``compacted``: the store marks ``compacted`` only by its own ``compact``, which
        writes a summary; Hermes' state (``archived``, ``rewound``, ``session_meta``,
        ``hidden``) is in ``extra["hermes"]["state"]``.
        """
        pending.marked[message.client_msg_uuid] = where
        self._add(pending, message, where, kind)

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

    def _row_message(
        self, row: dict[str, Any], sid: str, last_time: Any, keys: _Keys
    ) -> tuple[Message, str, str | None, str] | None:
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
        state = row_state(row)
        role = row.get("role")
        if role == SESSION_META:
            hermes["role"] = role
        if state is not None:
            hermes["state"] = state

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
        key, kind, by_content = keys.for_row(row.get("message_uid"), role, content, state is None)
        if kind == "uid" and self._replayed_inbound(sid, role, row.get("timestamp"), by_content):
            key, kind = by_content, "content"
        if kind == "duplicate":
            self.lists["duplicate_rows"].append(
                Problem(
                    where=where,
                    session_id=sid,
                    field="message_uid",
                    problem=f"a second live row of message_uid {row.get('message_uid')!r} "
                    "(Hermes stored the message twice): kept once",
                )
            )
            if self.progress is not None:
                self.progress(1)
            return None
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

        cleaned = {name: _column(value, name, aside) for name, value in hermes.items()}
        if aside.moved:
            cleaned["moved_aside"] = aside.moved
        message = self._message(
            where,
            sid,
            aside,
            client_msg_uuid=key,
            timestamp=when,
            extra={"hermes": cleaned},
            **fields,
        )
        return None if message is None else (message, kind, state, where)

    def _spool_message(
        self, item: SpoolMessage, sid: str, keys: _Keys
    ) -> tuple[Message, str] | None:
        where = f"{SPOOL_DIR}/{item.file} {item.path}"
        provenance_key = "hermes"
        while provenance_key in item.message:
            provenance_key += "_import"
        aside = _Aside(where, sid, f"extra.{provenance_key}.moved_aside")
        key, kind = keys.for_spool(
            item.message.get("message_uid"), item.message.get("role"), item.message.get("content")
        )
        fields: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        names: list[str] = []
        for name, value in item.message.items():
            if name == KEY_FIELD:
                try:
                    key = uuid.UUID(str(value))
                except ValueError:
                    aside.move(KEY_FIELD, value, "not a UUID: the importer's key is used")
                continue
            names.append(name)
            if name in _MESSAGE_FIELDS:
                fields[name] = _convert(name, value, aside)
            else:
                clean_name = _clean_text(name)
                if clean_name != name:
                    aside.move(clean_name, name, "a key that is not valid Unicode")
                    names[-1] = clean_name
                extra[clean_name] = _json_value(value, clean_name, aside)
        if "role" not in fields:
            fields["role"] = _role(None, aside)
            names.insert(0, "role")
        provenance = dict(item.provenance)
        if aside.moved:
            provenance["moved_aside"] = aside.moved
        extra[provenance_key] = _clean_json(provenance)
        names.append(provenance_key)
        own_time = item.message.get("timestamp")
        when = epoch_seconds(own_time)
        if when is None and isinstance(own_time, str):
            when = _iso_epoch(own_time)
        if when is None:
            when = item.time  # the payload's ts, else its file's modification time
        message = self._message(
            where,
            sid,
            aside,
            client_msg_uuid=key,
            timestamp=when,
            extra=extra,
            openai_keys=tuple(names),
            **fields,
        )
        return None if message is None else (message, kind)

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

    def _add(
        self, pending: _Pending, message: Message, where: str, kind: str
    ) -> dict[uuid.UUID, str]:
        pending.messages.append(message)
        pending.wheres.append(where)
        pending.kinds.append(kind)
        if len(pending.messages) >= self.batch_size:
            return self._flush(pending)
        return {}

    def _flush(self, pending: _Pending) -> dict[uuid.UUID, str]:
        """Append what is pending; the keys inserted, with where each came from."""
        messages, wheres, kinds = pending.messages, pending.wheres, pending.kinds
        pending.messages, pending.wheres, pending.kinds = [], [], []
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
                pending.marked.pop(messages[index].client_msg_uuid, None)
                self.counts["messages_rejected"] += 1
                self.lists["rejected"].append(
                    Problem(
                        where=wheres[index],
                        session_id=pending.session_id,
                        field=exc.field.partition(".")[2] or None,
                        problem=f"{exc.reason}: not stored; it stays in the source",
                    )
                )
                del messages[index], wheres[index], kinds[index]
                continue
            by_key = {
                m.client_msg_uuid: (m, w, k)
                for m, w, k in zip(messages, wheres, kinds, strict=True)
            }
            pending.inserted.update(result.inserted)
            for key in result.inserted:
                inserted[key] = by_key[key][1]
                if key in self._inbound_keys:
                    self.counts["inbound_inserted"] += 1
            if result.inserted:
                newest = max(message.timestamp for message in messages)
                known = self._newest.get(pending.session_id)
                self._newest[pending.session_id] = newest if known is None else max(known, newest)
            self.counts["messages_inserted"] += len(result.inserted)
            self.counts["messages_already_present"] += len(result.duplicates)
            self._sort_out_conflicts(pending.session_id, result.conflicts, by_key)
            break
        if self.progress is not None and total:
            self.progress(total)
        return inserted

    def _sort_out_conflicts(
        self,
        sid: str,
        conflicts: list[uuid.UUID],
        by_key: Mapping[uuid.UUID, tuple[Message, str, str]],
    ) -> None:
        """A key stored with other content is the same message read by another route
        (already present), or a message Hermes changed since (listed)."""
        if not conflicts:
            return
        stored = {
            m.client_msg_uuid: m for m in self.repo.load_transcript(sid, include_retracted=True)
        }
        for key in conflicts:
            message, where, kind = by_key[key]
            earlier = stored.get(key)
            if earlier is not None and _same_message(message, earlier, kind):
                self.counts["messages_already_present"] += 1
                self.counts["messages_seen_by_another_route"] += 1
                continue
            if earlier is not None and _same_but_state(message, earlier):
                # Taken out of (or back into) the conversation by Hermes since: the
                # stored row is the same message; _check_archived retracts it.
                self.counts["messages_already_present"] += 1
                continue
            self.counts["messages_changed"] += 1
            self.lists["changed"].append(
                Problem(
                    where=where,
                    session_id=sid,
                    problem=f"stored earlier (key {key}) with different content: the "
                    "source changed since; the stored message was kept",
                )
            )

    def _check_archived(
        self, sid: str, marked: Mapping[uuid.UUID, str], inserted: set[uuid.UUID]
    ) -> None:
        """List the rows an earlier import stored live that Hermes has taken out of the
        conversation since: the retraction that follows takes them out here too."""
        live = {message.client_msg_uuid for message in self.repo.load_transcript(sid)}
        for key, where in marked.items():
            if key in live and key not in inserted:
                self.lists["archived_since_import"].append(
                    Problem(
                        where=where,
                        session_id=sid,
                        field="active",
                        problem="stored as live by an earlier import, taken out of the "
                        "conversation by Hermes since: retracted now (kept, with its state "
                        "in extra.hermes.state)",
                    )
                )


def _iso_epoch(text: str) -> float | None:
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
    progress: Callable[[int], None] | None = None,
    batch_size: int = BATCH_SIZE,
) -> HermesImportSummary:
    """Import one Hermes home (or ``state.db``) into ``repository``; see the module
    docstring. A home's named profiles are homes of their own (:func:`hermes_profiles`).

    Safe to run again, and after a Hermes restart: what is stored is not written twice.

    Args:
        source: an open :class:`HermesSource` (left open), or a path to open (and close).
        repository: the store to write to.
        progress: called with the number of messages just processed (a progress bar's
            ``update``); the calls add up to ``source.total_messages``.
        batch_size: messages per transaction, at most 500.

    Raises:
        HermesSourceError: the source cannot be read.
        HermesImportError: the store failed part-way (``.summary`` says how far it got).
    """
    opened = source if isinstance(source, HermesSource) else open_hermes(source)
    try:
        return _Importer(opened, repository, batch_size=batch_size, progress=progress).run()
    finally:
        if opened is not source:
            opened.close()
