"""Insights at scale (issue 30): ``insights()`` over 1,000,000 messages and 100,000 usage
rows, on SQLite and PostgreSQL, with each grouping, over everything and over a range.

``python -m bench.usage_scale [--messages 1000000] [--usage 100000] [--postgres-url URL]``.
Makes the schema with the migrations, then seeds it with plain SQL bulk inserts
(SQLAlchemy Core ``executemany`` of the tables' own ``INSERT``; the API would take an hour
at this size): ``--messages / 100`` sessions of 100 messages each (five sources, 200
users, six models), spread over 90 days, 1% of the messages superseded (out of the
counts), ``--usage`` model calls spread over the sessions, four of the six models
priced; then the rollup of those rows (``usage_rollup``, what migration 0017's backfill
does: the seed goes past the write paths that keep it), timed. ``ANALYZE`` after the
load (what autovacuum does after one on PostgreSQL).
``--keep DIR`` keeps the seeded databases for another run (``--label before`` and
``--label after`` time a change against the same rows; the file keeps both).

Times ``insights(by=…)`` for day, model, source and user, over everything, over a
30-day ``[since, until)`` from midnight to midnight, and over the same 30 days with ends
inside a day: one warm-up, then 3 runs, the median and the worst. Checks each
report against a plain-SQL count over the same rows (messages, sessions, calls, tokens):
a report that disagrees fails the run. Writes ``bench/results/usage-scale.json`` with
the load average before and after.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import MetaData, Table, create_engine, text

from sessionrepo import open_repository
from sessionrepo.ops.insights import GROUPINGS, insights
from sessionrepo.store import rollup

RESULTS = Path(__file__).parent / "results"
PER_SESSION = 100
START = datetime(2026, 9, 1, tzinfo=UTC)
DAYS = 90
SOURCES = ("discord", "slack", "telegram", "whatsapp", "cli")
MODELS = ("gpt-4.1", "gpt-4.1-mini", "claude-sonnet-4", "gemini-2.5-flash", "o3", "local-llama")
PRICED = MODELS[:4]
RANGE = (START + timedelta(days=30), START + timedelta(days=60))
#: The same 30 days, its ends inside a day (``--since 30d`` at some time of day): the
#: partial days at the ends come from the rows, the whole ones from the rollup.
UNALIGNED = (RANGE[0] + timedelta(hours=13, minutes=17), RANGE[1] + timedelta(hours=9, minutes=41))
CHUNK = 10_000


def _sessions(count: int) -> Iterator[dict[str, Any]]:
    for index in range(count):
        started = START + timedelta(seconds=index * DAYS * 86400 // count)
        yield {
            "id": f"s{index:06d}",
            "source": SOURCES[index % len(SOURCES)],
            "user_id": f"u{index % 200:03d}",
            "model": MODELS[index % len(MODELS)],
            "started_at": started,
            "last_active_at": started + timedelta(hours=2),
            "next_seq": PER_SESSION + 1,
            "message_count": PER_SESSION,
        }


def _messages(sessions: int) -> Iterator[dict[str, Any]]:
    for index in range(sessions):
        started = START + timedelta(seconds=index * DAYS * 86400 // sessions)
        for seq in range(1, PER_SESSION + 1):
            content = f"message {seq} of session {index}"
            yield {
                "session_id": f"s{index:06d}",
                "seq": seq,
                "client_msg_uuid": _key(f"{index}/{seq}"),
                "role": "user" if seq % 2 else "assistant",
                "content": content,
                # Sessions run up to ~3 hours, so some cross midnight (UTC).
                "timestamp": started + timedelta(seconds=seq * 97),
                "content_hash": hashlib.md5(content.encode()).digest(),
                "superseded": "retracted" if (index * PER_SESSION + seq) % 100 == 0 else None,
            }


def _usage(sessions: int, count: int) -> Iterator[dict[str, Any]]:
    for index in range(count):
        session = index % sessions
        started = START + timedelta(seconds=session * DAYS * 86400 // sessions)
        yield {
            "session_id": f"s{session:06d}",
            "usage_id": _key(f"usage/{index}"),
            "message_uuid": None,
            "model": MODELS[(index // sessions + session) % len(MODELS)],
            "provider": "bench",
            "input_tokens": 1000 + index % 3000,
            "output_tokens": 100 + index % 700,
            "cache_read_tokens": (index % 5) * 100,
            "cache_write_tokens": 0,
            "reasoning_tokens": index % 50,
            "latency": 0.2 + (index % 40) / 10,
            "reported_cost": None if index % 3 else 0.001,
            "currency": "USD",
            "occurred_at": started + timedelta(seconds=(index // sessions) * 600 + 5),
            "extra": None,
        }


def _key(name: str) -> uuid.UUID:
    return uuid.uuid5(uuid.NAMESPACE_OID, name)


def _tables(engine: Any) -> dict[str, Table]:
    """The migrated tables, as the database has them."""
    metadata = MetaData()
    names = ["sessions", "messages", "usage_records", "usage_prices"]
    metadata.reflect(engine, only=names)
    return {name: metadata.tables[name] for name in names}


def _utc_text(postgres: bool, value: datetime) -> Any:
    """A time as the store keeps it: UTC text on SQLite (``YYYY-MM-DD HH:MM:SS.ffffff``)."""
    return value if postgres else value.strftime("%Y-%m-%d %H:%M:%S.%f")


def _insert(conn: Any, table: Any, rows: Iterator[dict[str, Any]]) -> None:
    chunk: list[dict[str, Any]] = []
    for row in rows:
        chunk.append(row)
        if len(chunk) == CHUNK:
            conn.execute(table.insert(), chunk)
            chunk = []
    if chunk:
        conn.execute(table.insert(), chunk)


def seed(url: str, messages: int, usage: int) -> tuple[float, float]:
    sessions = messages // PER_SESSION
    engine = create_engine(url)
    started = time.perf_counter()
    tables = _tables(engine)
    postgres = engine.dialect.name == "postgresql"

    def timed(rows: Iterator[dict[str, Any]], *names: str) -> Iterator[dict[str, Any]]:
        # The tables are reflected (bench/ uses only the library's public names): a uuid
        # as SQLite's CHAR(32) holds it, hex; times as datetimes (UTC, as stored).
        del names
        for row in rows:
            yield {
                k: v.hex if isinstance(v, uuid.UUID) and not postgres else v for k, v in row.items()
            }

    try:
        with engine.begin() as conn:
            _insert(
                conn,
                tables["sessions"],
                timed(_sessions(sessions), "started_at", "last_active_at"),
            )
            _insert(conn, tables["messages"], timed(_messages(sessions), "timestamp"))
            _insert(conn, tables["usage_records"], timed(_usage(sessions, usage), "occurred_at"))
            _insert(
                conn,
                tables["usage_prices"],
                (
                    {
                        "model": model,
                        "token_kind": kind,
                        "valid_from": date(2026, 1, 1),
                        "per_million": per_million * (1 + position),
                        "currency": "USD",
                    }
                    for position, model in enumerate(PRICED)
                    for kind, per_million in (("input_tokens", 1.0), ("output_tokens", 4.0))
                ),
            )
        with open_repository(url, read_only=True) as repository:
            dialect = repository.database.dialect
        rolled = time.perf_counter()
        with engine.begin() as conn:
            # The rollup of the rows seeded by plain SQL, past the write paths that keep
            # it: what migration 0017's backfill does.
            rollup.recount(conn, dialect, None)
        rollup_s = time.perf_counter() - rolled
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("ANALYZE"))
    finally:
        engine.dispose()
    return time.perf_counter() - started, rollup_s


def _sql_counts(
    url: str, by: str, bounds: tuple[datetime, datetime] | None
) -> tuple[dict[Any, Any], float]:
    """The report's counts by plain SQL: ``{key: (messages, sessions, calls, tokens)}``,
    and the seconds its two queries took (the yardstick: what the database alone
    spends on the same counts)."""
    engine = create_engine(url)
    postgres = engine.dialect.name == "postgresql"

    def day(column: str) -> str:
        if postgres:
            return f"to_char({column} AT TIME ZONE 'UTC', 'YYYY-MM-DD')"
        return f"substr({column}, 1, 10)"

    message_key = (
        day("m.timestamp")
        if by == "day"
        else {"model": "s.model", "source": "s.source", "user": "s.user_id"}[by]
    )
    usage_key = (
        day("u.occurred_at")
        if by == "day"
        else {"model": "u.model", "source": "s.source", "user": "s.user_id"}[by]
    )
    params: dict[str, Any] = {}
    m_where = "m.superseded IS NULL"
    u_where = "1 = 1"
    if bounds is not None:
        params = {"since": bounds[0], "until": bounds[1]}
        m_where += " AND m.timestamp >= :since AND m.timestamp < :until"
        u_where += " AND u.occurred_at >= :since AND u.occurred_at < :until"
    if bounds is not None:
        params = {name: _utc_text(postgres, value) for name, value in params.items()}

    def query(statement: str) -> Any:
        return text(statement)

    found: dict[Any, list[int]] = {}
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
            began = time.perf_counter()
            for key, count, distinct in conn.execute(
                query(
                    f"SELECT {message_key}, count(*), count(DISTINCT m.session_id) FROM messages m "
                    f"JOIN sessions s ON s.id = m.session_id WHERE {m_where} GROUP BY 1"
                ),
                params,
            ):
                found[key] = [int(count), int(distinct), 0, 0]
            for key, calls, tokens in conn.execute(
                query(
                    f"SELECT {usage_key}, count(*), sum(u.input_tokens + u.output_tokens) "
                    f"FROM usage_records u JOIN sessions s ON s.id = u.session_id "
                    f"WHERE {u_where} GROUP BY 1"
                ),
                params,
            ):
                found.setdefault(key, [0, 0, 0, 0])[2:] = [int(calls), int(tokens)]
            seconds = time.perf_counter() - began
    finally:
        engine.dispose()
    return {key: tuple(values) for key, values in found.items()}, seconds


def measure(url: str) -> dict[str, Any]:
    report: dict[str, Any] = {}
    with open_repository(url, read_only=True) as repository:
        for by in GROUPINGS:
            for name, bounds in (
                ("all", None),
                ("30_days", RANGE),
                ("30_days_unaligned", UNALIGNED),
            ):
                since, until = bounds if bounds else (None, None)
                first = insights(repository, by=by, since=since, until=until)
                times: list[float] = []
                for _ in range(3):
                    began = time.perf_counter()
                    insights(repository, by=by, since=since, until=until)
                    times.append(time.perf_counter() - began)
                got = {
                    row.key: (
                        row.messages,
                        row.sessions,
                        row.calls,
                        row.input_tokens + row.output_tokens,
                    )
                    for row in first.rows
                }
                expected, plain = _sql_counts(url, by, bounds)
                if got != expected:
                    raise SystemExit(f"{by}/{name}: the report disagrees with plain SQL")
                report[f"{by}/{name}"] = {
                    "median_s": round(statistics.median(times), 3),
                    "worst_s": round(max(times), 3),
                    "plain_sql_s": round(plain, 3),
                    "groups": len(first.rows),
                    "agrees_with_sql": True,
                }
                print(f"  {by}/{name}: {report[f'{by}/{name}']}", flush=True)
    return report


def run(url: str, messages: int, usage: int, *, seeded: bool) -> dict[str, Any]:
    load = rolled = None
    if not seeded:
        load, rolled = (round(value, 1) for value in seed(url, messages, usage))
        print(f"  seeded in {load:.0f} s (the rollup's backfill {rolled:.1f} s)", flush=True)
    return {
        "messages": messages,
        "usage_rows": usage,
        "seed_s": load,
        "rollup_backfill_s": rolled,
        **measure(url),
    }


def _migrate(url: str) -> None:
    """Migrate in this process: the migrations of the checkout that runs the bench (a
    ``sessionrepo`` on the PATH may be another checkout's install)."""
    open_repository(url, auto_migrate=True, embedder=False).close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--usage", type=int, default=100_000)
    parser.add_argument("--postgres-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--output", default=str(RESULTS / "usage-scale.json"))
    parser.add_argument(
        "--keep",
        metavar="DIR",
        help="keep the seeded databases (DIR/scale.db and the PostgreSQL database "
        "sessionrepo_usagescale_keep) and reuse them when they exist: to time a change "
        "against the same data; the PostgreSQL database is migrated again first",
    )
    parser.add_argument(
        "--label", default="run", help="the key this run's figures get in the output file"
    )
    args = parser.parse_args(argv)
    backends = args.backends.split(",")
    output = Path(args.output)
    results: dict[str, Any] = json.loads(output.read_text()) if output.exists() else {}
    results["load_average_before"] = [round(v, 2) for v in os.getloadavg()]
    results["cpus"] = os.cpu_count()
    run_results: dict[str, Any] = {
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load_average_before": results["load_average_before"],
    }
    if "sqlite" in backends:
        with tempfile.TemporaryDirectory() as folder:
            path = Path(args.keep or folder) / "scale.db"
            seeded = path.exists()
            url = f"sqlite:///{path}"
            open_repository(url).close()  # migrates
            print("sqlite", flush=True)
            run_results["sqlite"] = run(url, args.messages, args.usage, seeded=seeded)
    if "postgresql" in backends:
        name = (
            "sessionrepo_usagescale_keep"
            if args.keep
            else f"sessionrepo_usagescale_{uuid.uuid4().hex[:8]}"
        )
        base = args.postgres_url.rsplit("/", 1)[0]
        made = subprocess.run(
            ["createdb", "-h", "127.0.0.1", "-U", "postgres", name],
            capture_output=True,
            check=False,  # it exists: --keep reuses it
        )
        try:
            url = f"{base}/{name}"
            _migrate(url)
            print("postgresql", flush=True)
            run_results["postgresql"] = run(
                url, args.messages, args.usage, seeded=made.returncode != 0
            )
        finally:
            if not args.keep:
                subprocess.run(["dropdb", "-h", "127.0.0.1", "-U", "postgres", name], check=True)
    run_results["load_average_after"] = [round(v, 2) for v in os.getloadavg()]
    results[args.label] = run_results
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(run_results, indent=2))


if __name__ == "__main__":
    main()
