"""Every Python example in the README runs as written, on SQLite and on PostgreSQL.

The convention the README states: each example runs in an empty directory of its own
(its working directory: an outbox named ``sqlite:///outbox.db`` lands there) with
``SESSIONREPO_DATABASE_URL`` naming a fresh, migrated store of the backend, so that
``open_repository()`` (no URL) opens it. Nothing is skipped: an example that cannot run
alone is a broken example.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from sessionrepo import observability

README = Path(__file__).resolve().parent.parent / "README.md"
_FENCE = re.compile(r"^```python\n(.*?)^```$", re.S | re.M)


def _examples() -> list[tuple[int, str]]:
    """``(line, code)`` of every fenced ``python`` block."""
    text = README.read_text(encoding="utf-8")
    return [
        (text.count("\n", 0, found.start()) + 2, found.group(1)) for found in _FENCE.finditer(text)
    ]


EXAMPLES = _examples()


def test_the_readme_has_its_examples() -> None:
    """The extraction found the examples (a changed fence would otherwise run none)."""
    assert len(EXAMPLES) >= 7
    assert len(EXAMPLES) == README.read_text(encoding="utf-8").count("```python\n")


@pytest.fixture
def in_empty_directory(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SESSIONREPO_DATABASE_URL", database_url)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.delenv("SESSIONREPO_OUTBOX_URL", raising=False)
    yield
    # What an example enabled stays off for the tests after it.
    observability.disable_metrics()
    observability.disable_tracing()


@pytest.mark.parametrize(("line", "code"), EXAMPLES, ids=[f"line{n}" for n, _ in EXAMPLES])
@pytest.mark.usefixtures("in_empty_directory")
def test_the_example_runs(
    line: int, code: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Line numbers in a traceback are the README's.
    source = "\n" * (line - 1) + code
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        exec(compile(source, str(README), "exec"), {"__name__": "readme_example"})
    capsys.readouterr()
    # It used the store the test named, not the default embedded file.
    assert not (tmp_path / "data").exists()
