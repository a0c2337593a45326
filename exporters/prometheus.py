"""Prometheus registry policy, in one place.

Why here: prometheus-client has two modes. Single process: metrics live in a registry
(``REGISTRY`` unless one is injected) and that registry is scraped. Multiprocess (a gateway
run with several workers, ``PROMETHEUS_MULTIPROC_DIR`` set before start): every process
writes its values to files in that directory and the scrape must aggregate them with a
``MultiProcessCollector`` in a fresh registry, or a multi-worker gateway undercounts.
Custom collectors (NVML) do not work through the files; they are registered on the
exposition registry of the process that serves ``/metrics``.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Final

from prometheus_client import REGISTRY, CollectorRegistry, make_asgi_app
from prometheus_client import multiprocess as _multiprocess
from prometheus_client.registry import Collector

# prometheus_client.multiprocess has no annotations; used through an Any alias.
multiprocess: Any = _multiprocess

MULTIPROC_ENV: Final = "PROMETHEUS_MULTIPROC_DIR"
"""prometheus-client's switch for multiprocess mode."""

ASGIApp = Callable[
    [
        MutableMapping[str, Any],
        Callable[[], Awaitable[MutableMapping[str, Any]]],
        Callable[[MutableMapping[str, Any]], Awaitable[None]],
    ],
    Awaitable[None],
]


def multiprocess_enabled() -> bool:
    """True when ``PROMETHEUS_MULTIPROC_DIR`` names a directory (multi-worker mode)."""
    path = os.environ.get(MULTIPROC_ENV)
    return bool(path) and os.path.isdir(path or "")


def recording_registry(registry: CollectorRegistry | None = None) -> CollectorRegistry:
    """Where instruments are created: the injected registry or ``REGISTRY``."""
    return registry if registry is not None else REGISTRY


def exposition_registry(registry: CollectorRegistry | None = None) -> CollectorRegistry:
    """What ``/metrics`` serves: in multiprocess mode a fresh registry that aggregates
    every worker's files, otherwise the recording registry itself."""
    if multiprocess_enabled():
        # One per process and directory, so that collectors registered for exposition
        # (NVML) land on the registry that /metrics actually serves.
        path = os.environ[MULTIPROC_ENV]
        aggregate = _aggregates.get(path)
        if aggregate is None:
            aggregate = CollectorRegistry()
            multiprocess.MultiProcessCollector(aggregate, path=path)
            _aggregates[path] = aggregate
        return aggregate
    return recording_registry(registry)


_aggregates: dict[str, CollectorRegistry] = {}


def register_collector(collector: Collector, registry: CollectorRegistry | None = None) -> None:
    """Register a scrape-time collector (e.g. NVML) where ``/metrics`` will find it."""
    (registry if registry is not None else exposition_registry()).register(collector)


def metrics_app(registry: CollectorRegistry | None = None) -> ASGIApp:
    """An ASGI app serving the exposition registry (mount it at ``/metrics``)."""
    app: ASGIApp = make_asgi_app(registry if registry is not None else exposition_registry())
    return app
