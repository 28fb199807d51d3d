"""Retention policies: stored per source, applied (dry run first) through the erase path,
on both backends and both APIs; activity backdated by the tests."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import update

from sessionrepo import InvalidArgument, Message, NotFound, SessionRepository, open_repository
from sessionrepo.models.message import utcnow
from sessionrepo.models.privacy import RetentionPolicy
from sessionrepo.models.tables import sessions_table

pytestmark = pytest.mark.contract

S = sessions_table.c
DAY = timedelta(days=1)


@pytest.fixture
def setup(database_url: str) -> Iterator[SessionRepository]:
    repository = open_repository(database_url)
    yield repository
    repository.close()


def _backdate(
    setup: SessionRepository, sid: str, *, active: datetime, ended: datetime | None = None
) -> None:
    values: dict[str, Any] = {"last_active_at": active, "started_at": active}
    if ended is not None:
        values["ended_at"] = ended
        values["end_reason"] = "done"
    with setup.database.engine.begin() as conn:
        conn.execute(update(sessions_table).where(S.id == sid).values(**values))


def _say(setup: SessionRepository, sid: str, source: str, **fields: Any) -> None:
    setup.append(sid, [Message(role="user", content=f"in {sid}", **fields)], source=source)


def test_policies_are_stored_per_source_and_replaced(repo: Any) -> None:
    assert repo.retention_policies() == []
    repo.set_retention_policy(RetentionPolicy(source="discord", ended_days=30))
    repo.set_retention_policy(RetentionPolicy(source="*", idle_days=90))
    repo.set_retention_policy(RetentionPolicy(source="discord", ended_days=7, idle_days=60))
    assert repo.retention_policies() == [
        RetentionPolicy(source="*", idle_days=90),
        RetentionPolicy(source="discord", ended_days=7, idle_days=60),
    ]
    assert repo.delete_retention_policy("discord") is True
    assert repo.delete_retention_policy("discord") is False
    with pytest.raises(InvalidArgument):
        repo.delete_retention_policy("")
    with pytest.raises(ValueError, match="greater than or equal"):
        RetentionPolicy(source="x", ended_days=0)


def test_retention_erases_exactly_what_the_policy_says(repo: Any, setup: SessionRepository) -> None:
    now = utcnow()
    # discord: ended sessions after 30 days, open ones idle for 90; others: ended after 365.
    repo.set_retention_policy(RetentionPolicy(source="discord", ended_days=30, idle_days=90))
    repo.set_retention_policy(RetentionPolicy(source="*", ended_days=365))
    for sid, source in [
        ("d-ended-old", "discord"),
        ("d-ended-recent", "discord"),
        ("d-open-idle", "discord"),
        ("d-open-recent", "discord"),
        ("d-ended-old-but-active", "discord"),
        ("t-ended-40d", "telegram"),
        ("t-ended-400d", "telegram"),
        ("t-open-idle", "telegram"),
    ]:
        _say(setup, sid, source)
    _backdate(setup, "d-ended-old", active=now - 40 * DAY, ended=now - 40 * DAY)
    _backdate(setup, "d-ended-recent", active=now - 10 * DAY, ended=now - 10 * DAY)
    _backdate(setup, "d-open-idle", active=now - 100 * DAY)
    _backdate(setup, "d-open-recent", active=now - 80 * DAY)
    _backdate(setup, "d-ended-old-but-active", active=now - 5 * DAY, ended=now - 40 * DAY)
    _backdate(setup, "t-ended-40d", active=now - 40 * DAY, ended=now - 40 * DAY)
    _backdate(setup, "t-ended-400d", active=now - 400 * DAY, ended=now - 400 * DAY)
    _backdate(setup, "t-open-idle", active=now - 1000 * DAY)
    due = ["d-ended-old", "d-open-idle", "t-ended-400d"]

    dry = repo.apply_retention(dry_run=True, now=now)
    assert dry.session_ids == due
    assert dry.counts.live_messages == 3
    assert len(setup.list_sessions(limit=100).sessions) == 8  # nothing erased
    assert setup.privacy_audit() == []

    seen: list[str] = []
    report = repo.apply_retention(now=now, actor="cron", on_session=seen.append)
    assert report.session_ids == due
    assert seen == due
    left = sorted(s.id for s in setup.list_sessions(limit=100).sessions)
    assert left == sorted(
        {"d-ended-recent", "d-open-recent", "d-ended-old-but-active", "t-ended-40d", "t-open-idle"}
    )
    (entry,) = setup.privacy_audit()
    assert (entry.action, entry.actor, entry.selector_kind) == ("retention", "cron", "policy")
    assert entry.counts["sessions"] == 3
    # Through the tombstones: a re-flush of an erased session stores nothing.
    for sid in due:
        with pytest.raises(NotFound):
            setup.get_session(sid)
    old = Message(role="user", content="made long ago", timestamp=now - 500 * DAY)
    assert repo.append("t-ended-400d", [old]).erased == [old.client_msg_uuid]


def test_retention_erases_old_superseded_history_and_keeps_the_session(
    repo: Any, setup: SessionRepository
) -> None:
    now = utcnow()
    old, recent = now - 20 * DAY, now - 2 * DAY
    sent = [
        Message(role="user", content="old retracted", timestamp=old),
        Message(role="user", content="recent retracted", timestamp=recent),
        Message(role="user", content="old but live", timestamp=old),
    ]
    setup.append("s", sent, source="slack")
    setup.retract("s", [sent[0].client_msg_uuid, sent[1].client_msg_uuid])
    repo.set_retention_policy(RetentionPolicy(source="slack", superseded_days=10))
    assert repo.apply_retention(dry_run=True, now=now).superseded_messages == 1
    report = repo.apply_retention(now=now)
    assert report.session_ids == []
    assert report.superseded_messages == 1
    kept = [m.content for m in setup.load_transcript("s", include_retracted=True)]
    assert kept == ["recent retracted", "old but live"]
    assert repo.append("s", [sent[0]]).erased == [sent[0].client_msg_uuid]


def test_after_old_history_is_erased_the_live_session_takes_what_was_made_before(
    repo: Any, setup: SessionRepository
) -> None:
    """Retention erased only the session's old retracted messages: its tombstone screens
    their keys, but a message made before the sweep and not stored yet (parked in an
    outbox meanwhile) is stored, and a re-flush of the live ones is a duplicate, not an
    erasure."""
    now = utcnow()
    old = Message(role="user", content="old retracted", timestamp=now - 20 * DAY)
    live = Message(role="user", content="live", timestamp=now - 20 * DAY)
    parked = Message(role="user", content="parked meanwhile", timestamp=now - DAY)
    setup.append("s", [old, live], source="slack")
    setup.retract("s", [old.client_msg_uuid])
    repo.set_retention_policy(RetentionPolicy(source="slack", superseded_days=10))
    assert repo.apply_retention(now=now).superseded_messages == 1

    result = repo.append("s", [old, live, parked])

    assert result.erased == [old.client_msg_uuid]
    assert result.duplicates == [live.client_msg_uuid]
    assert result.inserted == [parked.client_msg_uuid]
