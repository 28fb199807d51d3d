"""A message dict flushed without a key is stamped, so flushing it again stores nothing.

The trap this closes: a gateway that forgets ``ensure_key`` used to get a fresh key on
every flush of the same dict (two appends, two rows; three writes, three rows) without a
word. ``append`` and ``write`` now stamp the caller's dict in place the first time they
see it, as ``ensure_key`` would; a mapping that cannot be stamped is refused.
"""

from __future__ import annotations

import uuid
from types import MappingProxyType
from typing import Any

import pytest

from sessionrepo import (
    InvalidMessage,
    Message,
    NotFound,
    ensure_key,
)
from sessionrepo.models.message import KEY_FIELD

pytestmark = pytest.mark.contract


def _contents(repo: Any, session_id: str) -> list[Any]:
    return [m.content for m in repo.load_transcript(session_id, include_retracted=True)]


def test_the_same_dict_appended_twice_is_stored_once(repo: Any) -> None:
    message = {"role": "user", "content": "hello"}
    first = repo.append("s1", [message], source="discord")
    assert KEY_FIELD in message  # stamped in place, as ensure_key would
    key = uuid.UUID(message[KEY_FIELD])
    assert first.inserted == [key]
    again = repo.append("s1", [message])
    assert (again.inserted, again.duplicates) == ([], [key])
    [stored] = repo.load_transcript("s1")
    assert (stored.client_msg_uuid, stored.content) == (key, "hello")
    assert repo.get_session("s1").message_count == 1
    # What the provider gets back is the dict without the key.
    assert stored.to_openai() == {"role": "user", "content": "hello"}


def test_one_dict_twice_in_a_batch_and_a_key_of_none(repo: Any) -> None:
    twice = {"role": "user", "content": "hi"}
    result = repo.append("s1", [twice, twice])
    assert result.inserted == [uuid.UUID(twice[KEY_FIELD])]
    assert result.duplicates == result.inserted
    made = {"role": "user", "content": "a"}
    key = ensure_key(made)
    unset = {"role": "user", "content": "b", KEY_FIELD: None}
    repo.append("s1", [made, unset])
    repo.append("s1", [twice, made, unset])
    assert made[KEY_FIELD] == str(key)  # a stamped dict keeps its key
    assert [m.client_msg_uuid for m in repo.load_transcript("s1")] == [
        uuid.UUID(twice[KEY_FIELD]),
        key,
        uuid.UUID(unset[KEY_FIELD]),
    ]


def test_the_same_dicts_written_again_each_turn_are_stored_once(writer: Any, repo: Any) -> None:
    """The gateway pattern without ``ensure_key``: the transcript list grows, each turn
    the whole list is written again."""
    transcript: list[dict[str, Any]] = []
    for turn in range(3):
        transcript.append({"role": "user", "content": f"question {turn}"})
        transcript.append({"role": "assistant", "content": f"answer {turn}"})
        result = writer.write("s1", transcript, source="cli")
        assert result.status == "stored"
        assert len(result.inserted) == 2
        assert len(result.duplicates) == 2 * turn
    assert writer.write("s1", transcript).inserted == []
    assert _contents(repo, "s1") == [
        text for turn in range(3) for text in (f"question {turn}", f"answer {turn}")
    ]
    assert [str(m.client_msg_uuid) for m in repo.load_transcript("s1")] == [
        m[KEY_FIELD] for m in transcript
    ]


def test_a_resumed_transcript_flushed_with_new_messages_stores_no_doubles(
    repo: Any, writer: Any
) -> None:
    """Loaded back with its keys, continued with keyless dicts, flushed (twice) through
    both paths: each message once."""
    repo.append("s1", [{"role": "user", "content": "one"}, {"role": "assistant", "content": "two"}])
    resumed = [m.to_openai(include_key=True) for m in repo.load_transcript("s1")]
    resumed.append({"role": "user", "content": "three"})
    assert repo.append("s1", resumed).inserted == [uuid.UUID(resumed[-1][KEY_FIELD])]
    resumed.append({"role": "assistant", "content": "four"})
    assert len(writer.write("s1", resumed).inserted) == 1
    assert writer.write("s1", resumed).inserted == []
    assert repo.append("s1", resumed).inserted == []
    assert _contents(repo, "s1") == ["one", "two", "three", "four"]


def test_a_read_only_mapping_without_a_key_is_refused_before_anything_is_written(
    repo: Any, writer: Any
) -> None:
    frozen = MappingProxyType({"role": "user", "content": "cannot be stamped"})
    for call in (repo.append, writer.write):
        with pytest.raises(InvalidMessage) as refused:
            call("s1", [{"role": "user", "content": "fine"}, frozen])
        assert refused.value.field == f"messages[1].{KEY_FIELD}"
        assert "ensure_key" in str(refused.value)
    with pytest.raises(NotFound):
        repo.get_session("s1")
    keyed = MappingProxyType({"role": "user", "content": "keyed", KEY_FIELD: str(uuid.uuid4())})
    repo.append("s1", [keyed])
    repo.append("s1", [keyed])
    assert _contents(repo, "s1") == ["keyed"]


def test_identity_is_the_key_a_message_keeps_from_where_it_was_made(repo: Any, writer: Any) -> None:
    """A ``Message`` object gets its key when it is made, and keeps it. Two equal dicts
    made separately are two messages (two "ok"s are two rows): a gateway that *rebuilds*
    its dicts from scratch each turn must key them where they are made (``ensure_key``,
    or a key it derives), as the README says."""
    message = Message(role="user", content="made once")
    repo.append("s1", [message])
    writer.write("s1", [message])
    assert [m.client_msg_uuid for m in repo.load_transcript("s1")] == [message.client_msg_uuid]
    repo.append("s2", [{"role": "user", "content": "ok"}])
    writer.write("s2", [{"role": "user", "content": "ok"}])
    assert _contents(repo, "s2") == ["ok", "ok"]
