"""What is recorded and the switches: the metric catalogue (:data:`METRICS`), the
instruments made from it, and turning metrics and traces on and off."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from sessionrepo.errors import InvalidArgument

if TYPE_CHECKING:  # pragma: no cover - the optional dependencies' types
    from opentelemetry.trace import Tracer, TracerProvider
    from prometheus_client import CollectorRegistry

#: Every metric: name, type, labels and meaning (the README's table is made from it).
#: Every one carries ``tenant`` (see :mod:`sessionrepo.observability.tenants`).
METRICS: Final = (
    ("sessionrepo_appends_total", "counter", "backend, tenant", "Batches appended to the primary."),
    (
        "sessionrepo_messages_total",
        "counter",
        "backend, outcome, tenant",
        "Messages of appended batches by outcome: inserted, duplicate (already stored, "
        "same content), conflict (key stored with other content), erased (key an erasure "
        "removed from the session: refused).",
    ),
    (
        "sessionrepo_append_seconds",
        "histogram",
        "backend, tenant",
        "Time of one append (one transaction), failed ones included.",
    ),
    (
        "sessionrepo_append_errors_total",
        "counter",
        "backend, error, tenant",
        "Appends that raised.",
    ),
    (
        "sessionrepo_writes_total",
        "counter",
        "status, tenant",
        "TranscriptWriter.write calls: stored (in the primary), parked (in the outbox), "
        "error (raised; nothing acknowledged).",
    ),
    (
        "sessionrepo_write_seconds",
        "histogram",
        "status, tenant",
        "Time of one write, parking included (bounded by the writer's deadline).",
    ),
    (
        "sessionrepo_messages_parked_total",
        "counter",
        "tenant",
        "Messages parked in the outbox by writes (a rising rate: the primary is failing).",
    ),
    (
        "sessionrepo_drained_messages_total",
        "counter",
        "result, tenant",
        "Parked messages handled by drains: replayed, duplicate, conflict, erased, failed (kept "
        "for a retry), dead (set aside).",
    ),
    ("sessionrepo_drains_total", "counter", "tenant", "Drain runs."),
    (
        "sessionrepo_usage_calls_total",
        "counter",
        "model, tenant",
        "Model calls recorded in the usage ledger (each once: a re-sent record is not counted).",
    ),
    (
        "sessionrepo_usage_tokens_total",
        "counter",
        "model, kind, tenant",
        "Tokens of the model calls recorded, by kind (input, output, cache_read, "
        "cache_write, reasoning).",
    ),
    (
        "sessionrepo_usage_reported_cost_total",
        "counter",
        "model, currency, tenant",
        "The cost the providers reported for the calls recorded (computed cost: insights).",
    ),
    ("sessionrepo_loads_total", "counter", "backend, tenant", "Transcript loads."),
    ("sessionrepo_load_seconds", "histogram", "backend, tenant", "Time of one transcript load."),
    ("sessionrepo_search_seconds", "histogram", "backend, tenant", "Time of one search."),
    (
        "sessionrepo_search_indexed_total",
        "counter",
        "backend, tenant",
        "Messages indexed by search catch-ups (its rate is the catch-up rate).",
    ),
    (
        "sessionrepo_outbox_pending",
        "gauge",
        "outbox, tenant",
        "Messages waiting in the outbox (read at scrape time from each watched outbox).",
    ),
    (
        "sessionrepo_outbox_dead",
        "gauge",
        "outbox, tenant",
        "Messages set aside as dead: an operator must look, then retry-dead.",
    ),
    (
        "sessionrepo_outbox_oldest_pending_age_seconds",
        "gauge",
        "outbox, tenant",
        "Age of the oldest pending outbox row (0: none); growing: nothing drains.",
    ),
    (
        "sessionrepo_search_backlog",
        "gauge",
        "store, tenant",
        "Appended messages waiting for the search catch-up.",
    ),
    (
        "sessionrepo_search_index_stale",
        "gauge",
        "store, tenant",
        "1 when the search index is stale (search refuses until a reindex), else 0.",
    ),
    (
        "sessionrepo_watch_up",
        "gauge",
        "source, at, tenant",
        "1 when this scrape read the watched outbox or store, 0 when it could not (its "
        "database is down: the other gauges of it are missing).",
    ),
)

_LATENCY_BUCKETS: Final = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip


class Metrics:
    """The instruments, in one registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        from prometheus_client import Counter, Histogram

        self.registry = registry
        made: dict[str, Any] = {}
        for name, kind, labels, meaning in METRICS:
            if kind == "gauge":
                continue  # read at scrape time by the watch collector
            names = [label.strip() for label in labels.split(",") if label.strip()]
            base = name.removesuffix("_total")
            if kind == "counter":
                made[name] = Counter(base, meaning, names, registry=registry)
            else:
                made[name] = Histogram(
                    name, meaning, names, registry=registry, buckets=_LATENCY_BUCKETS
                )
        self.appends = made["sessionrepo_appends_total"]
        self.messages = made["sessionrepo_messages_total"]
        self.append_seconds = made["sessionrepo_append_seconds"]
        self.append_errors = made["sessionrepo_append_errors_total"]
        self.writes = made["sessionrepo_writes_total"]
        self.write_seconds = made["sessionrepo_write_seconds"]
        self.parked = made["sessionrepo_messages_parked_total"]
        self.drained = made["sessionrepo_drained_messages_total"]
        self.drains = made["sessionrepo_drains_total"]
        self.loads = made["sessionrepo_loads_total"]
        self.load_seconds = made["sessionrepo_load_seconds"]
        self.search_seconds = made["sessionrepo_search_seconds"]
        self.indexed = made["sessionrepo_search_indexed_total"]
        self.usage_calls = made["sessionrepo_usage_calls_total"]
        self.usage_tokens = made["sessionrepo_usage_tokens_total"]
        self.usage_cost = made["sessionrepo_usage_reported_cost_total"]
        self.instruments = list(made.values())


@dataclass
class State:
    """What is on in this process: the decorators read it on every call."""

    metrics: Metrics | None = None
    tracer: Tracer | None = None
    #: Called with ``off`` whenever it is set (the decorators that install their wrapper
    #: only while something is on: see ``decorators.installed_only_when_on``).
    listeners: list[Callable[[bool], None]] = field(default_factory=list)
    _off: bool = True

    @property
    def off(self) -> bool:
        """Both off: the decorated methods run as they are."""
        return self._off

    @off.setter
    def off(self, value: bool) -> None:
        self._off = value
        for listener in self.listeners:
            listener(value)


#: The process's one switchboard (the decorated methods are the library's own).
state = State()


def enable_metrics(registry: CollectorRegistry | None = None) -> CollectorRegistry:
    """Record the library's metrics into ``registry`` (default: prometheus-client's
    global one) from now on, in this process. Enabling again with the same registry
    changes nothing; with another one, moves the metrics there (counts restart).

    Raises:
        InvalidArgument: prometheus-client is not installed.
    """
    try:
        import prometheus_client
    except ImportError:
        raise InvalidArgument(
            "metrics", "need prometheus-client: pip install 'sessionrepo[metrics]'"
        ) from None
    registry = registry if registry is not None else prometheus_client.REGISTRY
    current = state.metrics
    if current is not None and current.registry is registry:
        return registry
    disable_metrics()
    state.metrics = Metrics(registry)
    state.off = False
    return registry


def disable_metrics() -> None:
    """Stop recording metrics; their instruments leave the registry."""
    current, state.metrics = state.metrics, None
    if current is not None:
        for instrument in current.instruments:
            current.registry.unregister(instrument)
    state.off = state.metrics is None and state.tracer is None


def metrics_registry() -> CollectorRegistry | None:
    """The registry metrics are recorded into (``None``: metrics are off)."""
    return None if state.metrics is None else state.metrics.registry


def enable_tracing(tracer_provider: TracerProvider | None = None) -> None:
    """Make spans around appends, loads, searches, writes and drains from now on, with
    ``tracer_provider`` (default: OpenTelemetry's global one).

    Raises:
        InvalidArgument: opentelemetry-api is not installed.
    """
    try:
        from opentelemetry import trace
    except ImportError:
        raise InvalidArgument(
            "tracing", "needs opentelemetry-api: pip install 'sessionrepo[tracing]'"
        ) from None
    state.tracer = trace.get_tracer("sessionrepo", tracer_provider=tracer_provider)
    state.off = False


def disable_tracing() -> None:
    state.tracer = None
    state.off = state.metrics is None


def exposition() -> tuple[bytes, str] | None:
    """The enabled registry in Prometheus' text format, with its content type
    (``None``: metrics are off)."""
    if state.metrics is None:
        return None
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    return generate_latest(state.metrics.registry), CONTENT_TYPE_LATEST
