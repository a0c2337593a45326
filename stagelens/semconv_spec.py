"""What each name in ``stagelens.semconv`` is: kind, unit, labels or attributes, emitter.

Why a table beside the constants: the constants say what a name *is called*; the
generated reference (``docs/telemetry.md``, ``python -m stagelens.views.telemetry_docs``) and the
tests also need what it *is* (a counter in tokens with labels model, tenant and type), in a
form a program reads, not prose. Meanings stay in the constants' docstrings, once.

Conventions a new name follows (``tests/test_telemetry_docs.py`` enforces them):

- a Prometheus metric is a ``semconv`` constant whose value starts with ``stagelens_``; it
  needs a ``MetricSpec`` in ``METRICS``;
- an OpenTelemetry instrument is an ``HW_*`` or ``OTEL_*`` constant with a dotted value; it
  needs an ``OtelMetricSpec`` in ``OTEL_METRICS``;
- an attribute key is any other constant with a dotted value (``ATTR_*``, ``GEN_AI_*``,
  ``HTTP_*``, ...); it needs an ``AttributeSpec`` in ``ATTRIBUTES`` and, if spans carry it,
  a place in a ``SpanSpec``;
- a label is a ``LABEL_*`` constant (listed automatically); its values are the constants
  whose name starts with a prefix in ``VALUE_PREFIXES`` (``COMPONENT_*`` -> ``component``),
  also picked up automatically.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

from stagelens import semconv as sc

MetricKind = Literal["counter", "gauge", "histogram", "up-down counter"]
"""Instrument kind as exposed (Prometheus type, or the OTel instrument)."""

AttributeType = Literal["string", "int", "double", "boolean", "string[]"]
"""OpenTelemetry attribute value type."""

GATEWAY: Final = "gateway"
"""Emitter: the instrumented gateway (ASGI middleware, stages, upstream instrumentation)."""
VLLM_PLUGIN: Final = "vLLM plugin"
"""Emitter: the stat-logger plugin inside the vLLM server (``exporters/vllm_stat_logger.py``)."""
GPU_COLLECTOR: Final = "GPU collector"
"""Emitter: the NVML collector (``configure(gpu=...)``, ``stagelens gpu-exporter``, plugin)."""


@dataclass(frozen=True)
class MetricSpec:
    """One Prometheus metric: exposed name, kind, unit of its value, label names, emitters."""

    name: str
    kind: MetricKind
    unit: str
    labels: tuple[str, ...]
    emitted_by: tuple[str, ...]


@dataclass(frozen=True)
class OtelMetricSpec:
    """One OpenTelemetry instrument: name, kind, UCUM unit, attribute keys, emitter, and the
    Prometheus metric carrying the same reading (``None`` when there is none)."""

    name: str
    kind: MetricKind
    unit: str
    attributes: tuple[str, ...]
    emitted_by: str
    prometheus: str | None


@dataclass(frozen=True)
class AttributeSpec:
    """One attribute key: value type and unit (``""`` when the value has none)."""

    key: str
    type: AttributeType
    unit: str = ""


@dataclass(frozen=True)
class SpanSpec:
    """One kind of span: name (literal or ``{placeholder}`` pattern), span kind, parent,
    attribute keys it can carry, emitters, and what it covers."""

    name: str
    kind: Literal["SERVER", "CLIENT", "INTERNAL"]
    parent: str
    attributes: tuple[str, ...]
    emitted_by: tuple[str, ...]
    doc: str


_GW: Final = (GATEWAY,)
_EXTREMES_LABELS: Final = (
    sc.LABEL_HISTOGRAM,
    sc.LABEL_STAGE,
    sc.LABEL_PHASE,
    sc.LABEL_MODEL,
    sc.LABEL_CODE,
    sc.LABEL_PROMPT_SIZE,
)
"""The labels of the extremes gauges: the histogram's name and each series' own labels."""
_GPU: Final = (GPU_COLLECTOR,)
_PLUGIN: Final = (VLLM_PLUGIN,)
_GPU_LABELS: Final = (sc.LABEL_GPU, sc.LABEL_UUID, sc.LABEL_NAME)
_ENGINE_LABELS: Final = (sc.LABEL_BACKEND, sc.LABEL_MODEL)

METRICS: Final[tuple[MetricSpec, ...]] = (
    MetricSpec(sc.STAGE_DURATION, "histogram", "seconds", (sc.LABEL_STAGE, sc.LABEL_MODEL), _GW),
    MetricSpec(sc.REQUEST_DURATION, "histogram", "seconds", (sc.LABEL_MODEL, sc.LABEL_CODE), _GW),
    MetricSpec(
        sc.TIME_TO_FIRST_TOKEN,
        "histogram",
        "seconds",
        (sc.LABEL_MODEL, sc.LABEL_PROMPT_SIZE),
        _GW,
    ),
    MetricSpec(
        sc.NON_STREAMED_RESPONSE,
        "histogram",
        "seconds",
        (sc.LABEL_MODEL, sc.LABEL_PROMPT_SIZE),
        _GW,
    ),
    MetricSpec(sc.TIME_TO_FIRST_ANSWER_TOKEN, "histogram", "seconds", (sc.LABEL_MODEL,), _GW),
    MetricSpec(sc.INTER_TOKEN_LATENCY, "histogram", "seconds", (sc.LABEL_MODEL,), _GW),
    MetricSpec(
        sc.ENGINE_PHASE_DURATION,
        "histogram",
        "seconds",
        (sc.LABEL_PHASE, sc.LABEL_MODEL),
        (GATEWAY, VLLM_PLUGIN),
    ),
    MetricSpec(sc.REQUESTS, "counter", "requests", (sc.LABEL_MODEL, sc.LABEL_CODE), _GW),
    MetricSpec(
        sc.REJECTIONS, "counter", "requests", (sc.LABEL_STAGE, sc.LABEL_MODEL, sc.LABEL_CODE), _GW
    ),
    MetricSpec(
        sc.SLI_REQUESTS,
        "counter",
        "requests",
        (sc.LABEL_MODEL, sc.LABEL_SLI, sc.LABEL_PROMPT_SIZE),
        _GW,
    ),
    MetricSpec(
        sc.SLI_ERRORS,
        "counter",
        "requests",
        (sc.LABEL_MODEL, sc.LABEL_SLI, sc.LABEL_PROMPT_SIZE),
        _GW,
    ),
    MetricSpec(
        sc.UPSTREAM_TTFT, "histogram", "seconds", (sc.LABEL_MODEL, sc.LABEL_PROMPT_SIZE), _GW
    ),
    MetricSpec(sc.HISTOGRAM_MIN, "gauge", "seconds", _EXTREMES_LABELS, _GW),
    MetricSpec(sc.HISTOGRAM_MAX, "gauge", "seconds", _EXTREMES_LABELS, _GW),
    MetricSpec(
        sc.UNMETERED_REQUESTS, "counter", "requests", (sc.LABEL_MODEL, sc.LABEL_BILLING), _GW
    ),
    MetricSpec(
        sc.TOKENS, "counter", "tokens", (sc.LABEL_MODEL, sc.LABEL_TENANT, sc.LABEL_TYPE), _GW
    ),
    MetricSpec(sc.COST_USD, "counter", "USD", (sc.LABEL_MODEL, sc.LABEL_TENANT), _GW),
    MetricSpec(sc.BUDGET_USD, "gauge", "USD", (sc.LABEL_TENANT, sc.LABEL_WINDOW), _GW),
    MetricSpec(sc.STAGE_BUDGET, "gauge", "seconds", (sc.LABEL_STAGE,), _GW),
    MetricSpec(
        sc.TELEMETRY_ERRORS, "counter", "errors", (sc.LABEL_COMPONENT,), (GATEWAY, VLLM_PLUGIN)
    ),
    MetricSpec(sc.SPANS_DROPPED, "counter", "spans", (sc.LABEL_REASON,), _GW),
    MetricSpec(
        sc.TRACE_DECISIONS, "counter", "requests", (sc.LABEL_DECISION, sc.LABEL_REASON), _GW
    ),
    MetricSpec(sc.METRICS_SPLIT, "gauge", "1", (sc.LABEL_SERVER, sc.LABEL_WORKERS), _GW),
    MetricSpec(sc.KV_CACHE_QUERIES, "counter", "tokens", _ENGINE_LABELS, _PLUGIN),
    MetricSpec(sc.KV_CACHE_HITS, "counter", "tokens", _ENGINE_LABELS, _PLUGIN),
    MetricSpec(sc.KV_CACHE_USAGE, "gauge", "ratio", _ENGINE_LABELS, _PLUGIN),
    MetricSpec(sc.ENGINE_REQUESTS_RUNNING, "gauge", "requests", _ENGINE_LABELS, _PLUGIN),
    MetricSpec(sc.ENGINE_REQUESTS_WAITING, "gauge", "requests", _ENGINE_LABELS, _PLUGIN),
    MetricSpec(sc.ENGINE_PREEMPTIONS, "counter", "preemptions", _ENGINE_LABELS, _PLUGIN),
    MetricSpec(
        sc.ENGINE_SECONDS,
        "counter",
        "seconds",
        (sc.LABEL_MODEL, sc.LABEL_TENANT),
        (GATEWAY, VLLM_PLUGIN),
    ),
    MetricSpec(sc.ENGINE_BUSY_SECONDS, "counter", "seconds", _ENGINE_LABELS, _PLUGIN),
    MetricSpec(sc.ENGINE_IDLE_SECONDS, "counter", "seconds", _ENGINE_LABELS, _PLUGIN),
    MetricSpec(sc.ENGINE_PREEMPTED_SECONDS, "counter", "seconds", _ENGINE_LABELS, _PLUGIN),
    MetricSpec(sc.GPU_COLLECTOR_UP, "gauge", "1 or 0", (), _GPU),
    MetricSpec(sc.GPU_UTILIZATION, "gauge", "ratio", _GPU_LABELS, _GPU),
    MetricSpec(sc.GPU_SM_ACTIVE, "gauge", "ratio", _GPU_LABELS, _GPU),
    MetricSpec(sc.GPU_MEMORY_USED, "gauge", "bytes", _GPU_LABELS, _GPU),
    MetricSpec(sc.GPU_MEMORY_TOTAL, "gauge", "bytes", _GPU_LABELS, _GPU),
    MetricSpec(sc.GPU_POWER, "gauge", "watts", _GPU_LABELS, _GPU),
    MetricSpec(sc.GPU_ENERGY, "counter", "joules", _GPU_LABELS, _GPU),
    MetricSpec(sc.GPU_TEMPERATURE, "gauge", "celsius", _GPU_LABELS, _GPU),
    MetricSpec(sc.GPU_SM_CLOCK, "gauge", "hertz", _GPU_LABELS, _GPU),
    MetricSpec(sc.GPU_CLOCK_EVENT_REASONS, "gauge", "bitmask", _GPU_LABELS, _GPU),
    MetricSpec(
        sc.GPU_PROCESS_MEMORY_USED,
        "gauge",
        "bytes",
        (*_GPU_LABELS, sc.LABEL_PID, sc.LABEL_PROCESS),
        _GPU,
    ),
    MetricSpec(sc.GPU_COST_PER_HOUR, "gauge", "USD per hour", _GPU_LABELS, _GPU),
)
"""Every Prometheus metric stagelens exposes, in the order the reference lists them."""

_HW_GPU: Final = (
    sc.ATTR_HW_ID,
    sc.ATTR_HW_NAME,
    sc.ATTR_HW_MODEL,
    sc.ATTR_HW_VENDOR,
    sc.ATTR_HW_TYPE,
)
_HW_SENSOR: Final = (sc.ATTR_HW_ID, sc.ATTR_HW_NAME, sc.ATTR_HW_PARENT, sc.ATTR_HW_TYPE)
_PHASE_LABELS: Final = (sc.LABEL_PHASE, sc.LABEL_MODEL)


_GEN_AI: Final = (
    sc.GEN_AI_OPERATION_NAME,
    sc.GEN_AI_SYSTEM,
    sc.GEN_AI_REQUEST_MODEL,
    sc.GEN_AI_RESPONSE_MODEL,
    sc.SERVER_ADDRESS,
    sc.SERVER_PORT,
)
"""The attributes every GenAI histogram carries (``gen_ai.system`` or, opted in,
``gen_ai.provider.name``)."""


def _gpu(name: str, kind: MetricKind, unit: str, prometheus: str | None) -> OtelMetricSpec:
    return OtelMetricSpec(name, kind, unit, _HW_GPU, GPU_COLLECTOR, prometheus)


def _plugin(name: str, kind: MetricKind, unit: str, prometheus: str) -> OtelMetricSpec:
    attributes = _PHASE_LABELS if kind == "histogram" else _ENGINE_LABELS
    return OtelMetricSpec(name, kind, unit, attributes, VLLM_PLUGIN, prometheus)


OTEL_METRICS: Final[tuple[OtelMetricSpec, ...]] = (
    OtelMetricSpec(
        sc.HW_GPU_UTILIZATION,
        "gauge",
        "1",
        (*_HW_GPU, sc.ATTR_HW_GPU_TASK),
        GPU_COLLECTOR,
        sc.GPU_UTILIZATION,
    ),
    _gpu(sc.HW_GPU_MEMORY_USAGE, "up-down counter", "By", sc.GPU_MEMORY_USED),
    _gpu(sc.HW_GPU_MEMORY_LIMIT, "up-down counter", "By", sc.GPU_MEMORY_TOTAL),
    _gpu(sc.HW_GPU_MEMORY_UTILIZATION, "gauge", "1", None),
    _gpu(sc.HW_POWER, "gauge", "W", sc.GPU_POWER),
    _gpu(sc.HW_ENERGY, "counter", "J", sc.GPU_ENERGY),
    OtelMetricSpec(
        sc.HW_TEMPERATURE, "gauge", "Cel", _HW_SENSOR, GPU_COLLECTOR, sc.GPU_TEMPERATURE
    ),
    _gpu(sc.OTEL_GPU_SM_ACTIVE, "gauge", "1", sc.GPU_SM_ACTIVE),
    _gpu(sc.OTEL_GPU_SM_CLOCK, "gauge", "Hz", sc.GPU_SM_CLOCK),
    _gpu(sc.OTEL_GPU_CLOCK_EVENT_REASONS, "gauge", "1", sc.GPU_CLOCK_EVENT_REASONS),
    OtelMetricSpec(
        sc.OTEL_GPU_PROCESS_MEMORY_USAGE,
        "gauge",
        "By",
        (*_HW_GPU, sc.ATTR_PROCESS_PID, sc.ATTR_PROCESS_EXECUTABLE_NAME),
        GPU_COLLECTOR,
        sc.GPU_PROCESS_MEMORY_USED,
    ),
    _gpu(sc.OTEL_GPU_COST_PER_HOUR, "gauge", "USD/h", sc.GPU_COST_PER_HOUR),
    OtelMetricSpec(sc.OTEL_GPU_COLLECTOR_UP, "gauge", "1", (), GPU_COLLECTOR, sc.GPU_COLLECTOR_UP),
    _plugin(sc.OTEL_KV_CACHE_QUERIES, "counter", sc.UNIT_TOKEN, sc.KV_CACHE_QUERIES),
    _plugin(sc.OTEL_KV_CACHE_HITS, "counter", sc.UNIT_TOKEN, sc.KV_CACHE_HITS),
    _plugin(sc.OTEL_KV_CACHE_USAGE, "gauge", sc.UNIT_RATIO, sc.KV_CACHE_USAGE),
    _plugin(sc.OTEL_ENGINE_REQUESTS_RUNNING, "gauge", sc.UNIT_REQUEST, sc.ENGINE_REQUESTS_RUNNING),
    _plugin(sc.OTEL_ENGINE_REQUESTS_WAITING, "gauge", sc.UNIT_REQUEST, sc.ENGINE_REQUESTS_WAITING),
    _plugin(sc.OTEL_ENGINE_PREEMPTIONS, "counter", sc.UNIT_PREEMPTION, sc.ENGINE_PREEMPTIONS),
    _plugin(sc.OTEL_ENGINE_PHASE_DURATION, "histogram", sc.UNIT_SECONDS, sc.ENGINE_PHASE_DURATION),
    OtelMetricSpec(
        sc.OTEL_GEN_AI_SERVER_REQUEST_DURATION,
        "histogram",
        sc.UNIT_SECONDS,
        (*_GEN_AI, sc.ERROR_TYPE),
        GATEWAY,
        sc.REQUEST_DURATION,
    ),
    OtelMetricSpec(
        sc.OTEL_GEN_AI_SERVER_TIME_TO_FIRST_TOKEN,
        "histogram",
        sc.UNIT_SECONDS,
        _GEN_AI,
        GATEWAY,
        sc.TIME_TO_FIRST_TOKEN,
    ),
    OtelMetricSpec(
        sc.OTEL_GEN_AI_SERVER_TIME_PER_OUTPUT_TOKEN,
        "histogram",
        sc.UNIT_SECONDS,
        _GEN_AI,
        GATEWAY,
        None,
    ),
    OtelMetricSpec(
        sc.OTEL_GEN_AI_CLIENT_TOKEN_USAGE,
        "histogram",
        sc.UNIT_TOKEN,
        (*_GEN_AI, sc.GEN_AI_TOKEN_TYPE),
        GATEWAY,
        sc.TOKENS,
    ),
)
"""Every OpenTelemetry instrument: the GPU ``hw.*`` gauges (``configure(meter_provider=)``),
the vLLM plugin's metrics over OTLP (``STAGELENS_VLLM_OTLP_METRICS=1``) and the gateway's
GenAI histograms (``STAGELENS_GENAI_METRICS=1``; ``gen_ai.system`` is
``gen_ai.provider.name`` with ``OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental``).
The Prometheus column names the series with the same reading, where one exists (in its own
buckets and labels)."""

ATTRIBUTES: Final[tuple[AttributeSpec, ...]] = (
    AttributeSpec(sc.ATTR_STAGE, "string"),
    AttributeSpec(sc.ATTR_TENANT, "string"),
    AttributeSpec(sc.ATTR_REJECTED_BY, "string"),
    AttributeSpec(sc.ATTR_TTFT, "double", "s"),
    AttributeSpec(sc.ATTR_COST_USD, "double", "USD"),
    AttributeSpec(sc.ATTR_VLLM_REQUEST_ID, "string"),
    AttributeSpec(sc.ATTR_REQUEST_ID, "string"),
    AttributeSpec(sc.ATTR_CLIENT_DISCONNECTED, "boolean"),
    AttributeSpec(sc.ATTR_STREAM_CLOSED_EARLY, "boolean"),
    AttributeSpec(sc.ATTR_USAGE_ESTIMATED, "boolean"),
    AttributeSpec(sc.GEN_AI_OPERATION_NAME, "string"),
    AttributeSpec(sc.GEN_AI_PROVIDER_NAME, "string"),
    AttributeSpec(sc.GEN_AI_SYSTEM, "string"),
    AttributeSpec(sc.GEN_AI_TOKEN_TYPE, "string"),
    AttributeSpec(sc.GEN_AI_REQUEST_MODEL, "string"),
    AttributeSpec(sc.GEN_AI_REQUEST_MAX_TOKENS, "int", "{token}"),
    AttributeSpec(sc.GEN_AI_REQUEST_STREAM, "boolean"),
    AttributeSpec(sc.GEN_AI_RESPONSE_ID, "string"),
    AttributeSpec(sc.GEN_AI_RESPONSE_MODEL, "string"),
    AttributeSpec(sc.GEN_AI_RESPONSE_FINISH_REASONS, "string[]"),
    AttributeSpec(sc.GEN_AI_REQUEST_ENCODING_FORMATS, "string[]"),
    AttributeSpec(sc.GEN_AI_EMBEDDINGS_DIMENSION_COUNT, "int"),
    AttributeSpec(sc.GEN_AI_USAGE_INPUT_TOKENS, "int", "{token}"),
    AttributeSpec(sc.GEN_AI_USAGE_OUTPUT_TOKENS, "int", "{token}"),
    AttributeSpec(sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS, "int", "{token}"),
    AttributeSpec(sc.GEN_AI_INPUT_MESSAGES, "string"),
    AttributeSpec(sc.GEN_AI_OUTPUT_MESSAGES, "string"),
    AttributeSpec(sc.SERVER_ADDRESS, "string"),
    AttributeSpec(sc.SERVER_PORT, "int"),
    AttributeSpec(sc.ERROR_TYPE, "string"),
    AttributeSpec(sc.HTTP_REQUEST_METHOD, "string"),
    AttributeSpec(sc.HTTP_REQUEST_METHOD_ORIGINAL, "string"),
    AttributeSpec(sc.HTTP_ROUTE, "string"),
    AttributeSpec(sc.HTTP_RESPONSE_STATUS_CODE, "int"),
    AttributeSpec(sc.URL_PATH, "string"),
    AttributeSpec(sc.URL_SCHEME, "string"),
    AttributeSpec(sc.CLIENT_ADDRESS, "string"),
    AttributeSpec(sc.ATTR_HW_ID, "string"),
    AttributeSpec(sc.ATTR_HW_NAME, "string"),
    AttributeSpec(sc.ATTR_HW_MODEL, "string"),
    AttributeSpec(sc.ATTR_HW_VENDOR, "string"),
    AttributeSpec(sc.ATTR_HW_TYPE, "string"),
    AttributeSpec(sc.ATTR_HW_PARENT, "string"),
    AttributeSpec(sc.ATTR_HW_GPU_TASK, "string"),
    AttributeSpec(sc.ATTR_PROCESS_PID, "int"),
    AttributeSpec(sc.ATTR_PROCESS_EXECUTABLE_NAME, "string"),
    AttributeSpec(sc.GEN_AI_USAGE_REASONING_OUTPUT_TOKENS, "int", "{token}"),
    AttributeSpec(sc.ATTR_TTFAT, "double", "s"),
    AttributeSpec(sc.GEN_AI_USAGE_CACHE_WRITE_INPUT_TOKENS, "int", "{token}"),
    AttributeSpec(sc.GEN_AI_REQUEST_REASONING_LEVEL, "string"),
    AttributeSpec(sc.ATTR_ENGINE_SECONDS, "double", "s"),
    AttributeSpec(sc.ATTR_ENGINE_GPU_SECONDS, "double", "s"),
)
"""Every attribute key on spans or OpenTelemetry metrics, with its value type and unit."""

_USAGE: Final = (
    sc.GEN_AI_USAGE_INPUT_TOKENS,
    sc.GEN_AI_USAGE_OUTPUT_TOKENS,
    sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS,
    sc.GEN_AI_USAGE_CACHE_WRITE_INPUT_TOKENS,
)

SPANS: Final[tuple[SpanSpec, ...]] = (
    SpanSpec(
        f"{{{sc.HTTP_REQUEST_METHOD}}} {{{sc.HTTP_ROUTE}}}",
        "SERVER",
        "none (or the caller's span, from an incoming traceparent)",
        (
            sc.HTTP_REQUEST_METHOD,
            sc.HTTP_REQUEST_METHOD_ORIGINAL,
            sc.URL_PATH,
            sc.URL_SCHEME,
            sc.SERVER_ADDRESS,
            sc.SERVER_PORT,
            sc.CLIENT_ADDRESS,
            sc.HTTP_ROUTE,
            sc.HTTP_RESPONSE_STATUS_CODE,
            sc.GEN_AI_REQUEST_MODEL,
            sc.ATTR_TENANT,
            sc.ATTR_TTFT,
            sc.ATTR_TTFAT,
            sc.GEN_AI_USAGE_REASONING_OUTPUT_TOKENS,
            sc.ATTR_CLIENT_DISCONNECTED,
            sc.ATTR_REJECTED_BY,
            sc.ERROR_TYPE,
        ),
        _GW,
        "The request at the gateway, receipt to last byte sent (the trace's root). Named by "
        "the method alone when the framework names no route; a method that is not a known "
        "one is named `HTTP` (`http.request.method` `_OTHER`).",
    ),
    SpanSpec(
        f"{{{sc.ATTR_STAGE}}}",
        "INTERNAL",
        "the root span",
        (
            sc.ATTR_STAGE,
            sc.ERROR_TYPE,
            sc.ATTR_COST_USD,
            sc.ATTR_TENANT,
            *_USAGE,
            sc.ATTR_USAGE_ESTIMATED,
        ),
        _GW,
        "One stage of the request (``stage()`` blocks and the middleware's gateway and "
        "billing stages), named by the stage. The billing span carries the cost, tenant and "
        "token counts; user attributes given to ``stage()`` are added as they are.",
    ),
    SpanSpec(
        f"{{{sc.GEN_AI_OPERATION_NAME}}} {{{sc.GEN_AI_REQUEST_MODEL}}}",
        "CLIENT",
        "the root span",
        (
            sc.ATTR_STAGE,
            sc.GEN_AI_OPERATION_NAME,
            sc.GEN_AI_PROVIDER_NAME,
            sc.GEN_AI_REQUEST_MODEL,
            sc.GEN_AI_REQUEST_MAX_TOKENS,
            sc.GEN_AI_REQUEST_STREAM,
            sc.GEN_AI_REQUEST_REASONING_LEVEL,
            sc.GEN_AI_RESPONSE_ID,
            sc.GEN_AI_RESPONSE_MODEL,
            sc.GEN_AI_RESPONSE_FINISH_REASONS,
            sc.GEN_AI_REQUEST_ENCODING_FORMATS,
            sc.GEN_AI_EMBEDDINGS_DIMENSION_COUNT,
            *_USAGE,
            sc.GEN_AI_USAGE_REASONING_OUTPUT_TOKENS,
            sc.GEN_AI_INPUT_MESSAGES,
            sc.GEN_AI_OUTPUT_MESSAGES,
            sc.SERVER_ADDRESS,
            sc.SERVER_PORT,
            sc.ATTR_REQUEST_ID,
            sc.ATTR_VLLM_REQUEST_ID,
            sc.ATTR_STREAM_CLOSED_EARLY,
            sc.ATTR_USAGE_ESTIMATED,
            sc.ATTR_ENGINE_SECONDS,
            sc.ATTR_ENGINE_GPU_SECONDS,
            sc.ERROR_TYPE,
        ),
        _GW,
        "The inference stage: the call to the vLLM server (GenAI semantic conventions), "
        "e.g. ``chat tiny``, ``embeddings tiny`` (no stream flag, output tokens or first "
        "token; the encoding formats and vector size instead). Message content only when "
        "capture is opted in.",
    ),
    *(
        SpanSpec(
            name,
            "INTERNAL",
            "the inference span",
            (sc.ATTR_STAGE, sc.ATTR_VLLM_REQUEST_ID, sc.GEN_AI_REQUEST_MODEL),
            (GATEWAY, VLLM_PLUGIN),
            "",
        )
        for name in (sc.SPAN_ENGINE_QUEUE, sc.SPAN_ENGINE_PREFILL, sc.SPAN_ENGINE_DECODE)
    ),
)
"""Every kind of span. An empty ``doc`` means the span name's constant docstring says it."""

VALUE_PREFIXES: Final[dict[str, str]] = {
    "TOKEN_TYPE_": sc.LABEL_TYPE,
    "PHASE_": sc.LABEL_PHASE,
    "COMPONENT_": sc.LABEL_COMPONENT,
    "REASON_": sc.LABEL_REASON,
    "DECISION_": sc.LABEL_DECISION,
    "SLI_": sc.LABEL_SLI,
    "PROMPT_SIZE_": sc.LABEL_PROMPT_SIZE,
    "BUDGET_WINDOW_": sc.LABEL_WINDOW,
    "TENANT_": sc.LABEL_TENANT,
    "MODEL_": sc.LABEL_MODEL,
    "GEN_AI_OPERATION_": sc.GEN_AI_OPERATION_NAME,
    "GEN_AI_PROVIDER_": sc.GEN_AI_PROVIDER_NAME,
    "GEN_AI_TOKEN_TYPE_": sc.GEN_AI_TOKEN_TYPE,
    "HW_TYPE_": sc.ATTR_HW_TYPE,
    "HW_GPU_TASK_": sc.ATTR_HW_GPU_TASK,
    "HW_VENDOR_": sc.ATTR_HW_VENDOR,
    "BILLING_": sc.LABEL_BILLING,
    "ERROR_TYPE_": sc.ERROR_TYPE,
}
"""Constant-name prefix -> the label or attribute whose fixed values it names. A constant
whose value is itself a key (``GEN_AI_OPERATION_NAME``) is not a value."""
