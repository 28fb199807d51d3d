"""The appender's one entry is the instrumented one: every append is counted once, the
re-send after a lost acknowledgement included (it reruns inside the entry)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from sessionrepo import SessionRepository, observability


@pytest.fixture
def registry() -> Iterator[CollectorRegistry]:
    own = CollectorRegistry()
    observability.enable_metrics(own)
    yield own
    observability.disable_metrics()


def _count(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


def _delete_messages_behind_its_back(database_url: str, session_id: str) -> None:
    url = make_url(database_url)
    if url.drivername == "postgresql":
        url = url.set(drivername="postgresql+psycopg")
    engine = create_engine(url)
    try:
        with engine.begin() as connection:
            deleted = connection.execute(
                text("DELETE FROM messages WHERE session_id = :sid"), {"sid": session_id}
            ).rowcount
    finally:
        engine.dispose()
    assert deleted == 2  # the fault happened: the acknowledged rows are gone


def test_a_resend_after_its_rows_vanished_is_one_append(
    repo: SessionRepository, database_url: str, registry: CollectorRegistry
) -> None:
    url = make_url(database_url)
    # Every metric carries the tenant: a fresh file's, or the role the URL logs in as.
    tenant = "default" if url.get_backend_name() == "sqlite" else str(url.username)
    labels = {"backend": repo.backend, "tenant": tenant}
    batch = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}]
    assert len(repo.append("s1", batch).inserted) == 2
    _delete_messages_behind_its_back(database_url, "s1")
    # Both rows are remembered as stored: the probe finds the newest gone, the memory
    # forgets the session and the batch is sent again, inside the same append.
    again = repo.append("s1", batch)
    assert len(again.inserted) == 2
    assert _count(registry, "sessionrepo_appends_total", **labels) == 2
    assert _count(registry, "sessionrepo_append_seconds_count", **labels) == 2
    assert _count(registry, "sessionrepo_messages_total", **labels, outcome="inserted") == 4
