"""From per-round results to the summary (medians, ratios to the raw driver, goals), and
from the summary to JSON and Markdown."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from bench import baseline
from bench.contenders import LABELS
from bench.runner import BackendRun, Config

BACKEND_NAMES = {"sqlite": "SQLite", "postgresql": "PostgreSQL"}


def _cells(config: Config) -> list[tuple[str, str, str]]:
    """(cell, row heading, unit) in table order."""
    rows = [
        (f"flush_{batch}", f"flush, {batch} message{'s' if batch > 1 else ''} per call", "rate")
        for batch in config.flush_calls
    ]
    size = f"{config.reflush_size:,}"
    rows += [
        ("first_write", f"first write of a {size}-message transcript (one call)", "rate"),
        ("reflush", f"re-flush of the same {size} messages (no-op path)", "rate"),
    ]
    rows += [
        (
            f"turn_{n}",
            f"turn flush: {n:,} stored + {config.turn_new} new, flushed whole (time per call)",
            "time",
        )
        for n in config.turn_sizes
    ]
    rows += [
        ("load", f"load a {config.load_size:,}-message transcript", "time"),
        ("list", f"list newest {config.list_limit} of {config.list_total:,} sessions", "time"),
    ]
    return rows


def _value(result: dict[str, Any], unit: str) -> float | None:
    seconds = result.get("seconds")
    if not seconds:
        return None
    if unit == "rate":
        return float(result["messages"]) / float(seconds)
    return float(seconds) * 1000.0


def summarize_cell(
    results: list[dict[str, Any]], raw: list[dict[str, Any]] | None, unit: str
) -> dict[str, Any]:
    """Median over the rounds, and the median of the per-round ratios to the raw driver
    (as speed: above 1 is faster than raw)."""
    for result in results:
        if "unsupported" in result:
            return {"unsupported": result["unsupported"]}
    errors = [result["error"] for result in results if "error" in result]
    values = [_value(result, unit) for result in results if "error" not in result]
    samples = [value for value in values if value is not None]
    if not samples:
        return {"error": errors[0] if errors else "no result"}
    summary: dict[str, Any] = {
        "value": statistics.median(samples),
        "unit": "msg/s" if unit == "rate" else "ms",
        "samples": [round(value, 3) for value in samples],
        "rounds": len(samples),
    }
    if errors:
        summary["failed_rounds"] = len(errors)
    ratios = []
    for index, result in enumerate(results):
        if raw is None or index >= len(raw):
            break
        mine, theirs = _value(result, unit), _value(raw[index], unit)
        if mine and theirs:
            ratios.append(mine / theirs if unit == "rate" else theirs / mine)
    if ratios:
        summary["ratio"] = statistics.median(ratios)
    good = [result for result in results if "error" not in result]
    if any(result.get("capped") for result in good):
        capped = [result for result in good if result.get("capped")]
        summary["capped_rounds"] = len(capped)
        summary["calls_done"] = statistics.median(result["calls"] for result in capped)
        summary["messages_done"] = statistics.median(result["messages"] for result in capped)
    if any(result.get("errors") for result in good):
        summary["raised"] = statistics.median(result["errors"] for result in good)
        summary["messages_done"] = statistics.median(result["messages"] for result in good)
    checks = [result["check"] for result in good if "check" in result]
    if checks and not any("unsupported" in check for check in checks):
        failed = [
            check for check in checks if not check["ok"] and not check.get("ok_but_stores_again")
        ]
        summary["checked_rounds"] = len(checks)
        if failed:
            worst = failed[0]
            summary["check_failed"] = (
                f"{len(failed)} of {len(checks)} round(s): "
                f"{worst.get('rows', 0):,} rows for {worst.get('sent', 0):,} sent, "
                f"{worst.get('missing', 0):,} "
                f"missing, {worst.get('unexpected', 0):,} unexpected, "
                f"{worst.get('duplicates', 0):,} stored twice, "
                f"{worst.get('misordered_sessions', 0)} "
                "session(s) out of order"
                + (f", {worst['parked']:,} parked" if worst.get("parked") else "")
            )
        elif any(check.get("ok_but_stores_again") for check in checks):
            last = checks[-1]
            summary["stores_again"] = {"rows": last["rows"], "sent": last["sent"]}
    return summary


def summarize(run: BackendRun, config: Config) -> dict[str, Any]:
    cells: dict[str, dict[str, Any]] = {}
    units = _units(config)
    for cell, by_key in run.cells.items():
        raw = by_key.get("raw")
        unit = units.get(cell, "rate")
        cells[cell] = {key: summarize_cell(results, raw, unit) for key, results in by_key.items()}
    for summary in cells.get("reflush", {}).values():
        if "value" not in summary:
            continue
        if summary.get("raised"):
            summary["idempotent"] = "raises"
        elif "check_failed" in summary:
            summary["idempotent"] = "check failed"
        elif "stores_again" in summary:
            summary["idempotent"] = "no"
        elif summary.get("checked_rounds"):
            summary["idempotent"] = "yes"
    return {
        "backend": run.backend,
        "contenders": {
            key: {"label": LABELS.get(key, key)} | run.info.get(key, {}) for key in run.contenders
        },
        "failed": run.failed,
        "setup": run.setup,
        "load_average_samples": [round(value, 2) for value in run.load_average],
        "seconds": round(run.seconds, 1),
        "source_sha256": run.source_sha256,
        "cells": cells,
        "rounds": dict(run.cells),
        # With --baseline: each contender against its twin on the other tree, per round.
        "baseline": baseline.compare(run.cells, units),
    }


#: Our contenders (a failure of these, a failed check included, fails the run).
OURS = (
    "raw",
    "raw-autocommit",
    "sessionrepo",
    "sessionrepo-dicts",
    "sessionrepo-async",
    "sessionrepo-immediate",
    "sessionrepo-noindex",
    "writer",
    "writer-drainer",
    # The framework backends (issue 17): sessionrepo's, so their checks fail the run too.
    "sessionrepo-openai-agents",
    "sessionrepo-adk",
    "sessionrepo-langchain",
)


def _units(config: Config) -> dict[str, str]:
    units = {cell: unit for cell, _, unit in _cells(config)}
    units |= {f"concurrency_{count}": "rate" for count in config.writers}
    return units


def pair_ratio(
    summary: dict[str, Any], cell: str, mine: str, theirs: str, unit: str
) -> float | None:
    """Median over rounds of ``mine``'s speed over ``theirs``' in the same round (above 1:
    ``mine`` is faster)."""
    by_key = summary["rounds"].get(cell, {})
    ratios = []
    for a, b in zip(by_key.get(mine, []), by_key.get(theirs, []), strict=False):
        if "error" in a or "error" in b:
            continue
        x, y = _value(a, unit), _value(b, unit)
        if x and y:
            ratios.append(x / y if unit == "rate" else y / x)
    return statistics.median(ratios) if ratios else None


def goals(summaries: list[dict[str, Any]], config: Config) -> list[dict[str, Any]]:
    """sessionrepo's figures against issue 25's goals (and issues 13's and 7's that still
    apply), every ratio computed from this run's rounds."""
    checks: list[dict[str, Any]] = []
    units = _units(config)

    def add(goal: str, measured: str, met: bool | None) -> None:
        checks.append({"goal": goal, "measured": measured, "met": met})

    def has(summary: dict[str, Any], cell: str, key: str) -> bool:
        return "value" in summary["cells"].get(cell, {}).get(key, {})

    for summary in summaries:
        backend = BACKEND_NAMES[summary["backend"]]
        keys = list(summary["contenders"])
        peers = [key for key in keys if key not in OURS and not baseline.is_baseline(key)]
        label = {key: summary["contenders"][key]["label"] for key in keys}

        # Our checks: plain-SQL counts against what was sent, and order.
        failed = [
            f"{label[key]} {cell}"
            for cell, by_key in summary["cells"].items()
            for key, value in by_key.items()
            if key in OURS and "check_failed" in value
        ]
        add(
            f"{backend}: every stored row counted with plain SQL equals what was sent, in "
            "sending order (our contenders, every write cell)",
            "all checks pass" if not failed else "failed: " + ", ".join(failed[:6]),
            not failed,
        )

        for key, what in (("sessionrepo", "append"), ("writer-drainer", "write, drainer running")):
            if key not in keys:
                continue
            cells = [
                c for c in ("flush_1", "flush_10", "flush_100", "load") if has(summary, c, key)
            ]
            behind, margins = [], []
            for cell in cells:
                for peer in peers:
                    if not has(summary, cell, peer):
                        continue
                    ratio = pair_ratio(summary, cell, key, peer, units[cell])
                    if ratio is None:
                        continue
                    margins.append((ratio, cell, peer))
                    if ratio <= 1.0:
                        behind.append(f"{label[peer]} at {cell} ({ratio:.2f}×)")
            if margins:
                low = min(margins)
                add(
                    f"{backend}: {what} ahead of every peer in every cell ({', '.join(cells)})",
                    ("behind " + "; ".join(behind))
                    if behind
                    else f"ahead; closest: {low[0]:.2f}× {label[low[2]]} at {low[1]}",
                    not behind,
                )

        if "sessionrepo-dicts" in keys:
            ratios = {
                cell: pair_ratio(summary, cell, "sessionrepo-dicts", "sessionrepo", "rate")
                for cell in ("flush_1", "flush_100")
            }
            known = {c: r for c, r in ratios.items() if r is not None}
            if known:
                add(
                    f"{backend}: the dict path (validation timed) within 15 % of `Message` objects",
                    ", ".join(f"{c}: {r:.2f}×" for c, r in known.items()),
                    all(r >= 0.85 for r in known.values()),
                )

        floors = {"postgresql": (0.7, 1.0), "sqlite": (0.7, 0.85)}[summary["backend"]]
        for cell, floor in (("flush_1", floors[0]), ("flush_100", floors[1])):
            value = summary["cells"].get(cell, {}).get("sessionrepo", {})
            if "ratio" in value:
                per = "one message" if cell == "flush_1" else "100 messages"
                add(
                    f"{backend}: append, {per} per call ≥ {floor}× raw",
                    f"{value['ratio']:.2f}×",
                    value["ratio"] >= floor,
                )

        def relative(
            mine: str,
            theirs: str,
            cells: tuple[str, ...],
            floor: float,
            goal: str,
            *,
            summary: dict[str, Any] = summary,
            backend: str = backend,
        ) -> None:
            if mine not in summary["contenders"] or theirs not in summary["contenders"]:
                return
            found = {
                cell: pair_ratio(summary, cell, mine, theirs, units[cell])
                for cell in cells
                if cell in units
            }
            known = {c: r for c, r in found.items() if r is not None}
            if known:
                add(
                    f"{backend}: {goal}",
                    ", ".join(f"{c}: {r:.2f}×" for c, r in known.items()),
                    all(r >= floor for r in known.values()),
                )

        relative(
            "writer",
            "sessionrepo",
            ("flush_1", "flush_10", "flush_100"),
            0.9,
            "`TranscriptWriter.write` within 10 % of `append` (speed ratio ≥ 0.9)",
        )
        relative(
            "writer-drainer",
            "sessionrepo",
            ("flush_1", "flush_10", "flush_100"),
            0.9,
            "`TranscriptWriter.write`, drainer running, within 10 % of `append` (≥ 0.9)",
        )
        for key, what, most in (
            ("sessionrepo-dicts", "as wire dicts (`load_openai`)", 1.2),
            ("sessionrepo", "as `StoredMessage` objects (`load_transcript`)", 1.6),
        ):
            value = summary["cells"].get("load", {}).get(key, {})
            if "ratio" in value:
                add(
                    f"{backend}: load of {config.load_size:,} messages {what} ≤ {most}× raw's time",
                    f"{1 / value['ratio']:.2f}× raw's time",
                    1 / value["ratio"] <= most,
                )
        big = max((n for n in config.turn_sizes if n <= 1000), default=None)
        turn_cells = tuple(f"turn_{n}" for n in config.turn_sizes)
        relative(
            "writer-drainer",
            "writer",
            ("flush_1", "flush_10", "flush_100", "reflush", *turn_cells),
            0.9,
            "a running drainer costs ≤ 10 % of write throughput, re-flush included "
            "(drainer / no drainer ≥ 0.9)",
        )
        if big and big != 10:
            for key in ("sessionrepo", "writer", "writer-drainer"):
                if key not in keys:
                    continue
                rounds = summary["rounds"]
                small = rounds.get("turn_10", {}).get(key, [])
                large = rounds.get(f"turn_{big}", {}).get(key, [])
                growth = [
                    b["seconds"] / a["seconds"]
                    for a, b in zip(small, large, strict=False)
                    if a.get("seconds") and b.get("seconds")
                ]
                if growth:
                    g = statistics.median(growth)
                    add(
                        f"{backend}: {label[key]}, turn flush at n = {big:,} ≤ 1.5× its cost "
                        "at n = 10" + ("" if big == 1000 else " (smaller n in this mode)"),
                        f"{g:.2f}×",
                        g <= 1.5,
                    )
        relative(
            "sessionrepo-async",
            "sessionrepo",
            ("flush_1", "flush_100", "load"),
            0.85,
            "async within 15 % of sync (speed ratio ≥ 0.85)",
        )
        first = summary["cells"].get("first_write", {}).get("sessionrepo", {})
        again = summary["cells"].get("reflush", {}).get("sessionrepo", {})
        if "value" in first and "value" in again:
            add(
                f"{backend}: re-flush of a stored transcript faster than its first write",
                f"{again['value'] / first['value']:.1f}× the first write's rate",
                again["value"] > first["value"],
            )
        single = summary["cells"].get("concurrency_1", {}).get("sessionrepo", {})
        four = summary["cells"].get("concurrency_4", {}).get("sessionrepo", {})
        if "value" in single and "value" in four:
            add(
                f"{backend}: 4 writer processes ≥ 2.5× one",
                f"{four['value'] / single['value']:.2f}×",
                four["value"] / single["value"] >= 2.5,
            )
    if summaries:
        add(
            "frozen primary: after the first timeout, p99 write latency ≤ 50 ms until it recovers",
            "not measured by `make bench` (the outage tests and their own measurement)",
            None,
        )
    return checks


# -- Markdown -----------------------------------------------------------------------------


def _number(value: float, unit: str) -> str:
    if unit == "msg/s":
        return f"{value:,.0f}/s"
    return f"{value:,.1f} ms" if value < 100 else f"{value:,.0f} ms"


def _cell_text(cell: str, summary: dict[str, Any], info: dict[str, Any], rounds: int) -> str:
    if "unsupported" in summary:
        return f"— ({summary['unsupported']})"
    if "error" in summary:
        return f"failed: {summary['error'][:80]}"
    text = _number(summary["value"], summary["unit"])
    if "ratio" in summary:
        text += f" · **{summary['ratio']:.2f}×**"
    notes = []
    if not info.get("batch_api", True) and cell not in ("flush_1", "load", "list"):
        notes.append("one call per message")
    if "check_failed" in summary:
        notes.append(f"**CHECK FAILED**: {summary['check_failed']}")
    elif summary.get("idempotent") == "raises":
        notes.append(f"not idempotent: raises on each of {summary['raised']:,.0f} messages")
    elif "stores_again" in summary:
        again = summary["stores_again"]
        notes.append(f"stores again: {again['rows']:,} rows for {again['sent']:,} sent")
    elif summary.get("idempotent") == "yes":
        notes.append("no-op ✓")
    elif summary.get("checked_rounds"):
        notes.append("✓")
    done = summary.get("rounds", 0)
    if done < rounds and not summary.get("failed_rounds"):
        notes.append(f"{done} round{'s' if done > 1 else ''}: one call outlasts the cap")
    if summary.get("failed_rounds"):
        notes.append(f"failed in {summary['failed_rounds']} round(s)")
    if summary.get("capped_rounds"):
        notes.append(
            f"capped† in {summary['capped_rounds']} of {done} rounds, after "
            f"{summary['messages_done']:,.0f} messages"
        )
    if notes:
        text += " (" + "; ".join(notes) + ")"
    return text


def _durability(info: dict[str, Any]) -> str:
    settings = info.get("settings", {})
    if "synchronous" in settings:
        return f"WAL, synchronous={settings['synchronous']} ({settings.get('driver', '?')})"
    if "synchronous_commit" in settings:
        return (
            f"synchronous_commit={settings['synchronous_commit']} ({settings.get('driver', '?')})"
        )
    return "?"


def markdown(document: dict[str, Any]) -> str:
    machine = document["machine"]
    config = document["config"]
    lines = [
        f"# sessionrepo benchmark ({document['mode']})",
        "",
        f"Measured {machine['date']} on {machine['nproc']} cores ({machine['cpu']}), "
        f"{machine['memory']} memory, {machine['os']}; Python {machine['python']}, "
        f"SQLite {machine['sqlite']}"
        + (
            f", PostgreSQL {machine['postgresql'].get('version', '?')}"
            if "postgresql" in machine
            else ""
        )
        + f"; sessionrepo at {machine['sessionrepo_commit']}, source sha256 "
        f"{machine.get('sessionrepo_source_sha256', '?')}.",
        "",
        f"Median of {config['rounds']} round(s), contenders interleaved (each round starts with "
        "a different one). **Bold** is the ratio to the raw driver on the same backend, as "
        "speed (above 1 is faster than raw), the median of the per-round ratios. "
        f"† capped: a contender still running a cell after {config['cap']} s stops there; "
        "its rate is over what it did.",
        "",
    ]
    load = document["load_average"]
    lines += [
        f"Load average (1 min) during the run: min {load['min']:.2f}, median "
        f"{load['median']:.2f}, max {load['max']:.2f} (the machine was "
        f"{'shared' if load['max'] > 0.5 else 'otherwise idle'}). Whole run: "
        f"{document['seconds']:.0f} s.",
        "",
    ]
    cells = document["cells"]
    for summary in document["backends"]:
        backend = summary["backend"]
        keys = list(summary["contenders"])
        labels = [summary["contenders"][key]["label"] for key in keys]
        lines += [f"## {BACKEND_NAMES[backend]}", ""]
        source = summary.get("source_sha256")
        if source and source != machine.get("sessionrepo_source_sha256"):
            lines += [
                f"(The library's source changed before this backend started: sha256 {source}.)",
                "",
            ]
        lines.append("| step | " + " | ".join(labels) + " |")
        lines.append("|---|" + "---:|" * len(keys))
        for cell, heading, _ in cells:
            if cell not in summary["cells"]:
                continue
            row = [
                _cell_text(
                    cell,
                    summary["cells"][cell].get(key, {"error": "not run"}),
                    summary["contenders"][key],
                    config["rounds"],
                )
                if key not in summary["failed"] or key in summary["cells"][cell]
                else f"failed: {summary['failed'][key][:60]}"
                for key in keys
            ]
            lines.append(f"| {heading} | " + " | ".join(row) + " |")
        lines.append(
            "| durability | "
            + " | ".join(_durability(summary["contenders"][key]) for key in keys)
            + " |"
        )
        lines.append("")
        concurrency = [cell for cell in summary["cells"] if cell.startswith("concurrency_")]
        if concurrency:
            writers = [key for key in keys if any(key in summary["cells"][c] for c in concurrency)]
            lines += [
                f"Concurrency: N writer processes, each appending {config['writer_calls']} calls "
                f"of {config['writer_batch']} messages to sessions of its own, started together; "
                "messages/s over the whole (first start to last finish); ×1 is the scaling "
                "over one writer.",
                "",
                "| writers | "
                + " | ".join(summary["contenders"][key]["label"] for key in writers)
                + " |",
                "|---|" + "---:|" * len(writers),
            ]
            for cell in concurrency:
                count = cell.split("_")[1]
                row = []
                for key in writers:
                    value = summary["cells"][cell].get(key, {})
                    if "value" not in value:
                        row.append(value.get("error", "—"))
                        continue
                    one = summary["cells"].get("concurrency_1", {}).get(key, {}).get("value")
                    text = _number(value["value"], "msg/s")
                    if "ratio" in value:
                        text += f" · **{value['ratio']:.2f}×**"
                    if one:
                        text += f" · {value['value'] / one:.2f}× one writer"
                    row.append(text)
                lines.append(f"| {count} | " + " | ".join(row) + " |")
            lines.append("")
        for key, reason in summary["failed"].items():
            lines.append(f"- {summary['contenders'][key]['label']}: failed ({reason})")
        if summary["failed"]:
            lines.append("")
    if document["goals"]:
        lines += ["## sessionrepo against the issue's goals", "", "| goal | measured | met |"]
        lines.append("|---|---|---|")
        for check in document["goals"]:
            mark = "—" if check["met"] is None else "✓" if check["met"] else "✗ missed"
            lines.append(f"| {check['goal']} | {check['measured']} | {mark} |")
        lines.append("")
    if document.get("profile"):
        lines += [
            "## Where one 1-message append's time goes",
            "",
            "`python -m bench.profile --budget` per backend, after the rounds, on a fresh "
            "database (method: `bench/budget.py`). PostgreSQL's statements and round trips "
            "are read from libpq's own protocol trace, so psycopg's implicit `BEGIN` and "
            "anything pipelined or prepared are seen; SQLite's from `sqlite3`'s trace "
            "callback. The Python part is split by cProfile's shares (which inflate code "
            "made of many small calls). The raw yardsticks are traced the same way.",
            "",
        ]
        for text in document["profile"].values():
            lines += [text.strip(), ""]
    workload = document["workload"]
    lines += [
        "## Workload",
        "",
        f"OpenAI chat-format dicts, each stamped with a `client_msg_uuid` when made (seed "
        f"{config['seed']}): mean {workload['mean_bytes']:,} B, median "
        f"{workload['median_bytes']:,} B, p99 {workload['p99_bytes']:,} B, max "
        f"{workload['max_bytes']:,} B as JSON; {workload['with_tool_calls']:.1%} with tool "
        f"calls; {workload['outputs_of_100kb']} tool outputs of 100 KB in "
        f"{workload['messages_sampled']:,} messages. Flush calls go round "
        f"{config['sessions']} sessions ("
        + ", ".join(f"{calls} calls of {batch}" for batch, calls in config["flush_calls"].items())
        + " per round). The load and list steps read data seeded before the rounds: the "
        "transcript through each contender's own fastest write path (ADK: its ORM rows in one "
        "transaction), the sessions by bulk SQL in each contender's schema (so that each has "
        f"{config['list_total']:,}).",
        "",
        "## How each contender is used",
        "",
    ]
    seen = set()
    for summary in document["backends"]:
        for key, info in summary["contenders"].items():
            if key in seen or not info.get("usage"):
                continue
            seen.add(key)
            versions = ", ".join(
                f"{name} {version}" for name, version in info.get("versions", {}).items()
            )
            lines.append(f"- **{info['label']}** ({versions}): {info['usage']}")
    lines += [
        "",
        "## Versions",
        "",
        ", ".join(f"{name} {version}" for name, version in machine["versions"].items()),
        "",
    ]
    if "postgresql" in machine:
        pg = machine["postgresql"]
        lines += [
            "PostgreSQL settings: "
            + ", ".join(f"{name}={value}" for name, value in pg.items() if name != "version"),
            "",
        ]
    for summary in document["backends"]:
        lines += baseline.markdown(summary["backend"], summary.get("baseline", []))
    lines += ["", f"Reproduce: `{document['command']}`", ""]
    return "\n".join(lines)


def document(
    *,
    mode: str,
    command: str,
    machine: dict[str, Any],
    workload: dict[str, Any],
    config: Config,
    config_values: dict[str, Any],
    runs: list[BackendRun],
    seconds: float,
    profile: dict[str, str] | None = None,
) -> dict[str, Any]:
    summaries = [summarize(run, config) for run in runs]
    samples = [value for run in runs for value in run.load_average] or [0.0]
    return {
        "mode": mode,
        "command": command,
        "machine": machine,
        "workload": workload,
        "config": config_values,
        "seconds": round(seconds, 1),
        "load_average": {
            "min": min(samples),
            "median": statistics.median(samples),
            "max": max(samples),
        },
        "cells": _cells(config),
        "backends": summaries,
        "goals": goals(summaries, config),
        "profile": profile or {},
    }


def write(document_: dict[str, Any], directory: Path, name: str) -> tuple[Path, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    json_path = directory / f"{name}.json"
    md_path = directory / f"{name}.md"
    json_path.write_text(json.dumps(document_, indent=1, default=str) + "\n")
    md_path.write_text(markdown(document_))
    return json_path, md_path


def _from_json(path: Path) -> dict[str, Any]:
    """The document again from a results file, summaries recomputed from its rounds."""
    stored = json.loads(path.read_text())
    values = dict(stored["config"])
    values["flush_calls"] = {int(key): value for key, value in values["flush_calls"].items()}
    values["writers"] = tuple(values["writers"])
    values["turn_sizes"] = tuple(values.get("turn_sizes", ()))
    values["steps"] = tuple(values["steps"])
    values["cap"] = values["cap"] if values["cap"] is not None else float("inf")
    config = Config(**values)
    runs = []
    for backend in stored["backends"]:
        contenders = backend["contenders"]
        runs.append(
            BackendRun(
                backend=backend["backend"],
                contenders=list(contenders),
                info={
                    key: {name: value for name, value in info.items() if name != "label"}
                    for key, info in contenders.items()
                },
                cells=backend["rounds"],
                setup=backend["setup"],
                failed=backend["failed"],
                load_average=backend["load_average_samples"],
                seconds=backend["seconds"],
                source_sha256=backend.get("source_sha256"),
            )
        )
    return document(
        mode=stored["mode"],
        command=stored["command"],
        machine=stored["machine"],
        workload=stored["workload"],
        config=config,
        config_values=stored["config"],
        runs=runs,
        seconds=stored["seconds"],
        profile=stored.get("profile"),
    )


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.report RESULTS.json``: write its Markdown again (after a change to
    this module), from the rounds the file holds."""
    import sys

    paths = [Path(arg) for arg in (sys.argv[1:] if argv is None else argv)]
    if not paths:
        print("usage: python -m bench.report RESULTS.json [...]", file=sys.stderr)
        return 2
    for path in paths:
        document_ = _from_json(path)
        write(document_, path.parent, path.stem)
        print(f"rewrote {path.with_suffix('.md')} (and {path.name})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
