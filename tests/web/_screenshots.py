"""What the README's screenshots were taken from: the SHA-256 of every template, static
file and migration (the pages' look and the schema revision they show), and of each
picture, in ``docs/screenshots.json`` beside them. ``make screenshots`` writes it; a test
fails when the pages or the schema changed since."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Final

ROOT: Final = Path(__file__).resolve().parents[2]
DOCS: Final = ROOT / "docs"
MANIFEST: Final = DOCS / "screenshots.json"
#: The files the pictures depend on, relative to the repository.
INPUT_GLOBS: Final = (
    "repo/web/templates/*.html",
    "repo/web/static/*",
    "migrations/versions/[0-9]*.py",
)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def inputs() -> dict[str, str]:
    """Each input file's path and SHA-256, sorted by path."""
    found = {p for pattern in INPUT_GLOBS for p in ROOT.glob(pattern) if p.is_file()}
    return {str(p.relative_to(ROOT)): _digest(p) for p in sorted(found)}


def pictures(names: list[str]) -> dict[str, str]:
    return {name: _digest(DOCS / name) for name in sorted(names)}


def write_manifest(names: list[str]) -> None:
    manifest = {"inputs": inputs(), "screenshots": pictures(names)}
    MANIFEST.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def read_manifest() -> dict[str, dict[str, str]]:
    loaded: dict[str, dict[str, str]] = json.loads(MANIFEST.read_text())
    return loaded
