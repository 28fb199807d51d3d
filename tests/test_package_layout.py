"""The package's folders hold their code in named modules: a package's ``__init__.py``
only says what the package is (a docstring) and re-exports (issue 23)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent / "repo"


def _code_in(source: str) -> list[str]:
    """What ``source`` holds beyond a docstring, imports and ``__all__``."""
    found = []
    for index, node in enumerate(ast.parse(source).body):
        if isinstance(node, ast.Import | ast.ImportFrom):
            continue
        if index == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, ast.AnnAssign)
            else []
        )
        if [ast.unparse(target) for target in targets] == ["__all__"]:
            continue
        found.append(f"line {node.lineno}: {type(node).__name__}")
    return found


INITS = sorted(REPO.rglob("__init__.py"))


@pytest.mark.parametrize("path", INITS, ids=lambda path: str(path.relative_to(REPO.parent)))
def test_an_init_only_re_exports(path: Path) -> None:
    assert _code_in(path.read_text()) == []


def test_the_check_sees_code() -> None:
    assert _code_in('"""Doc."""\nimport x\n__all__ = ["x"]\n') == []
    assert _code_in("def f() -> None: ...\n") == ["line 1: FunctionDef"]
    assert _code_in("import x\nx.setup()\n") == ["line 2: Expr"]
    assert _code_in("TIMEOUT = 3\n") == ["line 1: Assign"]
