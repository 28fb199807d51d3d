"""The message wire format: one chat message, lossless to and from the OpenAI chat format."""

from __future__ import annotations

import copy
import math
import uuid
from collections.abc import Mapping, MutableMapping
from datetime import UTC, datetime
from typing import Any, Final, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from sessionrepo.errors import ArgumentTypeError, InvalidMessage
from sessionrepo.models._limits import check_identifier, check_json, check_text
from sessionrepo.models.tables import WIRE_FIELDS as _WIRE_COLUMNS

try:  # Python 3.14 has it in the standard library.
    from uuid import uuid7 as _uuid7  # type: ignore[attr-defined,unused-ignore]
except ImportError:  # pragma: no cover - depends on the interpreter
    from uuid_utils.compat import uuid7 as _uuid7

#: The roles of the OpenAI chat formats: Chat Completions (``developer`` is what current
#: reasoning models take instead of ``system``; ``function`` is the legacy tool result)
#: and the Responses API's ``message`` items.
Role = Literal["system", "developer", "user", "assistant", "tool", "function"]
ROLES: Final = ("system", "developer", "user", "assistant", "tool", "function")

#: The key that names an OpenAI Responses-API item (``{"type": "function_call", ...}``).
ITEM_TYPE_FIELD: Final = "type"

#: The key a gateway stamps on its message dicts (see :func:`ensure_key`).
KEY_FIELD: Final = "client_msg_uuid"

#: Fields that :meth:`Message.from_openai` takes from a dict by name (declared with the
#: message columns, :data:`sessionrepo.models.tables.WIRE_FIELDS`, ``role`` and
#: ``content`` first). Every other key of the dict goes to ``extra`` unchanged (``name``,
#: ``refusal``, ``audio``, even a ``timestamp`` the gateway put there:
#: ``Message.timestamp`` is ours, not the wire's).
WIRE_FIELDS: Final = _WIRE_COLUMNS
_WIRE_FIELD_SET: Final = frozenset(WIRE_FIELDS)
_RESERVED_EXTRA_KEYS: Final = _WIRE_FIELD_SET | {KEY_FIELD}
#: What an OpenAI Responses item without a role may not keep in ``extra``: every other
#: key of an item is its own, stored as given (:meth:`Message.from_openai`).
_RESERVED_ITEM_KEYS: Final = frozenset(("role", "content", KEY_FIELD))

_ITEM_FIELDS: Final = frozenset(("content",))

Content = str | list[Any] | dict[str, Any] | None


def new_key() -> uuid.UUID:
    """A fresh message key: a time-ordered UUIDv7."""
    return uuid.UUID(str(_uuid7()))


def ensure_key(message: MutableMapping[str, Any]) -> uuid.UUID:
    """Stamp ``message`` with a ``client_msg_uuid`` once, when the message is made.

    Call it where the gateway creates the dict. Later flushes of the same dict, and a
    transcript loaded back with ``to_openai(include_key=True)``, then carry the same key,
    so storing them again inserts nothing.

    Returns:
        The message's key (the existing one when the dict was already stamped).

    Raises:
        ArgumentTypeError: ``message`` is not a dict (a mutable mapping).
        InvalidMessage: its ``client_msg_uuid`` is there but not a UUID.
    """
    if not isinstance(message, MutableMapping):
        raise ArgumentTypeError(
            "message", f"expected the message's dict, got {type(message).__name__}"
        )
    existing = message.get(KEY_FIELD)
    if existing is None:
        key = new_key()
        message[KEY_FIELD] = str(key)
        return key
    if isinstance(existing, uuid.UUID):
        return existing
    try:
        return uuid.UUID(str(existing))
    except ValueError:
        raise InvalidMessage(KEY_FIELD, f"{KEY_FIELD}: not a UUID") from None


_new_object = object.__new__
_set_attribute = object.__setattr__
_UNKNOWN_SAFETY: Final = uuid.SafeUUID.unknown  # an Enum member: each access costs a call


def parse_uuid(text: str) -> uuid.UUID:
    """``uuid.UUID(text)``, in half the time for the usual forms (32 hex digits, with
    or without the four dashes): ``UUID.__init__`` tries every form a UUID can take.

    Raises:
        ValueError: ``text`` is not a UUID.
    """
    digits = text.replace("-", "") if len(text) == 36 else text
    if len(digits) == 32:
        try:
            value = int(digits, 16)
        except ValueError:
            return uuid.UUID(text)  # another form, or not a UUID: it says which
        if value >= 0:
            key = _new_object(uuid.UUID)
            _set_attribute(key, "int", value)
            _set_attribute(key, "is_safe", _UNKNOWN_SAFETY)
            return key
    return uuid.UUID(text)


def utcnow() -> datetime:
    return datetime.now(UTC)


def to_utc(value: Any, field: str) -> Any:
    """Epoch seconds become aware UTC datetimes; aware datetimes are normalised to UTC."""
    if isinstance(value, bool):
        raise ValueError(f"{field}: a bool is not a time")
    if isinstance(value, int | float):
        if not math.isfinite(value):
            raise ValueError(f"{field}: {value!r} is not a time")
        try:
            return datetime.fromtimestamp(value, UTC)
        except (OverflowError, OSError, ValueError) as exc:
            raise ValueError(f"{field}: {value!r} epoch seconds is out of range") from exc
    if isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError(
                f"{field}: naive datetime {value.isoformat()}; give it a timezone "
                "(datetime.now(UTC), not datetime.now())"
            )
        try:
            return value.astimezone(UTC)
        except OverflowError as exc:
            raise ValueError(f"{field}: {value.isoformat()} is out of range in UTC") from exc
    return value


class Message(BaseModel):
    """One chat message as a gateway hands it in and gets it back.

    Identity is ``client_msg_uuid``: storing a message whose key is already stored in the
    same session inserts nothing. Content never decides identity.

    ``timestamp`` is when the message was made (now, unless given); it is stored but is
    not part of the comparison that reports a re-sent key with different content.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=False)

    client_msg_uuid: uuid.UUID = Field(default_factory=new_key)
    #: ``None`` only for an OpenAI Responses-API item without a role (a
    #: ``function_call``, a ``reasoning`` item...), which its ``type`` (in ``extra``)
    #: names instead.
    role: Role | None
    content: Content = None
    tool_calls: list[Any] | None = None
    # Strict: a lax model would turn b"x" into "x", True or "5" into an int, and so
    # give back a different dict than it was given.
    tool_call_id: str | None = Field(default=None, strict=True)
    tool_name: str | None = Field(default=None, strict=True)
    reasoning: str | None = Field(default=None, strict=True)
    finish_reason: str | None = Field(default=None, strict=True)
    token_count: int | None = Field(default=None, strict=True, ge=-(2**63), lt=2**63)
    timestamp: datetime = Field(default_factory=utcnow)
    platform_message_id: str | None = Field(default=None, strict=True)
    extra: dict[str, Any] = Field(default_factory=dict)
    #: The keys, in order, of the OpenAI dict this message was made from, so that
    #: :meth:`to_openai` gives that dict back exactly (``None`` when built directly).
    openai_keys: tuple[str, ...] | None = None

    # Set by validation only: model_construct() and model_copy(update=...) bypass the
    # validators, and the store validates such instances again before writing them.
    _validated: bool = PrivateAttr(default=False)

    @field_validator("client_msg_uuid", mode="before")
    @classmethod
    def _parse_key(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                return parse_uuid(value)
            except ValueError:
                raise ValueError(f"{KEY_FIELD}: {value[:64]!r} is not a UUID") from None
        return value

    @field_validator("timestamp", mode="before")
    @classmethod
    def _parse_timestamp(cls, value: Any) -> Any:
        return to_utc(value, "timestamp")

    @field_validator("timestamp")
    @classmethod
    def _aware_utc(cls, value: datetime) -> datetime:
        return to_utc(value, "timestamp")  # type: ignore[no-any-return]

    # The JSON fields are checked before Pydantic sees them, by exact type: Pydantic
    # alone would turn a tuple or a set into a list and bytes into a str (lossy), and
    # would name a union member ("content.str") instead of the field in its errors.
    @field_validator("content", mode="before")
    @classmethod
    def _check_content(cls, value: Any) -> Any:
        if value is None:
            return None
        kind = type(value)
        if kind is str:
            return check_text(value, "content")
        if kind is list or kind is dict:
            return check_json(value, "content")
        raise ValueError(
            f"content: {kind.__name__} is not a content type "
            "(use str, a list of content parts, a dict or None)"
        )

    @field_validator("tool_calls", mode="before")
    @classmethod
    def _check_tool_calls(cls, value: Any) -> Any:
        if value is None:
            return None
        if type(value) is not list:
            raise ValueError(f"tool_calls: {type(value).__name__} is not a list")
        return check_json(value, "tool_calls")

    @field_validator("extra", mode="before")
    @classmethod
    def _check_extra(cls, value: Any) -> Any:
        if type(value) is not dict:
            raise ValueError(f"extra: {type(value).__name__} is not a dict")
        extra: dict[str, Any] = {}
        for key, item in value.items():
            if type(key) is not str:
                raise ValueError(f"extra: key {key!r} is not a string")
            check_text(key, "extra.<key>")
            # Each extra key is a top-level field of the message dict, like "content":
            # its value gets the same nesting depth.
            extra[key] = check_json(item, f"extra.{key}")
        return extra

    @field_validator("reasoning")
    @classmethod
    def _check_free_text(cls, value: str | None) -> str | None:
        return None if value is None else check_text(value, "reasoning")

    @field_validator("tool_call_id", "tool_name", "finish_reason", "platform_message_id")
    @classmethod
    def _check_identifiers(cls, value: str | None, info: Any) -> str | None:
        return None if value is None else check_identifier(value, info.field_name)

    @model_validator(mode="after")
    def _check_layout(self) -> Message:
        fields = self.__dict__
        extra = fields["extra"]
        role = fields["role"]
        if role is None:
            kind = extra.get(ITEM_TYPE_FIELD)
            if type(kind) is not str or not kind:
                raise ValueError(
                    "role: None is only for an OpenAI Responses item, which names its "
                    f"{ITEM_TYPE_FIELD!r} (a non-empty string)"
                )
        # An item's keys are its own (a configuration_update item's "reasoning" is a
        # dict, not our reasoning text): only its content is a named field.
        reserved_keys = _RESERVED_EXTRA_KEYS if role is not None else _RESERVED_ITEM_KEYS
        if extra and not reserved_keys.isdisjoint(extra):
            reserved = reserved_keys.intersection(extra)
            raise ValueError(f"extra: {sorted(reserved)} are named fields, not extra keys")
        if role is None and not _WIRE_FIELD_SET.isdisjoint(extra):
            for name in _WIRE_FIELD_SET.intersection(extra):
                if fields[name] is not None:
                    raise ValueError(f"extra: {name!r} is set both as a field and in extra")
        keys = fields["openai_keys"]
        if keys is not None:
            listed = set(keys)
            # The usual layout, checked with set operations; anything else is explained
            # (and refused) by _explain_layout.
            plain = (
                len(listed) == len(keys)
                and ("role" in listed or role is None)
                and listed.issuperset(extra)
                and not listed.difference(_WIRE_FIELD_SET, extra)
            )
            if plain:
                for name in _WIRE_FIELD_SET.difference(listed):
                    if fields[name] is not None:
                        plain = False
                        break
            if not plain:
                self._explain_layout(keys)
        # Validation initialised the private attributes already; setting the entry
        # directly skips BaseModel.__setattr__.
        self.__pydantic_private__["_validated"] = True  # type: ignore[index]
        return self

    def _explain_layout(self, keys: tuple[str, ...]) -> None:
        """Raise the ``ValueError`` that says what is wrong with ``openai_keys``."""
        if len(set(keys)) != len(keys):
            raise ValueError("openai_keys: a key is listed twice")
        listed = set(keys)
        for key in keys:
            if key not in _WIRE_FIELD_SET and key not in self.extra:
                raise ValueError(f"openai_keys: {key!r} is neither a wire field nor in extra")
        missing = [k for k in self.extra if k not in listed]
        missing += [f for f in WIRE_FIELDS if f not in listed and getattr(self, f) is not None]
        if "role" not in listed and self.role is not None:
            missing.append("role")
        if missing:
            raise ValueError(f"openai_keys: {missing} would be dropped by to_openai()")

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """Pydantic's copy; with ``update``, the copy is no longer known to be valid."""
        copied = super().model_copy(update=update, deep=deep)
        if update:
            copied._validated = False
        return copied

    @classmethod
    def from_openai(cls, message: Mapping[str, Any], *, timestamp: Any = None) -> Message:
        """Build a message from an OpenAI chat-format dict, keeping every key.

        The named fields are taken by name, ``client_msg_uuid`` (when present) becomes the
        key, and every other key goes to ``extra`` as it is. ``to_openai()`` gives the same
        dict back: ``Message.from_openai(d).to_openai() == d`` for any ``d`` without a key.

        Args:
            message: the dict; it is not modified.
            timestamp: when the message was made (aware datetime or epoch seconds);
                defaults to now.

        Raises:
            pydantic.ValidationError: the dict cannot be stored faithfully; the error
                names the field.
        """
        fields: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        keys: list[str] = []
        # A Responses item (a type, no role): only its content is a named field.
        named = (
            _ITEM_FIELDS
            if "role" not in message and ITEM_TYPE_FIELD in message
            else _WIRE_FIELD_SET
        )
        for key, value in message.items():
            if key == KEY_FIELD:
                fields[KEY_FIELD] = value
                continue
            keys.append(key)
            if key in named:
                fields[key] = value
            else:
                extra[key] = value
        if named is _ITEM_FIELDS:
            fields["role"] = None  # its type names it
        if timestamp is not None:
            fields["timestamp"] = timestamp
        return cls(**fields, extra=extra, openai_keys=tuple(keys))

    @property
    def item_type(self) -> str | None:
        """The Responses-API item type (``"message"``, ``"function_call"``,
        ``"reasoning"``...), or ``None`` for a Chat Completions message."""
        kind = self.extra.get(ITEM_TYPE_FIELD)
        return kind if isinstance(kind, str) else None

    @classmethod
    def from_item(cls, item: Mapping[str, Any], *, timestamp: Any = None) -> Message:
        """:meth:`from_openai` for an OpenAI Responses-API item (or Agents SDK item):
        every key kept, in order; ``to_item()`` gives it back.

        Raises:
            ValueError: ``item`` has no ``type`` (it is not an item).
            pydantic.ValidationError: as for :meth:`from_openai`.
        """
        if not isinstance(item.get(ITEM_TYPE_FIELD), str):
            raise ValueError(f"an item names its {ITEM_TYPE_FIELD!r}; this dict has none")
        return cls.from_openai(item, timestamp=timestamp)

    def to_item(self, *, include_key: bool = False) -> dict[str, Any]:
        """The message as the Responses-API item it was made from (:meth:`to_openai`)."""
        return self.to_openai(include_key=include_key)

    def to_openai(self, *, include_key: bool = False) -> dict[str, Any]:
        """The message as an OpenAI chat-format dict (a deep copy: yours to change).

        Args:
            include_key: add ``client_msg_uuid``, so that flushing the dict again later
                (after a resume, say) is recognised as the same message.
        """
        out: dict[str, Any] = {}
        if self.openai_keys is not None:
            extra = self.extra
            for key in self.openai_keys:
                # An item keeps wire names of its own in extra (see _RESERVED_ITEM_KEYS).
                out[key] = extra[key] if key in extra else getattr(self, key)
        elif self.role is None:  # an item built directly: its type first, as the API has it
            out.update(self.extra)
            for name in WIRE_FIELDS[1:]:
                value = getattr(self, name)
                if value is not None:
                    out[name] = value
        else:
            out["role"] = self.role
            out["content"] = self.content
            for name in WIRE_FIELDS[2:]:
                value = getattr(self, name)
                if value is not None:
                    out[name] = value
            out.update(self.extra)
        out = copy.deepcopy(out)
        if include_key:
            out[KEY_FIELD] = str(self.client_msg_uuid)
        return out


class StoredMessage(Message):
    """A message as read back from the store: the message plus where it sits."""

    session_id: str
    #: Position in the session's transcript, assigned by the database at insert.
    seq: int
    #: ``None`` for a message of the live transcript; ``"retracted"`` (rewound,
    #: retracted, popped or cleared) or ``"compacted"`` (replaced by a summary) for one
    #: that left it and is kept as history (``load_transcript(include_retracted=True)``).
    superseded: Literal["retracted", "compacted"] | None = None


def is_validated(message: Message) -> bool:
    """Whether every field of ``message`` went through validation (see ``_validated``)."""
    # Through the private dict: Pydantic's attribute lookup costs ~15 times more.
    private = message.__pydantic_private__
    return private is not None and private.get("_validated", False) is True


def mark_validated(message: Message) -> Message:
    """Vouch for a message built from already-validated data (a stored row)."""
    message._validated = True
    return message


_STORED_FIELDS: Final = tuple(StoredMessage.model_fields)
_STORED_FIELD_SET: Final = set(_STORED_FIELDS)
# Private attributes as validation leaves them. Every default is immutable (checked
# here), so each instance may start from a shallow copy of the same dict.
_VALIDATED_PRIVATE: Final = {
    name: attribute.get_default()
    for name, attribute in StoredMessage.__private_attributes__.items()
} | {"_validated": True}
if not all(
    value is None or isinstance(value, bool | int | str) for value in _VALIDATED_PRIVATE.values()
):  # pragma: no cover - a guard for whoever adds a private attribute
    raise TypeError("StoredMessage has a private attribute with a mutable default")


def trusted_stored_message(fields: dict[str, Any]) -> StoredMessage:
    """A validated ``StoredMessage`` from a stored row's decoded values, fast.

    ``fields`` must hold every field, in declaration order (``__dict__`` order is repr and
    dump order), already in its validated form; it becomes the instance's ``__dict__``.
    What results is what ``StoredMessage.model_construct(**fields)`` followed by
    :func:`mark_validated` builds (equal, frozen, every field set), without
    its generic per-field bookkeeping, which dominates loading a long transcript.
    """
    message = _new_object(StoredMessage)
    _set_attribute(message, "__dict__", fields)
    _set_attribute(message, "__pydantic_fields_set__", _STORED_FIELD_SET.copy())
    _set_attribute(message, "__pydantic_extra__", None)
    _set_attribute(message, "__pydantic_private__", _VALIDATED_PRIVATE.copy())
    return message


def coerce_message(value: Message | Mapping[str, Any]) -> Message:
    """A :class:`Message` as it is, or one made from an OpenAI-format dict."""
    if isinstance(value, Message):
        return value
    if isinstance(value, Mapping):
        return Message.from_openai(value)
    raise ArgumentTypeError(
        "message", f"expected a Message or an OpenAI-format dict, got {type(value).__name__}"
    )
