"""``StageLensStatLogger``: a vLLM stat-logger plugin exporting KV-cache and engine signals.

vLLM loads it from the ``vllm.stat_logger_plugins`` entry point as soon as stagelens is
installed next to it (``STAGELENS_VLLM_PLUGIN=0`` turns it off). Per engine and model it
exports the prefix-cache lookups and hits (tokens), KV-cache usage, running and waiting
requests, preemptions, and each finished request's queue/prefill/decode time, on vLLM's own
``/metrics`` (same process registry; prometheus-client multiprocess files when vLLM runs
several API servers, which vLLM sets up before plugins load).

``record()`` runs on vLLM's output-handling event loop: it reads the stats through
``stagelens.engine_stats`` (one adapter, tolerant of missing fields) and does O(1) work per
scheduler step plus O(1) per finished request: pre-bound metric children, no I/O, no locks
held across awaits. Spans (``STAGELENS_VLLM_TRACES=1``) are queued as tuples and built by a
background thread, never on the loop.
"""

from __future__ import annotations

import collections
import logging
import os
import re
import socket
import threading
import time
from typing import Any, Final

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from vllm.v1.metrics.loggers import StatLoggerBase

from stagelens import semconv as sc
from stagelens.buckets import ENGINE_PHASE_BUCKETS
from stagelens.engine_stats import FinishedRequest, read_iteration, read_scheduler

logger = logging.getLogger("stagelens.vllm")

ENV_ENABLED: Final = "STAGELENS_VLLM_PLUGIN"
"""Set to ``0`` to disable the plugin without uninstalling stagelens."""
ENV_TRACES: Final = "STAGELENS_VLLM_TRACES"
"""Set to ``1`` to emit engine ``queue``/``prefill``/``decode`` spans from the vLLM process."""
ENV_BACKEND: Final = "STAGELENS_BACKEND"
"""``backend`` label value (default ``<hostname>/engine<index>``)."""

_TRACE_IN_ID: Final = re.compile(r"([0-9a-f]{32})-([0-9a-f]{16})")
"""Request ids minted by stagelens's upstream instrumentation carry ``<trace>-<span>``."""


def plugin_enabled() -> bool:
    """False when ``STAGELENS_VLLM_PLUGIN`` is 0/false/off."""
    return os.environ.get(ENV_ENABLED, "1").strip().lower() not in {"0", "false", "off", "no"}


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


_METRICS: dict[int, EngineMetrics] = {}
_METRICS_LOCK = threading.Lock()


def engine_metrics(registry: CollectorRegistry = REGISTRY) -> EngineMetrics:
    """The registry's EngineMetrics (several engines in one process share them)."""
    with _METRICS_LOCK:
        found = _METRICS.get(id(registry))
        if found is None:
            found = _METRICS[id(registry)] = EngineMetrics(registry)
        return found


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
    ) -> None:
        self.enabled = plugin_enabled()
        self.engine_index = engine_index
        self.model = _served_model(vllm_config)
        self.backend = os.environ.get(ENV_BACKEND) or f"{socket.gethostname()}/engine{engine_index}"
        self._spans: _SpanBuilder | None = None
        self._failed = False
        if not self.enabled:
            return
        m = engine_metrics(registry if registry is not None else REGISTRY)
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
        )
        if os.environ.get(ENV_TRACES, "").strip() in {"1", "true"}:
            self._spans = _SpanBuilder.shared()

    def record(
        self,
        scheduler_stats: Any,
        iteration_stats: Any,
        mm_cache_stats: Any = None,
        engine_idx: int = 0,
    ) -> None:
        """Record one step. Never raises into the engine: a failure is logged once."""
        if not self.enabled:
            return
        try:
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
                queue, prefill, decode = self._phases
                for request in it.finished:
                    queue.observe(request.queue)
                    prefill.observe(request.prefill)
                    decode.observe(request.decode)
                if self._spans is not None and it.finished:
                    ended = float(getattr(iteration_stats, "iteration_timestamp", time.time()))
                    self._spans.submit(self.model, ended, it.finished)
        except Exception as exc:
            if not self._failed:
                self._failed = True
                logger.warning("stagelens vLLM plugin: record failed (%r); engine unaffected", exc)

    def log_engine_initialized(self) -> None:
        """Say once that the plugin is active (or disabled)."""
        logger.info(
            "stagelens vLLM plugin %s for model %r, backend %r",
            "active" if self.enabled else f"disabled ({ENV_ENABLED}=0)",
            self.model,
            self.backend,
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
            telemetry = configure(set_global=False)
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
    Phases end where the next begins, the last one at the iteration that finished the request.
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
