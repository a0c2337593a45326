"""``StageLensStatLogger``: the vLLM stat-logger plugin (the ``vllm.stat_logger_plugins``
entry point), exporting KV-cache and engine signals.

vLLM loads it as soon as stagelens is installed next to it (``STAGELENS_VLLM_PLUGIN=0``
turns it off). Per engine and model it exports the prefix-cache lookups and hits (tokens),
KV-cache usage, running and waiting requests, preemptions, each finished request's
queue/prefill/decode time (plus the API server's ``frontend`` share of vLLM's e2e latency),
and the engine's time: busy, idle and preempted seconds, and each finished request's share
by tenant (``vllm_engine_time``).

The shape is vLLM's own ``v1/metrics``: the stats are read into plain data by one adapter
(``vllm_stats``, like vLLM's ``stats.py``), and this logger only hands them to the
exporters: the metrics (``vllm_metrics``: vLLM's ``/metrics``, and OTLP when asked), the
engine's time (``vllm_engine_time``) and the engine spans (``vllm_spans``,
``STAGELENS_VLLM_TRACES=1``).

``record()`` runs on vLLM's output-handling event loop and does O(1) work per scheduler
step plus O(log N) per finished request (N: the engine-time ring, about the context length
in steps): pre-bound metric children and pre-built OTel attribute dicts, no I/O, no locks
held across awaits. OTLP export and span building run in threads of their own. A failure
is counted and logged once, never raised into the engine.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from typing import Any, Final

from opentelemetry.metrics import MeterProvider
from prometheus_client import REGISTRY, CollectorRegistry
from stagelens.exporters.vllm_engine_time import EngineTime
from stagelens.exporters.vllm_metrics import (
    ENV_GPU_COLLECTOR,
    OtelSeries,
    engine_metrics,
    otel_series,
    register_gpu_collector_once,
)
from stagelens.exporters.vllm_spans import ENV_TRACES, EngineSpans, engine_spans
from stagelens.exporters.vllm_stats import (
    IterationSample,
    SchedulerSample,
    read_iteration,
    read_scheduler,
)
from vllm.v1.metrics.loggers import StatLoggerBase

from stagelens import semconv as sc
from stagelens.config import env_flag
from stagelens.settings_env import report_unknown_variables

logger = logging.getLogger("stagelens.vllm")

ENV_ENABLED: Final = "STAGELENS_VLLM_PLUGIN"
"""Set to ``0`` to disable the plugin without uninstalling stagelens."""
ENV_BACKEND: Final = "STAGELENS_BACKEND"
"""``backend`` label value (default ``<hostname>/engine<index>``)."""


def plugin_enabled() -> bool:
    """False when ``STAGELENS_VLLM_PLUGIN`` is 0/false/off."""
    return env_flag(ENV_ENABLED, True)


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
        # A mistyped variable (STAGELENS_VLLM_TRACE) would leave its feature off in silence:
        # each unknown name is warned about once per process. Never raised here, strict or
        # not: refusing to start belongs to the gateway's configure(), not to vLLM's engine.
        report_unknown_variables(os.environ, strict=False)
        self.enabled = plugin_enabled()
        self.engine_index = engine_index
        self.model = _served_model(vllm_config)
        self.backend = os.environ.get(ENV_BACKEND) or f"{socket.gethostname()}/engine{engine_index}"
        self._spans: EngineSpans | None = None
        self._otel: OtelSeries | None = None
        self._engine_time: EngineTime | None = None
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
            try:
                self._spans = engine_spans(registry, m.errors)
            except Exception as exc:  # bad OTEL_* settings: metrics stay
                m.errors.report(sc.COMPONENT_VLLM_TRACES, exc, "vLLM plugin: engine spans off")
        try:
            self._otel = otel_series(meter_provider, m.errors, self.backend, self.model)
        except Exception as exc:  # bad OTEL_* settings, missing grpc extra: metrics stay
            m.errors.report(sc.COMPONENT_VLLM_OTLP_METRICS, exc, "vLLM plugin: OTLP metrics off")
        if env_flag(ENV_GPU_COLLECTOR, False):
            register_gpu_collector_once(registry, m.errors)
        try:
            self._engine_time = EngineTime(vllm_config, m, self.backend, self.model)
        except Exception as exc:  # an unexpected config: the other metrics stay
            m.errors.report(sc.COMPONENT_VLLM_PLUGIN, exc, "vLLM plugin: engine time off")

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
            if self._engine_time is not None and (s is not None or it is not None):
                self._engine_time.record(s, it)
            if self._otel is not None:
                self._otel.submit((self._otel, s, it))
        except Exception as exc:
            self._errors.report(sc.COMPONENT_VLLM_PLUGIN, exc, "vLLM plugin: record failed")

    def log_engine_initialized(self) -> None:
        """Say once that the plugin is active (or disabled), and where it exports."""
        logger.info(
            "stagelens vLLM plugin %s for model %r, backend %r%s%s",
            "active" if self.enabled else f"disabled ({ENV_ENABLED}=0)",
            self.model,
            self.backend,
            ", OTLP metrics on" if self._otel is not None else "",
            ", engine spans on" if self._spans is not None else "",
        )
