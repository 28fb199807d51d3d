"""Orphan safety: is a transcript valid to send to the provider?

Providers refuse a transcript in which a tool call has no output, an output answers no
call, or a Responses-API ``reasoning`` item is not followed by the item it reasoned
about. An edit that cuts a transcript in the wrong place makes exactly such a transcript
(OpenAI Agents JS PRs 1099 and 1280 were that bug); these helpers find the problems, so a
gateway can check what it is about to send, and ``pop_last`` never leaves one behind.

Both chat formats are understood, mixed in one transcript as a store may hold them:
Chat Completions (an ``assistant`` message's ``tool_calls`` answered by ``tool`` messages
with that ``tool_call_id``) and Responses items (``function_call`` and the other
client-run calls answered by their ``*_output`` item with the same ``call_id``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from sessionrepo.models.message import Message, coerce_message

#: Responses-API calls the client runs: each needs its ``<type>_output`` item, same
#: ``call_id``. Calls the provider runs itself (web search, file search, MCP, code
#: interpreter, image generation) carry their results and need nothing after them.
CLIENT_CALL_TYPES: Final = frozenset(
    (
        "function_call",
        "custom_tool_call",
        "computer_call",
        "local_shell_call",
        "shell_call",
        "apply_patch_call",
    )
)
OUTPUT_TYPES: Final = frozenset(f"{kind}_output" for kind in CLIENT_CALL_TYPES)


@dataclass(frozen=True)
class TranscriptProblem:
    """One reason a transcript would be refused: the message's position in the list
    given, and what is wrong with it."""

    index: int
    problem: str

    def __str__(self) -> str:
        return f"messages[{self.index}]: {self.problem}"


def _call_ids(message: Message) -> list[str]:
    """Ids of the calls this message makes that need an answer."""
    if message.item_type in CLIENT_CALL_TYPES:
        call_id = message.extra.get("call_id")
        return [call_id] if isinstance(call_id, str) else []
    if message.role == "assistant" and message.tool_calls:
        return [
            call["id"]
            for call in message.tool_calls
            if isinstance(call, Mapping) and isinstance(call.get("id"), str)
        ]
    return []


def answered_call(message: Message) -> str | None:
    """The call id this message answers (a ``tool`` message, a ``*_call_output`` item)."""
    if message.item_type in OUTPUT_TYPES:
        call_id = message.extra.get("call_id")
        if call_id is None and message.item_type == "local_shell_call_output":
            call_id = message.extra.get("id")  # this one names its call by "id"
        return call_id if isinstance(call_id, str) else None
    if message.role == "tool":
        return message.tool_call_id
    return None


def is_reasoning(message: Message) -> bool:
    return message.item_type == "reasoning"


def transcript_problems(
    messages: Iterable[Message | Mapping[str, Any]],
) -> list[TranscriptProblem]:
    """Every reason the provider would refuse this transcript, in order (empty: valid
    to send): a call without its output, an output without its call (before it), a
    reasoning item with nothing after it."""
    transcript = [coerce_message(message) for message in messages]
    problems: list[TranscriptProblem] = []
    open_calls: dict[str, int] = {}
    for index, message in enumerate(transcript):
        answered = answered_call(message)
        if answered is not None and open_calls.pop(answered, None) is None:
            problems.append(
                TranscriptProblem(index, f"answers call {answered!r}, made by no message before it")
            )
        for call_id in _call_ids(message):
            open_calls[call_id] = index
    for call_id, index in open_calls.items():
        problems.append(TranscriptProblem(index, f"call {call_id!r} has no output after it"))
    if transcript and is_reasoning(transcript[-1]):
        problems.append(
            TranscriptProblem(
                len(transcript) - 1, "a reasoning item must be followed by the item it led to"
            )
        )
    problems.sort(key=lambda problem: problem.index)
    return problems


def is_sendable(messages: Iterable[Message | Mapping[str, Any]]) -> bool:
    """Whether the provider would take this transcript (:func:`transcript_problems`
    finds nothing)."""
    return not transcript_problems(messages)


def last_step(messages: list[Message]) -> int:
    """Where the last *logical step* of a transcript starts: the index from which on
    ``pop_last`` takes messages away.

    A step is the last message with what cannot stay without it: tool outputs take
    the call that made them (an assistant message with ``tool_calls``, or the run of
    call items) and the outputs answering the same calls, and a reasoning item left
    last goes with what followed it. Returns ``len(messages)`` for an empty list.
    """
    start = len(messages) - 1
    if start < 0:
        return 0
    pending: set[str] = set()
    answered = answered_call(messages[start])
    if answered is not None:
        pending.add(answered)
    while pending and start > 0:
        start -= 1
        message = messages[start]
        pending.difference_update(_call_ids(message))
        answered = answered_call(message)
        if answered is not None:
            pending.add(answered)
    while start > 0 and is_reasoning(messages[start - 1]):
        start -= 1
    return start
