"""Mapping what :mod:`.source` read to sessionrepo's fields: a ``sessions`` row to a
session's fields, a ``messages`` row or a spool message dict to a :class:`Message`.

Each kind has one declarative table of :class:`FieldRule`, the same shape for both:
:data:`SESSION_RULES` and :data:`MESSAGE_RULES`. A rule names the field, the Hermes column
(or spool key) it comes from, the converter that turns the value into one the store holds
faithfully, and whether the column is also kept, as it was, in ``metadata["hermes"]`` /
``extra["hermes"]``. A value a converter cannot store as it is gets the nearest storable
value, and the original goes to ``moved_aside`` (:class:`Record` collects both).

Nothing here reads the store or the source: the lookups a rule needs (the prompt a
``system_prompt_hash`` names) come with the :class:`Record`.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import math
import re
import uuid
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any, Final, Literal, get_args

from pydantic import ValidationError

from sessionrepo.importers.hermes.keys import NAMESPACE, KeyKind, fingerprint, uid_key
from sessionrepo.importers.hermes.source import SPOOL_DIR, SpoolMessage, epoch_seconds, one_line
from sessionrepo.importers.hermes.summary import Problem
from sessionrepo.models import (
    MAX_ID_LENGTH,
    Message,
    StoredMessage,
    check_identifier,
    check_json,
    check_text,
)
from sessionrepo.models.message import KEY_FIELD, Role, to_utc

#: How Hermes marks a ``content`` value that is JSON (multimodal parts).
JSON_CONTENT_MARK: Final = "\x00json:"
#: Hermes' bookkeeping role: not part of the conversation.
SESSION_META: Final = "session_meta"
_ROLES: Final = frozenset(get_args(Role))
_SURROGATES: Final = re.compile("[\ud800-\udfff]")
#: Containers deeper than this are stored as their ``repr``.
_MAX_DEPTH: Final = 60


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


class Record:
    """One source record being mapped: where it is, and what its mapping set aside
    (``moved``, the originals for ``moved_aside``) or noted.

    Args:
        where: the record, as the summary names it (``state.db messages.id=42``).
        session_id: the stored session it belongs to (may be set later: a session's id
            is known only once its id was checked).
        prefix: where ``moved`` is stored (``extra.hermes.moved_aside``).
        system_prompt: the prompt a ``system_prompt_hash`` names, for the session rules.
    """

    def __init__(
        self,
        where: str,
        session_id: str | None,
        prefix: str,
        *,
        system_prompt: Callable[[Any], str | None] | None = None,
    ) -> None:
        self.where = where
        self.session_id = session_id
        self.prefix = prefix
        self.system_prompt = system_prompt or (lambda _hash: None)
        #: ``{field: repr(original)}``, what goes to ``moved_aside``.
        self.moved: dict[str, str] = {}
        self._moves: list[tuple[str, str]] = []
        self.notes: list[Problem] = []

    def move(self, field: str, original: Any, problem: str) -> None:
        self.moved[field] = repr(original)
        self._moves.append((field, problem))

    def note(self, field: str, problem: str, stored_as: str | None = None) -> None:
        self.notes.append(
            Problem(
                where=self.where,
                session_id=self.session_id,
                field=field,
                problem=problem,
                stored_as=stored_as,
            )
        )

    @property
    def problems(self) -> list[Problem]:
        """One :class:`Problem` per value moved aside."""
        return [
            Problem(
                where=self.where,
                session_id=self.session_id,
                field=field,
                problem=problem,
                stored_as=f"{self.prefix}.{field}",
            )
            for field, problem in self._moves
        ]


# -- converters: (value, field, record) -> the value to store ----------------------------

#: Turns a source value into a field's value (``None``: the field is not set); what it
#: cannot store as it is, it moves aside in the record.
Converter = Callable[[Any, str, Record], Any]


def _problem(exc: ValueError, field: str) -> str:
    text = str(exc)
    return text[len(field) + 2 :] if text.startswith(f"{field}: ") else text


def clean_text(value: str) -> str:
    """``value`` with every lone surrogate replaced (U+FFFD)."""
    return _SURROGATES.sub("\ufffd", value)


def clean_json(value: Any, depth: int = 0) -> Any:
    """The nearest value that ``check_json`` accepts."""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, bool | int | float):
        return str(value) if type(value) is int and value.bit_length() > 256 else value
    if depth < _MAX_DEPTH and isinstance(value, list | tuple):
        return [clean_json(item, depth + 1) for item in value]
    if depth < _MAX_DEPTH and isinstance(value, dict):
        return {clean_text(str(key)): clean_json(item, depth + 1) for key, item in value.items()}
    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else repr(value)
    return clean_text(text)


def json_value(value: Any, field: str, record: Record) -> Any:
    """Any JSON value (``extra`` and fields the model added since)."""
    try:
        return check_json(value, field)
    except ValueError as exc:
        record.move(field, value, _problem(exc, field))
        return clean_json(value)
    except RecursionError:
        record.move(field, value, "nested too deeply")
        return clean_json(value)


def column(value: Any, field: str, record: Record) -> Any:
    """A column kept in ``extra``/``metadata``: a BLOB as ``{"base64": ...}`` (Hermes keeps
    JSON as text, so a dict there can only be one), anything else checked as JSON."""
    if isinstance(value, bytes):
        return {"base64": base64.b64encode(value).decode("ascii")}
    return json_value(value, field, record)


def text(value: Any, field: str, record: Record) -> str | None:
    if value is None:
        return None
    if type(value) is str:
        try:
            return check_text(value, field)
        except ValueError as exc:
            record.move(field, value, _problem(exc, field))
            return clean_text(value)
    record.move(field, value, f"a {type(value).__name__}, not text")
    cleaned = clean_json(value)
    return cleaned if isinstance(cleaned, str) else json.dumps(cleaned)


def identifier(
    value: Any, field: str, record: Record, max_length: int = MAX_ID_LENGTH
) -> str | None:
    if value is None:
        return None
    if type(value) is not str:
        record.move(field, value, f"a {type(value).__name__}, not text")
        return None
    try:
        return check_identifier(value, field, max_length)
    except ValueError as exc:
        record.move(field, value, _problem(exc, field))
        return None


def role(value: Any, field: str, record: Record) -> str:
    if isinstance(value, str) and value in _ROLES:
        return value
    if value == SESSION_META:  # kept in extra["hermes"]["role"]; the row is set aside
        return "system"
    record.move(field, value, f"{value!r} is not a role sessionrepo stores: stored as 'system'")
    return "system"


def content(value: Any, field: str, record: Record) -> Any:
    if value is None or type(value) is str:
        return text(value, field, record)
    if type(value) is list or type(value) is dict:
        return json_value(value, field, record)
    record.move(field, value, f"a {type(value).__name__} is not content: stored as text")
    cleaned = clean_json(value)
    return cleaned if isinstance(cleaned, str) else json.dumps(cleaned)


def tool_calls(value: Any, field: str, record: Record) -> list[Any] | None:
    if value is None:
        return None
    if type(value) is not list:
        record.move(field, value, f"a {type(value).__name__}, not a list of tool calls")
        return None
    result: list[Any] = json_value(value, field, record)
    return result


def count(value: Any, field: str, record: Record) -> int | None:
    if value is None:
        return None
    if type(value) is int and -(2**63) <= value < 2**63:
        return value
    record.move(field, value, f"{value!r} is not a 64-bit integer")
    return None


def end_reason(value: Any, field: str, record: Record) -> str | None:
    return identifier(value, field, record, 1024)


def model_settings(value: Any, field: str, record: Record) -> dict[str, Any] | None:
    """Hermes' ``model_config``: JSON text of an object; else noted, and kept as it was."""
    if value is None:
        return None
    parsed: Any = None
    try:
        parsed = json.loads(value) if isinstance(value, str) else None
    except (ValueError, RecursionError):
        parsed = None
    if isinstance(parsed, dict):
        settings: dict[str, Any] = json_value(parsed, field, record)
        return settings
    record.note(field, "not a JSON object: kept as it was", f"metadata.hermes.{field}")
    return None


def prompt_of_hash(value: Any, field: str, record: Record) -> str | None:
    """The text ``system_prompts`` holds for a ``system_prompt_hash``."""
    if value is None:
        return None
    prompt = text(record.system_prompt(value), "system_prompt", record)
    if prompt is None:
        record.note(
            field,
            f"{value!r} is not in system_prompts: no system prompt",
            f"metadata.hermes.{field}",
        )
    return prompt


def parent_session(value: Any, field: str, record: Record) -> str | None:
    if value is None:
        return None
    parent = session_id_of(value, None)
    if parent != value:
        record.move(field, value, f"cannot be a session id: stored as {parent!r}")
    return parent


def started_at(value: Any, field: str, record: Record) -> float | None:
    """Required: when it is not epoch seconds, :func:`session_fields` dates the session
    by its end (else the epoch)."""
    started = epoch_seconds(value)
    if started is None:
        record.move(field, value, "not epoch seconds")
    return started


def ended_at(value: Any, field: str, record: Record) -> float | None:
    if value is None:
        return None
    ended = epoch_seconds(value)
    if ended is None:
        record.move(field, value, "not epoch seconds: left open")
    return ended


# -- the tables ---------------------------------------------------------------------------

#: Whether a rule's column is also kept in ``metadata["hermes"]``/``extra["hermes"]``:
#: ``never``, ``always``, or only when it did not become the field (``unconverted``).
Kept = Literal["never", "always", "unconverted"]


@dataclasses.dataclass(frozen=True)
class FieldRule:
    """How one Hermes column (or spool dict key) becomes one sessionrepo field."""

    field: str
    column: str
    convert: Converter
    kept: Kept = "never"
    #: A ``messages``/``sessions`` column holds the value as JSON text (a spool dict holds
    #: it as JSON): parsed before it is converted, moved aside when it does not parse.
    json_text: bool = False


#: A ``sessions`` row, in the order its fields are converted (the order of what
#: ``moved_aside`` records). Two rules for one field: the first that gives a value wins
#: (the prompt itself, else the one its hash names). Every column no rule names is kept
#: in ``metadata["hermes"]``; ``id`` is the session's id.
SESSION_RULES: Final[tuple[FieldRule, ...]] = (
    FieldRule("source", "source", identifier),
    FieldRule("user_id", "user_id", identifier),
    FieldRule("model", "model", identifier),
    FieldRule("title", "title", text),
    FieldRule("model_settings", "model_config", model_settings, kept="unconverted"),
    FieldRule("system_prompt", "system_prompt", text),
    FieldRule("system_prompt", "system_prompt_hash", prompt_of_hash, kept="always"),
    FieldRule("parent_session_id", "parent_session_id", parent_session),
    FieldRule("started_at", "started_at", started_at, kept="always"),
    FieldRule("ended_at", "ended_at", ended_at, kept="always"),
    FieldRule("end_reason", "end_reason", end_reason),
    FieldRule("input_tokens", "input_tokens", count, kept="always"),
    FieldRule("output_tokens", "output_tokens", count, kept="always"),
)

#: How a message value becomes a ``Message`` field, by name (a ``messages`` column and a
#: spool dict key have the field's name), in the order a row's fields are converted.
_MESSAGE_CONVERTERS: Final[dict[str, Converter]] = {
    "role": role,
    "content": content,
    "tool_calls": tool_calls,
    "tool_call_id": identifier,
    "tool_name": identifier,
    "finish_reason": identifier,
    "platform_message_id": identifier,
    "reasoning": text,
    "token_count": count,
}
#: ``messages`` columns holding JSON text (an OpenAI tool-call list).
_JSON_TEXT: Final = frozenset({"tool_calls"})
#: ``Message`` fields the importer makes itself (the key, the time, ``extra`` and the key
#: order): never taken from a column or a dict key of that name.
_OWN_FIELDS: Final = frozenset({KEY_FIELD, "timestamp", "extra", "openai_keys"})
#: A message, one rule per field of the model not in ``_OWN_FIELDS`` (from the model's own
#: list, so a field added to it is read too, as a JSON value checked like ``extra``: what
#: the model then refuses is reported as rejected, never dropped silently). Every column no
#: rule names is kept in ``extra["hermes"]``.
MESSAGE_RULES: Final[tuple[FieldRule, ...]] = tuple(
    FieldRule(name, name, _MESSAGE_CONVERTERS.get(name, json_value), json_text=name in _JSON_TEXT)
    for name in sorted(
        (name for name in Message.model_fields if name not in _OWN_FIELDS),
        key=lambda name: (
            list(_MESSAGE_CONVERTERS).index(name)
            if name in _MESSAGE_CONVERTERS
            else len(_MESSAGE_CONVERTERS)
        ),
    )
)
_MESSAGE_RULE: Final = {rule.column: rule for rule in MESSAGE_RULES}
#: ``messages`` columns that place a row (``id``, ``session_id``) or become fields.
_ROW_COLUMNS: Final = frozenset({"id", "session_id", "timestamp", *_MESSAGE_RULE})


def convert(
    rules: Iterable[FieldRule], values: Mapping[str, Any], record: Record, *, columns: bool
) -> tuple[dict[str, Any], set[str]]:
    """Apply ``rules`` to a record's ``values`` (``columns``: a ``state.db`` row, else a
    spool dict): the fields that got a value, and the columns kept as they were besides
    (the rules' ``kept``)."""
    fields: dict[str, Any] = {}
    kept: set[str] = set()
    for rule in rules:
        converted = None
        if rule.field not in fields:  # else an earlier rule gave the field its value
            value = values.get(rule.column)
            if columns and rule.json_text and value is not None:
                value = _parse_json_text(value, rule.column, record)
            converted = rule.convert(value, rule.column, record)
            if converted is not None:
                fields[rule.field] = converted
        if rule.kept == "always" or (rule.kept == "unconverted" and converted is None):
            kept.add(rule.column)
    return fields, kept


# -- sessions -----------------------------------------------------------------------------


def session_id_of(raw: Any, record: Record | None) -> str:
    """The stored id of a Hermes session id: the same id when it can be one, else a
    uuid5 of it (recorded in ``record``)."""
    if type(raw) is str:
        try:
            return check_identifier(raw, "id")
        except ValueError:
            pass
    sid = f"hermes-{uuid.uuid5(NAMESPACE, f'session:{raw!r}')}"
    if record is not None:
        record.move("id", raw, f"{raw!r} cannot be a session id: stored as {sid!r}")
    return sid


def session_fields(row: Mapping[str, Any], profile: str, record: Record) -> dict[str, Any]:
    """A ``sessions`` row as ``create_session`` fields (:data:`SESSION_RULES`); every
    other non-NULL column, and the profile, in ``metadata["hermes"]``."""
    fields, kept = convert(SESSION_RULES, row, record, columns=True)
    if "started_at" not in fields:
        fields["started_at"] = fields.get("ended_at", 0.0)
    named = {rule.column for rule in SESSION_RULES} - kept
    hermes = {
        name: column(value, name, record)
        for name, value in row.items()
        if name != "id" and name not in named and value is not None
    }
    hermes["profile"] = profile
    if record.moved:
        hermes["moved_aside"] = record.moved
    fields["metadata"] = {"hermes": hermes}
    return fields


# -- messages -----------------------------------------------------------------------------


def row_content(row: Mapping[str, Any], record: Record) -> tuple[Any, bool]:
    """A row's content as the conversation has it (the ``"\\x00json:"`` form becomes the
    JSON it encodes), and whether it was so encoded."""
    value = row.get("content")
    if not (isinstance(value, str) and value.startswith(JSON_CONTENT_MARK)):
        return value, False
    try:
        return json.loads(value[len(JSON_CONTENT_MARK) :]), True
    except (ValueError, RecursionError) as exc:
        record.note(
            "content",
            f"marked as JSON but not valid JSON ({one_line(exc)}): stored as the text it was",
        )
        return value, False


def row_message(
    row: Mapping[str, Any],
    record: Record,
    *,
    key: uuid.UUID,
    decoded: tuple[Any, bool],
    last_time: Any,
) -> dict[str, Any]:
    """A ``messages`` row as ``Message`` values (:data:`MESSAGE_RULES`); every other
    non-NULL column in ``extra["hermes"]``, with the row's ``id``, exact ``timestamp``
    and, when it is not conversation, its state.

    Args:
        decoded: what :func:`row_content` made of its content.
        last_time: the previous row's time, for a row whose time is not epoch seconds.
    """
    hermes: dict[str, Any] = {"id": row["id"]}
    raw_time = row.get("timestamp")
    if raw_time is not None:
        hermes["timestamp"] = raw_time
    for name, value in row.items():
        if name not in _ROW_COLUMNS and value is not None:
            hermes[name] = value
    if row.get("role") == SESSION_META:
        hermes["role"] = SESSION_META
    state = row_state(row)
    if state is not None:
        hermes["state"] = state
    text_value, encoded = decoded
    if encoded:
        hermes["content_encoding"] = "json"

    fields, _ = convert(MESSAGE_RULES, {**row, "content": text_value}, record, columns=True)
    if "content" in record.moved:
        record.moved["content"] = repr(row.get("content"))  # the column, as it was
    when = epoch_seconds(raw_time)
    if when is None:
        record.move("timestamp", raw_time, "not epoch seconds: the previous row's time is used")
        when = last_time if last_time is not None else 0.0

    extra = {name: column(value, name, record) for name, value in hermes.items()}
    if record.moved:
        extra["moved_aside"] = record.moved
    return {"client_msg_uuid": key, "timestamp": when, "extra": {"hermes": extra}, **fields}


def _parse_json_text(value: Any, field: str, record: Record) -> Any:
    """Parse a JSON text column; ``None`` after moving it aside when it is not one."""
    if not isinstance(value, str):
        record.move(field, value, f"a {type(value).__name__}, not JSON text")
        return None
    try:
        return json.loads(value)
    except (ValueError, RecursionError) as exc:
        record.move(field, value, f"not valid JSON ({one_line(exc)})")
        return None


def spool_where(item: SpoolMessage) -> str:
    return f"{SPOOL_DIR}/{item.file} {item.path}"


def spool_record(item: SpoolMessage, sid: str) -> tuple[Record, str]:
    """The record of a spool message, and the ``extra`` key its provenance goes to:
    ``hermes``, unless the dict has a key of that name."""
    provenance_key = "hermes"
    while provenance_key in item.message:
        provenance_key += "_import"
    return Record(spool_where(item), sid, f"extra.{provenance_key}.moved_aside"), provenance_key


def spool_message(
    item: SpoolMessage, record: Record, provenance_key: str, *, key: uuid.UUID
) -> dict[str, Any]:
    """A spool message dict as ``Message`` values: every key of the dict, in its order
    (a field by :data:`MESSAGE_RULES`, any other key in ``extra``), its provenance in
    ``extra[provenance_key]``. A ``client_msg_uuid`` in the dict is its key."""
    fields: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    names: list[str] = []
    for name, value in item.message.items():
        if name == KEY_FIELD:
            try:
                key = uuid.UUID(str(value))
            except ValueError:
                record.move(KEY_FIELD, value, "not a UUID: the importer's key is used")
            continue
        names.append(name)
        rule = _MESSAGE_RULE.get(name)
        if rule is not None:
            fields[name] = rule.convert(value, name, record)
        else:
            clean_name = clean_text(name)
            if clean_name != name:
                record.move(clean_name, name, "a key that is not valid Unicode")
                names[-1] = clean_name
            extra[clean_name] = json_value(value, clean_name, record)
    if "role" not in fields:
        fields["role"] = role(None, "role", record)
        names.insert(0, "role")
    provenance = dict(item.provenance)
    if record.moved:
        provenance["moved_aside"] = record.moved
    extra[provenance_key] = clean_json(provenance)
    names.append(provenance_key)
    own_time = item.message.get("timestamp")
    when = epoch_seconds(own_time)
    if when is None and isinstance(own_time, str):
        when = _iso_epoch(own_time)
    if when is None:
        when = item.time  # the payload's ts, else its file's modification time
    return {
        "client_msg_uuid": key,
        "timestamp": when,
        "extra": extra,
        "openai_keys": tuple(names),
        **fields,
    }


def _iso_epoch(value: str) -> float | None:
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    if parsed.tzinfo is None:
        return None
    return epoch_seconds(parsed.timestamp())


def build_message(values: Mapping[str, Any], record: Record) -> Message | Problem:
    """The ``Message``, or why it cannot be stored (every field was checked: a gap in the
    converters, reported, never dropped silently)."""
    try:
        return Message(**values)
    except ValidationError as exc:
        return Problem(
            where=record.where,
            session_id=record.session_id,
            problem=f"cannot be stored: {one_line(exc)}; it stays in the source",
        )


# -- what a stored message says about its source ------------------------------------------


def spool_provenance(message: Message) -> Mapping[str, Any] | None:
    """The spool provenance of a message stored from a spool payload, else ``None``."""
    for value in message.extra.values():
        if isinstance(value, dict) and "spool_file" in value:
            return value
    return None


def route(message: Message) -> str:
    """``spool`` when a message was stored from a spool payload, else ``row``."""
    return "row" if spool_provenance(message) is None else "spool"


#: The ``extra["hermes"]`` columns that say whether a row is part of the conversation.
_STATE_COLUMNS: Final = ("active", "compacted", "state")


def same_but_state(new: Message, stored: StoredMessage) -> bool:
    """The same row, stored earlier: only whether it is part of the conversation
    (``extra.hermes.active/compacted/state``) changed since."""
    if route(new) != "row" or route(stored) != "row":
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


def same_message(new: Message, stored: StoredMessage, kind: KeyKind) -> bool:
    """The same logical message read by another route (spool then, row now, or back)."""
    if route(new) == route(stored):
        return False
    if (new.role, new.content) != (stored.role, stored.content):
        return False
    return kind in ("uid", "replayed") or new.timestamp == stored.timestamp


#: Spool payload kinds a Hermes restart replays into ``state.db`` (kind 4 it leaves).
_REPLAYED_KINDS: Final = (1, 2, 3)


class Replayable:
    """The messages an earlier import stored in one session from spool payloads a Hermes
    restart replays (kinds 1 to 3): what a row with a uid of its own is recognised by.

    Args:
        transcript: the session's stored messages, retracted ones too.
    """

    def __init__(self, transcript: Iterable[StoredMessage]) -> None:
        #: The key each ``message_uid`` the payloads carried was stored under.
        self._uids: dict[str, uuid.UUID] = {}
        #: The payloads without a uid, by key, and by what they said (role and content),
        #: in stored order; each is matched to one row at most.
        self._keyed: dict[uuid.UUID, StoredMessage] = {}
        self._said: dict[str, list[StoredMessage]] = {}
        for message in transcript:
            provenance = spool_provenance(message)
            if provenance is None or provenance.get("kind") not in _REPLAYED_KINDS:
                continue
            uid = message.extra.get("message_uid")
            if isinstance(uid, str) and uid:
                self._uids[uid] = message.client_msg_uuid
                continue
            self._keyed[message.client_msg_uuid] = message
            self._said.setdefault(fingerprint(message.role, message.content), []).append(message)

    def key_of(
        self, row: Mapping[str, Any], content: Any, key: uuid.UUID, by_content: uuid.UUID
    ) -> uuid.UUID | None:
        """The key of the stored spool message a row is, else ``None``. The row (its
        ``content`` decoded) has a uid and got ``key`` by it (``by_content`` without it,
        see :class:`.SessionKeys`).

        Hermes' replay keeps a payload's uid (the key it was stored under may be another:
        a ``client_msg_uuid`` the dict carried, which Hermes has no column for) and mints
        one for a payload without. It appends the rows after the session's rows in the
        order the importer stored the payloads, dated by the payload's ``ts`` (or the
        message's own time): a replayed row without a uid of its own has the place, so the
        content key, of the message stored from its payload (else, for one stored under
        its dict's key, the same role, content and time), and a live row another time.
        """
        if not (self._uids or self._keyed):
            return None  # nothing stored from the spool: the common case, said quickly
        uid = row.get("message_uid")
        if isinstance(uid, str) and uid in self._uids:
            return self._uids[uid] if key == uid_key(uid) else None  # a copy keeps its own
        when = epoch_seconds(row.get("timestamp"))
        if when is None:
            return None
        placed = self._keyed.get(by_content)
        if placed is not None and _dated(placed, when):
            return self._claim(placed)
        said = self._said.get(fingerprint(row.get("role"), content), [])
        for message in said:
            if _dated(message, when):
                return self._claim(message)
        return None

    def _claim(self, message: StoredMessage) -> uuid.UUID:
        del self._keyed[message.client_msg_uuid]
        self._said[fingerprint(message.role, message.content)].remove(message)
        return message.client_msg_uuid


def _dated(message: StoredMessage, when: float) -> bool:
    """Whether a message stored from the spool has the time its replayed row has."""
    provenance = spool_provenance(message) or {}
    return to_utc(when, "timestamp") == message.timestamp or when == provenance.get("ts")
