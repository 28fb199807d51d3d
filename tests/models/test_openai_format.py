"""Messages convert losslessly to and from the OpenAI chat format (no database here).

DESIGN.md: ``Message.from_openai(d).to_openai() == d`` for every dict without the key,
unknown keys included; ``to_openai()`` is provider-ready; the key travels with the dict.
"""

from __future__ import annotations

import copy
import uuid
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from sessionrepo import Message, ensure_key
from sessionrepo.models import MAX_JSON_DEPTH
from sessionrepo.models.message import KEY_FIELD

from support.strategies import (
    assert_identical,
    aware_datetimes,
    json_values,
    nested_lists,
    openai_messages,
    timestamps,
)


@settings(max_examples=400, deadline=None)
@given(openai_messages())
def test_from_openai_then_to_openai_gives_the_same_dict(message: dict[str, Any]) -> None:
    before = copy.deepcopy(message)

    out = Message.from_openai(message).to_openai()

    assert out == message
    assert list(out) == list(message)  # key order, not just equality
    assert_identical(out, message)  # types (1 vs 1.0 vs True, -0.0) and nested key order
    assert_identical(message, before)  # the input dict is not modified


@settings(max_examples=200, deadline=None)
@given(openai_messages(), timestamps())
def test_include_key_then_from_openai_gives_the_same_key_and_message(
    message: dict[str, Any], timestamp: Any
) -> None:
    original = Message.from_openai(message, timestamp=timestamp)

    flushed = original.to_openai(include_key=True)
    again = Message.from_openai(flushed, timestamp=original.timestamp)

    assert flushed[KEY_FIELD] == str(original.client_msg_uuid)
    assert again.client_msg_uuid == original.client_msg_uuid
    assert again == original
    assert_identical(again.to_openai(), message)


@settings(max_examples=100, deadline=None)
@given(openai_messages())
def test_ensure_key_stamps_once_and_the_key_travels_with_the_dict(
    message: dict[str, Any],
) -> None:
    provider_dict = copy.deepcopy(message)

    key = ensure_key(message)

    assert isinstance(key, uuid.UUID)
    assert message[KEY_FIELD] == str(key)
    assert ensure_key(message) == key  # a second flush path: the same key
    assert message[KEY_FIELD] == str(key)
    first, second = Message.from_openai(message), Message.from_openai(message)
    assert first.client_msg_uuid == second.client_msg_uuid == key
    assert_identical(first.to_openai(), provider_dict)  # provider-ready: no key
    assert_identical(first.to_openai(include_key=True), message)


def test_ensure_key_keeps_a_key_the_dict_already_has() -> None:
    key = uuid.uuid4()
    as_text: dict[str, Any] = {"role": "user", "content": "hi", KEY_FIELD: str(key)}
    as_uuid: dict[str, Any] = {"role": "user", "content": "hi", KEY_FIELD: key}

    assert ensure_key(as_text) == key
    assert ensure_key(as_uuid) == key
    assert as_text[KEY_FIELD] == str(key)
    assert as_uuid[KEY_FIELD] is key


def test_new_keys_are_time_ordered_uuid7() -> None:
    keys = [ensure_key({"role": "user"}) for _ in range(50)]
    assert all(key.version == 7 for key in keys)
    assert len(set(keys)) == 50


@settings(max_examples=100, deadline=None)
@given(openai_messages())
def test_to_openai_returns_a_deep_copy(message: dict[str, Any]) -> None:
    parsed = Message.from_openai(message)
    out = parsed.to_openai()

    _vandalise(out)

    assert_identical(parsed.to_openai(), message)


@settings(max_examples=100, deadline=None)
@given(openai_messages())
def test_changing_the_input_dict_later_does_not_change_the_message(
    message: dict[str, Any],
) -> None:
    original = copy.deepcopy(message)
    parsed = Message.from_openai(message)

    _vandalise(message)

    assert_identical(parsed.to_openai(), original)


def _vandalise(value: Any) -> None:
    """Change every list and dict inside ``value`` in place."""
    if isinstance(value, dict):
        for item in list(value.values()):
            _vandalise(item)
        value["vandalised"] = True
    elif isinstance(value, list):
        for item in value:
            _vandalise(item)
        value.append("vandalised")


def test_a_directly_built_message_is_provider_ready() -> None:
    message = Message(role="user", content="hello")

    assert message.to_openai() == {"role": "user", "content": "hello"}
    assert KEY_FIELD not in message.to_openai()
    assert message.to_openai(include_key=True)[KEY_FIELD] == str(message.client_msg_uuid)


def test_a_directly_built_message_keeps_content_none_and_its_other_fields() -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    message = Message(
        role="assistant",
        content=None,
        tool_calls=[call],
        reasoning="because",
        finish_reason="tool_calls",
        token_count=7,
        extra={"refusal": None, "name": "bot"},
    )

    out = message.to_openai()

    # "content": None must be there: providers require the key on assistant messages.
    assert_identical(
        out,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [call],
            "reasoning": "because",
            "finish_reason": "tool_calls",
            "token_count": 7,
            "refusal": None,
            "name": "bot",
        },
    )
    assert Message.from_openai(out, timestamp=message.timestamp).to_openai() == out


@pytest.mark.parametrize(
    "message",
    [
        pytest.param({"role": "assistant"}, id="content-absent"),
        pytest.param({"role": "assistant", "content": None}, id="content-none"),
        pytest.param({"content": "x", "role": "user"}, id="role-not-first"),
        pytest.param(
            {"role": "tool", "tool_call_id": None, "name": None, "content": ""},
            id="explicit-nones",
        ),
        pytest.param({"role": "user", "timestamp": 1712345678.25}, id="timestamp-key-is-extra"),
        pytest.param(
            {"role": "user", "extra": {"x": 1}, "openai_keys": ["role"]}, id="our-own-names"
        ),
        pytest.param({"role": "user", "token_count": 0}, id="token-count-zero"),
        pytest.param({"role": "user", "n": 1, "f": 1.0, "b": True, "z": -0.0}, id="number-types"),
    ],
)
def test_edge_dicts_round_trip(message: dict[str, Any]) -> None:
    assert_identical(Message.from_openai(message).to_openai(), message)


@pytest.mark.parametrize(
    ("message", "field"),
    [
        pytest.param({"content": "x"}, "role", id="no-role"),
        pytest.param({"role": "robot"}, "role", id="unknown-role"),
        pytest.param({"role": "user", "content": b"x"}, "content", id="bytes-content"),
        pytest.param({"role": "user", "content": ("x",)}, "content", id="tuple-content"),
        pytest.param({"role": "user", "content": 5}, "content", id="int-content"),
        pytest.param(
            {"role": "user", "tool_calls": ({"id": "a"},)}, "tool_calls", id="tuple-calls"
        ),
        pytest.param({"role": "user", "token_count": True}, "token_count", id="bool-tokens"),
        pytest.param({"role": "user", "token_count": 1.0}, "token_count", id="float-tokens"),
        pytest.param({"role": "user", "token_count": "5"}, "token_count", id="str-tokens"),
        pytest.param({"role": "user", "token_count": 2**63}, "token_count", id="huge-tokens"),
        pytest.param({"role": "user", "tool_call_id": b"x"}, "tool_call_id", id="bytes-id"),
        pytest.param({"role": "user", "tool_call_id": ""}, "tool_call_id", id="empty-id"),
        pytest.param({"role": "user", "reasoning": 1}, "reasoning", id="int-reasoning"),
        pytest.param({"role": "user", 1: "x"}, "extra", id="int-key"),
        pytest.param({"role": "user", "x": {1: "x"}}, "extra", id="nested-int-key"),
        pytest.param({"role": "user", "x": float("nan")}, "extra", id="nan-extra"),
        pytest.param({"role": "user", KEY_FIELD: "not-a-uuid"}, KEY_FIELD, id="bad-key"),
    ],
)
def test_dicts_that_would_not_come_back_the_same_are_refused(
    message: dict[str, Any], field: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        Message.from_openai(message)
    assert caught.value.errors()[0]["loc"] == (field,)


@pytest.mark.parametrize("field", ["content", "tool_calls", "extra-value"], ids=lambda f: f)
def test_nesting_is_limited_to_max_json_depth_in_every_json_field(field: str) -> None:
    def build(depth: int) -> dict[str, Any]:
        value = nested_lists(depth)
        key = "x" if field == "extra-value" else field
        return {"role": "user", key: value}

    deepest = build(MAX_JSON_DEPTH)
    assert_identical(Message.from_openai(deepest).to_openai(), deepest)
    with pytest.raises(ValidationError, match=f"deeper than {MAX_JSON_DEPTH}"):
        Message.from_openai(build(MAX_JSON_DEPTH + 1))


def test_a_self_containing_list_is_refused_not_a_recursion_error() -> None:
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(ValidationError, match="deeper than"):
        Message(role="user", content=loop)


@settings(max_examples=100, deadline=None)
@given(aware_datetimes())
def test_timestamps_are_the_same_instant_in_utc(when: datetime) -> None:
    message = Message(role="user", timestamp=when)

    assert message.timestamp == when
    assert message.timestamp.utcoffset() == timedelta(0)


def test_epoch_seconds_are_accepted_as_utc() -> None:
    assert Message(role="user", timestamp=0).timestamp == datetime(1970, 1, 1, tzinfo=UTC)
    assert Message(role="user", timestamp=1_700_000_000.123456).timestamp == datetime(
        2023, 11, 14, 22, 13, 20, 123456, tzinfo=UTC
    )


@pytest.mark.parametrize(
    "when",
    [
        pytest.param(datetime(2024, 1, 1), id="naive"),
        pytest.param(True, id="bool"),
        pytest.param(float("nan"), id="nan"),
        pytest.param(float("inf"), id="inf"),
        pytest.param(10**20, id="epoch-out-of-range"),
        pytest.param(
            datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=5))), id="before-year-1-in-utc"
        ),
    ],
)
def test_timestamps_that_are_not_an_instant_are_refused(when: Any) -> None:
    with pytest.raises(ValidationError) as caught:
        Message(role="user", timestamp=when)
    assert caught.value.errors()[0]["loc"] == ("timestamp",)


@given(json_values())
def test_json_values_in_extra_keep_their_types(value: Any) -> None:
    message = {"role": "user", "payload": value}
    assert_identical(Message.from_openai(message).to_openai(), message)


@given(openai_messages(), st.integers(min_value=2, max_value=4))
def test_equal_dicts_give_different_keys(message: dict[str, Any], times: int) -> None:
    # Identity is the key, never the content: the same dict twice is two messages. (One
    # message drawn: a list of them was slow enough to fail Hypothesis' health check.)
    parsed = [Message.from_openai(message) for _ in range(times)]
    assert len({m.client_msg_uuid for m in parsed}) == len(parsed)
