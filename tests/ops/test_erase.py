"""``SessionRepository.erase`` on both backends and both APIs: what it reaches, its dry
run, the tombstones that keep a re-flush, a restore and an import of an older export from
bringing anything back, and its audit. (Processes and the bytes of SQLite files:
``test_erase_processes.py``.)"""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any
from uuid import UUID

import pytest
from sqlalchemy import func, insert, select

from sessionrepo import InvalidArgument, Message, NotFound, SessionRepository, open_repository
from sessionrepo.models.adk import adk_app_states_table, adk_sessions_table, adk_user_states_table
from sessionrepo.models.privacy import erased_messages_table, erased_sessions_table
from sessionrepo.models.tables import messages_table, outbox_table, search_backlog_table
from sessionrepo.ops import export_sessions, import_sessions
from sessionrepo.ops.erase import verify_erased
from sessionrepo.outbox.table import Outbox

pytestmark = pytest.mark.contract

SECRETS = ("alpacazebra", "quinoaparrot", "retractedmango", "compactedkiwi", "forkedlychee")


@pytest.fixture
def setup(database_url: str) -> Iterator[SessionRepository]:
    """A sync repository on the test's database, to build and inspect what ``repo``
    (sync or async) erases."""
    repository = open_repository(database_url)
    yield repository
    repository.close()


def _user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def _alice(setup: SessionRepository) -> dict[str, list[dict[str, Any]]]:
    """Alice's sessions: a transcript with a retraction and a compaction, a fork of it,
    ADK state, a parked outbox row, all indexed; Bob's session beside them."""
    a1 = [
        _user("hello alpacazebra"),
        {"role": "assistant", "content": "hi quinoaparrot"},
        _user("retractedmango oops"),
        _user("compactedkiwi later"),
    ]
    setup.append("a1", a1, user_id="alice", source="discord", title="alpacazebra title")
    setup.retract("a1", [_key(a1[2])])
    setup.compact("a1", 1, {"role": "system", "content": "summary of alpacazebra"})
    setup.fork_session("a1", 2, "a1-fork", user_id="someone-else")
    fork_tail = [_user("forkedlychee in the fork")]
    setup.append("a1-fork", fork_tail)
    setup.append("b1", [_user("bob keeps alpaca words")], user_id="bob", source="discord")
    with setup.database.engine.begin() as conn:
        conn.execute(
            insert(adk_sessions_table).values(
                session_id="a1",
                app_name="app",
                user_id="alice",
                adk_session_id="x",
                state={"note": "adk quinoaparrot"},
                update_time=1.0,
                applied_seq=0,
            )
        )
        conn.execute(
            insert(adk_user_states_table).values(
                app_name="app", user_id="alice", state={"k": "alpacazebra"}, update_time=1.0
            )
        )
        conn.execute(
            insert(adk_user_states_table).values(
                app_name="app", user_id="bob", state={"k": "bob"}, update_time=1.0
            )
        )
        conn.execute(insert(adk_app_states_table).values(app_name="app", state={}, update_time=1.0))
    parked = Message(role="user", content="parked quinoaparrot")
    Outbox(setup.database).park("a1", [parked], setup.get_session("a1"), reason="test")
    setup.catch_up_search_index()
    assert setup.search("alpacazebra")
    return {"a1": a1, "fork": fork_tail, "parked": [parked.to_openai(include_key=True)]}


def _key(message: dict[str, Any]) -> UUID:
    return UUID(message["client_msg_uuid"])


def _count(setup: SessionRepository, table: Any, *where: Any) -> int:
    with setup.database.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(table).where(*where)).scalar_one())


def test_a_dry_run_counts_per_kind_and_changes_nothing(repo: Any, setup: SessionRepository) -> None:
    _alice(setup)
    before = setup.load_transcript("a1", include_retracted=True)
    report = repo.erase(user_id="alice", dry_run=True)
    assert report.dry_run
    assert report.audit_id is None
    assert report.session_ids == ["a1", "a1-fork"]
    counts = report.counts
    # a1: 4 sent + the summary (seq 2), 1 retracted, 1 compacted. The fork, at seq 2: its
    # copied prefix (the compacted message and the summary) and its own message.
    assert (counts.sessions, counts.derived_sessions) == (2, 1)
    assert (counts.retracted_messages, counts.compacted_messages) == (1, 1 + 1)
    assert counts.live_messages == 3 + 2
    assert (counts.adk_sessions, counts.adk_user_states, counts.outbox_rows) == (1, 1, 1)
    assert setup.load_transcript("a1", include_retracted=True) == before
    assert setup.privacy_audit() == []
    assert _count(setup, erased_sessions_table) == 0


def test_erase_removes_every_copy_and_leaves_only_tombstones(
    repo: Any, setup: SessionRepository
) -> None:
    _alice(setup)
    dry = repo.erase(user_id="alice", dry_run=True)
    report = repo.erase(user_id="alice", actor="ticket 1")
    assert report.counts == dry.counts
    assert report.session_ids == dry.session_ids
    for sid in ("a1", "a1-fork"):
        with pytest.raises(NotFound):
            setup.get_session(sid)
    assert [s.id for s in setup.list_sessions().sessions] == ["b1"]
    for secret in SECRETS:
        assert setup.search(secret) == []
    assert _count(setup, messages_table, messages_table.c.session_id.in_(["a1", "a1-fork"])) == 0
    assert _count(setup, search_backlog_table) == 0
    assert _count(setup, outbox_table) == 0
    assert _count(setup, adk_sessions_table) == 0
    # Bob's ADK user state and the app's state stay: not Alice's.
    assert _count(setup, adk_user_states_table) == 1
    assert _count(setup, adk_app_states_table) == 1
    assert setup.load_transcript("b1")[0].content == "bob keeps alpaca words"
    buffer = io.BytesIO()
    export_sessions(setup, buffer)
    assert all(secret.encode() not in buffer.getvalue() for secret in SECRETS)
    assert verify_erased(setup, list(SECRETS)).findings == []
    # The tombstones: two sessions and Alice's ADK user state, every key (the parked
    # one too), no content.
    assert _count(setup, erased_sessions_table) == 2 + 1
    assert _count(setup, erased_messages_table) == 5 + 3 + 1
    (entry,) = setup.privacy_audit()
    assert (entry.action, entry.actor, entry.selector_kind) == ("erase", "ticket 1", "user")
    assert entry.counts["sessions"] == 2
    assert entry.note is None
    assert "alice" not in entry.model_dump_json()


def test_a_reflush_after_erase_stores_only_new_keys(repo: Any, setup: SessionRepository) -> None:
    sent = _alice(setup)
    repo.erase(user_id="alice")
    fresh = _user("said after the erasure")
    result = repo.append("a1", [*sent["a1"], fresh])
    assert result.inserted == [_key(fresh)]
    assert result.erased == [_key(m) for m in sent["a1"]]
    assert [m.content for m in setup.load_transcript("a1", include_retracted=True)] == [
        "said after the erasure"
    ]
    # Sent again alone: nothing, and not even the session comes back for the fork.
    again = repo.append("a1-fork", sent["fork"])
    assert again.inserted == []
    assert again.erased == [_key(sent["fork"][0])]
    with pytest.raises(NotFound):
        setup.get_session("a1-fork")
    # A unit of work's append (the importers') is screened the same way.
    with setup.session_transaction("a1") as tx:
        inside = tx.append(sent["a1"][:1])
    assert inside.inserted == []
    assert inside.erased == [_key(sent["a1"][0])]


def test_an_import_of_an_older_export_brings_nothing_back(
    repo: Any, setup: SessionRepository
) -> None:
    _alice(setup)
    older = io.BytesIO()
    export_sessions(setup, older)
    repo.erase(user_id="alice")
    report = import_sessions(setup, io.BytesIO(older.getvalue()))
    assert report.messages_erased == 5 + 3
    assert report.messages_inserted == 0
    for sid in ("a1", "a1-fork"):
        with pytest.raises(NotFound):
            setup.get_session(sid)
    assert verify_erased(setup, ["retractedmango", "forkedlychee"]).findings == []


def test_erase_of_one_session_reaches_its_forks_not_its_siblings(
    repo: Any, setup: SessionRepository
) -> None:
    setup.append("p", [_user("one"), _user("two")], user_id="carol")
    setup.fork_session("p", 1, "p-fork")
    setup.fork_session("p-fork", 1, "p-fork-fork")
    setup.append("q", [_user("other")], user_id="carol")
    report = repo.erase(session_id="p")
    assert report.session_ids == ["p", "p-fork", "p-fork-fork"]
    assert report.counts.derived_sessions == 2
    assert [s.id for s in setup.list_sessions().sessions] == ["q"]
    assert repo.erase(session_id="p").session_ids == []  # again: nothing left


@pytest.mark.parametrize(
    "selector",
    [{}, {"user_id": "a", "source": "b"}, {"user_id": ""}, {"session_id": 7}],
)
def test_a_bad_selector_erases_nothing(
    repo: Any, setup: SessionRepository, selector: dict[str, Any]
) -> None:
    setup.append("s", [_user("kept")], user_id="a", source="b")
    with pytest.raises((InvalidArgument, TypeError)):
        repo.erase(**selector)
    assert setup.load_transcript("s")[0].content == "kept"
    assert setup.privacy_audit() == []
