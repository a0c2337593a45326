"""The span job of an upstream call: what its span says of the answer.

``CallSpan`` sets the answer's attributes (response id and model, finish reasons, usage,
the engine's share, the failure), lays the engine's phases out as child spans, and, for a
trace still undecided (its span a ``DeferredSpan``), does both only when the trace is kept
(``_built``, run by the deferred tracer as it builds the span). It reads what the call's
other jobs learned (the reader, ``_events.EventReader``; the state machine,
``_upstream._UpstreamCall``) and holds nothing of its own: the call's slots hold it.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Final

import httpx
from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode
from stagelens.instrumentation._call_request import client_attributes
from stagelens.instrumentation._call_state import ClientDisconnected
from stagelens.instrumentation._headers import REQUEST_ID_KEY, header_value
from stagelens.instrumentation._span_errors import record_failure

from stagelens import semconv as sc
from stagelens.pricing import Usage
from stagelens.stages import Stage
from stagelens.telemetry import Telemetry

_NS: Final = 1_000_000_000
_INFERENCE: Final = Stage.INFERENCE.value
Ending = tuple[BaseException | None, Usage | None, str | bool | None, list[tuple[str, float]], int]
"""How a call of an undecided trace ended, for its span if kept: (error, usage, estimated,
engine phases, end in ``time_ns``)."""


class CallSpan:
    """The span job of an upstream call (the module docstring). A base of the call's class
    with no slots of its own; the names below are the call's, declared for the reader."""

    __slots__ = ()

    telemetry: Telemetry
    model: str
    stream: bool
    span: trace.Span
    _operation: str
    _payload: dict[str, Any]
    _request: httpx.Request
    _response_headers: httpx.Headers | None
    _ending: Ending | None
    _embeddings: bool
    _dimensions: int | None
    _status: int
    _failure: str | None
    _response_id: str | None
    _response_model: str | None
    _finish_reasons: list[str]
    _engine_share: tuple[float, int] | None
    _reasoning_reported: bool

    if TYPE_CHECKING:

        def read_last_for_span(self) -> None:
            """The reader's (``EventReader``)."""

    def _built(self, built: trace.Span) -> None:
        """What the span built from the call's ``DeferredSpan`` holds besides the calls made
        on it, as a span recorded at once gets it (a completion run only if the trace is
        kept): the request attributes, then, as ``_finish`` sets them, the vLLM request
        id, the answer's attributes and the engine's spans. A span is built only once it
        ended, so the call has ended too (``_ending``), unless ending it failed."""
        built.set_attributes(
            client_attributes(
                self.model, self.stream, self._operation, self._payload, self._request
            )
        )
        if self._ending is None:
            return
        headers = self._response_headers
        if headers is not None:
            vllm_id = header_value(headers, REQUEST_ID_KEY)
            if vllm_id:
                built.set_attribute(sc.ATTR_VLLM_REQUEST_ID, vllm_id)
        error, usage, estimated, phases, end_ns = self._ending
        self.read_last_for_span()
        self._set_response_attributes(built, error, usage, estimated)
        self._engine_spans(built, phases, end_ns)

    def _engine_spans(self, span: trace.Span, phases: list[tuple[str, float]], end_ns: int) -> None:
        """Child spans of ``span`` laid back to back, ending at ``end_ns``: when the
        engine's per-request metrics arrived (vLLM sends them as the request finishes, with
        its last token or in the event just after), else when the call ended."""
        if not phases:
            return
        parent = trace.set_span_in_context(span)
        for phase, seconds in reversed(phases):
            start_ns = end_ns - int(seconds * _NS)
            child = self.telemetry.tracer.start_span(
                phase,
                context=parent,
                start_time=start_ns,
                attributes={sc.ATTR_STAGE: _INFERENCE},
            )
            child.end(end_time=end_ns)
            end_ns = start_ns

    def _set_response_attributes(
        self,
        span: trace.Span,
        error: BaseException | None,
        usage: Usage | None,
        estimated: str | bool | None,
    ) -> None:
        """``estimated``: the billing label, or True when only the reasoning tokens were
        counted from the events (either way the span says its usage is estimated)."""
        attributes: dict[str, Any] = {}  # set in one call, not one call per attribute
        if self._response_id:
            attributes[sc.GEN_AI_RESPONSE_ID] = self._response_id
        if self._response_model:
            attributes[sc.GEN_AI_RESPONSE_MODEL] = self._response_model
        if self._finish_reasons:
            attributes[sc.GEN_AI_RESPONSE_FINISH_REASONS] = self._finish_reasons
        if usage is not None:
            attributes[sc.GEN_AI_USAGE_INPUT_TOKENS] = usage.input_tokens
            if not self._embeddings:  # an embedding generates no output token
                attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] = usage.output_tokens
                attributes[sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] = usage.cached_input_tokens
                if usage.cache_write_input_tokens:
                    written = usage.cache_write_input_tokens
                    attributes[sc.GEN_AI_USAGE_CACHE_WRITE_INPUT_TOKENS] = written
            if usage.reasoning_output_tokens or self._reasoning_reported:
                reasoning = usage.reasoning_output_tokens
                attributes[sc.GEN_AI_USAGE_REASONING_OUTPUT_TOKENS] = reasoning
        if self._dimensions is not None:
            attributes[sc.GEN_AI_EMBEDDINGS_DIMENSION_COUNT] = self._dimensions
        if estimated is True or estimated == sc.BILLING_ESTIMATED:
            attributes[sc.ATTR_USAGE_ESTIMATED] = True
        if self._engine_share is not None:
            seconds, gpus = self._engine_share
            attributes[sc.ATTR_ENGINE_SECONDS] = seconds
            if gpus:
                attributes[sc.ATTR_ENGINE_GPU_SECONDS] = seconds * gpus
        span.set_attributes(attributes)
        if error is not None:
            # ClientDisconnected's message is stagelens' own: it says what happened.
            capture = self.telemetry.settings.capture_message_content
            record_failure(span, error, capture=capture or isinstance(error, ClientDisconnected))
            span.set_attribute(sc.ERROR_TYPE, type(error).__qualname__)
        elif self._failure is not None and self._status < 400:
            span.set_attribute(sc.ERROR_TYPE, self._failure)
            span.set_status(Status(StatusCode.ERROR, "stream failed after its response began"))

    def _capture_output(self, body: dict[str, Any]) -> None:
        choices = body.get("choices")
        messages = [
            c.get("message") or {"text": c.get("text")}
            for c in (choices if isinstance(choices, list) else ())
            if isinstance(c, dict)
        ]
        self.span.set_attribute(sc.GEN_AI_OUTPUT_MESSAGES, json.dumps(messages))
