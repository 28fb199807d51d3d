"""The importers and the demo are built on sessionrepo's public names only: nothing they
import from another package of sessionrepo is private (a ``_name``, or a name from a
``_module``), so a change behind the store's public API cannot break them unseen."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2] / "repo"
#: The packages checked, each free to use its own private names.
PACKAGES = ("importers", "demo")


def private_imports(path: Path, own: str) -> list[str]:
    """What ``path`` imports privately from outside its own package ``own``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ImportFrom) or not (node.module or "").startswith(
            "sessionrepo"
        ):
            continue
        module = node.module or ""
        if module == own or module.startswith(own + "."):
            continue
        names = [alias.name for alias in node.names]
        if any(part.startswith("_") for part in module.split(".")):
            found.append(f"line {node.lineno}: from {module}")
        found += [
            f"line {node.lineno}: {name} from {module}" for name in names if name.startswith("_")
        ]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [
                f"line {node.lineno}: import {alias.name}"
                for alias in node.names
                if alias.name.startswith("sessionrepo")
                and any(part.startswith("_") for part in alias.name.split("."))
            ]
    return found


FILES = sorted(path for package in PACKAGES for path in (REPO / package).rglob("*.py"))


@pytest.mark.parametrize("path", FILES, ids=lambda path: str(path.relative_to(REPO.parent)))
def test_only_public_names_of_other_packages(path: Path) -> None:
    parts = path.relative_to(REPO).parts
    # A module's own package: sessionrepo.importers.hermes for the Hermes importer.
    own = ".".join(["sessionrepo", *parts[:-1]])
    assert private_imports(path, own) == []


def test_the_check_sees_a_private_import(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "from sessionrepo.models._limits import check_text\n"
        "from sessionrepo.store.repository import _activity\n"
        "from sessionrepo.importers.hermes.keys import _private\n"
        "import sessionrepo.store._secret\n"
        "from sessionrepo.models import Message\n"
    )
    assert private_imports(module, "sessionrepo.importers.hermes") == [
        "line 1: from sessionrepo.models._limits",
        "line 2: _activity from sessionrepo.store.repository",
        "line 4: import sessionrepo.store._secret",
    ]
