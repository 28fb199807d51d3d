"""What an operator reads in the log while the primary is down: one line per change of
state (primary lost, writes parking, primary back, drained N), a bounded number of
lines however many writes park and however many times the drainer retries, and no
traceback above DEBUG.

The outage is real: another connection holds what the writer's appends wait for
(``holding_the_write_lock``: SQLite's write lock, or the session's row on PostgreSQL)
for about two seconds while a gateway keeps writing, with the background drainer and
its search index catch-up running every 50 ms.
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sessionrepo import (
    AsyncTranscriptWriter,
    BackendUnavailable,
    TranscriptWriter,
    open_async_repository,
    open_repository,
)
from sessionrepo.outbox.writer import LOGGERS

from support.harness import held_until, holding_the_write_lock, until_primary_back
from support.outbox_workers import make_message
from support.paths import ROOT
from support.polling import eventually

#: Writes the gateway sends while the primary is held (about 1.5 seconds' worth).
WRITES = 25
#: Upper bound for the drainer to replay everything once the primary is back.
DRAINER_TIMEOUT = 30.0

#: The lines of each change of state, and how many times each may appear in one outage.
ONCE = {
    "lost": r"^primary unavailable: .+; writes park in the outbox until it answers$",
    "parking": r"^writes park in the outbox \(first: session 's': .+\)$",
    "back": r"^primary answers again after \d+\.\ds: writes go to it$",
    "drained": r"^outbox drained: (\d+) parked messages replayed, none left$",
}
#: Lines that summarise repeats: at most one per doubling interval (5 s, 10 s, ...).
REPEATS = r"still parking|still failing|still unavailable"
#: The first line of a failure that repeats, and its end.
EPISODES = r"failed: .+; retrying|works again \(failures: \d+, over"


@pytest.fixture(autouse=True)
def _outbox_only_where_the_test_says(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SESSIONREPO_OUTBOX_URL", raising=False)


@pytest.fixture
def records() -> Iterator[list[logging.LogRecord]]:
    """Every record of sessionrepo's loggers, DEBUG included."""
    caught: list[logging.LogRecord] = []

    class Catch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            caught.append(record)

    handler = Catch(logging.DEBUG)
    root = logging.getLogger("sessionrepo")
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield caught
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def _writer_options(tmp_path: Path) -> dict[str, Any]:
    return {
        "outbox_url": f"sqlite:///{tmp_path / 'outbox.db'}",
        # The first write, before the outage, opens the writer's connection and must be
        # stored: at 0.5 s a CI run at load 2 on 2 cores parked it (async, PostgreSQL).
        # Only the outage's first write waits the deadline; the rest park at once.
        "deadline": 1.0,
        "probe_interval": 0.1,
        # Replays due again quickly: the drainer retries many times during the outage.
        "backoff_base": 0.01,
        "backoff_cap": 0.05,
    }


def _check(records: list[logging.LogRecord], parked: int) -> None:
    """The outage's log, as an operator reads it."""
    loud = [r for r in records if r.levelno >= logging.INFO]
    lines = [r.getMessage() for r in loud]
    shown = "\n".join(f"{r.levelname} {r.name}: {r.getMessage()}" for r in loud)
    for record in loud:
        assert record.exc_info is None, f"a traceback above DEBUG:\n{shown}"
        assert "Traceback" not in record.getMessage(), shown
        assert "\n" not in record.getMessage(), f"a line that is not one:\n{shown}"
        assert record.name in LOGGERS, f"an undocumented logger {record.name}"
    for name, pattern in ONCE.items():
        matching = [line for line in lines if re.match(pattern, line)]
        assert len(matching) == 1, f"{name}: {len(matching)} lines\n{shown}"
    drained = next(m for line in lines if (m := re.match(ONCE["drained"], line)))
    assert int(drained.group(1)) == parked, shown
    # The drained line comes last of the four: after the primary came back.
    order = [next(i for i, line in enumerate(lines) if re.match(p, line)) for p in ONCE.values()]
    assert order[0] < order[2] < order[3], shown
    assert order[1] < order[3], shown
    assert len([line for line in lines if re.search(REPEATS, line)]) <= 4, shown
    # Whatever failed meanwhile (replays, the catch-up) says so once, and once when it
    # works again: never once per retry.
    assert len([line for line in lines if re.search(EPISODES, line)]) <= 6, shown
    assert len(loud) <= len(ONCE) + 4 + 6, shown
    # The failures happened, and their tracebacks are there for DEBUG.
    quiet = [r for r in records if r.levelno < logging.INFO]
    assert [r for r in quiet if r.exc_info is not None], "no failure seen"
    assert len([r for r in quiet if r.getMessage().startswith("session 's': parked 1")]) == parked


def test_an_outage_logs_one_line_per_change_of_state(
    records: list[logging.LogRecord], database_url: str, backend: str, tmp_path: Path
) -> None:
    with open_repository(database_url) as repository:
        writer = TranscriptWriter(repository, **_writer_options(tmp_path))
        try:
            assert writer.write("s", [make_message("s", 0)]).status == "stored"
            # The outbox file made and migrated now, not within an outage write's deadline
            # (on a loaded machine that took longer than the deadline leaves the outbox).
            assert writer.pending() == 0
            writer.start(interval=0.05)
            statuses = []
            with holding_the_write_lock(database_url, backend, "s"):
                for index in range(1, WRITES + 1):
                    statuses.append(writer.write("s", [make_message("s", index)]).status)
                    time.sleep(0.05)
            assert set(statuses) == {"parked"}  # the outage happened, to every write
            until_primary_back(writer)
            eventually(lambda: writer.pending() == 0, "the drainer drains", timeout=DRAINER_TIMEOUT)
            _until_logged(records)
            assert len(repository.load_transcript("s")) == WRITES + 1
        finally:
            writer.close()
    _check(records, parked=WRITES)


def test_an_outage_logs_one_line_per_change_of_state_async(
    records: list[logging.LogRecord], database_url: str, backend: str, tmp_path: Path
) -> None:
    async def main() -> None:
        async with (
            await open_async_repository(database_url) as repository,
            AsyncTranscriptWriter(repository, **_writer_options(tmp_path)) as writer,
        ):
            first = await writer.write("s", [make_message("s", 0)])
            assert first.status == "stored"
            assert await writer.pending() == 0  # the outbox file made now (see above)
            writer.start(interval=0.05)
            statuses = []
            with holding_the_write_lock(database_url, backend, "s"):
                for index in range(1, WRITES + 1):
                    result = await writer.write("s", [make_message("s", index)])
                    statuses.append(result.status)
                    await asyncio.sleep(0.05)
            assert set(statuses) == {"parked"}
            give_up = time.monotonic() + DRAINER_TIMEOUT
            while await writer.pending():
                assert time.monotonic() < give_up, "the drainer task did not drain"
                await asyncio.sleep(0.05)
            _until_logged(records)
            assert writer.primary_down is None
            assert len(await repository.load_transcript("s")) == WRITES + 1

    asyncio.run(main())
    _check(records, parked=WRITES)


def test_the_documented_loggers_are_the_ones_the_package_uses() -> None:
    source = ROOT / "repo"
    used = {
        match.group(1)
        for path in source.rglob("*.py")
        for match in re.finditer(r'getLogger\("([^"]+)"\)', path.read_text(encoding="utf-8"))
    }
    assert used == set(LOGGERS)


def _until_logged(records: list[logging.LogRecord]) -> None:
    """Give the drainer, which found the outbox empty, time to say so (the line follows
    the delete); ``_check`` then fails, showing the log, if it never did."""
    give_up = time.monotonic() + 5.0
    while time.monotonic() < give_up:
        if any(re.match(ONCE["drained"], r.getMessage()) for r in records):
            return
        time.sleep(0.02)


# -- a catch-up that outlasts the deadline ----------------------------------------------


class _HeldCatchUp:
    """The repository's first search index catch-up held until :attr:`release` (a large
    backlog), then failing when :attr:`fail` is set; later ones run as usual."""

    def __init__(self, catch_up: Any, *, on_loop: bool) -> None:
        self._catch_up = catch_up
        self._on_loop = on_loop
        self.release = threading.Event()
        self.fail = False
        self.started = 0
        self.ended = threading.Event()

    def __call__(self, *, limit: int | None = None) -> int:
        self.started += 1
        if self.started > 1:
            return int(self._catch_up(limit=limit))
        try:
            held_until(self.release, DRAINER_TIMEOUT, on_loop=self._on_loop)
            if self.fail:
                raise BackendUnavailable("the index's disk went away (injected)")
            return int(self._catch_up(limit=limit))
        finally:
            self.ended.set()


def _index_lines(records: list[logging.LogRecord], level: int) -> list[str]:
    return [
        r.getMessage()
        for r in records
        if r.name == "sessionrepo.writer.index" and r.levelno == level
    ]


def _outlasting_catch_up(
    records: list[logging.LogRecord], held: _HeldCatchUp, rounds: Callable[[], None]
) -> None:
    """``rounds()`` runs one drainer round. The first round's catch-up outlasts the
    deadline: no failure is logged and no round starts another while it runs; when it
    ends (failing, here), its failure is logged once, as any catch-up's."""
    rounds()
    assert held.started == 1
    assert _index_lines(records, logging.WARNING) == []
    still = [
        line
        for line in _index_lines(records, logging.DEBUG)
        if line.startswith("search index catch-up still running after 0.3s")
    ]
    assert len(still) == 1, still
    for _ in range(3):
        rounds()
    assert held.started == 1  # none started while it runs
    held.fail = True
    held.release.set()
    assert held.ended.wait(DRAINER_TIMEOUT)
    eventually(
        lambda: len(_index_lines(records, logging.WARNING)) == 1,
        "its failure logged",
        timeout=DRAINER_TIMEOUT,
    )
    (failed,) = _index_lines(records, logging.WARNING)
    assert failed.startswith("search index catch-up failed: the index's disk went away")


def test_a_catch_up_past_the_deadline_finishes_in_the_background(
    records: list[logging.LogRecord], database_url: str, tmp_path: Path
) -> None:
    with (
        open_repository(database_url) as repository,
        TranscriptWriter(repository, **{**_writer_options(tmp_path), "deadline": 0.3}) as writer,
    ):
        repository.append("s", [make_message("s", 0)])  # in the backlog: the catch-up has work
        held = _HeldCatchUp(repository.catch_up_search_index, on_loop=False)
        repository.catch_up_search_index = held  # type: ignore[method-assign]
        _outlasting_catch_up(records, held, lambda: writer.drain_round(0.05))
        # After its backoff, the next catch-up runs and indexes the message.
        eventually(
            lambda: writer.drain_round(0.05) >= 0 and held.started == 2,
            "the next catch-up",
            timeout=DRAINER_TIMEOUT,
        )
        assert [hit.session_id for hit in repository.search("message")] == ["s"]


def test_a_catch_up_past_the_deadline_finishes_in_the_background_async(
    records: list[logging.LogRecord], database_url: str, tmp_path: Path
) -> None:
    async def main() -> None:
        async with (
            await open_async_repository(database_url) as repository,
            AsyncTranscriptWriter(
                repository, **{**_writer_options(tmp_path), "deadline": 0.3}
            ) as writer,
        ):
            await repository.append("s", [make_message("s", 0)])
            sync = repository._sync
            held = _HeldCatchUp(sync.catch_up_search_index, on_loop=True)
            sync.catch_up_search_index = held  # type: ignore[method-assign]
            loop = asyncio.get_running_loop()

            def rounds() -> None:
                asyncio.run_coroutine_threadsafe(
                    writer._calls.call(writer._sync.drain_round, 0.05), loop
                ).result(DRAINER_TIMEOUT)

            await asyncio.to_thread(_outlasting_catch_up, records, held, rounds)

    asyncio.run(main())


def test_close_waits_for_a_catch_up_still_running(
    records: list[logging.LogRecord], database_url: str, tmp_path: Path
) -> None:
    """A writer closed while its drainer's catch-up runs past its round waits (up to the
    deadline) for it to end, so that nothing of it runs on, or logs, after ``close``."""
    with open_repository(database_url) as repository:
        writer = TranscriptWriter(repository, **{**_writer_options(tmp_path), "deadline": 0.3})
        held = _HeldCatchUp(repository.catch_up_search_index, on_loop=False)
        repository.catch_up_search_index = held  # type: ignore[method-assign]
        try:
            writer.start(interval=0.05)
            eventually(
                lambda: any(
                    line.startswith("search index catch-up still running")
                    for line in _index_lines(records, logging.DEBUG)
                ),
                "the catch-up past its round",
                timeout=DRAINER_TIMEOUT,
            )
            assert not held.ended.is_set()
            # It ends a tenth of a second into the close, well within the deadline.
            threading.Timer(0.1, held.release.set).start()
        finally:
            writer.close()
        assert held.ended.is_set()
        assert held.started == 1
