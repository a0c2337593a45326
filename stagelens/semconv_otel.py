"""OpenTelemetry instrument and attribute names stagelens emits: the GPU collector's OTel
variant (``hw.*`` and its own), the vLLM plugin's instruments exported over OTLP, and the
gateway's opt-in GenAI metrics.

A part of ``stagelens.semconv``, which re-exports every name (read them as ``sc.NAME``);
kept apart because they are the OpenTelemetry side of the contract, each translating to a
Prometheus name defined there. Each is declared in ``stagelens.semconv_spec``.
"""

from __future__ import annotations

from typing import Final

# OpenTelemetry hardware semantic conventions (``hw.*``) for the OTel GPU variant. Spelled
# here because opentelemetry-semantic-conventions only has them in its ``_incubating`` modules
# and not in every version we allow; tests/exporters/test_gpu_otel.py checks they match.
HW_GPU_UTILIZATION: Final = "hw.gpu.utilization"
"""OTel gauge, unit ``1``: fraction of time the GPU spent in a task (NVML util.gpu)."""
HW_GPU_MEMORY_USAGE: Final = "hw.gpu.memory.usage"
"""OTel up-down counter, unit ``By``: GPU memory used."""
HW_GPU_MEMORY_LIMIT: Final = "hw.gpu.memory.limit"
"""OTel up-down counter, unit ``By``: GPU memory size."""
HW_GPU_MEMORY_UTILIZATION: Final = "hw.gpu.memory.utilization"
"""OTel gauge, unit ``1``: fraction of GPU memory used."""
HW_POWER: Final = "hw.power"
"""OTel gauge, unit ``W``: instantaneous power of the component."""
HW_ENERGY: Final = "hw.energy"
"""OTel counter, unit ``J``: energy consumed by the component."""
HW_TEMPERATURE: Final = "hw.temperature"
"""OTel gauge, unit ``Cel``: temperature of a sensor."""
ATTR_HW_ID: Final = "hw.id"
"""Hardware component id, unique on the host: the GPU UUID (sensor: ``<uuid>/temperature``)."""
ATTR_HW_NAME: Final = "hw.name"
"""Recognisable component name: ``gpu<index>`` (the Prometheus ``gpu`` label, prefixed)."""
ATTR_HW_MODEL: Final = "hw.model"
"""Descriptive model name: the NVML product name (the Prometheus ``name`` label)."""
ATTR_HW_VENDOR: Final = "hw.vendor"
"""Component vendor: ``NVIDIA``."""
ATTR_HW_TYPE: Final = "hw.type"
"""Component type: ``gpu`` (``temperature`` for the temperature sensor)."""
ATTR_HW_PARENT: Final = "hw.parent"
"""Parent component id: the GPU UUID on its temperature sensor."""
ATTR_HW_GPU_TASK: Final = "hw.gpu.task"
"""GPU task of ``hw.gpu.utilization``: ``general`` for NVML util.gpu."""
ATTR_PROCESS_PID: Final = "process.pid"
"""OTel process id attribute on per-process GPU memory."""
ATTR_PROCESS_EXECUTABLE_NAME: Final = "process.executable.name"
"""OTel executable name attribute on per-process GPU memory (NVML's name, basename)."""
HW_TYPE_GPU: Final = "gpu"
"""``hw.type`` value for a GPU."""
HW_TYPE_TEMPERATURE: Final = "temperature"
"""``hw.type`` value for a temperature sensor."""
HW_GPU_TASK_GENERAL: Final = "general"
"""``hw.gpu.task`` value for general (compute/graphics) work."""
HW_VENDOR_NVIDIA: Final = "NVIDIA"
"""``hw.vendor`` value for NVML GPUs."""
OTEL_GPU_SM_ACTIVE: Final = "stagelens.gpu.sm.activity"
"""OTel gauge, unit ``1``: GPM SM activity (no ``hw.*`` name exists for it)."""
OTEL_GPU_SM_CLOCK: Final = "stagelens.gpu.sm.clock"
"""OTel gauge, unit ``Hz``: current SM clock."""
OTEL_GPU_CLOCK_EVENT_REASONS: Final = "stagelens.gpu.clock_event_reasons"
"""OTel gauge, unit ``1``: NVML clock-event (throttle) reasons bitmask."""
OTEL_GPU_PROCESS_MEMORY_USAGE: Final = "stagelens.gpu.process.memory.usage"
"""OTel gauge, unit ``By``: GPU memory used by one compute process."""
OTEL_GPU_COST_PER_HOUR: Final = "stagelens.gpu.cost_per_hour"
"""OTel gauge, unit ``USD/h``: configured price of one GPU-hour."""
OTEL_GPU_COLLECTOR_UP: Final = "stagelens.gpu.collector.up"
"""OTel gauge, unit ``1``: 1 when NVML answered on the last collection, else 0."""

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

# OpenTelemetry GenAI metrics of the gateway (opt-in: ``STAGELENS_GENAI_METRICS=1``), named,
# unitised and bucketed as the GenAI semantic conventions v1.41.0 define them
# (open-telemetry/semantic-conventions, model/gen-ai/metrics.yaml and
# docs/gen-ai/gen-ai-metrics.md; the names are those of opentelemetry-semantic-conventions'
# ``_incubating/metrics/gen_ai_metrics.py``, spelled here because only its ``_incubating``
# modules have them). Recorded by ``exporters/genai_metrics.py`` from each finished
# request's record; requests that made no upstream GenAI call are not GenAI operations.
OTEL_GEN_AI_SERVER_REQUEST_DURATION: Final = "gen_ai.server.request.duration"
"""OTel histogram, unit ``s``: gateway receipt to last byte sent (the semconv's
"time-to-last byte"), ``error.type`` set to the status code when the answer was an error
(4xx and 5xx, 499 for a client gone before the answer)."""
OTEL_GEN_AI_SERVER_TIME_TO_FIRST_TOKEN: Final = "gen_ai.server.time_to_first_token"
"""OTel histogram, unit ``s``: gateway receipt to the first token sent to the client, for
successful streamed responses (a non-streamed body's first byte is its last token)."""
OTEL_GEN_AI_SERVER_TIME_PER_OUTPUT_TOKEN: Final = "gen_ai.server.time_per_output_token"
"""OTel histogram, unit ``s``: (request duration - time to first token) / (output tokens -
1), as the semconv defines it, for successful streamed responses with 2+ output tokens."""
OTEL_GEN_AI_CLIENT_TOKEN_USAGE: Final = "gen_ai.client.token.usage"
"""OTel histogram, unit ``{token}``: billed input and output tokens per request (the
semconv: "instrumentation MUST report billable tokens"), one value per ``gen_ai.token.type``;
no output value for embeddings."""
GEN_AI_FOLD_TRIGGER: Final = "stagelens-genai-fold"
"""Name of an observable gauge the GenAI metrics register and that never observes anything:
its callback, which the SDK runs at the start of every collection, folds the requests still
queued, so each export has every finished request. Never exported (no data points)."""
