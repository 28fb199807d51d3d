"""``python -m bench``: run the benchmark and write ``bench/results/<name>.{json,md}``."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg

from bench import baseline, machine, report
from bench.contenders import CONTENDERS
from bench.databases import DEFAULT_POSTGRES_URL
from bench.report import OURS
from bench.runner import FULL, QUICK, BackendRun, Config, config_dict, run_all
from bench.workload import describe

RESULTS = Path(__file__).resolve().parent / "results"
DEFAULT_CONTENDERS = (
    "raw",
    "raw-autocommit",
    "sessionrepo",
    "sessionrepo-dicts",
    "sessionrepo-async",
    "writer",
    "writer-drainer",
    "openai",
    "openai-sqlite",
    "sessionrepo-openai-agents",
    "adk",
    "sessionrepo-adk",
    "langchain",
    "sessionrepo-langchain",
)
#: Left out of a --quick run unless named: its imports and its one-call-per-message
#: appends take most of a smoke run's minute.
QUICK_SKIPS = ("adk",)
STEPS = ("flush", "reflush", "turn", "load", "list", "concurrency")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description=(
            "sessionrepo against the raw drivers and the peer session stores: the same "
            "workload, the same database server, interleaved rounds."
        ),
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny sizes and one round: a smoke test (figures mean nothing)",
    )
    parser.add_argument("--rounds", type=int, help="rounds per cell (default: 5; quick: 1)")
    parser.add_argument(
        "--backends",
        default="sqlite,postgresql",
        help="comma-separated: sqlite, postgresql (default: both)",
    )
    parser.add_argument(
        "--contenders",
        default=None,
        help=f"comma-separated, from {', '.join(CONTENDERS)} (raw is always run: it is "
        "the yardstick; default: all but the sessionrepo-immediate / -noindex variants, and "
        "with --quick also but Google ADK, the slowest to start and to run)",
    )
    parser.add_argument(
        "--steps",
        default=",".join(STEPS),
        help=f"comma-separated, from {', '.join(STEPS)}",
    )
    parser.add_argument(
        "--postgres-url",
        default=os.environ.get("BENCH_POSTGRES_URL")
        or os.environ.get("SESSIONREPO_TEST_POSTGRES_URL")
        or DEFAULT_POSTGRES_URL,
        help="a server where the benchmark may create and drop databases (default: "
        "$BENCH_POSTGRES_URL, $SESSIONREPO_TEST_POSTGRES_URL, else "
        f"{DEFAULT_POSTGRES_URL})",
    )
    parser.add_argument("--cap", type=float, help="seconds a contender may spend on one cell")
    parser.add_argument(
        "--baseline",
        type=Path,
        help="another checkout (e.g. `git worktree add /tmp/before main`): each sessionrepo "
        "contender also runs on its package, interleaved round by round, and the report "
        "pairs the two per round (see bench/baseline.py)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help="results directory")
    parser.add_argument("--name", help="results file name (default: bench-full / bench-quick)")
    return parser


def _installed(key: str) -> bool:
    distribution = CONTENDERS[key][2]
    if distribution is None:
        return True
    module = {"openai-agents": "agents", "google-adk": "google.adk"}.get(
        distribution, distribution.replace("-", "_")
    )
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def _postgres_reachable(url: str) -> str | None:
    try:
        with psycopg.connect(url, connect_timeout=5):
            return None
    except psycopg.Error as exc:
        return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    config = QUICK if args.quick else FULL
    steps = tuple(step for step in args.steps.split(",") if step)
    unknown = set(steps) - set(STEPS)
    if unknown:
        print(f"unknown steps: {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    config = dataclasses.replace(
        config,
        rounds=args.rounds or config.rounds,
        cap=args.cap or config.cap,
        steps=steps,
    )
    chosen = args.contenders or ",".join(
        key for key in DEFAULT_CONTENDERS if not (args.quick and key in QUICK_SKIPS)
    )
    wanted = [key for key in chosen.split(",") if key]
    unknown = set(wanted) - set(CONTENDERS)
    if unknown:
        print(f"unknown contenders: {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    contenders = ["raw", *(key for key in wanted if key != "raw")]
    missing = [key for key in contenders if not _installed(key)]
    for key in missing:
        print(
            f"skipping {key}: not installed (pip install --group bench)",
            file=sys.stderr,
        )
    contenders = [key for key in contenders if key not in missing]

    backends = [backend for backend in args.backends.split(",") if backend]
    postgres_url: str | None = args.postgres_url
    if "postgresql" in backends:
        problem = _postgres_reachable(args.postgres_url)
        if problem:
            print(f"skipping PostgreSQL: {problem}", file=sys.stderr)
            backends.remove("postgresql")
            postgres_url = None
    else:
        postgres_url = None
    if not backends:
        print("no backend to run on", file=sys.stderr)
        return 1

    with tempfile.TemporaryDirectory(prefix="bench-baseline-") as scratch:
        tree = None
        if args.baseline is not None:
            tree = str(baseline.build_tree(args.baseline.resolve(), Path(scratch)))
            ours = [key for key in contenders if key in OURS and not key.startswith("raw")]
            contenders += [baseline.twin(key) for key in ours]
        return _run(
            args,
            argv,
            config=config,
            contenders=contenders,
            missing=missing,
            backends=backends,
            postgres_url=postgres_url,
            tree=tree,
        )


def _run(
    args: argparse.Namespace,
    argv: list[str] | None,
    *,
    config: Config,
    contenders: list[str],
    missing: list[str],
    backends: list[str],
    postgres_url: str | None,
    tree: str | None,
) -> int:
    started = time.perf_counter()
    description = machine.describe(postgres_url)
    workload = describe(config.seed)
    runs = run_all(config, contenders, backends, postgres_url, baseline_tree=tree)
    profiles = _budgets(backends, postgres_url, 60 if args.quick else 500)
    seconds = time.perf_counter() - started
    command = "python -m bench" + (" " + shlex.join(argv if argv is not None else sys.argv[1:]))
    document = report.document(
        mode=config.mode,
        command=command.strip(),
        machine=description | {"load_average_at_end": [round(v, 2) for v in os.getloadavg()]},
        workload=workload | {"skipped": missing},
        config=config,
        config_values=config_dict(config),
        runs=runs,
        seconds=seconds,
        profile=profiles,
    )
    name = args.name or f"bench-{config.mode}"
    json_path, md_path = report.write(document, args.out, name)
    print(report.markdown(document))
    print(f"wrote {json_path} and {md_path} in {seconds:.0f} s", file=sys.stderr)
    return 1 if _our_failures(runs) else 0


def _budgets(backends: list[str], postgres_url: str | None, calls: int) -> dict[str, str]:
    """``python -m bench.profile --budget`` per backend, in a process of its own, after the
    rounds: where a 1-message append's microseconds go, for the report."""
    out = {}
    for backend in backends:
        command = [sys.executable, "-m", "bench.profile", "--budget", "--backend", backend]
        command += ["--calls", str(calls)]
        if postgres_url:
            command += ["--postgres-url", postgres_url]
        print(f"profiling a 1-message append on {backend}", file=sys.stderr)
        done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
        out[backend] = (
            done.stdout
            if done.returncode == 0
            else f"(the profile failed: {done.stderr.strip().splitlines()[-1:]})"
        )
    return out


def _our_failures(runs: list[BackendRun]) -> bool:
    """Whether sessionrepo or the harness itself (the raw driver) failed anywhere: that is
    what a smoke run exists to catch. A peer's failure is reported, not fatal."""
    failed = False
    for run in runs:
        for key in OURS:
            problems = [run.failed[key]] if key in run.failed else []
            problems += [
                f"{cell}: {result['error']}"
                for cell, by_key in run.cells.items()
                for result in by_key.get(key, [])
                if "error" in result
            ]
            # The plain-SQL checks: rows against what was sent, and their order.
            problems += [
                f"{cell}: check failed: {result['check']}"
                for cell, by_key in run.cells.items()
                for result in by_key.get(key, [])
                if not result.get("check", {}).get("ok", True)
            ]
            problems += [
                f"{name}: {value['error']}"
                for name, value in run.setup.get(key, {}).items()
                if isinstance(value, dict) and "error" in value
            ]
            problems += [
                f"{name}: check failed: {value['check']}"
                for name, value in run.setup.get(key, {}).items()
                if isinstance(value, dict) and not value.get("check", {}).get("ok", True)
            ]
            for problem in problems:
                print(f"FAILED [{run.backend}] {key}: {problem}", file=sys.stderr)
                failed = True
    return failed
