"""``StageLensStatLogger``: a vLLM stat-logger plugin exporting KV-cache and engine signals.

vLLM loads it from the ``vllm.stat_logger_plugins`` entry point as soon as stagelens is
installed next to it (``STAGELENS_VLLM_PLUGIN=0`` turns it off). Per engine and model it
exports the prefix-cache lookups and hits (tokens), KV-cache usage, running and waiting
requests, preemptions, and each finished request's queue/prefill/decode time (plus the
API server's ``frontend`` share of vLLM's e2e latency), on vLLM's own ``/metrics`` (same
process registry; prometheus-client multiprocess files when vLLM runs several API servers,
which vLLM sets up before plugins load) and, when configured, as OpenTelemetry metrics over
OTLP (``STAGELENS_VLLM_OTLP_METRICS=1`` or ``OTEL_METRICS_EXPORTER=otlp``).

``record()`` runs on vLLM's output-handling event loop: it reads the stats through
``stagelens.engine_stats`` (one adapter, tolerant of missing fields) and does O(1) work per
scheduler step plus O(1) per finished request: pre-bound metric children and pre-built OTel
attribute dicts, no I/O, no locks held across awaits. OTLP export happens in the SDK's
reader thread, spans (``STAGELENS_VLLM_TRACES=1``) in a background thread of ours: never on
the loop. A dead collector is counted and logged once, never raised.
"""

from __future__ import annotations

import atexit
import collections
import logging
import os
import re
import socket
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, Final

from opentelemetry.metrics import MeterProvider
from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter
from opentelemetry.sdk.metrics import MeterProvider as SdkMeterProvider
from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricExportResult,
    MetricsData,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from vllm.v1.metrics.loggers import StatLoggerBase

from stagelens import semconv as sc
from stagelens._compat import SyncGauge, metric_exporter_preferences
from stagelens.buckets import ENGINE_PHASE_BUCKETS
from stagelens.config import env_flag
from stagelens.engine_stats import (
    FinishedRequest,
    IterationSample,
    SchedulerSample,
    read_iteration,
    read_scheduler,
)

logger = logging.getLogger("stagelens.vllm")

ENV_ENABLED: Final = "STAGELENS_VLLM_PLUGIN"
"""Set to ``0`` to disable the plugin without uninstalling stagelens."""
ENV_TRACES: Final = "STAGELENS_VLLM_TRACES"
"""Set to ``1`` to emit engine ``queue``/``prefill``/``decode`` spans from the vLLM process."""
ENV_BACKEND: Final = "STAGELENS_BACKEND"
"""``backend`` label value (default ``<hostname>/engine<index>``)."""
ENV_OTLP_METRICS: Final = "STAGELENS_VLLM_OTLP_METRICS"
"""``1`` exports the plugin's metrics over OTLP too, ``0`` never; unset follows
``OTEL_METRICS_EXPORTER`` (on only when it explicitly lists ``otlp``)."""
ENV_GPU_COLLECTOR: Final = "STAGELENS_GPU_COLLECTOR"
"""``1`` registers the NVML GPU collector on vLLM's registry (opt-in; GPU hosts)."""

_TRACE_IN_ID: Final = re.compile(r"([0-9a-f]{32})-([0-9a-f]{16})")
"""Request ids minted by stagelens's upstream instrumentation carry ``<trace>-<span>``."""


def plugin_enabled() -> bool:
    """False when ``STAGELENS_VLLM_PLUGIN`` is 0/false/off."""
    return env_flag(ENV_ENABLED, True)


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


class ErrorReporter:
    """Counts swallowed telemetry failures per component and logs the first of each.

    Called from ``record()``'s except branch and from the OTLP reader thread, so it takes a
    short lock (never held across an await: nothing here awaits)."""

    def __init__(self, counter: Counter | None) -> None:
        self._counter = counter
        self._logged: set[str] = set()
        self._lock = threading.Lock()

    def report(self, component: str, exc: BaseException | None, what: str) -> None:
        """Count one failure of ``component``; log it the first time only."""
        try:
            if self._counter is not None:
                self._counter.labels(component).inc()
            with self._lock:
                first = component not in self._logged
                self._logged.add(component)
            if first:
                logger.warning(
                    "stagelens vLLM plugin: %s (%s); vLLM is unaffected, further failures "
                    "are only counted in %s{component=%r}",
                    what,
                    exc if exc is not None else "no detail",
                    sc.TELEMETRY_ERRORS,
                    component,
                )
        except Exception:  # reporting must not fail either
            pass


class EngineMetrics:
    """The plugin's Prometheus instruments, created once per registry."""

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
        try:
            errors: Counter | None = Counter(
                sc.TELEMETRY_ERRORS,
                "Telemetry failures swallowed so that serving goes on.",
                [sc.LABEL_COMPONENT],
                registry=registry,
            )
        except ValueError:  # the gateway's instruments already own it on this registry
            errors = None
        self.errors = ErrorReporter(errors)


# Keyed by the object itself (weakly), not by id(): a freed registry's id can be reused.
_METRICS: weakref.WeakKeyDictionary[CollectorRegistry, EngineMetrics] = weakref.WeakKeyDictionary()
_METRICS_LOCK = threading.RLock()  # the OTLP pipeline is built while holding it


def engine_metrics(registry: CollectorRegistry = REGISTRY) -> EngineMetrics:
    """The registry's EngineMetrics (several engines in one process share them)."""
    with _METRICS_LOCK:
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
        self, meter_provider: MeterProvider, interval_s: float = 0.5, max_pending: int = 100_000
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
            tuple[_OtelSeries, SchedulerSample | None, IterationSample | None]
        ] = collections.deque(maxlen=max_pending)
        self._drain_lock = threading.Lock()
        self._interval_s = interval_s
        self.on_error: Callable[[BaseException], None] | None = None
        threading.Thread(target=self._run, name="stagelens-vllm-otel", daemon=True).start()

    def _run(self) -> None:
        while True:
            time.sleep(self._interval_s)
            try:
                self.drain()
            except Exception as exc:  # never let the thread die silently
                if self.on_error is not None:
                    self.on_error(exc)

    def drain(self) -> None:
        """Record everything queued so far (the thread; also before a flush or shutdown)."""
        with self._drain_lock:
            sums: dict[_OtelSeries, list[int]] = {}
            last: dict[_OtelSeries, SchedulerSample] = {}
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


_OTEL: weakref.WeakKeyDictionary[MeterProvider, OtelEngineMetrics] = weakref.WeakKeyDictionary()


def otel_engine_metrics(meter_provider: MeterProvider) -> OtelEngineMetrics:
    """The provider's OtelEngineMetrics (several engines in one process share them)."""
    with _METRICS_LOCK:
        found = _OTEL.get(meter_provider)
        if found is None:
            found = _OTEL[meter_provider] = OtelEngineMetrics(meter_provider)
        return found


class _OtelSeries:
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


class _CountingMetricExporter(MetricExporter):
    """Wraps the OTLP exporter so a failed export is counted and logged once, never raised.

    The SDK reader would log every failed export (one line per interval for as long as the
    collector is down) and the HTTP exporter one line per retry; this turns them into one
    warning plus ``stagelens_telemetry_errors_total{component="vllm_otlp_metrics"}``."""

    def __init__(
        self, wrapped: MetricExporter, on_failure: Callable[[BaseException | None], None]
    ) -> None:
        temporality, aggregation = metric_exporter_preferences(wrapped)
        super().__init__(preferred_temporality=temporality, preferred_aggregation=aggregation)
        self._wrapped = wrapped
        self._on_failure = on_failure

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        try:
            result = self._wrapped.export(metrics_data, timeout_millis=timeout_millis)
        except Exception as exc:
            self._on_failure(exc)
            return MetricExportResult.FAILURE
        if result is not MetricExportResult.SUCCESS:
            self._on_failure(None)
        return result

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self._wrapped.force_flush(timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self._wrapped.shutdown(timeout_millis=timeout_millis)


def _quiet(*logger_names: str) -> None:
    """One line per kind of exporter failure (imported late: the SDK is optional here)."""
    from stagelens.exporters.otlp import quiet_loggers

    quiet_loggers(*logger_names)


def otlp_metric_exporter() -> MetricExporter:
    """The OTLP metric exporter for ``OTEL_EXPORTER_OTLP[_METRICS]_PROTOCOL``
    (``http/protobuf`` by default, ``grpc`` with the grpc extra). The exporter itself reads
    ``OTEL_EXPORTER_OTLP[_METRICS]_ENDPOINT``, headers, timeout and temporality."""
    protocol = os.environ.get(
        "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
        os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
    ).strip()
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
            OTLPMetricExporter as GrpcMetricExporter,
        )

        _quiet(GrpcMetricExporter.__module__, "opentelemetry.exporter.otlp.proto.grpc.exporter")
        return GrpcMetricExporter()
    if protocol in ("http/protobuf", "http"):
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

        _quiet(OTLPMetricExporter.__module__, "opentelemetry.exporter.otlp.common.http")
        return OTLPMetricExporter()
    raise ValueError(f"OTEL_EXPORTER_OTLP_METRICS_PROTOCOL: unsupported {protocol!r}")


def _resource() -> Resource:
    """``OTEL_SERVICE_NAME`` / ``OTEL_RESOURCE_ATTRIBUTES`` over two defaults: the service is
    ``vllm`` and each process has its own ``service.instance.id``, because several
    API-server processes each export their own cumulative series for one engine (recent
    SDKs already set a random one; ``host:pid`` is the fallback for older ones)."""
    from_env = Resource.create({})
    defaults: dict[str, str] = {"service.instance.id": f"{socket.gethostname()}:{os.getpid()}"}
    pairs = os.environ.get("OTEL_RESOURCE_ATTRIBUTES", "").split(",")
    named = os.environ.get("OTEL_SERVICE_NAME") or any(
        pair.split("=", 1)[0].strip() == "service.name" for pair in pairs
    )
    if not named:
        defaults["service.name"] = "vllm"
    kept = {
        k: v
        for k, v in from_env.attributes.items()
        if named or k != "service.name"  # drop the SDK's "unknown_service" placeholder
    }
    return Resource(defaults).merge(Resource(kept, from_env.schema_url))


class OtlpMetricsPipeline:
    """SDK MeterProvider + PeriodicExportingMetricReader + counting OTLP exporter.

    The reader exports from its own thread every ``OTEL_METRIC_EXPORT_INTERVAL`` ms (SDK
    default 60000), so ``record()`` only updates in-memory aggregations. The provider is
    never made global: vLLM or the user may have their own."""

    def __init__(
        self,
        on_failure: Callable[[BaseException | None], None],
        exporter: MetricExporter | None = None,
    ) -> None:
        _quiet(PeriodicExportingMetricReader.__module__)
        self.reader = PeriodicExportingMetricReader(
            _CountingMetricExporter(exporter or otlp_metric_exporter(), on_failure)
        )
        # Exemplars off: measurements are replayed from a thread with no span context, so
        # the trace-based filter could never keep one and would only cost time.
        self.provider = SdkMeterProvider(
            resource=_resource(),
            metric_readers=[self.reader],
            exemplar_filter=AlwaysOffExemplarFilter(),
            shutdown_on_exit=False,  # our atexit hook drains the queue first
        )
        self.metrics = otel_engine_metrics(self.provider)
        self._closed = False
        atexit.register(self.shutdown)

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        """Record what is queued, then export now (tests, shutdown)."""
        self.metrics.drain()
        return self.provider.force_flush(timeout_millis)

    def shutdown(self) -> None:
        """Record what is queued, final export, stop; at interpreter exit too. Bounded by the
        exporter's timeout (``OTEL_EXPORTER_OTLP[_METRICS]_TIMEOUT``, 10 s by default) when
        the collector is down."""
        if self._closed:
            return
        self._closed = True
        try:
            self.metrics.drain()
            self.provider.shutdown()
        except Exception as exc:
            logger.debug("stagelens vLLM plugin: OTLP shutdown (%r)", exc)


_OTLP: list[OtlpMetricsPipeline] = []


def shared_otlp_pipeline(errors: ErrorReporter) -> OtlpMetricsPipeline:
    """The process's one OTLP pipeline, built on first use from the ``OTEL_*`` variables."""

    def failed(exc: BaseException | None) -> None:
        errors.report(sc.COMPONENT_VLLM_OTLP_METRICS, exc, "OTLP metric export failed")

    with _METRICS_LOCK:
        if not _OTLP:
            _OTLP.append(OtlpMetricsPipeline(failed))
        return _OTLP[0]


_GPU_REGISTRIES: weakref.WeakSet[CollectorRegistry] = weakref.WeakSet()


def register_gpu_collector_once(registry: CollectorRegistry, errors: ErrorReporter) -> bool:
    """Opt-in (``STAGELENS_GPU_COLLECTOR=1``): NVML GPU metrics on vLLM's registry.

    Never raises: a failing import or registration is counted and logged once. Skipped in
    prometheus multiprocess mode, where vLLM serves only the shared files and a custom
    collector would never be scraped (run ``stagelens gpu-exporter`` there instead)."""
    with _METRICS_LOCK:
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
        errors.report(sc.COMPONENT_GPU_COLLECTOR, exc, "GPU collector unavailable")
        return False
    return True


def _served_model(vllm_config: Any) -> str:
    model_config = getattr(vllm_config, "model_config", None)
    name = getattr(model_config, "served_model_name", None) or getattr(
        model_config, "model", "unknown"
    )
    if isinstance(name, list | tuple):
        name = name[0] if name else "unknown"
    return str(name)


class StageLensStatLogger(StatLoggerBase):
    """Per-engine stat logger; vLLM instantiates one per engine index."""

    def __init__(
        self,
        vllm_config: Any,
        engine_index: int = 0,
        *,
        registry: CollectorRegistry | None = None,
        meter_provider: MeterProvider | None = None,
    ) -> None:
        """Bind every series once. ``registry`` defaults to prometheus-client's global
        one (the registry vLLM serves); ``meter_provider`` (tests, embedders) records the
        OTel series there instead of the env-configured OTLP pipeline."""
        self.enabled = plugin_enabled()
        self.engine_index = engine_index
        self.model = _served_model(vllm_config)
        self.backend = os.environ.get(ENV_BACKEND) or f"{socket.gethostname()}/engine{engine_index}"
        self._spans: _SpanBuilder | None = None
        self._otel: _OtelSeries | None = None
        if not self.enabled:
            return
        registry = registry if registry is not None else REGISTRY
        m = engine_metrics(registry)
        self._errors = m.errors
        key = (self.backend, self.model)
        self._queries = m.queries.labels(*key)
        self._hits = m.hits.labels(*key)
        self._usage = m.usage.labels(*key)
        self._running = m.running.labels(*key)
        self._waiting = m.waiting.labels(*key)
        self._preemptions = m.preemptions.labels(*key)
        self._phases = (
            m.phase.labels(sc.PHASE_QUEUE, self.model),
            m.phase.labels(sc.PHASE_PREFILL, self.model),
            m.phase.labels(sc.PHASE_DECODE, self.model),
            m.phase.labels(sc.PHASE_FRONTEND, self.model),
        )
        if env_flag(ENV_TRACES, False):
            self._spans = _SpanBuilder.shared()
        try:
            if meter_provider is None and otlp_metrics_enabled():
                meter_provider = shared_otlp_pipeline(m.errors).provider
            if meter_provider is not None:
                otel = otel_engine_metrics(meter_provider)
                if otel.on_error is None:
                    errors = m.errors
                    otel.on_error = lambda exc: errors.report(
                        sc.COMPONENT_VLLM_OTLP_METRICS, exc, "OTel metric recording failed"
                    )
                self._otel = _OtelSeries(otel, self.backend, self.model)
        except Exception as exc:  # bad OTEL_* settings, missing grpc extra: metrics stay
            m.errors.report(sc.COMPONENT_VLLM_OTLP_METRICS, exc, "OTLP metrics disabled")
        if env_flag(ENV_GPU_COLLECTOR, False):
            register_gpu_collector_once(registry, m.errors)

    def record(
        self,
        scheduler_stats: Any,
        iteration_stats: Any,
        mm_cache_stats: Any = None,
        engine_idx: int = 0,
    ) -> None:
        """Record one step. Never raises into the engine: a failure is counted, logged once."""
        if not self.enabled:
            return
        try:
            s: SchedulerSample | None = None
            it: IterationSample | None = None
            if scheduler_stats is not None:
                s = read_scheduler(scheduler_stats)
                self._running.set(s.running)
                self._waiting.set(s.waiting)
                self._usage.set(s.kv_cache_usage)
                if s.prefix_queries:
                    self._queries.inc(s.prefix_queries)
                if s.prefix_hits:
                    self._hits.inc(s.prefix_hits)
            if iteration_stats is not None:
                it = read_iteration(iteration_stats)
                if it.preemptions:
                    self._preemptions.inc(it.preemptions)
                queue, prefill, decode, frontend = self._phases
                for request in it.finished:
                    queue.observe(request.queue)
                    prefill.observe(request.prefill)
                    decode.observe(request.decode)
                    if request.frontend is not None:
                        frontend.observe(request.frontend)
                if self._spans is not None and it.finished:
                    ended = float(getattr(iteration_stats, "iteration_timestamp", time.time()))
                    self._spans.submit(self.model, ended, it.finished)
            if self._otel is not None:
                self._otel.submit((self._otel, s, it))
        except Exception as exc:
            self._errors.report(sc.COMPONENT_VLLM_PLUGIN, exc, "record failed")

    def log_engine_initialized(self) -> None:
        """Say once that the plugin is active (or disabled), and where it exports."""
        logger.info(
            "stagelens vLLM plugin %s for model %r, backend %r%s",
            "active" if self.enabled else f"disabled ({ENV_ENABLED}=0)",
            self.model,
            self.backend,
            ", OTLP metrics on" if self._otel is not None else "",
        )


class _SpanBuilder:
    """Builds engine spans in a daemon thread from tuples queued by ``record()``."""

    _instance: _SpanBuilder | None = None
    _lock = threading.Lock()

    def __init__(self, max_pending: int = 10_000) -> None:
        self._pending: collections.deque[tuple[str, float, list[FinishedRequest]]] = (
            collections.deque(maxlen=max_pending)
        )
        self._wake = threading.Event()
        self._tracer: Any = None
        threading.Thread(target=self._run, name="stagelens-vllm-spans", daemon=True).start()

    @classmethod
    def shared(cls) -> _SpanBuilder:
        with cls._lock:
            if cls._instance is None:
                cls._instance = cls()
            return cls._instance

    def submit(self, model: str, ended: float, finished: list[FinishedRequest]) -> None:
        self._pending.append((model, ended, finished))
        self._wake.set()

    def _run(self) -> None:
        from opentelemetry import trace
        from stagelens.exporters import configure

        try:
            # gpu=False: vLLM installs nvidia-ml-py, and the NVML collector is opt-in here
            # (STAGELENS_GPU_COLLECTOR=1), registered by the plugin itself.
            telemetry = configure(set_global=False, gpu=False)
            self._tracer = telemetry.tracer
        except Exception as exc:
            logger.warning("stagelens vLLM plugin: tracing unavailable (%r)", exc)
            return
        while True:
            self._wake.wait(1.0)
            self._wake.clear()
            while self._pending:
                model, ended, finished = self._pending.popleft()
                for request in finished:
                    try:
                        self._emit(trace, model, ended, request)
                    except Exception as exc:
                        logger.debug("stagelens vLLM plugin: span dropped (%r)", exc)

    def _emit(self, trace: Any, model: str, ended: float, request: FinishedRequest) -> None:
        emit_engine_spans(self._tracer, model, ended, request)


def emit_engine_spans(tracer: Any, model: str, ended: float, request: FinishedRequest) -> int:
    """Emit ``queue``/``prefill``/``decode`` for one finished request; returns spans made.

    The parent is the gateway's inference span, recovered from a stagelens-minted request id
    (``<trace-id>-<span-id>``, found anywhere in vLLM's id, which adds its own prefix and
    suffix). Other ids get no spans: ``FinishedRequestStats`` carries no trace headers.
    Phases end where the next begins, the last one at the iteration that finished the request;
    the API server's ``frontend`` time is left as the gap before ``queue`` (most of it is
    prompt rendering and hand-over, before the engine core queues the request).
    """
    from opentelemetry import trace

    match = _TRACE_IN_ID.search(request.request_id or "")
    if match is None:
        return 0  # not a stagelens-minted id: nothing to join
    parent = trace.set_span_in_context(
        trace.NonRecordingSpan(
            trace.SpanContext(
                trace_id=int(match.group(1), 16),
                span_id=int(match.group(2), 16),
                is_remote=True,
                trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED),
            )
        )
    )
    end_ns = int(ended * 1e9)
    attributes = {
        sc.ATTR_STAGE: "inference",
        sc.ATTR_VLLM_REQUEST_ID: request.request_id or "",
        sc.GEN_AI_REQUEST_MODEL: model,
    }
    for name, seconds in (
        (sc.SPAN_ENGINE_DECODE, request.decode),
        (sc.SPAN_ENGINE_PREFILL, request.prefill),
        (sc.SPAN_ENGINE_QUEUE, request.queue),
    ):
        start_ns = end_ns - int(seconds * 1e9)
        span = tracer.start_span(name, context=parent, start_time=start_ns, attributes=attributes)
        span.end(end_time=end_ns)
        end_ns = start_ns
    return 3
