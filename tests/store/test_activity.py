"""A session's activity: an append rewrites the indexed ``last_active_at`` only when it is
more than ``ACTIVITY_GRANULARITY`` behind, else it records the lag (in no index); what a
caller reads (``get_session``, the listing's order and its cursor) is the exact activity,
on both backends and both append paths."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest
from sqlalchemy import select, update

from sessionrepo import SessionRepository, open_repository
from sessionrepo.models.message import utcnow
from sessionrepo.models.tables import ACTIVITY_GRANULARITY, sessions_table
from sessionrepo.store.database import Database
from tests.conftest import take_path

S = sessions_table.c


@pytest.fixture(params=["direct", "locked"])
def store(database_url: str, request: pytest.FixtureRequest) -> Iterator[SessionRepository]:
    repository = take_path(open_repository(database_url), request.param)
    yield repository
    repository.close()


def _stored(url: str, session_id: str) -> tuple[datetime, int]:
    database = Database(url)
    try:
        row = database.read(
            lambda conn: conn.execute(
                select(S.last_active_at, S.last_active_lag_us).where(S.id == session_id)
            ).one()
        )
    finally:
        database.dispose()
    return row[0], int(row[1])


def _set_activity(url: str, session_id: str, at: datetime, lag: int = 0) -> None:
    database = Database(url)
    try:
        database.write(
            lambda conn: conn.execute(
                update(sessions_table)
                .where(S.id == session_id)
                .values(last_active_at=at, last_active_lag_us=lag)
            )
        )
    finally:
        database.dispose()


def test_an_append_within_the_granularity_records_only_the_lag(
    store: SessionRepository, database_url: str
) -> None:
    store.append("s", [{"role": "user", "content": "one"}])
    indexed = utcnow()
    _set_activity(database_url, "s", indexed)
    store.append("s", [{"role": "user", "content": "two"}])
    after = utcnow()

    at, lag = _stored(database_url, "s")
    assert at == indexed  # the indexed column was not rewritten
    assert 0 < lag <= ACTIVITY_GRANULARITY // timedelta(microseconds=1)
    activity = store.get_session("s").last_active_at
    assert activity == indexed + timedelta(microseconds=lag)
    assert indexed < activity <= after


def test_an_append_past_the_granularity_moves_last_active_at(
    store: SessionRepository, database_url: str
) -> None:
    store.append("s", [{"role": "user", "content": "one"}])
    _set_activity(database_url, "s", utcnow() - 10 * ACTIVITY_GRANULARITY, lag=123)
    before = utcnow()
    store.append("s", [{"role": "user", "content": "two"}])

    at, lag = _stored(database_url, "s")
    assert at >= before
    assert lag == 0
    assert store.get_session("s").last_active_at == at


def test_the_listing_orders_by_exact_activity_within_the_granularity(
    store: SessionRepository, database_url: str
) -> None:
    # All within one granularity: the index holds the same time for all of them, and
    # only their lags tell the order of the appends.
    for sid in ("a", "b", "c", "d"):
        store.create_session(sid, source="test")
    start = utcnow()
    for sid in ("a", "b", "c", "d"):
        _set_activity(database_url, sid, start)
    for sid in ("c", "a", "d"):
        store.append(sid, [{"role": "user", "content": sid}])
    assert {_stored(database_url, sid)[0] for sid in "abcd"} == {start}

    assert [s.id for s in store.list_sessions().sessions] == ["d", "a", "c", "b"]
    paged: list[str] = []
    cursor = None
    while True:
        page = store.list_sessions(limit=1, cursor=cursor)
        paged += [s.id for s in page.sessions]
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert paged == ["d", "a", "c", "b"]
    assert [s.id for s in store.list_sessions(limit=2).sessions] == ["d", "a"]


def test_the_listing_ranks_lags_across_the_index_order(
    store: SessionRepository, database_url: str
) -> None:
    # "old" is indexed earlier than "new" but its lag puts its activity after it: the
    # listing reads a granularity past its page, so "old" comes first, on every page size.
    for sid in ("old", "new", "older"):
        store.create_session(sid, source="test")
    base = utcnow() - 100 * ACTIVITY_GRANULARITY
    lag = ACTIVITY_GRANULARITY // timedelta(microseconds=1)
    _set_activity(database_url, "older", base - 5 * ACTIVITY_GRANULARITY)
    _set_activity(database_url, "old", base, lag=lag)
    _set_activity(database_url, "new", base + ACTIVITY_GRANULARITY / 2)

    for limit in (1, 2, 3):
        listed: list[str] = []
        cursor = None
        while True:
            page = store.list_sessions(limit=limit, cursor=cursor)
            listed += [s.id for s in page.sessions]
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
        assert listed == ["old", "new", "older"], limit
    first = store.list_sessions(limit=1).sessions[0]
    assert first.last_active_at == base + ACTIVITY_GRANULARITY
