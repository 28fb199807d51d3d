"""The decorators on the store's and the writer's methods: one flag checked while
everything is off; otherwise a span around the call and its metrics recorded."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any, Final, TypeVar

from sessionrepo.errors import QueuedBehindOutbox
from sessionrepo.models import AppendResult
from sessionrepo.models.outbox import DrainReport, WriteResult
from sessionrepo.observability.switches import Metrics, state
from sessionrepo.observability.tenants import tenant_of

F = TypeVar("F", bound=Callable[..., Any])


def _backend(target: Any) -> str:
    repository = getattr(target, "_repository", target)
    return str(getattr(repository, "backend", "unknown"))


def _tenant(target: Any) -> str:
    """The tenant of a repository, of a writer's repository, or of an appender's
    database (its ``_db``: the appender is the store's own)."""
    repository = getattr(target, "_repository", target)
    database = getattr(repository, "database", None) or getattr(repository, "_db", None)
    return tenant_of(database)


def _span(operation: str, target: Any, session_id: str | None) -> Any:
    tracer = state.tracer
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
    record: Callable[[Metrics | None, Any, Any, Any, float], None],
) -> Callable[[F], F]:
    def decorate(method: F) -> F:
        @functools.wraps(method)
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            if state.off:
                return method(self, *args, **kwargs)
            span_manager = _span(operation, self, session_of(args, kwargs))
            started = time.perf_counter()
            span: Any = None if span_manager is None else span_manager.__enter__()
            try:
                result = method(self, *args, **kwargs)
            except BaseException as exc:
                elapsed = time.perf_counter() - started
                record(state.metrics, self, None, exc, elapsed)
                if span_manager is not None:
                    span.set_attribute("error.type", type(exc).__name__)
                    _end_span(span_manager, span, exc)
                raise
            elapsed = time.perf_counter() - started
            record(state.metrics, self, result, None, elapsed)
            if span_manager is not None:
                _annotate(span, result)
                span_manager.__exit__(None, None, None)
            return result

        return wrapper  # type: ignore[return-value]

    return decorate


class _InstalledWhenOn:
    """A method whose wrapper is on its class only while metrics or tracing are on: while
    both are off, a call is the method's own (no wrapper frame, no flag read)."""

    def __init__(self, method: Any, wrapper: Any) -> None:
        self.method = method
        self.wrapper = wrapper

    def __set_name__(self, owner: type, name: str) -> None:
        def install(off: bool) -> None:
            setattr(owner, name, self.method if off else self.wrapper)

        state.listeners.append(install)
        install(state.off)


def installed_only_when_on(instrument: Callable[[F], F]) -> Callable[[F], F]:
    """``instrument`` (one of the decorators below) for a method looked up on its class at
    every call (never captured as a function, as ``aio.awaited`` does): its wrapper is
    installed when metrics or tracing are enabled and removed when both are disabled."""

    def decorate(method: F) -> F:
        return _InstalledWhenOn(method, instrument(method))  # type: ignore[return-value]

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
    metrics: Metrics | None, target: Any, result: Any, error: Any, elapsed: float
) -> None:
    if metrics is None:
        return
    if isinstance(error, QueuedBehindOutbox):
        return  # a writer's batch queued behind parked ones: the write's metrics count it
    backend, tenant = _backend(target), _tenant(target)
    metrics.append_seconds.labels(backend, tenant).observe(elapsed)
    if error is not None:
        metrics.append_errors.labels(backend, type(error).__name__, tenant).inc()
        return
    metrics.appends.labels(backend, tenant).inc()
    for outcome, keys in (
        ("inserted", result.inserted),
        ("duplicate", result.duplicates),
        ("conflict", result.conflicts),
        ("erased", result.erased),
    ):
        if keys:
            metrics.messages.labels(backend, outcome, tenant).inc(len(keys))


def _record_load(
    metrics: Metrics | None, target: Any, result: Any, error: Any, elapsed: float
) -> None:
    if metrics is not None:
        labels = (_backend(target), _tenant(target))
        metrics.loads.labels(*labels).inc()
        metrics.load_seconds.labels(*labels).observe(elapsed)


def _record_search(
    metrics: Metrics | None, target: Any, result: Any, error: Any, elapsed: float
) -> None:
    if metrics is not None:
        metrics.search_seconds.labels(_backend(target), _tenant(target)).observe(elapsed)


def _record_catch_up(
    metrics: Metrics | None, target: Any, result: Any, error: Any, elapsed: float
) -> None:
    if metrics is not None and isinstance(result, int) and result:
        metrics.indexed.labels(_backend(target), _tenant(target)).inc(result)


def _record_write(
    metrics: Metrics | None, target: Any, result: Any, error: Any, elapsed: float
) -> None:
    if metrics is None:
        return
    status = "error" if error is not None else result.status
    tenant = _tenant(target)
    metrics.writes.labels(status, tenant).inc()
    metrics.write_seconds.labels(status, tenant).observe(elapsed)
    if error is None and result.parked:
        metrics.parked.labels(tenant).inc(result.parked)


def _record_drain(
    metrics: Metrics | None, target: Any, result: Any, error: Any, elapsed: float
) -> None:
    if metrics is None or error is not None:
        return
    tenant = _tenant(target)
    metrics.drains.labels(tenant).inc()
    for name, amount in (
        ("replayed", result.replayed),
        ("duplicate", result.duplicates),
        ("conflict", result.conflicts),
        ("erased", result.erased),
        ("failed", result.failed),
        ("dead", result.dead),
    ):
        if amount:
            metrics.drained.labels(name, tenant).inc(amount)


#: ``Appender.append`` (every append: ``SessionRepository.append``, ``append_prepared``,
#: the writer's, the async API's): installed only while something is on.
instrument_append: Final = installed_only_when_on(
    _instrument("append", _batch_session, _record_append)
)
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


def record_usage(records: Any, database: Any = None) -> None:
    """Count usage records the ledger inserted (``Usage`` objects) into ``database`` (the
    ledger's: its tenant labels them), when metrics are on: after the commit on the
    ledger's own paths; inside a caller's unit of work (``SessionTransaction.record_usage``)
    at the insert, so a rollback after it counts records that were not kept."""
    metrics = state.metrics
    if metrics is None or not records:
        return
    tenant = tenant_of(database)
    for record in records:
        model = record.model or ""
        metrics.usage_calls.labels(model, tenant).inc()
        for kind in ("input", "output", "cache_read", "cache_write", "reasoning"):
            count = getattr(record, f"{kind}_tokens")
            if count:
                metrics.usage_tokens.labels(model, kind, tenant).inc(count)
        if record.reported_cost:
            metrics.usage_cost.labels(model, record.currency, tenant).inc(record.reported_cost)
