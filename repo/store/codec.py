"""Pydantic models to table rows and back. ORM rows never leave the store.

Every message column is declared once, by ``sessionrepo.models.tables.MessageRow``
(:data:`~sessionrepo.models.tables.MESSAGE_COLUMNS`): how a field is encoded for its
column, which fields are hashed and what a loaded row decodes to follow from the column
types and markers there. A new plain column (text, number, JSON) needs nothing here.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import textwrap
import weakref
from collections.abc import Callable, Iterable, Mapping, MutableMapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from pydantic import ValidationError
from sqlalchemy import Row, Text, Uuid, column, table, type_coerce
from sqlalchemy.types import NullType

from sessionrepo.errors import InvalidMessage
from sessionrepo.models import MAX_MESSAGE_BYTES, Message, Session, StoredMessage
from sessionrepo.models._limits import check_identifier
from sessionrepo.models.message import (
    KEY_FIELD,
    coerce_message,
    is_validated,
    mark_validated,
    new_key,
    parse_uuid,
    trusted_stored_message,
)
from sessionrepo.models.tables import (
    ENCODED_MARK,
    HASHED_COLUMNS,
    MESSAGE_COLUMNS,
    MESSAGE_PLACE,
    MESSAGE_STATE,
    JSONText,
    LosslessText,
    UTCDateTime,
    dump_json,
    dump_layout,
    encode_text,
    messages_table,
)
from sessionrepo.models.usage import Usage
from sessionrepo.store.memory import SentMemory

#: ``messages`` for rows that :func:`message_row` already encoded: the text and JSON
#: columns take the stored strings as they are (the mapped table would encode again).
encoded_messages = table(
    "messages",
    *(
        column(c.name, Text if isinstance(c.type, LosslessText | JSONText) else c.type)
        for c in messages_table.columns
    ),
)


def invalid_from_validation(exc: ValidationError, prefix: str) -> InvalidMessage:
    """The first problem Pydantic found, as an ``InvalidMessage`` naming the field."""
    error = exc.errors(include_url=False)[0]
    loc = ".".join(str(part) for part in error["loc"])
    field = f"{prefix}.{loc}" if loc else prefix
    reason = error["msg"].removeprefix("Value error, ")
    if reason.startswith(f"{loc}: "):
        reason = reason[len(loc) + 2 :]
    elif loc and reason.startswith((f"{loc}.", f"{loc}[")):
        # A path inside the field ("extra.audio[0]: ..."): keep it, under the prefix.
        reason = f"{prefix}.{reason}"
    return InvalidMessage(field, reason)


def check_session_id(session_id: Any, field: str = "session_id") -> str:
    if not isinstance(session_id, str):
        raise InvalidMessage(field, f"must be a string, got {type(session_id).__name__}")
    try:
        return check_identifier(session_id, field)
    except ValueError as exc:
        raise InvalidMessage(field, str(exc).removeprefix(f"{field}: ")) from None


def _encode_extra(extra: dict[str, Any]) -> str | None:
    return dump_json(extra) if extra else None  # no extra keys: NULL, read back as {}


def _encoder(name: str) -> Callable[[Any], Any] | None:
    """How the value of a message field becomes its column's stored value (``None``: as
    it is), by the column's type: the hot path writes the stored strings itself."""
    special: dict[str, Callable[[Any], Any]] = {"extra": _encode_extra, "openai_keys": dump_layout}
    if name in special:
        return special[name]
    kind = messages_table.c[name].type
    if isinstance(kind, LosslessText):
        return encode_text
    if isinstance(kind, JSONText):
        return dump_json
    return None


#: ``(name, encoder, counted)`` per message field stored: ``counted`` fields (the content
#: columns stored as text) make up the message's stored size and are hashed as UTF-8.
_ENCODERS: Final = tuple(
    (
        name,
        _encoder(name),
        name in HASHED_COLUMNS and isinstance(messages_table.c[name].type, LosslessText | JSONText),
    )
    for name in MESSAGE_COLUMNS
    if name != "content_hash"
)


def message_row(message: Message, field: str) -> dict[str, Any]:
    """The stored form of one message (the :data:`MESSAGE_COLUMNS`): text and JSON
    fields encoded as the tables store them, plus ``content_hash`` and
    ``tool_call_total`` (for the session counter).

    Raises:
        InvalidMessage: a field cannot be encoded (a nested value changed after
            validation), or the message is larger than ``MAX_MESSAGE_BYTES`` once stored.
    """
    row: dict[str, Any] = {}
    # Each large field is encoded to UTF-8 once: its size and the hash use the bytes.
    encoded: dict[str, bytes] = {}
    try:
        for name, encode, counted in _ENCODERS:
            value = getattr(message, name)
            if encode is not None and value is not None:
                value = encode(value)
                if counted and value is not None:
                    encoded[name] = value.encode("utf-8")
            row[name] = value
    except (ValueError, TypeError) as exc:  # UnicodeEncodeError is a ValueError
        raise InvalidMessage(field, f"cannot be stored faithfully: {exc}") from exc
    size = sum(map(len, encoded.values()))
    if size > MAX_MESSAGE_BYTES:
        # Name the field when one field alone is too large, else the whole message.
        sizes = {name: len(data) for name, data in encoded.items()}
        largest = max(sizes, key=sizes.__getitem__)
        where = f"{field}.{largest}" if sizes[largest] > MAX_MESSAGE_BYTES else field
        raise InvalidMessage(
            where, f"{size} bytes once stored; the limit is {MAX_MESSAGE_BYTES} bytes"
        )
    row["content_hash"] = content_hash(row, encoded)
    row["tool_call_total"] = len(message.tool_calls or ())
    return row


def content_hash(row: Mapping[str, Any], encoded: Mapping[str, bytes]) -> bytes:
    """16 bytes of SHA-256 over the content columns (:data:`HASHED_COLUMNS`) of an
    encoded row; ``encoded`` holds the text columns already encoded to UTF-8, by name."""
    parts = []
    for name in HASHED_COLUMNS:
        value = row[name]
        # A tag per field tells None from "" and keeps fields from running together.
        if value is None:
            parts.append(b"\x00")
        else:
            data = encoded.get(name)
            if data is None:
                data = str(value).encode("utf-8")
            parts += (b"\x01", len(data).to_bytes(8, "big"), data)
    return hashlib.sha256(b"".join(parts)).digest()[:16]


class PreparedBatch:
    """A validated, encoded batch: what ``append`` writes and the outbox parks.

    Messages the repository's memory proved acknowledged in the session, unchanged
    (see :mod:`.memory`), are neither validated nor encoded when the batch is made: the
    append sends only the others. :attr:`messages` and :attr:`rows` validate them the
    first time they are read (the outbox parks a whole batch; a lost tip resends it).
    """

    __slots__ = (
        "_items",
        "_messages",
        "_rows",
        "era",
        "keys",
        "new_session",
        "pending_rows",
        "proofs",
        "session",
        "session_id",
        "usage",
    )

    def __init__(
        self,
        session_id: str,
        messages: list[Message | None],
        rows: list[dict[str, Any] | None],
        session: Session,
        *,
        keys: list[Any] | None = None,
        proofs: list[Any] | None = None,
        items: list[Any] | None = None,
        era: int | None = None,
    ) -> None:
        self.session_id = session_id
        self.session = session
        self._messages = messages
        self._rows = rows
        #: The rows, ``None`` for a message taken as acknowledged (not encoded yet): the
        #: same list :attr:`rows` fills in.
        self.pending_rows = rows
        #: Each message's UUID, in batch order.
        self.keys: list[Any] = (
            keys
            if keys is not None
            else [row["client_msg_uuid"] for row in rows if row is not None]
        )
        #: Per message, ``(memory key, proof)`` to remember it by once stored, or ``None``.
        self.proofs = proofs
        self._items = items
        #: The session's era in the memory when the batch was made (``None``: no message
        #: was taken as acknowledged).
        self.era = era
        #: ``session``'s columns, for the row a first append creates: encoded with the
        #: messages (the codec's work done in one place, once however often it is sent).
        self.new_session = session_row(session)
        #: The usage records that come with the messages (:mod:`sessionrepo.store.usage`),
        #: each with its key and message: set by the repository's ``prepare``.
        self.usage: tuple[Usage, ...] = ()

    def __repr__(self) -> str:
        return f"PreparedBatch(session_id={self.session_id!r}, messages={len(self.keys)})"

    @property
    def known(self) -> bool:
        """Whether messages were taken as acknowledged (and are not encoded yet)."""
        return self.era is not None

    @property
    def messages(self) -> list[Message]:
        """The validated messages, in batch order."""
        self.materialize()
        return self._messages  # type: ignore[return-value]

    @property
    def rows(self) -> list[dict[str, Any]]:
        """Their column values, in batch order."""
        self.materialize()
        return self._rows  # type: ignore[return-value]

    def materialize(self) -> None:
        """Validate and encode the messages taken as acknowledged (they are sent, or
        parked, whole from now on)."""
        if self.era is None:
            return
        items = self._items or []
        for index, row in enumerate(self._rows):
            if row is None:
                self._messages[index], self._rows[index] = _validated(items[index], index)
        self.era = None


def prepare_batch(
    session_id: str,
    messages: Iterable[Message | Mapping[str, Any]],
    session_defaults: Mapping[str, Any],
    memory: SentMemory | None = None,
) -> PreparedBatch:
    """A batch for ``session_id`` (checked by the caller): :func:`prepare_messages`
    and the session a first append creates from ``session_defaults``, encoded.

    With ``memory``, one pass over the batch: a message the memory proves acknowledged
    in the session, unchanged, is taken as it is (not validated, not encoded); the
    proof of every other one is taken for remembering it once stored.

    Raises:
        InvalidMessage: as :func:`prepare_messages`, or a session default is invalid.
    """
    if memory is None or not memory.limit:
        validated, rows = prepare_messages(messages)
        session = build_session(session_id, session_defaults, "session_defaults")
        return PreparedBatch(session_id, validated, rows, session)  # type: ignore[arg-type]
    if isinstance(messages, Message | Mapping | str | bytes):
        raise InvalidMessage("messages", "expected a list of messages, got a single one")
    items = messages if isinstance(messages, list) else list(messages)
    tip = memory.tips_by_session.get(session_id)
    era = None if tip is None else tip[2]
    entries = memory.entries
    count = len(items)
    out_messages: list[Message | None] = [None] * count
    out_rows: list[dict[str, Any] | None] = [None] * count
    keys: list[Any] = [None] * count
    #: Per message, (memory key, proof): what it is remembered by once stored.
    proofs: list[Any] = [None] * count
    taken = False
    # One pass; the digest inlined (it is most of a re-flush's time).
    blake2b, dumps = hashlib.blake2b, pickle.dumps
    for index, item in enumerate(items):
        kind = type(item)
        proof: Any = None
        if kind is dict:
            key: Any = item.get(KEY_FIELD)
            if key is None:
                key = _stamp(item, index)
            if type(key) is str:
                try:
                    proof = blake2b(dumps(item, 5), digest_size=16).digest()
                except Exception:  # unpicklable: not remembered (see memory.digest)
                    proof = None
                else:
                    entry = entries.get(key) if era is not None else None
                    if entry is not None and entry[2] == era and entry[0] == proof:
                        keys[index] = entry[1]
                        proofs[index] = (key, proof)
                        taken = True
                        continue
        elif kind is Message:
            key = item.client_msg_uuid
            entry = entries.get(key) if era is not None else None
            if entry is not None and entry[2] == era:
                ref = entry[0]
                if type(ref) is not bytes and ref() is item:  # type: ignore[operator]
                    keys[index] = key
                    proofs[index] = (key, ref)
                    taken = True
                    continue
            proof = weakref.ref(item) if is_validated(item) else None
        elif isinstance(item, Mapping) and item.get(KEY_FIELD) is None:
            _stamp(item, index)
        message, row = _validated(item, index)
        out_messages[index] = message
        out_rows[index] = row
        keys[index] = row["client_msg_uuid"]
        if proof is not None:
            proofs[index] = (key, proof)
    session = build_session(session_id, session_defaults, "session_defaults")
    return PreparedBatch(
        session_id,
        out_messages,
        out_rows,
        session,
        keys=keys,
        proofs=proofs,
        items=items if taken else None,
        era=era if taken else None,
    )


def prepare_messages(
    messages: Iterable[Message | Mapping[str, Any]],
) -> tuple[list[Message], list[dict[str, Any]]]:
    """Validate and encode a batch before anything is written.

    ``Message`` instances are validated again: ``model_copy(update=...)`` and
    ``model_construct`` skip Pydantic's validators, and what they let through (a naive
    timestamp, a lone surrogate, NaN) must be refused here, not by the database. A
    ``StoredMessage`` becomes a plain ``Message`` (its place is the store's to give).

    A dict without a ``client_msg_uuid`` is stamped in place with a new one, as
    :func:`~sessionrepo.ensure_key` would: its next flush carries the same key and
    inserts nothing. Without it, every flush of the same dict would be a new message.

    Returns:
        The validated messages and their column values, in batch order.

    Raises:
        InvalidMessage: a message cannot be stored faithfully, or is a read-only
            mapping without a key (it cannot be stamped, so each flush would store it
            again).
    """
    if isinstance(messages, Message | Mapping | str | bytes):
        raise InvalidMessage("messages", "expected a list of messages, got a single one")
    validated: list[Message] = []
    rows = []
    for index, item in enumerate(messages):
        if isinstance(item, Mapping) and item.get(KEY_FIELD) is None:
            _stamp(item, index)
        message, row = _validated(item, index)
        validated.append(message)
        rows.append(row)
    return validated, rows


def _validated(item: Any, index: int) -> tuple[Message, dict[str, Any]]:
    """One message (stamped already, if a dict) validated and encoded."""
    field = f"messages[{index}]"
    try:
        if isinstance(item, Message) and is_validated(item):
            message = item if type(item) is Message else _plain(item)
        elif isinstance(item, Message):
            message = Message.model_validate({name: getattr(item, name) for name in _FIELDS})
        else:
            message = coerce_message(item)
    except ValidationError as exc:
        raise invalid_from_validation(exc, field) from exc
    except TypeError as exc:
        raise InvalidMessage(field, str(exc)) from exc
    return message, message_row(message, field)


def _stamp(item: Mapping[str, Any], index: int) -> str:
    """Give a keyless message dict its key, in place: stamped as it is first stored,
    the dict keeps it across every later flush (the key travels with the message)."""
    if not isinstance(item, MutableMapping):
        raise InvalidMessage(
            f"messages[{index}].{KEY_FIELD}",
            f"missing, and a read-only {type(item).__name__} cannot be stamped with one: "
            "call ensure_key() on the dict where the message is made",
        )
    # setdefault: two threads flushing the same new dict at once end up with one key.
    fresh = str(new_key())
    key: str | None = item.setdefault(KEY_FIELD, fresh)
    if key is None:  # given as None: no key either
        key = item[KEY_FIELD] = fresh
    return key


_FIELDS = tuple(Message.model_fields)


def _plain(message: Message) -> Message:
    """A validated ``StoredMessage`` (or other subclass) as a plain ``Message``."""
    return mark_validated(
        Message.model_construct(**{name: getattr(message, name) for name in _FIELDS})
    )


#: The columns :func:`stored_messages` decodes, in this order: the stored message's
#: (without the content hash), its place, then its state: the field order of
#: ``StoredMessage``.
LOAD_COLUMNS: Final = (
    *(name for name in MESSAGE_COLUMNS if name != "content_hash"),
    *MESSAGE_PLACE,
    *MESSAGE_STATE,
)


#: ``messages``' :data:`LOAD_COLUMNS` as the driver returns them, for ``select()``: no
#: SQLAlchemy result processing, :func:`stored_messages` decodes them, faster.
load_columns = tuple(
    type_coerce(messages_table.c[name], NullType()).label(name) for name in LOAD_COLUMNS
)


#: How a stored value becomes the field's value, as statements on the local ``{name}``:
#: by column name for the fields stored their own way, else by column type.
_DECODING_BY_NAME: Final = {
    # NULL when there are no extra keys.
    "extra": "{name} = ({name} is not None and loads({name})) or {{}}\n",
    # Few layouts recur: one shared tuple per layout.
    "openai_keys": (
        "if {name} is not None:\n"
        "    layout = layouts.get({name})\n"
        "    if layout is None:\n"
        "        layout = layouts[{name}] = tuple(loads({name}))\n"
        "    {name} = layout\n"
    ),
}
_DECODING_BY_TYPE: Final = (
    # SQLite: 32 hex digits; psycopg: a UUID already.
    (Uuid, "if type({name}) is str:\n    {name} = uuid_from_hex({name})\n"),
    # SQLAlchemy's SQLite text for a naive UTC time ("2026-11-29 12:00:00.000000") is
    # parsed with its zone at once (datetime.replace is slow); psycopg gives it aware.
    (
        UTCDateTime,
        "if type({name}) is str:\n"
        "    if len({name}) == 26 and {name}[19] == '.':\n"
        "        {name} = parse_time({name} + '+00:00')\n"
        "    else:\n"
        "        {name} = parse_time({name})\n"
        "if {name}.tzinfo is not UTC:\n"
        "    {name} = {name}.replace(tzinfo=UTC) if {name}.tzinfo is None "
        "else {name}.astimezone(UTC)\n",
    ),
    (
        LosslessText,
        "if {name} is not None and {name}.startswith(mark):\n    {name} = loads({name}[1:])\n",
    ),
    (JSONText, "if {name} is not None:\n    {name} = loads({name})\n"),
)


def _decoding(name: str) -> str:
    """The statements that decode the local ``name`` (a stored value as the driver gives
    it) to the field's value; none for a value stored as it is."""
    template = _DECODING_BY_NAME.get(name)
    if template is None:
        kind = messages_table.c[name].type
        template = next((t for cls, t in _DECODING_BY_TYPE if isinstance(kind, cls)), "")
    return template.format(name=name)


def _decoder_source() -> str:
    """The loop of :func:`stored_messages`, written out column by column from the
    declaration: a loop over the columns inside the loop over the rows makes loading a
    long transcript half again as slow."""
    body = "".join(_decoding(name) for name in LOAD_COLUMNS)
    values = ", ".join(f"{name!r}: {name}" for name in LOAD_COLUMNS)
    return (
        "def decode(rows, append, layouts):\n"
        "    for row in rows:\n"
        f"        ({', '.join(LOAD_COLUMNS)},) = row\n"
        + textwrap.indent(body, " " * 8)
        + f"        append(build({{{values}}}))\n"
    )


_Decoder = Callable[
    [Iterable[Sequence[Any]], Callable[[StoredMessage], None], dict[str, tuple[str, ...]]], None
]


def _compile_decoder() -> _Decoder:
    scope: dict[str, Any] = {
        "UTC": UTC,
        "build": trusted_stored_message,
        "loads": json.loads,
        "mark": ENCODED_MARK,
        "parse_time": datetime.fromisoformat,
        "uuid_from_hex": parse_uuid,
    }
    exec(compile(_decoder_source(), f"<{__name__} decoder>", "exec"), scope)
    decode: Any = scope["decode"]
    return decode  # type: ignore[no-any-return]


_decode = _compile_decoder()


def stored_messages(rows: Iterable[Sequence[Any]]) -> list[StoredMessage]:
    """Rows of :func:`load_columns` as ``StoredMessage`` objects: trusted, so not
    revalidated.

    Decodes what the column types (``Uuid``, ``UTCDateTime``, ``LosslessText``,
    ``JSONText``) would, as the driver hands it over: SQLite gives the key as 32 hex
    digits and the time as naive UTC text, psycopg gives a ``UUID`` and an aware
    ``datetime``.
    """
    messages: list[StoredMessage] = []
    #: openai_keys as stored -> the tuple (immutable, so one shared copy per layout).
    layouts: dict[str, tuple[str, ...]] = {}
    _decode(rows, messages.append, layouts)
    return messages


SESSION_FIELDS = (
    "id",
    "source",
    "user_id",
    "title",
    "model",
    "model_settings",
    "system_prompt",
    "parent_session_id",
    "started_at",
    "ended_at",
    "end_reason",
    "message_count",
    "tool_call_count",
    "input_tokens",
    "output_tokens",
    "last_active_at",
    "forked_from_session_id",
    "forked_from_seq",
)


def session_row(session: Session) -> dict[str, Any]:
    """Column values for a new ``sessions`` row."""
    row = {name: getattr(session, name) for name in SESSION_FIELDS}
    row["metadata"] = session.metadata or None
    row["last_active_at"] = session.last_active_at or session.started_at
    return row


def session_from_row(row: Row[Any] | Mapping[str, Any], **more: Any) -> Any:
    mapping = row._mapping if isinstance(row, Row) else row
    values = {name: mapping[name] for name in SESSION_FIELDS}
    values["metadata"] = mapping["metadata"] or {}
    if lag := mapping.get("last_active_lag_us"):  # the activity within the granularity
        values["last_active_at"] += timedelta(microseconds=lag)
    return values | more


def build_session(session_id: str, values: Mapping[str, Any], field: str) -> Session:
    """A validated ``Session`` from keyword arguments, or ``InvalidMessage``."""
    if "id" in values:
        raise InvalidMessage(f"{field}.id", "pass the session id positionally")
    try:
        return Session(id=session_id, **values)
    except ValidationError as exc:
        raise invalid_from_validation(exc, field) from exc
    except TypeError as exc:
        raise InvalidMessage(field, str(exc)) from exc
