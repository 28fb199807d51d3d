"""What the append path remembers is bounded in bytes (``open_repository(append_memory=...)``):
a gateway's memory does not grow with what it has written.

Each soak writes several times its bound of message content, one message a call across a
few sessions, through ``append``, ``TranscriptWriter.write`` and the async API, drops the
messages, and asserts with ``tracemalloc`` that what stays allocated is under the bound
(plus a fixed slack for the pools and statement caches a first write warms, measured
after a warm-up). Bounded in time: a few hundred messages per backend.
"""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import EventLoopThread

from sessionrepo import (
    InvalidArgument,
    SessionRepository,
    TranscriptWriter,
    open_async_repository,
    open_repository,
)
from sessionrepo.store import codec
from sessionrepo.store.memory import DEFAULT_MEMORY_BYTES, ENTRY_BYTES

MiB = 1024 * 1024
#: The bound under test, and the content written through it (several times over).
BOUND = 1 * MiB
CONTENT = 48 * 1024
MESSAGES = 6 * BOUND // CONTENT
#: What else a run may leave allocated: pools, statement caches, interned keys.
SLACK = 1 * MiB


def _message(index: int) -> dict[str, Any]:
    # Distinct content each: nothing shared between messages but what the store keeps.
    return {"role": "user", "content": f"{index:08d}" * (CONTENT // 8)}


def _retained(write: Callable[[str, list[dict[str, Any]]], Any]) -> int:
    """Bytes still allocated after writing :data:`MESSAGES` messages through ``write``
    and dropping them (measured from after a warm-up of the same calls)."""
    for index in range(10):  # warm-up: connections, compiled statements, sessions
        write(f"s{index % 5}", [_message(-index - 1)])
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for index in range(MESSAGES):
            write(f"s{index % 5}", [_message(index)])
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


@pytest.fixture
def bounded(database_url: str) -> Iterator[SessionRepository]:
    repository = open_repository(database_url, append_memory=BOUND)
    yield repository
    repository.close()


def test_append_keeps_no_more_than_its_bound(bounded: SessionRepository) -> None:
    retained = _retained(bounded.append)
    assert retained < BOUND + SLACK, f"{retained / MiB:.1f} MiB retained"
    assert 0 < bounded._appender.memory.size <= BOUND


def test_the_writer_keeps_no_more_than_its_bound(bounded: SessionRepository) -> None:
    with TranscriptWriter(bounded) as writer:
        retained = _retained(writer.write)
    assert retained < BOUND + SLACK, f"{retained / MiB:.1f} MiB retained"


def test_the_async_api_keeps_no_more_than_its_bound(
    database_url: str, event_loop_thread: EventLoopThread
) -> None:
    repository = event_loop_thread.run(open_async_repository(database_url, append_memory=BOUND))
    try:
        retained = _retained(
            lambda sid, messages: event_loop_thread.run(repository.append(sid, messages))
        )
    finally:
        event_loop_thread.run(repository.close())
    assert retained < BOUND + SLACK, f"{retained / MiB:.1f} MiB retained"


def test_a_reflush_within_the_bound_validates_nothing_again(
    bounded: SessionRepository, monkeypatch: pytest.MonkeyPatch
) -> None:
    small = [{"role": "user", "content": f"turn {index}"} for index in range(20)]
    bounded.append("s", small)
    validated: list[object] = []
    original = codec.coerce_message

    def counting(item: Any) -> Any:
        validated.append(item)
        return original(item)

    monkeypatch.setattr(codec, "coerce_message", counting)
    again = bounded.append("s", small)
    assert len(again.duplicates) == 20
    assert validated == []
    # Past the bound the oldest are forgotten: sent again, they are validated again,
    # and still stored once (the key decides, not the memory).
    for start in range(0, 2 * BOUND // ENTRY_BYTES, 500):
        bounded.append(
            "other", [{"role": "user", "content": f"{n}"} for n in range(start, start + 500)]
        )
    validated.clear()
    assert bounded.append("s", small).duplicates == again.duplicates
    assert len(validated) == 20
    assert bounded.get_session("s").message_count == 20


def test_a_bound_of_zero_remembers_nothing(database_url: str) -> None:
    repository = open_repository(database_url, append_memory=0)
    try:
        messages = [_message(index) for index in range(5)]
        assert len(repository.append("s", messages).inserted) == 5
        assert len(repository.append("s", messages).duplicates) == 5
        assert repository._appender.memory.size == 0
    finally:
        repository.close()


def test_the_bound_is_checked_and_documented() -> None:
    # The goal: at most 64 MiB by default, and the README says what it is.
    assert 64 * MiB >= DEFAULT_MEMORY_BYTES
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    assert f"`append_memory` (bytes, default {DEFAULT_MEMORY_BYTES // MiB} MiB" in readme
    for wrong in (-1, 1.5, True, "1"):
        with pytest.raises(InvalidArgument):
            open_repository("sqlite:///unused.db", append_memory=wrong)
