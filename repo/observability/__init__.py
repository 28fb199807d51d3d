"""Metrics (Prometheus) and traces (OpenTelemetry) of the library, off until enabled.

Both are optional dependencies (``pip install 'sessionrepo[metrics]'``,
``'sessionrepo[tracing]'``) and cost nothing while off: the instrumented methods (the
append path's one entry, ``Appender.append``, which every append, write and async
append goes through; ``SessionRepository.load_transcript``, ``search``, ``catch_up_search_index``;
:meth:`TranscriptWriter.write`, ``drain``) are wrapped by the decorators below, whose
wrapper checks one flag and calls the method; the append's wrapper is not even on its
class while both are off (``installed_only_when_on``).

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

from sessionrepo.observability.decorators import (
    instrument_append,
    instrument_catch_up,
    instrument_drain,
    instrument_load,
    instrument_search,
    instrument_write,
    record_usage,
)
from sessionrepo.observability.gauges import Watch, watch
from sessionrepo.observability.switches import (
    METRICS,
    disable_metrics,
    disable_tracing,
    enable_metrics,
    enable_tracing,
    exposition,
    metrics_registry,
)

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
    "record_usage",
    "watch",
]
