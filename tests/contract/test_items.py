"""Every OpenAI format stored losslessly: the Chat Completions roles (developer and function
included) and one item of every Responses-API input type the OpenAI Python SDK defines
(tests/support/responses_items.py), on both backends and both APIs; orphan safety."""

from __future__ import annotations

import copy
import io
from typing import Any

import pytest
from pydantic import ValidationError

from sessionrepo import (
    InvalidMessage,
    Message,
    SessionRepository,
    is_sendable,
    open_repository,
    transcript_problems,
)
from sessionrepo.ops import export_sessions, import_sessions

from support.responses_items import CHAT_MESSAGES, RESPONSES_ITEMS
from support.strategies import assert_identical

pytestmark = pytest.mark.contract

ITEMS = [item for _, item in RESPONSES_ITEMS]
NAMES = [name for name, _ in RESPONSES_ITEMS]


@pytest.mark.parametrize("item", ITEMS + CHAT_MESSAGES, ids=NAMES + ["chat"] * len(CHAT_MESSAGES))
def test_every_item_and_role_round_trips_through_the_model(item: dict[str, Any]) -> None:
    assert_identical(Message.from_openai(item).to_openai(), item)


def test_an_item_keeps_its_own_keys_even_where_they_are_our_field_names() -> None:
    update = next(item for name, item in RESPONSES_ITEMS if name.startswith("ResponseConfig"))
    message = Message.from_item(update)
    assert message.role is None
    assert message.reasoning is None
    assert message.item_type == "configuration_update"
    assert message.extra["reasoning"] == {"effort": "low", "summary": "auto"}
    assert_identical(message.to_item(), update)


def test_a_dict_with_neither_role_nor_type_is_refused_naming_the_role() -> None:
    with pytest.raises(ValidationError) as caught:
        Message.from_openai({"content": "x"})
    assert caught.value.errors()[0]["loc"] == ("role",)
    with pytest.raises(ValueError, match="type"):
        Message.from_item({"role": "user", "content": "x"})
    with pytest.raises(ValidationError, match="Responses item"):
        Message(role=None, content="x")
    with pytest.raises(ValidationError, match="role"):
        Message.from_openai({"role": "robot", "content": "x"})


def test_an_item_built_directly_comes_out_type_first() -> None:
    message = Message(role=None, extra={"type": "function_call", "call_id": "c", "name": "f"})
    assert list(message.to_openai()) == ["type", "call_id", "name"]


def test_every_item_and_role_round_trips_through_the_store(repo: SessionRepository) -> None:
    sent = [copy.deepcopy(item) for item in ITEMS + CHAT_MESSAGES]
    result = repo.append("s", sent)
    assert len(result.inserted) == len(sent)
    assert not result.conflicts

    loaded = repo.load_transcript("s")
    for message, original in zip(loaded, ITEMS + CHAT_MESSAGES, strict=True):
        assert_identical(message.to_openai(), original)
    assert [m.role for m in loaded[:3]] == ["developer", "user", "system"]
    assert loaded[4].role is None
    assert loaded[4].item_type == "file_search_call"

    again = repo.append("s", [m.to_openai(include_key=True) for m in loaded])
    assert (again.inserted, len(again.duplicates), again.conflicts) == ([], len(sent), [])
    assert repo.get_session("s").message_count == len(sent)


@pytest.mark.parametrize(
    ("words", "item_name"),
    [
        ("Kyoto celsius", "ResponseFunctionToolCallParam"),  # function arguments
        ("temperature clear", "FunctionCallOutput"),  # function output
        ("vet file first", "ResponseReasoningItemParam"),  # reasoning summary
        ("visits", "ResponseCustomToolCallParam"),  # custom tool input
        ("vaccination record", "ResponseFileSearchToolCallParam"),  # queries
        ("Mochi vet visit Tuesday", "ResponseOutputMessageParam"),  # output_text part
    ],
)
def test_the_text_of_items_is_searchable(
    repo: SessionRepository, words: str, item_name: str
) -> None:
    repo.append("s", [copy.deepcopy(item) for item in ITEMS])
    hits = repo.search(words, session_id="s")
    assert NAMES.index(item_name) + 1 in [hit.seq for hit in hits]


def test_list_sessions_previews_a_user_message_item(repo: SessionRepository) -> None:
    parts = next(item for name, item in RESPONSES_ITEMS if name == "EasyInputMessageParam:parts")
    repo.append("s", [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}])
    repo.append("s", [copy.deepcopy(parts)])
    [summary] = repo.list_sessions().sessions
    assert summary.preview == "what is in this picture of Mochi?"


def test_a_role_outside_the_formats_is_refused_before_anything_is_written(
    repo: SessionRepository,
) -> None:
    with pytest.raises(InvalidMessage):
        repo.append("s", [{"role": "user", "content": "ok"}, {"content": "no role, no type"}])
    with pytest.raises(InvalidMessage):
        repo.append("s", [{"role": "robot", "content": "x"}])
    assert repo.list_sessions().sessions == []


def test_export_and_import_reproduce_every_item_exactly(database_url: str, tmp_path: Any) -> None:
    source = open_repository(database_url, auto_migrate=True)
    try:
        source.append("s", [copy.deepcopy(item) for item in ITEMS + CHAT_MESSAGES])
        buffer = io.BytesIO()
        export_sessions(source, buffer)
    finally:
        source.close()
    target = open_repository(f"sqlite:///{tmp_path}/copy.db", auto_migrate=True)
    try:
        import_sessions(target, io.BytesIO(buffer.getvalue()))
        for message, original in zip(
            target.load_transcript("s"), ITEMS + CHAT_MESSAGES, strict=True
        ):
            assert_identical(message.to_openai(), original)
    finally:
        target.close()


# -- orphan safety -------------------------------------------------------------------


def _call(call_id: str) -> dict[str, Any]:
    return {"type": "function_call", "call_id": call_id, "name": "f", "arguments": "{}"}


def _output(call_id: str) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": "ok"}


REASONING = {"type": "reasoning", "id": "rs", "summary": []}
CHAT_CALL = {
    "role": "assistant",
    "content": None,
    "tool_calls": [{"id": "t1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
}
CHAT_OUTPUT = {"role": "tool", "tool_call_id": "t1", "content": "ok"}


@pytest.mark.parametrize(
    ("transcript", "problem_at"),
    [
        ([{"role": "user", "content": "hi"}, REASONING, _call("a"), _output("a")], []),
        ([{"role": "user", "content": "hi"}, CHAT_CALL, CHAT_OUTPUT], []),
        ([_call("a")], [0]),  # a call without its output
        ([_output("a")], [0]),  # an output without its call
        ([_output("a"), _call("a")], [0, 1]),  # the output before its call
        ([CHAT_CALL], [0]),
        ([CHAT_OUTPUT], [0]),
        ([{"role": "user", "content": "hi"}, REASONING], [1]),  # reasoning left last
        ([_call("a"), _call("b"), _output("b")], [0]),
        # Calls the provider runs need nothing after them.
        ([{"type": "web_search_call", "id": "w", "status": "completed", "action": {}}], []),
    ],
)
def test_transcript_problems_finds_what_a_provider_refuses(
    transcript: list[dict[str, Any]], problem_at: list[int]
) -> None:
    problems = transcript_problems(transcript)
    assert [problem.index for problem in problems] == problem_at
    assert is_sendable(transcript) == (not problem_at)


def test_the_sdk_corpus_is_sendable_where_its_calls_are_answered() -> None:
    # Every client-run call in the corpus is followed by its output (a local shell
    # output names its call by "id"); the reasoning item is followed by a message.
    corpus = [item for name, item in RESPONSES_ITEMS if name != "FunctionCallOutput:parts"]
    assert transcript_problems(corpus) == []
    lone = next(item for name, item in RESPONSES_ITEMS if name == "FunctionCallOutput:parts")
    assert [p.index for p in transcript_problems([*corpus, lone])] == [len(corpus)]
