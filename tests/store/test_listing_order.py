"""``list_sessions`` in one statement: the database ranks the candidates by the exact
activity (``last_active_at`` plus ``last_active_lag_us``), so pages follow it where the
indexed order does not, through the cursor, with every filter; on both backends."""

from __future__ import annotations

import random
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, event, update

from sessionrepo import SessionRepository
from sessionrepo.models.message import utcnow
from sessionrepo.models.tables import ACTIVITY_GRANULARITY, sessions_table
from sessionrepo.store.database import Database

S = sessions_table.c
GRANULARITY_US = ACTIVITY_GRANULARITY // timedelta(microseconds=1)
MICROSECOND = timedelta(microseconds=1)


def _set_activities(url: str, activities: dict[str, tuple[datetime, int]]) -> None:
    """Store each session's indexed time and lag as they are given (no append)."""

    def work(conn: Connection) -> None:
        for sid, (at, lag) in activities.items():
            conn.execute(
                update(sessions_table)
                .where(S.id == sid)
                .values(last_active_at=at, last_active_lag_us=lag)
            )

    database = Database(url)
    try:
        database.write(work)
    finally:
        database.dispose()


def _listed(
    repo: SessionRepository, limit: int, **filters: Any
) -> list[tuple[str, datetime | None]]:
    """Every page of ``limit``, through the cursor: (id, last_active_at) in order."""
    listed: list[tuple[str, datetime | None]] = []
    cursor = None
    while True:
        page = repo.list_sessions(limit=limit, cursor=cursor, **filters)
        listed += [(s.id, s.last_active_at) for s in page.sessions]
        assert len(page.sessions) <= limit
        if page.next_cursor is None:
            return listed
        assert len(page.sessions) == limit
        cursor = page.next_cursor


def test_pages_follow_the_exact_activity_where_the_index_order_differs(
    repo: SessionRepository, database_url: str
) -> None:
    rng = random.Random(20261203)
    base = utcnow().replace(microsecond=0) - 100 * ACTIVITY_GRANULARITY
    activities: dict[str, tuple[datetime, int]] = {}
    sources: dict[str, str] = {}
    ended: set[str] = set()
    for n in range(60):
        sid = f"s{n:02d}"
        sources[sid] = rng.choice(["a", "b"])
        repo.create_session(sid, source=sources[sid], user_id=f"u{n % 3}")
        if n % 4 == 0:
            repo.end_session(sid, "done")
            ended.add(sid)
        # Indexed times a quarter of a granularity apart, some a microsecond before a
        # whole second; lags from none to the whole granularity: the indexed order and
        # the activity's cross, and some activities tie (then the id decides).
        at = base + rng.randrange(12) * ACTIVITY_GRANULARITY / 4
        if rng.random() < 0.3:
            at -= MICROSECOND
        lag = rng.choice([0, 1, GRANULARITY_US, rng.randrange(GRANULARITY_US + 1)])
        activities[sid] = (at, lag)
    _set_activities(database_url, activities)

    def exact(sid: str) -> datetime:
        at, lag = activities[sid]
        return at + lag * MICROSECOND

    def expected(chosen: list[str]) -> list[tuple[str, datetime]]:
        order = sorted(chosen, key=lambda sid: (exact(sid), sid), reverse=True)
        return [(sid, exact(sid)) for sid in order]

    everything = list(activities)
    indexed_order = sorted(everything, key=lambda sid: (activities[sid][0], sid), reverse=True)
    assert [sid for sid, _ in expected(everything)] != indexed_order  # the test means something
    for limit in (1, 2, 5, 7, 60, 100):
        assert _listed(repo, limit) == expected(everything), limit
    for limit in (1, 3, 50):
        assert _listed(repo, limit, source="a") == expected(
            [sid for sid in everything if sources[sid] == "a"]
        )
        assert _listed(repo, limit, user_id="u1") == expected(
            [sid for sid in everything if int(sid[1:]) % 3 == 1]
        )
        assert _listed(repo, limit, status="ended") == expected(sorted(ended))
        assert _listed(repo, limit, status="open") == expected(
            [sid for sid in everything if sid not in ended]
        )


def test_a_lag_carries_the_activity_over_a_whole_second(
    repo: SessionRepository, database_url: str
) -> None:
    # Microsecond arithmetic across the second: x.999999 + 1 us is (x+1).000000, level
    # with a session indexed there with no lag (the id decides), ahead of one a
    # microsecond earlier.
    second = utcnow().replace(microsecond=0) - 10 * ACTIVITY_GRANULARITY
    for sid in ("p", "q", "r"):
        repo.create_session(sid, source="test")
    _set_activities(
        database_url,
        {
            "p": (second - MICROSECOND, 1),
            "q": (second, 0),
            "r": (second - 2 * MICROSECOND, 1),
        },
    )
    expected = [("q", second), ("p", second), ("r", second - MICROSECOND)]
    for limit in (1, 2, 3):
        assert _listed(repo, limit) == expected


def test_a_page_is_one_statement(repo: SessionRepository, database_url: str) -> None:
    for n in range(5):
        repo.create_session(f"s{n}", source="test")
    repo.list_sessions()  # the first call may read what the store is (its schema)
    statements: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if statement.split(None, 1)[0].upper() not in ("BEGIN", "COMMIT", "ROLLBACK"):
            statements.append(statement)

    engine = repo.database.engine
    event.listen(engine, "before_cursor_execute", record)
    try:
        first = repo.list_sessions(limit=2)
        assert len(statements) == 1
        assert first.next_cursor is not None
        repo.list_sessions(limit=2, cursor=first.next_cursor)
        assert len(statements) == 2
        repo.list_sessions(limit=2, source="test", status="open", user_id="nobody")
        assert len(statements) == 3
    finally:
        event.remove(engine, "before_cursor_execute", record)
