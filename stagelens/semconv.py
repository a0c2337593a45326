"""Every name stagelens emits: span names, attribute keys, metric names, label names, units.

Why one module: dashboards, alert rules, tests and users' own queries depend on these
strings, so they are a contract: a change to one is listed in the CHANGELOG. Code never
spells a name inline; it imports the constant from here, so a rename is one edit plus the
places the type checker and the drift checks point at.

What each name is (kind, unit, labels or attributes, emitter) is declared beside it in
``stagelens.semconv_spec``; ``docs/telemetry.md`` is generated from the two (``make
generate``). A new metric, instrument or attribute constant needs its spec there (the tests
and the generator fail without); label values named ``COMPONENT_*``, ``PHASE_*``, ... are
picked up by their prefix.

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
"""On the root span: seconds from gateway receipt to the first token sent to the client (as
``stagelens_time_to_first_token_seconds``: the first body carrying generated output; streamed
answers only, as the histogram: a non-streamed answer's span lasts its whole answer)."""
ATTR_COST_USD: Final = "stagelens.cost_usd"
"""On the billing span: the request's cost from the price table, in USD."""
ATTR_VLLM_REQUEST_ID: Final = "stagelens.vllm.request_id"
"""On the inference span: the request id the vLLM server used (links the engine side)."""
ATTR_REQUEST_ID: Final = "stagelens.request_id"
"""The ``X-Request-Id`` sent upstream (the app's own, or the one stagelens minted)."""
ATTR_CLIENT_DISCONNECTED: Final = "stagelens.client_disconnected"
"""True when the client went away before it received the whole answer: noticed while the
answer was being sent, or found gone just before it (a server that drops what is sent to
a departed client, as uvicorn does). Such a request is recorded with ``code="499"``
(nginx's "client closed request"), never as the 200 nobody received; the span's
``http.response.status_code`` stays what the app sent."""
ATTR_USAGE_ESTIMATED: Final = "stagelens.usage.estimated"
"""On the inference span: True when the call's usage was estimated from what was received
(the stream ended before the server's usage event); see ``BILLING_ESTIMATED``. On the
billing span: the app billed its own estimate (``record_usage(estimated=True)``)."""
ATTR_STREAM_CLOSED_EARLY: Final = "stagelens.upstream.closed_early"
"""On the inference span: True when the upstream stream was closed before its last event,
either cut by the gateway (stop sequence, safety check: not an error) or because the client
went away (the span then also records the error)."""

# GenAI semantic conventions (v1.41 names).
GEN_AI_OPERATION_NAME: Final = "gen_ai.operation.name"
"""``chat``, ``text_completion`` or ``embeddings``."""
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
# Embeddings client span: the request's encoding formats and the answer's
# vector size, as the GenAI semantic conventions name them.
GEN_AI_REQUEST_ENCODING_FORMATS: Final = "gen_ai.request.encoding_formats"
"""On an embeddings span: the encoding formats asked for (``encoding_format``), as a list."""
GEN_AI_EMBEDDINGS_DIMENSION_COUNT: Final = "gen_ai.embeddings.dimension.count"
"""On an embeddings span: the number of dimensions of the answer's (first) vector."""
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
"""Host of the server: the gateway's own on the root span, the upstream's on the inference
span."""
SERVER_PORT: Final = "server.port"
"""Port of the server (the gateway's on the root span, the upstream's on the inference span)."""
ERROR_TYPE: Final = "error.type"
"""Exception class name or HTTP status code on failure."""
ERROR_TYPE_INCOMPLETE_STREAM: Final = "incomplete_stream"
"""``error.type`` value: the upstream stream ended (or was dropped) before its last event."""
ERROR_TYPE_UPSTREAM_ERROR_EVENT: Final = "upstream_error_event"
"""``error.type`` value: the upstream sent an error event inside a 200 stream (vLLM does
when the engine fails mid-generation); its message is never recorded."""
HTTP_REQUEST_METHOD: Final = "http.request.method"
"""Root span: the request's method when known (``HTTP_KNOWN_METHODS``), else ``_OTHER``."""
HTTP_REQUEST_METHOD_ORIGINAL: Final = "http.request.method_original"
"""Root span: the method as the client sent it, set only when it was not a known one."""
HTTP_METHOD_OTHER: Final = "_OTHER"
"""``http.request.method`` of a request whose method is not known: a client's made-up
method never becomes a new attribute value."""
HTTP_SPAN_NAME_OTHER: Final = "HTTP"
"""Root span name (``HTTP`` or ``HTTP {route}``) for a method that is not known: a junk
method never becomes a new span name (HTTP semconv)."""
HTTP_KNOWN_METHODS: Final = frozenset(
    ("CONNECT", "DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT", "TRACE")
)
"""The methods known by default (RFC 9110 and PATCH, as HTTP semconv defines them; case
matters). ``OTEL_INSTRUMENTATION_HTTP_KNOWN_METHODS`` (comma-separated) replaces them."""
ENV_HTTP_KNOWN_METHODS: Final = "OTEL_INSTRUMENTATION_HTTP_KNOWN_METHODS"
"""Environment variable overriding ``HTTP_KNOWN_METHODS`` (a full replacement)."""

# HTTP semantic conventions on the gateway's root (SERVER) span.
HTTP_ROUTE: Final = "http.route"
"""The matched route template (e.g. ``/v1/chat/completions``), when the framework names one."""
HTTP_RESPONSE_STATUS_CODE: Final = "http.response.status_code"
"""HTTP status code sent to the client (499 when the client went away first)."""
URL_PATH: Final = "url.path"
"""Path of the request URL, without the query string."""
URL_SCHEME: Final = "url.scheme"
"""``http`` or ``https``."""
CLIENT_ADDRESS: Final = "client.address"
"""Address of the client as the ASGI server saw it."""

GEN_AI_PROVIDER_VLLM: Final = "vllm"
"""Value of ``gen_ai.provider.name`` for vLLM."""
GEN_AI_OPERATION_CHAT: Final = "chat"
"""``gen_ai.operation.name`` for chat completions."""
GEN_AI_OPERATION_TEXT_COMPLETION: Final = "text_completion"
"""``gen_ai.operation.name`` for legacy completions."""
GEN_AI_OPERATION_EMBEDDINGS: Final = "embeddings"
"""``gen_ai.operation.name`` for embeddings (no output tokens, no time to first token)."""

GEN_AI_SYSTEM: Final = "gen_ai.system"
"""The provider key of the GenAI conventions up to v1.36.0 (``vllm``), renamed
``gen_ai.provider.name`` in v1.37.0: the GenAI metrics carry it by default, as the v1.41.0
transition plan asks of instrumentations (``OTEL_SEMCONV_STABILITY_OPT_IN``)."""
GEN_AI_TOKEN_TYPE: Final = "gen_ai.token.type"
"""On ``gen_ai.client.token.usage``: which tokens a value counts (``input``, ``output``)."""
GEN_AI_TOKEN_TYPE_INPUT: Final = "input"
"""``gen_ai.token.type`` value: prompt tokens, cached ones included (billable, as billed)."""
GEN_AI_TOKEN_TYPE_OUTPUT: Final = "output"
"""``gen_ai.token.type`` value: completion tokens (billable, as billed)."""
SEMCONV_STABILITY_OPT_IN_ENV: Final = "OTEL_SEMCONV_STABILITY_OPT_IN"
"""Environment variable (comma-separated) choosing which semantic-convention versions
instrumentations emit, read as the OpenTelemetry contrib instrumentations read it."""
SEMCONV_GEN_AI_LATEST_EXPERIMENTAL: Final = "gen_ai_latest_experimental"
"""``OTEL_SEMCONV_STABILITY_OPT_IN`` value: the GenAI metrics carry the v1.41.0 provider key
``gen_ai.provider.name`` instead of the v1.36.0 ``gen_ai.system`` (nothing else differs)."""

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
"""Request id sent to the vLLM server, which uses it as its own request id: the app's own,
else ``<trace-id>-<span-id>`` of a recorded inference span (the engine side joins the trace
by it), or ``0...0-<random>`` for a call whose trace is sampled out or not yet kept (the
tail sampler decides at the request's end: ``docs/tail-sampling.md``); then ``~<tenant>``,
the bounded tenant label, when the request has one (``docs/engine-seconds.md``)."""
HEADER_ENGINE_SECONDS: Final = "x-stagelens-engine"
"""Response header (and, in a stream, SSE comment ``: x-stagelens-engine ...``) the vLLM
server's stagelens middleware adds for a stagelens request id: ``seconds=S; gpus=N``, the
request's share of the engine's time and the GPUs the engine holds."""

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
"""Histogram {model, prompt_size}: gateway receipt to the first body sent to the client that carries
generated output (content text, a tool-call delta, reasoning text, a completion's text; never
a role-only chunk, an SSE comment or keep-alive, an error or a usage-only event): the first
body sent after the upstream's first output-bearing event arrived, however the app frames
it. Streamed answers only (the request asked for a stream, or the answer is an event
stream), as the ``ttft`` SLI counts them: a non-streamed answer's first byte is sent once its
whole generation is done, and goes to ``stagelens_non_streamed_response_seconds``. Only
requests that made an inference call record it. ``prompt_size``: the request's prompt-size
class (``LABEL_PROMPT_SIZE``), since prefill, and so TTFT, grows with the prompt."""
NON_STREAMED_RESPONSE: Final = "stagelens_non_streamed_response_seconds"
"""Histogram {model, prompt_size}: gateway receipt to the first body byte of a non-streamed
answer (not an event stream), sent once the whole answer arrived: its whole generation,
which ``stagelens_time_to_first_token_seconds`` would have read as a first token. Answers
(status below 400) of requests that made an inference call."""
INTER_TOKEN_LATENCY: Final = "stagelens_inter_token_latency_seconds"
"""Histogram {model}: gap between consecutive output-bearing SSE events of one choice, as
sent to the client: one sample per event, however the network coalesced them (events read
together give gaps of ~0). With ``n`` > 1 each choice has its own gaps: a request records
``n * (events per choice - 1)`` samples, never the gap between one choice's event and
another's. Streamed requests only. A sampled request's worst gap is kept as its bucket's
exemplar (trace id), so a stall on the heatmap links to its trace."""
ENGINE_PHASE_DURATION: Final = "stagelens_engine_phase_duration_seconds"
"""Histogram {phase, model}: the engine's own per-request timings. How they relate to the
gateway's time to first token: ``queue`` + ``prefill`` (queued to scheduled to first token,
on the engine's clock) <= the upstream time to first token (inference stage start to the
first output event received) <= the gateway's time to first token (receipt to first token
sent); ``decode`` comes after the first token and is never part of it."""
REQUESTS: Final = "stagelens_requests_total"
"""Counter {model, code}: finished requests, any outcome."""
TOKENS: Final = "stagelens_tokens_total"
"""Counter {model, tenant, type}: tokens billed; cached_input and cache_write are parts of
input, reasoning of output."""
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
from stagelens.semconv_gpu import *  # noqa: E402, F403 (the GPU names, in their place)

COMPONENT_NVML: Final = "nvml"
"""``component`` label value: an unexpected (non-NVML) failure while reading the GPUs."""
COMPONENT_UPSTREAM: Final = "upstream"
"""``component`` label value: the upstream (httpx) instrumentation failed; the call went on."""
COMPONENT_CONTEXT: Final = "context"
"""``component`` label value: a stage's OpenTelemetry context could not be detached."""
COMPONENT_SHUTDOWN_FLUSH: Final = "shutdown_flush"
"""``component`` label value: flushing spans or metrics (at application shutdown, or on
``Telemetry.force_flush()`` / ``shutdown()``) failed."""
COMPONENT_REQUEST_HOOK: Final = "request_hook"
"""``component`` label value: the user's ``request_hook`` raised (recorded on the span)."""
COMPONENT_RESPONSE_HOOK: Final = "response_hook"
"""``component`` label value: the user's ``response_hook`` raised (recorded on the span)."""
COMPONENT_BILLING: Final = "billing"
"""``component`` label value: billing a finished request failed."""
COMPONENT_METRICS: Final = "metrics"
"""``component`` label value: a finished request's figures could not be recorded in the
gateway series (one count per bad record; the rest of its batch is recorded)."""
COMPONENT_UPSTREAM_EVENT: Final = "upstream_event"
"""``component`` label value: an upstream event or body could not be read (not JSON, or not
the expected shape); the bytes still reach the app unchanged."""
REJECTIONS: Final = "stagelens_rejections_total"
"""Counter {stage, model, code}: requests answered with an error by the stage that rejected
them (401/429 at the gateway, 404 at the router, 400 at the tokenizer, ...)."""
TELEMETRY_ERRORS: Final = "stagelens_telemetry_errors_total"
"""Counter {component}: telemetry failures swallowed so serving goes on (hooks, exporters)."""
SPANS_DROPPED: Final = "stagelens_spans_dropped_total"
"""Counter {reason}: spans that could not be exported (queue full, export failed)."""
SLI_REQUESTS: Final = "stagelens_sli_requests_total"
"""Requests an SLI counts (labels: model, sli, prompt_size), recorded by the gateway at each
request's end."""
SLI_ERRORS: Final = "stagelens_sli_errors_total"
"""Of ``stagelens_sli_requests_total``, the requests that were bad for that SLI (labels:
model, sli, prompt_size)."""
UPSTREAM_TTFT: Final = "stagelens_upstream_time_to_first_token_seconds"
"""Histogram {model, prompt_size}: from the start of the inference stage (upstream request
sent) to the first output-bearing event received from the upstream (streamed calls only).
The inference stage's share of the time to first token; its stage budget applies to this,
per prompt-size class (``unknown`` for a call made outside an instrumented request)."""
LABEL_PROMPT_SIZE: Final = "prompt_size"
"""Prompt-size class of a request on the TTFT histogram and the SLI counters: the smallest
configured bound (input tokens) at or above its input tokens, ``+Inf`` above the last,
``unknown`` when its input tokens are not known."""
PROMPT_SIZE_ABOVE: Final = "+Inf"
"""``prompt_size`` label value: more input tokens than the last configured bound."""
PROMPT_SIZE_UNKNOWN: Final = "unknown"
"""``prompt_size`` label value: the request's input tokens are not known (it was answered
before any inference call, or the call gave no usage and sent no prompt to estimate)."""
LABEL_SLI: Final = "sli"
"""Which service level indicator a request was counted for (``availability``, ``ttft``,
``itl``, ``goodput``, ``answer``); each request's verdict is decided by the gateway at its
end."""
SLI_AVAILABILITY: Final = "availability"
"""``sli`` label value: every measured request except those whose client left before the
answer was complete and sooner than ``client_left_bad_after_seconds`` (a user changing their
mind is no outage); bad when answered 5xx, when a stream failed after its 200 headers, or
when the client left after the gateway had spent longer than that on it (a hang clients
time out on, recorded as ``code="499"``)."""
SLI_TTFT: Final = "ttft"
"""``sli`` label value: streamed completions not answered 4xx; bad when the time to first
token exceeded the threshold of the request's ``prompt_size`` class
(``ttft_slo_thresholds_seconds``, else ``ttft_slo_threshold_seconds``) or no first token came
because the request failed (a client gone before the first token counts only if it waited
past the threshold)."""
SLI_ITL: Final = "itl"
"""``sli`` label value: streamed requests with at least two output-bearing events; bad when
their *worst* inter-token gap exceeded ``itl_stall_threshold_seconds`` (a stall: a mean hides
one long freeze among many quick tokens, the user does not) or the stream failed after its
first token."""
SLI_GOODPUT: Final = "goodput"
"""``sli`` label value: the ``ttft`` requests; good only when both the TTFT and the ITL
objectives were met and the stream was not cut after exactly one output event (failed, or
its client gone): with one event there is no gap for the stall rule to judge, and a first
token followed by nothing is no answer. ITL counts as met with fewer than two events."""
UNMETERED_REQUESTS: Final = "stagelens_unmetered_requests_total"
"""Counter {model, billing}: requests with an inference call whose tokens the server's usage
did not give: billed from what was received (``estimated``) or not billed at all
(``unbilled``). An app's own ``record_usage()`` makes a request metered."""
LABEL_BILLING: Final = "billing"
"""How a request's tokens were metered when the server's usage was missing."""
BILLING_ESTIMATED: Final = "estimated"
"""``billing`` label value: a stream cut before its usage event (client gone, backend died,
gateway cut), billed from what was received: one output token per output-bearing event,
input tokens estimated from the prompt's text (UTF-8 bytes / 4, rounded up)."""
BILLING_UNBILLED: Final = "unbilled"
"""``billing`` label value: an answered call with neither usage nor any output received:
nothing could be billed."""

LABEL_STAGE: Final = "stage"
"""Stage label (canonical or user stage name)."""
LABEL_MODEL: Final = "model"
"""Served model name: names configured, or the first N that were answered successfully;
everything else ``other`` (``MODEL_OTHER``)."""
LABEL_CODE: Final = "code"
"""HTTP status code as a string."""
LABEL_TENANT: Final = "tenant"
"""Bounded tenant: top-N configured tenants, everything else ``other``."""
LABEL_TYPE: Final = "type"
"""Token type: input, output, cached_input and cache_write (parts of input), reasoning (part
of output)."""
LABEL_PHASE: Final = "phase"
"""Engine phase: queue, prefill, decode (contract); the vLLM plugin adds ``frontend``
(``PHASE_FRONTEND``): filter ``phase!="frontend"`` to compare engine phases alone."""
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
"""Why something was dropped (spans) or kept (traces, with ``decision``)."""
REASON_QUEUE_FULL: Final = "queue_full"
"""``reason`` label value: dropped before export, more spans waiting than the queue bound."""
REASON_EXPORT_FAILED: Final = "export_failed"
"""``reason`` label value: dropped by a failed export (collector down, refused, timed out)."""

EXEMPLAR_TRACE_ID: Final = "trace_id"
"""Exemplar label: the trace id (32 hex digits) of a sampled request whose observation
fell in that bucket, on the buckets of ``stagelens_time_to_first_token_seconds``,
``stagelens_request_duration_seconds`` and ``stagelens_stage_duration_seconds``: the latest
such request per bucket, in the OpenMetrics exposition only (``Accept:
application/openmetrics-text``), never in prometheus-client's multiprocess mode. Grafana
links it to the trace (``exemplarTraceIdDestinations``)."""
EXEMPLAR_SPAN_ID: Final = "span_id"
"""Exemplar label beside ``trace_id``: the span id (16 hex digits) of that request's root
span (the gateway's SERVER span), for every one of the three histograms."""

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
MODEL_OTHER: Final = "other"
"""Model label for a requested name that is not a served model (configured, or among the
first ``max_models`` answered successfully): a client's typo or made-up name would
otherwise be a new series each."""
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
from stagelens.semconv_foreign import *  # noqa: E402, F403 (foreign names, in their place)

# --------------------------------------------------------------------------------------
# vLLM plugin: engine phase beyond the contract's three, error components, units, OTel
# metrics, and the engine time each request took
# --------------------------------------------------------------------------------------
from stagelens.semconv_vllm import *  # noqa: E402, F403 (the vLLM plugin's names, in their place)

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

# Reasoning models: reasoning tokens and the time to the first answer token.
# --------------------------------------------------------------------------------------
GEN_AI_USAGE_REASONING_OUTPUT_TOKENS: Final = "gen_ai.usage.reasoning.output_tokens"
"""On the inference and root spans: the request's reasoning tokens, a part of
``gen_ai.usage.output_tokens`` (GenAI semantic conventions v1.41.1): the server's
``usage.completion_tokens_details.reasoning_tokens`` when it reports them, else the
reasoning events received, one token each (``stagelens.usage.estimated`` then set)."""
TOKEN_TYPE_REASONING: Final = "reasoning"
"""``type`` label value: reasoning tokens, a part of ``output`` (as ``cached_input`` is of
``input``). Billed as output, at the output rate: the cost is unchanged by them."""
GEN_AI_TOKEN_TYPE_REASONING: Final = "reasoning"
"""``gen_ai.token.type`` value (a stagelens extension: the conventions name only ``input``
and ``output``): the reasoning tokens of a request, a part of its ``output`` value, so a
sum over ``input`` and ``output`` still counts every billed token once."""
TIME_TO_FIRST_ANSWER_TOKEN: Final = "stagelens_time_to_first_answer_token_seconds"
"""Histogram {model}: gateway receipt to the first body sent to the client after the first
answer-bearing event arrived from upstream (content, a tool call, a completion's text:
anything but reasoning); streamed answers only, as the TTFT histogram. Equal to
``stagelens_time_to_first_token_seconds`` for a model that does not reason; for one that
does, the time the user waits past the thinking. Same buckets as the TTFT histogram, with
the answer SLO threshold a boundary."""
ATTR_TTFAT: Final = "stagelens.time_to_first_answer_token"
"""On the root span: seconds from gateway receipt to the first answer token sent (as
``stagelens_time_to_first_answer_token_seconds``; streamed answers only)."""
SLI_ANSWER: Final = "answer"
"""``sli`` label value: the ``ttft`` requests (streamed completions not answered 4xx); bad
when the time to first answer token exceeded ``answer_slo_threshold_seconds``, or no answer
token came because the request failed or the stream was cut during the reasoning (a client
gone before the answer counts only if it waited past the threshold)."""

# Tail sampling: the sampler ``OTEL_TRACES_SAMPLER`` names, and the decisions it
# makes when each request ends (``stagelens/tail_sampling.py``).
TRACES_SAMPLER_TAIL: Final = "stagelens_tail"
"""``OTEL_TRACES_SAMPLER`` value (an ``opentelemetry_traces_sampler`` entry point): keep a
trace by what happened to its request, decided when the request ends;
``OTEL_TRACES_SAMPLER_ARG`` is the base keep ratio for requests that went fine."""
TRACE_DECISIONS: Final = "stagelens_trace_decisions_total"
"""Counter {decision, reason}: requests whose trace the tail sampler (``stagelens_tail``)
kept or dropped, and why; counted only while that sampler is in use."""
LABEL_DECISION: Final = "decision"
"""What the tail sampler decided for a request's trace: ``kept`` or ``dropped``."""
DECISION_KEPT: Final = "kept"
"""``decision`` label value: the trace was exported, whole."""
DECISION_DROPPED: Final = "dropped"
"""``decision`` label value: the trace's spans were discarded unbuilt (its metrics count)."""
REASON_ERROR: Final = "error"
"""``reason`` label value (kept): answered 5xx, failed after its headers or the app
raised (an upstream error among them)."""
REASON_CLIENT_LEFT: Final = "client_left"
"""``reason`` label value (kept): the client went away before the answer was complete."""
REASON_SLOW: Final = "slow"
"""``reason`` label value (kept): slow against the SLO thresholds: bad for the ``ttft``,
``itl`` or ``goodput`` SLI, an inter-token gap over ``tail_stall_seconds`` or a duration
over ``tail_slow_seconds``."""
REASON_EXEMPLAR: Final = "exemplar"
"""``reason`` label value (kept): chosen to be an exemplar, its request duration falling in
a bucket no kept trace of its model had filled recently, or the slowest request of its
model so far in the current window (so the slowest of any stretch of traffic is kept)."""
REASON_PARENT: Final = "parent"
"""``reason`` label value (kept): the caller's ``traceparent`` said sampled."""
REASON_RATIO: Final = "ratio"
"""``reason`` label value (kept): chosen by the base keep ratio from the trace id alone, as
OpenTelemetry's ``TraceIdRatioBased`` chooses (so services sampling by ratio agree)."""
REASON_FINE: Final = "fine"
"""``reason`` label value (dropped): the request went fine and the base ratio did not
choose its trace."""

# The fastest and slowest value each gateway histogram series observed: what
# ``stagelens report`` narrows a percentile read from buckets with, so that it never lies
# above the slowest request or below the fastest (``stagelens.views.percentiles``).
LABEL_HISTOGRAM: Final = "histogram"
"""Label of ``stagelens_histogram_min_seconds`` / ``_max_seconds``: the histogram's name."""
HISTOGRAM_MIN: Final = "stagelens_histogram_min_seconds"
"""Gauge {histogram, stage, phase, model, code, prompt_size}: the smallest value one series
of a gateway histogram (named by ``histogram``, with that series' own labels) observed since
the process started, as its ``_bucket`` counts run since then. Not exposed in multiprocess
mode."""
HISTOGRAM_MAX: Final = "stagelens_histogram_max_seconds"
"""Gauge {histogram, stage, phase, model, code, prompt_size}: the largest value, as
``stagelens_histogram_min_seconds``."""

# The agent APIs (OpenAI Responses, Anthropic Messages): prompt-cache writes and the
# reasoning effort asked for, as the newest GenAI conventions name them.
# --------------------------------------------------------------------------------------
GEN_AI_USAGE_CACHE_WRITE_INPUT_TOKENS: Final = "gen_ai.usage.cache_write.input_tokens"
"""On the inference and billing spans: the input tokens written to the prompt cache, a
part of ``gen_ai.usage.input_tokens`` (as the cache reads are): Anthropic's
``cache_creation_input_tokens``, the Responses API's ``input_tokens_details.cache_write_tokens``
and chat's ``prompt_tokens_details.created_cache_tokens`` where vLLM reports them. Set only
when the call wrote to the cache."""
TOKEN_TYPE_CACHE_WRITE: Final = "cache_write"
"""``type`` label value: input tokens written to the prompt cache, a part of ``input`` (as
``cached_input``, the tokens read from it, is): priced at ``cache_write`` in the price table,
the input rate unless set."""
GEN_AI_REQUEST_REASONING_LEVEL: Final = "gen_ai.request.reasoning.level"
"""On the inference span: the reasoning effort the client asked for, as it wrote it (chat's
``reasoning_effort``, the Responses API's ``reasoning.effort``, the Messages API's
``output_config.effort``, or ``none`` for its ``thinking`` disabled); absent when it asked none."""

# A process that is one of several workers of one server while nothing adds their metrics
# up (``PROMETHEUS_MULTIPROC_DIR`` unset): ``stagelens/prefork.py`` finds them.
METRICS_SPLIT: Final = "stagelens_metrics_split_info"
"""Gauge {server, workers}: 1, on every worker, while this process is one of several workers
of one server (uvicorn ``--workers``, gunicorn, any pre-fork server) and
``PROMETHEUS_MULTIPROC_DIR`` is unset: each scrape reads only the worker that answers it, so
counters jump back and forth and every rate is wrong. Absent otherwise."""
LABEL_SERVER: Final = "server"
"""The server whose workers split the metrics: ``gunicorn``, ``uvicorn``, ``hypercorn``,
``granian``, ``daphne`` or ``unknown``."""
LABEL_WORKERS: Final = "workers"
"""How many workers accept on the answering worker's socket, itself included."""
