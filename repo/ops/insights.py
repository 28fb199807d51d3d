"""Insights: what the conversations cost, from the usage ledger and the transcripts.

:func:`insights` groups a time range by UTC day, model, source or user and counts, per
group: sessions and messages (live messages, by their ``timestamp``; the model, source
and user are the session's), model calls and their tokens (by the call's
``occurred_at``; the model is the call's own), the cost computed from the operator's
prices, the cost the providers reported, and the calls' latency p50/p95. Everything
is counted by the database (a ``GROUP BY`` per table); only the price lookup and the
percentiles run here, over the groups and the latencies.

Cost, per call, from the price of its model valid on its UTC day (the latest
``valid_from`` not after it; :func:`set_price` adds one, a change is a new row):
``input_tokens`` minus the cached part at the input price, ``cache_read_tokens`` at the
cache-read price (else the input price), ``cache_write_tokens`` at the cache-write price
(none: free), ``output_tokens`` minus the reasoning part at the output price, and
``reasoning_tokens`` at the reasoning price (else the output price). A call whose
model has no price counts in ``unpriced_calls``; its cost is not guessed: a group whose
calls all lack a price has ``cost`` ``None`` ("no price", never ``0``), one with some
priced calls has their cost, beside the count of the others.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from datetime import date, datetime
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, ValidationError
from sqlalchemy import ColumnElement, Connection, Select, func, select

from sessionrepo.errors import InvalidArgument
from sessionrepo.models.tables import messages_table, sessions_table
from sessionrepo.models.usage import TOKEN_KINDS, Price, prices_table, usage_table
from sessionrepo.store.arguments import check_aware_time, check_choice, check_limit
from sessionrepo.store.repository import SessionRepository

__all__ = ["GROUPINGS", "Insights", "InsightsRow", "SessionCost", "insights", "prices", "set_price"]

Grouping = Literal["day", "model", "source", "user"]
GROUPINGS: Final = ("day", "model", "source", "user")

U = usage_table.c
M = messages_table.c
S = sessions_table.c
P = prices_table.c


class InsightsRow(BaseModel):
    """One group of the report (``key`` ``None``: no model, no user)."""

    model_config = ConfigDict(frozen=True)

    key: str | None
    sessions: int = 0
    messages: int = 0
    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0
    #: The calls' cost from the prices; ``None``: the group has calls and none of them
    #: has a price (the cost is unknown, not zero). With ``unpriced_calls`` above zero
    #: and a number here, it is the priced calls' cost alone.
    cost: float | None = 0.0
    reported_cost: float = 0.0
    unpriced_calls: int = 0
    latency_p50: float | None = None
    latency_p95: float | None = None


class SessionCost(BaseModel):
    """One of the busiest sessions of the range (by tokens)."""

    model_config = ConfigDict(frozen=True)

    session_id: str
    source: str
    calls: int
    tokens: int
    #: As :attr:`InsightsRow.cost`: ``None`` when none of its calls has a price.
    cost: float | None
    unpriced_calls: int = 0


class Insights(BaseModel):
    """The report: its groups (sorted by key), their totals, the busiest sessions."""

    model_config = ConfigDict(frozen=True)

    by: str
    since: datetime | None
    until: datetime | None
    rows: list[InsightsRow]
    total: InsightsRow
    busiest: list[SessionCost]


def set_price(repository: SessionRepository, price: Price | dict[str, Any]) -> Price:
    """Add (or correct) the price of one model's token kind from a day on.

    Raises:
        InvalidArgument: the price is not valid (nothing was written).
    """
    try:
        checked = Price.model_validate(price.model_dump() if isinstance(price, Price) else price)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"])
        raise InvalidArgument(f"price.{where}", error["msg"]) from None
    row = checked.model_dump()
    key = {name: row[name] for name in ("model", "token_kind", "valid_from")}
    database = repository.database

    def work(conn: Connection) -> None:
        changed = conn.execute(
            prices_table.update()
            .where(*(P[name] == value for name, value in key.items()))
            .values(per_million=row["per_million"], currency=row["currency"])
        ).rowcount
        if not changed:
            conn.execute(prices_table.insert().values(**row))

    database.write(work)
    return checked


def prices(repository: SessionRepository) -> list[Price]:
    """Every price, by model, token kind and day."""
    query = select(prices_table).order_by(P.model, P.token_kind, P.valid_from)
    return repository.database.read(
        lambda conn: [Price.model_validate(dict(row._mapping)) for row in conn.execute(query)]
    )


def insights(
    repository: SessionRepository,
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    by: Grouping = "day",
    busiest: int = 10,
) -> Insights:
    """The report over ``[since, until)`` (either open), grouped ``by``.

    Raises:
        InvalidArgument: a bound is not an aware time, or ``by`` is not one of
            :data:`GROUPINGS`.
    """
    check_choice(by, "by", GROUPINGS)
    if since is not None:
        check_aware_time(since, "since")
    if until is not None:
        check_aware_time(until, "until")
    busiest = check_limit(busiest, "busiest")
    database = repository.database
    day_of = database.dialect.utc_day

    def work(conn: Connection) -> Insights:
        price_list = [dict(row._mapping) for row in conn.execute(select(prices_table))]
        book = _PriceBook(price_list)
        groups: dict[str | None, dict[str, Any]] = defaultdict(dict)
        # Messages and sessions, by the message's time: one pass over the messages,
        # counted per session (and day) by the database; the groups and the distinct
        # sessions are summed here from those rows (a session per group at most once).
        seen: set[str] = set()
        for key, sid, count in conn.execute(_per_session(by, day_of, since, until)):
            group = groups[key]
            group["messages"] = group.get("messages", 0) + int(count)
            group["sessions"] = group.get("sessions", 0) + 1
            seen.add(sid)
        # Calls, by the call's own day and model (the price's), then the group.
        usage_key = _usage_key(by, day_of)
        day, model = day_of(U.occurred_at), U.model
        sums = [func.sum(U[kind]).label(kind) for kind in TOKEN_KINDS]
        calls = select(
            usage_key.label("key"),
            day.label("day"),
            model.label("model"),
            func.count().label("calls"),
            func.coalesce(func.sum(U.reported_cost), 0.0).label("reported_cost"),
            *sums,
        )
        if by in ("source", "user"):
            calls = calls.join_from(usage_table, sessions_table, S.id == U.session_id)
        calls = _bounded(calls, U.occurred_at, since, until).group_by(usage_key, day, model)
        for row in conn.execute(calls):
            group = groups[row.key]
            tokens = {kind: int(getattr(row, kind) or 0) for kind in TOKEN_KINDS}
            for kind, count in tokens.items():
                group[kind] = group.get(kind, 0) + count
            group["calls"] = group.get("calls", 0) + row.calls
            group["reported_cost"] = group.get("reported_cost", 0.0) + float(row.reported_cost)
            cost = book.cost(row.model, date.fromisoformat(row.day), tokens)
            if cost is None:
                group["unpriced_calls"] = group.get("unpriced_calls", 0) + row.calls
            else:
                group["cost"] = group.get("cost", 0.0) + cost
        # Latencies, for the percentiles.
        latencies: dict[str | None, list[float]] = defaultdict(list)
        timed = select(usage_key.label("key"), U.latency).where(U.latency.is_not(None))
        if by in ("source", "user"):
            timed = timed.join_from(usage_table, sessions_table, S.id == U.session_id)
        every: list[float] = []
        for key, latency in conn.execute(_bounded(timed, U.occurred_at, since, until)):
            latencies[key].append(float(latency))
            every.append(float(latency))
        rows = [
            InsightsRow(key=key, **_unknown_cost(values), **_percentiles(latencies.get(key, [])))
            for key, values in sorted(
                groups.items(), key=lambda item: (item[0] is None, item[0] or "")
            )
        ]
        # Sessions are not additive across groups (one spans days).
        total = _total(rows, every, len(seen))
        return Insights(
            by=by,
            since=since,
            until=until,
            rows=rows,
            total=total,
            busiest=_busiest(conn, book, day_of=day_of, since=since, until=until, limit=busiest),
        )

    return database.read(work)


def _unknown_cost(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` with ``cost`` ``None`` when it has calls and none has a price."""
    calls = values.get("calls", 0)
    if calls and values.get("unpriced_calls", 0) == calls:
        return {**values, "cost": None}
    return values


def _per_session(
    by: str, day_of: Any, since: datetime | None, until: datetime | None
) -> Select[Any]:
    """``(key, session id, live messages)`` per session of the range (and per day of
    it, by day): the messages grouped by session first, so the session's model, source
    or user is joined to one row per session, not to every message."""
    if by == "day":
        day = day_of(M.timestamp)
        query = select(day.label("key"), M.session_id, func.count()).where(M.superseded.is_(None))
        grouped: Select[Any] = _bounded(query, M.timestamp, since, until).group_by(
            M.session_id, day
        )
        return grouped
    per_session = (
        _bounded(
            select(M.session_id.label("sid"), func.count().label("n")).where(
                M.superseded.is_(None)
            ),
            M.timestamp,
            since,
            until,
        )
        .group_by(M.session_id)
        .subquery()
    )
    key = {"model": S.model, "source": S.source, "user": S.user_id}[by]
    return select(key, per_session.c.sid, per_session.c.n).join_from(
        per_session, sessions_table, S.id == per_session.c.sid
    )


def _usage_key(by: str, day_of: Any) -> ColumnElement[Any]:
    if by == "day":
        key: ColumnElement[Any] = day_of(U.occurred_at)
        return key
    return {"model": U.model, "source": S.source, "user": S.user_id}[by]


def _bounded(query: Any, column: Any, since: datetime | None, until: datetime | None) -> Any:
    if since is not None:
        query = query.where(column >= since)
    if until is not None:
        query = query.where(column < until)
    return query


class _PriceBook:
    """The prices, per model and kind, newest ``valid_from`` first."""

    def __init__(self, rows: Iterable[dict[str, Any]]) -> None:
        self._prices: dict[tuple[str, str], list[tuple[date, float]]] = defaultdict(list)
        for row in rows:
            self._prices[(row["model"], row["token_kind"])].append(
                (row["valid_from"], float(row["per_million"]))
            )
        for entries in self._prices.values():
            entries.sort(reverse=True)

    def price(self, model: str, kind: str, day: date) -> float | None:
        for valid_from, per_million in self._prices.get((model, kind), ()):
            if valid_from <= day:
                return per_million
        return None

    def cost(self, model: str | None, day: date, tokens: dict[str, int]) -> float | None:
        """The cost of ``tokens`` of ``model`` on ``day``; ``None``: no input or output
        price for it that day."""
        if model is None:
            return None
        input_price = self.price(model, "input_tokens", day)
        output_price = self.price(model, "output_tokens", day)
        if input_price is None or output_price is None:
            return None
        cached = self.price(model, "cache_read_tokens", day)
        written = self.price(model, "cache_write_tokens", day) or 0.0
        reasoning = self.price(model, "reasoning_tokens", day)
        cache_read = tokens["cache_read_tokens"]
        thinking = tokens["reasoning_tokens"]
        total = (
            max(tokens["input_tokens"] - cache_read, 0) * input_price
            + cache_read * (input_price if cached is None else cached)
            + tokens["cache_write_tokens"] * written
            + max(tokens["output_tokens"] - thinking, 0) * output_price
            + thinking * (output_price if reasoning is None else reasoning)
        )
        return total / 1_000_000


def _percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"latency_p50": None, "latency_p95": None}
    ordered = sorted(values)
    return {"latency_p50": _rank(ordered, 0.50), "latency_p95": _rank(ordered, 0.95)}


def _rank(ordered: list[float], share: float) -> float:
    """The nearest-rank percentile."""
    return ordered[max(math.ceil(share * len(ordered)) - 1, 0)]


def _total(rows: list[InsightsRow], latencies: list[float], sessions: int) -> InsightsRow:
    summed = ("calls", *TOKEN_KINDS, "unpriced_calls", "messages")
    values: dict[str, Any] = {name: sum(getattr(row, name) for row in rows) for name in summed}
    values["cost"] = sum(row.cost or 0.0 for row in rows)
    values["reported_cost"] = sum(row.reported_cost for row in rows)
    values["sessions"] = sessions
    return InsightsRow(key=None, **_unknown_cost(values), **_percentiles(latencies))


def _busiest(
    conn: Connection,
    book: _PriceBook,
    *,
    day_of: Any,
    since: datetime | None,
    until: datetime | None,
    limit: int,
) -> list[SessionCost]:
    tokens = func.sum(U.input_tokens + U.output_tokens)
    top = (
        select(U.session_id, tokens.label("tokens"))
        .group_by(U.session_id)
        .order_by(tokens.desc(), U.session_id)
        .limit(limit)
    )
    top = _bounded(top, U.occurred_at, since, until)
    ranked = [(row.session_id, int(row.tokens or 0)) for row in conn.execute(top)]
    if not ranked:
        return []
    ids = [sid for sid, _ in ranked]
    day = day_of(U.occurred_at)
    detail = select(
        U.session_id,
        day.label("day"),
        U.model,
        func.count().label("calls"),
        *(func.sum(U[kind]).label(kind) for kind in TOKEN_KINDS),
    ).where(U.session_id.in_(ids))
    detail = _bounded(detail, U.occurred_at, since, until).group_by(U.session_id, day, U.model)
    calls: dict[str, int] = defaultdict(int)
    unpriced: dict[str, int] = defaultdict(int)
    costs: dict[str, float] = defaultdict(float)
    for row in conn.execute(detail):
        calls[row.session_id] += row.calls
        spent = book.cost(
            row.model,
            date.fromisoformat(row.day),
            {kind: int(getattr(row, kind) or 0) for kind in TOKEN_KINDS},
        )
        if spent is None:
            unpriced[row.session_id] += row.calls
        else:
            costs[row.session_id] += spent
    sources = dict(conn.execute(select(S.id, S.source).where(S.id.in_(ids))).all())
    return [
        SessionCost(
            session_id=sid,
            source=str(sources.get(sid, "")),
            calls=calls[sid],
            tokens=count,
            cost=None if calls[sid] and unpriced[sid] == calls[sid] else costs[sid],
            unpriced_calls=unpriced[sid],
        )
        for sid, count in ranked
    ]
