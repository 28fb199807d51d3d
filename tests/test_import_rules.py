"""tools/import_rules.py, the rules ``make lint`` runs (public API, frozen migrations,
third parties' privates in shims): each kind of violation is found, and what the rules
allow (a package's own privates, ``self._x``, dunders, a framework's privates to the
public-API rule, a shim's uses) is not reported."""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _load() -> ModuleType:
    # tools/ is not a package anyone installs: loaded from its file.
    spec = importlib.util.spec_from_file_location("import_rules", ROOT / "tools/import_rules.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


rules = _load()

#: A miniature tree: a store with privates, a private models module, an entry point.
TREE = {
    "repo/__init__.py": '__all__ = ["open_repository"]\nfrom sessionrepo.store.repository'
    " import open_repository\n",
    "repo/store/__init__.py": "",
    "repo/store/repository.py": """
        class SessionRepository:
            def __init__(self):
                self._calls = None
            def _append(self, conn): ...
            def append(self): ...
        def open_repository(): ...
        _RETRIES = 3
    """,
    "repo/store/database.py": "class Database: ...\n",
    "repo/aio/__init__.py": "",
    "repo/aio/api.py": """
        class AsyncSessionRepository:
            def __init__(self, sync):
                self._sync = sync
    """,
    "repo/integrations/__init__.py": "",
    "repo/integrations/langchain.py": """
        class History:
            def __init__(self):
                self._sync = None
    """,
    "repo/search/__init__.py": '__all__ = ["parse_query"]\ndef parse_query(): ...\n',
    "repo/search/query.py": "def parse_query(): ...\n",
    "models/__init__.py": "",
    "models/_limits.py": "def check_text(): ...\n",
    "bench/__init__.py": "",
    # The bench's own privates are not sessionrepo's.
    "bench/contenders.py": "class Contender:\n    def __init__(self):\n        self._held = 1\n",
}


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp("tree")
    for name, text in TREE.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(textwrap.dedent(text))
    return rules.build_index(root)


def _found(index: Any, code: str, module: str = "sessionrepo.integrations.adk") -> list[str]:
    found = rules.public_api_violations(index, textwrap.dedent(code), "x.py", module)
    return [violation.message for violation in found]


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (
            "from sessionrepo.store.repository import _RETRIES",
            "imports the private name _RETRIES from sessionrepo.store.repository",
        ),
        (
            "from sessionrepo.models._limits import check_text",
            "imports check_text from the private module sessionrepo.models._limits",
        ),
        ("import sessionrepo.models._limits", "imports the private module"),
        (
            "from ..models._limits import check_text",  # relative to sessionrepo.integrations
            "imports check_text from the private module sessionrepo.models._limits",
        ),
        (
            "from sessionrepo.store.repository import SessionRepository\n"
            "SessionRepository._append(None, None)",
            "reads the private _append of sessionrepo.store.repository.SessionRepository",
        ),
        (
            "from sessionrepo.store import repository as r\nr._RETRIES",
            "reads the private _RETRIES of sessionrepo.store.repository._RETRIES",
        ),
        ("def f(repo):\n    return repo._append(None)", "reads _append, a private of another"),
        ("def f(repo):\n    return repo.x._calls.call()", "reads _calls, a private of another"),
        ("def f(repo):\n    return getattr(repo, '_append')", "reads _append, a private"),
        # The async repository's _sync, though a sibling module of the same package has a
        # _sync of its own: reported where this module does not define it.
        ("def f(repo):\n    return repo._sync", "reads _sync, a private of another"),
    ],
)
def test_a_private_of_another_package_is_reported(index: Any, code: str, expected: str) -> None:
    [message] = _found(index, code)
    assert message.startswith(expected), message


@pytest.mark.parametrize(
    "code",
    [
        "from sessionrepo.store.repository import SessionRepository, open_repository",
        "from sessionrepo.store.repository import SessionRepository as _Repo",
        # This module's own privates, on self, cls or any object.
        "class A:\n    def __init__(self):\n        self._append = 1\n"
        "    def f(self, other):\n        return self._append, other._append",
        "class A:\n    @classmethod\n    def f(cls):\n        return cls._calls",
        # Dunders and the throwaway name.
        "def f(repo):\n    return repo.__class__.__name__, repo.__dict__, repo._",
        # A framework's private, which no sessionrepo package defines.
        "def f(session):\n    session._storage_update_marker = None",
        "import os\nos._exit",
        "def f(contender):\n    return contender._held",  # the bench's, not sessionrepo's
        # The own package's private module.
        "from sessionrepo.integrations._shared import x\nx._y",
    ],
)
def test_what_the_rule_allows_is_not_reported(index: Any, code: str) -> None:
    assert _found(index, code) == []


def test_the_bench_imports_only_what_a_module_or_package_exports(index: Any) -> None:
    code = """
        from sessionrepo import open_repository
        from sessionrepo.search import parse_query
        from sessionrepo.store.database import Database
        from sessionrepo.search.query import parse_query as parse
        import sessionrepo.store.database
        from bench.contenders import _private_of_the_bench
    """
    assert _found(index, code, module="bench.citus") == [
        "imports Database from sessionrepo.store.database, which does not export it",
        "imports parse_query from sessionrepo.search.query, which does not export it",
        "imports sessionrepo.store.database, which declares no public names",
    ]
    # Inside the package, a public name of an internal module is fine.
    assert _found(index, code) == []


def test_a_migration_importing_the_library_is_reported() -> None:
    code = """
        import sqlalchemy as sa
        from alembic import op
        from sessionrepo.dialects.citus import distribute_schema
        import models.tables
        from . import helpers
    """
    found = rules.migration_violations(textwrap.dedent(code), "0099_x.py")
    assert [(v.line, v.message) for v in found] == [
        (4, "a migration imports library code (sessionrepo.dialects.citus)"),
        (5, "a migration imports library code (models.tables)"),
        (6, "a migration imports library code (.)"),
    ]


def test_the_report_fails_on_a_new_violation_and_on_a_known_one_fixed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name, text in TREE.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(textwrap.dedent(text))
    (tmp_path / "migrations/versions").mkdir(parents=True)
    (tmp_path / "migrations/versions/0001_a.py").write_text("from alembic import op\n")
    assert rules.report(rules.check(tmp_path), frozenset()) == 0
    (tmp_path / "bench/run.py").write_text("from sessionrepo.models._limits import check_text\n")
    capsys.readouterr()
    assert rules.report(rules.check(tmp_path), frozenset()) == 1
    violation = (
        "bench/run.py: imports check_text from the private module sessionrepo.models._limits"
    )
    assert capsys.readouterr().out == violation.replace(": ", ":1: ", 1) + "\n"
    # Known (on the list of those being fixed): tolerated; once fixed, the list must shrink.
    assert rules.report(rules.check(tmp_path), frozenset({violation})) == 0
    (tmp_path / "bench/run.py").unlink()
    capsys.readouterr()
    assert rules.report(rules.check(tmp_path), frozenset({violation})) == 1
    assert "fixed, so delete it from KNOWN" in capsys.readouterr().out


def test_a_third_party_private_is_reported_outside_a_compat_shim(index: Any) -> None:
    code = """
        def run(driver, row, repo, session):
            driver._execute(len, driver._queue)
            session._marker = None  # writing someone's private defines nothing of ours
            getattr(driver, "_pre_ping", False)
            return row._mapping, row._asdict(), repo._append, driver.__class__
    """

    def found(path: str) -> list[tuple[int, str]]:
        violations = rules.third_party_violations(index, textwrap.dedent(code), path)
        return [(v.line, v.message.split(",")[0]) for v in violations]

    assert sorted(found("repo/dialects/sqlite.py")) == [
        (3, "uses _execute"),
        (3, "uses _queue"),
        (4, "uses _marker"),
        (5, "uses _pre_ping"),
    ]
    assert found("repo/dialects/aiosqlite_compat.py") == []
