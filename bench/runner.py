"""The run: every step, every contender, interleaved, round after round.

Per backend: make each contender a fresh database and a process of its own, create the
sessions and seed the data the load and list steps read (untimed), then run the rounds. In
each round every cell (a step at one size) is run by every contender in turn, starting with
a different contender each round (A B C, B C A, …), so that drift in the machine's load
falls on all of them alike. The concurrency step (PostgreSQL) comes last, with its own
rounds.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from bench.baseline import base_key, is_baseline
from bench.contenders import BACKENDS
from bench.databases import Databases, Target
from bench.machine import source_digest
from bench.worker import UnsupportedStep, Worker, WorkerError


@dataclass(frozen=True)
class Config:
    mode: str
    rounds: int
    #: Sessions the flush steps spread their calls over.
    sessions: int
    #: Calls per round for each batch size (messages per call).
    flush_calls: dict[int, int]
    reflush_size: int
    #: Turn flush: transcripts of n stored messages, each round 2 new ones added and the
    #: whole transcript flushed again.
    turn_sizes: tuple[int, ...]
    load_size: int
    list_total: int
    list_limit: int
    writers: tuple[int, ...]
    writer_calls: int
    writer_batch: int
    writer_sessions: int
    #: A contender still running a cell after this many seconds stops there (the rate is
    #: over what it did, and the table marks the cell). Only slow peers ever reach it.
    cap: float
    seed: int = 20261129
    steps: tuple[str, ...] = ("flush", "reflush", "turn", "load", "list", "concurrency")
    turn_new: int = 2


FULL = Config(
    mode="full",
    rounds=5,
    sessions=200,
    flush_calls={1: 200, 10: 100, 100: 20},
    reflush_size=1000,
    turn_sizes=(10, 100, 1000, 10_000),
    load_size=10_000,
    list_total=100_000,
    list_limit=50,
    writers=(1, 2, 4),
    writer_calls=100,
    writer_batch=10,
    writer_sessions=10,
    cap=2.0,
)

QUICK = Config(
    mode="quick",
    rounds=1,
    sessions=10,
    flush_calls={1: 5, 10: 3, 100: 1},
    reflush_size=50,
    turn_sizes=(10, 100),
    load_size=300,
    list_total=1_000,
    list_limit=50,
    writers=(1, 2),
    writer_calls=5,
    writer_batch=10,
    writer_sessions=2,
    cap=0.5,
)

#: Contenders that run the concurrency step (more would make the run too long for 2 cores;
#: the search_index=False variant shows how much of the scaling the index costs).
CONCURRENT = ("raw", "sessionrepo", "sessionrepo-noindex")


@dataclass
class BackendRun:
    backend: str
    contenders: list[str]
    info: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: cell -> contender -> one result per round (or {"unsupported": …} / {"error": …})
    cells: dict[str, dict[str, list[dict[str, Any]]]] = field(default_factory=dict)
    setup: dict[str, dict[str, Any]] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    load_average: list[float] = field(default_factory=list)
    seconds: float = 0.0
    #: The library's source as this backend's processes imported it (others may be
    #: editing the tree while a run goes on).
    source_sha256: str | None = None

    def record(self, cell: str, key: str, value: dict[str, Any]) -> None:
        self.cells.setdefault(cell, {}).setdefault(key, []).append(value)


_STARTED = time.perf_counter()


def _log(message: str) -> None:
    print(f"{time.perf_counter() - _STARTED:7.1f}s {message}", file=sys.stderr, flush=True)


def _first_line(error: str) -> str:
    lines = [line for line in error.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else "failed"


class Runner:
    def __init__(
        self,
        config: Config,
        contenders: Sequence[str],
        databases: Databases,
        progress: Callable[[str], None] = _log,
        baseline_tree: str | None = None,
    ) -> None:
        self.config = config
        self.contenders = list(contenders)
        self.databases = databases
        self.log = progress
        #: Where the ``-baseline`` twins import sessionrepo from (see bench.baseline).
        self.baseline_tree = baseline_tree

    def _worker(self, key: str, target: Target, seed: int) -> Worker:
        return Worker(key, target, seed, self.baseline_tree if is_baseline(key) else None)

    # -- plumbing -------------------------------------------------------------------

    def _call(self, run: BackendRun, worker: Worker, method: str, *args: Any) -> Any:
        """One command; a contender that crashes is marked failed and skipped from then on."""
        try:
            return worker.call(method, *args)
        except (EOFError, OSError, BrokenPipeError) as exc:
            run.failed[worker.key] = f"worker process died: {exc!r}"
            raise WorkerError(run.failed[worker.key]) from exc

    def _cell(
        self, run: BackendRun, workers: dict[str, Worker], cell: str, key: str, *command: Any
    ) -> dict[str, Any] | None:
        if key in run.failed:
            return None
        try:
            value: dict[str, Any] = self._call(run, workers[key], *command)
        except UnsupportedStep as exc:
            run.record(cell, key, {"unsupported": str(exc)})
            return None
        except WorkerError as exc:
            run.record(cell, key, {"error": _first_line(str(exc))})
            self.log(f"  {key} {cell}: {_first_line(str(exc))}")
            return None
        run.record(cell, key, value)
        return value

    def _broadcast(
        self,
        run: BackendRun,
        workers: dict[str, Worker],
        method: str,
        *args: Any,
        tolerant: bool = False,
    ) -> dict[str, Any]:
        """Send one command to every live worker at once (untimed setup work runs in
        parallel), then collect the answers."""
        sent = []
        for key, worker in workers.items():
            if key in run.failed:
                continue
            try:
                worker.send(method, *args)
                sent.append(key)
            except (WorkerError, UnsupportedStep, EOFError, OSError) as exc:
                run.failed[key] = _first_line(str(exc))
        answers: dict[str, Any] = {}
        for key in sent:
            try:
                answers[key] = workers[key].receive()
            except UnsupportedStep as exc:
                answers[key] = UnsupportedStep(str(exc))
            except WorkerError as exc:
                if not tolerant:
                    run.failed[key] = _first_line(str(exc))
                    self.log(f"  {key} {method}: {run.failed[key]}")
                    continue
                # The contender goes on; the failure is kept with the setup (and fails
                # the run for our contenders).
                answers[key] = {"error": _first_line(str(exc))}
                self.log(f"  {key} {method}: {answers[key]['error']}")
            except (EOFError, OSError) as exc:
                run.failed[key] = _first_line(str(exc))
                self.log(f"  {key} {method}: {run.failed[key]}")
        return answers

    # -- the run --------------------------------------------------------------------

    def run_backend(self, backend: str) -> BackendRun:
        config = self.config
        started = time.perf_counter()
        contenders = [
            key for key in self.contenders if backend in BACKENDS.get(base_key(key), (backend,))
        ]
        run = BackendRun(backend, contenders, source_sha256=source_digest())
        targets = {key: self.databases.create(backend, key.replace("-", "_")) for key in contenders}
        workers = {key: self._worker(key, targets[key], config.seed) for key in contenders}
        extra: dict[str, list[Worker]] = {}
        try:
            self.log(f"[{backend}] opening {', '.join(contenders)}")
            for key, info in self._broadcast(run, workers, "open").items():
                if is_baseline(key):
                    info["label"] += " (baseline)"
                run.info[key] = info
            flush_sessions = [f"s{index:04d}" for index in range(config.sessions)]
            reflush_sessions = [f"reflush-{index}" for index in range(config.rounds)]
            turn_sessions = [f"turn-{size}" for size in config.turn_sizes]
            self._broadcast(
                run,
                workers,
                "create_sessions",
                [*flush_sessions, *reflush_sessions, *turn_sessions, "load"],
            )
            if "turn" in config.steps:
                self.log(
                    f"[{backend}] seeding turn-flush transcripts of "
                    + ", ".join(f"{size:,}" for size in config.turn_sizes)
                    + " messages (each through its contender's own write path)"
                )
                for size in config.turn_sizes:
                    for key, value in self._broadcast(
                        run, workers, "seed_turn", f"turn-{size}", size, tolerant=True
                    ).items():
                        if isinstance(value, dict):
                            run.setup.setdefault(key, {})[f"seed_turn_{size}"] = value
            if "load" in config.steps:
                self.log(f"[{backend}] seeding a {config.load_size:,}-message transcript")
                for key, value in self._broadcast(
                    run, workers, "seed_transcript", "load", config.load_size
                ).items():
                    if isinstance(value, dict):
                        run.setup.setdefault(key, {})["seed_transcript_s"] = value["seconds"]
            if "list" in config.steps:
                self.log(f"[{backend}] seeding {config.list_total:,} sessions (bulk SQL)")
                for key, value in self._broadcast(
                    run, workers, "seed_listing", config.list_total
                ).items():
                    if isinstance(value, dict):
                        run.setup.setdefault(key, {})["seed_listing"] = value
            for round_index in range(config.rounds):
                run.load_average.append(os.getloadavg()[0])
                self.log(
                    f"[{backend}] round {round_index + 1}/{config.rounds} "
                    f"(load average {run.load_average[-1]:.2f})"
                )
                self._round(run, workers, round_index, flush_sessions)
            if "concurrency" in config.steps and backend == "postgresql":
                writers = [key for key in contenders if base_key(key) in CONCURRENT]
                extra = {
                    key: [
                        self._worker(key, targets[key], config.seed + index)
                        for index in range(1, max(config.writers))
                    ]
                    for key in writers
                }
                self.log(f"[{backend}] starting {max(config.writers) - 1} more writers each")
                for key in writers:
                    for worker in extra[key]:
                        worker.call("open")
                self._concurrency(run, workers, extra, writers)
            run.load_average.append(os.getloadavg()[0])
        finally:
            for worker_list in extra.values():
                for worker in worker_list:
                    worker.close()
            for worker in workers.values():
                worker.close()
        run.seconds = time.perf_counter() - started
        return run

    def _order(self, round_index: int, keys: Sequence[str]) -> list[str]:
        shift = round_index % len(keys)
        return [*keys[shift:], *keys[:shift]]

    def _round(
        self,
        run: BackendRun,
        workers: dict[str, Worker],
        round_index: int,
        sessions: Sequence[str],
    ) -> None:
        config = self.config
        order = self._order(round_index, run.contenders)
        if "flush" in config.steps:
            offset = round_index * 37  # each round starts somewhere else in the session list
            for batch, calls in config.flush_calls.items():
                spec = [
                    (sessions[(offset + index) % len(sessions)], batch) for index in range(calls)
                ]
                for key in order:
                    self._cell(run, workers, f"flush_{batch}", key, "flush", spec, config.cap)
        if "reflush" in config.steps:
            session_id = f"reflush-{round_index}"
            for key in order:
                first = self._cell(
                    run,
                    workers,
                    "first_write",
                    key,
                    "first_write",
                    session_id,
                    config.reflush_size,
                    config.cap,
                )
                if first is None:
                    continue
                self._cell(
                    run,
                    workers,
                    "reflush",
                    key,
                    "reflush",
                    session_id,
                    first["messages"],
                    config.cap,
                )
        if "turn" in config.steps:
            for size in config.turn_sizes:
                for key in order:
                    self._cell(
                        run,
                        workers,
                        f"turn_{size}",
                        key,
                        "turn_flush",
                        f"turn-{size}",
                        config.turn_new,
                        config.cap,
                    )
        # One call each, which the cap cannot cut short: a contender whose call took longer
        # than the cap is measured in the first round only (the table says how many).
        if "load" in config.steps:
            for key in order:
                if not self._too_slow(run, "load", key):
                    self._cell(run, workers, "load", key, "load", "load")
        if "list" in config.steps:
            for key in order:
                if not self._too_slow(run, "list", key):
                    self._cell(run, workers, "list", key, "list_newest", config.list_limit)

    def _too_slow(self, run: BackendRun, cell: str, key: str) -> bool:
        results = run.cells.get(cell, {}).get(key, [])
        return any(result.get("seconds", 0.0) > self.config.cap for result in results)

    def _concurrency(
        self,
        run: BackendRun,
        workers: dict[str, Worker],
        extra: dict[str, list[Worker]],
        keys: Sequence[str],
    ) -> None:
        config = self.config
        for round_index in range(config.rounds):
            run.load_average.append(os.getloadavg()[0])
            self.log(
                f"[{run.backend}] concurrency round {round_index + 1}/{config.rounds} "
                f"(load average {run.load_average[-1]:.2f})"
            )
            for count in config.writers:
                for key in self._order(round_index, list(keys)):
                    if key in run.failed:
                        continue
                    pool = [workers[key], *extra[key]][:count]
                    cell = f"concurrency_{count}"
                    try:
                        result = self._writers(pool, round_index, count)
                    except (WorkerError, UnsupportedStep, EOFError, OSError) as exc:
                        run.record(cell, key, {"error": _first_line(str(exc))})
                        continue
                    run.record(cell, key, result)

    def _writers(self, pool: Sequence[Worker], round_index: int, count: int) -> dict[str, Any]:
        """``count`` processes, each appending to sessions of its own, started together."""
        config = self.config
        for index, worker in enumerate(pool):
            sessions = [
                f"c{count}-r{round_index}-w{index}-s{number}"
                for number in range(config.writer_sessions)
            ]
            worker.call("create_sessions", sessions)
            spec = [
                (sessions[call % len(sessions)], config.writer_batch)
                for call in range(config.writer_calls)
            ]
            worker.call("prepare_writes", spec)
        for worker in pool:
            worker.send("write")
        results = [worker.receive() for worker in pool]
        checks = [result.get("check", {}) for result in results]
        start = min(result["start"] for result in results)
        end = max(result["end"] for result in results)
        messages = sum(result["messages"] for result in results)
        return {
            "writers": count,
            "messages": messages,
            "seconds": end - start,
            "slowest_writer_s": max(result["seconds"] for result in results),
            "check": {
                "ok": all(check.get("ok", False) for check in checks),
                "ok_but_stores_again": False,
                "sent": sum(check.get("sent", 0) for check in checks),
                "rows": sum(check.get("rows", 0) for check in checks),
                "missing": sum(check.get("missing", 0) for check in checks),
                "duplicates": sum(check.get("duplicates", 0) for check in checks),
                "misordered_sessions": sum(check.get("misordered_sessions", 0) for check in checks),
            },
        }


def run_all(
    config: Config,
    contenders: Sequence[str],
    backends: Sequence[str],
    postgres_url: str | None,
    baseline_tree: str | None = None,
) -> list[BackendRun]:
    prefix = f"bench_{os.getpid()}"
    runs = []
    with Databases(postgres_url, prefix) as databases:
        runner = Runner(config, contenders, databases, baseline_tree=baseline_tree)
        for backend in backends:
            runs.append(runner.run_backend(backend))
    return runs


def config_dict(config: Config) -> dict[str, Any]:
    values = asdict(config)
    values["flush_calls"] = {str(key): value for key, value in config.flush_calls.items()}
    values["cap"] = config.cap if math.isfinite(config.cap) else None
    return values


__all__ = ["FULL", "QUICK", "BackendRun", "Config", "Runner", "Target", "run_all"]
