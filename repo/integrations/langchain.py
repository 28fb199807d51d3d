"""LangChain's chat message history on sessionrepo (extra ``langchain``).

:class:`SessionRepoChatMessageHistory` is a ``langchain_core`` ``BaseChatMessageHistory``
(what ``RunnableWithMessageHistory``'s ``get_session_history`` returns), sync and async,
storing one LangChain conversation as one sessionrepo session.

How a LangChain message is stored. Each message becomes one OpenAI chat-format message
(``HumanMessage`` → ``user``, ``AIMessage`` → ``assistant`` with its tool calls in
OpenAI's form, ``SystemMessage`` → ``system`` (``developer`` when its
``additional_kwargs["__openai_role__"]`` says so, as ``langchain-openai`` marks it),
``ToolMessage`` → ``tool`` with its ``tool_call_id``, ``FunctionMessage`` → ``function``
with its ``name``, ``ChatMessage`` → its role when it is an OpenAI role, else ``user``),
so the stored transcript is one a gateway, the search and ``to_openai()`` understand.
Whatever that form cannot say (the message's ``id``, ``additional_kwargs``,
``response_metadata``, ``usage_metadata``, ``invalid_tool_calls``, a ``ToolMessage``'s
``name``, ``artifact`` and ``status``, a ``ChatMessage``'s role, the message class,
tool calls without an id or whose arguments do not survive JSON) is kept in the
message's ``extra["langchain"]``: the fields of ``message.model_dump()`` that differ from
what the OpenAI form implies (absent when none do). So every message class
``messages_from_dict`` knows (chunks included) comes back equal to what was added, and
a plain ``HumanMessage("hi")`` is stored as the plain ``{"role": "user", "content":
"hi"}``. ``RemoveMessage`` is an instruction to LangGraph, not a message: it is refused.

Messages stored by someone else (a gateway's OpenAI dicts) are read the same way, their
other OpenAI keys (``refusal``, ``audio``...) in ``additional_kwargs``; a Responses-API
item without a role comes back as a ``ChatMessage`` whose role is the item's ``type``.

Keys. A message with an ``id`` is stored under ``uuid5(MESSAGE_ID_NAMESPACE,
f"{session_id}:{id}")``: adding it again (a retried ``add_messages``, a re-sent batch)
stores nothing, where LangChain's own SQL history stores it twice. A message without
an ``id`` gets a fresh key each time it is added (LangChain's "each add appends").
LangChain's chat models give their replies an id (``lc_run--<run id>``); the messages
``RunnableWithMessageHistory`` makes from a string input have none: give inputs an id
(``HumanMessage(text, id=...)``) to make a retried turn idempotent. ``clear()`` takes
the messages out of the live transcript and keeps them stored (sessionrepo never
deletes history); adding a message whose id was cleared stores nothing either.
"""

from __future__ import annotations

import asyncio
import functools
import json
import threading
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Final

try:  # the framework comes with the extra: say which, not just "No module named"
    import langchain_core  # noqa: F401
except ImportError as exc:
    raise ImportError(
        f"{__name__} needs langchain-core: pip install 'sessionrepo[langchain]'"
    ) from exc
from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    ChatMessage,
    ChatMessageChunk,
    FunctionMessage,
    FunctionMessageChunk,
    HumanMessage,
    HumanMessageChunk,
    SystemMessage,
    SystemMessageChunk,
    ToolMessage,
    ToolMessageChunk,
)
from langchain_core.messages.tool import default_tool_parser
from langchain_core.runnables.config import run_in_executor

from sessionrepo import (
    ArgumentTypeError,
    AsyncSessionRepository,
    AsyncTranscriptWriter,
    ConflictError,
    InvalidArgument,
    InvalidMessage,
    NotFound,
    RepoError,
    SessionRepository,
    StoredMessage,
    TranscriptWriter,
    WriteResult,
    open_async_repository,
    open_repository,
)
from sessionrepo.integrations.reported import reported_usage
from sessionrepo.models import check_identifier
from sessionrepo.models.message import KEY_FIELD, ROLES, WIRE_FIELDS
from sessionrepo.models.usage import Usage
from sessionrepo.store.arguments import check_session_id

__all__ = [
    "LANGCHAIN_FIELD",
    "MESSAGE_ID_NAMESPACE",
    "SessionRepoChatMessageHistory",
    "from_stored_message",
    "message_key",
    "to_openai_message",
]

#: The namespace of the keys derived from message ids:
#: ``uuid5(NAMESPACE_URL, "sessionrepo:langchain:message-id")``. Fixed: changing it
#: would make every re-added message new.
MESSAGE_ID_NAMESPACE: Final = uuid.UUID("708bd505-a951-5fdf-a6ea-a9262ae08aa9")
#: The key of a stored message's ``extra`` that holds what OpenAI's form cannot say.
LANGCHAIN_FIELD: Final = "langchain"

#: The message classes by their ``type``, as ``messages_from_dict`` names them.
_CLASSES: Final[dict[str, type[BaseMessage]]] = {
    cls.model_fields["type"].default: cls
    for cls in (
        HumanMessage,
        AIMessage,
        SystemMessage,
        ToolMessage,
        FunctionMessage,
        ChatMessage,
        HumanMessageChunk,
        AIMessageChunk,
        SystemMessageChunk,
        ToolMessageChunk,
        FunctionMessageChunk,
        ChatMessageChunk,
    )
}
#: The OpenAI role of each class (``None``: a ChatMessage, whose role says).
_ROLE_OF: Final[dict[type[BaseMessage], str | None]] = {
    HumanMessage: "user",
    AIMessage: "assistant",
    SystemMessage: "system",
    ToolMessage: "tool",
    FunctionMessage: "function",
    ChatMessage: None,
}
#: The class a stored role implies, when ``extra["langchain"]`` does not name another.
_TYPE_OF_ROLE: Final = {
    "user": "human",
    "assistant": "ai",
    "system": "system",
    "developer": "system",
    "tool": "tool",
    "function": "function",
}
#: Roles whose OpenAI messages carry a ``name`` of their own.
_NAMED_ROLES: Final = frozenset(("user", "assistant", "system", "developer", "function"))
#: How ``langchain-openai`` marks a SystemMessage that is sent as ``developer``.
_OPENAI_ROLE: Final = "__openai_role__"
_REQUIRED: Final = object()


def message_key(session_id: str, message_id: str) -> uuid.UUID:
    """The key a message with ``id`` ``message_id`` is stored under in ``session_id``."""
    return uuid.uuid5(MESSAGE_ID_NAMESPACE, f"{session_id}:{message_id}")


def _role_of(message: BaseMessage) -> str:
    for cls in type(message).__mro__:
        if cls in _ROLE_OF:
            role = _ROLE_OF[cls]
            if role is None:  # a ChatMessage: its role, when OpenAI has it
                chat_role = getattr(message, "role", None)
                return chat_role if chat_role in ROLES else "user"
            if role == "system" and message.additional_kwargs.get(_OPENAI_ROLE) == "developer":
                return "developer"
            return role
    raise InvalidMessage(
        "type", f"{type(message).__name__} ({message.type!r}) is not a message to store"
    )


def _openai_tool_calls(calls: list[Any]) -> list[dict[str, Any]] | None:
    """LangChain tool calls in OpenAI's form, or ``None`` when that form would not give
    exactly them back (a call without an id, arguments that are not plain JSON)."""
    try:
        converted = [
            {
                "id": call["id"],
                "type": "function",
                "function": {
                    "name": call["name"],
                    "arguments": json.dumps(call["args"], ensure_ascii=False),
                },
            }
            for call in calls
        ]
    except (KeyError, TypeError, ValueError):
        return None
    if any(not isinstance(call["id"], str) for call in converted):
        return None
    parsed, invalid = default_tool_parser(converted)
    return converted if not invalid and parsed == calls else None


def _implied(wire: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """The message type and fields an OpenAI-format message implies on its own."""
    role = wire["role"]
    content = wire.get("content")
    fields: dict[str, Any] = {"content": "" if content is None else content}
    extra = {k: v for k, v in wire.items() if k not in _WIRE_KEYS}
    if role in _NAMED_ROLES and "name" in extra:
        fields["name"] = extra.pop("name")
    additional: dict[str, Any] = {}
    if role == "developer":
        additional[_OPENAI_ROLE] = "developer"
    additional.update(extra)  # another writer's OpenAI keys (refusal, audio...)
    fields["additional_kwargs"] = additional
    if role == "assistant":
        tool_calls, invalid = default_tool_parser(wire.get("tool_calls") or [])
        fields["tool_calls"] = tool_calls
        fields["invalid_tool_calls"] = invalid
    elif role == "tool":
        fields["tool_call_id"] = wire.get("tool_call_id") or ""
        if wire.get("tool_name") is not None:
            fields["name"] = wire["tool_name"]
    elif role == "function":
        fields.setdefault("name", "")
    return _TYPE_OF_ROLE[role], fields


#: Keys of an OpenAI-format message that are not "another OpenAI key" for _implied.
_WIRE_KEYS: Final = frozenset(
    ("role", "content", "tool_calls", "tool_call_id", "tool_name", LANGCHAIN_FIELD, KEY_FIELD)
)


def _is_identifier(value: object) -> bool:
    """Whether ``value`` can be stored in an id column (``tool_call_id``)."""
    if not isinstance(value, str):
        return False
    try:
        check_identifier(value, "tool_call_id")
    except ValueError:
        return False
    return True


@functools.cache
def _defaults(cls: type[BaseMessage]) -> dict[str, Any]:
    """The default of each optional field of ``cls`` (compared with, never handed out)."""
    return {
        name: field.get_default(call_default_factory=True)
        for name, field in cls.model_fields.items()
        if not field.is_required()
    }


def message_usage(
    messages: Sequence[BaseMessage], batch: Sequence[Mapping[str, Any]]
) -> list[Usage] | None:
    """The usage LangChain reported on the batch's AI messages (``usage_metadata``, the
    model from ``response_metadata``), each keyed by its message (so a re-sent message
    counts once); ``None`` when none reported any."""
    records = []
    for message, wire in zip(messages, batch, strict=True):
        reported = getattr(message, "usage_metadata", None)
        if not isinstance(message, AIMessage) or not reported:
            continue
        details_in = reported.get("input_token_details") or {}
        details_out = reported.get("output_token_details") or {}
        meta = message.response_metadata or {}
        model = meta.get("model_name") or meta.get("model")
        key = uuid.UUID(str(wire[KEY_FIELD]))
        record = reported_usage(
            f"LangChain message {key}",
            message_uuid=key,
            model=model if isinstance(model, str) and model else None,
            provider=meta.get("model_provider") or None,
            input_tokens=reported.get("input_tokens") or 0,
            output_tokens=reported.get("output_tokens") or 0,
            cache_read_tokens=details_in.get("cache_read") or 0,
            cache_write_tokens=details_in.get("cache_creation") or 0,
            reasoning_tokens=details_out.get("reasoning") or 0,
        )
        if record is not None:
            records.append(record)
    return records or None


def to_openai_message(session_id: str, message: BaseMessage) -> dict[str, Any]:
    """``message`` as the OpenAI-format dict it is stored as (with its key).

    Raises:
        ArgumentTypeError: ``message`` is not a LangChain message.
        InvalidMessage: it is a ``RemoveMessage`` (or another class without a role).
    """
    if not isinstance(message, BaseMessage):
        raise ArgumentTypeError(
            "messages", f"must be a LangChain BaseMessage, got {type(message).__name__}"
        )
    role = _role_of(message)
    fields = message.model_dump()
    kind = fields.pop("type")
    wire: dict[str, Any] = {"role": role, "content": fields.pop("content")}
    if role in _NAMED_ROLES and fields.get("name") is not None:
        wire["name"] = fields["name"]
    if role == "assistant" and fields.get("tool_calls"):
        calls = _openai_tool_calls(fields["tool_calls"])
        if calls is not None:
            wire["tool_calls"] = calls
    if role == "tool" and _is_identifier(fields.get("tool_call_id")):
        wire["tool_call_id"] = fields["tool_call_id"]  # else kept as LangChain has it
    implied_kind, implied = _implied(wire)
    defaults = _defaults(type(message))
    saved: dict[str, Any] = {}
    for name, value in fields.items():
        base = implied[name] if name in implied else defaults.get(name, _REQUIRED)
        if base is _REQUIRED or value != base or type(value) is not type(base):
            saved[name] = value
    if saved or kind != implied_kind:
        wire[LANGCHAIN_FIELD] = {"type": kind, **saved}
    wire[KEY_FIELD] = str(message_key(session_id, message.id) if message.id else uuid.uuid4())
    return wire


def from_stored_message(message: StoredMessage) -> BaseMessage:
    """The LangChain message a stored message stands for (see the module's docstring)."""
    if message.role is None:  # a Responses item another writer stored
        wire = message.to_openai()
        content = wire.pop("content", None)
        kind = wire.get("type")
        return ChatMessage(
            content="" if content is None else content, role=str(kind), additional_kwargs=wire
        )
    # The stored message's own values, not to_openai()'s deep copy: the stored message
    # is read for this call only, and what it shares with the result is the result's.
    wire = {"role": message.role, "content": message.content}
    for name in WIRE_FIELDS[2:]:
        value = getattr(message, name)
        if value is not None:
            wire[name] = value
    wire.update(message.extra)
    return _from_wire(wire)


def _from_wire(wire: dict[str, Any]) -> BaseMessage:
    """The LangChain message an OpenAI-format message with a role stands for (a dict of
    ``load_openai``'s, or :func:`from_stored_message`'s own)."""
    saved = wire.get(LANGCHAIN_FIELD)
    kind, fields = _implied(wire)
    if isinstance(saved, dict):
        saved = dict(saved)
        cls = _CLASSES.get(saved.pop("type", kind), _CLASSES[kind])
        # What the OpenAI form implies for another class is not that class's.
        fields = {k: v for k, v in fields.items() if k in cls.model_fields}
        fields.update(saved)
        return cls(**fields)
    return _CLASSES[kind](**fields)


def _from_wire_dict(wire: dict[str, Any]) -> BaseMessage:
    """:func:`from_stored_message` of a ``load_openai`` dict (the load decodes the stored
    columns straight to it: no ``StoredMessage`` is built)."""
    if wire.get("role") is None:  # a Responses item another writer stored
        content = wire.pop("content", None)
        kind = wire.get("type")
        return ChatMessage(
            content="" if content is None else content, role=str(kind), additional_kwargs=wire
        )
    return _from_wire(wire)


class SessionRepoChatMessageHistory(BaseChatMessageHistory):
    """One conversation's history in a sessionrepo session (``session_id``).

    Give it one of:

    - ``url``: a database URL; omitted, ``SESSIONREPO_DATABASE_URL`` or the embedded
      SQLite file (``open_repository``'s default). The history opens what it needs on
      first use (a sync repository for the sync methods, an async one, on the running
      loop, for the async methods) and closes them in :meth:`close` / :meth:`aclose`.
      Its async methods then belong to the event loop of the first one called (an
      async repository is used from the loop that opened it): make one history per
      loop, or give it a repository.
    - ``repository``: an opened ``SessionRepository`` (the async methods then run its
      calls in an executor, as LangChain does) or ``AsyncSessionRepository`` (the async
      methods only: the sync ones raise ``InvalidArgument``). Yours to close.
    - ``repository`` and ``writer``: writes go through that ``TranscriptWriter`` (with an
      ``AsyncSessionRepository``: that ``AsyncTranscriptWriter``), whose repository it
      must be; while the primary refuses writes, added messages are parked in its outbox
      and reach the transcript in order when it drains (``writer.start()``). Reads show
      what the primary has. Yours to close.

    ``session_defaults`` (``source=``, ``user_id=``, ``title=``...) fill in the session
    row when the first add creates it.

    Adding is atomic per call (all the messages or none). A message whose ``id`` is
    stored already with the same content is skipped; with other content, the call
    raises ``ConflictError`` (through a writer: after storing the others).

    Raises:
        InvalidArgument: conflicting or missing arguments (``ArgumentTypeError``: of the
            wrong type); nothing was opened.
    """

    def __init__(
        self,
        session_id: str,
        *,
        url: str | None = None,
        repository: SessionRepository | AsyncSessionRepository | None = None,
        writer: TranscriptWriter | AsyncTranscriptWriter | None = None,
        session_defaults: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.session_id = check_session_id(session_id)
        if url is not None and not isinstance(url, str):
            raise ArgumentTypeError("url", f"must be a string, got {type(url).__name__}")
        if url is not None and repository is not None:
            raise InvalidArgument("url", "give url= or repository=, not both")
        if repository is not None and not isinstance(
            repository, SessionRepository | AsyncSessionRepository
        ):
            raise ArgumentTypeError(
                "repository",
                "must be a SessionRepository or an AsyncSessionRepository, "
                f"got {type(repository).__name__}",
            )
        if writer is not None:
            if repository is None:
                raise InvalidArgument("writer", "give the repository it writes to as well")
            wanted = (
                TranscriptWriter
                if isinstance(repository, SessionRepository)
                else AsyncTranscriptWriter
            )
            if not isinstance(writer, wanted):
                raise ArgumentTypeError(
                    "writer",
                    f"a {type(repository).__name__} goes with a {wanted.__name__}, "
                    f"got {type(writer).__name__}",
                )
        if session_defaults is not None and not isinstance(session_defaults, Mapping):
            raise ArgumentTypeError(
                "session_defaults", f"must be a mapping, got {type(session_defaults).__name__}"
            )
        self._url = url
        self._owned = repository is None
        self._sync = repository if isinstance(repository, SessionRepository) else None
        self._async = repository if isinstance(repository, AsyncSessionRepository) else None
        self._writer = writer if isinstance(writer, TranscriptWriter) else None
        self._async_writer = writer if isinstance(writer, AsyncTranscriptWriter) else None
        self._defaults = dict(session_defaults or {})
        self._opening = threading.Lock()
        self._async_opening: asyncio.Lock | None = None
        self._closed = False

    def __repr__(self) -> str:
        return f"SessionRepoChatMessageHistory({self.session_id!r})"

    # -- what it runs on ------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise RepoError("this SessionRepoChatMessageHistory is closed")

    def _repository(self) -> SessionRepository:
        self._check_open()
        if self._sync is None:
            if not self._owned:
                raise InvalidArgument(
                    "repository",
                    "an AsyncSessionRepository serves the async methods only (aget_messages, "
                    "aadd_messages, aclear); give a SessionRepository or url= for the sync ones",
                )
            with self._opening:
                if self._sync is None:
                    self._sync = open_repository(self._url)
        return self._sync

    async def _async_repository(self) -> AsyncSessionRepository | None:
        """The async repository, opened on first use when the history owns it; ``None``
        when it was given a sync one."""
        self._check_open()
        if self._async is not None or not self._owned:
            return self._async
        if self._async_opening is None:
            self._async_opening = asyncio.Lock()
        async with self._async_opening:
            if self._async is None:
                self._async = await open_async_repository(self._url)
        return self._async

    def _batch(self, messages: Sequence[BaseMessage]) -> list[dict[str, Any]]:
        if isinstance(messages, BaseMessage | str) or not isinstance(messages, Sequence):
            raise ArgumentTypeError(
                "messages", f"a sequence of messages, got {type(messages).__name__}"
            )
        batch = []
        for index, message in enumerate(messages):
            try:
                batch.append(to_openai_message(self.session_id, message))
            except InvalidArgument as exc:  # named by its place in the batch
                raise type(exc)(f"messages[{index}]", exc.reason) from None
        return batch

    def _check_written(self, result: WriteResult) -> None:
        if result.conflicts:
            raise ConflictError(
                f"{len(result.conflicts)} message id(s) are stored already with other "
                "content (the other messages were stored)",
                session_id=self.session_id,
                conflicts=result.conflicts,
            )

    # -- BaseChatMessageHistory -----------------------------------------------------

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        """The live transcript, oldest first."""
        try:
            wires = self._repository().load_openai(self.session_id)
        except NotFound:
            return []
        return [_from_wire_dict(wire) for wire in wires]

    async def aget_messages(self) -> list[BaseMessage]:
        repository = await self._async_repository()
        if repository is None:
            return await run_in_executor(None, lambda: self.messages)
        try:
            wires = await repository.load_openai(self.session_id)
        except NotFound:
            return []
        return [_from_wire_dict(wire) for wire in wires]

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        """Store ``messages`` at the end of the transcript, atomically.

        Raises:
            InvalidMessage: a message cannot be stored faithfully (a field that is not
                JSON, a ``RemoveMessage``); nothing was stored.
            ConflictError: a message's id is stored already with other content.
            BackendUnavailable: the database cannot take it now (without a writer).
        """
        repository = self._repository()
        batch = self._batch(messages)
        if not batch:
            return
        usage = message_usage(messages, batch)
        if self._writer is not None:
            self._check_written(
                self._writer.write(self.session_id, batch, usage=usage, **self._defaults)
            )
        else:
            repository.append(
                self.session_id, batch, on_conflict="raise", usage=usage, **self._defaults
            )

    async def aadd_messages(self, messages: Sequence[BaseMessage]) -> None:
        """:meth:`add_messages`, awaited."""
        repository = await self._async_repository()
        if repository is None:
            await run_in_executor(None, self.add_messages, messages)
            return
        batch = self._batch(messages)
        if not batch:
            return
        usage = message_usage(messages, batch)
        if self._async_writer is not None:
            result = await self._async_writer.write(
                self.session_id, batch, usage=usage, **self._defaults
            )
            self._check_written(result)
        else:
            await repository.append(
                self.session_id, batch, on_conflict="raise", usage=usage, **self._defaults
            )

    def clear(self) -> None:
        """Empty the live transcript; the messages stay stored as history (sessionrepo
        never deletes them: ``prune`` does)."""
        repository = self._repository()
        try:
            if self._writer is not None:
                self._writer.clear_session(self.session_id)
            else:
                repository.clear_session(self.session_id)
        except NotFound:
            pass

    async def aclear(self) -> None:
        """:meth:`clear`, awaited."""
        repository = await self._async_repository()
        if repository is None:
            await run_in_executor(None, self.clear)
            return
        try:
            if self._async_writer is not None:
                await self._async_writer.clear_session(self.session_id)
            else:
                await repository.clear_session(self.session_id)
        except NotFound:
            pass

    # -- closing --------------------------------------------------------------------

    def close(self) -> None:
        """Close what the history opened (nothing it was given).

        Raises:
            RepoError: it opened an async repository too (its async methods were
                used): close it with ``await history.aclose()``.
        """
        if self._closed or not self._owned:
            self._closed = True
            return
        if self._async is not None:
            raise RepoError(
                "this history opened an async repository: close it with await history.aclose()"
            )
        self._closed = True
        if self._sync is not None:
            self._sync.close()

    async def aclose(self) -> None:
        """Close what the history opened, the async repository included."""
        if self._closed:
            return
        self._closed = True
        if not self._owned:
            return
        if self._async is not None:
            await self._async.close()
        if self._sync is not None:
            await run_in_executor(None, self._sync.close)

    def __enter__(self) -> SessionRepoChatMessageHistory:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    async def __aenter__(self) -> SessionRepoChatMessageHistory:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
