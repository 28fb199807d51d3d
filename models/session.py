"""Sessions (one per conversation) and the results the repository hands back."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Final, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    computed_field,
    field_validator,
    model_validator,
)

from sessionrepo.models._limits import check_identifier, check_json, check_text
from sessionrepo.models.message import to_utc, utcnow

#: Session columns the store keeps from the transcript itself: a caller can read them,
#: never set them (``create_session`` and ``append``'s session defaults refuse them). The
#: sequence state, ``next_seq``, is not even a field of :class:`Session`.
DERIVED_FIELDS: Final = (
    "message_count",
    "tool_call_count",
    "next_seq",
    "last_active_at",
    "forked_from_session_id",
    "forked_from_seq",
)


class Session(BaseModel):
    """One conversation.

    ``model_settings`` (the model's parameters: temperature, ...) is the column's name and
    the export's key too. It was called ``model_config``, a name Pydantic reserves for a
    model's own configuration; that name is still accepted on input (a keyword argument,
    an export made before the rename), never written.
    ``message_count``, ``tool_call_count`` and ``last_active_at`` are kept by the store
    (see :data:`DERIVED_FIELDS`).
    """

    model_config = ConfigDict(
        frozen=True, extra="forbid", populate_by_name=True, protected_namespaces=()
    )

    id: str
    source: str = "unknown"
    user_id: str | None = None
    title: str | None = None
    model: str | None = None
    model_settings: dict[str, Any] | None = Field(
        default=None, validation_alias=AliasChoices("model_settings", "model_config")
    )
    system_prompt: str | None = None
    parent_session_id: str | None = None
    started_at: datetime = Field(default_factory=utcnow)
    ended_at: datetime | None = None
    end_reason: str | None = None
    message_count: int = 0
    tool_call_count: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    metadata: dict[str, Any] = Field(default_factory=dict)
    #: When a message was last inserted (the session's start until then).
    last_active_at: datetime | None = None
    #: Set by ``fork_session`` (never by a caller): the session whose transcript this one
    #: started as a copy of, up to and including ``forked_from_seq``.
    forked_from_session_id: str | None = None
    forked_from_seq: int | None = None

    @field_validator(
        "id", "source", "parent_session_id", "user_id", "model", "forked_from_session_id"
    )
    @classmethod
    def _check_identifiers(cls, value: str | None, info: Any) -> str | None:
        return None if value is None else check_identifier(value, info.field_name)

    @field_validator("end_reason")
    @classmethod
    def _check_reason(cls, value: str | None) -> str | None:
        return None if value is None else check_identifier(value, "end_reason", 1024)

    @field_validator("title", "system_prompt")
    @classmethod
    def _check_text(cls, value: str | None, info: Any) -> str | None:
        return None if value is None else check_text(value, info.field_name)

    @field_validator("model_settings", "metadata")
    @classmethod
    def _check_json(cls, value: Any, info: Any) -> Any:
        return check_json(value, info.field_name)

    @field_validator("started_at", "ended_at", "last_active_at", mode="before")
    @classmethod
    def _parse_time(cls, value: Any, info: Any) -> Any:
        return None if value is None else to_utc(value, info.field_name)

    @property
    def is_open(self) -> bool:
        return self.ended_at is None


class SessionSummary(Session):
    """A session as listed by ``list_sessions``: every field of :class:`Session`, plus
    ``status`` (``"open"`` or ``"ended"``, what ``list_sessions(status=...)`` filters on)
    and ``preview``, the start of its first live user message's text (at most 120
    characters, whitespace collapsed; ``None`` when it has no user message)."""

    preview: str | None = None

    @computed_field  # type: ignore[prop-decorator]  # mypy does not follow pydantic's decorator on a property
    @property
    def status(self) -> Literal["open", "ended"]:
        """``"open"`` until the session ends (derived from ``ended_at``)."""
        return "open" if self.ended_at is None else "ended"

    @model_validator(mode="before")
    @classmethod
    def _derived_status(cls, data: Any) -> Any:
        # A dumped summary validates again: its status is checked, not stored.
        if isinstance(data, dict) and "status" in data:
            data = dict(data)
            status = data.pop("status")
            if status != ("open" if data.get("ended_at") is None else "ended"):
                raise ValueError(f"status: {status!r} does not agree with ended_at")
        return data


class SessionPage(BaseModel):
    """One page of :meth:`SessionRepository.list_sessions`. Page until ``next_cursor`` is
    ``None``::

        cursor = None
        while True:
            page = repo.list_sessions(cursor=cursor)
            ...
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
    """

    model_config = ConfigDict(frozen=True)

    sessions: list[SessionSummary]
    #: Pass it back as ``cursor=`` for the next page; ``None`` on the last page (a
    #: full last page included: no empty page follows). ``cursor=None`` asks for the
    #: first page, so a loop that passes this ``None`` back starts over.
    next_cursor: str | None = None


class AppendResult(BaseModel):
    """What one ``append`` did, by message key, in the order the batch gave them."""

    model_config = ConfigDict(frozen=True)

    session_id: str
    #: Keys stored by this call.
    inserted: list[uuid.UUID] = Field(default_factory=list)
    #: Keys already stored with the same content (or repeated within the batch): skipped.
    duplicates: list[uuid.UUID] = Field(default_factory=list)
    #: Keys already stored with *different* content: skipped, the stored row unchanged.
    conflicts: list[uuid.UUID] = Field(default_factory=list)
    #: Keys an erasure removed from this session (its tombstone): skipped, never stored
    #: again (see ``SessionRepository.erase``).
    erased: list[uuid.UUID] = Field(default_factory=list)
    #: ``seq`` of the first inserted message, ``None`` when nothing was inserted.
    first_seq: int | None = None


class EditResult(BaseModel):
    """What one edit (rewind, retract, pop, clear, compact) did to a session's live
    transcript. Messages taken out of it stay stored (``superseded`` says why)."""

    model_config = ConfigDict(frozen=True)

    session_id: str
    #: Keys this call took out of the live transcript, in ``seq`` order (those already
    #: out of it are not listed: an edit sent again changes nothing).
    superseded: list[uuid.UUID] = Field(default_factory=list)
    #: ``compact``: the summary's key when this call stored it.
    inserted: list[uuid.UUID] = Field(default_factory=list)
    #: Messages in the live transcript after the edit.
    message_count: int = 0
