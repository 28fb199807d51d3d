"""``python -m bench --baseline PATH``: this tree's sessionrepo against another checkout's, in
one interleaved run.

Each sessionrepo contender gets a twin, ``<key>-baseline``, that runs the same contender
code (this tree's bench) on the package from ``PATH`` (a checkout of another commit, e.g.
``git worktree add /tmp/before main``): its worker process imports ``sessionrepo`` from a
copy of ``PATH``'s source folders laid out as its ``pyproject.toml`` installs them, before
anything else can import it. Every dependency is this environment's, so the package is the
only difference. The twins are ordinary contenders to the runner: each round rotates the
order of all of them, so drift in the machine's load falls on both trees alike, and the
report pairs each round's figure with its twin's.
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tomllib
from pathlib import Path
from typing import Any, Final

SUFFIX: Final = "-baseline"


def twin(key: str) -> str:
    return key + SUFFIX


def is_baseline(key: str) -> bool:
    return key.endswith(SUFFIX)


def base_key(key: str) -> str:
    """The contender a key runs (a twin runs its original's code)."""
    return key.removesuffix(SUFFIX)


def build_tree(checkout: Path, into: Path) -> Path:
    """``checkout``'s package as its pyproject installs it (``[tool.setuptools.package-dir]``:
    source folder -> package), copied under ``into``; returns the directory to put first on
    ``sys.path``."""
    project = tomllib.loads((checkout / "pyproject.toml").read_text())
    mapping: dict[str, str] = project["tool"]["setuptools"]["package-dir"]
    # Parents before the packages inside them (sessionrepo before sessionrepo.models).
    for package, folder in sorted(mapping.items(), key=lambda item: item[0].count(".")):
        target = into.joinpath(*package.split("."))
        shutil.copytree(
            checkout / folder,
            target,
            dirs_exist_ok=True,
            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
        )
    return into


def use_tree(tree: str) -> None:
    """In a worker process, before any contender code runs: ``sessionrepo`` from ``tree``."""
    if any(name == "sessionrepo" or name.startswith("sessionrepo.") for name in sys.modules):
        raise RuntimeError("sessionrepo was imported before the baseline tree was put first")
    sys.path.insert(0, tree)
    import sessionrepo

    if not str(Path(sessionrepo.__file__ or "").resolve()).startswith(str(Path(tree).resolve())):
        raise RuntimeError(f"sessionrepo came from {sessionrepo.__file__}, not from {tree}")


def _speed(result: dict[str, Any], unit: str) -> float | None:
    seconds = result.get("seconds")
    if not seconds or "error" in result or "unsupported" in result:
        return None
    if unit == "rate":
        return float(result["messages"]) / float(seconds)
    return 1.0 / float(seconds)


def compare(
    rounds: dict[str, dict[str, list[dict[str, Any]]]], units: dict[str, str]
) -> list[dict[str, Any]]:
    """Per cell and twin pair: the per-round speed ratios (this tree over the baseline,
    above 1 is faster), their median, and whether this tree was slower in every round (a
    sign test: with n rounds, by chance alone 1 in 2**n)."""
    rows = []
    for cell, by_key in rounds.items():
        for key, results in by_key.items():
            if is_baseline(key) or twin(key) not in by_key:
                continue
            unit = units.get(cell, "rate")
            ratios = []
            for mine, theirs in zip(results, by_key[twin(key)], strict=False):
                now, before = _speed(mine, unit), _speed(theirs, unit)
                if now and before:
                    ratios.append(now / before)
            if ratios:
                rows.append(
                    {
                        "cell": cell,
                        "contender": key,
                        "ratios": [round(ratio, 3) for ratio in ratios],
                        "median": round(statistics.median(ratios), 3),
                        "slower_every_round": len(ratios) >= 3 and max(ratios) < 1.0,
                    }
                )
    return rows


def markdown(backend: str, rows: list[dict[str, Any]]) -> list[str]:
    """The comparison table of one backend."""
    if not rows:
        return []
    lines = [
        "",
        f"### {backend}: this tree against the baseline (speed ratio, above 1 is faster)",
        "",
        "| cell | contender | median | per round | |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        mark = "slower in every round ✗" if row["slower_every_round"] else ""
        per_round = ", ".join(f"{ratio:.2f}" for ratio in row["ratios"])
        lines.append(
            f"| {row['cell']} | {row['contender']} | {row['median']:.2f} | {per_round} | {mark} |"
        )
    return lines
