"""Search by meaning at scale (issue 29): brute-force query latency and the catch-up's
rate over many messages, on SQLite and PostgreSQL.

``python -m bench.semantic_scale [--messages 100000] [--postgres-url URL]``. Loads
``--messages`` messages (200 per session) through ``append``, then fills the vectors with
``catch_up_semantic_index()`` using a stand-in embedder (512 dimensions like the
default model, vectors derived from a hash of the text, so that the database's part is
what is timed, not a model's), then times ``search(mode="semantic")``: 5 queries, each
warmed up once (its vector remembered, so the scan is what is timed), 3 runs each, with
no filter and with ``session_id=``. Prints p50/p95 and writes
``bench/results/semantic-scale.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import subprocess
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sessionrepo import CallableEmbedder, open_repository

RESULTS = Path(__file__).parent / "results"
DIMENSION = 512
PER_SESSION = 200


def _vectors(texts: Sequence[str]) -> Sequence[Sequence[float]]:
    out: list[list[float]] = []
    for text in texts:
        seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
        out.append(np.random.default_rng(seed).standard_normal(DIMENSION).tolist())
    return out


def run(url: str, messages: int) -> dict[str, Any]:
    embedder = CallableEmbedder("bench-hash-512", DIMENSION, _vectors)
    repository = open_repository(url, embedder=embedder, search_index=False)
    try:
        started = time.perf_counter()
        for start in range(0, messages, PER_SESSION):
            repository.append(
                f"s{start // PER_SESSION}",
                [
                    {"role": "user", "content": f"message {i} about topic {i % 97} and {i % 13}"}
                    for i in range(start, min(messages, start + PER_SESSION))
                ],
            )
        load = time.perf_counter() - started
        started = time.perf_counter()
        repository.catch_up_semantic_index()
        fill = time.perf_counter() - started
        report: dict[str, Any] = {
            "messages": messages,
            "load_s": round(load, 1),
            "catch_up_s": round(fill, 1),
            "catch_up_rate_per_s": round(messages / fill),
        }
        for name, session_id in (("all", None), ("one_session", "s7")):
            times: list[float] = []
            for q in range(5):
                query = f"what did we say about topic {q}"
                repository.search(query, mode="semantic", session_id=session_id)
                for _ in range(3):
                    began = time.perf_counter()
                    repository.search(query, mode="semantic", session_id=session_id)
                    times.append((time.perf_counter() - began) * 1000)
            times.sort()
            report[name] = {
                "p50_ms": round(statistics.median(times), 1),
                "p95_ms": round(times[int(len(times) * 0.95) - 1], 1),
            }
        return report
    finally:
        repository.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--postgres-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    args = parser.parse_args(argv)
    results: dict[str, Any] = {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    with tempfile.TemporaryDirectory() as folder:
        results["sqlite"] = run(f"sqlite:///{folder}/scale.db", args.messages)
    print("sqlite", results["sqlite"], flush=True)
    name = f"sessionrepo_semscale_{uuid.uuid4().hex[:8]}"
    base = args.postgres_url.rsplit("/", 1)[0]
    subprocess.run(["createdb", "-h", "127.0.0.1", "-U", "postgres", name], check=True)
    try:
        url = f"{base}/{name}"
        subprocess.run(
            ["sessionrepo", "migrate"],
            check=True,
            env={
                "SESSIONREPO_DATABASE_URL": url,
                "PATH": str(Path(__file__).resolve().parents[1] / ".venv" / "bin")
                + ":/usr/bin:/bin",
            },
        )
        results["postgresql"] = run(url, args.messages)
    finally:
        subprocess.run(["dropdb", "-h", "127.0.0.1", "-U", "postgres", name], check=True)
    print("postgresql", results["postgresql"], flush=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "semantic-scale.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
