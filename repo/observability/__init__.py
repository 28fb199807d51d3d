"""Metrics (Prometheus) and traces (OpenTelemetry) of the library, off until enabled.

Both are optional dependencies (``pip install 'sessionrepo[metrics]'``,
``'sessionrepo[tracing]'``) and cost nothing while off: the instrumented methods
(:meth:`SessionRepository.append_prepared`, ``load_transcript``, ``search``,
``catch_up_search_index``; :meth:`TranscriptWriter.write`, ``drain``) are wrapped by the
decorators below, whose wrapper checks one flag and calls the method.

A gateway enables them in its own process, into its own registry if it has one::

    from prometheus_client import CollectorRegistry
    from sessionrepo import observability

    registry = CollectorRegistry()
    observability.enable_metrics(registry)       # appends, writes, drains, latencies
    observability.watch(repository, writer.outbox, registry=registry)  # gauges at scrape
    observability.enable_tracing()                # spans on the global TracerProvider

``sessionrepo serve`` does the same and exposes ``/metrics``. The metric names and their
meaning are in :data:`METRICS` (and the README's table). Spans carry OpenTelemetry's
attribute names where one fits (``gen_ai.conversation.id`` for the session id,
``db.system.name``, ``db.operation.name``, ``error.type``) and counts of our own
(``sessionrepo.messages.*``); never message content, never a search query.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeVar

from sessionrepo.errors import InvalidArgument, QueuedBehindOutbox
from sessionrepo.models import AppendResult
from sessionrepo.models.outbox import DrainReport, OutboxStatus, WriteResult

if TYPE_CHECKING:  # pragma: no cover - the optional dependencies' types
    from opentelemetry.trace import Tracer, TracerProvider
    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics_core import Metric

F = TypeVar("F", bound=Callable[..., Any])

#: Every metric: name, type, labels and meaning (the README's table is made from it).
METRICS: Final = (
    ("sessionrepo_appends_total", "counter", "backend", "Batches appended to the primary."),
    (
        "sessionrepo_messages_total",
        "counter",
        "backend, outcome",
        "Messages of appended batches by outcome: inserted, duplicate (already stored, "
        "same content), conflict (key stored with other content).",
    ),
    (
        "sessionrepo_append_seconds",
        "histogram",
        "backend",
        "Time of one append (one transaction), failed ones included.",
    ),
    ("sessionrepo_append_errors_total", "counter", "backend, error", "Appends that raised."),
    (
        "sessionrepo_writes_total",
        "counter",
        "status",
        "TranscriptWriter.write calls: stored (in the primary), parked (in the outbox), "
        "error (raised; nothing acknowledged).",
    ),
    (
        "sessionrepo_write_seconds",
        "histogram",
        "status",
        "Time of one write, parking included (bounded by the writer's deadline).",
    ),
    (
        "sessionrepo_messages_parked_total",
        "counter",
        "",
        "Messages parked in the outbox by writes (a rising rate: the primary is failing).",
    ),
    (
        "sessionrepo_drained_messages_total",
        "counter",
        "result",
        "Parked messages handled by drains: replayed, duplicate, conflict, failed (kept "
        "for a retry), dead (set aside).",
    ),
    ("sessionrepo_drains_total", "counter", "", "Drain runs."),
    ("sessionrepo_loads_total", "counter", "backend", "Transcript loads."),
    ("sessionrepo_load_seconds", "histogram", "backend", "Time of one transcript load."),
    ("sessionrepo_search_seconds", "histogram", "backend", "Time of one search."),
    (
        "sessionrepo_search_indexed_total",
        "counter",
        "backend",
        "Messages indexed by search catch-ups (its rate is the catch-up rate).",
    ),
    (
        "sessionrepo_outbox_pending",
        "gauge",
        "outbox",
        "Messages waiting in the outbox (read at scrape time from each watched outbox).",
    ),
    (
        "sessionrepo_outbox_dead",
        "gauge",
        "outbox",
        "Messages set aside as dead: an operator must look, then retry-dead.",
    ),
    (
        "sessionrepo_outbox_oldest_pending_age_seconds",
        "gauge",
        "outbox",
        "Age of the oldest pending outbox row (0: none); growing: nothing drains.",
    ),
    (
        "sessionrepo_search_backlog",
        "gauge",
        "store",
        "Appended messages waiting for the search catch-up.",
    ),
    (
        "sessionrepo_search_index_stale",
        "gauge",
        "store",
        "1 when the search index is stale (search refuses until a reindex), else 0.",
    ),
    (
        "sessionrepo_watch_up",
        "gauge",
        "source, at",
        "1 when this scrape read the watched outbox or store, 0 when it could not (its "
        "database is down: the other gauges of it are missing).",
    ),
)

_LATENCY_BUCKETS: Final = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip


class _Metrics:
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
        self.instruments = list(made.values())


@dataclass
class _State:
    metrics: _Metrics | None = None
    tracer: Tracer | None = None
    #: Both off: the decorated methods run as they are.
    off: bool = True


_state = _State()


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
    current = _state.metrics
    if current is not None and current.registry is registry:
        return registry
    disable_metrics()
    _state.metrics = _Metrics(registry)
    _state.off = False
    return registry


def disable_metrics() -> None:
    """Stop recording metrics; their instruments leave the registry."""
    current, _state.metrics = _state.metrics, None
    if current is not None:
        for instrument in current.instruments:
            current.registry.unregister(instrument)
    _state.off = _state.metrics is None and _state.tracer is None


def metrics_registry() -> CollectorRegistry | None:
    """The registry metrics are recorded into (``None``: metrics are off)."""
    return None if _state.metrics is None else _state.metrics.registry


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
    _state.tracer = trace.get_tracer("sessionrepo", tracer_provider=tracer_provider)
    _state.off = False


def disable_tracing() -> None:
    _state.tracer = None
    _state.off = _state.metrics is None


def exposition() -> tuple[bytes, str] | None:
    """The enabled registry in Prometheus' text format, with its content type
    (``None``: metrics are off)."""
    if _state.metrics is None:
        return None
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    return generate_latest(_state.metrics.registry), CONTENT_TYPE_LATEST


# -- the gauges read at scrape time ---------------------------------------------------------


class _Outbox(Protocol):
    @property
    def display_url(self) -> str: ...

    def status(self, *, limit: int = 100) -> OutboxStatus: ...


class _Store(Protocol):
    @property
    def display_url(self) -> str: ...

    def search_index_backlog(self) -> int: ...

    def search_index_state(self) -> tuple[str, str | None]: ...


class Watch:
    """A collector that reads an outbox's and a store's state at each scrape
    (registered by :func:`watch`; :meth:`close` unregisters it)."""

    def __init__(self, registry: CollectorRegistry, store: _Store | None, outbox: _Outbox | None):
        self.registry = registry
        self.store = store
        self.outbox = outbox
        registry.register(self)

    def describe(self) -> list[Metric]:
        return []  # gauges read live: nothing to check for duplicate names up front

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import GaugeMetricFamily

        up = GaugeMetricFamily(
            "sessionrepo_watch_up", _MEANING["sessionrepo_watch_up"], labels=["source", "at"]
        )
        if self.outbox is not None:
            where = self.outbox.display_url
            try:
                status = self.outbox.status(limit=1)
            except Exception:  # a scrape must answer even while the database is down
                up.add_metric(["outbox", where], 0.0)
            else:
                up.add_metric(["outbox", where], 1.0)
                for name, value in (
                    ("sessionrepo_outbox_pending", status.pending),
                    ("sessionrepo_outbox_dead", status.dead),
                    ("sessionrepo_outbox_oldest_pending_age_seconds", status.oldest_pending_age),
                ):
                    family = GaugeMetricFamily(name, _MEANING[name], labels=["outbox"])
                    family.add_metric([where], float(value))
                    yield family
        if self.store is not None:
            where = self.store.display_url
            try:
                backlog = self.store.search_index_backlog()
                state, _ = self.store.search_index_state()
            except Exception:
                up.add_metric(["store", where], 0.0)
            else:
                up.add_metric(["store", where], 1.0)
                for name, value in (
                    ("sessionrepo_search_backlog", backlog),
                    ("sessionrepo_search_index_stale", int(state != "ok")),
                ):
                    family = GaugeMetricFamily(name, _MEANING[name], labels=["store"])
                    family.add_metric([where], float(value))
                    yield family
        yield up

    def close(self) -> None:
        self.registry.unregister(self)


_MEANING: Final = {name: meaning for name, _, _, meaning in METRICS}


def watch(
    store: _Store | None = None,
    outbox: _Outbox | None = None,
    *,
    registry: CollectorRegistry | None = None,
) -> Watch:
    """Export ``outbox``'s pending/dead/oldest-age and ``store``'s search backlog and index
    state as gauges, read at each scrape, into ``registry`` (default: the one metrics
    were enabled with).

    Raises:
        InvalidArgument: no registry given and metrics are off.
    """
    registry = registry if registry is not None else metrics_registry()
    if registry is None:
        raise InvalidArgument("registry", "give one, or enable_metrics() first")
    return Watch(registry, store, outbox)


# -- the decorators -------------------------------------------------------------------------


def _backend(target: Any) -> str:
    repository = getattr(target, "_repository", target)
    return str(getattr(repository, "backend", "unknown"))


def _span(operation: str, target: Any, session_id: str | None) -> Any:
    tracer = _state.tracer
    if tracer is None:
        return None
    attributes: dict[str, Any] = {
        "db.system.name": _backend(target),
        "db.operation.name": operation,
    }
    if session_id is not None:
        attributes["gen_ai.conversation.id"] = session_id
    return tracer.start_as_current_span(f"sessionrepo {operation}", attributes=attributes)


def _instrument(
    operation: str,
    session_of: Callable[[tuple[Any, ...], dict[str, Any]], str | None],
    record: Callable[[_Metrics | None, Any, Any, Any, float], None],
) -> Callable[[F], F]:
    def decorate(method: F) -> F:
        @functools.wraps(method)
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            if _state.off:
                return method(self, *args, **kwargs)
            span_manager = _span(operation, self, session_of(args, kwargs))
            started = time.perf_counter()
            span: Any = None if span_manager is None else span_manager.__enter__()
            try:
                result = method(self, *args, **kwargs)
            except BaseException as exc:
                elapsed = time.perf_counter() - started
                record(_state.metrics, self, None, exc, elapsed)
                if span_manager is not None:
                    span.set_attribute("error.type", type(exc).__name__)
                    _end_span(span_manager, span, exc)
                raise
            elapsed = time.perf_counter() - started
            record(_state.metrics, self, result, None, elapsed)
            if span_manager is not None:
                _annotate(span, result)
                span_manager.__exit__(None, None, None)
            return result

        return wrapper  # type: ignore[return-value]

    return decorate


def _end_span(manager: Any, span: Any, exc: BaseException) -> None:
    from opentelemetry.trace import Status, StatusCode

    # The type only: an error's text may quote what was stored.
    span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
    manager.__exit__(None, None, None)


def _annotate(span: Any, result: Any) -> None:
    if isinstance(result, AppendResult):
        span.set_attribute("sessionrepo.messages.inserted", len(result.inserted))
        span.set_attribute("sessionrepo.messages.duplicates", len(result.duplicates))
        span.set_attribute("sessionrepo.messages.conflicts", len(result.conflicts))
    elif isinstance(result, WriteResult):
        span.set_attribute("sessionrepo.write.status", result.status)
        span.set_attribute("sessionrepo.messages.inserted", len(result.inserted))
        span.set_attribute("sessionrepo.messages.parked", result.parked)
    elif isinstance(result, DrainReport):
        span.set_attribute("sessionrepo.messages.replayed", result.replayed)
        span.set_attribute("sessionrepo.messages.failed", result.failed)
        span.set_attribute("sessionrepo.messages.dead", result.dead)
        span.set_attribute("sessionrepo.outbox.remaining", result.remaining)
    elif isinstance(result, list):
        span.set_attribute("sessionrepo.messages.count", len(result))
    elif isinstance(result, int):
        span.set_attribute("sessionrepo.messages.count", result)


def _first_session(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    value = args[0] if args else kwargs.get("session_id")
    return value if isinstance(value, str) else None


def _batch_session(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    batch = args[0] if args else kwargs.get("batch")
    value = getattr(batch, "session_id", None)
    return value if isinstance(value, str) else None


def _keyword_session(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    value = kwargs.get("session_id")
    return value if isinstance(value, str) else None


def _no_session(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    return None


def _record_append(
    metrics: _Metrics | None, target: Any, result: Any, error: Any, elapsed: float
) -> None:
    if metrics is None:
        return
    backend = _backend(target)
    if isinstance(error, QueuedBehindOutbox):
        return  # a writer's batch queued behind parked ones: the write's metrics count it
    metrics.append_seconds.labels(backend).observe(elapsed)
    if error is not None:
        metrics.append_errors.labels(backend, type(error).__name__).inc()
        return
    metrics.appends.labels(backend).inc()
    for outcome, keys in (
        ("inserted", result.inserted),
        ("duplicate", result.duplicates),
        ("conflict", result.conflicts),
    ):
        if keys:
            metrics.messages.labels(backend, outcome).inc(len(keys))


def _record_load(
    metrics: _Metrics | None, target: Any, result: Any, error: Any, elapsed: float
) -> None:
    if metrics is not None:
        backend = _backend(target)
        metrics.loads.labels(backend).inc()
        metrics.load_seconds.labels(backend).observe(elapsed)


def _record_search(
    metrics: _Metrics | None, target: Any, result: Any, error: Any, elapsed: float
) -> None:
    if metrics is not None:
        metrics.search_seconds.labels(_backend(target)).observe(elapsed)


def _record_catch_up(
    metrics: _Metrics | None, target: Any, result: Any, error: Any, elapsed: float
) -> None:
    if metrics is not None and isinstance(result, int) and result:
        metrics.indexed.labels(_backend(target)).inc(result)


def _record_write(
    metrics: _Metrics | None, target: Any, result: Any, error: Any, elapsed: float
) -> None:
    if metrics is None:
        return
    status = "error" if error is not None else result.status
    metrics.writes.labels(status).inc()
    metrics.write_seconds.labels(status).observe(elapsed)
    if error is None and result.parked:
        metrics.parked.inc(result.parked)


def _record_drain(
    metrics: _Metrics | None, target: Any, result: Any, error: Any, elapsed: float
) -> None:
    if metrics is None or error is not None:
        return
    metrics.drains.inc()
    for name, amount in (
        ("replayed", result.replayed),
        ("duplicate", result.duplicates),
        ("conflict", result.conflicts),
        ("failed", result.failed),
        ("dead", result.dead),
    ):
        if amount:
            metrics.drained.labels(name).inc(amount)


#: ``SessionRepository.append_prepared`` (every append, the writer's included).
instrument_append: Final = _instrument("append", _batch_session, _record_append)
#: ``SessionRepository.load_transcript``.
instrument_load: Final = _instrument("load", _first_session, _record_load)
#: ``SessionRepository.search`` (the query is never recorded).
instrument_search: Final = _instrument("search", _keyword_session, _record_search)
#: ``SessionRepository.catch_up_search_index``.
instrument_catch_up: Final = _instrument("index", _no_session, _record_catch_up)
#: ``TranscriptWriter.write``.
instrument_write: Final = _instrument("write", _first_session, _record_write)
#: ``TranscriptWriter.drain``.
instrument_drain: Final = _instrument("drain", _keyword_session, _record_drain)

__all__ = [
    "METRICS",
    "Watch",
    "disable_metrics",
    "disable_tracing",
    "enable_metrics",
    "enable_tracing",
    "exposition",
    "instrument_append",
    "instrument_catch_up",
    "instrument_drain",
    "instrument_load",
    "instrument_search",
    "instrument_write",
    "metrics_registry",
    "watch",
]
