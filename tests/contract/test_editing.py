"""Rewind, retract, pop, clear, compact and fork: messages leave the live transcript, its
counters, the preview and search, and stay stored; keys stay taken; seq stays gap-free.
Both backends, both APIs."""

from __future__ import annotations

import io
from typing import Any
from uuid import uuid4

import pytest

from sessionrepo import (
    ConflictError,
    InvalidArgument,
    Message,
    NotFound,
    SessionRepository,
    is_sendable,
    open_repository,
)
from sessionrepo.ops import export_sessions, import_sessions

pytestmark = pytest.mark.contract


def _texts(repo: SessionRepository, sid: str = "s", **options: Any) -> list[str]:
    return [m.content for m in repo.load_transcript(sid, **options)]


def _seed(repo: SessionRepository, count: int, sid: str = "s") -> list[Message]:
    messages = [
        Message(role="user" if i % 2 else "assistant", content=f"word{i} turn {i}")
        for i in range(1, count + 1)
    ]
    repo.append(sid, messages, source="discord")
    return messages


def _seqs_stored(repo: SessionRepository, sid: str = "s") -> list[int]:
    return [m.seq for m in repo.load_transcript(sid, include_retracted=True)]


def test_rewind_takes_the_tail_out_of_the_live_transcript_and_keeps_it(
    repo: SessionRepository,
) -> None:
    messages = _seed(repo, 5)
    result = repo.rewind("s", 3)

    assert result.superseded == [messages[3].client_msg_uuid, messages[4].client_msg_uuid]
    assert result.message_count == 3
    assert _texts(repo) == ["word1 turn 1", "word2 turn 2", "word3 turn 3"]
    assert repo.get_session("s").message_count == 3
    history = repo.load_transcript("s", include_retracted=True)
    assert [(m.seq, m.superseded) for m in history] == [
        (1, None),
        (2, None),
        (3, None),
        (4, "retracted"),
        (5, "retracted"),
    ]
    assert repo.search("word5") == []
    assert [hit.seq for hit in repo.search("word3")] == [3]
    assert repo.rewind("s", 3).superseded == []  # sent again: nothing changes


def test_a_reflush_of_a_rewound_message_is_a_no_op_and_does_not_bring_it_back(
    repo: SessionRepository,
) -> None:
    messages = _seed(repo, 4)
    repo.rewind("s", 2)
    again = repo.append("s", messages)
    assert again.inserted == []
    assert len(again.duplicates) == 4
    assert len(repo.load_transcript("s")) == 2
    # New messages continue the stored seq: gap-free over what is stored.
    fresh = repo.append("s", [Message(role="user", content="after the rewind")])
    assert fresh.first_seq == 5
    assert _seqs_stored(repo) == [1, 2, 3, 4, 5]
    assert _texts(repo)[-1] == "after the rewind"
    assert repo.get_session("s").message_count == 3


def test_retract_takes_out_exactly_the_given_keys(repo: SessionRepository) -> None:
    messages = _seed(repo, 4)
    result = repo.retract("s", [messages[1].client_msg_uuid, str(messages[2].client_msg_uuid)])
    assert result.superseded == [messages[1].client_msg_uuid, messages[2].client_msg_uuid]
    assert _texts(repo) == ["word1 turn 1", "word4 turn 4"]
    assert repo.retract("s", [messages[1].client_msg_uuid]).superseded == []


def test_retracting_a_key_the_session_lacks_retracts_nothing(repo: SessionRepository) -> None:
    messages = _seed(repo, 2)
    with pytest.raises(NotFound):
        repo.retract("s", [messages[0].client_msg_uuid, uuid4()])
    assert len(repo.load_transcript("s")) == 2
    with pytest.raises(InvalidArgument):
        repo.retract("s", [])
    with pytest.raises(InvalidArgument):
        repo.retract("s", ["not-a-uuid"])


def test_counters_count_the_live_transcript(repo: SessionRepository) -> None:
    call = Message(
        role="assistant",
        tool_calls=[
            {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}},
            {"id": "b", "type": "function", "function": {"name": "g", "arguments": "{}"}},
        ],
    )
    outputs = [
        Message(role="tool", tool_call_id="a", content="1"),
        Message(role="tool", tool_call_id="b", content="2"),
    ]
    repo.append("s", [Message(role="user", content="go"), call, *outputs])
    assert repo.get_session("s").tool_call_count == 2
    repo.rewind("s", 1)
    session = repo.get_session("s")
    assert (session.message_count, session.tool_call_count) == (1, 0)


def test_pop_last_takes_a_tool_call_with_all_its_outputs(repo: SessionRepository) -> None:
    transcript: list[dict[str, Any]] = [
        {"role": "user", "content": "weather in Kyoto and Oslo?"},
        {"type": "reasoning", "id": "rs", "summary": [{"type": "summary_text", "text": "t"}]},
        {"type": "function_call", "call_id": "k", "name": "weather", "arguments": "{}"},
        {"type": "function_call", "call_id": "o", "name": "weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "k", "output": "21C"},
        {"type": "function_call_output", "call_id": "o", "output": "3C"},
    ]
    repo.append("s", transcript)
    popped = repo.pop_last("s")
    assert len(popped.superseded) == 5  # the outputs, both calls and the reasoning before
    assert [m.to_openai(include_key=True) for m in repo.load_transcript("s")] == transcript[:1]
    assert is_sendable([m.to_openai() for m in repo.load_transcript("s")])


def test_pop_last_of_a_chat_turn_and_of_an_empty_transcript(repo: SessionRepository) -> None:
    repo.append(
        "s",
        [
            {"role": "user", "content": "hi"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "t", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                ],
            },
            {"role": "tool", "tool_call_id": "t", "content": "done"},
            {"role": "assistant", "content": "all done"},
        ],
    )
    assert len(repo.pop_last("s").superseded) == 1  # the answer alone: what is left is valid
    assert len(repo.pop_last("s").superseded) == 2  # the output takes its call
    assert _texts(repo) == ["hi"]
    assert len(repo.pop_last("s").superseded) == 1
    assert repo.pop_last("s").superseded == []
    with pytest.raises(NotFound):
        repo.pop_last("nobody")


def test_clear_session_empties_the_live_transcript_and_keeps_history(
    repo: SessionRepository,
) -> None:
    _seed(repo, 3)
    assert repo.clear_session("s").message_count == 0
    assert repo.load_transcript("s") == []
    assert len(repo.load_transcript("s", include_retracted=True)) == 3
    [summary] = repo.list_sessions().sessions
    assert summary.preview is None
    assert summary.message_count == 0
    assert repo.search("word1") == []
    with pytest.raises(NotFound):
        repo.clear_session("nobody")


def test_compact_puts_the_summary_in_place_of_the_prefix(repo: SessionRepository) -> None:
    messages = _seed(repo, 6)
    summary = Message(role="system", content="summary: turns one to four")
    result = repo.compact("s", 4, summary)

    assert result.superseded == [m.client_msg_uuid for m in messages[:4]]
    assert result.inserted == [summary.client_msg_uuid]
    live = repo.load_transcript("s")
    assert [(m.seq, m.content) for m in live] == [
        (5, "summary: turns one to four"),
        (6, "word5 turn 5"),
        (7, "word6 turn 6"),
    ]
    history = repo.load_transcript("s", include_retracted=True)
    assert [m.seq for m in history] == list(range(1, 8))
    assert [m.superseded for m in history] == ["compacted"] * 4 + [None] * 3
    assert repo.get_session("s").message_count == 3
    assert [hit.seq for hit in repo.search("word6")] == [7]
    assert [hit.seq for hit in repo.search("summary")] == [5]
    assert repo.search("word2") == []
    # Sent again: a no-op; the same key as another summary: a conflict.
    assert repo.compact("s", 4, summary).inserted == []
    with pytest.raises(ConflictError):
        repo.compact("s", 4, summary.model_copy(update={"content": "other"}))
    assert repo.append("s", [Message(role="user", content="next")]).first_seq == 8


def test_compact_refuses_a_point_past_the_end(repo: SessionRepository) -> None:
    _seed(repo, 2)
    with pytest.raises(InvalidArgument):
        repo.compact("s", 3, Message(role="system", content="x"))
    with pytest.raises(InvalidArgument):
        repo.compact("s", 0, Message(role="system", content="x"))
    assert len(repo.load_transcript("s")) == 2


def test_fork_copies_the_prefix_and_goes_its_own_way(repo: SessionRepository) -> None:
    messages = _seed(repo, 6)
    repo.retract("s", [messages[1].client_msg_uuid])
    fork = repo.fork_session("s", 4, "f", title="what if")

    assert (fork.forked_from_session_id, fork.forked_from_seq) == ("s", 4)
    assert (fork.source, fork.title, fork.message_count) == ("discord", "what if", 3)
    assert _texts(repo, "f") == ["word1 turn 1", "word3 turn 3", "word4 turn 4"]
    assert [m.superseded for m in repo.load_transcript("f", include_retracted=True)] == [
        None,
        "retracted",
        None,
        None,
    ]
    added = repo.append("f", [Message(role="user", content="only in the fork")])
    assert added.first_seq == 5
    assert len(repo.load_transcript("s")) == 5
    assert [hit.session_id for hit in repo.search("fork")] == ["f"]
    assert sorted(hit.session_id for hit in repo.search("word3")) == ["f", "s"]
    # The same fork again is a no-op; another point or source is a conflict.
    assert repo.fork_session("s", 4, "f").id == "f"
    assert len(repo.load_transcript("f")) == 4
    with pytest.raises(ConflictError):
        repo.fork_session("s", 3, "f")
    with pytest.raises(ConflictError):
        repo.fork_session("f", 4, "s")
    with pytest.raises(InvalidArgument):
        repo.fork_session("s", 99, "g")
    with pytest.raises(NotFound):
        repo.fork_session("nobody", 0, "g")


def test_export_and_import_keep_what_edits_did(database_url: str, tmp_path: Any) -> None:
    source = open_repository(database_url, auto_migrate=True)
    try:
        messages = _seed(source, 6)
        source.retract("s", [messages[0].client_msg_uuid])
        source.compact("s", 3, Message(role="system", content="summary"))
        source.fork_session("s", 2, "f")
        expected = {sid: source.load_transcript(sid, include_retracted=True) for sid in ("s", "f")}
        sessions = {sid: source.get_session(sid) for sid in ("s", "f")}
        buffer = io.BytesIO()
        export_sessions(source, buffer)
    finally:
        source.close()
    target = open_repository(f"sqlite:///{tmp_path}/copy.db", auto_migrate=True)
    try:
        import_sessions(target, io.BytesIO(buffer.getvalue()))
        for sid in ("s", "f"):
            assert target.load_transcript(sid, include_retracted=True) == expected[sid]
            assert target.get_session(sid).message_count == sessions[sid].message_count
        assert target.get_session("f").forked_from_session_id == "s"
        assert target.search("word5")[0].session_id == "s"
        assert [h.session_id for h in target.search("word1")] == []
    finally:
        target.close()


def test_edits_refuse_bad_arguments_before_anything_is_written(repo: SessionRepository) -> None:
    _seed(repo, 2)
    for call in (
        lambda: repo.rewind("s", -1),
        lambda: repo.rewind("s", "1"),
        lambda: repo.fork_session("s", 1, "s"),
        lambda: repo.fork_session("s", 1, "g", message_count=5),
    ):
        with pytest.raises((InvalidArgument, TypeError)):
            call()
    assert len(repo.load_transcript("s")) == 2
    with pytest.raises(NotFound):
        repo.get_session("g")
