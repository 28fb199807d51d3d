"""What one append writes: WAL pages (SQLite) and WAL bytes (PostgreSQL) per 1-message
append to an existing session, beside the raw driver's, and the PostgreSQL session row's
share of heap-only (HOT) updates.

    python -m bench.wal                                   # both backends, 400 appends each
    python -m bench.wal --backends sqlite --appends 1000
    python -m bench.wal --postgres-url postgresql://postgres@127.0.0.1:5433/postgres

How each figure is taken (issue 25):

- SQLite: a second connection holds a read transaction open, so no checkpoint can reset the
  ``-wal`` file; after a warm-up, ``N`` single-message appends go to one session, and
  ``(growth of the -wal file) / (page size + 24) / N`` is the frames (pages) one append
  wrote.
- PostgreSQL: ``pg_wal_lsn_diff`` of ``pg_current_wal_insert_lsn()`` before and after the
  ``N`` appends, divided by ``N``. The position is the whole server's: run this on a server
  nobody else writes to (``--postgres-url`` of a private cluster), or the figure includes
  their WAL. Each measurement is repeated (``--repeats``) and the smallest kept: other
  writers only ever add. The HOT share is ``n_tup_hot_upd / n_tup_upd`` of ``sessions`` in
  ``pg_stat_user_tables``, read after the contender's connections closed (a backend
  reports its counts when it ends).

The contenders are the benchmark's own (:mod:`bench.contenders`), each in a fresh database,
each fed the same workload's messages (:mod:`bench.workload`). The results go to
``bench/results/wal.md`` and ``wal.json``. No figure is asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sqlite3
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psycopg

from bench.contenders import LABELS, contender_class
from bench.databases import DEFAULT_POSTGRES_URL, Databases, Target, postgres_settings
from bench.workload import Transcripts

#: Contenders measured by default: the yardstick and sessionrepo's write paths.
DEFAULT_CONTENDERS = ("raw", "raw-autocommit", "sessionrepo", "sessionrepo-async", "writer")
RESULTS = Path(__file__).parent / "results"
SESSION = "io-session"
WARM_UP = 50


@dataclass
class Figure:
    """One contender's I/O per 1-message append on one backend."""

    backend: str
    contender: str
    appends: int
    #: SQLite: WAL frames (pages) per append; PostgreSQL: WAL bytes per append.
    wal_per_append: float
    #: PostgreSQL: updates of ``sessions`` during the run, and how many were HOT.
    session_updates: int | None = None
    hot_updates: int | None = None

    @property
    def hot_share(self) -> float | None:
        if not self.session_updates or self.hot_updates is None:
            return None
        return self.hot_updates / self.session_updates


def _calls(transcripts: Transcripts, count: int) -> list[tuple[str, list[Any]]]:
    return [(SESSION, transcripts.take(SESSION, 1)) for _ in range(count)]


def _open(key: str, target: Target) -> Any:
    contender = contender_class(key)(target)
    contender.open()
    contender.create_sessions([SESSION])
    return contender


def _run(contender: Any, calls: list[tuple[str, list[Any]]]) -> None:
    prepared = [(sid, contender.prepare(messages)) for sid, messages in calls]
    result = contender.flush(prepared, cap=3600.0)
    if result["errors"] or result["capped"]:
        raise RuntimeError(f"{contender.key}: the appends did not all succeed: {result}")


def measure_sqlite(key: str, target: Target, appends: int, seed: int) -> Figure:
    transcripts = Transcripts(seed)
    contender = _open(key, target)
    try:
        _run(contender, _calls(transcripts, WARM_UP))
        calls = _calls(transcripts, appends)
        wal = target.location + "-wal"
        with contextlib.closing(sqlite3.connect(target.location, isolation_level=None)) as reader:
            page = int(reader.execute("PRAGMA page_size").fetchone()[0])
            reader.execute("BEGIN")
            reader.execute("SELECT count(*) FROM sessions").fetchone()  # holds a snapshot
            before = os.path.getsize(wal)
            _run(contender, calls)
            after = os.path.getsize(wal)
            reader.execute("COMMIT")
    finally:
        contender.close()
    return Figure("sqlite", key, appends, (after - before) / (page + 24) / appends)


def _hot_counts(target: Target) -> tuple[int, int]:
    with psycopg.connect(target.location, autocommit=True) as connection:
        connection.execute("SELECT pg_stat_clear_snapshot()")
        row = connection.execute(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'sessions'"
        ).fetchone()
    return (0, 0) if row is None else (int(row[0]), int(row[1]))


def _wal_position(target: Target) -> str:
    with psycopg.connect(target.location, autocommit=True) as connection:
        row = connection.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
    assert row is not None
    return str(row[0])


def _wal_bytes(target: Target, start: str, end: str) -> int:
    with psycopg.connect(target.location, autocommit=True) as connection:
        row = connection.execute("SELECT pg_wal_lsn_diff(%s, %s)", (end, start)).fetchone()
    assert row is not None
    return int(row[0])


def _settled_hot_counts(target: Target, before: tuple[int, int]) -> tuple[int, int]:
    """The counts once the closed connections' backends have reported theirs."""
    counts = before
    for _ in range(50):
        counts = _hot_counts(target)
        if counts != before:
            time.sleep(0.5)  # every backend of the pool reports as it ends
            return _hot_counts(target)
        time.sleep(0.1)
    return counts


def measure_postgres(key: str, target: Target, appends: int, seed: int, repeats: int) -> Figure:
    transcripts = Transcripts(seed)
    contender = _open(key, target)
    best: float | None = None
    try:
        _run(contender, _calls(transcripts, WARM_UP))
        for _ in range(repeats):
            calls = _calls(transcripts, appends)
            start = _wal_position(target)
            _run(contender, calls)
            per_append = _wal_bytes(target, start, _wal_position(target)) / appends
            best = per_append if best is None else min(best, per_append)
    finally:
        contender.close()
    # The table is new: every update counted is the warm-up's or the run's.
    updates, hot = _settled_hot_counts(target, (0, 0))
    assert best is not None
    return Figure("postgresql", key, appends, best, session_updates=updates, hot_updates=hot)


def markdown(figures: Sequence[Figure], settings: dict[str, Any]) -> str:
    lines = [
        "# What one append writes (`python -m bench.wal`)",
        "",
        "Per 1-message append to an existing session, after a warm-up of "
        f"{WARM_UP} appends. SQLite: WAL frames (pages) per append, a reader holding a "
        "snapshot so no checkpoint runs. PostgreSQL: WAL bytes per append "
        "(`pg_current_wal_insert_lsn` difference, smallest of the repeats), and the share "
        "of the `sessions` row's updates (warm-up included) that were heap-only (HOT).",
        "",
        "| backend | contender | appends | WAL per append | × raw | session-row updates | HOT |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    raw = {f.backend: f.wal_per_append for f in figures if f.contender == "raw"}
    for figure in figures:
        unit = "pages" if figure.backend == "sqlite" else "bytes"
        base = raw.get(figure.backend)
        ratio = f"{figure.wal_per_append / base:.2f}×" if base else ""
        share = figure.hot_share
        lines.append(
            f"| {figure.backend} | {LABELS.get(figure.contender, figure.contender)} "
            f"| {figure.appends} | {figure.wal_per_append:,.1f} {unit} | {ratio} "
            f"| {'' if figure.session_updates is None else figure.session_updates} "
            f"| {'' if share is None else f'{share:.0%}'} |"
        )
    lines += ["", "Settings: `" + json.dumps(settings, sort_keys=True) + "`", ""]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.wal", description=__doc__.split("\n")[0])
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--contenders", default=",".join(DEFAULT_CONTENDERS))
    parser.add_argument("--appends", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--postgres-url",
        default=os.environ.get("BENCH_POSTGRES_URL")
        or os.environ.get("SESSIONREPO_TEST_POSTGRES_URL")
        or DEFAULT_POSTGRES_URL,
    )
    parser.add_argument("--output", default=str(RESULTS / "wal"), help="path without suffix")
    args = parser.parse_args(argv)
    backends = [name for name in args.backends.split(",") if name]
    figures: list[Figure] = []
    settings: dict[str, Any] = {"sqlite": sqlite3.sqlite_version}
    with Databases(args.postgres_url, f"benchio_{os.getpid()}") as databases:
        for backend in backends:
            if backend == "postgresql":
                settings["postgresql"] = postgres_settings(args.postgres_url)
            for key in args.contenders.split(","):
                target = databases.create(backend, key.replace("-", "_"))
                if backend == "sqlite":
                    figure = measure_sqlite(key, target, args.appends, args.seed)
                else:
                    figure = measure_postgres(key, target, args.appends, args.seed, args.repeats)
                figures.append(figure)
                print(f"{backend:10} {key:20} {figure.wal_per_append:10.1f}", figure.hot_share)
    output = Path(args.output)
    output.with_suffix(".md").write_text(markdown(figures, settings))
    payload = {
        "figures": [asdict(f) | {"hot_share": f.hot_share} for f in figures],
        "settings": settings,
    }
    output.with_suffix(".json").write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {output.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
