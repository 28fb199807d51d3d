"""``export`` writes each session's usage records and ``import`` (restore) loads them,
keyed: a second import adds none, the session's token totals are never counted twice, a
merged session's totals move by what it lacked, and an old (version 1) export without
usage records still imports; on both backends."""

from __future__ import annotations

import io
import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from sessionrepo import Message, SessionRepository, open_repository
from sessionrepo.ops import BadExportFile, export_sessions, import_sessions
from sessionrepo.ops.insights import insights
from sessionrepo.store.database import Database
from sessionrepo.store.schema import upgrade

WHEN = datetime(2026, 11, 3, 12, tzinfo=UTC)


@pytest.fixture
def target(empty_database_url: str) -> Iterator[SessionRepository]:
    database = Database(empty_database_url)
    try:
        upgrade(database)
    finally:
        database.dispose()
    repository = open_repository(empty_database_url)
    yield repository
    repository.close()


@pytest.fixture
def source(database_url: str) -> Iterator[SessionRepository]:
    repository = open_repository(database_url)
    messages = [
        Message(role="user", content="q", timestamp=WHEN),
        Message(role="assistant", content="a", timestamp=WHEN),
    ]
    repository.append(
        "a",
        messages,
        usage={
            "model": "gpt-4.1",
            "provider": "openai",
            "input_tokens": 1200,
            "output_tokens": 80,
            "cache_read_tokens": 200,
            "latency": 1.5,
            "reported_cost": 0.002,
            "occurred_at": WHEN,
            "extra": {"b": 1, "a": [2]},
        },
        source="discord",
    )
    repository.record_usage("a", [_call("side", 300, 20)])
    repository.append("b", [Message(role="user", content="no calls", timestamp=WHEN)])
    yield repository
    repository.close()


def _call(name: str, tokens_in: int, tokens_out: int) -> dict[str, Any]:
    return {
        "usage_id": str(uuid.uuid5(uuid.NAMESPACE_URL, name)),
        "model": "gemini-2.5-flash",
        "input_tokens": tokens_in,
        "output_tokens": tokens_out,
        "occurred_at": WHEN,
    }


def _export(repository: SessionRepository) -> bytes:
    buffer = io.BytesIO()
    export_sessions(repository, buffer)
    return buffer.getvalue()


def _import(repository: SessionRepository, data: bytes) -> Any:
    return import_sessions(repository, io.BytesIO(data))


def _records(data: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in data.split(b"\n") if line]


def _dumps(repository: SessionRepository, sid: str) -> list[dict[str, Any]]:
    return [record.model_dump(mode="json") for record in repository.list_usage(sid)]


def test_usage_goes_out_with_its_session_and_comes_back_once(
    source: SessionRepository, target: SessionRepository
) -> None:
    data = _export(source)
    records = _records(data)
    kinds = [(r["type"], r.get("session_id")) for r in records]
    # a's session record, its two messages, then its two usage records; then b.
    assert kinds[1:6] == [("session", None), *[("message", "a")] * 2, *[("usage", "a")] * 2]
    assert records[-1] == {"type": "end", "sessions": 2, "messages": 3, "usage": 2}
    assert [r["usage"] for r in records if r["type"] == "usage"] == _dumps(source, "a")

    report = _import(target, data)
    assert (report.usage_inserted, report.usage_present, report.sessions_restored) == (2, 0, 2)
    assert _dumps(target, "a") == _dumps(source, "a")  # field by field, extra's key order too
    assert list(target.list_usage("a")[0].extra or {}) == ["b", "a"]
    expected = source.get_session("a")
    assert (expected.input_tokens, expected.output_tokens) == (1500, 100)
    restored = target.get_session("a")
    assert (restored.input_tokens, restored.output_tokens) == (1500, 100)  # not doubled
    assert target.list_usage("b") == []

    again = _import(target, data)
    assert (again.usage_inserted, again.usage_present, again.sessions_present) == (0, 2, 2)
    assert target.get_session("a").input_tokens == 1500
    assert insights(target, by="model").rows == insights(source, by="model").rows


def test_a_merged_session_takes_the_records_it_lacks_and_its_totals_move_by_them(
    source: SessionRepository, target: SessionRepository
) -> None:
    _import(target, _export(source))
    target.append("a", [Message(role="user", content="written in the target")])
    source.record_usage("a", [_call("later", 1000, 1)])

    report = _import(target, _export(source))
    assert report.sessions_merged == 1
    assert (report.usage_inserted, report.usage_present) == (1, 2)
    assert target.get_session("a").input_tokens == 2500 == source.get_session("a").input_tokens
    assert {r.usage_id for r in target.list_usage("a")} == {
        r.usage_id for r in source.list_usage("a")
    }


def test_an_old_export_without_usage_still_imports(
    source: SessionRepository, target: SessionRepository
) -> None:
    records = [r for r in _records(_export(source)) if r["type"] != "usage"]
    records[0]["version"] = 1
    del records[-1]["usage"]
    data = b"".join(json.dumps(r).encode() + b"\n" for r in records)

    report = _import(target, data)
    assert report.complete
    assert (report.sessions_restored, report.messages_inserted, report.usage_inserted) == (2, 3, 0)
    assert target.list_usage("a") == []
    # The row as exported: its totals too (what the source had counted).
    assert target.get_session("a").input_tokens == 1500


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (lambda r: {**r, "usage": {**r["usage"], "input_tokens": -1}}, "usage.input_tokens"),
        (lambda r: {**r, "usage": {**r["usage"], "usage_id": None}}, "needs its key"),
        (lambda r: {**r, "session_id": "b"}, "among those of 'a'"),
        (lambda r: {**r, "usage": "x"}, "no usage object"),
    ],
)
def test_a_damaged_usage_record_is_refused_at_its_line(
    source: SessionRepository, target: SessionRepository, damage: Any, expected: str
) -> None:
    records = _records(_export(source))
    at = next(i for i, r in enumerate(records) if r["type"] == "usage")
    records[at] = damage(records[at])
    data = b"".join(json.dumps(r).encode() + b"\n" for r in records)
    with pytest.raises(BadExportFile, match=f"line {at + 1}: .*{expected}"):
        _import(target, data)
    # What came before the line is kept: a's messages.
    assert len(target.load_transcript("a")) == 2


def test_the_end_record_must_count_the_usage_records(
    source: SessionRepository, target: SessionRepository
) -> None:
    records = _records(_export(source))
    records[-1]["usage"] = 5
    data = b"".join(json.dumps(r).encode() + b"\n" for r in records)
    with pytest.raises(BadExportFile, match="counts 5 usage records, the file holds 2"):
        _import(target, data)
