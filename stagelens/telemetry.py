"""The wiring one instrumented app records into: tracer, the fold and its sinks, prices,
label bounds.

Why an object and not module globals: tests and multi-app processes need isolated
providers and registries; the middleware, ``stage()`` and the upstream instrumentation
reach the active one through the per-request state, so nothing on the hot path looks up
globals.
"""

from __future__ import annotations

import logging
import threading
import weakref
from typing import Any, NamedTuple, Protocol

from opentelemetry import trace
from prometheus_client import REGISTRY, CollectorRegistry, make_asgi_app

from stagelens import _compat
from stagelens import semconv as sc
from stagelens._failures import FailureReporter
from stagelens._version import __version__
from stagelens.config import Settings, answer_classes, load_settings
from stagelens.errors import ConfigurationError
from stagelens.metrics.fold import FOLD_EVERY, Fold
from stagelens.metrics.instruments import Instruments
from stagelens.metrics.prometheus import FoldOnCollect, PrometheusSink
from stagelens.model_labels import ModelLabels
from stagelens.pricing import PriceTable
from stagelens.tenants import TenantLimiter

logger = logging.getLogger("stagelens")


class Pipeline(Protocol):
    """An export pipeline a Telemetry records into besides its tracer provider (the GenAI
    metrics' OTLP pipeline, a meter provider): what :meth:`Telemetry.add_pipeline` takes."""

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Export what was recorded so far; True when it was."""
        ...

    def shutdown(self) -> None:
        """Final export, then stop."""
        ...


class _FlushOnly:
    """A pipeline stagelens records into but does not own (a meter provider the user
    gave): flushed on :meth:`Telemetry.shutdown` too, never shut down (its owner does)."""

    def __init__(self, provider: object) -> None:
        self._provider = provider

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        flush = getattr(self._provider, "force_flush", None)
        return bool(flush(timeout_millis)) if flush is not None else True

    def shutdown(self) -> None:
        self.force_flush()


class Recording(NamedTuple):
    """What one registry's requests are recorded through: the fold every finished request
    is submitted to, and the Prometheus instruments of its first sink."""

    fold: Fold
    instruments: Instruments


_BY_REGISTRY: weakref.WeakKeyDictionary[CollectorRegistry, Recording] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def recording_for(registry: CollectorRegistry, settings: Settings) -> Recording:
    """The registry's fold and instruments, created on first use: the fold, a collector
    that folds on every collection (registered before the series, so that a scrape folds,
    then reads them), the instruments, and the Prometheus sink as the fold's first sink.
    Further sinks (the GenAI metrics) are added to the same fold.

    Raises ConfigurationError when a second caller asks for different TTFT buckets on the
    same registry (the histogram cannot change buckets once created).
    """
    with _LOCK:
        found = _BY_REGISTRY.get(registry)
        if found is None:
            holder: list[Instruments] = []

            def count_failures(n: int) -> None:
                holder[0].telemetry_errors.get(sc.COMPONENT_METRICS).inc(n)

            # In multiprocess mode the scrape reads every worker's files, which a fold in
            # this process cannot precede: each record is handed over at once there.
            every = FOLD_EVERY if _compat.in_process_values() else 1
            fold = Fold(every=every, count_failures=count_failures)
            registry.register(FoldOnCollect(fold))
            holder.append(Instruments(registry, settings))
            fold.add_sink(PrometheusSink(holder[0]))
            found = _BY_REGISTRY[registry] = Recording(fold, holder[0])
        elif found.instruments.ttft_threshold != settings.ttft_slo_threshold_seconds:
            raise ConfigurationError(
                "this registry already has TTFT buckets for threshold "
                f"{found.instruments.ttft_threshold}s; use a separate registry for "
                f"{settings.ttft_slo_threshold_seconds}s"
            )
        elif found.instruments.answer_thresholds != (
            answers := tuple(seconds for _, seconds in answer_classes(settings))
        ):
            raise ConfigurationError(
                "this registry already has time-to-first-answer-token buckets for thresholds "
                f"{list(found.instruments.answer_thresholds)} s; use a separate registry for "
                f"{list(answers)} s"
            )
        return found


class Telemetry:
    """Tracer + Prometheus instruments + billing policy for one instrumented service."""

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        tracer_provider: trace.TracerProvider | None = None,
        registry: CollectorRegistry | None = None,
        exposition_registry: CollectorRegistry | None = None,
        prices: PriceTable | None = None,
    ) -> None:
        self.settings = load_settings(settings)
        self.tracer_provider = tracer_provider
        self.tracer = trace.get_tracer(
            sc.INSTRUMENTATION_NAME, __version__, tracer_provider=tracer_provider
        )
        self.registry = registry if registry is not None else REGISTRY
        self.exposition_registry = (
            exposition_registry if exposition_registry is not None else self.registry
        )
        recording = recording_for(self.registry, self.settings)
        self.fold: Fold = recording.fold
        """Where the middleware submits each finished request (``stagelens.metrics.record``)."""
        self.instruments: Instruments = recording.instruments
        if prices is None:
            prices = (
                PriceTable.load(self.settings.price_table)
                if self.settings.price_table is not None
                else PriceTable.default()
            )
        self.prices = prices
        self.tenants = TenantLimiter(
            self.settings.tenants, self.settings.max_tenants, self.settings.daily_budgets_usd
        )
        self.models = ModelLabels(
            self.settings.models, self.settings.max_models, default=self.settings.default_model
        )
        errors = self.instruments.telemetry_errors
        self._failures = FailureReporter(lambda component: errors.get(component).inc(), logger)
        self._pipelines: list[Pipeline] = []
        """Pipelines besides the tracer provider, registered by the exporters that built
        them (core never imports exporters); shared with every derived Telemetry."""

    def derive(self, *, prices: PriceTable | None = None, **overrides: Any) -> Telemetry:
        """A Telemetry recording where this one records (same tracer provider and
        registries, hence the same instruments), with ``overrides`` applied to a copy of its
        settings and ``prices`` (default: this one's). For an app that knows more than the
        environment says: its served models, its own price table.

        Raises ConfigurationError for invalid settings, or for a TTFT threshold other than
        the registry's (its buckets are fixed once created).
        """
        derived = Telemetry(
            load_settings(self.settings, **overrides),
            tracer_provider=self.tracer_provider,
            registry=self.registry,
            exposition_registry=self.exposition_registry,
            prices=prices if prices is not None else self.prices,
        )
        derived._pipelines = self._pipelines  # the same instruments feed the same pipelines
        return derived

    def metrics_app(self) -> Any:
        """An ASGI app serving this telemetry's exposition registry (for ``/metrics``)."""
        app: Any = make_asgi_app(self.exposition_registry)
        return app

    def add_pipeline(self, pipeline: Pipeline) -> None:
        """Have :meth:`force_flush` and :meth:`shutdown` cover ``pipeline`` too. Exporters
        call it for what they build beside the tracer provider (``enable_genai_metrics``
        for its OTLP metrics pipeline). Idempotent."""
        self._add(pipeline, pipeline)

    def add_flushed(self, provider: object) -> None:
        """Have :meth:`force_flush` and :meth:`shutdown` flush ``provider`` (a meter
        provider the user gave, which stagelens records into but does not own: shutdown
        flushes it and leaves it running). One without ``force_flush`` is ignored."""
        self._add(provider, _FlushOnly(provider))

    def _add(self, key: object, entry: Pipeline) -> None:
        known = [p._provider if isinstance(p, _FlushOnly) else p for p in self._pipelines]
        if not any(p is key for p in known):
            self._pipelines.append(entry)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Export now what every pipeline holds: queued spans, and the requests not yet
        folded into the GenAI metrics (tests, shutdown). True when every one flushed; a
        pipeline that raises is counted and the others still flush."""
        flushed = True
        for pipeline in list(self._pipelines):
            try:
                flushed = bool(pipeline.force_flush(timeout_millis)) and flushed
            except Exception as exc:
                self.report_error(sc.COMPONENT_SHUTDOWN_FLUSH, exc)
                flushed = False
        flush = getattr(self.tracer_provider, "force_flush", None)
        return (bool(flush(timeout_millis)) if flush is not None else True) and flushed

    def shutdown(self) -> None:
        """Final export and stop of every pipeline (call at process exit): the metrics
        pipelines first (folding records the last spans do not need), then the tracer
        provider; a pipeline that raises is counted and the others still shut down."""
        for pipeline in list(self._pipelines):
            try:
                pipeline.shutdown()
            except Exception as exc:
                self.report_error(sc.COMPONENT_SHUTDOWN_FLUSH, exc)
        shutdown = getattr(self.tracer_provider, "shutdown", None)
        if shutdown is not None:
            shutdown()

    def report_error(self, component: str, exc: BaseException) -> None:
        """Count a swallowed telemetry failure; log it the first time per component only
        (its type, never its message: see ``stagelens._failures``)."""
        self._failures.report(component, exc)


_default: Telemetry | None = None
_default_lock = threading.Lock()


def set_default_telemetry(telemetry: Telemetry | None) -> None:
    """Make ``telemetry`` what instrument_app()/stage() use when given none (configure())."""
    global _default
    _default = telemetry


def default_telemetry() -> Telemetry:
    """The configured Telemetry, or one on the global tracer provider and REGISTRY."""
    global _default
    if _default is None:
        with _default_lock:
            if _default is None:
                _default = Telemetry()
    return _default
