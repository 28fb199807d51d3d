"""Append: idempotent by key, atomic per batch, ordered by seq."""

from __future__ import annotations

import pytest

from sessionrepo import InvalidMessage, Message, NotFound, SessionRepository

pytestmark = pytest.mark.contract  # every repo test runs on the sync and async API


def _messages(n: int, prefix: str = "m") -> list[Message]:
    return [Message(role="user", content=f"{prefix}{i}") for i in range(n)]


def test_flushing_the_same_messages_three_times_stores_them_once(repo: SessionRepository) -> None:
    batch = _messages(3)
    first = repo.append("s1", batch)
    second = repo.append("s1", batch)
    third = repo.append("s1", batch)

    assert first.inserted == [m.client_msg_uuid for m in batch]
    assert second.inserted == third.inserted == []
    assert second.duplicates == [m.client_msg_uuid for m in batch]
    assert [m.content for m in repo.load_transcript("s1")] == ["m0", "m1", "m2"]
    assert repo.get_session("s1").message_count == 3


def test_a_resumed_transcript_plus_two_new_messages_inserts_exactly_two(
    repo: SessionRepository,
) -> None:
    dicts = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}]
    repo.append("s1", [Message.from_openai(d) for d in dicts])  # keys minted here...
    # ...and a gateway that stamped its dicts keeps them across a resume:
    resumed = [m.to_openai(include_key=True) for m in repo.load_transcript("s1")]
    resumed += [{"role": "user", "content": "again"}, {"role": "assistant", "content": "yes"}]

    result = repo.append("s1", resumed)

    assert len(result.inserted) == 2
    assert len(result.duplicates) == 2
    assert result.conflicts == []
    assert [m.content for m in repo.load_transcript("s1")] == ["hello", "hi", "again", "yes"]


def test_two_messages_with_equal_content_are_two_rows(repo: SessionRepository) -> None:
    result = repo.append(
        "s1", [Message(role="user", content="ok")] * 1 + [Message(role="user", content="ok")]
    )
    assert len(result.inserted) == 2
    assert [m.content for m in repo.load_transcript("s1")] == ["ok", "ok"]


def test_a_resent_key_with_different_content_is_a_conflict_and_changes_nothing(
    repo: SessionRepository,
) -> None:
    original = Message(role="user", content="original")
    repo.append("s1", [original])
    altered = original.model_copy(update={"content": "altered"})

    result = repo.append("s1", [altered])

    assert result.conflicts == [original.client_msg_uuid]
    assert result.inserted == result.duplicates == []
    [stored] = repo.load_transcript("s1")
    assert stored.content == "original"
    assert repo.get_session("s1").message_count == 1


def test_a_key_repeated_inside_one_batch_is_stored_once(repo: SessionRepository) -> None:
    message = Message(role="user", content="twice")
    result = repo.append("s1", [message, message])
    assert result.inserted == [message.client_msg_uuid]
    assert result.duplicates == [message.client_msg_uuid]
    assert len(repo.load_transcript("s1")) == 1


def test_the_same_key_in_two_sessions_is_two_messages(repo: SessionRepository) -> None:
    message = Message(role="user", content="shared")
    assert repo.append("a", [message]).inserted == [message.client_msg_uuid]
    assert repo.append("b", [message]).inserted == [message.client_msg_uuid]


def test_an_invalid_message_anywhere_in_a_batch_writes_nothing(repo: SessionRepository) -> None:
    batch: list[object] = [
        {"role": "user", "content": "fine"},
        {"role": "user", "content": "\ud800"},
    ]
    with pytest.raises(InvalidMessage) as raised:
        repo.append("s1", batch)  # type: ignore[arg-type]
    assert raised.value.field == "messages[1].content"
    with pytest.raises(NotFound):
        repo.get_session("s1")


def test_seq_follows_append_order_not_timestamps(repo: SessionRepository) -> None:
    late = Message(role="user", content="first appended", timestamp=2_000_000_000)
    early = Message(role="user", content="second appended", timestamp=1_000_000_000)
    repo.append("s1", [late])
    repo.append("s1", [early])
    transcript = repo.load_transcript("s1")
    assert [m.content for m in transcript] == ["first appended", "second appended"]
    assert [m.seq for m in transcript] == [1, 2]
