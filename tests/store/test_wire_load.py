"""``load_openai``: the live transcript as OpenAI wire dicts, decoded straight from the
stored columns, equal to ``to_openai()`` of what ``load_transcript`` returns (both APIs,
both backends)."""

from __future__ import annotations

from typing import Any

import pytest

from sessionrepo import Message, NotFound, SessionStore

pytestmark = pytest.mark.contract


def _transcript() -> list[Any]:
    return [
        {"role": "system", "content": "You are Mochi.", "x-provider": {"n": 1.5, "a": [1]}},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "look"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
            ],
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
            "reasoning": "think\x00ing",
        },
        {"content": "out", "tool_call_id": "c1", "role": "tool", "name": "f"},
        {"type": "reasoning", "id": "rs_1", "summary": []},  # a Responses item, no role
        Message(role="assistant", content="built directly", finish_reason="stop"),
    ]


def test_the_wire_dicts_are_what_to_openai_gives(repo: SessionStore) -> None:
    repo.append("s", _transcript())
    stored = repo.load_transcript("s")

    assert repo.load_openai("s") == [m.to_openai() for m in stored]
    keyed = repo.load_openai("s", include_key=True)
    assert keyed == [m.to_openai(include_key=True) for m in stored]
    assert [list(d) for d in repo.load_openai("s")] == [list(m.to_openai()) for m in stored]
    # The caller's to change: a fresh copy each time.
    first = repo.load_openai("s")
    first[0]["x-provider"]["a"].append(2)
    assert repo.load_openai("s")[0]["x-provider"] == {"n": 1.5, "a": [1]}
    # Sent again with their keys, they store nothing.
    assert repo.append("s", keyed).inserted == []


def test_pages_and_the_live_transcript_only(repo: SessionStore) -> None:
    repo.append("s", [{"role": "user", "content": str(i)} for i in range(6)])
    assert [d["content"] for d in repo.load_openai("s", after_seq=2, limit=2)] == ["2", "3"]
    repo.rewind("s", 4)
    assert [d["content"] for d in repo.load_openai("s")] == ["0", "1", "2", "3"]
    assert repo.load_openai("s", after_seq=4) == []


def test_pages_backward_as_load_transcript_does(repo: SessionStore) -> None:
    repo.append("s", [{"role": "user", "content": str(i)} for i in range(8)])
    repo.retract("s", [repo.load_transcript("s")[6].client_msg_uuid])  # "6" out
    end = 2**63 - 1
    for cursor in (
        {"before_seq": end, "limit": 3},
        {"before_seq": 5, "limit": 2},
        {"before_seq": 4},
    ):
        stored = repo.load_transcript("s", **cursor)
        assert repo.load_openai("s", **cursor) == [m.to_openai() for m in stored], cursor
    assert [d["content"] for d in repo.load_openai("s", before_seq=end, limit=3)] == ["4", "5", "7"]
    assert [d["content"] for d in repo.load_openai("s", after_seq=1, before_seq=5)] == [
        "1",
        "2",
        "3",
    ]
    assert repo.load_openai("s", before_seq=1) == []
    everything = repo.load_transcript("s", include_retracted=True)
    assert repo.load_openai("s", include_retracted=True) == [m.to_openai() for m in everything]
    newest = repo.load_transcript("s", before_seq=end, limit=3, include_retracted=True)
    assert repo.load_openai("s", before_seq=end, limit=3, include_retracted=True) == [
        m.to_openai() for m in newest
    ]


def test_an_unknown_session_is_not_found(repo: SessionStore) -> None:
    with pytest.raises(NotFound):
        repo.load_openai("nobody")
    repo.create_session("empty")
    assert repo.load_openai("empty") == []
