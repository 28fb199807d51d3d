"""Issue 31's long runs: a gateway's memory does not grow with what it has written.

Two measurements, each on SQLite and PostgreSQL, through ``TranscriptWriter.write`` (one
message a call, as a gateway writes), with the default ``append_memory`` bound:

- ``rss``: 100,000 messages of 50 KB to 50 sessions in one process; RSS growth (after
  ``gc.collect()``) against the goal of the bound + 20 MiB.
- ``load``: 8 writer processes for 10 minutes, each on its own sessions, each reporting
  its RSS every minute; the slope after the first minute against the goal of ≤ 2 MiB a
  minute.

``python -m bench.longrun`` runs both (about 25 minutes); ``--quick`` is the smoke run of
CI (a few seconds: figures mean nothing). ``make bench`` runs it after the benchmark.
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing
import os
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.databases import DEFAULT_POSTGRES_URL, Databases, Target
from sessionrepo import BackendUnavailable, TranscriptWriter, open_repository

MiB = 1024 * 1024
#: The default bound (``open_repository``'s ``append_memory``), stated here as the goal's.
BOUND_MIB = 64
#: The goals of issue 31.
RSS_SLACK_MIB = 20
SLOPE_MIB_PER_MINUTE = 2.0


def rss_bytes() -> int:
    """This process's resident set (``VmRSS``, Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def _content(index: int, size: int) -> str:
    # Distinct text per message (nothing shared between messages), cheap to make.
    head = f"{index:012d}-{uuid.uuid4().hex}-"
    return head + "lorem ipsum dolor " * ((size - len(head)) // 18)


def measure_rss(location: str, messages: int, size: int, sessions: int) -> dict[str, Any]:
    """RSS growth over ``messages`` writes of ``size`` bytes (after a warm-up of 1 %)."""
    with (
        open_repository(location, auto_migrate=True) as repository,
        TranscriptWriter(repository) as writer,
    ):
        warm = max(50, messages // 100)
        for index in range(warm):
            writer.write(
                f"rss-{index % sessions}", [{"role": "user", "content": _content(index, size)}]
            )
        gc.collect()
        before = rss_bytes()
        started = time.perf_counter()
        for index in range(warm, warm + messages):
            sid = f"rss-{index % sessions}"
            writer.write(sid, [{"role": "user", "content": _content(index, size)}])
        gc.collect()
        growth = rss_bytes() - before
        elapsed = time.perf_counter() - started
    return {
        "messages": messages,
        "bytes_each": size,
        "rss_growth_mib": round(growth / MiB, 1),
        "goal_mib": BOUND_MIB + RSS_SLACK_MIB,
        "met": growth <= (BOUND_MIB + RSS_SLACK_MIB) * MiB,
        "seconds": round(elapsed, 1),
    }


def _writer(location: str, name: str, seconds: float, every: float, out: Any) -> None:
    """One gateway: writes to its own 20 sessions for ``seconds``, its RSS each ``every``."""
    with (
        open_repository(location) as repository,
        TranscriptWriter(repository) as writer,
    ):
        transcripts: dict[str, list[dict[str, Any]]] = {}
        started = time.monotonic()
        next_sample = started
        samples: list[tuple[float, int]] = []
        written = refused = 0
        while (now := time.monotonic()) - started < seconds:
            if now >= next_sample:
                gc.collect()
                samples.append((now - started, rss_bytes()))
                next_sample += every
            sid = f"{name}-{written % 20}"
            transcript = transcripts.setdefault(sid, [])
            transcript.append({"role": "user", "content": _content(written, 1_300)})
            # A gateway flushes its recent turn (the last few messages) each time; when
            # neither the primary nor the outbox answers in time it keeps them and goes on
            # (they are in the next flush).
            try:
                writer.write(sid, transcript[-4:])
            except BackendUnavailable:
                refused += 1
            if len(transcript) > 200:  # the gateway compacts: it drops old messages
                del transcript[:100]
            written += 1
        gc.collect()
        samples.append((time.monotonic() - started, rss_bytes()))
    out.put({"writer": name, "samples": samples, "written": written, "refused": refused})


def _slope(samples: list[tuple[float, int]], every: float) -> float:
    """Least-squares RSS slope in MiB per minute after the first interval."""
    points = [(t, r) for t, r in samples if t >= every] or samples
    if len(points) < 2:
        return 0.0
    mean_t = sum(t for t, _ in points) / len(points)
    mean_r = sum(r for _, r in points) / len(points)
    var = sum((t - mean_t) ** 2 for t, _ in points)
    cov = sum((t - mean_t) * (r - mean_r) for t, r in points)
    return (cov / var) * 60 / MiB if var else 0.0


def measure_load(location: str, writers: int, seconds: float, every: float) -> dict[str, Any]:
    """``writers`` processes writing for ``seconds``: each one's RSS per ``every`` seconds."""
    with open_repository(location, auto_migrate=True):
        pass  # the schema, once, before the writers start
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    processes = [
        context.Process(target=_writer, args=(location, f"w{n}", seconds, every, out))
        for n in range(writers)
    ]
    for process in processes:
        process.start()
    reports = [out.get(timeout=seconds + 120) for _ in processes]
    for process in processes:
        process.join(timeout=60)
    rows = []
    for report in sorted(reports, key=lambda r: str(r["writer"])):
        slope = _slope(report["samples"], every)
        rows.append(
            {
                "writer": report["writer"],
                "written": report["written"],
                "refused": report["refused"],
                "rss_mib": [round(r / MiB, 1) for _, r in report["samples"]],
                "slope_mib_per_minute": round(slope, 2),
            }
        )
    worst = max(row["slope_mib_per_minute"] for row in rows)
    return {
        "writers": rows,
        "every_seconds": every,
        "seconds": seconds,
        "worst_slope": worst,
        "met": worst <= SLOPE_MIB_PER_MINUTE,
    }


def _location(target: Target) -> str:
    return target.sqlalchemy_url("psycopg" if target.backend == "postgresql" else "pysqlite")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.longrun", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a smoke run (seconds)")
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--runs", default="rss,load", help="comma-separated: rss, load")
    parser.add_argument("--messages", type=int, help="rss: messages (default 100,000)")
    parser.add_argument("--minutes", type=float, help="load: minutes (default 10)")
    parser.add_argument(
        "--postgres-url", default=os.environ.get("BENCH_POSTGRES_URL", DEFAULT_POSTGRES_URL)
    )
    parser.add_argument(
        "--out", help="results directory (default: bench/results; --quick: no file written)"
    )
    args = parser.parse_args(argv)
    messages = args.messages or (200 if args.quick else 100_000)
    seconds = (args.minutes or (0.05 if args.quick else 10)) * 60
    every = 1.0 if args.quick else 60.0
    results: dict[str, Any] = {"quick": args.quick}
    runs: dict[str, Callable[[str], dict[str, Any]]] = {
        "rss": lambda location: measure_rss(location, messages, 50_000, 50),
        "load": lambda location: measure_load(location, 8, seconds, every),
    }
    with Databases(args.postgres_url, "longrun") as databases:
        for backend in args.backends.split(","):
            for run in args.runs.split(","):
                target = databases.create(backend, f"{run}_{os.getpid()}")
                result = runs[run](_location(target))
                results[f"{backend}/{run}"] = result
                print(f"{backend} {run}: {json.dumps(result)}", flush=True)
    if args.out is None and args.quick:
        return 0
    out = Path(args.out or "bench/results")
    out.mkdir(parents=True, exist_ok=True)
    name = "longrun-quick" if args.quick else "longrun"
    (out / f"{name}.json").write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
