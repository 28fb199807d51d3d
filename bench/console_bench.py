"""``python -m bench.console_bench``: server time of every console page (issue 18).

On each backend, two stores: the demo's data (``sessionrepo demo``'s gateways plus a
debugging session with tool calls and an image) and a large one, ``--sessions``
sessions (default 1,000,000) made with bulk SQL, the newest few hundred of them with
real transcripts appended through the library. Each page is asked for ``--rounds``
times through the console application itself (in-process, no network); the figure is
the ``Server-Timing`` the console reports (routing, the repository's queries, the
template), median and worst, in milliseconds.

Nothing is asserted; the issue's goal is every page under 100 ms.

    python -m bench.console_bench --backend sqlite --sessions 1000000
    BENCH_POSTGRES_URL=postgresql://postgres@127.0.0.1/postgres python -m bench.console_bench
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
from sqlalchemy.engine import make_url

from sessionrepo import Message, SessionRepository, open_repository
from sessionrepo.demo import run_demo

RICH = "rich-debug-session"
LIVE_SESSIONS = 300


def pages(repository: SessionRepository) -> list[tuple[str, str]]:
    listing = repository.list_sessions(limit=50)
    second = listing.next_cursor or ""
    busy = max(listing.sessions, key=lambda s: s.message_count).id
    return [
        ("listing", "/"),
        ("listing, page 2", f"/?cursor={second}"),
        ("listing, source", "/?source=discord"),
        ("listing, user", "/?user=user-7"),
        ("listing, ended", "/?status=ended"),
        ("transcript", f"/session?id={busy}"),
        ("transcript, rich", f"/session?id={RICH}"),
        ("search, rank", "/search?q=deploy"),
        ("search, newest", "/search?q=deploy&order=newest"),
        ("health", "/health"),
        ("api sessions", "/api/sessions"),
        ("api messages", f"/api/session/messages?id={busy}"),
        ("api search", "/api/search?q=deploy"),
    ]


def measure(url: str, rounds: int) -> list[tuple[str, float, float]]:
    warnings.simplefilter("ignore")  # starlette's test client names its httpx dependency
    from fastapi.testclient import TestClient

    from sessionrepo.web import create_app

    repository = open_repository(url)
    try:
        client = TestClient(create_app(repository, url=url), base_url="http://127.0.0.1")
        figures = []
        for name, path in pages(repository):
            times = []
            for _ in range(rounds + 1):
                answer = client.get(path)
                if answer.status_code != 200:
                    raise SystemExit(f"{path}: {answer.status_code} {answer.text[:200]}")
                times.append(float(answer.headers["server-timing"].split("dur=")[1]))
            figures.append((name, statistics.median(times[1:]), max(times[1:])))
        return figures
    finally:
        repository.close()


def add_live_sessions(repository: SessionRepository) -> None:
    """Real transcripts for the newest sessions, and the rich one."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "web"))
    from _console_data import _rich

    for number in range(LIVE_SESSIONS):
        repository.append(
            f"live-{number:04d}",
            [
                Message(role="user" if i % 2 == 0 else "assistant", content=f"deploy step {i}")
                for i in range(20 if number % 10 else 150)
            ],
            source=("discord", "telegram", "cli")[number % 3],
            user_id=f"user-{number % 50}",
        )
    _rich(repository)
    repository.catch_up_search_index()


def bulk_sessions(url: str, count: int) -> None:
    """``count`` sessions in one statement each batch: ids, sources, users, times spread
    over the last year, every fifth one ended."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        import sqlite3

        sqlite = sqlite3.connect(parsed.database or "")
        sqlite.execute(
            """
            WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < ?)
            INSERT INTO sessions (id, source, user_id, title, started_at, last_active_at,
                ended_at, end_reason, message_count, tool_call_count, input_tokens,
                output_tokens, next_seq)
            SELECT printf('bulk-%07d', i),
                   CASE i % 3 WHEN 0 THEN 'discord' WHEN 1 THEN 'telegram' ELSE 'cli' END,
                   'user-' || (i % 5000), 'Conversation ' || i, t, t,
                   CASE WHEN i % 5 = 0 THEN t END, CASE WHEN i % 5 = 0 THEN 'user_left' END,
                   0, 0, 0, 0, 1
            FROM (SELECT i, strftime('%Y-%m-%d %H:%M:%S', '2025-12-01',
                                     '+' || (i * 31) || ' seconds') || '.000000' AS t
                  FROM n)
            """,
            (count,),
        )
        sqlite.commit()
        sqlite.execute("ANALYZE")
        sqlite.close()
        return
    conninfo = parsed.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(
            """
            INSERT INTO sessions (id, source, user_id, title, started_at, last_active_at,
                ended_at, end_reason, message_count, tool_call_count, input_tokens,
                output_tokens, next_seq)
            SELECT 'bulk-' || lpad(i::text, 7, '0'),
                   (ARRAY['discord', 'telegram', 'cli'])[i %% 3 + 1],
                   'user-' || (i %% 5000), 'Conversation ' || i, t, t,
                   CASE WHEN i %% 5 = 0 THEN t END, CASE WHEN i %% 5 = 0 THEN 'user_left' END,
                   0, 0, 0, 0, 1
            FROM (SELECT i, timestamptz '2025-12-01 00:00Z' + i * interval '31 seconds' AS t
                  FROM generate_series(0, %s - 1) AS i) AS g
            """,
            (count,),
        )
        conn.execute("ANALYZE")


@contextmanager
def store(backend: str, postgres: str, tmp: Path, name: str) -> Iterator[str]:
    if backend == "sqlite":
        yield f"sqlite:///{tmp / (name + '.db')}"
        return
    admin = make_url(postgres).set(drivername="postgresql")
    database = f"sessionrepo_console_bench_{name}_{os.getpid()}"
    conninfo = admin.render_as_string(hide_password=False)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{database}"')
    try:
        yield admin.set(database=database).render_as_string(hide_password=False)
    finally:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


def demo_store(url: str, tmp: Path) -> None:
    """The demo's gateways' transcripts (copied, for PostgreSQL) and the rich session."""
    from sessionrepo.ops import export_sessions, import_sessions

    demo = tmp / "demo-source.db"
    if not demo.exists():
        run_demo(demo, turns=10)
    source = open_repository(f"sqlite:///{demo}")
    target = open_repository(url)
    try:
        if url != f"sqlite:///{demo}":
            dump = tmp / "demo.jsonl"
            with dump.open("wb") as out:
                export_sessions(source, out)
            with dump.open("rb") as data:
                import_sessions(target, data)
        add_live_sessions(target)
    finally:
        source.close()
        target.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=["sqlite", "postgresql", "both"], default="both")
    parser.add_argument("--sessions", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--postgres",
        default=os.environ.get(
            "BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
        ),
    )
    args = parser.parse_args(argv)
    logging.getLogger("sessionrepo").setLevel(logging.ERROR)  # the demo's outage is planned
    backends = ["sqlite", "postgresql"] if args.backend == "both" else [args.backend]
    with tempfile.TemporaryDirectory(prefix="console-bench-") as scratch:
        tmp = Path(scratch)
        for backend in backends:
            for name in ("demo", "large"):
                with store(backend, args.postgres, tmp, name) as url:
                    started = time.monotonic()
                    open_repository(url, auto_migrate=True).close()  # the schema
                    if name == "demo":
                        demo_store(url, tmp)
                    else:
                        bulk_sessions(url, args.sessions)
                        repository = open_repository(url)
                        try:
                            add_live_sessions(repository)
                        finally:
                            repository.close()
                    repository = open_repository(url)
                    total = repository.count_sessions()
                    repository.close()
                    built = time.monotonic() - started
                    print(f"\n{backend}, {name}: {total:,} sessions (built in {built:.0f} s)")
                    print(f"  {'page':<20} {'median ms':>10} {'worst ms':>10}")
                    for page, median, worst in measure(url, args.rounds):
                        print(f"  {page:<20} {median:>10.1f} {worst:>10.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
