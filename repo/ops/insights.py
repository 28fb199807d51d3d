"""Insights: what the conversations cost, from the usage ledger and the transcripts.

:func:`insights` groups a time range by UTC day, model, source or user and counts, per
group: sessions and messages (live messages, by their ``timestamp``; the model, source
and user are the session's), model calls and their tokens (by the call's
``occurred_at``; the model is the call's own), the cost computed from the operator's
prices, the cost the providers reported, and the calls' latency p50/p95 (nearest
rank). Everything is counted by the database: the whole UTC days of the range from the
rollup (``usage_rollup``, :mod:`sessionrepo.store.rollup`: per session, day and model,
kept with the rows it sums) and the sessions' open days (the messages of its newest day
a session row counts itself), the partial days at its ends from the rows themselves (the
messages of the sessions the rollup or their row names for that day; the calls by
their time), the
percentiles over the range's calls (PostgreSQL's ``percentile_disc``, SQLite an
aggregate of its own). Only the price lookup runs here, once per group, model and price
period.

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

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, ValidationError
from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Connection,
    Select,
    String,
    cast,
    false,
    func,
    literal,
    null,
    select,
    union_all,
)

from sessionrepo.dialects.base import BackendDialect
from sessionrepo.errors import InvalidArgument
from sessionrepo.models.tables import messages_table, sessions_table
from sessionrepo.models.usage import (
    ROLLUP_NO_MODEL,
    TOKEN_KINDS,
    Price,
    prices_table,
    rollup_table,
    usage_table,
)
from sessionrepo.store.arguments import check_aware_time, check_choice, check_limit
from sessionrepo.store.repository import SessionRepository

__all__ = ["GROUPINGS", "Insights", "InsightsRow", "SessionCost", "insights", "prices", "set_price"]

Grouping = Literal["day", "model", "source", "user"]
GROUPINGS: Final = ("day", "model", "source", "user")

U = usage_table.c
M = messages_table.c
S = sessions_table.c
P = prices_table.c
R = rollup_table.c


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
    dialect = database.dialect
    days = _Days.of(since, until)

    def work(conn: Connection) -> Insights:
        price_list = [dict(row._mapping) for row in conn.execute(select(prices_table))]
        book = _PriceBook(price_list)
        groups: dict[str | None, dict[str, Any]] = defaultdict(dict)
        # Messages and sessions per group, counted by the database (a session counts once
        # per group); the range's distinct sessions beside them.
        counted = _per_session(dialect, days)
        seen = 0
        for key, sessions, count in conn.execute(_per_group(by, counted)):
            groups[key]["messages"] = int(count)
            groups[key]["sessions"] = int(sessions)
            seen += int(sessions)
        if by == "day":  # a session spans days: counted once over the range
            seen = int(conn.execute(select(func.count(counted.c.sid.distinct()))).scalar_one())
        # Calls, by the call's own model and price period (by day: its day), then the group.
        for row in _calls(conn, by, dialect, days, book=book):
            group = groups[row.key]
            for kind, count in row.tokens.items():
                group[kind] = group.get(kind, 0) + count
            group["calls"] = group.get("calls", 0) + row.calls
            group["reported_cost"] = group.get("reported_cost", 0.0) + row.reported_cost
            cost = book.cost(row.model, _priced_on(row.day), row.tokens)
            if cost is None:
                group["unpriced_calls"] = group.get("unpriced_calls", 0) + row.calls
            else:
                group["cost"] = group.get("cost", 0.0) + cost
        # The calls' latency percentiles, by the database over the range's records.
        latencies = _latencies(conn, by, dialect, since, until)
        total_latency = latencies.pop(_TOTAL, _NO_LATENCY)
        rows = [
            InsightsRow(key=key, **_unknown_cost(values), **latencies.get(key, _NO_LATENCY))
            for key, values in sorted(
                groups.items(), key=lambda item: (item[0] is None, item[0] or "")
            )
        ]
        # Sessions are not additive across groups (one spans days).
        total = _total(rows, total_latency, seen)
        return Insights(
            by=by,
            since=since,
            until=until,
            rows=rows,
            total=total,
            busiest=_busiest(conn, book, dialect=dialect, days=days, limit=busiest),
        )

    return database.read(work)


def _unknown_cost(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` with ``cost`` ``None`` when it has calls and none has a price."""
    calls = values.get("calls", 0)
    if calls and values.get("unpriced_calls", 0) == calls:
        return {**values, "cost": None}
    return values


@dataclass(frozen=True)
class _Days:
    """A range ``[since, until)`` split where the rollup's UTC days can count it: the
    whole days ``[first, end)`` (either open) from the rollup, and the ``edges``, the
    partial days at either end (``(since, until, day)``, each within its UTC ``day``),
    from the rows themselves."""

    first: str | None
    end: str | None
    edges: tuple[tuple[datetime, datetime, str], ...]
    #: No whole day: everything comes from the rows (``edges``).
    none: bool

    @classmethod
    def of(cls, since: datetime | None, until: datetime | None) -> _Days:
        if since is not None and until is not None and since >= until:
            return cls(first=None, end=None, edges=(), none=True)
        first = None if since is None else _day_start(since, up=True)
        end = None if until is None else _day_start(until, up=False)
        if since is not None and until is not None and first and end and first > end:
            # Both ends within one day.
            return cls(first=None, end=None, edges=((since, until, _day(since)),), none=True)
        edges: list[tuple[datetime, datetime, str]] = []
        if since is not None and first is not None and since < first:
            edges.append((since, first, _day(since)))
        if until is not None and end is not None and end < until:
            edges.append((end, until, _day(end)))
        return cls(
            first=None if first is None else _day(first),
            end=None if end is None else _day(end),
            edges=tuple(edges),
            none=first is not None and first == end,
        )

    def whole(self, query: Any, day: Any = R.day) -> Any:
        """``query`` of the rollup (or of another ``day`` column), bounded to the whole
        days."""
        if self.first is not None:
            query = query.where(day >= self.first)
        if self.end is not None:
            query = query.where(day < self.end)
        return query


def _day(moment: datetime) -> str:
    return moment.astimezone(UTC).date().isoformat()


def _day_start(moment: datetime, *, up: bool) -> datetime:
    """The UTC midnight at or after (``up``) or at or before ``moment``."""
    utc = moment.astimezone(UTC)
    midnight = datetime.combine(utc.date(), time(), tzinfo=UTC)
    if up and midnight < utc:
        return midnight + timedelta(days=1)
    return midnight


def _per_session(dialect: BackendDialect, days: _Days) -> Any:
    """``(sid, day, n)``: the live messages per session and UTC day of the range, as a
    subquery: the whole days from the rollup and the sessions' open days (the count a
    session row keeps for its newest day: ``sessions.rollup_day``; a ``(sid, day)`` may
    be in both, so they are summed), the edges counted from the messages (their days are
    other days than the whole ones, so no ``(sid, day)`` repeats)."""
    parts: list[Select[Any]] = []
    if not days.none:
        rolled = days.whole(
            select(R.session_id.label("sid"), R.day.label("day"), R.messages.label("n")).where(
                R.model == ROLLUP_NO_MODEL, R.messages > 0
            )
        )
        still_open = days.whole(
            select(
                S.id.label("sid"), S.rollup_day.label("day"), S.rollup_messages.label("n")
            ).where(S.rollup_messages > 0),
            S.rollup_day,
        )
        both = union_all(rolled, still_open).subquery()
        parts.append(
            select(both.c.sid, both.c.day, func.sum(both.c.n).label("n")).group_by(
                both.c.sid, both.c.day
            )
        )
    day = dialect.utc_day(M.timestamp)
    for since, until, on in days.edges:
        # The messages of the day's sessions only (the rollup or their row names them),
        # read by the key's session prefix: no index of the messages' time is needed.
        active = union_all(
            select(R.session_id).where(R.day == on, R.model == ROLLUP_NO_MODEL, R.messages > 0),
            select(S.id).where(S.rollup_day == on, S.rollup_messages > 0),
        )
        edge = select(M.session_id.label("sid"), day.label("day"), func.count().label("n")).where(
            M.superseded.is_(None), M.session_id.in_(active)
        )
        parts.append(_bounded(edge, M.timestamp, since, until).group_by(M.session_id, day))
    return _union(parts, ("sid", "day", "n"))


def _per_group(by: str, counted: Any) -> Select[Any]:
    """``(key, sessions, messages)`` per group of ``counted`` (:func:`_per_session`),
    summed by the database: by day a row is one session's day; by the session's
    model, source or user each session is in one group, so its rows are summed first
    and the group counts each session once."""
    if by == "day":
        return select(counted.c.day, func.count(), func.sum(counted.c.n)).group_by(counted.c.day)
    per_session = (
        select(counted.c.sid, func.sum(counted.c.n).label("n")).group_by(counted.c.sid).subquery()
    )
    key = {"model": S.model, "source": S.source, "user": S.user_id}[by]
    return (
        select(key, func.count(), func.sum(per_session.c.n))
        .join_from(per_session, sessions_table, S.id == per_session.c.sid)
        .group_by(key)
    )


_UNION_TYPES: Final[dict[str, Any]] = {
    "sid": String(),
    "day": String(),
    "n": BigInteger(),
    "tokens": BigInteger(),
}


def _union(parts: list[Select[Any]], names: tuple[str, ...]) -> Any:
    """The rows of ``parts`` (each of ``names``) as one subquery."""
    if not parts:  # typed: a sum of an untyped NULL is a sum of text on PostgreSQL
        empty = (cast(null(), _UNION_TYPES[name]).label(name) for name in names)
        return select(*empty).where(false()).subquery()
    if len(parts) == 1:
        return parts[0].subquery()
    return union_all(*parts).subquery()


@dataclass(frozen=True)
class _Spent:
    """The calls of one group and model over days that share that model's prices."""

    key: Any
    #: The day the prices are looked up on: the first of the price period (``''``:
    #: before the model's first price, or a model without one), or the calls' day.
    day: str
    model: str | None
    calls: int
    reported_cost: float
    tokens: dict[str, int]


def _calls(
    conn: Connection,
    by: str,
    dialect: BackendDialect,
    days: _Days,
    *,
    book: _PriceBook,
    sessions: list[str] | None = None,
) -> list[_Spent]:
    """The range's calls per group key (``by``, or ``session``: the session id, of
    ``sessions`` only), model and price period (by day: per day): the whole days from
    the rollup, the edges from the records (other days: the rows never overlap)."""
    found: list[_Spent] = []
    if not days.none:
        # Grouped by model and (but by day, a group of its own) by which side of each
        # price change within the range a day is on: a model's prices hold from one
        # valid_from to the next and a cost is linear in tokens, so each group is priced
        # once. Booleans on plain columns, not a CASE of the period: PostgreSQL estimates
        # a boolean's two values and a column's statistics, and hashes the few groups;
        # an expression it takes for 200 values, and sorted 61,660 rows to disk instead.
        changes = [] if by == "day" else book.changes(days.first, days.end)
        flags = [(R.day >= change).label(f"after_{index}") for index, change in enumerate(changes)]
        grouped: Any = {
            "day": R.day,
            "model": R.model,
            "source": S.source,
            "user": S.user_id,
            "session": R.session_id,
        }[by]
        keys = [R.model, *flags] if by == "model" else [grouped, R.model, *flags]
        whole = select(
            *keys,
            func.sum(R.calls).label("calls"),
            func.sum(R.reported_cost).label("reported_cost"),
            *(func.sum(R[kind]).label(kind) for kind in TOKEN_KINDS),
        ).where(R.calls > 0)
        if by in ("source", "user"):
            whole = whole.join_from(rollup_table, sessions_table, S.id == R.session_id)
        if sessions is not None:
            whole = whole.where(R.session_id.in_(sessions))
        for row in conn.execute(days.whole(whole).group_by(*keys)):
            stored = row.model
            model = None if stored == ROLLUP_NO_MODEL else stored
            if by == "day":
                day = row[0]
            else:
                mapping = row._mapping
                held = {change: bool(mapping[f"after_{i}"]) for i, change in enumerate(changes)}
                day = book.start(stored, days.first, held)
            found.append(
                _Spent(
                    key=model if by == "model" else row[0],
                    day=day,
                    model=model,
                    calls=int(row.calls),
                    reported_cost=float(row.reported_cost),
                    tokens={kind: int(row._mapping[kind] or 0) for kind in TOKEN_KINDS},
                )
            )
    usage_key = _usage_key(by, dialect.utc_day)
    day = dialect.utc_day(U.occurred_at)
    for since, until, _on in days.edges:
        edge = select(
            usage_key.label("key"),
            day.label("day"),
            U.model.label("model"),
            func.count().label("calls"),
            func.coalesce(func.sum(U.reported_cost), 0.0).label("reported_cost"),
            *(func.sum(U[kind]).label(kind) for kind in TOKEN_KINDS),
        )
        if by in ("source", "user"):
            edge = edge.join_from(usage_table, sessions_table, S.id == U.session_id)
        if sessions is not None:
            edge = edge.where(U.session_id.in_(sessions))
        for row in conn.execute(
            _bounded(edge, U.occurred_at, since, until).group_by(usage_key, day, U.model)
        ):
            found.append(
                _Spent(
                    key=row.key,
                    day=row.day,
                    model=row.model,
                    calls=int(row.calls),
                    reported_cost=float(row.reported_cost),
                    tokens={kind: int(row._mapping[kind] or 0) for kind in TOKEN_KINDS},
                )
            )
    return found


#: The key of the whole range's percentiles among the groups'.
_TOTAL: Final = object()
_NO_LATENCY: Final[dict[str, float | None]] = {"latency_p50": None, "latency_p95": None}
#: p50 and p95, as the nearest rank (the value at rank ``ceil(a/b * n)``).
_SHARES: Final = ((50, 100), (95, 100))


def _latencies(
    conn: Connection,
    by: str,
    dialect: BackendDialect,
    since: datetime | None,
    until: datetime | None,
) -> dict[Any, dict[str, float | None]]:
    """The calls' latency p50/p95 per group key, and of the whole range (``_TOTAL``),
    computed by the database over the range's records that have a latency."""
    found: dict[Any, dict[str, float | None]] = {}
    usage_key = _usage_key(by, dialect.utc_day)
    for key, grouped in ((usage_key, True), (literal(1), False)):
        timed = select(key.label("key"), U.latency.label("value")).where(U.latency.is_not(None))
        if grouped and by in ("source", "user"):
            timed = timed.join_from(usage_table, sessions_table, S.id == U.session_id)
        ranks = dialect.nearest_ranks(_bounded(timed, U.occurred_at, since, until), _SHARES)
        for row in conn.execute(ranks):
            found[row[0] if grouped else _TOTAL] = {
                "latency_p50": float(row[1]),
                "latency_p95": float(row[2]),
            }
    return found


def _usage_key(by: str, day_of: Any) -> ColumnElement[Any]:
    if by == "day":
        key: ColumnElement[Any] = day_of(U.occurred_at)
        return key
    return {"model": U.model, "source": S.source, "user": S.user_id, "session": U.session_id}[by]


def _bounded(query: Any, column: Any, since: datetime | None, until: datetime | None) -> Any:
    if since is not None:
        query = query.where(column >= since)
    if until is not None:
        query = query.where(column < until)
    return query


def _priced_on(day: str) -> date:
    """The day a group's price is looked up on (``''``: before any price: none)."""
    return date.fromisoformat(day) if day else date.min


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
        #: Per model, the days any of its prices starts on (``YYYY-MM-DD``).
        self._starts: dict[str, set[str]] = defaultdict(set)
        for (model, _kind), entries in self._prices.items():
            self._starts[model].update(valid.isoformat() for valid, _ in entries)

    def price(self, model: str, kind: str, day: date) -> float | None:
        for valid_from, per_million in self._prices.get((model, kind), ()):
            if valid_from <= day:
                return per_million
        return None

    def changes(self, first: str | None, end: str | None) -> list[str]:
        """The days (``YYYY-MM-DD``) a price of some model starts on strictly within
        the whole days ``[first, end)`` (either open): where a range's days may change
        price. One starting on or before ``first`` holds for all of them."""
        return sorted(
            {
                valid.isoformat()
                for entries in self._prices.values()
                for valid, _ in entries
                if (first is None or valid.isoformat() > first)
                and (end is None or valid.isoformat() < end)
            }
        )

    def start(self, model: str, first: str | None, held: dict[str, bool]) -> str:
        """The first day (``YYYY-MM-DD``) of the period of ``model``'s prices that holds a
        group of days, from ``held`` (for each of :meth:`changes`: whether the days are
        on or after it); ``''`` before its first price, or for a model without one."""
        best = ""
        for valid in self._starts.get(model, ()):
            on = held.get(valid, first is not None and valid <= first)
            if on and valid > best:
                best = valid
        return best

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


def _total(rows: list[InsightsRow], latency: dict[str, float | None], sessions: int) -> InsightsRow:
    summed = ("calls", *TOKEN_KINDS, "unpriced_calls", "messages")
    values: dict[str, Any] = {name: sum(getattr(row, name) for row in rows) for name in summed}
    values["cost"] = sum(row.cost or 0.0 for row in rows)
    values["reported_cost"] = sum(row.reported_cost for row in rows)
    values["sessions"] = sessions
    return InsightsRow(key=None, **_unknown_cost(values), **latency)


def _busiest(
    conn: Connection, book: _PriceBook, *, dialect: BackendDialect, days: _Days, limit: int
) -> list[SessionCost]:
    parts: list[Select[Any]] = []
    if not days.none:
        parts.append(
            days.whole(
                select(
                    R.session_id.label("sid"), (R.input_tokens + R.output_tokens).label("tokens")
                ).where(R.calls > 0)
            )
        )
    for since, until, _on in days.edges:
        edge = select(U.session_id.label("sid"), (U.input_tokens + U.output_tokens).label("tokens"))
        parts.append(_bounded(edge, U.occurred_at, since, until))
    spent = _union(parts, ("sid", "tokens"))
    tokens = func.sum(spent.c.tokens)
    top = (
        select(spent.c.sid, tokens.label("tokens"))
        .group_by(spent.c.sid)
        .order_by(tokens.desc(), spent.c.sid)
        .limit(limit)
    )
    ranked = [(row.sid, int(row.tokens or 0)) for row in conn.execute(top)]
    if not ranked:
        return []
    ids = [sid for sid, _ in ranked]
    calls: dict[str, int] = defaultdict(int)
    unpriced: dict[str, int] = defaultdict(int)
    costs: dict[str, float] = defaultdict(float)
    for row in _calls(conn, "session", dialect, days, book=book, sessions=ids):
        calls[row.key] += row.calls
        cost = book.cost(row.model, _priced_on(row.day), row.tokens)
        if cost is None:
            unpriced[row.key] += row.calls
        else:
            costs[row.key] += cost
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
