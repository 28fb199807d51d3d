"""A hit's extract as ``(text, is_match)`` runs (``SearchHit.snippet_parts``): a bracket
the message itself holds is text, never a mark; ``snippet`` is the same runs bracketed."""

from __future__ import annotations

import pytest

from sessionrepo import SessionStore

pytestmark = pytest.mark.contract  # every repo test runs on the sync and async API


def test_snippet_parts_tell_matches_from_the_texts_own_brackets(repo: SessionStore) -> None:
    repo.append("s", [{"role": "user", "content": "see [mochi]  and\n mochi][ 3.14 done"}])

    [hit] = repo.search("mochi 3.14")
    assert hit.snippet_parts == [
        ("see [", False),
        ("mochi", True),
        ("] and ", False),
        ("mochi", True),
        ("][ ", False),
        ("3.14", True),  # 3, . and 14 matched side by side read as one match
        (" done", False),
    ]
    assert hit.snippet == "see [[mochi]] and [mochi]][ [3.14] done"  # ambiguous
