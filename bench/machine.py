"""What the figures were measured on."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import os
import platform
import sqlite3
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.databases import postgres_settings

#: Versions recorded for every run (peers show "not installed" when absent).
PACKAGES = (
    "sessionrepo",
    "sqlalchemy",
    "pydantic",
    "psycopg",
    "psycopg-binary",
    "alembic",
    "openai-agents",
    "google-adk",
    "google-genai",
    "langchain-community",
    "langchain-core",
    "asyncpg",
    "aiosqlite",
    "greenlet",
)


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _memory() -> str:
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                kib = int(line.split()[1])
                return f"{kib / 1024 / 1024:.1f} GiB"
    return "unknown"


def _git() -> str:
    root = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{commit}{' (with uncommitted changes)' if dirty else ''}"


def source_digest() -> str:
    """A short hash of the library's source as measured (the tree may be mid-change)."""
    root = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256()
    for folder in ("models", "repo", "migrations"):
        for path in sorted((root / folder).rglob("*.py")):
            digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def versions() -> dict[str, str]:
    found = {}
    for name in PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = "not installed"
    return found


def describe(postgres_url: str | None) -> dict[str, Any]:
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    machine: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "nproc": affinity or os.cpu_count(),
        "cpu": _cpu_model(),
        "memory": _memory(),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "sessionrepo_commit": _git(),
        "sessionrepo_source_sha256": source_digest(),
        "versions": versions(),
        "load_average_at_start": [round(value, 2) for value in os.getloadavg()],
    }
    if postgres_url:
        try:
            machine["postgresql"] = postgres_settings(postgres_url)
        except Exception as exc:  # shown in the results; the run goes on without it
            machine["postgresql"] = {"error": str(exc).strip().splitlines()[0]}
    return machine
