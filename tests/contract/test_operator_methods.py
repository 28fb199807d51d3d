"""The repository methods behind the operator tools (``sessionrepo.ops``) and the importers:
snapshots and counts, restore, prune, backdating. On both backends and both APIs.

The tools' own behaviour (the export format, restore / merge outcomes, prune batches) is
tested in ``test_maintenance.py``; here, what each method promises on its own.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from sessionrepo import (
    ArgumentTypeError,
    InvalidArgument,
    InvalidMessage,
    Message,
    NotFound,
    RepoError,
    Session,
    SessionRepository,
    StoredMessage,
)
from sessionrepo.models.message import utcnow
from sessionrepo.store.repository import SessionFilter, SessionSnapshot

pytestmark = pytest.mark.contract

LONG_AGO = datetime(2020, 1, 1, 12, 0, tzinfo=UTC)


def _stored(session_id: str, seq: int, content: str, **fields: object) -> StoredMessage:
    return StoredMessage(session_id=session_id, seq=seq, role="user", content=content, **fields)


def _exported(session_id: str, next_seq: int, **fields: object) -> SessionSnapshot:
    """A session as an export from another store describes it."""
    values: dict[str, object] = {
        "source": "discord",
        "title": "from elsewhere",
        "started_at": LONG_AGO,
        "last_active_at": LONG_AGO + timedelta(hours=1),
    }
    return SessionSnapshot(Session(id=session_id, **{**values, **fields}), next_seq)


def _aged(repo: SessionRepository, session_id: str, *, ended: bool = True) -> None:
    """An old session with one message, ended (or not) long ago."""
    end = {"ended_at": LONG_AGO + timedelta(hours=2), "end_reason": "done"} if ended else {}
    repo.restore_session(_exported(session_id, 2, **end), [_stored(session_id, 1, "old")])


# -- snapshots and counts -------------------------------------------------------------


def test_snapshots_page_by_id_with_their_next_seq(repo: SessionRepository) -> None:
    for sid in ("c", "a", "b"):
        repo.append(sid, [Message(role="user", content=sid)], source="cli")
    repo.append("b", [Message(role="user", content="more")])

    first = repo.session_snapshots(limit=2)
    rest = repo.session_snapshots(after_id=first[-1].session.id, limit=2)

    assert [(s.session.id, s.next_seq) for s in first + rest] == [("a", 2), ("b", 3), ("c", 2)]
    assert first[1].session == repo.get_session("b")
    assert repo.count_sessions() == 3
    assert repo.count_messages(["a", "b", "missing"]) == 3
    assert repo.count_messages([]) == 0


def test_filters_select_and_refuse_what_cannot_be_meant(repo: SessionRepository) -> None:
    repo.append("open", [Message(role="user", content="x")], source="cli", user_id="u1")
    _aged(repo, "old")

    def ids(selection: SessionFilter) -> list[str]:
        return [s.session.id for s in repo.session_snapshots(selection)]

    assert ids(SessionFilter(session_ids=("old", "missing"))) == ["old"]
    assert ids(SessionFilter(source="cli")) == ["open"]
    assert ids(SessionFilter(user_id="u1", status="open")) == ["open"]
    assert ids(SessionFilter(status="ended")) == ["old"]
    assert ids(SessionFilter(ended_before=utcnow())) == ["old"]
    assert ids(SessionFilter(active_before=LONG_AGO + timedelta(days=1))) == ["old"]
    assert repo.count_sessions(SessionFilter(active_before=LONG_AGO)) == 0
    with pytest.raises(InvalidArgument, match="ids or filters") as raised:
        repo.count_sessions(SessionFilter(session_ids=("old",), source="cli"))
    assert type(raised.value) is InvalidArgument
    with pytest.raises(InvalidArgument, match="timezone-aware"):
        repo.session_snapshots(SessionFilter(ended_before=datetime(2020, 1, 1)))
    with pytest.raises(ArgumentTypeError, match="ended_before"):
        repo.session_snapshots(SessionFilter(ended_before="2020-01-01"))  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="limit"):
        repo.session_snapshots(limit=0)


# -- restore --------------------------------------------------------------------------


def test_a_restored_session_is_as_exported_with_derived_counters(repo: SessionRepository) -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    snapshot = _exported("s", 4, message_count=99, tool_call_count=7, input_tokens=5)
    messages = [
        _stored("s", 1, "hi"),
        StoredMessage(session_id="s", seq=2, role="assistant", content=None, tool_calls=[call]),
        _stored("s", 3, "bye"),
    ]

    result = repo.restore_session(snapshot, messages)

    assert result.outcome == "created"
    assert result.inserted == [m.client_msg_uuid for m in messages]
    stored = repo.get_session("s")
    # Times and every described field as exported; the counters count what is stored.
    assert stored.model_dump(exclude={"message_count", "tool_call_count"}) == (
        snapshot.session.model_dump(exclude={"message_count", "tool_call_count"})
    )
    assert (stored.message_count, stored.tool_call_count, stored.input_tokens) == (3, 1, 5)
    assert [(m.seq, m.client_msg_uuid) for m in repo.load_transcript("s")] == [
        (m.seq, m.client_msg_uuid) for m in messages
    ]
    assert [h.seq for h in repo.search("bye")] == [3]


def test_restoring_again_or_in_parts_writes_each_message_once(repo: SessionRepository) -> None:
    snapshot = _exported("s", 5)
    messages = [_stored("s", seq, f"#{seq}") for seq in range(1, 5)]

    first = repo.restore_session(snapshot, messages[:2])
    second = repo.restore_session(snapshot, messages[1:])  # resumed, overlapping
    third = repo.restore_session(snapshot, messages)

    assert (first.outcome, second.outcome, third.outcome) == ("created", "present", "present")
    assert second.inserted == [m.client_msg_uuid for m in messages[2:]]
    assert second.duplicates == [messages[1].client_msg_uuid]
    assert (third.inserted, len(third.duplicates)) == ([], 4)
    assert [m.seq for m in repo.load_transcript("s")] == [1, 2, 3, 4]
    assert repo.get_session("s").last_active_at == snapshot.session.last_active_at


def test_a_gap_in_the_export_stays_a_gap(repo: SessionRepository) -> None:
    snapshot = _exported("s", 8)
    messages = [_stored("s", seq, f"#{seq}") for seq in (1, 2, 5, 7)]

    repo.restore_session(snapshot, messages)
    repo.append("s", [Message(role="user", content="after")])

    assert [m.seq for m in repo.load_transcript("s")] == [1, 2, 5, 7, 8]
    assert repo.get_session("s").message_count == 5


def test_a_session_the_store_changed_is_not_restored_into(repo: SessionRepository) -> None:
    snapshot = _exported("s", 3)
    repo.restore_session(snapshot, [_stored("s", 1, "#1")])
    repo.append("s", [Message(role="assistant", content="a gateway wrote since")])

    result = repo.restore_session(snapshot, [_stored("s", 2, "#2")])

    assert result.outcome == "diverged"
    assert (result.inserted, result.duplicates, result.conflicts) == ([], [], [])
    assert [m.content for m in repo.load_transcript("s")] == ["#1", "a gateway wrote since"]


def test_an_other_message_at_an_exported_seq_is_refused_and_nothing_written(
    repo: SessionRepository,
) -> None:
    snapshot = _exported("s", 3)
    held = _stored("s", 1, "held")
    repo.restore_session(snapshot, [held])

    with pytest.raises(RepoError, match=f"seq 1 holds message {held.client_msg_uuid}"):
        repo.restore_session(snapshot, [_stored("s", 1, "other"), _stored("s", 2, "#2")])

    assert [m.content for m in repo.load_transcript("s")] == ["held"]
    assert repo.get_session("s").message_count == 1


def test_a_key_stored_with_other_content_is_a_conflict(repo: SessionRepository) -> None:
    snapshot = _exported("s", 2)
    message = _stored("s", 1, "original")
    repo.restore_session(snapshot, [message])

    result = repo.restore_session(snapshot, [message.model_copy(update={"content": "edited"})])

    assert (result.outcome, result.conflicts) == ("present", [message.client_msg_uuid])
    assert [m.content for m in repo.load_transcript("s")] == ["original"]


@pytest.mark.parametrize(
    ("messages", "field"),
    [
        ([_stored("other", 1, "x")], "messages[0].session_id"),
        ([_stored("s", 2, "x"), _stored("s", 1, "y")], "messages[1].seq"),
        ([_stored("s", 3, "x")], "messages[0].seq"),  # at next_seq
    ],
)
def test_restore_refuses_messages_that_do_not_belong_there(
    repo: SessionRepository, messages: list[StoredMessage], field: str
) -> None:
    with pytest.raises(InvalidMessage) as caught:
        repo.restore_session(_exported("s", 3), messages)

    assert caught.value.field == field
    with pytest.raises(NotFound):
        repo.get_session("s")


# -- prune ----------------------------------------------------------------------------


def test_only_ended_sessions_older_than_the_cutoff_are_deleted(repo: SessionRepository) -> None:
    _aged(repo, "old")
    _aged(repo, "old-but-open", ended=False)
    repo.append("recent", [Message(role="user", content="x")])
    repo.end_session("recent", "done")

    result = repo.delete_ended_sessions(
        ["old", "old-but-open", "recent", "missing"], cutoff=utcnow() - timedelta(days=1)
    )

    assert [s.id for s in result.deleted] == ["old"]
    assert result.kept == ["missing", "old-but-open", "recent"]
    assert (result.messages, result.parked) == (1, {})
    with pytest.raises(NotFound):
        repo.get_session("old")
    assert repo.get_session("old-but-open").is_open
    with pytest.raises(InvalidArgument, match="timezone-aware"):
        repo.delete_ended_sessions(["recent"], cutoff=datetime(2030, 1, 1))
    with pytest.raises(ArgumentTypeError, match="cutoff"):
        repo.delete_ended_sessions(["recent"], cutoff=None)  # type: ignore[arg-type]


def test_a_session_changed_since_its_snapshot_is_kept(repo: SessionRepository) -> None:
    _aged(repo, "a")
    _aged(repo, "b")
    listed = {s.session.id: s for s in repo.session_snapshots()}
    repo.create_session("b", user_id="filled in since")  # still prunable, but not as listed

    result = repo.delete_ended_sessions(listed, cutoff=utcnow(), unchanged_from=listed)

    assert ([s.id for s in result.deleted], result.kept) == (["a"], ["b"])
    assert repo.get_session("b").user_id == "filled in since"


# -- backdating an import -------------------------------------------------------------


def test_backdate_replaces_the_imports_own_stamp_but_not_newer_activity(
    repo: SessionRepository,
) -> None:
    began = utcnow()
    repo.append("imported", [Message(role="user", content="x")])  # stamped now
    history = LONG_AGO + timedelta(days=3)

    assert repo.backdate_activity("imported", history, stamped_since=began)
    assert repo.get_session("imported").last_active_at == history
    # Older than the history: moved forward. Newer, and from before the import: kept.
    assert repo.backdate_activity("imported", history + timedelta(days=1), stamped_since=began)
    assert not repo.backdate_activity("imported", history, stamped_since=began)
    assert repo.get_session("imported").last_active_at == history + timedelta(days=1)
    with pytest.raises(NotFound):
        repo.backdate_activity("missing", history, stamped_since=began)
