"""``python -m bench.citus_paths``: what the Citus paths of issue 26/27's last round are
worth, each against the path it replaced, interleaved in one process on one store.

Two repositories on one Citus schema (2,000 sessions, ``bench.citus.fill``), and one on
plain PostgreSQL for the ratio: ``now`` as this sessionrepo runs; ``before``, the same
code with the replaced paths put back on its dialect object, exactly as they ran:

- the store reads the tombstones on the coordinator before each append (a read
  transaction of its own) and the call passes no tombstone hash
  (``Capabilities.screens_erasure`` false, as before migration 0016);
- a load goes through SQLAlchemy (``load_direct`` returns None: ``BEGIN``, the SELECT,
  ``COMMIT`` sent to the worker);
- the coordinator's connections keep Citus's defaults (16 connections per worker per
  statement, 1 kept);
- the search sends ``citus.propagate_set_commands`` in a round trip of its own.

Per round, each figure is the median of its calls; rounds alternate which repository goes
first; the result is the median of rounds. Writes ``bench/results/citus-paths-<time>``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Connection

from bench.citus import citus_store, fill, postgres_store
from sessionrepo import Message, SessionRepository, open_repository
from sessionrepo.dialects import CitusDialect, PostgresDialect

RESULTS = Path(__file__).resolve().parent / "results"


def as_before(repository: SessionRepository) -> None:
    """Put the replaced Citus paths back on ``repository``'s dialect (see the module)."""
    dialect = repository.database.dialect
    assert isinstance(dialect, CitusDialect), dialect
    dialect.capabilities = dataclasses.replace(dialect.capabilities, screens_erasure=False)  # type: ignore[misc]
    dialect.load_direct = lambda driver, load: None  # type: ignore[method-assign]
    dialect.configure_connection = lambda dbapi_connection: None  # type: ignore[method-assign]
    dialect.search_settings = PostgresDialect.search_settings
    search = dialect.search_messages

    def search_messages(connection: Connection, *args: Any, **kwargs: Any) -> Any:
        connection.exec_driver_sql("SET LOCAL citus.propagate_set_commands = 'local'")
        return search(connection, *args, **kwargs)

    dialect.search_messages = search_messages  # type: ignore[method-assign]
    repository.database.engine.dispose()  # its connections made again, without the settings


def _median_ms(action: Callable[[], object], calls: int) -> float:
    action()
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        action()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def one_round(repository: SessionRepository, calls: int) -> dict[str, float]:
    sid = f"paths-{uuid.uuid4().hex[:8]}"
    repository.append(sid, [Message(role="user", content="first")], source="bench")
    count = iter(range(10**9))
    return {
        "append_1_ms": _median_ms(
            lambda: repository.append(sid, [Message(role="user", content=f"m {next(count)}")]),
            calls,
        ),
        "load_ms": _median_ms(lambda: repository.load_transcript("bulk-17"), calls),
        "search_session_ms": _median_ms(
            lambda: repository.search("common", session_id="bulk-17", limit=20), calls
        ),
        "search_common_ms": _median_ms(lambda: repository.search("common", limit=20), calls // 3),
        "list_newest_ms": _median_ms(lambda: repository.list_sessions(limit=50), calls // 3),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "load_average": " ".join(f"{v:.2f}" for v in os.getloadavg()),
        "sessions": args.sessions,
        "rounds": args.rounds,
        "calls": args.calls,
    }
    with ExitStack() as stack:
        citus = stack.enter_context(citus_store(args.citus_url))
        postgres = stack.enter_context(postgres_store(args.postgres_url))
        fill(citus, args.sessions)
        fill(postgres, args.sessions)
        repositories = {
            "now": stack.enter_context(open_repository(citus)),
            "before": stack.enter_context(open_repository(citus)),
            "postgresql": stack.enter_context(open_repository(postgres)),
        }
        repositories["before"].list_sessions(limit=1)  # connected: the dialect is Citus's
        as_before(repositories["before"])
        rounds: dict[str, list[dict[str, float]]] = {name: [] for name in repositories}
        for number in range(args.rounds):
            order = list(repositories) if number % 2 == 0 else list(reversed(repositories))
            for name in order:
                print(f"{name}: round {number + 1}", file=sys.stderr)
                rounds[name].append(one_round(repositories[name], args.calls))
    for name, found in rounds.items():
        results[name] = {key: statistics.median(r[key] for r in found) for key in found[0]} | {
            f"{key}_rounds": [round(r[key], 2) for r in found] for key in found[0]
        }
    return results


def markdown(results: dict[str, Any]) -> str:
    labels = {
        "append_1_ms": "append of 1 message",
        "load_ms": "load (2 messages)",
        "search_session_ms": "search one session",
        "search_common_ms": "search common word, store-wide",
        "list_newest_ms": "list newest 50",
    }
    lines = [
        f"# Citus paths: before and now ({results['when']})",
        "",
        f"Load average at the start: {results['load_average']}. {results['sessions']:,} "
        f"sessions at 32 shards; {results['rounds']} interleaved rounds, each figure the "
        "median of rounds (of the median of a round's calls), in ms. `before`: the same "
        "code with the replaced paths put back (bench/citus_paths.py says which).",
        "",
        "| | before | now | postgresql | now / before | now / postgresql |",
        "|---|---|---|---|---|---|",
    ]
    for key, label in labels.items():
        before, now, pg = (results[name][key] for name in ("before", "now", "postgresql"))
        lines.append(
            f"| {label} | {before:.2f} | {now:.2f} | {pg:.2f} | {now / before:.2f}x "
            f"| {now / pg:.2f}x |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.citus_paths", description=__doc__)
    parser.add_argument("--citus-url", default=os.environ.get("BENCH_CITUS_URL"))
    parser.add_argument(
        "--postgres-url",
        default=os.environ.get("BENCH_POSTGRES_URL")
        or os.environ.get("SESSIONREPO_TEST_POSTGRES_URL")
        or "postgresql://postgres@127.0.0.1:5432/postgres",
    )
    parser.add_argument("--sessions", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=60, help="calls of each kind a round")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if not args.citus_url:
        parser.error("a Citus coordinator is needed: --citus-url or BENCH_CITUS_URL")
    results = run(args)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"citus-paths-{stamp}.json").write_text(json.dumps(results, indent=2))
    text = markdown(results)
    (args.out / f"citus-paths-{stamp}.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
