"""Metrics and traces (sessionrepo.observability): off by default and then free of
effect; once enabled, into a gateway's own registry, appends, writes, parks, drains,
loads and searches are counted and timed on both backends and both APIs, the outbox and
search gauges are read at scrape time, and spans carry ids and counts, never content."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry, generate_latest
from sqlalchemy.engine import make_url

from sessionrepo import (
    InvalidMessage,
    Message,
    SessionRepository,
    SessionStore,
    TranscriptWriter,
    observability,
    open_repository,
)
from sessionrepo.models.usage import Usage

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


@pytest.fixture
def tenant(database_url: str) -> str:
    """The tenant label of a repository opened on ``database_url`` for none in
    particular: a fresh SQLite file's is ``default``, a PostgreSQL one's the role its URL
    logs in as."""
    url = make_url(database_url)
    return "default" if url.get_backend_name() == "sqlite" else str(url.username)


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    found = registry.get_sample_value(name, labels)
    return 0.0 if found is None else found


def test_appends_count_inserted_duplicate_and_conflicting_messages(
    repo: SessionStore, registry: CollectorRegistry, tenant: str
) -> None:
    labels = {"backend": repo.backend, "tenant": tenant}
    first = Message(role="user", content="hello")
    repo.append("s1", [first, Message(role="assistant", content="hi")])
    repo.append("s1", [first, first.model_copy(update={"content": "changed"})])
    assert value(registry, "sessionrepo_appends_total", **labels) == 2
    assert value(registry, "sessionrepo_messages_total", **labels, outcome="inserted") == 2
    assert value(registry, "sessionrepo_messages_total", **labels, outcome="duplicate") == 1
    assert value(registry, "sessionrepo_messages_total", **labels, outcome="conflict") == 1
    assert value(registry, "sessionrepo_append_seconds_count", **labels) == 2
    assert value(registry, "sessionrepo_append_seconds_sum", **labels) > 0
    repo.load_transcript("s1")
    repo.search("hello")
    assert value(registry, "sessionrepo_loads_total", **labels) == 1
    assert value(registry, "sessionrepo_search_seconds_count", **labels) == 1
    assert b"sessionrepo_append_seconds_bucket" in generate_latest(registry)


def test_writes_parks_and_drains_are_counted(
    database_url: str, tmp_path: Any, registry: CollectorRegistry, tenant: str
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
                    value(
                        registry,
                        "sessionrepo_outbox_pending",
                        outbox=writer.outbox.display_url,
                        tenant="gateway",
                    )
                    == 3
                )
                # The store is down: its gauges are missing, and the scrape says so.
                assert (
                    value(
                        registry,
                        "sessionrepo_watch_up",
                        source="store",
                        at=down.display_url,
                        tenant="gateway",
                    )
                    == 0
                )
                assert (
                    registry.get_sample_value(
                        "sessionrepo_search_backlog",
                        {"store": down.display_url, "tenant": "gateway"},
                    )
                    is None
                )
            finally:
                watch.close()
    finally:
        down.close()
    # The down primary's URL logs in as ``gateway``: its writes are that tenant's.
    assert value(registry, "sessionrepo_writes_total", status="parked", tenant="gateway") == 1
    assert value(registry, "sessionrepo_messages_parked_total", tenant="gateway") == 3

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
    assert value(registry, "sessionrepo_drains_total", tenant=tenant) == 1
    assert (
        value(registry, "sessionrepo_drained_messages_total", result="replayed", tenant=tenant) == 3
    )
    assert value(registry, "sessionrepo_writes_total", status="stored", tenant=tenant) == 1
    assert value(registry, "sessionrepo_writes_total", status="error", tenant=tenant) == 1
    assert (
        value(registry, "sessionrepo_write_seconds_count", status="parked", tenant="gateway") == 1
    )


def test_watched_gauges_are_read_at_each_scrape(
    database_url: str, registry: CollectorRegistry, tenant: str
) -> None:
    repository = open_repository(database_url)
    try:
        watch = observability.watch(repository, None)
        repository.append("s1", [Message(role="user", content="to index")])
        store = repository.display_url
        assert value(registry, "sessionrepo_search_backlog", store=store, tenant=tenant) == 1
        assert value(registry, "sessionrepo_search_index_stale", store=store, tenant=tenant) == 0
        assert repository.catch_up_search_index() == 1
        assert value(registry, "sessionrepo_search_backlog", store=store, tenant=tenant) == 0
        assert (
            value(
                registry,
                "sessionrepo_search_indexed_total",
                backend=repository.backend,
                tenant=tenant,
            )
            == 1
        )
        watch.close()
        assert (
            registry.get_sample_value(
                "sessionrepo_search_backlog", {"store": store, "tenant": tenant}
            )
            is None
        )
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


def test_usage_is_labelled_by_the_tenant_of_the_ledger_it_went_into(
    repo: SessionRepository, registry: CollectorRegistry, tenant: str
) -> None:
    call = Usage(usage_id=uuid.uuid4(), model="m", input_tokens=7, reported_cost=0.5)
    repo.record_usage("s1", [call])
    repo.record_usage("s1", [call])  # the same key: not counted again
    assert value(registry, "sessionrepo_usage_calls_total", model="m", tenant=tenant) == 1
    assert (
        value(registry, "sessionrepo_usage_tokens_total", model="m", kind="input", tenant=tenant)
        == 7
    )
    assert (
        value(
            registry,
            "sessionrepo_usage_reported_cost_total",
            model="m",
            currency="USD",
            tenant=tenant,
        )
        == 0.5
    )


def test_usage_recorded_in_a_unit_of_work_is_labelled_too(
    database_url: str, registry: CollectorRegistry, tenant: str
) -> None:
    repository = open_repository(database_url)
    with repository, repository.session_transaction("s1") as tx:
        tx.record_usage([Usage(usage_id=uuid.uuid4(), model="m", output_tokens=3)])
    assert (
        value(registry, "sessionrepo_usage_tokens_total", model="m", kind="output", tenant=tenant)
        == 3
    )


@pytest.mark.sqlite
def test_a_sqlite_file_is_labelled_by_the_tenant_that_claimed_it(
    tmp_path: Any, registry: CollectorRegistry
) -> None:
    path = f"sqlite:///{tmp_path / 'discord.db'}"
    with open_repository(path, tenant="discord") as claimed:
        claimed.append("s1", [Message(role="user", content="hi")])
    # Opened again for none in particular: still the claimed file's tenant.
    with open_repository(path) as reopened:
        reopened.load_transcript("s1")
        reopened.load_transcript("s1")
    assert value(registry, "sessionrepo_appends_total", backend="sqlite", tenant="discord") == 1
    assert value(registry, "sessionrepo_loads_total", backend="sqlite", tenant="discord") == 2
    assert value(registry, "sessionrepo_loads_total", backend="sqlite", tenant="default") == 0


def test_the_tenant_label_takes_one_value_whatever_the_traffic(
    repo: SessionStore, registry: CollectorRegistry, tenant: str
) -> None:
    for n in range(20):
        repo.append(f"s{n}", [Message(role="user", content="hi")], user_id=f"user-{n}")
        repo.load_transcript(f"s{n}")
    labelled = {
        sample.labels.get("tenant")
        for family in registry.collect()
        for sample in family.samples
        if family.name.startswith("sessionrepo_")
    }
    assert labelled == {tenant}


def test_the_login_role_is_read_from_the_url_without_connecting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from sessionrepo.observability.tenants import login_role

    assert login_role(make_url("postgresql://discord:secret@db/chat")) == "discord"
    assert login_role(make_url("postgresql:///chat?host=/run&user=slack")) == "slack"
    assert login_role(make_url("postgresql://ops@db/chat?options=-c%20role%3Dteams")) == "teams"
    monkeypatch.setenv("PGUSER", "from_environment")
    assert login_role(make_url("postgresql:///chat")) == "from_environment"
