"""The append path's memory holds no content (``repo/store/memory.py``): an entry costs
the same whatever its message's size, a change anywhere in a dict is seen, the tips are
inside the bound, and a re-flush sends only what is new."""

from __future__ import annotations

import gc
import tracemalloc
import uuid
from typing import Any

import pytest
import sqlalchemy

from sessionrepo import Message, SessionRepository, open_repository
from sessionrepo.store import codec
from sessionrepo.store.memory import ENTRY_BYTES, TIP_BYTES, SentMemory, digest

MiB = 1024 * 1024


def test_an_entry_costs_what_is_counted_whatever_the_content() -> None:
    memory = SentMemory(1 << 40)
    count = 20_000
    keys = [str(uuid.uuid4()) for _ in range(count)]
    uuids = [uuid.UUID(key) for key in keys]
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for start in range(0, count, 100):
            stored = [
                (keys[i], digest({"role": "user", "content": "x" * 50_000, "i": i}), uuids[i])
                for i in range(start, start + 100)
            ]
            memory.acknowledge(f"s{start}", stored, (1, uuids[start]))
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    # The keys and UUIDs are the caller's (shared, not copied): counted from above.
    per_entry = held / count
    assert per_entry < ENTRY_BYTES, f"{per_entry:.0f} B an entry"
    assert memory.size == count * ENTRY_BYTES + memory.tips * TIP_BYTES


def test_the_tips_are_inside_the_bound(database_url: str) -> None:
    # A gateway writing to ever more sessions: the tips (one per session) are bounded
    # with the entries, the oldest going first.
    bound = 64 * 1024
    repository = open_repository(database_url, append_memory=bound)
    try:
        memory = repository._appender.memory
        for index in range(600):
            repository.append(f"many-{index}", [{"role": "user", "content": f"m{index}"}])
            assert memory.size <= bound
        assert 0 < memory.tips < 600
        assert memory.era("many-599") is not None  # the newest stay
        assert memory.era("many-0") is None
        # A session whose tip is forgotten is sent again: the key keeps it a no-op.
        again = repository.append("many-0", [{"role": "user", "content": "m0"}])
        assert len(again.inserted) == 1  # a new dict: a new key, so a new message
    finally:
        repository.close()


@pytest.fixture
def repository(database_url: str) -> Any:
    repository = open_repository(database_url)
    yield repository
    repository.close()


def _count_validations(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    validated: list[object] = []
    original = codec.coerce_message

    def counting(item: Any) -> Any:
        validated.append(item)
        return original(item)

    monkeypatch.setattr(codec, "coerce_message", counting)
    return validated


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(
            lambda d: d["tool_calls"][0]["function"].update(arguments='{"q": 2}'), id="deep"
        ),
        pytest.param(lambda d: d.update(content=d.pop("content")), id="key-order"),
        pytest.param(lambda d: d["tool_calls"][0].update(index=1.0), id="int-to-float"),
        pytest.param(lambda d: d.update(content=d["content"] + "!"), id="content"),
    ],
)
def test_a_changed_dict_is_validated_again_and_reported(
    repository: SessionRepository, monkeypatch: pytest.MonkeyPatch, change: Any
) -> None:
    call = {"id": "c1", "type": "function", "index": 1}
    call["function"] = {"name": "f", "arguments": '{"q": 1}'}
    message = {"role": "assistant", "content": "calling", "tool_calls": [call]}
    transcript = [message, {"role": "user", "content": "next"}]
    repository.append("s", transcript)
    validated = _count_validations(monkeypatch)
    assert len(repository.append("s", transcript).duplicates) == 2
    assert validated == []  # unchanged: taken as acknowledged
    change(message)
    result = repository.append("s", transcript)
    assert validated == [message]  # only the changed one is validated again
    if result.conflicts:
        assert result.conflicts == [uuid.UUID(message["client_msg_uuid"])]
    else:  # what the change touched is not part of the stored content (key order)
        assert len(result.duplicates) == 2


def test_a_validated_message_is_known_by_identity(
    repository: SessionRepository, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = Message.from_openai({"role": "user", "content": "hello"})
    repository.append("m", [first])
    again = repository.prepare("m", [first])
    assert again.known  # the same object: neither validated nor encoded again
    twin = first.model_copy()
    assert not repository.prepare("m", [twin]).known
    assert repository.append("m", [twin]).duplicates == [first.client_msg_uuid]


def test_a_reflush_sends_only_what_is_new(repository: SessionRepository) -> None:
    transcript = [{"role": "user", "content": f"turn {index}"} for index in range(50)]
    repository.append("t", transcript)
    transcript += [{"role": "assistant", "content": "new"}]
    batch = repository.prepare("t", transcript)
    assert batch.pending_rows.count(None) == 50
    result = repository.append_prepared(batch)
    assert len(result.inserted) == 1
    assert len(result.duplicates) == 50
    # What the outbox parks is the whole batch, validated when it is read.
    assert [m.content for m in batch.messages][-2:] == ["turn 49", "new"]
    assert None not in batch.rows


def test_a_lost_tip_sends_the_whole_batch_again(
    repository: SessionRepository, database_url: str
) -> None:
    transcript = [{"role": "user", "content": f"turn {index}"} for index in range(5)]
    repository.append("gone", transcript)
    # Another process removes the session behind this one's back.
    engine = sqlalchemy.create_engine(database_url)
    with engine.begin() as conn:
        for table in ("search_backlog", "messages"):
            conn.execute(sqlalchemy.text(f"DELETE FROM {table} WHERE session_id = 'gone'"))
        conn.execute(sqlalchemy.text("DELETE FROM sessions WHERE id = 'gone'"))
    engine.dispose()
    batch = repository.prepare("gone", [*transcript, {"role": "user", "content": "more"}])
    assert batch.known
    result = repository.append_prepared(batch)
    assert len(result.inserted) == 6  # the memory is a hint: the database decides
    assert [m.content for m in repository.load_transcript("gone")][-1] == "more"
