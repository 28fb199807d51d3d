"""What a dialect's ``nearest_vectors`` (pgvector's index, sqlite-vec's scan) answered to
each semantic query of a test: the proof that a query went through it, or did not."""

from __future__ import annotations

from typing import Any

import pytest


class NearestSpy:
    """Records each answer of ``role.nearest_vectors`` (``None``: the extension was not
    used, so the caller scanned), the method patched for the test's duration."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, role: type[Any]) -> None:
        self.answers: list[Any] = []
        original = role.nearest_vectors

        def spied(dialect: Any, connection: Any, target: bytes, depth: int, filters: Any) -> Any:
            answer = original(dialect, connection, target, depth, filters)
            self.answers.append(answer)
            return answer

        monkeypatch.setattr(role, "nearest_vectors", spied)
