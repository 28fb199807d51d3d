"""Faithful storage, the same on both backends (DESIGN.md, "Append").

Every valid Unicode string and every JSON value that round-trips comes back exactly:
same characters, same types, same numbers, same key order; timestamps come back as the
same instant, timezone-aware UTC. What cannot be stored faithfully is refused with
``InvalidMessage`` naming the field, before anything is written.

The corpus runs on every backend through the ``repo`` fixture; the differential test at
the end stores Hypothesis-generated transcripts on SQLite and PostgreSQL at once and
compares the two.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sessionrepo import (
    InvalidMessage,
    Message,
    NotFound,
    SessionRepository,
    StoredMessage,
    open_repository,
)
from sessionrepo.models import MAX_ID_LENGTH, MAX_JSON_DEPTH, MAX_MESSAGE_BYTES
from sessionrepo.models.message import KEY_FIELD

from support.strategies import (
    assert_identical,
    nested_lists,
    openai_messages,
    timestamps,
)

pytestmark = pytest.mark.contract  # every repo test runs on the sync and async API

MESSAGE_FIELDS = tuple(Message.model_fields)
STORED_FIELDS = tuple(StoredMessage.model_fields)

C0_AND_DEL = "".join(chr(code) for code in range(0x20)) + "\x7f"
NONCHARACTERS = "".join(chr(code) for code in range(0xFDD0, 0xFDF0)) + "\ufffe\uffff"
MIB = 1024 * 1024


def _sid() -> str:
    return f"s-{uuid.uuid4().hex}"


def _assert_stored_exactly(loaded: StoredMessage, message: Message, sid: str, seq: int) -> None:
    """``loaded`` is ``message``, field by field, exact types and key order included."""
    for name in MESSAGE_FIELDS:
        assert_identical(getattr(loaded, name), getattr(message, name), f"${name}")
    assert loaded.timestamp.utcoffset() == timedelta(0)
    assert (loaded.session_id, loaded.seq) == (sid, seq)


def _store_and_load(repo: SessionRepository, message: Message) -> StoredMessage:
    sid = _sid()
    result = repo.append(sid, [message])
    assert result.inserted == [message.client_msg_uuid]
    [loaded] = repo.load_transcript(sid)
    _assert_stored_exactly(loaded, message, sid, 1)
    # Flushing what was loaded again (a resumed gateway) is a plain duplicate: the
    # stored value hashes the same as the original, whatever strange data it holds.
    again = repo.append(sid, [loaded.to_openai(include_key=True)])
    assert (again.inserted, again.duplicates, again.conflicts) == (
        [],
        [message.client_msg_uuid],
        [],
    )
    return loaded


# -- valid: every case comes back exactly ---------------------------------------------

TOOL_CALLS = [
    {
        "id": "call_0",
        "type": "function",
        "function": {
            "name": "search",
            "arguments": '{"q": "caf\\u00e9", "filters": {"z": 1, "a": [1.0, -0.0, null]}}',
        },
    },
    {
        "id": "call_1",
        "type": "function",
        "function": {"name": "nested", "arguments": {"deep": {"er": [{"est": [[[]]]}]}}},
        "z-last": {"b": 1, "a": 2},
    },
]

VALID_CASES = [
    pytest.param({"role": "user", "content": C0_AND_DEL}, id="every-c0-control-and-del"),
    pytest.param({"role": "user", "content": "\x00"}, id="nul-alone"),
    pytest.param({"role": "user", "content": "\x00leading nul"}, id="nul-at-start"),
    pytest.param({"role": "user", "content": "nul\x00in\x00middle\x00"}, id="nul-in-middle"),
    pytest.param({"role": "assistant", "reasoning": "think\x00ing"}, id="nul-in-reasoning"),
    pytest.param({"role": "user", "note\x00": "va\x00lue"}, id="nul-in-extra-key-and-value"),
    pytest.param(
        {"role": "assistant", "content": None, "tool_calls": [{"arguments": "\x00\x01"}]},
        id="nul-in-tool-calls",
    ),
    pytest.param({"role": "user", "content": "\x7f\x7f"}, id="del"),
    pytest.param({"role": "user", "content": "\x80\x85\x9f"}, id="c1-controls"),
    pytest.param({"role": "user", "content": "\ufeffhello\ufeff"}, id="bom"),
    pytest.param({"role": "user", "content": NONCHARACTERS}, id="noncharacters-at-start"),
    pytest.param({"role": "user", "content": f"a{NONCHARACTERS}b"}, id="noncharacters-in-middle"),
    pytest.param({"role": "user", "content": "\uffff"}, id="u+ffff-at-start"),
    pytest.param({"role": "user", "content": "x\uffffy"}, id="u+ffff-in-middle"),
    pytest.param({"role": "user", "content": "\ufdd0"}, id="the-mark-alone"),
    pytest.param({"role": "user", "content": '\ufdd0{"a": [1, 2]}'}, id="mark-then-json-object"),
    pytest.param({"role": "user", "content": "\ufdd0[1,2,3]"}, id="mark-then-json-list"),
    pytest.param({"role": "user", "content": '\ufdd0"a string"'}, id="mark-then-json-string"),
    pytest.param({"role": "user", "content": "\ufdd0null"}, id="mark-then-json-null"),
    pytest.param({"role": "user", "content": "\ufdd0{not json"}, id="mark-then-not-json"),
    pytest.param({"role": "assistant", "reasoning": "\ufdd0[1]"}, id="mark-then-json-reasoning"),
    pytest.param({"role": "user", "x": "\ufdd0[1]"}, id="mark-then-json-in-extra"),
    pytest.param(
        {"role": "user", "content": "👩‍👩‍👧‍👦 🏳️‍🌈 👍🏽 🇯🇵 ❤️"}, id="emoji-zwj-flags-modifiers"
    ),
    pytest.param({"role": "user", "content": "你好，世界。こんにちは、안녕하세요"}, id="cjk"),
    pytest.param(
        {"role": "user", "content": "مرحبا بالعالم \u202eשלום\u202c abc"}, id="rtl-and-override"
    ),
    pytest.param(
        {"role": "user", "content": "e\u0301 é \u0041\u030a Å ṩ ज़"},
        id="combining-marks-not-normalised",
    ),
    pytest.param(
        {"role": "user", "content": "𝄞 𐍈 \U0001f600 \U000e0041 \U0010fffd \U0010ffff"},
        id="astral-planes",
    ),
    pytest.param(
        {"role": "user", "content": "\u2028\u2029\u200b\u00ad\r\n\t"},
        id="separators-and-invisibles",
    ),
    pytest.param(
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is in this image?"},
                {
                    "type": "image_url",
                    "image_url": {"url": "https://x.test/a.png", "detail": "low"},
                },
                {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
                {"type": "text", "text": "\x00\ufdd0"},
            ],
        },
        id="multimodal-content-parts",
    ),
    pytest.param({"role": "user", "content": []}, id="empty-parts-list"),
    pytest.param(
        {"role": "user", "content": {"z": 1, "a": {"y": [], "b": {}}, "m": "\ufdd0"}},
        id="dict-content",
    ),
    pytest.param({"role": "user", "content": {}}, id="empty-dict-content"),
    pytest.param(
        {"role": "assistant", "content": None, "tool_calls": TOOL_CALLS}, id="tool-calls-nested"
    ),
    pytest.param(
        {"role": "assistant", "content": "", "tool_calls": []}, id="empty-tool-calls-list"
    ),
    pytest.param(
        {
            "role": "tool",
            "tool_call_id": "call_" + "x" * (MAX_ID_LENGTH - 5),
            "tool_name": "ツール🔧",
            "content": "42",
        },
        id="longest-and-unicode-identifiers",
    ),
    pytest.param(
        {"zeta": 1, "role": "user", "alpha": 2, "content": "x", "mid": {"z": 1, "a": 2}},
        id="key-order-of-message-and-extra",
    ),
    pytest.param(
        {"role": "user", "x": {"c": {"z": 1, "y": 2}, "b": [{"k2": 1, "k1": 2}], "a": None}},
        id="key-order-nested",
    ),
    pytest.param(
        {
            "role": "user",
            "numbers": [0.1, 1e308, -1e308, 5e-324, 2.2250738585072014e-308, -0.0, 0.0, 1.0, 1],
            "flags": [True, False, None, 1, 0],
            "mixed": {"one": 1, "one_float": 1.0, "true": True},
        },
        id="floats-ints-bools-keep-their-types",
    ),
    pytest.param(
        {
            "role": "user",
            "big": [2**256 - 1, -(2**256 - 1), 2**64, -(2**63) - 1, 2**53 + 1],
            "token_count": 2**63 - 1,
        },
        id="big-ints-near-the-bound",
    ),
    pytest.param({"role": "user", "token_count": -(2**63)}, id="smallest-token-count"),
    pytest.param(
        {"role": "user", "ключ": 1, "鍵": {"🔑": 2, "": 3, "\ufdd0": 4}, "e\u0301": 5, "é": 6},
        id="unicode-keys",
    ),
    pytest.param(
        {"role": "user", "content": "", "reasoning": "", "name": "", "": ""},
        id="empty-strings",
    ),
    pytest.param({"role": "user", "a": [], "b": {}, "c": [[]], "d": [{}]}, id="empty-containers"),
    pytest.param({"role": "assistant"}, id="content-absent"),
    pytest.param(
        {"role": "assistant", "content": None, "tool_calls": None, "name": None, "audio": None},
        id="explicit-nones",
    ),
    pytest.param({"role": "system", "content": "You are helpful."}, id="system"),
    pytest.param(
        {
            "content": "result",
            "tool_call_id": "call_0",
            "role": "tool",
            "platform_message_id": "discord:1234567890",
            "finish_reason": "stop",
            "token_count": 0,
        },
        id="tool-with-every-identifier",
    ),
    pytest.param(
        {"role": "user", "timestamp": "2024-01-01T00:00:00+05:30", "created": 1712345678.25},
        id="timestamp-key-stays-in-extra",
    ),
    pytest.param(
        {"role": "user", "extra": {"x": 1}, "openai_keys": ["y"], "seq": 9, "session_id": "z"},
        id="keys-named-like-our-columns",
    ),
    pytest.param({"role": "user", "deep": nested_lists(MAX_JSON_DEPTH)}, id="deepest-nesting"),
]


@pytest.mark.parametrize("message_dict", VALID_CASES)
def test_the_corpus_round_trips_exactly(
    repo: SessionRepository, message_dict: dict[str, Any]
) -> None:
    message = Message.from_openai(message_dict)

    loaded = _store_and_load(repo, message)

    assert_identical(loaded.to_openai(), message_dict)


def test_a_directly_built_message_round_trips(repo: SessionRepository) -> None:
    message = Message(
        role="assistant",
        content=[{"type": "text", "text": "\x00"}],
        tool_calls=[{"id": "c", "function": {"arguments": "{}"}}],
        tool_call_id="c",
        tool_name="t",
        reasoning="\ufdd0{}",
        finish_reason="tool_calls",
        token_count=12,
        platform_message_id="p-1",
        extra={"refusal": None, "n": -0.0},
    )

    loaded = _store_and_load(repo, message)

    assert loaded.openai_keys is None
    assert_identical(loaded.to_openai(), message.to_openai())


def test_a_batch_of_every_case_round_trips_in_order(repo: SessionRepository) -> None:
    dicts: list[dict[str, Any]] = [param.values[0] for param in VALID_CASES]  # type: ignore[misc]
    messages = [Message.from_openai(d) for d in dicts]
    sid = _sid()

    repo.append(sid, messages)
    loaded = repo.load_transcript(sid)

    assert len(loaded) == len(messages)
    for seq, (stored, message, original) in enumerate(
        zip(loaded, messages, dicts, strict=True), start=1
    ):
        _assert_stored_exactly(stored, message, sid, seq)
        assert_identical(stored.to_openai(), original)


# -- timestamps -------------------------------------------------------------------

IST = timezone(timedelta(hours=5, minutes=30))
TIMESTAMP_CASES = [
    pytest.param(
        datetime(2024, 3, 10, 12, 0, 0, 123456, tzinfo=IST),
        datetime(2024, 3, 10, 6, 30, 0, 123456, tzinfo=UTC),
        id="offset-+05:30",
    ),
    pytest.param(
        datetime(2024, 3, 10, 1, 0, tzinfo=timezone(timedelta(hours=-9, minutes=-30))),
        datetime(2024, 3, 10, 10, 30, tzinfo=UTC),
        id="offset--09:30",
    ),
    pytest.param(1_700_000_000, datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC), id="epoch-int"),
    pytest.param(
        1_700_000_000.5, datetime(2023, 11, 14, 22, 13, 20, 500000, tzinfo=UTC), id="epoch-float"
    ),
    pytest.param(
        datetime(2024, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
        datetime(2024, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
        id="microseconds-kept",
    ),
    pytest.param(
        datetime(2024, 1, 1, 0, 0, 0, 1, tzinfo=UTC),
        datetime(2024, 1, 1, 0, 0, 0, 1, tzinfo=UTC),
        id="one-microsecond",
    ),
    pytest.param(datetime(1, 1, 1, tzinfo=UTC), datetime(1, 1, 1, tzinfo=UTC), id="year-1"),
    pytest.param(
        datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
        datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
        id="year-9999",
    ),
]


@pytest.mark.parametrize(("given", "expected"), TIMESTAMP_CASES)
def test_timestamps_come_back_as_the_same_instant_in_utc(
    repo: SessionRepository, given: Any, expected: datetime
) -> None:
    message = Message.from_openai({"role": "user", "content": "t"}, timestamp=given)

    loaded = _store_and_load(repo, message)

    assert loaded.timestamp == expected
    assert loaded.timestamp.tzinfo is not None
    assert loaded.timestamp.utcoffset() == timedelta(0)
    assert (loaded.timestamp.year, loaded.timestamp.microsecond) == (
        expected.year,
        expected.microsecond,
    )


# -- large messages -----------------------------------------------------------------


@pytest.mark.slow
def test_a_32_mib_content_string_round_trips(repo: SessionRepository) -> None:
    content = "0123456789abcdef" * (32 * MIB // 16)
    message = Message(role="user", content=content)

    loaded = _store_and_load(repo, message)

    assert len(loaded.content) == 32 * MIB  # type: ignore[arg-type]


@pytest.mark.slow
def test_32_mib_of_multibyte_text_with_nul_round_trips(repo: SessionRepository) -> None:
    # Stored as the mark + JSON (it holds NUL): the encoded form must fit the limit too.
    unit = "\x00añ€😀"  # 1 + 1 + 2 + 3 + 4 bytes of UTF-8; NUL becomes \u0000 (6) in JSON
    content = unit * (32 * MIB // 16)
    message = Message(role="user", content=content, reasoning="é" * (MIB // 2))

    loaded = _store_and_load(repo, message)

    assert loaded.content == content


@pytest.mark.slow
def test_a_message_of_exactly_the_size_limit_is_stored(repo: SessionRepository) -> None:
    message = Message(role="user", content="x" * MAX_MESSAGE_BYTES)

    loaded = _store_and_load(repo, message)

    assert len(loaded.content) == MAX_MESSAGE_BYTES  # type: ignore[arg-type]


# -- invalid: refused, naming the field, nothing written ---------------------------

NAIVE = datetime(2024, 1, 1, 12, 0)
Batch = Callable[[], list[Any]]


def _one(**fields: Any) -> Batch:
    return lambda: [{"role": "user", **fields}]


def _bypassing_validation(**update: Any) -> Batch:
    # ``model_copy(update=...)`` skips Pydantic's validators: the repository must not.
    return lambda: [Message(role="user", content="x").model_copy(update=update)]


INVALID_CASES = [
    pytest.param(None, _one(content="a\ud800b"), "messages[0].content", id="surrogate-content"),
    pytest.param(
        None,
        _one(content=[{"type": "text", "text": "half an emoji \ud83d"}]),
        "messages[0].content",
        id="surrogate-in-content-part",
    ),
    pytest.param(None, _one(reasoning="\udc80"), "messages[0].reasoning", id="surrogate-reasoning"),
    pytest.param(None, _one(**{"k\udfff": 1}), "messages[0].extra", id="surrogate-extra-key"),
    pytest.param(None, _one(x={"\ud800": 1}), "messages[0].extra", id="surrogate-nested-key"),
    pytest.param(None, _one(x=["ok", "\udbff"]), "messages[0].extra", id="surrogate-extra-value"),
    pytest.param(
        None,
        _one(tool_calls=[{"id": "c", "function": {"arguments": {"a": [{"b": "\ud800"}]}}}]),
        "messages[0].tool_calls",
        id="surrogate-deep-in-tool-calls",
    ),
    pytest.param(None, _one(tool_call_id="c\ud800"), "messages[0].tool_call_id", id="surrogate-id"),
    pytest.param(
        None,
        _bypassing_validation(content="\ud800"),
        "messages[0].content",
        id="surrogate-via-model-copy",
    ),
    pytest.param(None, _one(x=float("nan")), "messages[0].extra", id="nan-extra"),
    pytest.param(
        None, _one(tool_calls=[{"x": float("inf")}]), "messages[0].tool_calls", id="inf-tool-calls"
    ),
    pytest.param(
        None, _one(content={"x": float("-inf")}), "messages[0].content", id="-inf-content"
    ),
    pytest.param(
        None,
        _bypassing_validation(extra={"x": float("nan")}),
        "messages[0].extra",
        id="nan-via-model-copy",
    ),
    pytest.param(
        None, _bypassing_validation(timestamp=NAIVE), "messages[0].timestamp", id="naive-timestamp"
    ),
    pytest.param(None, _one(created=NAIVE), "messages[0].extra", id="datetime-in-extra"),
    pytest.param(None, _one(x={1: "a"}), "messages[0].extra", id="int-key-nested"),
    pytest.param(None, lambda: [{"role": "user", 2: "a"}], "messages[0].extra", id="int-key-top"),
    pytest.param(None, _one(content={None: "a"}), "messages[0].content", id="none-key-content"),
    pytest.param(None, _one(content=("a", "b")), "messages[0].content", id="tuple-content"),
    pytest.param(None, _one(x=(1, 2)), "messages[0].extra", id="tuple-extra"),
    pytest.param(None, _one(tool_calls=({"id": "c"},)), "messages[0].tool_calls", id="tuple-calls"),
    pytest.param(None, _one(content=b"bytes"), "messages[0].content", id="bytes-content"),
    pytest.param(None, _one(x=[b"bytes"]), "messages[0].extra", id="bytes-extra"),
    pytest.param(None, _one(tool_call_id=b"c"), "messages[0].tool_call_id", id="bytes-id"),
    pytest.param(None, _one(tool_calls={"a"}), "messages[0].tool_calls", id="set-tool-calls"),
    pytest.param(None, _one(x={1, 2}), "messages[0].extra", id="set-extra"),
    pytest.param(
        None,
        _one(content=nested_lists(MAX_JSON_DEPTH + 1)),
        "messages[0].content",
        id="too-deep-content",
    ),
    pytest.param(
        None, _one(x=nested_lists(MAX_JSON_DEPTH + 1)), "messages[0].extra", id="too-deep-extra"
    ),
    pytest.param(
        None,
        _one(tool_calls=nested_lists(MAX_JSON_DEPTH + 1)),
        "messages[0].tool_calls",
        id="too-deep-tool-calls",
    ),
    pytest.param(None, _one(x=2**256), "messages[0].extra", id="int-wider-than-256-bits"),
    pytest.param(None, _one(x=[-(2**256)]), "messages[0].extra", id="negative-int-too-wide"),
    pytest.param(None, _one(token_count=2**63), "messages[0].token_count", id="token-count-int64"),
    pytest.param(None, _one(token_count=True), "messages[0].token_count", id="token-count-bool"),
    pytest.param(None, _one(token_count=3.0), "messages[0].token_count", id="token-count-float"),
    pytest.param(
        None,
        _one(tool_call_id="c" * (MAX_ID_LENGTH + 1)),
        "messages[0].tool_call_id",
        id="256-char-tool-call-id",
    ),
    pytest.param(
        None,
        _one(platform_message_id="p" * (MAX_ID_LENGTH + 1)),
        "messages[0].platform_message_id",
        id="256-char-platform-id",
    ),
    pytest.param(None, _one(tool_call_id="a\x00b"), "messages[0].tool_call_id", id="nul-in-id"),
    pytest.param(None, _one(tool_name="a\nb"), "messages[0].tool_name", id="newline-in-id"),
    pytest.param(None, _one(finish_reason=""), "messages[0].finish_reason", id="empty-id"),
    pytest.param("s" * (MAX_ID_LENGTH + 1), _one(), "session_id", id="256-char-session-id"),
    pytest.param("a\x00b", _one(), "session_id", id="nul-in-session-id"),
    pytest.param("a\nb", _one(), "session_id", id="newline-in-session-id"),
    pytest.param("a\x85b", _one(), "session_id", id="c1-control-in-session-id"),
    pytest.param("", _one(), "session_id", id="empty-session-id"),
    pytest.param("s\ud800", _one(), "session_id", id="surrogate-in-session-id"),
    pytest.param(
        None, lambda: [{"role": "robot", "content": "x"}], "messages[0].role", id="bad-role"
    ),
    pytest.param(None, lambda: [{"content": "x"}], "messages[0].role", id="missing-role"),
    pytest.param(None, lambda: ["just a string"], "messages[0]", id="not-a-message"),
    pytest.param(
        None,
        lambda: [{"role": "user", KEY_FIELD: "nope"}],
        f"messages[0].{KEY_FIELD}",
        id="key-not-a-uuid",
    ),
    pytest.param(
        None,
        lambda: [{"role": "user", "content": "fine"}, {"role": "user", "content": "\ud800"}],
        "messages[1].content",
        id="second-of-two-invalid",
    ),
    pytest.param(
        None,
        _one(content="x" * (MAX_MESSAGE_BYTES + 1)),
        "messages[0].content",
        id="content-over-max-bytes",
    ),
    pytest.param(
        None,
        _one(content="\x00" * (MAX_MESSAGE_BYTES // 6 + 1)),
        "messages[0].content",
        id="nul-content-over-max-bytes-once-encoded",
    ),
    pytest.param(
        None,
        _one(content="x" * (MAX_MESSAGE_BYTES // 2), big="y" * (MAX_MESSAGE_BYTES // 2)),
        "messages[0]",
        id="fields-together-over-max-bytes",
    ),
]


@pytest.mark.parametrize(("session_id", "batch", "field"), INVALID_CASES)
def test_what_cannot_be_stored_faithfully_is_refused_and_nothing_is_written(
    repo: SessionRepository, session_id: str | None, batch: Batch, field: str
) -> None:
    sid = _sid() if session_id is None else session_id

    with pytest.raises(InvalidMessage) as raised:
        repo.append(sid, batch())

    assert raised.value.field == field
    assert str(raised.value).startswith(field)
    assert repo.list_sessions().sessions == []
    if session_id is None:
        with pytest.raises(NotFound):
            repo.get_session(sid)


def test_invalid_session_defaults_are_refused_and_nothing_is_written(
    repo: SessionRepository,
) -> None:
    with pytest.raises(InvalidMessage) as raised:
        repo.append("s1", [{"role": "user"}], metadata={"x": float("nan")})

    assert raised.value.field == "session_defaults.metadata"
    with pytest.raises(NotFound):
        repo.get_session("s1")


def test_an_invalid_batch_for_an_existing_session_changes_nothing(
    repo: SessionRepository,
) -> None:
    repo.append("s1", [{"role": "user", "content": "kept"}])
    before = repo.get_session("s1")

    with pytest.raises(InvalidMessage):
        repo.append("s1", [{"role": "user", "content": "new"}, {"role": "user", "x": (1,)}])

    assert [m.content for m in repo.load_transcript("s1")] == ["kept"]
    assert repo.get_session("s1") == before


# -- differential: SQLite and PostgreSQL agree, on anything Hypothesis finds --------


@pytest.fixture
def both_stores(
    tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[tuple[SessionRepository, SessionRepository]]:
    """One SQLite store and one PostgreSQL store, both fresh, for the whole test."""
    server = request.getfixturevalue("postgres_server")
    path = tmp_path / "differential.db"
    shutil.copyfile(request.getfixturevalue("sqlite_template"), path)
    name = server.new_database()
    sqlite_repo = open_repository(f"sqlite:///{path}")
    postgres_repo = open_repository(server.url_for(name))
    try:
        yield sqlite_repo, postgres_repo
    finally:
        sqlite_repo.close()
        postgres_repo.close()
        server.drop(name)


@pytest.mark.sqlite
@pytest.mark.postgres
@settings(
    max_examples=500,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    batch=st.lists(st.tuples(openai_messages(), st.none() | timestamps()), min_size=1, max_size=6),
    split=st.integers(min_value=0, max_value=6),
)
def test_sqlite_and_postgresql_store_the_same_transcripts(
    both_stores: tuple[SessionRepository, SessionRepository],
    batch: list[tuple[dict[str, Any], Any]],
    split: int,
) -> None:
    dicts = [message for message, _ in batch]
    messages = [Message.from_openai(d, timestamp=when) for d, when in batch]
    sid = _sid()

    transcripts = []
    for store in both_stores:
        # Two appends, so that seq is checked across batches too.
        store.append(sid, messages[:split])
        store.append(sid, messages[split:])
        transcripts.append(store.load_transcript(sid))

    on_sqlite, on_postgres = transcripts
    assert len(on_sqlite) == len(on_postgres) == len(messages)
    for seq, (left, right, message, original) in enumerate(
        zip(on_sqlite, on_postgres, messages, dicts, strict=True), start=1
    ):
        for name in STORED_FIELDS:
            assert_identical(getattr(left, name), getattr(right, name), f"${name}")
        _assert_stored_exactly(left, message, sid, seq)
        assert_identical(left.to_openai(), original)
