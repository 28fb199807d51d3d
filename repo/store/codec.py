"""Pydantic models to table rows and back. ORM rows never leave ``repo/``."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError
from sqlalchemy import (
    BigInteger,
    LargeBinary,
    Row,
    String,
    Text,
    Uuid,
    column,
    table,
    type_coerce,
)
from sqlalchemy.types import NullType

from sessionrepo.errors import InvalidMessage
from sessionrepo.models import MAX_MESSAGE_BYTES, Message, Session, StoredMessage
from sessionrepo.models._limits import check_identifier
from sessionrepo.models.message import (
    coerce_message,
    is_validated,
    mark_validated,
    parse_uuid,
    trusted_stored_message,
)
from sessionrepo.models.tables import (
    ENCODED_MARK,
    UTCDateTime,
    dump_json,
    dump_layout,
    encode_text,
    messages_table,
)

#: The message fields that make up its content: the hash over them tells a plain re-send
#: (same key, same content) from a conflict. The key, the timestamp and the key order of
#: the wire dict are not content.
HASHED_FIELDS = (
    "role",
    "content",
    "tool_calls",
    "tool_call_id",
    "tool_name",
    "reasoning",
    "finish_reason",
    "token_count",
    "platform_message_id",
    "extra",
)

#: Columns of an encoded row (see :func:`message_row`), in insert order.
ROW_COLUMNS = (
    "client_msg_uuid",
    "role",
    "content",
    "tool_calls",
    "tool_call_id",
    "tool_name",
    "reasoning",
    "finish_reason",
    "token_count",
    "timestamp",
    "platform_message_id",
    "extra",
    "openai_keys",
    "content_hash",
)

MESSAGE_COLUMNS = (
    "client_msg_uuid",
    *HASHED_FIELDS,
    "timestamp",
    "openai_keys",
)

#: ``messages`` for rows that :func:`message_row` already encoded: the text and JSON
#: columns take the stored strings as they are (the mapped table would encode again).
encoded_messages = table(
    "messages",
    column("session_id", String),
    column("seq", BigInteger),
    column("client_msg_uuid", Uuid),
    column("role", String),
    column("content", Text),
    column("tool_calls", Text),
    column("tool_call_id", String),
    column("tool_name", String),
    column("reasoning", Text),
    column("finish_reason", String),
    column("token_count", BigInteger),
    column("timestamp", UTCDateTime),
    column("platform_message_id", String),
    column("extra", Text),
    column("openai_keys", Text),
    column("content_hash", LargeBinary),
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


def message_row(message: Message, field: str) -> dict[str, Any]:
    """The stored form of one message (without ``session_id`` and ``seq``): text and
    JSON fields encoded as the tables store them, plus ``content_hash`` and
    ``tool_call_total`` (for the session counter).

    Raises:
        InvalidMessage: a field cannot be encoded (a nested value changed after
            validation), or the message is larger than ``MAX_MESSAGE_BYTES`` once stored.
    """
    try:
        content = None if message.content is None else encode_text(message.content)
        reasoning = None if message.reasoning is None else encode_text(message.reasoning)
        tool_calls = None if message.tool_calls is None else dump_json(message.tool_calls)
        extra = dump_json(message.extra) if message.extra else None
        # Each large field is encoded to UTF-8 once: its size and the hash use the bytes.
        encoded = {
            name: value.encode("utf-8")
            for name, value in (
                ("content", content),
                ("reasoning", reasoning),
                ("tool_calls", tool_calls),
                ("extra", extra),
            )
            if value is not None
        }
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
    row: dict[str, Any] = {
        "client_msg_uuid": message.client_msg_uuid,
        "role": message.role,
        "content": content,
        "tool_calls": tool_calls,
        "tool_call_id": message.tool_call_id,
        "tool_name": message.tool_name,
        "reasoning": reasoning,
        "finish_reason": message.finish_reason,
        "token_count": message.token_count,
        "timestamp": message.timestamp,
        "platform_message_id": message.platform_message_id,
        "extra": extra,
        "openai_keys": (
            dump_layout(message.openai_keys) if message.openai_keys is not None else None
        ),
    }
    row["content_hash"] = content_hash(row, encoded)
    row["tool_call_total"] = len(message.tool_calls or ())
    return row


def content_hash(row: Mapping[str, Any], encoded: Mapping[str, bytes] | None = None) -> bytes:
    """16 bytes of SHA-256 over the encoded content fields of a row (``encoded``: fields
    already encoded to UTF-8, by name)."""
    parts = []
    for name in HASHED_FIELDS:
        value = row[name]
        # A tag per field tells None from "" and keeps fields from running together.
        if value is None:
            parts.append(b"\x00")
        else:
            data = encoded.get(name) if encoded is not None else None
            if data is None:
                data = str(value).encode("utf-8")
            parts += (b"\x01", len(data).to_bytes(8, "big"), data)
    return hashlib.sha256(b"".join(parts)).digest()[:16]


def prepare_messages(
    messages: Iterable[Message | Mapping[str, Any]],
) -> tuple[list[Message], list[dict[str, Any]]]:
    """Validate and encode a batch before anything is written.

    ``Message`` instances are validated again: ``model_copy(update=...)`` and
    ``model_construct`` skip Pydantic's validators, and what they let through (a naive
    timestamp, a lone surrogate, NaN) must be refused here, not by the database. A
    ``StoredMessage`` becomes a plain ``Message`` (its place is the store's to give).

    Returns:
        The validated messages and their column values, in batch order.
    """
    if isinstance(messages, Message | Mapping | str | bytes):
        raise InvalidMessage("messages", "expected a list of messages, got a single one")
    validated: list[Message] = []
    rows = []
    for index, item in enumerate(messages):
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
        validated.append(message)
        rows.append(message_row(message, field))
    return validated, rows


_FIELDS = tuple(Message.model_fields)


def _plain(message: Message) -> Message:
    """A validated ``StoredMessage`` (or other subclass) as a plain ``Message``."""
    return mark_validated(
        Message.model_construct(**{name: getattr(message, name) for name in _FIELDS})
    )


def stored_message(row: Row[Any]) -> StoredMessage:
    """A row read from ``messages`` (typed columns) as a ``StoredMessage``: trusted, so
    not revalidated."""
    keys = row.openai_keys
    message = StoredMessage.model_construct(
        session_id=row.session_id,
        seq=row.seq,
        client_msg_uuid=row.client_msg_uuid,
        role=row.role,
        content=row.content,
        tool_calls=row.tool_calls,
        tool_call_id=row.tool_call_id,
        tool_name=row.tool_name,
        reasoning=row.reasoning,
        finish_reason=row.finish_reason,
        token_count=row.token_count,
        timestamp=row.timestamp,
        platform_message_id=row.platform_message_id,
        extra=row.extra or {},
        openai_keys=tuple(keys) if keys is not None else None,
    )
    mark_validated(message)  # it was validated before it was stored
    return message


#: The columns :func:`stored_messages` decodes, in this order: an encoded row's, but the
#: content hash, then the message's place.
LOAD_COLUMNS = (*(name for name in ROW_COLUMNS if name != "content_hash"), "session_id", "seq")


#: ``messages``' :data:`LOAD_COLUMNS` as the driver returns them, for ``select()``: no
#: SQLAlchemy result processing, :func:`stored_messages` decodes them, faster.
load_columns = tuple(
    type_coerce(messages_table.c[name], NullType()).label(name) for name in LOAD_COLUMNS
)


def stored_messages(rows: Iterable[Sequence[Any]]) -> list[StoredMessage]:
    """Rows of :func:`load_columns` as ``StoredMessage`` objects: trusted, so not
    revalidated.

    Decodes what the column types (``Uuid``, ``UTCDateTime``, ``LosslessText``,
    ``JSONText``) would, as the driver hands it over: SQLite gives the key as 32 hex
    digits and the time as naive UTC text, psycopg gives a ``UUID`` and an aware
    ``datetime``.
    """
    loads = json.loads
    mark = ENCODED_MARK
    parse_time = datetime.fromisoformat
    uuid_from_hex = parse_uuid
    build = trusted_stored_message
    #: openai_keys as stored -> the tuple (immutable, so one shared copy per layout).
    layouts: dict[str, tuple[str, ...]] = {}
    messages: list[StoredMessage] = []
    append = messages.append
    for row in rows:
        (
            key,
            role,
            content,
            tool_calls,
            tool_call_id,
            tool_name,
            reasoning,
            finish_reason,
            token_count,
            stamp,
            platform_message_id,
            extra,
            openai_keys,
            session_id,
            seq,
        ) = row
        if type(key) is str:
            key = uuid_from_hex(key)
        if type(stamp) is str:
            # SQLAlchemy's SQLite text for a naive UTC time ("2026-11-29 12:00:00.000000"):
            # parsed with its zone at once (datetime.replace is slow).
            if len(stamp) == 26 and stamp[19] == ".":
                stamp = parse_time(stamp + "+00:00")
            else:
                stamp = parse_time(stamp)
        if stamp.tzinfo is not UTC:
            stamp = stamp.replace(tzinfo=UTC) if stamp.tzinfo is None else stamp.astimezone(UTC)
        if content is not None and content.startswith(mark):
            content = loads(content[1:])
        if reasoning is not None and reasoning.startswith(mark):
            reasoning = loads(reasoning[1:])
        if openai_keys is not None:
            layout = layouts.get(openai_keys)
            if layout is None:
                layout = layouts[openai_keys] = tuple(loads(openai_keys))
            openai_keys = layout
        append(
            build(
                {
                    "client_msg_uuid": key,
                    "role": role,
                    "content": content,
                    "tool_calls": None if tool_calls is None else loads(tool_calls),
                    "tool_call_id": tool_call_id,
                    "tool_name": tool_name,
                    "reasoning": reasoning,
                    "finish_reason": finish_reason,
                    "token_count": token_count,
                    "timestamp": stamp,
                    "platform_message_id": platform_message_id,
                    "extra": (extra is not None and loads(extra)) or {},
                    "openai_keys": openai_keys,
                    "session_id": session_id,
                    "seq": seq,
                }
            )
        )
    return messages


SESSION_FIELDS = (
    "id",
    "source",
    "user_id",
    "title",
    "model",
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
)


def session_row(session: Session) -> dict[str, Any]:
    """Column values for a new ``sessions`` row."""
    row = {name: getattr(session, name) for name in SESSION_FIELDS}
    row["model_config"] = session.model_settings
    row["metadata"] = session.metadata or None
    row["last_active_at"] = session.last_active_at or session.started_at
    return row


def session_from_row(row: Row[Any] | Mapping[str, Any], **more: Any) -> Any:
    mapping = row._mapping if isinstance(row, Row) else row
    values = {name: mapping[name] for name in SESSION_FIELDS}
    values["model_settings"] = mapping["model_config"]
    values["metadata"] = mapping["metadata"] or {}
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
