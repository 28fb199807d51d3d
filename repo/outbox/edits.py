"""Edits through the outbox: a rewind, retract, clear or compaction a gateway sends while
its session has parked messages (or while the primary is away) is parked in the same
per-session FIFO, so that a replay applies it exactly where it was sent: after the
messages parked before it and before those parked after it.

A parked edit is an outbox row like a message's: its payload is a :class:`Message` that
is a Responses-style item of type :data:`EDIT_TYPE` (a type no OpenAI item has) naming
the operation and its arguments, under a key of its own. The drainer applies it with the
repository's edit instead of appending it; it is never stored as a message.

Every edit the writer takes may be applied twice without harm (a write abandoned at the
deadline may still commit, and its parked copy then replays too): rewind, retract and
clear take out what is live past a point or under a key, and a compaction is
idempotent by its summary's key. ``pop_last`` is not (twice is two steps), so the writer
does not take it: retract the step's keys instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from sessionrepo.models import EditResult, Message
from sessionrepo.store.repository import SessionRepository

#: The item type of a parked edit.
EDIT_TYPE: Final = "sessionrepo.edit"
#: The edits the writer takes (see the module docstring for why not ``pop_last``).
OPERATIONS: Final = ("rewind", "retract", "clear_session", "compact")


def edit_message(operation: str, arguments: Mapping[str, Any]) -> Message:
    """The outbox payload of an edit (``arguments`` JSON-ready)."""
    if operation not in OPERATIONS:
        raise ValueError(f"{operation!r} is not an edit the writer takes")
    return Message(
        role=None,
        extra={"type": EDIT_TYPE, "operation": operation, "arguments": dict(arguments)},
    )


def is_edit(message: Message) -> bool:
    return message.role is None and message.extra.get("type") == EDIT_TYPE


def apply_edit(repository: SessionRepository, session_id: str, message: Message) -> EditResult:
    """Apply a parked edit to the primary, as the call that parked it asked."""
    operation = message.extra["operation"]
    arguments: dict[str, Any] = message.extra["arguments"]
    if operation == "rewind":
        return repository.rewind(session_id, arguments["to_seq"])
    if operation == "retract":
        return repository.retract(session_id, arguments["keys"])
    if operation == "clear_session":
        return repository.clear_session(session_id)
    if operation == "compact":
        summary = Message.model_validate(arguments["summary"])
        return repository.compact(session_id, arguments["through_seq"], summary)
    raise ValueError(f"an outbox row names an unknown edit {operation!r}")
