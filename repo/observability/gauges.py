"""The gauges read at scrape time: an outbox's and a store's state (:func:`watch`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Final, Protocol

from sessionrepo.errors import InvalidArgument
from sessionrepo.models.outbox import OutboxStatus
from sessionrepo.observability.switches import METRICS, metrics_registry
from sessionrepo.observability.tenants import tenant_of

if TYPE_CHECKING:  # pragma: no cover - the optional dependency's types
    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics_core import Metric


class _Outbox(Protocol):
    @property
    def display_url(self) -> str: ...

    @property
    def database(self) -> Any: ...

    def status(self, *, limit: int = 100) -> OutboxStatus: ...


class _Store(Protocol):
    @property
    def display_url(self) -> str: ...

    @property
    def database(self) -> Any: ...

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
            "sessionrepo_watch_up",
            _MEANING["sessionrepo_watch_up"],
            labels=["source", "at", "tenant"],
        )
        if self.outbox is not None:
            where = self.outbox.display_url
            # The gateway's tenant when its store is watched too: an outbox file opened
            # for no tenant is unbound, yet what it parks is the gateway's.
            tenant = tenant_of(
                self.store.database if self.store is not None else self.outbox.database
            )
            try:
                status = self.outbox.status(limit=1)
            except Exception:  # a scrape must answer even while the database is down
                up.add_metric(["outbox", where, tenant], 0.0)
            else:
                up.add_metric(["outbox", where, tenant], 1.0)
                for name, value in (
                    ("sessionrepo_outbox_pending", status.pending),
                    ("sessionrepo_outbox_dead", status.dead),
                    ("sessionrepo_outbox_oldest_pending_age_seconds", status.oldest_pending_age),
                ):
                    family = GaugeMetricFamily(name, _MEANING[name], labels=["outbox", "tenant"])
                    family.add_metric([where, tenant], float(value))
                    yield family
        if self.store is not None:
            where = self.store.display_url
            tenant = tenant_of(self.store.database)
            try:
                backlog = self.store.search_index_backlog()
                state, _ = self.store.search_index_state()
            except Exception:
                up.add_metric(["store", where, tenant], 0.0)
            else:
                up.add_metric(["store", where, tenant], 1.0)
                for name, value in (
                    ("sessionrepo_search_backlog", backlog),
                    ("sessionrepo_search_index_stale", int(state != "ok")),
                ):
                    family = GaugeMetricFamily(name, _MEANING[name], labels=["store", "tenant"])
                    family.add_metric([where, tenant], float(value))
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
