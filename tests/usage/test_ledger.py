"""The usage ledger on every write path, both backends, both APIs: a model call's usage
is stored with its message, once, through re-flushes, retries and an outage parked in
the outbox; it goes with its session; bad usage is refused before anything is written.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from sessionrepo import (
    AsyncTranscriptWriter,
    InvalidMessage,
    Message,
    TranscriptWriter,
)
from sessionrepo.models.usage import Usage
from tests.conftest import BlockingAsync

from support.harness import holding_the_write_lock

pytestmark = pytest.mark.contract


def _usage(**fields: Any) -> dict[str, Any]:
    return {
        "model": "gpt-4.1",
        "provider": "openai",
        "input_tokens": 1200,
        "output_tokens": 300,
        "cache_read_tokens": 1000,
        "reasoning_tokens": 64,
        "latency": 1.25,
        **fields,
    }


def _ledger(url: str) -> list[dict[str, Any]]:
    """The ledger as plain SQL sees it, not through the library."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT session_id, usage_id, message_uuid, model, input_tokens, "
                    "output_tokens, cache_read_tokens, reasoning_tokens "
                    "FROM usage_records ORDER BY session_id, occurred_at"
                )
            )
            return [dict(row._mapping) for row in rows]
    finally:
        engine.dispose()


def _as_uuid(value: Any) -> uuid.UUID:
    return value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))


def test_usage_with_a_message_is_stored_once_through_reflushes(
    repo: Any, database_url: str
) -> None:
    turn: list[dict[str, Any]] = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
    ]
    first = repo.append("s1", turn, usage=_usage(), source="cli")
    assert len(first.inserted) == 2
    # The whole transcript flushed again, usage and all, twice: nothing new.
    for _ in range(2):
        again = repo.append("s1", turn, usage=_usage())
        assert again.inserted == []
    rows = _ledger(database_url)
    assert len(rows) == 1
    answer = _as_uuid(turn[1]["client_msg_uuid"])
    # Without keys of its own, the record took the last message's key, and names it.
    assert _as_uuid(rows[0]["usage_id"]) == answer
    assert _as_uuid(rows[0]["message_uuid"]) == answer
    assert (rows[0]["input_tokens"], rows[0]["output_tokens"]) == (1200, 300)
    assert (rows[0]["cache_read_tokens"], rows[0]["reasoning_tokens"]) == (1000, 64)
    session = repo.get_session("s1")
    assert (session.input_tokens, session.output_tokens) == (1200, 300)
    [stored] = repo.list_usage("s1")
    assert stored.model == "gpt-4.1"
    assert stored.latency == 1.25


def test_a_second_call_of_the_same_turn_counts_and_session_totals_follow(
    repo: Any, database_url: str
) -> None:
    call = {
        "role": "assistant",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        ],
    }
    tool = {"role": "tool", "tool_call_id": "c1", "content": "42"}
    answer = {"role": "assistant", "content": "it is 42"}
    repo.append("s2", [call], usage=_usage(input_tokens=100, output_tokens=10))
    repo.append("s2", [call, tool, answer], usage=_usage(input_tokens=150, output_tokens=20))
    repo.append("s2", [call, tool, answer])  # no usage this time: nothing changes
    rows = _ledger(database_url)
    assert [(r["input_tokens"], r["output_tokens"]) for r in rows] == [(100, 10), (150, 20)]
    session = repo.get_session("s2")
    assert (session.input_tokens, session.output_tokens) == (250, 30)


def test_usage_recorded_alone_needs_its_key_and_is_idempotent(repo: Any, database_url: str) -> None:
    key = uuid.uuid4()
    with pytest.raises(InvalidMessage, match="usage_id"):
        repo.record_usage("s3", _usage())
    assert _ledger(database_url) == []
    done = repo.record_usage("s3", [_usage(usage_id=str(key))], source="api")
    assert done.inserted == [key]
    assert repo.record_usage("s3", [Usage(usage_id=key, **_usage())]).duplicates == [key]
    assert len(_ledger(database_url)) == 1
    assert repo.get_session("s3").source == "api"


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        ({"input_tokens": -1}, "input_tokens"),
        ({"latency": float("nan")}, "latency"),
        ({"model": "a\x00b"}, "model"),
        ({"occurred_at": datetime(2026, 1, 1)}, "occurred_at"),
        ({"tokens": 3}, "tokens"),
    ],
)
def test_bad_usage_is_refused_before_anything_is_written(
    repo: Any, database_url: str, bad: dict[str, Any], field: str
) -> None:
    with pytest.raises(InvalidMessage, match=field):
        repo.append("s4", [{"role": "assistant", "content": "x"}], usage=_usage(**bad))
    assert _ledger(database_url) == []
    assert not _session_exists(repo, "s4")


def _session_exists(repo: Any, session_id: str) -> bool:
    return any(s.id == session_id for s in repo.list_sessions().sessions)


def test_usage_goes_with_its_session(repo: Any, database_url: str) -> None:
    repo.append("gone", [{"role": "assistant", "content": "x"}], usage=_usage())
    repo.append("kept", [{"role": "assistant", "content": "y"}], usage=_usage())
    repo.end_session("gone", "done")
    far = datetime(2100, 1, 1, tzinfo=UTC)
    repo.delete_ended_sessions(["gone"], cutoff=far)
    assert [row["session_id"] for row in _ledger(database_url)] == ["kept"]


def test_the_writer_stores_usage_with_its_messages(
    writer: Any, repo: Any, database_url: str
) -> None:
    turn = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    assert writer.write("w1", turn, usage=_usage()).status == "stored"
    assert writer.write("w1", turn, usage=_usage()).status == "stored"
    assert len(_ledger(database_url)) == 1


def _outage_writer(repo: Any, outbox: Path) -> Any:
    """A writer with a short deadline and its outbox in a local file, on the repo's API."""
    target = getattr(repo, "_target", None)
    if target is None:
        return TranscriptWriter(repo, outbox_url=f"sqlite:///{outbox}", deadline=0.5)
    loop = repo._loop

    async def make() -> AsyncTranscriptWriter:
        return AsyncTranscriptWriter(target, outbox_url=f"sqlite:///{outbox}", deadline=0.5)

    return BlockingAsync(loop.run(make()), loop)


def test_usage_parked_in_an_outage_is_replayed_once(
    repo: Any, database_url: str, backend: str, tmp_path: Path
) -> None:
    writer = _outage_writer(repo, tmp_path / "outbox.db")
    try:
        repo.create_session("o1", source="cli")
        # The outbox file made and migrated now, not in the outage's short deadline.
        assert writer.pending("o1") == 0
        turn = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
        with holding_the_write_lock(database_url, backend, "o1"):
            parked = writer.write("o1", turn, usage=_usage())
            assert parked.status == "parked"  # the fault happened: the primary was held
            # A retry of the same write while it is still down: parked behind, no-op.
            assert writer.write("o1", turn, usage=_usage()).status == "parked"
        # (the abandoned attempt may commit once the lock is gone: the key makes it one)
        assert writer.pending("o1") == 2
        report = writer.drain(ignore_backoff=True)
        assert report.remaining == 0
        writer.drain(ignore_backoff=True)
        rows = _ledger(database_url)
        assert len(rows) == 1
        assert _as_uuid(rows[0]["message_uuid"]) == _as_uuid(turn[1]["client_msg_uuid"])
        assert repo.get_session("o1").input_tokens == 1200
        # And the flush after the outage, with the same usage again, counts nothing.
        writer.write("o1", turn, usage=_usage())
        assert len(_ledger(database_url)) == 1
    finally:
        writer.close()


def test_a_message_object_carries_usage_given_as_a_model(repo: Any, database_url: str) -> None:
    message = Message(role="assistant", content="m")
    record = Usage(model="gemini-2.5-flash", input_tokens=7, output_tokens=3)
    repo.append("s5", [message], usage=[record])
    repo.append("s5", [message], usage=[record])
    [row] = _ledger(database_url)
    assert _as_uuid(row["usage_id"]) == message.client_msg_uuid


def test_metrics_count_each_recorded_call_once(database_url: str) -> None:
    pytest.importorskip("prometheus_client")
    from prometheus_client import CollectorRegistry

    from sessionrepo import observability, open_repository

    registry = CollectorRegistry()
    observability.enable_metrics(registry)
    try:
        with open_repository(database_url) as repo:
            turn = [{"role": "assistant", "content": "a"}]
            for _ in range(3):  # re-flushes: one call
                repo.append("m1", turn, usage=_usage(reported_cost=0.25))
        url = make_url(database_url)
        # Every metric carries the tenant: a fresh file's, or the role the URL logs in as.
        tenant = "default" if url.get_backend_name() == "sqlite" else str(url.username)
        labels = {"model": "gpt-4.1", "tenant": tenant}
        assert registry.get_sample_value("sessionrepo_usage_calls_total", labels) == 1
        tokens = {**labels, "kind": "input"}
        assert registry.get_sample_value("sessionrepo_usage_tokens_total", tokens) == 1200
        cost = {**labels, "currency": "USD"}
        assert registry.get_sample_value("sessionrepo_usage_reported_cost_total", cost) == 0.25
    finally:
        observability.disable_metrics()
