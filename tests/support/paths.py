"""Where the project's files are, whichever folder of ``tests/`` a module lives in."""

from __future__ import annotations

from pathlib import Path

#: The project's root: ``pyproject.toml``, ``README.md``, ``repo/``, ``models/``.
ROOT = Path(__file__).resolve().parents[2]
