"""The vLLM plugin's metrics: Prometheus instruments on vLLM's registry, the same figures as
OpenTelemetry instruments (optionally exported over OTLP), and the opt-in GPU collector.

Why two back-ends: vLLM serves its own ``/metrics`` from prometheus-client (the same process
registry, or prometheus-client multiprocess files when vLLM runs several API servers, set up
before plugins load), so the Prometheus series are always there; OTLP is for deployments
that collect OpenTelemetry metrics instead. Both are created once per registry or meter
provider and shared by every engine of the process; the stat logger
(``stagelens.exporters.vllm_stat_logger``) binds its series once and only records.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
import weakref
from typing import Final

from opentelemetry.metrics import MeterProvider
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from stagelens.exporters.otlp import OtlpMetricsPipeline
from stagelens.exporters.vllm_stats import IterationSample, SchedulerSample

from stagelens import semconv as sc
from stagelens._compat import SyncGauge
from stagelens._failures import FailureReporter
from stagelens.config import env_flag
from stagelens.metrics.buckets import ENGINE_PHASE_BUCKETS

logger = logging.getLogger("stagelens.vllm")

ENV_OTLP_METRICS: Final = "STAGELENS_VLLM_OTLP_METRICS"
"""``1`` exports the plugin's metrics over OTLP too, ``0`` never; unset follows
``OTEL_METRICS_EXPORTER`` (on only when it explicitly lists ``otlp``)."""
ENV_GPU_COLLECTOR: Final = "STAGELENS_GPU_COLLECTOR"
"""``1`` registers the NVML GPU collector on vLLM's registry (opt-in; GPU hosts)."""
SERVICE_NAME: Final = "vllm"
"""Default ``service.name`` of what the plugin exports over OTLP (``OTEL_SERVICE_NAME``
wins)."""


def otlp_metrics_enabled() -> bool:
    """Whether to export over OTLP: ``STAGELENS_VLLM_OTLP_METRICS`` decides when set, else
    ``OTEL_METRICS_EXPORTER`` must name ``otlp``. The OTel spec's default for an unset
    ``OTEL_METRICS_EXPORTER`` is ``otlp``; the plugin deliberately stays off then, because
    it runs inside someone else's server and must not start exporting unasked."""
    explicit = env_flag(ENV_OTLP_METRICS)
    if explicit is not None:
        return explicit
    exporters = os.environ.get("OTEL_METRICS_EXPORTER", "")
    return "otlp" in {name.strip().lower() for name in exporters.split(",")}


def optional_counter(
    registry: CollectorRegistry, name: str, documentation: str, labels: list[str]
) -> Counter | None:
    """A counter the gateway's instruments also create: None when they already own it on
    this registry (a gateway and vLLM in one process), so the plugin never fails on it."""
    try:
        return Counter(name, documentation, labels, registry=registry)
    except ValueError:
        return None


class EngineMetrics:
    """The plugin's Prometheus instruments, created once per registry, and the reporter of
    the plugin's swallowed failures (counted on the same registry)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        labels = [sc.LABEL_BACKEND, sc.LABEL_MODEL]
        self.queries = Counter(
            sc.KV_CACHE_QUERIES,
            "Prompt tokens looked up in the prefix cache.",
            labels,
            registry=registry,
        )
        self.hits = Counter(
            sc.KV_CACHE_HITS,
            "Prompt tokens found in the prefix cache.",
            labels,
            registry=registry,
        )
        self.usage = Gauge(
            sc.KV_CACHE_USAGE,
            "KV-cache blocks in use, 0-1.",
            labels,
            registry=registry,
            multiprocess_mode="livemostrecent",
        )
        self.running = Gauge(
            sc.ENGINE_REQUESTS_RUNNING,
            "Requests the engine is running.",
            labels,
            registry=registry,
            multiprocess_mode="livemostrecent",
        )
        self.waiting = Gauge(
            sc.ENGINE_REQUESTS_WAITING,
            "Requests waiting in the engine queue.",
            labels,
            registry=registry,
            multiprocess_mode="livemostrecent",
        )
        self.preemptions = Counter(
            sc.ENGINE_PREEMPTIONS,
            "Requests preempted by the scheduler.",
            labels,
            registry=registry,
        )
        self.phase = Histogram(
            sc.ENGINE_PHASE_DURATION,
            "The engine's own per-request timings (queue, prefill, decode).",
            [sc.LABEL_PHASE, sc.LABEL_MODEL],
            buckets=ENGINE_PHASE_BUCKETS,
            registry=registry,
        )
        errors = optional_counter(
            registry,
            sc.TELEMETRY_ERRORS,
            "Telemetry failures swallowed so that serving goes on.",
            [sc.LABEL_COMPONENT],
        )
        count = None if errors is None else lambda component: errors.labels(component).inc()
        self.errors = FailureReporter(count, logger, unaffected="vLLM")


# Keyed by the object itself (weakly), not by id(): a freed registry's id can be reused.
_METRICS: weakref.WeakKeyDictionary[CollectorRegistry, EngineMetrics] = weakref.WeakKeyDictionary()
_OTEL: weakref.WeakKeyDictionary[MeterProvider, OtelEngineMetrics] = weakref.WeakKeyDictionary()
_OTLP: list[OtlpMetricsPipeline] = []
"""The process's one OTLP pipeline, once built."""
_LOCK = threading.RLock()  # the OTLP pipeline is built while holding it


def engine_metrics(registry: CollectorRegistry = REGISTRY) -> EngineMetrics:
    """The registry's EngineMetrics (several engines in one process share them)."""
    with _LOCK:
        found = _METRICS.get(registry)
        if found is None:
            found = _METRICS[registry] = EngineMetrics(registry)
        return found


class OtelEngineMetrics:
    """The plugin's OpenTelemetry instruments (created once per MeterProvider) and the
    daemon thread that records into them.

    Why a thread: an OTel SDK ``add``/``record`` costs tens of microseconds in Python
    (measured: recording every step directly made ``record()`` 4-5x dearer), too much for
    vLLM's output loop. ``record()`` only appends its already-read samples to a deque
    (thread-safe, O(1)); every ``interval_s`` the thread drains it, sums counters, keeps the
    last gauge values and records each finished request's phases. The exporter reads the
    aggregations later in the SDK reader's own thread.

    Names and units are chosen so that the OTel->Prometheus translation gives exactly the
    names served on ``/metrics`` (see ``stagelens.semconv.OTEL_*``)."""

    def __init__(
        self,
        meter_provider: MeterProvider,
        errors: FailureReporter,
        interval_s: float = 0.5,
        max_pending: int = 100_000,
    ) -> None:
        meter = meter_provider.get_meter(sc.INSTRUMENTATION_NAME)
        self.queries = meter.create_counter(
            sc.OTEL_KV_CACHE_QUERIES, sc.UNIT_TOKEN, "Prompt tokens looked up in the prefix cache."
        )
        self.hits = meter.create_counter(
            sc.OTEL_KV_CACHE_HITS, sc.UNIT_TOKEN, "Prompt tokens found in the prefix cache."
        )
        self.usage: SyncGauge = meter.create_gauge(
            sc.OTEL_KV_CACHE_USAGE, sc.UNIT_RATIO, "KV-cache blocks in use, 0-1."
        )
        self.running: SyncGauge = meter.create_gauge(
            sc.OTEL_ENGINE_REQUESTS_RUNNING, sc.UNIT_REQUEST, "Requests the engine is running."
        )
        self.waiting: SyncGauge = meter.create_gauge(
            sc.OTEL_ENGINE_REQUESTS_WAITING,
            sc.UNIT_REQUEST,
            "Requests waiting in the engine queue.",
        )
        self.preemptions = meter.create_counter(
            sc.OTEL_ENGINE_PREEMPTIONS, sc.UNIT_PREEMPTION, "Requests preempted by the scheduler."
        )
        self.phase = meter.create_histogram(
            sc.OTEL_ENGINE_PHASE_DURATION,
            sc.UNIT_SECONDS,
            "The engine's own per-request timings (queue, prefill, decode) and the API "
            "server's share (frontend).",
            explicit_bucket_boundaries_advisory=ENGINE_PHASE_BUCKETS,
        )
        # Bounded: at one drain per 0.5 s it overflows only past 200k steps/s.
        self.pending: collections.deque[
            tuple[OtelSeries, SchedulerSample | None, IterationSample | None]
        ] = collections.deque(maxlen=max_pending)
        self._drain_lock = threading.Lock()
        self._interval_s = interval_s
        self._errors = errors
        threading.Thread(target=self._run, name="stagelens-vllm-otel", daemon=True).start()

    def _run(self) -> None:
        while True:
            time.sleep(self._interval_s)
            try:
                self.drain()
            except Exception as exc:  # never let the thread die silently
                self._errors.report(
                    sc.COMPONENT_VLLM_OTLP_METRICS, exc, "vLLM plugin: OTel metric recording failed"
                )

    def drain(self) -> None:
        """Record everything queued so far (the thread; also before a flush or shutdown)."""
        with self._drain_lock:
            sums: dict[OtelSeries, list[int]] = {}
            last: dict[OtelSeries, SchedulerSample] = {}
            pending = self.pending
            record = self.phase.record
            while pending:
                series, s, it = pending.popleft()
                totals = sums.get(series)
                if totals is None:
                    totals = sums[series] = [0, 0, 0]
                if s is not None:
                    totals[0] += s.prefix_queries
                    totals[1] += s.prefix_hits
                    last[series] = s
                if it is not None:
                    totals[2] += it.preemptions
                    queue, prefill, decode, frontend = series.phases
                    for request in it.finished:
                        record(request.queue, queue)
                        record(request.prefill, prefill)
                        record(request.decode, decode)
                        if request.frontend is not None:
                            record(request.frontend, frontend)
            for series, (queries, hits, preemptions) in sums.items():
                attrs = series.attrs
                if queries:
                    self.queries.add(queries, attrs)
                if hits:
                    self.hits.add(hits, attrs)
                if preemptions:
                    self.preemptions.add(preemptions, attrs)
            for series, s in last.items():
                attrs = series.attrs
                self.running.set(s.running, attrs)
                self.waiting.set(s.waiting, attrs)
                self.usage.set(s.kv_cache_usage, attrs)


def otel_engine_metrics(
    meter_provider: MeterProvider, errors: FailureReporter
) -> OtelEngineMetrics:
    """The provider's OtelEngineMetrics (several engines in one process share them; the
    first one's ``errors`` reports the drain thread's failures)."""
    with _LOCK:
        found = _OTEL.get(meter_provider)
        if found is None:
            found = _OTEL[meter_provider] = OtelEngineMetrics(meter_provider, errors)
        return found


class OtelSeries:
    """One engine's OTel series: attribute dicts built once; ``submit`` is all record() does."""

    __slots__ = ("attrs", "m", "phases", "submit")

    def __init__(self, m: OtelEngineMetrics, backend: str, model: str) -> None:
        self.m = m
        self.attrs = {sc.LABEL_BACKEND: backend, sc.LABEL_MODEL: model}
        self.phases = tuple(
            {sc.LABEL_PHASE: phase, sc.LABEL_MODEL: model}
            for phase in (sc.PHASE_QUEUE, sc.PHASE_PREFILL, sc.PHASE_DECODE, sc.PHASE_FRONTEND)
        )
        self.submit = m.pending.append


def otel_series(
    meter_provider: MeterProvider | None, errors: FailureReporter, backend: str, model: str
) -> OtelSeries | None:
    """One engine's OTel series: on ``meter_provider`` when given, else on the process's
    OTLP pipeline (built from ``OTEL_*`` on first use) when OTLP metrics are enabled, else
    None. Raises ConfigurationError / DependencyMissingError for bad ``OTEL_*`` settings."""
    if meter_provider is None:
        if not otlp_metrics_enabled():
            return None
        meter_provider = _shared_pipeline(errors).provider
    return OtelSeries(otel_engine_metrics(meter_provider, errors), backend, model)


def _shared_pipeline(errors: FailureReporter) -> OtlpMetricsPipeline:
    """The process's one OTLP pipeline, with the OTel instruments' drain before each flush."""

    def failed(exc: BaseException | None) -> None:
        errors.report(sc.COMPONENT_VLLM_OTLP_METRICS, exc, "vLLM plugin: OTLP metric export failed")

    with _LOCK:
        if not _OTLP:
            pipeline = OtlpMetricsPipeline(failed, service_name=SERVICE_NAME)
            pipeline.before_flush.append(otel_engine_metrics(pipeline.provider, errors).drain)
            _OTLP.append(pipeline)
        return _OTLP[0]


_GPU_REGISTRIES: weakref.WeakSet[CollectorRegistry] = weakref.WeakSet()


def register_gpu_collector_once(registry: CollectorRegistry, errors: FailureReporter) -> bool:
    """Opt-in (``STAGELENS_GPU_COLLECTOR=1``): NVML GPU metrics on vLLM's registry.

    Never raises: a failing import or registration is counted and logged once. Skipped in
    prometheus multiprocess mode, where vLLM serves only the shared files and a custom
    collector would never be scraped (run ``stagelens gpu-exporter`` there instead)."""
    with _LOCK:
        if registry in _GPU_REGISTRIES:
            return False
        _GPU_REGISTRIES.add(registry)
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR") and registry is REGISTRY:
        logger.warning(
            "stagelens vLLM plugin: %s=1 ignored: vLLM runs in prometheus multiprocess mode, "
            "which does not serve custom collectors; run `stagelens gpu-exporter` instead",
            ENV_GPU_COLLECTOR,
        )
        return False
    try:
        from stagelens.exporters import nvml

        nvml.register_gpu_collector(registry)
    except Exception as exc:
        errors.report(sc.COMPONENT_GPU_COLLECTOR, exc, "vLLM plugin: GPU collector unavailable")
        return False
    return True
