"""The GenAI sink: the gateway's figures as the GenAI conventions' OpenTelemetry histograms.

Opt-in (``STAGELENS_GENAI_METRICS=1``, or ``configure(genai_metrics=True)``), for back-ends
that read OTLP and the conventions' names, as Envoy AI Gateway and Kong emit them:

- ``gen_ai.server.request.duration`` (``s``): gateway receipt to last byte sent, with
  ``error.type`` (the status code) when the answer was an error;
- ``gen_ai.server.time_to_first_token`` (``s``): receipt to the first token sent, successful
  streamed answers only (the first byte of a non-streamed body is its last token);
- ``gen_ai.server.time_per_output_token`` (``s``): (duration - time to first token) /
  (output tokens - 1), the semconv's own definition, successful streamed answers with two
  or more output tokens;
- ``gen_ai.client.token.usage`` (``{token}``): the billed input and output tokens, one value
  each, ``gen_ai.token.type`` ``input`` / ``output``; for a request whose model reasoned, a
  third value, ``reasoning`` (a stagelens extension of the type's values): the part of its
  output spent thinking, so that the reasoning share per model reads
  ``sum(reasoning) / sum(output)``.

Definitions: semantic conventions v1.41.0 (open-telemetry/semantic-conventions, tag
v1.41.0, ``model/gen-ai/metrics.yaml`` for names, units and attributes,
``docs/gen-ai/gen-ai-metrics.md`` for the explicit bucket advice, ``stagelens.metrics.buckets``).
Attributes: ``gen_ai.operation.name`` and the provider (required), ``gen_ai.request.model``
(the bounded ``model`` label value), ``gen_ai.response.model`` (the engine's answer, at most
``max_models`` distinct values), ``server.address`` / ``server.port`` (the engine called),
and ``error.type`` on ``gen_ai.server.request.duration`` only, as the v1.41 groups say
(``metric_attributes.gen_ai.server`` carries it; the other three extend
``metric_attributes.gen_ai``, which does not).

``OTEL_SEMCONV_STABILITY_OPT_IN``: the v1.41.0 document asks GenAI instrumentations to emit
v1.36.0 by default and the latest experimental conventions only with
``gen_ai_latest_experimental``, as the contrib instrumentations do. For these four
instruments the two versions differ in one name only (``model/gen-ai/metrics.yaml``,
v1.36.0 against v1.41.0): the provider is ``gen_ai.system`` by default and
``gen_ai.provider.name`` with the opt-in. Names, units, buckets and every other attribute
are the same.

Why from the fold: the figures are those of the Prometheus series (the same
``RequestRecord``), recorded where those are, off the request path and batched; the
instruments are created once. Requests that made no upstream GenAI call (rejected before
it, ``/v1/models``) are no GenAI operation and are not recorded.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Final

from opentelemetry.metrics import CallbackOptions, Histogram, MeterProvider, Observation
from opentelemetry.util.types import AttributeValue

from stagelens import semconv as sc
from stagelens._version import __version__
from stagelens.metrics.buckets import (
    GEN_AI_CLIENT_TOKEN_USAGE_BUCKETS,
    GEN_AI_SERVER_REQUEST_DURATION_BUCKETS,
    GEN_AI_SERVER_TIME_PER_OUTPUT_TOKEN_BUCKETS,
    GEN_AI_SERVER_TIME_TO_FIRST_TOKEN_BUCKETS,
)
from stagelens.metrics.genai_call import GenAICall
from stagelens.metrics.record import Record, RequestRecord

if TYPE_CHECKING:
    from stagelens.telemetry import Pipeline

__all__ = ["GEN_AI_HISTOGRAMS", "GenAIMetrics", "latest_experimental"]

GEN_AI_HISTOGRAMS: Final = (
    sc.OTEL_GEN_AI_SERVER_REQUEST_DURATION,
    sc.OTEL_GEN_AI_SERVER_TIME_TO_FIRST_TOKEN,
    sc.OTEL_GEN_AI_SERVER_TIME_PER_OUTPUT_TOKEN,
    sc.OTEL_GEN_AI_CLIENT_TOKEN_USAGE,
)
"""Every instrument this module creates."""

_MAX_MODEL_NAME: Final = 256
"""A response model name longer than this is not recorded (the engine's answer is data)."""


def latest_experimental(value: str | None = None) -> bool:
    """Whether ``OTEL_SEMCONV_STABILITY_OPT_IN`` (or ``value``), a comma-separated list,
    names ``gen_ai_latest_experimental``: read as the contrib instrumentations read it
    (each item stripped, exact match)."""
    raw = os.environ.get(sc.SEMCONV_STABILITY_OPT_IN_ENV, "") if value is None else value
    return sc.SEMCONV_GEN_AI_LATEST_EXPERIMENTAL in {item.strip() for item in raw.split(",")}


def _usable(value: float) -> bool:
    """A value a histogram can take: finite and not negative (the upstream's usage is the
    engine's data, and a user's ``record_usage()`` the user's)."""
    return value >= 0 and math.isfinite(value)


class GenAIMetrics:
    """The four GenAI histograms on one meter provider: a sink of the fold (``RequestSink``),
    beside the Prometheus one."""

    needs_genai = True
    """Records must carry their upstream call (``RequestRecord.genai``)."""

    def __init__(
        self,
        meter_provider: MeterProvider,
        *,
        latest: bool | None = None,
        max_response_models: int = 20,
        on_error: Callable[[BaseException], None] | None = None,
        before_collect: Callable[[], None] | None = None,
    ) -> None:
        """Create the instruments now (once). ``latest``: v1.41.0's provider key instead of
        v1.36.0's; None reads ``OTEL_SEMCONV_STABILITY_OPT_IN``. ``before_collect`` runs at
        the start of every collection of the provider's readers (the fold of the requests
        still queued: a periodic export then has every request finished before it)."""
        meter = meter_provider.get_meter(sc.INSTRUMENTATION_NAME, __version__)
        self.latest = latest_experimental() if latest is None else latest
        self.provider_key = sc.GEN_AI_PROVIDER_NAME if self.latest else sc.GEN_AI_SYSTEM
        self.pipeline: Pipeline | None = None
        """The OTLP pipeline ``stagelens.exporters.genai_metrics.enable_genai_metrics``
        built, None on a given provider."""
        self.meter_provider = meter_provider
        self._on_error = on_error
        self._room = max_response_models
        self._response_models: frozenset[str] = frozenset()
        self._lock = threading.Lock()
        self.request_duration: Histogram = meter.create_histogram(
            sc.OTEL_GEN_AI_SERVER_REQUEST_DURATION,
            unit=sc.UNIT_SECONDS,
            description="Generative AI server request duration such as time-to-last byte "
            "or last output token.",
            explicit_bucket_boundaries_advisory=GEN_AI_SERVER_REQUEST_DURATION_BUCKETS,
        )
        self.time_to_first_token: Histogram = meter.create_histogram(
            sc.OTEL_GEN_AI_SERVER_TIME_TO_FIRST_TOKEN,
            unit=sc.UNIT_SECONDS,
            description="Time to generate first token for successful responses.",
            explicit_bucket_boundaries_advisory=GEN_AI_SERVER_TIME_TO_FIRST_TOKEN_BUCKETS,
        )
        self.time_per_output_token: Histogram = meter.create_histogram(
            sc.OTEL_GEN_AI_SERVER_TIME_PER_OUTPUT_TOKEN,
            unit=sc.UNIT_SECONDS,
            description="Time per output token generated after the first token for "
            "successful responses.",
            explicit_bucket_boundaries_advisory=GEN_AI_SERVER_TIME_PER_OUTPUT_TOKEN_BUCKETS,
        )
        self.token_usage: Histogram = meter.create_histogram(
            sc.OTEL_GEN_AI_CLIENT_TOKEN_USAGE,
            unit=sc.UNIT_TOKEN,
            description="Number of input and output tokens used.",
            explicit_bucket_boundaries_advisory=[
                float(b) for b in GEN_AI_CLIENT_TOKEN_USAGE_BUCKETS
            ],
        )
        self._before_collect = before_collect
        if before_collect is not None:
            # Why an observable instrument: the SDK runs every callback at the start of each
            # collection, whoever built the provider (MetricReader.collect is final).
            meter.create_observable_gauge(sc.GEN_AI_FOLD_TRIGGER, [self._collecting])

    def _collecting(self, options: CallbackOptions) -> Iterable[Observation]:
        """Run ``before_collect``; observe nothing (so the gauge is never exported)."""
        if self._before_collect is not None:
            try:
                self._before_collect()
            except Exception as exc:
                if self._on_error is not None:
                    self._on_error(exc)
        return ()

    def write(self, batch: Sequence[Record]) -> list[Exception]:
        """``RequestSink.write``: ``record`` the batch. Its failures are counted as the
        GenAI metrics' own (``on_error``), so none is returned to the fold."""
        self.record(batch)
        return []

    def record(self, batch: Sequence[Record]) -> None:
        """Record every request of ``batch`` that made a GenAI call; never raises. A record
        that fails costs only itself, counted through ``on_error``. A lone observation
        (``LoneRecord``) is no request the gateway served: the server histograms have
        nothing to say of it, and it names no call."""
        for record in batch:
            if not isinstance(record, RequestRecord):
                continue
            call = record.genai
            if call is None:
                continue
            try:
                self._record(record, call)
            except Exception as exc:
                if self._on_error is not None:
                    self._on_error(exc)

    def _record(self, record: RequestRecord, call: GenAICall) -> None:
        attributes = self._attributes(record, call)
        code = int(record.code)
        failed = code >= 400
        if _usable(record.duration):
            if failed:
                self.request_duration.record(
                    record.duration, {**attributes, sc.ERROR_TYPE: record.code}
                )
            else:
                self.request_duration.record(record.duration, attributes)
        billed = record.billing
        ttft = record.ttft
        if not failed and call.stream and ttft is not None and _usable(ttft):
            self.time_to_first_token.record(ttft, attributes)
            if billed is not None and billed.output_tokens >= 2:
                per_token = (record.duration - ttft) / (billed.output_tokens - 1)
                if _usable(per_token):
                    self.time_per_output_token.record(per_token, attributes)
        if billed is None:
            return
        usage = self.token_usage
        token_type = sc.GEN_AI_TOKEN_TYPE
        if _usable(billed.input_tokens):
            usage.record(
                billed.input_tokens, {**attributes, token_type: sc.GEN_AI_TOKEN_TYPE_INPUT}
            )
        if call.operation != sc.GEN_AI_OPERATION_EMBEDDINGS and _usable(billed.output_tokens):
            usage.record(
                billed.output_tokens,
                {**attributes, token_type: sc.GEN_AI_TOKEN_TYPE_OUTPUT},
            )
            reasoning = billed.reasoning_tokens
            if reasoning and _usable(reasoning):  # a model that reasons: its share of output
                usage.record(reasoning, {**attributes, token_type: sc.GEN_AI_TOKEN_TYPE_REASONING})

    def _attributes(self, record: RequestRecord, call: GenAICall) -> dict[str, AttributeValue]:
        """The attributes every GenAI instrument shares for this request."""
        attributes: dict[str, AttributeValue] = {
            sc.GEN_AI_OPERATION_NAME: call.operation,
            self.provider_key: sc.GEN_AI_PROVIDER_VLLM,
            sc.GEN_AI_REQUEST_MODEL: record.model,
        }
        response_model = call.response_model
        if response_model is not None and self._admitted(response_model):
            attributes[sc.GEN_AI_RESPONSE_MODEL] = response_model
        if call.server_address:
            attributes[sc.SERVER_ADDRESS] = call.server_address
            if call.server_port is not None:
                attributes[sc.SERVER_PORT] = call.server_port
        return attributes

    def _admitted(self, name: str) -> bool:
        """Whether ``name`` may be a ``gen_ai.response.model`` value: the first
        ``max_response_models`` names seen are (a bound on the series, as the ``model``
        label has one); later ones are left out (the attribute is only recommended)."""
        if name in self._response_models:
            return True
        if self._room <= 0 or len(name) > _MAX_MODEL_NAME:
            return False
        with self._lock:
            if name not in self._response_models and self._room > 0:
                self._response_models = self._response_models | {name}
                self._room -= 1
        return name in self._response_models
