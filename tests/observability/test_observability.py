"""Metrics and traces (sessionrepo.observability): off by default and then free of
effect; once enabled, into a gateway's own registry, appends, writes, parks, drains,
loads and searches are counted and timed on both backends and both APIs, the outbox and
search gauges are read at scrape time, and spans carry ids and counts, never content."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry, generate_latest

from sessionrepo import (
    InvalidMessage,
    Message,
    SessionStore,
    TranscriptWriter,
    observability,
    open_repository,
)

pytestmark = pytest.mark.contract

SECRET_CONTENT = "the user's private words"
DOWN_PRIMARY = "postgresql://gateway@127.0.0.1:1/chat"


@pytest.fixture
def registry() -> Iterator[CollectorRegistry]:
    own = CollectorRegistry()
    observability.enable_metrics(own)
    yield own
    observability.disable_metrics()


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    observability.enable_tracing(provider)
    yield exporter
    observability.disable_tracing()
    provider.shutdown()


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    found = registry.get_sample_value(name, labels)
    return 0.0 if found is None else found


def test_appends_count_inserted_duplicate_and_conflicting_messages(
    repo: SessionStore, registry: CollectorRegistry
) -> None:
    backend = repo.backend
    first = Message(role="user", content="hello")
    repo.append("s1", [first, Message(role="assistant", content="hi")])
    repo.append("s1", [first, first.model_copy(update={"content": "changed"})])
    assert value(registry, "sessionrepo_appends_total", backend=backend) == 2
    assert value(registry, "sessionrepo_messages_total", backend=backend, outcome="inserted") == 2
    assert value(registry, "sessionrepo_messages_total", backend=backend, outcome="duplicate") == 1
    assert value(registry, "sessionrepo_messages_total", backend=backend, outcome="conflict") == 1
    assert value(registry, "sessionrepo_append_seconds_count", backend=backend) == 2
    assert value(registry, "sessionrepo_append_seconds_sum", backend=backend) > 0
    repo.load_transcript("s1")
    repo.search("hello")
    assert value(registry, "sessionrepo_loads_total", backend=backend) == 1
    assert value(registry, "sessionrepo_search_seconds_count", backend=backend) == 1
    assert b"sessionrepo_append_seconds_bucket" in generate_latest(registry)


def test_writes_parks_and_drains_are_counted(
    database_url: str, tmp_path: Any, registry: CollectorRegistry
) -> None:
    outbox = str(tmp_path / "outbox.db")
    down = open_repository(DOWN_PRIMARY, require_connection=False)
    try:
        with TranscriptWriter(down, outbox_url=outbox, deadline=2.0) as writer:
            parked = writer.write("s1", [Message(role="user", content=f"#{i}") for i in range(3)])
            assert parked.status == "parked"
            watch = observability.watch(down, writer.outbox)
            try:
                assert (
                    value(registry, "sessionrepo_outbox_pending", outbox=writer.outbox.display_url)
                    == 3
                )
                # The store is down: its gauges are missing, and the scrape says so.
                assert (
                    value(registry, "sessionrepo_watch_up", source="store", at=down.display_url)
                    == 0
                )
                assert (
                    registry.get_sample_value(
                        "sessionrepo_search_backlog", {"store": down.display_url}
                    )
                    is None
                )
            finally:
                watch.close()
    finally:
        down.close()
    assert value(registry, "sessionrepo_writes_total", status="parked") == 1
    assert value(registry, "sessionrepo_messages_parked_total") == 3

    primary = open_repository(database_url)
    try:
        with TranscriptWriter(primary, outbox_url=outbox) as writer:
            report = writer.drain(ignore_backoff=True)
            assert report.replayed == 3
            writer.write("s1", [Message(role="user", content="after")])
            with pytest.raises(InvalidMessage):
                writer.write("s1", [{"role": "robot"}])
        observability.watch(primary, writer.outbox).close()
    finally:
        primary.close()
    assert value(registry, "sessionrepo_drains_total") == 1
    assert value(registry, "sessionrepo_drained_messages_total", result="replayed") == 3
    assert value(registry, "sessionrepo_writes_total", status="stored") == 1
    assert value(registry, "sessionrepo_writes_total", status="error") == 1
    assert value(registry, "sessionrepo_write_seconds_count", status="parked") == 1


def test_watched_gauges_are_read_at_each_scrape(
    database_url: str, registry: CollectorRegistry
) -> None:
    repository = open_repository(database_url)
    try:
        watch = observability.watch(repository, None)
        repository.append("s1", [Message(role="user", content="to index")])
        store = repository.display_url
        assert value(registry, "sessionrepo_search_backlog", store=store) == 1
        assert value(registry, "sessionrepo_search_index_stale", store=store) == 0
        assert repository.catch_up_search_index() == 1
        assert value(registry, "sessionrepo_search_backlog", store=store) == 0
        assert value(registry, "sessionrepo_search_indexed_total", backend=repository.backend) == 1
        watch.close()
        assert registry.get_sample_value("sessionrepo_search_backlog", {"store": store}) is None
    finally:
        repository.close()


def test_spans_name_the_session_and_counts_never_the_content(
    repo: SessionStore, spans: InMemorySpanExporter
) -> None:
    repo.append("s1", [Message(role="user", content=SECRET_CONTENT)])
    repo.load_transcript("s1")
    repo.search("private words", session_id="s1")
    with pytest.raises(InvalidMessage):
        repo.append("s1", [{"role": "user", "content": SECRET_CONTENT, "token_count": "x"}])
    finished = {span.name: span for span in spans.get_finished_spans()}
    append = finished["sessionrepo append"]
    assert append.attributes is not None
    assert append.attributes["gen_ai.conversation.id"] == "s1"
    assert append.attributes["db.system.name"] == repo.backend
    assert append.attributes["sessionrepo.messages.inserted"] == 1
    load = finished["sessionrepo load"]
    assert load.attributes is not None
    assert load.attributes["sessionrepo.messages.count"] == 1
    search = finished["sessionrepo search"]
    assert search.attributes is not None
    assert search.attributes["gen_ai.conversation.id"] == "s1"
    for span in spans.get_finished_spans():
        everything = repr(dict(span.attributes or {})) + repr(span.status) + repr(span.events)
        assert "private" not in everything


def test_off_by_default_and_after_disabling() -> None:
    own = CollectorRegistry()
    observability.enable_metrics(own)
    observability.disable_metrics()
    assert observability.metrics_registry() is None
    assert observability.exposition() is None
    assert list(own.collect()) == []  # every instrument left the registry
    # The wrapper of a method is the method's own signature and docstring.
    from sessionrepo import SessionRepository

    assert SessionRepository.load_transcript.__wrapped__.__name__ == "load_transcript"  # type: ignore[attr-defined]
