"""Search by meaning at scale (issue 29): brute-force query latency and the catch-up's
rate over many messages, on SQLite and PostgreSQL.

``python -m bench.semantic_scale [--messages 100000] [--postgres-url URL] [--pgvector]
[--vectors hash|words] [--memory N]``. Per backend:
loads ``--messages`` messages (200 per session, 10 users) through ``append``, indexes
them for keyword search, then fills the vectors with ``catch_up_semantic_index()``
using a stand-in embedder (512 dimensions like the default model, vectors derived from
a hash of the text: the scale run skips the model, so that what is timed is the
store's part, the catch-up's reads and writes and the queries' scan; the model's own
rate is measured apart, below). Then times ``search(mode="semantic")``:

- ``cold``: the first query of a new repository (it loads the vectors into memory),
  the median of 3 repositories (``cold_runs_ms``: each);
- ``all``: the whole store, 10 queries, each warmed up once (its vector remembered, so
  the scan is what is timed), 5 runs each: p50/p95;
- ``one_session`` (``session_id=``), ``one_user`` (``user_id=``), ``hybrid``;
- ``no_cache``: ``semantic_memory=0`` (every query reads every vector from the
  database: a store past its bound), the whole store, a user's, one session's; on
  SQLite through sqlite-vec where this Python loads it, and then also
  ``no_cache_without_sqlite_vec``, the same queries scanned in Python.

Also: ``numpy_scan_ms``, the matrix-vector product alone over a matrix of that size,
and, when the ``semantic`` extra is installed, ``model_rate_per_s``: the default
model's catch-up rate over ``--model-messages`` messages (on SQLite). The load average
is recorded before and after. Writes ``bench/results/semantic-scale.json``.

``--vectors words``: a stand-in whose vectors are the sums of their words' (texts on one
subject near each other, as a model's are) instead of a hash of the whole text (every
vector as far from every other: the worst case of a nearest-neighbour index, where its
recall means nothing). ``--memory N``: the repositories' ``semantic_memory`` (``0``:
nothing kept, every query answered from the database).

``--pgvector`` (PostgreSQL): ``CREATE EXTENSION vector`` before migrating, so that the
store has pgvector's HNSW index (migration 0021). The index is dropped before the
catch-up and built again after it (``ann_index_build_s``: a bulk load builds it faster
than row by row, as pgvector advises), then ``catch_up_rate_with_index_per_s`` (5,000
more messages, each vector an insert into the graph too) and ``ann_recall_at_10``: the
index's whole-store answers against the exact scan's (``keys``: the share of the exact
ten found; ``scores``: the share scoring at least the exact tenth, where messages tie).
Queries whose vectors do not fit the repository's bound (1,000,000 at the default) are
the index's.

Extensions: sqlite-vec is used where this Python's ``sqlite3`` loads it (the
``sqlite-vec`` extra installed and ``enable_load_extension`` built in: run this with
``make test-sqlite-vec``'s venv, ``.venv-sqlite-vec/bin/python``, for it); the result
records what was found (``extensions``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sqlite3
import statistics
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

import sessionrepo.dialects.sqlite.vectors as sqlite_vectors
from sessionrepo import CallableEmbedder, open_repository
from sessionrepo.search.embedders import default_embedder

RESULTS = Path(__file__).parent / "results"
DIMENSION = 512
PER_SESSION = 200
QUERIES = 10
RUNS = 5
#: New repositories whose first query is timed (``cold``: their median).
COLD_RUNS = 3
TOPICS = (
    "planning a trip to tokyo with a rail pass",
    "the cat is sick and needs the vet",
    "a slow postgres query without an index",
    "baking bread in a hot oven",
    "renewing a passport at the consulate",
    "the football match last night",
    "a python traceback in the deploy script",
    "choosing a mortgage with a fixed rate",
    "learning to play the piano",
    "a birthday present for my sister",
)


def _vectors(texts: Sequence[str]) -> Sequence[Sequence[float]]:
    out: list[list[float]] = []
    for text in texts:
        seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
        out.append(np.random.default_rng(seed).standard_normal(DIMENSION).tolist())
    return out


_WORD_VECTORS: dict[str, Any] = {}


def _word_vector(word: str) -> Any:
    vector = _WORD_VECTORS.get(word)
    if vector is None:
        seed = int.from_bytes(hashlib.sha256(word.encode()).digest()[:8], "little")
        vector = np.random.default_rng(seed).standard_normal(DIMENSION)
        if len(_WORD_VECTORS) < 10_000:  # the topics' words, not each message's number
            _WORD_VECTORS[word] = vector
    return vector


def _bag_of_words(texts: Sequence[str]) -> Sequence[Sequence[float]]:
    """A text's vector: the sum of its words' (each a fixed random vector), so that texts
    sharing words are near, as a model's are for texts on one subject; the store's
    vectors then have the clusters real ones have (the hash stand-in's are spread
    evenly, a nearest-neighbour index's worst case)."""
    out: list[list[float]] = []
    for text in texts:
        words = text.lower().replace(",", " ").replace(":", " ").split()
        out.append(np.sum([_word_vector(word) for word in words], axis=0).tolist())
    return out


STAND_INS: dict[str, Callable[[Sequence[str]], Sequence[Sequence[float]]]] = {
    "hash": _vectors,
    "words": _bag_of_words,
}


def _ms(call: Callable[[], object]) -> float:
    began = time.perf_counter()
    call()
    return (time.perf_counter() - began) * 1000


def _summary(times: list[float]) -> dict[str, float]:
    times = sorted(times)
    return {
        "p50_ms": round(statistics.median(times), 1),
        "p95_ms": round(times[max(0, int(len(times) * 0.95) - 1)], 1),
        "samples": len(times),
    }


def _timed(search: Callable[[str], object], queries: Sequence[str], runs: int) -> dict[str, float]:
    times: list[float] = []
    for query in queries:
        search(query)  # its vector remembered
        times += [_ms(lambda q=query: search(q)) for _ in range(runs)]  # type: ignore[misc]
    return _summary(times)


def run(
    url: str,
    messages: int,
    memory: int | None,
    ann: Callable[[], Any] | None = None,
    vectors: str = "hash",
) -> dict[str, Any]:
    """The figures of one backend; ``ann``: drops pgvector's index before the catch-up
    and returns what makes it again (a bulk load builds an HNSW index faster after the
    rows are in, as pgvector advises), ``None`` without one."""
    embedder = CallableEmbedder(f"bench-{vectors}-512", DIMENSION, STAND_INS[vectors])
    options: dict[str, Any] = {"embedder": embedder}
    if memory is not None:  # else the repository's default
        options["semantic_memory"] = memory
    repository = open_repository(url, **options)
    try:
        started = time.perf_counter()
        for start in range(0, messages, PER_SESSION):
            session = start // PER_SESSION
            repository.append(
                f"s{session}",
                [
                    {
                        "role": "user" if i % 2 == 0 else "assistant",
                        "content": f"message {i}: {TOPICS[i % len(TOPICS)]}, part {i % 97}",
                    }
                    for i in range(start, min(messages, start + PER_SESSION))
                ],
                user_id=f"user{session % 10}",
            )
        load = time.perf_counter() - started
        started = time.perf_counter()
        repository.catch_up_search_index()
        keyword_index = time.perf_counter() - started
        rebuild = None if ann is None else ann()
        started = time.perf_counter()
        embedded = repository.catch_up_semantic_index()
        fill = time.perf_counter() - started
        report: dict[str, Any] = {
            "messages": messages,
            "semantic_memory": memory,
            "vectors": embedded,
            "load_s": round(load, 1),
            "keyword_index_s": round(keyword_index, 1),
            "catch_up_s": round(fill, 1),
            "catch_up_rate_per_s": round(embedded / fill),
        }
        if rebuild is not None:
            started = time.perf_counter()
            rebuild()
            report["ann_index_build_s"] = round(time.perf_counter() - started, 1)
            report["catch_up_rate_with_index_per_s"] = _catch_up_rate(repository, messages)
    finally:
        repository.close()
    queries = [f"what did we say about {topic}" for topic in TOPICS[:QUERIES]]
    colds = []
    for _ in range(COLD_RUNS - 1):
        fresh = open_repository(url, **options)
        try:
            fresh.search(queries[0], mode="keyword")  # the connection pool warm
            colds.append(_ms(lambda r=fresh: r.search(queries[0], mode="semantic")))  # type: ignore[misc]
        finally:
            fresh.close()
    repository = open_repository(url, **options)
    try:
        repository.search(queries[0], mode="keyword")
        colds.append(_ms(lambda: repository.search(queries[0], mode="semantic")))
        report["cold_ms"] = round(statistics.median(colds), 1)
        report["cold_runs_ms"] = [round(c, 1) for c in colds]
        report["all"] = _timed(lambda q: repository.search(q, mode="semantic"), queries, RUNS)
        report["one_session"] = _timed(
            lambda q: repository.search(q, mode="semantic", session_id="s7"), queries, RUNS
        )
        report["one_user"] = _timed(
            lambda q: repository.search(q, mode="semantic", user_id="user3"), queries, RUNS
        )
        report["hybrid"] = _timed(lambda q: repository.search(q, mode="hybrid"), queries, RUNS)
        report["keyword"] = _timed(lambda q: repository.search(q, mode="keyword"), queries, RUNS)
        if ann is not None:
            report["ann_recall_at_10"] = _recall(url, embedder, repository, queries)
            report["vectors"] = vectors
    finally:
        repository.close()
    if ann is None:  # with the index, a query without the cache is the index's: "all"
        if url.startswith("sqlite") and _sqlite_vec_version() is not None:
            report["no_cache"] = _uncached(url, embedder, queries[:5], 3)
            loader = sqlite_vectors.load_sqlite_vec
            sqlite_vectors.load_sqlite_vec = lambda driver_connection: None  # as where it cannot
            try:
                report["no_cache_without_sqlite_vec"] = _uncached(url, embedder, queries[:3], 1)
            finally:
                sqlite_vectors.load_sqlite_vec = loader
        else:
            report["no_cache"] = _uncached(url, embedder, queries[:3], 1)
    return report


def _uncached(
    url: str, embedder: Any, queries: Sequence[str], runs: int
) -> dict[str, dict[str, float]]:
    """The queries of a repository that keeps no vector (each reads them all)."""
    uncached = open_repository(url, embedder=embedder, semantic_memory=0)
    try:
        uncached.search(queries[0], mode="semantic")  # its vector remembered, the pool warm
        return {
            "all": _timed(lambda q: uncached.search(q, mode="semantic"), queries, runs),
            "one_user": _timed(
                lambda q: uncached.search(q, mode="semantic", user_id="user3"), queries, runs
            ),
            "one_session": _timed(
                lambda q: uncached.search(q, mode="semantic", session_id="s7"), queries, runs
            ),
        }
    finally:
        uncached.close()


def _sqlite_vec_version() -> str | None:
    """sqlite-vec's version where this Python loads it, else ``None``."""
    connection = sqlite3.connect(":memory:")
    try:
        return sqlite_vectors.load_sqlite_vec(connection)
    finally:
        connection.close()


def _catch_up_rate(repository: Any, after: int, messages: int = 5_000) -> int:
    """Vectors a catch-up stores per second with the index in place (each one an
    insert into the HNSW graph too): ``messages`` new ones."""
    for start in range(after, after + messages, PER_SESSION):
        repository.append(
            f"late{start}",
            [
                {"role": "user", "content": f"late {i}: {TOPICS[i % len(TOPICS)]}"}
                for i in range(start, start + PER_SESSION)
            ],
        )
    started = time.perf_counter()
    embedded = int(repository.catch_up_semantic_index())
    return round(embedded / (time.perf_counter() - started))


def _recall(url: str, embedder: Any, indexed: Any, queries: Sequence[str]) -> dict[str, float]:
    """Recall@10 of the index's whole-store answers against the exact ones (every vector
    scored: a repository that keeps them all in memory): ``keys``, the share of the
    exact ten the index found; ``scores``, the share of the index's ten scoring at least
    the exact tenth (where many messages tie, either of two equal ones is right)."""
    exact = open_repository(url, embedder=embedder, semantic_memory=4 * 1024**3)
    try:
        keys = scores = total = 0
        for query in queries:
            truth = exact.search(query, mode="semantic", limit=10)
            got = indexed.search(query, mode="semantic", limit=10)
            keys += len(
                {(h.session_id, h.seq) for h in truth} & {(h.session_id, h.seq) for h in got}
            )
            if truth:
                scores += sum(1 for h in got if h.rank >= truth[-1].rank - 1e-9)
            total += len(truth)
    finally:
        exact.close()
    if not total:
        return {"keys": 0.0, "scores": 0.0}
    return {"keys": round(keys / total, 3), "scores": round(scores / total, 3)}


def numpy_scan(messages: int) -> float:
    """p50 of the scan's arithmetic alone: an int8 matrix widened and multiplied, a chunk
    at a time, as the kept vectors are (over random vectors of the store's size)."""
    rng = np.random.default_rng(1)
    matrix = rng.integers(-127, 128, size=(messages, DIMENSION), dtype=np.int8)
    target = rng.standard_normal(DIMENSION).astype(np.float32)

    def scan() -> None:  # as sessionrepo.store.semantic scores: 256 rows at a time
        out = np.empty(messages, dtype=np.float32)
        buffer = np.empty((256, DIMENSION), dtype=np.float32)
        for start in range(0, messages, 256):
            chunk = matrix[start : start + 256]
            widened = buffer[: chunk.shape[0]]
            widened[...] = chunk
            np.matmul(widened, target, out=out[start : start + chunk.shape[0]])

    return round(statistics.median(_ms(scan) for _ in range(20)), 1)


def model_rate(messages: int) -> dict[str, Any]:
    """The default model's catch-up rate, on SQLite (``None``: not installed)."""
    embedder = default_embedder()
    if embedder is None:
        return {"model": None, "why": "the semantic extra is not installed"}
    with tempfile.TemporaryDirectory() as folder:
        repository = open_repository(f"sqlite:///{folder}/model.db", embedder=embedder)
        try:
            repository.append("warm", [{"role": "user", "content": "a first text loads the model"}])
            repository.catch_up_semantic_index()
            for start in range(0, messages, PER_SESSION):
                repository.append(
                    f"m{start}",
                    [
                        {"role": "user", "content": f"{TOPICS[i % len(TOPICS)]} ({i})"}
                        for i in range(start, min(messages, start + PER_SESSION))
                    ],
                )
            started = time.perf_counter()
            embedded = repository.catch_up_semantic_index()
            took = time.perf_counter() - started
        finally:
            repository.close()
    return {"model": embedder.name, "messages": embedded, "rate_per_s": round(embedded / took, 1)}


def extensions() -> dict[str, str]:
    found = {}
    version = _sqlite_vec_version()
    if version is not None:
        found["sqlite-vec"] = f"{version}, loaded"
    elif not hasattr(sqlite3.Connection, "enable_load_extension"):
        found["sqlite-vec"] = "not usable: Python's sqlite3 is built without enable_load_extension"
    else:
        found["sqlite-vec"] = "not loaded: the sqlite-vec package is not installed"
    return found


def _psql(database: str, sql: str) -> str:
    done = subprocess.run(
        [
            "psql",
            "-h",
            "127.0.0.1",
            "-U",
            "postgres",
            "-v",
            "ON_ERROR_STOP=1",
            "-Atc",
            sql,
            database,
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


def _without_index(database: str) -> Callable[[], None]:
    """Drop pgvector's index over the vectors (migration 0021's), and return what builds
    it again."""
    found = _psql(
        database,
        "SELECT indexname || '|' || indexdef FROM pg_indexes "
        "WHERE tablename = 'message_embeddings' AND indexdef LIKE '%USING hnsw%'",
    )
    if not found:
        raise SystemExit("--pgvector: the store has no pgvector index (is the extension 0.8+?)")
    name, definition = found.split("|", 1)
    _psql(database, f"DROP INDEX {name}")

    def rebuild() -> None:
        _psql(database, f"SET maintenance_work_mem = '2GB'; {definition}")

    return rebuild


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--model-messages", type=int, default=1_000)
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--postgres-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument(
        "--memory",
        type=int,
        default=None,
        help="semantic_memory= of the timed repositories, in bytes (default: theirs)",
    )
    parser.add_argument(
        "--pgvector",
        action="store_true",
        help="PostgreSQL: CREATE EXTENSION vector before migrating, so that the store has "
        "pgvector's index (migration 0021); needs the extension on the server",
    )
    parser.add_argument(
        "--vectors",
        choices=sorted(STAND_INS),
        default="hash",
        help="the stand-in embedder: a hash of each text, or a sum of its words' vectors",
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "semantic-scale.json")
    args = parser.parse_args(argv)
    results: dict[str, Any] = {
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cpus": os.cpu_count(),
        "load_average_before": [round(x, 1) for x in os.getloadavg()],
        "vectors": f"stand-in embedder ({args.vectors}, 512 dimensions: "
        + ("a hash of each text" if args.vectors == "hash" else "the sum of its words'")
        + "): the model is skipped for the scale run; its rate is model_rate",
        "extensions": extensions(),
    }
    backends = args.backends.split(",")
    if "sqlite" in backends:
        with tempfile.TemporaryDirectory() as folder:
            results["sqlite"] = run(
                f"sqlite:///{folder}/scale.db", args.messages, args.memory, vectors=args.vectors
            )
        print("sqlite", results["sqlite"], flush=True)
    if "postgresql" in backends:
        name = f"sessionrepo_semscale_{uuid.uuid4().hex[:8]}"
        base = args.postgres_url.rsplit("/", 1)[0]
        subprocess.run(["createdb", "-h", "127.0.0.1", "-U", "postgres", name], check=True)
        try:
            url = f"{base}/{name}"
            if args.pgvector:
                _psql(name, "CREATE EXTENSION vector")
            subprocess.run(
                ["sessionrepo", "migrate"],
                check=True,
                env={
                    "SESSIONREPO_DATABASE_URL": url,
                    "PATH": str(Path(__file__).resolve().parents[1] / ".venv" / "bin")
                    + ":/usr/bin:/bin",
                },
            )
            ann = (lambda: _without_index(name)) if args.pgvector else None
            results["postgresql"] = run(url, args.messages, args.memory, ann, args.vectors)
            extension = subprocess.run(
                [
                    "psql",
                    "-h",
                    "127.0.0.1",
                    "-U",
                    "postgres",
                    "-Atc",
                    "SELECT count(*) FROM pg_available_extensions WHERE name = 'vector'",
                    name,
                ],
                capture_output=True,
                text=True,
                check=False,
            ).stdout.strip()
            results["extensions"]["pgvector"] = (
                "available on the server" if extension == "1" else "not installed on the server"
            )
        finally:
            subprocess.run(["dropdb", "-h", "127.0.0.1", "-U", "postgres", name], check=True)
        print("postgresql", results["postgresql"], flush=True)
    results["numpy_scan_ms"] = numpy_scan(args.messages)
    if args.model_messages:
        results["model_rate"] = model_rate(args.model_messages)
    results["load_average_after"] = [round(x, 1) for x in os.getloadavg()]
    print(json.dumps({k: v for k, v in results.items() if k not in backends}), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
