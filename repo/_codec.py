"""Pydantic models to table rows and back. ORM rows never leave ``repo/``."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import ValidationError
from sqlalchemy import Row

from models import MAX_MESSAGE_BYTES, Message, Session, StoredMessage
from models._limits import check_identifier
from models.message import coerce_message
from models.tables import dump_json, encode_text
from repo.errors import InvalidMessage

#: The message fields that make up its content: the hash over them tells a plain re-send
#: (same key, same content) from a conflict. The key and the timestamp are not content.
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

MESSAGE_COLUMNS = (
    "client_msg_uuid",
    *HASHED_FIELDS,
    "timestamp",
    "openai_keys",
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


def content_hash(message: Message) -> bytes:
    """16 bytes of SHA-256 over the content fields, canonically serialised."""
    payload = [getattr(message, name) for name in HASHED_FIELDS]
    payload[HASHED_FIELDS.index("extra")] = message.extra or None
    canonical = json.dumps(payload, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).digest()[:16]


def message_row(message: Message, field: str) -> dict[str, Any]:
    """Column values for one message (without ``session_id`` and ``seq``).

    Raises:
        InvalidMessage: the message is larger than ``MAX_MESSAGE_BYTES`` once stored.
    """
    sizes: dict[str, int] = {}
    for name in ("content", "reasoning"):
        value = getattr(message, name)
        if value is not None:
            sizes[name] = len(encode_text(value).encode("utf-8"))
    for name in ("tool_calls", "extra"):
        value = getattr(message, name)
        if value:
            sizes[name] = len(dump_json(value).encode("utf-8"))
    size = sum(sizes.values())
    if size > MAX_MESSAGE_BYTES:
        # Name the field when one field alone is too large, else the whole message.
        largest = max(sizes, key=sizes.__getitem__)
        where = f"{field}.{largest}" if sizes[largest] > MAX_MESSAGE_BYTES else field
        raise InvalidMessage(
            where, f"{size} bytes once stored; the limit is {MAX_MESSAGE_BYTES} bytes"
        )
    return {
        "client_msg_uuid": message.client_msg_uuid,
        "role": message.role,
        "content": message.content,
        "tool_calls": message.tool_calls,
        "tool_call_id": message.tool_call_id,
        "tool_name": message.tool_name,
        "reasoning": message.reasoning,
        "finish_reason": message.finish_reason,
        "token_count": message.token_count,
        "platform_message_id": message.platform_message_id,
        "extra": message.extra or None,
        "timestamp": message.timestamp,
        "openai_keys": list(message.openai_keys) if message.openai_keys is not None else None,
        "content_hash": content_hash(message),
        "tool_call_total": len(message.tool_calls or ()),
    }


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
            if isinstance(item, Message):
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


def stored_message(row: Row[Any]) -> StoredMessage:
    """A row read from ``messages`` as a ``StoredMessage``: trusted, so not revalidated."""
    keys = row.openai_keys
    return StoredMessage.model_construct(
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
