"""Session lifecycle: create, end (first reason wins), reopen, continuations, listing."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from sessionrepo import InvalidArgument, InvalidMessage, Message, NotFound, SessionRepository

pytestmark = pytest.mark.contract  # every repo test runs on the sync and async API


def test_create_session_is_idempotent_and_keeps_what_was_set(repo: SessionRepository) -> None:
    first = repo.create_session("s1", source="discord", user_id="u1", title="Mochi")
    again = repo.create_session("s1", source="telegram", user_id="u2", title="Other")

    assert first == again
    assert (again.source, again.user_id, again.title) == ("discord", "u1", "Mochi")


def test_a_session_first_created_by_append_gets_its_attributes_from_a_later_create(
    repo: SessionRepository,
) -> None:
    repo.append("s1", [Message(role="user", content="hi")])
    assert repo.get_session("s1").source == "unknown"

    session = repo.create_session(
        "s1", source="slack", user_id="u1", model="gpt-x", model_config={"temperature": 0.2}
    )

    assert (session.source, session.user_id, session.model) == ("slack", "u1", "gpt-x")
    assert session.model_settings == {"temperature": 0.2}
    assert session.message_count == 1


def test_append_creates_the_session_from_its_defaults(repo: SessionRepository) -> None:
    repo.append(
        "s1",
        [Message(role="user", content="hi")],
        source="cli",
        user_id="u7",
        metadata={"chat_id": 42},
    )
    session = repo.get_session("s1")
    assert (session.source, session.user_id, session.metadata) == ("cli", "u7", {"chat_id": 42})
    assert session.is_open


def test_session_defaults_are_validated_before_anything_is_written(
    repo: SessionRepository,
) -> None:
    with pytest.raises(InvalidMessage) as raised:
        repo.append("s1", [Message(role="user", content="hi")], no_such_field=1)
    assert raised.value.field.startswith("session_defaults")
    with pytest.raises(NotFound):
        repo.get_session("s1")


def test_get_session_of_an_unknown_id_raises_not_found(repo: SessionRepository) -> None:
    with pytest.raises(NotFound):
        repo.get_session("nope")
    with pytest.raises(NotFound):
        repo.load_transcript("nope")
    with pytest.raises(NotFound):
        repo.end_session("nope", "x")


def test_counters_move_only_for_inserted_messages(repo: SessionRepository) -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    batch = [
        Message(role="assistant", tool_calls=[call, {**call, "id": "c2"}]),
        Message(role="tool", tool_call_id="c1", content="ok"),
    ]
    repo.append("s1", batch)
    repo.append("s1", batch)
    session = repo.get_session("s1")
    assert (session.message_count, session.tool_call_count) == (2, 2)


def test_the_first_end_reason_wins(repo: SessionRepository) -> None:
    repo.create_session("s1")
    assert repo.end_session("s1", "compression") is True
    ended_at = repo.get_session("s1").ended_at

    assert repo.end_session("s1", "agent_close") is False

    session = repo.get_session("s1")
    assert session.end_reason == "compression"
    assert session.ended_at == ended_at


def test_reopen_is_the_explicit_way_back(repo: SessionRepository) -> None:
    repo.create_session("s1")
    assert repo.reopen_session("s1") is False  # it was open
    repo.end_session("s1", "idle")

    assert repo.reopen_session("s1") is True

    session = repo.get_session("s1")
    assert session.is_open
    assert session.end_reason is None
    assert repo.end_session("s1", "cli_close") is True
    assert repo.get_session("s1").end_reason == "cli_close"


def test_a_late_flush_after_the_end_is_stored_and_does_not_reopen(
    repo: SessionRepository,
) -> None:
    repo.create_session("s1")
    repo.end_session("s1", "shutdown")
    assert repo.append("s1", [Message(role="assistant", content="late")]).inserted
    assert repo.get_session("s1").end_reason == "shutdown"


def test_the_tip_of_a_continuation_chain_resolves_from_any_id(repo: SessionRepository) -> None:
    repo.create_session("a")
    repo.append("a", [Message(role="user", content="one")])
    repo.end_session("a", "compression")
    repo.create_session("b", parent_session_id="a")
    repo.append("b", [Message(role="user", content="two")])
    repo.end_session("b", "compression")
    repo.create_session("c", parent_session_id="b")
    repo.append("c", [Message(role="user", content="three")])

    assert [repo.resolve_tip(sid).id for sid in ("a", "b", "c")] == ["c", "c", "c"]
    assert [s.id for s in repo.session_chain("c")] == ["a", "b", "c"]
    with_ancestors = repo.load_transcript("c", include_ancestors=True)
    assert [(m.session_id, m.content) for m in with_ancestors] == [
        ("a", "one"),
        ("b", "two"),
        ("c", "three"),
    ]


def test_the_tip_follows_the_most_recently_active_branch(repo: SessionRepository) -> None:
    repo.create_session("root")
    repo.create_session("old-branch", parent_session_id="root")
    repo.create_session("new-branch", parent_session_id="root")
    repo.append("old-branch", [Message(role="user", content="x")])
    repo.append("new-branch", [Message(role="user", content="y")])
    assert repo.resolve_tip("root").id == "new-branch"


def test_transcript_pages_forward_and_backward(repo: SessionRepository) -> None:
    repo.append("s1", [Message(role="user", content=str(i)) for i in range(10)])

    page1 = repo.load_transcript("s1", limit=4)
    page2 = repo.load_transcript("s1", after_seq=page1[-1].seq, limit=4)
    page3 = repo.load_transcript("s1", after_seq=page2[-1].seq, limit=4)
    assert [m.content for m in page1 + page2 + page3] == [str(i) for i in range(10)]

    tail = repo.load_transcript("s1", before_seq=11, limit=3)
    before_tail = repo.load_transcript("s1", before_seq=tail[0].seq, limit=3)
    assert [m.content for m in before_tail + tail] == ["4", "5", "6", "7", "8", "9"]


def test_list_sessions_newest_activity_first_with_filters_and_preview(
    repo: SessionRepository,
) -> None:
    repo.create_session("d1", source="discord", user_id="u1")
    repo.create_session("t1", source="telegram", user_id="u2")
    repo.create_session("d2", source="discord", user_id="u2")
    repo.append(
        "d1", [Message(role="system", content="sys"), Message(role="user", content="Hi Mochi")]
    )
    repo.end_session("t1", "idle")

    everything = repo.list_sessions()
    assert [s.id for s in everything.sessions] == ["d1", "d2", "t1"]
    assert everything.sessions[0].preview == "Hi Mochi"
    assert everything.next_cursor is None
    assert [s.id for s in repo.list_sessions(source="discord").sessions] == ["d1", "d2"]
    assert [s.id for s in repo.list_sessions(user_id="u2").sessions] == ["d2", "t1"]
    assert [s.id for s in repo.list_sessions(status="ended").sessions] == ["t1"]
    assert [s.id for s in repo.list_sessions(status="open").sessions] == ["d1", "d2"]


def test_list_sessions_pages_with_a_cursor(repo: SessionRepository) -> None:
    base = datetime(2026, 1, 1, tzinfo=UTC).timestamp()
    for i in range(7):
        repo.create_session(f"s{i}", started_at=base + i)
    seen: list[str] = []
    cursor = None
    while True:
        page = repo.list_sessions(limit=3, cursor=cursor)
        seen += [s.id for s in page.sessions]
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert seen == [f"s{i}" for i in reversed(range(7))]


def test_a_garbled_cursor_is_invalid_input(repo: SessionRepository) -> None:
    # An argument error, not a message one: the cursor is no data to store.
    with pytest.raises(InvalidArgument) as raised:
        repo.list_sessions(cursor="not-a-cursor")
    assert type(raised.value) is InvalidArgument
    assert raised.value.field == "cursor"


def test_the_preview_of_content_parts_is_their_text(repo: SessionRepository) -> None:
    parts = [{"type": "text", "text": "What is in this picture?"}, {"type": "image_url"}]
    repo.append("s1", [Message(role="user", content=parts)])
    assert repo.list_sessions().sessions[0].preview == "What is in this picture?"
