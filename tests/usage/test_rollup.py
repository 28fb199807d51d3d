"""The usage rollup keeps the insights report equal to one computed from the rows.

On both backends, both APIs and both append paths: after appends (re-flushed, across
midnight, with and without usage), usage alone, edits (retract, rewind, pop, compact,
clear, fork), an erasure, a unit of work, an export imported again and a prune, the
rollup holds what the messages and usage records give (counted again from them), and
``insights`` over every grouping and over ranges whose ends fall inside a day, on a
midnight, or both within one day, equals a report computed here in Python from the
rows themselves. The migration's backfill builds the same rollup from rows stored
before it.
"""

from __future__ import annotations

import io
import math
import uuid
from collections import defaultdict
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import insert, select

from sessionrepo import Message, SessionRepository, open_repository
from sessionrepo.models.tables import messages_table, sessions_table
from sessionrepo.models.usage import ROLLUP_COLUMNS, TOKEN_KINDS, rollup_table, usage_table
from sessionrepo.ops.export import export_sessions
from sessionrepo.ops.insights import GROUPINGS, Insights, insights, prices, set_price
from sessionrepo.ops.prune import prune_sessions
from sessionrepo.ops.restore import import_sessions
from sessionrepo.store import rollup
from sessionrepo.store.database import Database
from sessionrepo.store.schema import downgrade, upgrade

pytestmark = pytest.mark.contract

M = messages_table.c
S = sessions_table.c
U = usage_table.c
R = rollup_table.c

NIGHT = datetime(2026, 11, 1, 23, 59, 50, tzinfo=UTC)  # ten seconds before midnight
MIDNIGHT = datetime(2026, 11, 2, tzinfo=UTC)
#: Ranges whose ends fall inside a day, on a midnight, both within one day, reversed.
RANGES: list[tuple[datetime | None, datetime | None]] = [
    (None, None),
    (MIDNIGHT, None),
    (None, MIDNIGHT),
    (NIGHT, MIDNIGHT + timedelta(hours=13)),
    (MIDNIGHT - timedelta(days=1), MIDNIGHT + timedelta(days=1)),
    (MIDNIGHT + timedelta(seconds=1), MIDNIGHT + timedelta(hours=12)),
    (MIDNIGHT + timedelta(seconds=3), None),
    (MIDNIGHT + timedelta(days=1), MIDNIGHT),
]


def _key(name: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"rollup/{name}"))


def _messages(name: str, start: datetime, count: int, step: timedelta) -> list[Message]:
    return [
        Message(
            role="user" if index % 2 == 0 else "assistant",
            content=f"{name} {index}",
            timestamp=start + index * step,
            client_msg_uuid=_key(f"{name}/{index}"),
        )
        for index in range(count)
    ]


def _usage(name: str, when: datetime, model: str | None, **fields: Any) -> dict[str, Any]:
    return {
        "usage_id": _key(f"usage/{name}"),
        "model": model,
        "input_tokens": 1000 + len(name) * 7,
        "output_tokens": 200 + len(name),
        "cache_read_tokens": 100,
        "reasoning_tokens": 10,
        "occurred_at": when,
        **fields,
    }


def _write_everything(repo: Any) -> None:
    """Appends and edits through the API under test (sync or async)."""
    # Across midnight, with usage, then re-flushed: nothing twice.
    night = _messages("a", NIGHT, 6, timedelta(seconds=4))
    calls = [
        _usage("a1", NIGHT + timedelta(seconds=2), "gpt-4.1", latency=1.5, reported_cost=0.25),
        _usage("a2", MIDNIGHT + timedelta(seconds=2), "gpt-4.1", latency=0.5),
        _usage("a3", MIDNIGHT + timedelta(seconds=6), None, latency=2.5, reported_cost=0.5),
    ]
    repo.append("a", night, usage=calls, source="discord", model="gpt-4.1", user_id="u1")
    repo.append("a", night, usage=calls)
    repo.record_usage("a", [_usage("a4", MIDNIGHT + timedelta(hours=12), "o3", latency=4.0)])
    repo.record_usage("a", [_usage("a4", MIDNIGHT + timedelta(hours=12), "o3", latency=4.0)])
    # Edits: retract, rewind, pop, compact (its summary on a later day), clear.
    day = _messages("b", MIDNIGHT + timedelta(hours=1), 8, timedelta(minutes=1))
    repo.append(
        "b",
        day,
        usage=_usage("b1", MIDNIGHT + timedelta(hours=1), "claude-sonnet-4", latency=0.75),
        source="slack",
        model="claude-sonnet-4",
    )
    repo.retract("b", [day[1].client_msg_uuid])
    repo.rewind("b", 6)
    repo.pop_last("b")
    repo.compact(
        "b",
        2,
        Message(
            role="assistant",
            content="summary",
            timestamp=MIDNIGHT + timedelta(days=1, hours=2),
            client_msg_uuid=_key("b/summary"),
        ),
    )
    repo.append("c", _messages("c", NIGHT - timedelta(hours=3), 4, timedelta(hours=1)))
    repo.fork_session("c", 3, "c-fork")
    repo.append("c-fork", _messages("c-fork", MIDNIGHT + timedelta(hours=5), 2, timedelta(0)))
    repo.append(
        "d",
        _messages("d", MIDNIGHT + timedelta(hours=2), 3, timedelta(minutes=5)),
        usage=_usage("d1", MIDNIGHT + timedelta(hours=2), "gpt-4.1", latency=9.0),
        source="slack",
        user_id="u2",
    )
    repo.clear_session("d")
    repo.append(
        "gone",
        _messages("gone", MIDNIGHT, 2, timedelta(0)),
        usage=_usage("gone1", MIDNIGHT, "gpt-4.1", latency=3.0),
    )
    repo.erase(session_id="gone")


def _price(repository: SessionRepository) -> None:
    for kind, per_million in (("input_tokens", 2.0), ("output_tokens", 8.0)):
        set_price(
            repository,
            {
                "model": "gpt-4.1",
                "token_kind": kind,
                "per_million": per_million,
                "valid_from": NIGHT.date(),
            },
        )


def _stored(repository: SessionRepository) -> tuple[list[Any], list[Any], list[Any]]:
    def read(conn: Any) -> tuple[list[Any], list[Any], list[Any]]:
        return (
            conn.execute(select(sessions_table)).all(),
            conn.execute(select(M.session_id, M.timestamp).where(M.superseded.is_(None))).all(),
            conn.execute(select(usage_table)).all(),
        )

    return repository.database.read(read)


def _reference(
    repository: SessionRepository, by: str, since: datetime | None, until: datetime | None
) -> dict[str, Any]:
    """The report as the rows give it, computed here (the nearest-rank percentiles, the
    cost of each day's and model's calls at that day's price)."""
    sessions, live, calls = _stored(repository)
    book = sorted(prices(repository), key=lambda price: price.valid_from, reverse=True)
    attribute = {"model": "model", "source": "source", "user": "user_id"}
    of = {row.id: row for row in sessions}

    def inside(moment: datetime) -> bool:
        return (since is None or moment >= since) and (until is None or moment < until)

    def day(moment: datetime) -> str:
        return moment.astimezone(UTC).date().isoformat()

    groups: dict[Any, dict[str, Any]] = defaultdict(lambda: defaultdict(int))
    per: dict[tuple[Any, str], int] = defaultdict(int)
    for sid, moment in live:
        if inside(moment):
            key = day(moment) if by == "day" else getattr(of[sid], attribute[by])
            per[(key, sid)] += 1
    for (key, _sid), count in per.items():
        groups[key]["messages"] += count
        groups[key]["sessions"] += 1
    latencies: dict[Any, list[float]] = defaultdict(list)
    spent: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])  # tokens, calls, unpriced
    costs: dict[Any, float] = defaultdict(float)
    for call in calls:
        if not inside(call.occurred_at):
            continue
        if by == "day":
            key = day(call.occurred_at)
        elif by == "model":
            key = call.model
        else:
            key = getattr(of[call.session_id], attribute[by])
        group = groups[key]
        group["calls"] += 1
        for kind in TOKEN_KINDS:
            group[kind] += getattr(call, kind)
        group["reported_cost"] += call.reported_cost or 0.0
        cost = _cost(book, call)
        spent[call.session_id][0] += call.input_tokens + call.output_tokens
        spent[call.session_id][1] += 1
        if cost is None:
            group["unpriced_calls"] += 1
            spent[call.session_id][2] += 1
        else:
            costs[key] += cost
            costs[("session", call.session_id)] += cost
        if call.latency is not None:
            latencies[key].append(call.latency)
            latencies["total"].append(call.latency)
    rows = []
    for key in sorted(groups, key=lambda k: (k is None, k or "")):
        group = groups[key]
        priced = group["calls"] - group["unpriced_calls"]
        row = {name: group[name] for name in _INTEGERS}
        row |= {
            "key": key,
            "reported_cost": group["reported_cost"] or 0.0,
            "cost": costs[key] if priced or not group["calls"] else None,
            **_ranks(latencies[key]),
        }
        rows.append(row)
    busiest = sorted(spent.items(), key=lambda item: (-item[1][0], item[0]))[:10]
    return {
        "rows": rows,
        "sessions": len({sid for _key, sid in per}),
        "total": _ranks(latencies["total"]),
        "busiest": [
            (
                sid,
                tokens,
                count,
                None if unpriced == count else costs[("session", sid)],
            )
            for sid, (tokens, count, unpriced) in busiest
        ],
    }


_INTEGERS = ("sessions", "messages", "calls", *TOKEN_KINDS, "unpriced_calls")


def _cost(book: list[Any], call: Any) -> float | None:
    """Input at the input price, output at the output price, each the one valid on the
    call's UTC day (the cached and reasoning parts at those too: no price of their own
    here); ``book`` newest ``valid_from`` first."""
    day = call.occurred_at.astimezone(UTC).date()

    def price(kind: str) -> float | None:
        return next(
            (
                p.per_million
                for p in book
                if (p.model, p.token_kind) == (call.model, kind) and p.valid_from <= day
            ),
            None,
        )

    inputs, outputs = price("input_tokens"), price("output_tokens")
    if inputs is None or outputs is None:
        return None
    return float(call.input_tokens * inputs + call.output_tokens * outputs) / 1_000_000


def _ranks(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"latency_p50": None, "latency_p95": None}
    ordered = sorted(values)
    return {
        "latency_p50": ordered[max(math.ceil(0.5 * len(ordered)) - 1, 0)],
        "latency_p95": ordered[max(math.ceil(0.95 * len(ordered)) - 1, 0)],
    }


def _close(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-12)


def _agrees(report: Insights, expected: dict[str, Any]) -> None:
    got = [row.model_dump() for row in report.rows]
    assert [row["key"] for row in got] == [row["key"] for row in expected["rows"]]
    for row, want in zip(got, expected["rows"], strict=True):
        assert {n: row[n] for n in _INTEGERS} == {n: want[n] for n in _INTEGERS}, row["key"]
        for name in ("reported_cost", "cost", "latency_p50", "latency_p95"):
            assert _close(row[name], want[name]), (row["key"], name, row[name], want[name])
    assert report.total.sessions == expected["sessions"]
    assert report.total.latency_p50 == expected["total"]["latency_p50"]
    assert report.total.latency_p95 == expected["total"]["latency_p95"]
    assert [(b.session_id, b.tokens, b.calls) for b in report.busiest] == [
        entry[:3] for entry in expected["busiest"]
    ]
    for entry, want in zip(report.busiest, expected["busiest"], strict=True):
        assert _close(entry.cost, want[3])


def _rollup_is_counted_again(repository: SessionRepository) -> None:
    """The rollup's rows (but those that count nothing any more) are what counting the
    rows again gives."""
    dialect = repository.database.dialect

    def read(conn: Any) -> tuple[set[tuple[Any, ...]], set[tuple[Any, ...]]]:
        kept = {tuple(row) for row in conn.execute(rollup.held()) if any(row[3:])}
        again = {tuple(row) for row in conn.execute(rollup.counted(dialect, session_ids=None))}
        return kept, again

    kept, again = repository.database.read(read)
    normal = {_normal(row) for row in kept}
    assert normal == {_normal(row) for row in again}
    assert normal  # something was counted


def _normal(row: tuple[Any, ...]) -> tuple[Any, ...]:
    """A rollup row with its sums as plain numbers (PostgreSQL sums to ``Decimal``)."""
    return (*row[:3], *(int(value) for value in row[3:-1]), round(float(row[-1]), 9))


def _report_agrees_everywhere(repository: SessionRepository) -> None:
    for by in GROUPINGS:
        for since, until in RANGES:
            report = insights(repository, by=by, since=since, until=until)
            _agrees(report, _reference(repository, by, since, until))


@pytest.fixture
def store(repo: Any, database_url: str) -> Iterator[SessionRepository]:
    """A sync repository on the same database as ``repo`` (the report's API)."""
    repository = open_repository(database_url)
    yield repository
    repository.close()


def test_the_report_from_the_rollup_equals_the_report_from_the_rows(
    repo: Any, store: SessionRepository
) -> None:
    _write_everything(repo)
    _price(store)
    _rollup_is_counted_again(store)
    _report_agrees_everywhere(store)


def test_the_open_day_is_counted_on_the_session_row_and_moves_to_the_rollup_later(
    repo: Any, store: SessionRepository
) -> None:
    """An append of the session's newest day writes no rollup row (the session row counts
    it); the first append of a later day moves that count into the rollup; messages of
    an older day go to the rollup at once; a batch across days keeps its newest open.
    After each step the rollup and the rows agree and so does every report."""
    day = [date(2026, 11, d).isoformat() for d in (1, 2, 3, 4)]

    def held() -> tuple[Any, dict[str, int]]:
        def read(conn: Any) -> tuple[Any, dict[str, int]]:
            row = conn.execute(select(S.rollup_day, S.rollup_messages).where(S.id == "open")).one()
            rolled = conn.execute(
                select(R.day, R.messages).where(R.session_id == "open", R.model == "")
            )
            return tuple(row), {d: int(n) for d, n in rolled}

        return store.database.read(read)

    first = datetime(2026, 11, 2, 9, tzinfo=UTC)
    for index, message in enumerate(_messages("open-a", first, 3, timedelta(minutes=5))):
        repo.append("open", [message], source="discord")
        assert held() == ((day[1], index + 1), {})  # no rollup row on the open day
    repo.append("open", _messages("open-b", first + timedelta(days=1), 2, timedelta(hours=1)))
    assert held() == ((day[2], 2), {day[1]: 3})  # the day before, moved once
    repo.append("open", _messages("open-c", first - timedelta(days=1), 1, timedelta(hours=1)))
    # An older day: to the rollup at once.
    assert held() == ((day[2], 2), {day[1]: 3, day[0]: 1})
    across = _messages("open-d", first + timedelta(days=1, hours=12), 3, timedelta(hours=6))
    repo.append("open", across)  # 21:00 on day 3, then 03:00 and 09:00 on day 4
    assert held() == ((day[3], 2), {day[1]: 3, day[0]: 1, day[2]: 3})
    _rollup_is_counted_again(store)
    _report_agrees_everywhere(store)
    repo.retract("open", [across[-1].client_msg_uuid])
    # An edit moves the open count to the rollup first, then takes the message out.
    assert held() == ((day[3], 0), {day[1]: 3, day[0]: 1, day[2]: 3, day[3]: 1})
    _rollup_is_counted_again(store)
    _report_agrees_everywhere(store)


def test_a_downgrade_moves_the_open_days_into_the_rollup(database_url: str) -> None:
    """Migration 0020's downgrade keeps every count: the sessions' open days go back to
    the rollup (which then alone equals the rows counted again), and an upgrade after
    it goes on from there."""
    repository = open_repository(database_url)
    try:
        first = datetime(2026, 11, 2, 9, tzinfo=UTC)
        repository.append("down-a", _messages("down-a", first, 3, timedelta(hours=1)))
        repository.append("down-b", _messages("down-b", first, 2, timedelta(hours=1)))
        repository.append("down-b", _messages("down-c", first, 1, timedelta(days=1)))
        repository.record_usage("down-a", [_usage("down-u", first, None)])
        database = repository.database
        downgrade(database, "0019")

        def read(conn: Any) -> tuple[set[Any], set[Any]]:
            stored = {
                _normal(tuple(row))
                for row in conn.execute(select(*(R[name] for name in ROLLUP_COLUMNS)))
            }
            again = {
                _normal(tuple(row))
                for row in conn.execute(rollup.counted(database.dialect, session_ids=None))
            }
            return stored, again

        stored, again = database.read(read)
        assert stored == again, (stored, again)
        assert stored_key(stored, "down-a") == ("down-a", "2026-11-02", "", 3, 1)
        upgrade(database, "head")
        repository.append("down-a", _messages("down-d", first, 1, timedelta(hours=1)))
        _rollup_is_counted_again(repository)
    finally:
        repository.close()


def stored_key(rows: set[Any], session_id: str) -> tuple[Any, ...]:
    """The session's message row of the rollup, its key and first two counts."""
    found = [row[:5] for row in rows if row[0] == session_id and row[2] == ""]
    assert len(found) == 1, rows
    return found[0]


def test_prices_that_change_within_a_range_price_each_day_at_its_own(
    repo: Any, store: SessionRepository
) -> None:
    """Calls of one group on both sides of a price change (inside a range, on its first
    day, before a model's first price) are each priced at their day's price."""
    _write_everything(repo)
    _price(store)
    later = MIDNIGHT + timedelta(days=1)
    repo.record_usage(
        "a",
        [
            _usage("p1", later + timedelta(hours=1), "gpt-4.1", latency=0.25),
            _usage("p2", later + timedelta(hours=2), "o3", latency=0.5),
            _usage("p3", NIGHT, "o3", latency=1.25),
        ],
    )
    for model, kind, per_million, valid in (
        ("gpt-4.1", "input_tokens", 1.0, MIDNIGHT.date()),
        ("gpt-4.1", "output_tokens", 4.0, MIDNIGHT.date()),
        ("gpt-4.1", "input_tokens", 0.5, later.date()),
        ("gpt-4.1", "output_tokens", 3.0, later.date()),
        ("o3", "input_tokens", 5.0, MIDNIGHT.date()),
        ("o3", "output_tokens", 20.0, MIDNIGHT.date()),
    ):
        set_price(
            store,
            {"model": model, "token_kind": kind, "per_million": per_million, "valid_from": valid},
        )
    _report_agrees_everywhere(store)
    for since, until in ((MIDNIGHT - timedelta(days=1), later + timedelta(days=1)), (later, None)):
        _report_agrees_everywhere_within(store, since, until)


def _report_agrees_everywhere_within(
    repository: SessionRepository, since: datetime | None, until: datetime | None
) -> None:
    for by in GROUPINGS:
        report = insights(repository, by=by, since=since, until=until)
        _agrees(report, _reference(repository, by, since, until))


def test_a_unit_of_work_an_import_and_a_prune_keep_it(
    database_url: str, store: SessionRepository
) -> None:
    _write_everything(store)
    _price(store)
    with store.session_transaction("t", source="cli", model="gpt-4.1") as tx:
        held = _messages("t", MIDNIGHT + timedelta(hours=3), 3, timedelta(minutes=1))
        tx.append(held)
        tx.record_usage(
            [
                _usage("t1", MIDNIGHT + timedelta(hours=3), "gpt-4.1", latency=1.0),
                _usage("t2", MIDNIGHT + timedelta(hours=4), "o3", latency=6.0),
            ]
        )
        tx.retract([held[0].client_msg_uuid])
    _rollup_is_counted_again(store)
    _report_agrees_everywhere(store)
    # Exported, erased, imported again: the same rows, the same rollup.
    exported = io.BytesIO()
    export_sessions(store, exported)
    before = insights(store, by="model")
    for sid in ("a", "b", "t"):
        store.erase(session_id=sid)

    def forget_tombstones(conn: Any) -> None:  # they would keep the sessions out
        conn.exec_driver_sql("DELETE FROM erased_messages")
        conn.exec_driver_sql("DELETE FROM erased_sessions")

    store.database.write(forget_tombstones)
    import_sessions(store, io.BytesIO(exported.getvalue()))
    _rollup_is_counted_again(store)
    assert insights(store, by="model") == before
    _report_agrees_everywhere(store)
    # Pruned: their rows go with them.
    store.append("old", _messages("old", NIGHT, 2, timedelta(0)), ended_at=NIGHT)
    prune_sessions(store, cutoff=datetime.now(UTC) + timedelta(days=1))
    assert not store.database.read(
        lambda conn: conn.execute(select(R.session_id).where(R.session_id == "old")).all()
    )
    _rollup_is_counted_again(store)
    _report_agrees_everywhere(store)


def test_the_migration_backfills_the_rollup_from_stored_rows(
    empty_database_url: str,
) -> None:
    database = Database(empty_database_url)
    try:
        upgrade(database, "0015")
        now = datetime(2026, 11, 1, 12, tzinfo=UTC)

        def fill(conn: Any) -> None:
            for sid in ("x", "y"):
                conn.execute(
                    insert(sessions_table).values(
                        id=sid,
                        source="cli",
                        started_at=now,
                        last_active_at=now,
                        next_seq=4,
                        message_count=3,
                    )
                )
                for seq in (1, 2, 3):
                    conn.execute(
                        insert(messages_table).values(
                            session_id=sid,
                            seq=seq,
                            client_msg_uuid=uuid.uuid4(),
                            role="user",
                            content="m",
                            timestamp=now + timedelta(hours=6 * seq),
                            content_hash=b"h" * 16,
                            superseded="retracted" if seq == 2 and sid == "y" else None,
                        )
                    )
                for index, model in enumerate(("gpt-4.1", None, "gpt-4.1")):
                    conn.execute(
                        insert(usage_table).values(
                            session_id=sid,
                            usage_id=uuid.uuid4(),
                            model=model,
                            input_tokens=10 * (index + 1),
                            output_tokens=1,
                            cache_read_tokens=0,
                            cache_write_tokens=0,
                            reasoning_tokens=0,
                            reported_cost=0.25 if index else None,
                            currency="USD",
                            occurred_at=now + timedelta(hours=8 * index),
                        )
                    )

        database.write(fill)
        upgrade(database, "head")

        def read(conn: Any) -> tuple[set[Any], set[Any]]:
            stored = {_normal(tuple(row)) for row in conn.execute(rollup.held())}
            again = {
                _normal(tuple(row))
                for row in conn.execute(rollup.counted(database.dialect, session_ids=None))
            }
            return stored, again

        stored, again = database.read(read)
        assert stored == again
        day1, day2 = date(2026, 11, 1).isoformat(), date(2026, 11, 2).isoformat()
        # x: messages at 18:00, then 00:00 and 06:00; calls at 12:00, 20:00 (no model)
        # and 04:00. y: the same, its 00:00 message retracted.
        assert ("x", day1, "", 1, 1, 20, 1, 0, 0, 0, 0.25) in stored
        assert ("x", day1, "gpt-4.1", 0, 1, 10, 1, 0, 0, 0, 0.0) in stored
        assert ("x", day2, "", 2, 0, 0, 0, 0, 0, 0, 0.0) in stored
        assert ("x", day2, "gpt-4.1", 0, 1, 30, 1, 0, 0, 0, 0.25) in stored
        assert ("y", day2, "", 1, 0, 0, 0, 0, 0, 0, 0.0) in stored
        assert len(stored) == 8
    finally:
        database.dispose()
