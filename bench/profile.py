"""Where sessionrepo's time goes, step by step: ``python -m bench.profile``.

Runs one benchmark cell through sessionrepo in this process under ``cProfile`` (on a
fresh database, the same workload as ``python -m bench``) and prints the time by area
(validation, encoding, search index, SQLAlchemy, the driver and the server's answer, …)
and the functions that cost the most. Built-in functions count for the area of the code
that called them. For a flame graph, run the same under py-spy::

    py-spy record -o flush.svg -- python -m bench.profile --step flush_1
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time
from collections import defaultdict
from typing import Any

from bench.databases import DEFAULT_POSTGRES_URL, Databases
from bench.peers_compat import pool_pre_ping
from bench.workload import Transcripts

#: (area, what a path contains), first match wins.
AREAS = (
    ("search index (repo/search/, repo/store/search_index.py)", "/search/"),
    ("search index (repo/search/, repo/store/search_index.py)", "/store/search_index.py"),
    ("validation: dict -> Message (models/, pydantic)", "/models/"),
    ("validation: dict -> Message (models/, pydantic)", "/pydantic"),
    ("encoding rows, hashing (repo/store/codec.py)", "/store/codec.py"),
    ("repository logic (repo/store/repository.py, repo/dialects/)", "/store/repository.py"),
    ("repository logic (repo/store/repository.py, repo/dialects/)", "/dialects/"),
    ("transactions, retries (repo/_database.py)", "/repo/_database.py"),
    ("SQLAlchemy (statements, pool, result rows)", "/sqlalchemy/"),
    ("driver and server round trips (psycopg, sqlite3)", "/psycopg/"),
    ("driver and server round trips (psycopg, sqlite3)", "sqlite3"),
    ("uuid, json, datetime (stdlib)", "/uuid.py"),
    ("uuid, json, datetime (stdlib)", "/json/"),
)
_DRIVER_BUILTINS = ("sqlite3.", "psycopg", "select.", "socket", "'poll'", "'recv", "'send")


def _area(filename: str, name: str) -> str | None:
    if filename == "~":
        if any(marker in name for marker in _DRIVER_BUILTINS):
            return "driver and server round trips (psycopg, sqlite3)"
        return None  # counted for its caller
    for area, marker in AREAS:
        if marker in filename:
            return area
    return "other Python"


def breakdown(stats: pstats.Stats) -> dict[str, float]:
    """Seconds per area; built-ins are split over their callers' areas."""
    areas: dict[str, float] = defaultdict(float)
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    for (filename, _, name), (_, _, tottime, _, callers) in raw.items():
        area = _area(filename, name)
        if area is not None:
            areas[area] += tottime
            continue
        total = sum(edge[3] for edge in callers.values()) or 1.0
        if not callers:
            areas["other Python"] += tottime
        for (caller_file, _, caller_name), edge in callers.items():
            caller_area = _area(caller_file, caller_name) or "other Python"
            areas[caller_area] += tottime * edge[3] / total
    return dict(sorted(areas.items(), key=lambda item: -item[1]))


def _count_round_trips(engine: Any) -> dict[str, Any]:
    """Statements sent and transactions committed through ``engine`` from now on, and the
    wall time of each kind of statement (its first words) and of the commits."""
    from sqlalchemy import event

    counts: dict[str, Any] = {"statements": 0, "commits": 0, "transactions": 0, "checkouts": 0}
    timings: dict[str, list[float]] = defaultdict(list)
    counts["timings"] = timings
    started: list[float] = [0.0]

    def before(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        counts["statements"] += 1
        started[0] = time.perf_counter()

    def after(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        timings[_statement_kind(statement)].append(time.perf_counter() - started[0])

    def begin(*_: Any) -> None:
        counts["transactions"] += 1

    def checkout(*_: Any) -> None:
        counts["checkouts"] += 1

    event.listen(engine, "before_cursor_execute", before)
    event.listen(engine, "after_cursor_execute", after)
    event.listen(engine, "begin", begin)
    event.listen(engine.pool, "checkout", checkout)
    do_commit = engine.dialect.do_commit

    def timed_commit(dbapi_connection: Any) -> None:
        counts["commits"] += 1
        start = time.perf_counter()
        do_commit(dbapi_connection)
        timings["COMMIT (the driver's commit: WAL flush)"].append(time.perf_counter() - start)

    engine.dialect.do_commit = timed_commit
    return counts


def _statement_kind(statement: str) -> str:
    words = " ".join(statement.split())
    for marker in ("messages_fts", "message_search", "search_index_state"):
        if marker in words:  # the search index's statements, whatever their form
            return f"{' '.join(words.split()[:2])} … {marker}"
    return words[:60]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__)
    parser.add_argument("--backend", choices=("sqlite", "postgresql"), default="postgresql")
    parser.add_argument(
        "--step",
        choices=("flush_1", "flush_10", "flush_100", "reflush", "load", "list"),
        default="flush_1",
    )
    parser.add_argument("--calls", type=int, default=300, help="calls for the flush steps")
    parser.add_argument("--no-search-index", action="store_true", help="search_index=False")
    parser.add_argument(
        "--postgres-url",
        default=os.environ.get("BENCH_POSTGRES_URL") or DEFAULT_POSTGRES_URL,
    )
    parser.add_argument("--top", type=int, default=25, help="functions to list")
    parser.add_argument(
        "--budget",
        action="store_true",
        help="where one 1-message append's microseconds go (validation, encoding, each "
        "statement and round trip as the driver sees it, Python by area), with the raw "
        "yardsticks' statements; see bench/budget.py",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.budget:
        from bench import budget

        print(budget.run(args.backend, args.postgres_url, args.calls))
        return 0
    from sessionrepo import open_repository

    transcripts = Transcripts(20261129)
    with Databases(args.postgres_url, f"bench_profile_{os.getpid()}") as databases:
        target = databases.create(args.backend, "sessionrepo")
        options = {"search_index": False} if args.no_search_index else {}
        repo = open_repository(target.location, auto_migrate=True, **options)
        sessions = [f"s{index:04d}" for index in range(200)]
        for session_id in sessions:
            repo.create_session(session_id, source="bench")
        work: Any
        if args.step.startswith("flush_"):
            batch = int(args.step.split("_")[1])
            calls = [
                (sessions[index % len(sessions)], transcripts.take(sessions[index % 200], batch))
                for index in range(args.calls)
            ]
            count = batch * args.calls

            def work() -> None:
                for session_id, messages in calls:
                    repo.append(session_id, messages)

        elif args.step == "reflush":
            messages = transcripts.take("reflush", 1000)
            repo.append("reflush", messages)
            count = len(messages)

            def work() -> None:
                repo.append("reflush", messages)

        elif args.step == "load":
            messages = transcripts.take("load", 10_000)
            for start in range(0, len(messages), 1000):
                repo.append("load", messages[start : start + 1000])
            count = len(messages)

            def work() -> None:
                repo.load_transcript("load")

        else:
            count = 50

            def work() -> None:
                repo.list_sessions(limit=50)

        counts = _count_round_trips(repo.database.engine)
        pre_ping = pool_pre_ping(repo.database.engine.pool)
        profiler = cProfile.Profile()
        started = time.perf_counter()
        profiler.enable()
        work()
        profiler.disable()
        seconds = time.perf_counter() - started
        repo.close()

    stats = pstats.Stats(profiler, stream=sys.stdout)
    print(
        f"sessionrepo {args.step} on {args.backend}"
        f"{' (search_index=False)' if args.no_search_index else ''}: {seconds:.3f} s under "
        f"cProfile for {count:,} messages ({count / seconds:,.0f}/s; cProfile adds overhead, "
        "so read the shares, not the rate)\n"
    )
    calls_made = args.calls if args.step.startswith("flush_") else 1
    print(
        f"per call: {counts['statements'] / calls_made:.1f} SQL statements, "
        f"{counts['commits'] / calls_made:.1f} commits, "
        f"{counts['transactions'] / calls_made:.1f} transactions, "
        f"{counts['checkouts'] / calls_made:.1f} pool checkouts"
        f"{' (each one pings the server first: pool_pre_ping)' if pre_ping else ''} "
        "(the raw driver: 1 executemany, 1 commit, no ping)\n"
    )
    print(f"{'statement (first words)':<62} {'per call':>8} {'us each':>8} {'us/call':>8}")
    rows = sorted(counts["timings"].items(), key=lambda item: -sum(item[1]))
    for kind, seconds in rows:
        each = sorted(seconds)[len(seconds) // 2] * 1e6
        print(
            f"{kind:<62} {len(seconds) / calls_made:8.1f} {each:8.0f} "
            f"{sum(seconds) * 1e6 / calls_made:8.0f}"
        )
    print(
        "(wall time around the driver call, round trip included, under cProfile; "
        "'us each' is the median)\n"
    )
    total = sum(breakdown(stats).values()) or 1.0
    print(f"{'area':<55} {'seconds':>8} {'share':>6}")
    for area, area_seconds in breakdown(stats).items():
        print(f"{area:<55} {area_seconds:8.3f} {area_seconds / total:6.1%}")
    print()
    stats.sort_stats("cumulative").print_stats(args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
