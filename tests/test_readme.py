"""The README's Python examples that stand alone run as written."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def _section(title: str) -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index(f"### {title}\n")
    end = text.index("\n### ", start + 1)
    return text[start:end]


def test_the_editing_example_runs() -> None:
    [code] = re.findall(
        r"```python\n(.*?)```", _section("Every OpenAI format, and taking things back"), re.S
    )
    exec(compile(code, "README.md", "exec"), {"__name__": "readme"})
