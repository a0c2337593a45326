"""Every name stagelens emits: span names, attribute keys, metric names, label names, units.

Why one module: dashboards, alert rules, tests and users' own queries depend on these
strings (``../shared/CONTRACT.md`` is the binding list). Code never spells a name inline; it
imports the constant from here, so a rename is one edit plus the places the type checker
and the drift checks point at.

Prometheus names follow the naming guide: ``stagelens_`` prefix, base units with a plural
suffix, ``_total`` on counters, ``_ratio`` for 0-1 values. The OpenTelemetry GenAI attribute
keys are the v1.41 semantic-convention names.
"""

from __future__ import annotations

from typing import Final

# --------------------------------------------------------------------------------------
# Instrumentation scope
# --------------------------------------------------------------------------------------
INSTRUMENTATION_NAME: Final = "stagelens"
"""Tracer/meter name (instrumentation scope) for everything stagelens records."""

# --------------------------------------------------------------------------------------
# Span attributes
# --------------------------------------------------------------------------------------
ATTR_STAGE: Final = "stagelens.stage"
"""Stage name on every stage span (one of the seven canonical stages or a user stage)."""
ATTR_TENANT: Final = "stagelens.tenant"
"""Bounded tenant name (configured name or short key hash), never the API key."""
ATTR_REJECTED_BY: Final = "stagelens.rejected_by"
"""On the root span: the stage that rejected the request (4xx/5xx answered by us)."""
ATTR_TTFT: Final = "stagelens.time_to_first_token"
"""On the root span: seconds from gateway receipt to the first content byte sent."""
ATTR_COST_USD: Final = "stagelens.cost_usd"
"""On the billing span: the request's cost from the price table, in USD."""
ATTR_VLLM_REQUEST_ID: Final = "stagelens.vllm.request_id"
"""On the inference span: the request id the vLLM server used (links the engine side)."""
ATTR_REQUEST_ID: Final = "stagelens.request_id"
"""The ``X-Request-Id`` stagelens propagated upstream."""
ATTR_BACKEND: Final = "stagelens.backend"
"""The backend (``host:port``) the load balancer chose."""
ATTR_CLIENT_DISCONNECTED: Final = "stagelens.client_disconnected"
"""True when the client went away before the last byte was sent."""

# GenAI semantic conventions (v1.41 names).
GEN_AI_OPERATION_NAME: Final = "gen_ai.operation.name"
"""``chat`` or ``text_completion``."""
GEN_AI_PROVIDER_NAME: Final = "gen_ai.provider.name"
"""Always ``vllm`` for the engine stagelens wraps."""
GEN_AI_REQUEST_MODEL: Final = "gen_ai.request.model"
"""Model name the client asked for."""
GEN_AI_REQUEST_MAX_TOKENS: Final = "gen_ai.request.max_tokens"
"""``max_tokens`` / ``max_completion_tokens`` of the request, when given."""
GEN_AI_REQUEST_STREAM: Final = "gen_ai.request.stream"
"""Whether the client asked for a streamed (SSE) response."""
GEN_AI_RESPONSE_ID: Final = "gen_ai.response.id"
"""The completion id returned by the server."""
GEN_AI_RESPONSE_MODEL: Final = "gen_ai.response.model"
"""The model name the server answered with."""
GEN_AI_RESPONSE_FINISH_REASONS: Final = "gen_ai.response.finish_reasons"
"""Finish reasons of every choice, as a string array."""
GEN_AI_USAGE_INPUT_TOKENS: Final = "gen_ai.usage.input_tokens"
"""Prompt tokens, cached ones included."""
GEN_AI_USAGE_OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"
"""Completion tokens."""
GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: Final = "gen_ai.usage.cache_read.input_tokens"
"""Prompt tokens served from the prefix cache (part of the input tokens)."""
GEN_AI_INPUT_MESSAGES: Final = "gen_ai.input.messages"
"""Prompt content; recorded only when content capture is enabled."""
GEN_AI_OUTPUT_MESSAGES: Final = "gen_ai.output.messages"
"""Completion content; recorded only when content capture is enabled."""
SERVER_ADDRESS: Final = "server.address"
"""Host of the upstream server."""
SERVER_PORT: Final = "server.port"
"""Port of the upstream server."""
ERROR_TYPE: Final = "error.type"
"""Exception class name or HTTP status code on failure."""

GEN_AI_PROVIDER_VLLM: Final = "vllm"
"""Value of ``gen_ai.provider.name`` for vLLM."""
GEN_AI_OPERATION_CHAT: Final = "chat"
"""``gen_ai.operation.name`` for chat completions."""
GEN_AI_OPERATION_TEXT_COMPLETION: Final = "text_completion"
"""``gen_ai.operation.name`` for legacy completions."""

CAPTURE_MESSAGE_CONTENT_ENV: Final = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
"""Environment variable that opts in to recording prompt/completion text (off by default)."""

# --------------------------------------------------------------------------------------
# Span names
# --------------------------------------------------------------------------------------
SPAN_ENGINE_QUEUE: Final = "queue"
"""Child of the inference span: time the request waited in the engine's queue."""
SPAN_ENGINE_PREFILL: Final = "prefill"
"""Child of the inference span: prompt processing up to the first token."""
SPAN_ENGINE_DECODE: Final = "decode"
"""Child of the inference span: first token to last token."""

# --------------------------------------------------------------------------------------
# HTTP headers
# --------------------------------------------------------------------------------------
HEADER_REQUEST_ID: Final = "x-request-id"
"""Request id propagated to the vLLM server (vLLM uses it as its own request id)."""

# --------------------------------------------------------------------------------------
# Prometheus metrics (exposed names) and labels
# --------------------------------------------------------------------------------------
METRIC_PREFIX: Final = "stagelens_"
"""Prefix of every metric stagelens exposes."""

STAGE_DURATION: Final = "stagelens_stage_duration_seconds"
"""Histogram {stage, model}: time spent in each stage."""
REQUEST_DURATION: Final = "stagelens_request_duration_seconds"
"""Histogram {model, code}: gateway receipt to last byte sent."""
TIME_TO_FIRST_TOKEN: Final = "stagelens_time_to_first_token_seconds"
"""Histogram {model}: gateway receipt to first content token sent to the client."""
INTER_TOKEN_LATENCY: Final = "stagelens_inter_token_latency_seconds"
"""Histogram {model}: gap between consecutive streamed tokens."""
ENGINE_PHASE_DURATION: Final = "stagelens_engine_phase_duration_seconds"
"""Histogram {phase, model}: the engine's own per-request timings."""
REQUESTS: Final = "stagelens_requests_total"
"""Counter {model, code}: finished requests, any outcome."""
TOKENS: Final = "stagelens_tokens_total"
"""Counter {model, tenant, type}: tokens billed; cached_input is part of input."""
COST_USD: Final = "stagelens_cost_usd_total"
"""Counter {model, tenant}: cost from the price table."""
BUDGET_USD: Final = "stagelens_budget_usd"
"""Gauge {tenant, window}: configured spend budget."""
STAGE_BUDGET: Final = "stagelens_stage_budget_seconds"
"""Gauge {stage}: configured latency budget per stage."""
KV_CACHE_QUERIES: Final = "stagelens_kv_cache_queries_total"
"""Counter {backend, model}: prompt tokens looked up in the prefix cache."""
KV_CACHE_HITS: Final = "stagelens_kv_cache_hits_total"
"""Counter {backend, model}: of those, tokens found."""
KV_CACHE_USAGE: Final = "stagelens_kv_cache_usage_ratio"
"""Gauge {backend, model}: KV-cache blocks in use, 0-1."""
ENGINE_REQUESTS_RUNNING: Final = "stagelens_engine_requests_running"
"""Gauge {backend, model}: requests the engine is running (scheduler stats)."""
ENGINE_REQUESTS_WAITING: Final = "stagelens_engine_requests_waiting"
"""Gauge {backend, model}: requests waiting in the engine's queue (scheduler stats)."""
ENGINE_PREEMPTIONS: Final = "stagelens_engine_preemptions_total"
"""Counter {backend, model}: requests preempted by the scheduler."""
GPU_UTILIZATION: Final = "stagelens_gpu_utilization_ratio"
"""Gauge {gpu, uuid, name}: NVML fraction of time a kernel ran (liveness, not load)."""
GPU_SM_ACTIVE: Final = "stagelens_gpu_sm_active_ratio"
"""Gauge {gpu, uuid, name}: NVML GPM SM activity, where supported."""
GPU_MEMORY_USED: Final = "stagelens_gpu_memory_used_bytes"
"""Gauge {gpu, uuid, name}: framebuffer in use."""
GPU_MEMORY_TOTAL: Final = "stagelens_gpu_memory_total_bytes"
"""Gauge {gpu, uuid, name}: framebuffer size."""
GPU_POWER: Final = "stagelens_gpu_power_watts"
"""Gauge {gpu, uuid, name}: board power."""
GPU_ENERGY: Final = "stagelens_gpu_energy_joules_total"
"""Counter {gpu, uuid, name}: energy since driver load."""
GPU_TEMPERATURE: Final = "stagelens_gpu_temperature_celsius"
"""Gauge {gpu, uuid, name}: core temperature."""
GPU_COLLECTOR_UP: Final = "stagelens_gpu_collector_up"
"""Gauge: 1 when NVML answered on the last scrape, else 0."""
GPU_SM_CLOCK: Final = "stagelens_gpu_sm_clock_hertz"
"""Gauge {gpu, uuid, name}: current SM clock (NVML MHz converted to Hz)."""
GPU_CLOCK_EVENT_REASONS: Final = "stagelens_gpu_clock_event_reasons"
"""Gauge {gpu, uuid, name}: NVML clock-event (throttle) reasons bitmask (0x1 idle, 0x4 SW cap)."""
GPU_PROCESS_MEMORY_USED: Final = "stagelens_gpu_process_memory_used_bytes"
"""Gauge {gpu, uuid, name, pid}: framebuffer used by one compute process."""
GPU_COST_PER_HOUR: Final = "stagelens_gpu_cost_usd_per_hour"
"""Gauge {gpu, uuid, name}: configured price of one GPU-hour (STAGELENS_GPU_COST_USD_PER_HOUR)."""
LABEL_PID: Final = "pid"
"""Operating-system process id."""
REJECTIONS: Final = "stagelens_rejections_total"
"""Counter {stage, model, code}: requests answered with an error by the stage that rejected
them (401/429 at the gateway, 404 at the router, 400 at the tokenizer, ...)."""
TELEMETRY_ERRORS: Final = "stagelens_telemetry_errors_total"
"""Counter {component}: telemetry failures swallowed so serving goes on (hooks, exporters)."""
SPANS_DROPPED: Final = "stagelens_spans_dropped_total"
"""Counter {reason}: spans that could not be exported (queue full, export failed)."""

LABEL_STAGE: Final = "stage"
"""Stage label (canonical or user stage name)."""
LABEL_MODEL: Final = "model"
"""Served model name."""
LABEL_CODE: Final = "code"
"""HTTP status code as a string."""
LABEL_TENANT: Final = "tenant"
"""Bounded tenant: top-N configured tenants, everything else ``other``."""
LABEL_TYPE: Final = "type"
"""Token type: input, output, cached_input."""
LABEL_PHASE: Final = "phase"
"""Engine phase: queue, prefill, decode."""
LABEL_WINDOW: Final = "window"
"""Budget window, e.g. ``1d``."""
LABEL_BACKEND: Final = "backend"
"""Engine/backend identity (``host:port`` or engine index)."""
LABEL_GPU: Final = "gpu"
"""GPU index as NVML enumerates it."""
LABEL_UUID: Final = "uuid"
"""GPU UUID."""
LABEL_NAME: Final = "name"
"""GPU product name."""
LABEL_COMPONENT: Final = "component"
"""Telemetry component that failed (hook, exporter, nvml, vllm_plugin, ...)."""
LABEL_REASON: Final = "reason"
"""Why something was dropped."""

TOKEN_TYPE_INPUT: Final = "input"
"""``type`` label value: prompt tokens, cached included."""
TOKEN_TYPE_OUTPUT: Final = "output"
"""``type`` label value: completion tokens."""
TOKEN_TYPE_CACHED_INPUT: Final = "cached_input"
"""``type`` label value: prompt tokens served from the prefix cache."""
PHASE_QUEUE: Final = SPAN_ENGINE_QUEUE
"""``phase`` label value for the engine queue."""
PHASE_PREFILL: Final = SPAN_ENGINE_PREFILL
"""``phase`` label value for prefill."""
PHASE_DECODE: Final = SPAN_ENGINE_DECODE
"""``phase`` label value for decode."""
TENANT_OTHER: Final = "other"
"""Tenant label for every tenant outside the configured top-N."""
BUDGET_WINDOW_DAY: Final = "1d"
"""The daily budget window."""

# --------------------------------------------------------------------------------------
# Alerts and recording rules
# --------------------------------------------------------------------------------------
ALERT_TTFT_BUDGET_BURN: Final = "StagelensTTFTBudgetBurn"
"""Multi-window multi-burn-rate alert on the TTFT SLI."""
ALERT_TTFT_P95_HIGH: Final = "StagelensTTFTP95High"
"""P95 TTFT above the threshold for 10 minutes."""
ALERT_COST_BUDGET_BURN: Final = "StagelensCostBudgetBurn"
"""Spend rate against the daily budget."""

# --------------------------------------------------------------------------------------
# Foreign metrics the dashboards read as fallbacks (emitted by vLLM and by NVIDIA DCGM)
# --------------------------------------------------------------------------------------
VLLM_PREFIX_CACHE_HITS: Final = "vllm:prefix_cache_hits_total"
"""vLLM: prefix-cache hits in tokens."""
VLLM_PREFIX_CACHE_QUERIES: Final = "vllm:prefix_cache_queries_total"
"""vLLM: prefix-cache queries in tokens."""
VLLM_KV_CACHE_USAGE: Final = "vllm:kv_cache_usage_perc"
"""vLLM: KV-cache usage, 0-1 despite the name."""
VLLM_REQUESTS_RUNNING: Final = "vllm:num_requests_running"
"""vLLM: requests in the running batch."""
VLLM_REQUESTS_WAITING: Final = "vllm:num_requests_waiting"
"""vLLM: requests waiting to be scheduled."""
VLLM_PREEMPTIONS: Final = "vllm:num_preemptions_total"
"""vLLM: cumulative preemptions."""
DCGM_GPU_UTIL: Final = "DCGM_FI_DEV_GPU_UTIL"
"""DCGM: GPU utilisation in percent."""
DCGM_SM_ACTIVE: Final = "DCGM_FI_PROF_SM_ACTIVE"
"""DCGM: SM activity, 0-1."""
DCGM_FB_USED: Final = "DCGM_FI_DEV_FB_USED"
"""DCGM: framebuffer used, MiB."""
DCGM_POWER: Final = "DCGM_FI_DEV_POWER_USAGE"
"""DCGM: board power, watts."""
