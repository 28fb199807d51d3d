"""``python -m bench.citus``: sessionrepo on a Citus coordinator against one PostgreSQL.

The same workload on both, one after the other, from one process:

- **append / load**: sessions flushed a batch at a time by one writer (messages per
  second), then each transcript loaded whole (loads per second);
- **routing**: every statement those appends and loads sent, and those of a listing and a
  search, ``EXPLAIN``-ed on the coordinator: the share that run as one task on one shard
  group (router) and the ones that fan out;
- **fan-out at scale**: the store filled to ``--sessions`` sessions (default 100,000, two
  messages each, written by SQL in bulk: the figures are of reading them), then the
  newest page of sessions, a filtered page, and a search for a common and a rare word,
  each the median of repeated calls.

On one machine the workers share its cores with the coordinator: what this shows is the
cost of routing and of fan-out per statement, not scale-out (README, "Scaling out").
Results go to ``bench/results/citus-<time>.{json,md}``. ``make bench BENCH_CITUS_URL=...``
runs it after the main benchmark.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy import Engine, event
from sqlalchemy.engine import make_url

from sessionrepo import Message, open_repository

RESULTS = Path(__file__).resolve().parent / "results"


def _conninfo(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@contextmanager
def citus_store(admin_url: str) -> Iterator[str]:
    """A migrated (so distributed) schema of its own on the coordinator, with a role of
    that name whose ``search_path`` it is; dropped on exit."""
    name = f"bench_citus_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(_conninfo(admin_url), autocommit=True) as conn:
        conn.execute(f'CREATE ROLE "{name}" LOGIN SUPERUSER')
        conn.execute(f'CREATE SCHEMA "{name}" AUTHORIZATION "{name}"')
        conn.execute(f'ALTER ROLE "{name}" SET search_path = "{name}"')
    url = make_url(admin_url).set(username=name).render_as_string(hide_password=False)
    try:
        _migrate(url)
        yield url
    finally:
        with psycopg.connect(_conninfo(admin_url), autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
            conn.execute(f'DROP ROLE IF EXISTS "{name}"')


@contextmanager
def postgres_store(admin_url: str) -> Iterator[str]:
    """A migrated database of its own on the plain PostgreSQL server; dropped on exit."""
    name = f"bench_citus_pg_{os.getpid()}"
    with psycopg.connect(_conninfo(admin_url), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    url = make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    try:
        _migrate(url)
        yield url
    finally:
        with psycopg.connect(_conninfo(admin_url), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _migrate(url: str) -> None:
    # What `sessionrepo migrate` does: Alembic's upgrade under the advisory lock (on
    # Citus, migration 0007 distributes the schema).
    open_repository(url, auto_migrate=True).close()


class Recorder:
    """The statements an engine sends while recording (text, first parameters, count)."""

    def __init__(self, engine: Engine) -> None:
        self.seen: dict[str, tuple[Any, int]] = {}
        self.on = False
        event.listen(engine, "before_cursor_execute", self._record)

    def _record(self, conn: Any, cursor: Any, statement: str, params: Any, *rest: Any) -> None:
        if not self.on:
            return
        if rest[-1] and isinstance(params, list | tuple):
            params = params[0]
        first, count = self.seen.get(statement, (params, 0))
        self.seen[statement] = (first, count + 1)


_CONTROL = re.compile(r"^\s*(SET|BEGIN|COMMIT|ROLLBACK|SAVEPOINT|RELEASE)\b", re.I)


def classify(url: str, seen: dict[str, tuple[Any, int]]) -> dict[str, Any]:
    """How many of the recorded statements (weighted by how often each was sent) run as
    one task on one shard group, and which fan out (their task counts)."""
    single = multi = other = 0
    fanning: list[dict[str, Any]] = []
    with psycopg.connect(_conninfo(url), autocommit=True) as conn:
        for statement, (params, count) in seen.items():
            if _CONTROL.match(statement) or "pg_advisory_xact_lock" in statement:
                other += count
                continue
            plan = "\n".join(
                str(row[0]) for row in conn.execute("EXPLAIN " + statement, params or None)
            )
            tasks = [int(found) for found in re.findall(r"Task Count: (\d+)", plan)]
            if not tasks:
                other += count
            elif all(task == 1 for task in tasks):
                single += count
            else:
                multi += count
                fanning.append(
                    {"statement": " ".join(statement.split())[:120], "tasks": tasks, "sent": count}
                )
    routed = single + multi
    return {
        "single_shard": single,
        "multi_shard": multi,
        "no_table": other,
        "single_shard_share": single / routed if routed else 1.0,
        "fan_out": fanning,
    }


def _timed(action: Callable[[], object], repeat: int) -> float:
    """Median milliseconds of ``repeat`` calls (after one warm-up call)."""
    action()
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        action()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def hot_path(url: str, sessions: int, flushes: int, batch: int, prefix: str) -> dict[str, Any]:
    """Appends and loads of a gateway's shape (new sessions named ``prefix-N``): rates,
    and the routing of what they sent."""
    with open_repository(url) as repository:
        recorder = Recorder(repository.database.engine)
        ids = [f"{prefix}-{index:05d}" for index in range(sessions)]
        recorder.on = True
        started = time.perf_counter()
        for flush in range(flushes):
            for sid in ids:
                messages = [
                    Message(role="user", content=f"flush {flush} message {index} of {sid}")
                    for index in range(batch)
                ]
                repository.append(sid, messages, source="bench")
        append_seconds = time.perf_counter() - started
        started = time.perf_counter()
        for sid in ids:
            repository.load_transcript(sid)
            repository.get_session(sid)
        load_seconds = time.perf_counter() - started
        recorder.on = False
        return {
            "messages_per_second": sessions * flushes * batch / append_seconds,
            "appends_per_second": sessions * flushes / append_seconds,
            "loads_per_second": sessions / load_seconds,
            "statements": recorder.seen,
        }


class RemoteCommands:
    """What the coordinator sends to the workers (``citus.log_remote_commands`` notices)
    on the connections of every engine made while listening: per call, the workers
    contacted and whether its commit took two phases."""

    def __init__(self) -> None:
        self.commands: list[tuple[str, str]] = []
        event.listen(Engine, "connect", self._connected)

    def close(self) -> None:
        event.remove(Engine, "connect", self._connected)

    def _connected(self, dbapi_connection: Any, record: Any) -> None:
        dbapi_connection.add_notice_handler(self._notice)
        cursor = dbapi_connection.cursor()
        cursor.execute("SET citus.log_remote_commands = on")
        cursor.close()
        dbapi_connection.commit()

    def _notice(self, diagnostic: Any) -> None:
        found = re.search(r"on server \S+@(\S+:\d+) ", diagnostic.message_detail or "")
        message = diagnostic.message_primary or ""
        if found and message.startswith("issuing "):
            self.commands.append((found.group(1), message))

    def call(self, action: Callable[[], object]) -> tuple[int, bool, int]:
        """``action()``; the workers it contacted, whether it committed in two phases,
        and how many commands it sent them (one: the append delegated whole)."""
        start = len(self.commands)
        action()
        seen = self.commands[start:]
        two_phase = any("PREPARE TRANSACTION" in command for _, command in seen)
        return len({worker for worker, _ in seen}), two_phase, len(seen)


def single_appends(
    url: str, sessions: int, calls: int, citus: bool, batch: int = 1
) -> dict[str, Any]:
    """Appends of ``batch`` messages to existing sessions, round robin: the median
    milliseconds of a call (``append_<batch>_ms``) and, on Citus, the workers each call
    contacted and how many used 2PC (the remote-command log is on for those calls only:
    it costs a notice per command)."""
    remote = RemoteCommands() if citus else None
    try:
        with open_repository(url) as repository:
            ids = [f"one-{uuid.uuid4().hex[:8]}-{index:03d}" for index in range(sessions)]
            for sid in ids:
                repository.append(sid, [Message(role="user", content="first")], source="bench")

            def messages(text: str) -> list[Message]:
                return [Message(role="user", content=f"{text} {n}") for n in range(batch)]

            times = []
            for index in range(calls):
                message = messages(f"message {index}")
                started = time.perf_counter()
                repository.append(ids[index % sessions], message)
                times.append((time.perf_counter() - started) * 1000)
            routed: dict[str, Any] = {}
            if remote is not None:
                contacted = [
                    remote.call(
                        functools.partial(
                            repository.append, ids[index % sessions], messages("routed")
                        )
                    )
                    for index in range(min(calls, 50))
                ]
                routed = {
                    "max_workers_per_append": max(workers for workers, _, _ in contacted),
                    "two_phase_appends": sum(1 for _, two, _ in contacted if two),
                    "max_commands_per_append": max(sent for _, _, sent in contacted),
                    "appends_checked": len(contacted),
                }
            return {f"append_{batch}_ms": statistics.median(times), **routed}
    finally:
        if remote is not None:
            remote.close()


def fill(url: str, sessions: int) -> float:
    """``sessions`` sessions of two messages each, indexed, written by SQL in bulk;
    returns the seconds it took."""
    started = time.perf_counter()
    with psycopg.connect(_conninfo(url), autocommit=True) as conn:
        conn.execute(
            "INSERT INTO sessions (id, source, user_id, started_at, last_active_at, "
            "message_count, next_seq) SELECT 'bulk-' || g, "
            "CASE WHEN g %% 10 = 0 THEN 'slack' ELSE 'discord' END, 'user-' || (g %% 1000), "
            "now() - g * interval '1 second', now() - g * interval '1 second', 2, 3 "
            "FROM generate_series(1, %s) g",
            [sessions],
        )
        conn.execute(
            "INSERT INTO messages (session_id, seq, client_msg_uuid, role, content, "
            "timestamp, content_hash) SELECT 'bulk-' || g, s, gen_random_uuid(), "
            "CASE WHEN s = 1 THEN 'user' ELSE 'assistant' END, "
            "CASE WHEN g %% 1000 = 0 THEN 'a rare zebra question ' ELSE 'a common question ' "
            "END || g || ' part ' || s, now() - g * interval '1 second', "
            "decode(md5(g::text || '/' || s), 'hex') "
            "FROM generate_series(1, %s) g, generate_series(1, 2) s",
            [sessions],
        )
        conn.execute(
            "INSERT INTO message_search (session_id, seq, ts, role, document) "
            "SELECT session_id, seq, timestamp, role, to_tsvector('simple', content) "
            "FROM messages WHERE session_id LIKE 'bulk-%'"
        )
        conn.execute("ANALYZE")
    return time.perf_counter() - started


def fan_out(url: str, repeat: int) -> dict[str, Any]:
    """Median latencies (ms) of the reads that span sessions, and their routing."""
    with open_repository(url) as repository:
        recorder = Recorder(repository.database.engine)
        recorder.on = True
        figures = {
            "list_newest_ms": _timed(lambda: repository.list_sessions(limit=50), repeat),
            "list_by_source_ms": _timed(
                lambda: repository.list_sessions(source="slack", limit=50), repeat
            ),
            "search_common_ms": _timed(lambda: repository.search("common", limit=20), repeat),
            "search_rare_ms": _timed(lambda: repository.search("zebra", limit=20), repeat),
            "search_session_ms": _timed(
                lambda: repository.search("common", session_id="bulk-17", limit=20), repeat
            ),
        }
        recorder.on = False
        return {**figures, "statements": recorder.seen}


def _median_of_rounds(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Each numeric figure of the rounds, their median (and the rounds' values)."""
    figures: dict[str, Any] = {}
    for key, value in rounds[0].items():
        if isinstance(value, int | float):
            values = [found[key] for found in rounds]
            figures[key] = statistics.median(values)
            figures[f"{key}_rounds"] = [round(v, 3) for v in values]
    return figures


def run(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "load_average": " ".join(f"{v:.2f}" for v in os.getloadavg()),
        "sessions": args.sessions,
        "hot_path": {"sessions": args.hot_sessions, "flushes": args.flushes, "batch": args.batch},
    }
    stores = {"citus": citus_store(args.citus_url)}
    if args.postgres_url:
        stores["postgresql"] = postgres_store(args.postgres_url)
    with ExitStack() as stack:
        urls = {name: stack.enter_context(store) for name, store in stores.items()}
        # Appends of each batch size, interleaved: rounds alternate which store goes first.
        rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in urls}
        for number in range(args.rounds):
            order = list(urls) if number % 2 == 0 else list(reversed(urls))
            for name in order:
                found: dict[str, Any] = {}
                for batch in args.batches:
                    print(
                        f"{name}: appends of {batch} messages, round {number + 1}", file=sys.stderr
                    )
                    done = single_appends(urls[name], 20, args.single_calls, name == "citus", batch)
                    for key, value in done.items():
                        if key.startswith("max_"):
                            found[key] = max(found.get(key, 0), value)
                        elif key.endswith("_appends") or key == "appends_checked":
                            found[key] = found.get(key, 0) + value
                        else:
                            found[key] = value
                rounds[name].append(found)
        for name, found_rounds in rounds.items():
            figures: dict[str, Any] = {"batches": list(args.batches)}
            for batch in args.batches:
                key = f"append_{batch}_ms"
                figures[key] = statistics.median(r[key] for r in found_rounds)
                figures[f"{key}_rounds"] = [round(r[key], 3) for r in found_rounds]
            if name == "citus":
                for key in ("max_workers_per_append", "max_commands_per_append"):
                    figures[key] = max(r[key] for r in found_rounds)
                for key in ("two_phase_appends", "appends_checked"):
                    figures[key] = sum(r[key] for r in found_rounds)
            results.setdefault(name, {})["single"] = figures
        # Appends and loads, then (both stores filled) the reads across sessions: in
        # rounds that alternate which store goes first; each figure the median of rounds.
        hot_rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in urls}
        for number in range(args.rounds):
            order = list(urls) if number % 2 == 0 else list(reversed(urls))
            for name in order:
                print(f"{name}: appends and loads, round {number + 1}", file=sys.stderr)
                hot_rounds[name].append(
                    hot_path(
                        urls[name], args.hot_sessions, args.flushes, args.batch, f"hot{number}"
                    )
                )
        for name, url in urls.items():
            print(f"{name}: filling to {args.sessions} sessions", file=sys.stderr)
            fill_seconds = fill(url, args.sessions)
            hot = _median_of_rounds(hot_rounds[name])
            hot["fill_seconds"] = fill_seconds
            if name == "citus":
                hot["routing"] = classify(url, hot_rounds[name][0]["statements"])
            results[name] |= {"hot_path": hot}
        wide_rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in urls}
        for number in range(args.rounds):
            order = list(urls) if number % 2 == 0 else list(reversed(urls))
            for name in order:
                print(f"{name}: reads across sessions, round {number + 1}", file=sys.stderr)
                wide_rounds[name].append(fan_out(urls[name], args.repeat))
        for name, url in urls.items():
            wide = _median_of_rounds(wide_rounds[name])
            if name == "citus":
                wide["routing"] = classify(url, wide_rounds[name][0]["statements"])
            results[name]["across_sessions"] = wide
    return results


def markdown(results: dict[str, Any]) -> str:
    names = [name for name in ("citus", "postgresql") if name in results]
    batches = results["citus"]["single"].get("batches", [1])
    rows = [
        *(
            (
                f"append of {batch} message{'s' if batch > 1 else ''}, ms (median of rounds)",
                "single",
                f"append_{batch}_ms",
                "{:.2f}",
            )
            for batch in batches
        ),
        ("append, messages/s", "hot_path", "messages_per_second", "{:.0f}"),
        ("append, calls/s", "hot_path", "appends_per_second", "{:.0f}"),
        ("load + lookup, sessions/s", "hot_path", "loads_per_second", "{:.0f}"),
        ("list newest 50, ms", "across_sessions", "list_newest_ms", "{:.1f}"),
        ("list by source, ms", "across_sessions", "list_by_source_ms", "{:.1f}"),
        ("search common word, ms", "across_sessions", "search_common_ms", "{:.1f}"),
        ("search rare word, ms", "across_sessions", "search_rare_ms", "{:.1f}"),
        ("search one session, ms", "across_sessions", "search_session_ms", "{:.1f}"),
    ]
    hot = results["hot_path"]
    lines = [
        f"# sessionrepo on Citus ({results['when']})",
        "",
        f"Load average at the start: {results.get('load_average', '?')}. Every figure the "
        "median of interleaved rounds (the stores alternate which goes first).",
        "",
        f"Hot path: {hot['sessions']} sessions x {hot['flushes']} flushes of {hot['batch']} "
        f"messages, one writer. Reads across sessions at {results['sessions']:,} sessions.",
        "",
        "| | " + " | ".join(names) + (" | citus / postgresql |" if len(names) == 2 else " |"),
        "|---|" + "---|" * (len(names) + (len(names) == 2)),
    ]
    for label, part, key, form in rows:
        values = [results[name][part][key] for name in names]
        cells = [form.format(value) for value in values]
        if len(names) == 2:
            # A rate's ratio inverted, so that every ratio reads as "times slower".
            slower = values[1] / values[0] if "/s" in label else values[0] / values[1]
            cells.append(f"{slower:.2f}x")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    single = results["citus"]["single"]
    lines += [
        "",
        f"Appends on Citus ({', '.join(map(str, batches))} messages a call), read from the "
        "coordinator's remote commands: at most "
        f"{single['max_workers_per_append']} worker per append, "
        f"at most {single['max_commands_per_append']} command sent per append, "
        f"{single['two_phase_appends']} of {single['appends_checked']} committed in two phases."
        + (
            " Ratio to plain PostgreSQL: "
            + ", ".join(
                f"{single[key] / results['postgresql']['single'][key]:.2f}x ({b} a call)"
                for b in batches
                for key in (f"append_{b}_ms",)
            )
            + "."
            if "postgresql" in results
            else ""
        ),
    ]
    for part, title in (("hot_path", "hot path"), ("across_sessions", "reads across sessions")):
        routing = results["citus"][part]["routing"]
        lines += [
            "",
            f"Routing, {title}: {routing['single_shard']} statements on one shard, "
            f"{routing['multi_shard']} fanned out "
            f"({routing['single_shard_share']:.0%} single-shard).",
        ]
        lines += [
            f"- fans out ({'/'.join(map(str, f['tasks']))} tasks, sent {f['sent']}x): "
            f"`{f['statement']}`"
            for f in routing["fan_out"]
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.citus", description=__doc__)
    parser.add_argument("--citus-url", default=os.environ.get("BENCH_CITUS_URL"))
    parser.add_argument(
        "--postgres-url",
        default=os.environ.get("BENCH_POSTGRES_URL")
        or os.environ.get("SESSIONREPO_TEST_POSTGRES_URL")
        or "postgresql://postgres@127.0.0.1:5432/postgres",
        help="the plain PostgreSQL to compare with ('' for none)",
    )
    parser.add_argument("--sessions", type=int, default=100_000)
    parser.add_argument("--hot-sessions", type=int, default=200)
    parser.add_argument("--flushes", type=int, default=5)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument(
        "--rounds", type=int, default=3, help="interleaved rounds of 1-message appends"
    )
    parser.add_argument(
        "--single-calls", type=int, default=300, help="appends of each batch size a round"
    )
    parser.add_argument(
        "--batches",
        type=lambda text: [int(part) for part in text.split(",")],
        default=[1, 10, 100],
        help="messages per append in the timed appends, comma-separated (default 1,10,100)",
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if not args.citus_url:
        parser.error("a Citus coordinator is needed: --citus-url or BENCH_CITUS_URL")
    if args.quick:
        args.sessions, args.hot_sessions, args.flushes, args.repeat = 2000, 20, 2, 3
        args.rounds, args.single_calls = 1, 30
    results = run(args)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"citus-{stamp}.json").write_text(json.dumps(results, indent=2, default=str))
    text = markdown(results)
    (args.out / f"citus-{stamp}.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
