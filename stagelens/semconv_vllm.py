"""The vLLM plugin's names of ``stagelens.semconv``: the engine phase beyond the contract's
three, the plugin's error components, the units and OpenTelemetry instruments of its
metrics, and the engine time each request took (the plugin and the gateway both record it).

A part of ``stagelens.semconv``, which imports every name here where they stood: import
them from there, like every other name (``docs/telemetry.md`` reads both files).
"""

from __future__ import annotations

from typing import Final

PHASE_FRONTEND: Final = "frontend"
"""``phase`` label value, vLLM plugin only: the API server's share of vLLM's e2e latency
(rendering and tokenising the prompt, handing it to the engine core, receiving the last
output back), i.e. ``e2e_latency - queue - prefill - decode``. With it the four phases sum
to ``vllm:e2e_request_latency_seconds``; the gateway, which only sees the response timings,
never emits it."""
COMPONENT_VLLM_PLUGIN: Final = "vllm_plugin"
"""``component`` label value: ``StageLensStatLogger.record()`` failed (the engine went on)."""
COMPONENT_VLLM_OTLP_METRICS: Final = "vllm_otlp_metrics"
"""``component`` label value: an OTLP export of the plugin's metrics failed (collector down)."""
COMPONENT_GPU_COLLECTOR: Final = "gpu_collector"
"""``component`` label value: the NVML collector could not be imported or registered."""
COMPONENT_VLLM_TRACES: Final = "vllm_traces"
"""``component`` label value: engine spans (``STAGELENS_VLLM_TRACES=1``) could not be set up
from the ``OTEL_*`` settings, or one could not be built (the engine went on)."""
COMPONENT_GENAI_METRICS: Final = "genai_metrics"
"""``component`` label value: a batch of finished requests could not be recorded in the
GenAI OpenTelemetry metrics (``STAGELENS_GENAI_METRICS=1``); the Prometheus series were."""
COMPONENT_LEDGER: Final = "ledger"
"""``component`` label value: the reference gateway's usage ledger (SQLite, PostgreSQL)
could not be written or read; the request was served, its usage is not on record."""
COMPONENT_RATE_LIMITER: Final = "rate_limiter"
"""``component`` label value: the reference gateway's shared rate limiter (Redis) did not
answer; the request was let through unlimited."""

UNIT_SECONDS: Final = "s"
"""UCUM unit of durations; OTel->Prometheus adds ``_seconds``."""
UNIT_RATIO: Final = "1"
"""UCUM unit of 0-1 values; adds no suffix in the Python Prometheus exporter (the collector
adds ``_ratio``), so ratio instruments carry ``_ratio`` in their name and both agree."""
UNIT_TOKEN: Final = "{token}"
"""Annotation-only unit (dropped by the OTel->Prometheus translation): counted tokens."""
UNIT_REQUEST: Final = "{request}"
"""Annotation-only unit: counted requests."""
UNIT_PREEMPTION: Final = "{preemption}"
"""Annotation-only unit: counted preemptions."""

# OpenTelemetry instrument names of the vLLM plugin's metrics (exported over OTLP when
# STAGELENS_VLLM_OTLP_METRICS=1 or OTEL_METRICS_EXPORTER=otlp). Each translates, by the
# OTel->Prometheus rules (``.`` -> ``_``, unit suffix, ``_total`` on monotonic sums), to the
# Prometheus name the plugin serves on vLLM's /metrics; tests assert the translation.
OTEL_KV_CACHE_QUERIES: Final = "stagelens.kv_cache.queries"
"""Counter, ``{token}`` {backend, model} -> ``stagelens_kv_cache_queries_total``."""
OTEL_KV_CACHE_HITS: Final = "stagelens.kv_cache.hits"
"""Counter, ``{token}`` {backend, model} -> ``stagelens_kv_cache_hits_total``."""
OTEL_KV_CACHE_USAGE: Final = "stagelens.kv_cache.usage_ratio"
"""Gauge, ``1`` {backend, model} -> ``stagelens_kv_cache_usage_ratio``."""
OTEL_ENGINE_REQUESTS_RUNNING: Final = "stagelens.engine.requests.running"
"""Gauge, ``{request}`` {backend, model} -> ``stagelens_engine_requests_running``."""
OTEL_ENGINE_REQUESTS_WAITING: Final = "stagelens.engine.requests.waiting"
"""Gauge, ``{request}`` {backend, model} -> ``stagelens_engine_requests_waiting``."""
OTEL_ENGINE_PREEMPTIONS: Final = "stagelens.engine.preemptions"
"""Counter, ``{preemption}`` {backend, model} -> ``stagelens_engine_preemptions_total``."""
OTEL_ENGINE_PHASE_DURATION: Final = "stagelens.engine.phase.duration"
"""Histogram, ``s`` {phase, model} -> ``stagelens_engine_phase_duration_seconds``."""

# Engine time per request: each engine step's time split among its requests by
# the tokens each computed in it (``exporters/engine_ledger.py``, docs/engine-seconds.md).
ENGINE_SECONDS: Final = "stagelens_engine_seconds_total"
"""Counter {model, tenant}: engine seconds attributed to finished requests (the gateway: as
the engine reported each request's share; the vLLM plugin: every finished request, tenant
from its request id)."""
ENGINE_BUSY_SECONDS: Final = "stagelens_engine_busy_seconds_total"
"""Counter {backend, model}: wall time of engine steps (the requests' shares, preempted
work, and what no finished request claims: requests still running or aborted)."""
ENGINE_IDLE_SECONDS: Final = "stagelens_engine_idle_seconds_total"
"""Counter {backend, model}: engine wall time with no step running (counted a few seconds
late while it lasts)."""
ENGINE_PREEMPTED_SECONDS: Final = "stagelens_engine_preempted_seconds_total"
"""Counter {backend, model}: busy time spent computing again the tokens of requests resumed
after preemption: a part of busy time no request is charged for."""
ATTR_ENGINE_SECONDS: Final = "stagelens.engine.seconds"
"""Inference span: the request's share of the engine's time, seconds."""
ATTR_ENGINE_GPU_SECONDS: Final = "stagelens.engine.gpu_seconds"
"""Inference span: that share times the GPUs the engine holds (absent on a CPU engine)."""
