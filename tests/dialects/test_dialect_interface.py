"""The dialect interface: an abstract class per role, every backend complete, the
differences declared as capabilities, and nothing above the dialects asking which
backend it runs on (issue 23)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import make_url

from sessionrepo.dialects import (
    BackendDialect,
    Capabilities,
    CitusDialect,
    PostgresDialect,
    SQLiteDialect,
    database_file,
    dialect_for,
    normalize_url,
)
from sessionrepo.dialects.base import AppendRole, EngineRole, ErasureRole, ProbeRole, SearchRole
from sessionrepo.dialects.sqlite.append import SQLiteAppend
from sessionrepo.dialects.sqlite.engine import SQLiteEngine
from sessionrepo.dialects.sqlite.search import SQLiteSearch

from support.paths import ROOT

REPO = ROOT / "repo"
DIALECTS = [SQLiteDialect, PostgresDialect, CitusDialect]
#: What a comparison with one of these strings would be asking: which backend this is.
BACKEND_NAMES = frozenset({"sqlite", "postgresql", "postgres", "citus"})


@pytest.mark.parametrize("dialect", DIALECTS, ids=lambda dialect: dialect.__name__)
def test_every_dialect_implements_every_role_and_declares_itself(
    dialect: type[BackendDialect],
) -> None:
    instance = dialect()  # an abstract method left out would make this a TypeError
    for role in (EngineRole, AppendRole, SearchRole, ProbeRole, ErasureRole):
        assert isinstance(instance, role)
    assert dialect.name in ("sqlite", "postgresql")
    assert dialect.display_name in ("SQLite", "PostgreSQL")
    assert isinstance(dialect.capabilities, Capabilities)
    assert dialect.search_index_ddl


def test_the_registry_serves_the_dialect_of_each_name() -> None:
    assert type(dialect_for("sqlite")) is SQLiteDialect
    assert type(dialect_for("postgresql")) is PostgresDialect


def test_a_dialect_missing_a_role_cannot_be_made() -> None:
    class WithoutProbes(SQLiteEngine, SQLiteAppend, SQLiteSearch, BackendDialect):
        name = "sqlite"

    with pytest.raises(TypeError, match="judge_settings"):
        WithoutProbes()  # type: ignore[abstract]  # what the test shows refused


def test_the_abstract_interface_lists_what_a_backend_must_write() -> None:
    assert {
        "create_engine",
        "begin_snapshot",
        "translate",
        "describe",
        "is_broken_object",
        "text_after",
        "is_damaged",
        "insert_adding",
        "insert_ignoring",
        "lock_session",
        "insert_new_messages",
        "message_at",
        "probe_search_index",
        "index_documents",
        "index_entries",
        "reset_search_index",
        "search_messages",
        "forget_search_documents",
        "forget_search_entries",
        "server_version",
        "settings",
        "judge_settings",
        "prepare_erasure",
        "scrub_after_erasure",
        "nearest_ranks",
        "utc_day",
        "activity",
        "time_before",
    } == set(BackendDialect.__abstractmethods__)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("store.db", "store.db"),
        ("sqlite:///var/lib/store.db", "var/lib/store.db"),
        ("sqlite:////var/lib/store.db", "/var/lib/store.db"),
        ("sqlite://", None),
        ("sqlite:///:memory:", None),
        ("postgresql://user@host/db", None),
    ],
)
def test_database_file_is_the_file_a_sqlite_url_names(url: str, expected: str | None) -> None:
    found = database_file(normalize_url(url))
    assert found == (None if expected is None else Path(expected))


def test_database_file_of_a_server_url_with_a_path_like_name_is_none() -> None:
    assert database_file(make_url("postgresql+psycopg://host/store.db")) is None


def _asks_for_a_backend(node: ast.AST) -> bool:
    """A comparison with a backend's name, or ``x.startswith("sqlite")`` and the like."""
    if isinstance(node, ast.Compare):
        operands: list[Any] = [node.left, *node.comparators]
        for operand in operands:
            values = operand.elts if isinstance(operand, ast.Tuple | ast.Set) else [operand]
            if any(
                isinstance(value, ast.Constant) and value.value in BACKEND_NAMES for value in values
            ):
                return True
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("startswith", "endswith")
    ):
        return any(
            isinstance(arg, ast.Constant)
            and isinstance(arg.value, str)
            and arg.value.lower().startswith(tuple(BACKEND_NAMES))
            for arg in node.args
        )
    return False


def test_nothing_above_the_dialects_compares_a_backend_s_name() -> None:
    """The layers above read capabilities (``dialect.capabilities``) and
    ``sessionrepo.dialects.database_file``; only the dialects know the names. The models
    (``sessionrepo.models``, the tables' column types) are below them and know none."""
    found = []
    for path in sorted([*REPO.rglob("*.py"), *(ROOT / "models").rglob("*.py")]):
        if (REPO / "dialects") in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if _asks_for_a_backend(node):
                found.append(f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', '?')}")
    assert found == []


def test_the_name_check_finds_a_comparison() -> None:
    """The scan above is not vacuous: it sees each form it looks for."""
    for source in (
        'dialect.name == "sqlite"',
        'backend in ("postgresql", "x")',
        'url.startswith("sqlite:")',
        '"postgres" != name',
    ):
        assert any(_asks_for_a_backend(node) for node in ast.walk(ast.parse(source))), source
    assert not any(_asks_for_a_backend(node) for node in ast.walk(ast.parse('x == "other"')))
