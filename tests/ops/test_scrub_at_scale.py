"""SQLite: after an erasure's scrub, a byte scan of the file finds none of the erased text,
even where the deletes rebalanced the b-trees (issue 27).

When SQLite rebalances a b-tree it rewrites a page's cells at the page's end and leaves
the bytes below them as they were, so a row that moved to a neighbour page keeps a copy
in the unused space of the page it left; secure delete zeroes the row where it is when
deleted, not that copy. The shape here (sessions written side by side, so their search
rows interleave by time; the rows of various lengths; two of every three sessions
erased) makes the deletes leave such copies in the search index's content table: seen
first at 1,000,000 messages, here at a few thousand.
"""

from __future__ import annotations

import asyncio
import random
import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from sessionrepo import Message, open_async_repository, open_repository
from sessionrepo.dialects.sqlite import erasure
from sessionrepo.ops.erase import scan_file, verify_erased

pytestmark = pytest.mark.sqlite

SECRET = "zqinterleavedsecret"
SESSIONS = 12
PER_SESSION = 150
#: Layouts (random seeds) whose deletes leave copies behind without the unused-space
#: step, with SQLite 3.40 (tests/ops: a shape is never enough on its own, so three).
SEEDS = (3, 6, 8)


def _store(url: str, seed: int) -> dict[str, list[str]]:
    """Sessions ``s<seed>-NN`` side by side in time, every third kept (``kept``), the
    others ``victim``'s, their messages indexed; the kept sessions' contents."""
    rng = random.Random(seed)
    start = datetime(2026, 1, 1, tzinfo=UTC)
    kept: dict[str, list[str]] = {}
    repository = open_repository(url, embedder=False)
    try:
        for s in range(SESSIONS):
            victim = s % 3 != 0
            word = SECRET if victim else "nothing"
            contents = [
                f"{word} {n} " + "lorem ipsum " * rng.randint(2, 30) for n in range(PER_SESSION)
            ]
            sid = f"s{seed}-{s:02d}"
            repository.append(
                sid,
                [
                    Message(
                        role="user",
                        content=text,
                        timestamp=start + timedelta(seconds=n * SESSIONS + s),
                    )
                    for n, text in enumerate(contents)
                ],
                user_id="victim" if victim else "kept",
            )
            if not victim:
                kept[sid] = contents
        repository.reindex()
    finally:
        repository.close()
    return kept


async def _erase_async(url: str) -> list[str]:
    repository = await open_async_repository(url, embedder=False)
    try:
        report = await repository.erase(user_id="victim")
        assert report.scrub is not None
        assert report.scrub.complete
        return report.scrub.steps
    finally:
        await repository.close()


def _erase(url: str, mode: str) -> list[str]:
    if mode == "async":
        return asyncio.run(_erase_async(url))
    repository = open_repository(url, embedder=False)
    try:
        report = repository.erase(user_id="victim")
        assert report.scrub is not None
        assert report.scrub.complete
        return report.scrub.steps
    finally:
        repository.close()


@pytest.mark.parametrize("mode", ["sync", pytest.param("async", marks=pytest.mark.asyncapi)])
def test_after_the_scrub_no_erased_text_is_left_in_the_pages_unused_space(
    mode: str, tmp_path: Path
) -> None:
    for seed in SEEDS:
        url = f"sqlite:///{tmp_path / f'store-{seed}.db'}"
        kept = _store(url, seed)

        steps = _erase(url, mode)

        path = tmp_path / f"store-{seed}.db"
        assert scan_file(path, [SECRET]) == {}, (seed, steps)
        assert any(step.startswith("zeroed the unused space of ") for step in steps)
        repository = open_repository(url, embedder=False)
        try:
            assert verify_erased(repository, [SECRET]).clean
            # The rows grown and put back are as they were, the index agrees with them.
            for sid, contents in kept.items():
                assert [m.content for m in repository.load_transcript(sid)] == contents
            assert len(repository.search('"nothing"', limit=5)) == 5
        finally:
            repository.close()
        check = sqlite3.connect(path)
        try:
            assert check.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
            check.execute("INSERT INTO messages_fts (messages_fts) VALUES ('integrity-check')")
        finally:
            check.close()


def test_without_the_unused_space_step_this_store_keeps_an_erased_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shape above does leave copies (so the test above can fail): the scrub with
    the step taken out finds the secret in at least one of the stores."""
    monkeypatch.setattr(erasure, "_zero_unused_space", lambda connection: (0, 0))
    found = 0
    for seed in SEEDS:
        url = f"sqlite:///{tmp_path / f'store-{seed}.db'}"
        _store(url, seed)
        _erase(url, "sync")
        found += sum(scan_file(tmp_path / f"store-{seed}.db", [SECRET]).values())
    assert found > 0


def test_a_page_whose_unused_space_is_clean_is_not_written(tmp_path: Path) -> None:
    """A second scrub has nothing left to zero: only pages holding old bytes are
    written, not every page of the tables."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    _store(url, SEEDS[0])
    _erase(url, "sync")
    repository = open_repository(url, embedder=False)
    try:
        again = repository.scrub_erased()
    finally:
        repository.close()
    assert "zeroed the unused space of 0 pages" in " ".join(again.steps)
