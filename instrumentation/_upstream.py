"""One instrumented upstream call, as an explicit state machine.

The call's ``mode`` says what it does with the next chunk of the upstream body:

- ``BODY``: an answer that is not an event stream (not streamed, or an error status):
  kept (up to ``_MAX_BODY``) and read when it ends;
- ``EVENTS``: a stream whose every event is read as it arrives (``_events.py``): output
  events are counted and marked for the request's first token and inter-token gaps, the
  usage, finish reasons, engine timings and error events are taken, and the usage event
  stagelens asked for is removed from what the app reads;
- ``PASS``: a stream no longer read (an event longer than ``_TAIL_MAX``, or a reading that
  failed): its chunks pass as they come, nothing more is learned;
- ``FINISHED``: the span ended and the figures were handed to the request.

Any mode moves to ``FINISHED`` when the body was read to its end, failed, or was closed
(``finish`` / ``closed``). How the stream ended (``_ended``: its last event arrived) and
whether it failed after its headers (``_failure``) are facts beside the mode.
"""

from __future__ import annotations

import enum
import json
import time
from dataclasses import replace
from typing import Any, Final

import httpx
from opentelemetry import propagate, trace
from opentelemetry.trace import (
    INVALID_SPAN,
    INVALID_SPAN_CONTEXT,
    NonRecordingSpan,
    SpanKind,
    Status,
    StatusCode,
)
from stagelens.instrumentation import _openai
from stagelens.instrumentation._events import EventReader
from stagelens.instrumentation._headers import (
    CONTENT_TYPE_KEY,
    REQUEST_ID_KEY,
    add_upstream_headers,
    header_value,
)
from stagelens.instrumentation._span_errors import record_failure
from stagelens.instrumentation._suppress import current_context

from stagelens import _compat
from stagelens import semconv as sc
from stagelens.metrics.genai_call import GenAICall
from stagelens.metrics.record import LoneRecord, PhaseTimes, StageTimes
from stagelens.pricing import Usage
from stagelens.request import InferenceFacts, RequestState, current_request
from stagelens.spans.pending import DeferredSpan, PendingTrace, context_in, new_id
from stagelens.spans.stages import anchor_in, open_stage, parent_under
from stagelens.stages import Stage
from stagelens.telemetry import Telemetry, default_telemetry

_MAX_BODY: Final = 4 * 1024 * 1024
"""Answers that are not streamed are kept up to this size for their usage (bigger: not
read)."""
_NS: Final = 1_000_000_000
_INFERENCE: Final = Stage.INFERENCE.value
_Ending = tuple[BaseException | None, Usage | None, str | bool | None, list[tuple[str, float]], int]
"""How a call of an undecided trace ended, for its span if kept: (error, usage, estimated,
engine phases, end in ``time_ns``)."""


class _Later(NonRecordingSpan):
    """The span of a call of an undecided trace that nothing asked for yet (``LATER``):
    recorded (the call holds what the span needs), but not made."""

    def is_recording(self) -> bool:
        return True


LATER: Final[trace.Span] = _Later(INVALID_SPAN_CONTEXT)
"""``_UpstreamCall.span`` of a call of an undecided trace whose span nothing asked for yet:
the call holds what its span needs, and makes it only when asked (``_recorded``: never
through ``span`` itself) or when the trace is kept (``as_deferred``)."""


class Mode(enum.Enum):
    """What an upstream call does with the next chunk of the body (module docstring)."""

    BODY = "body"
    EVENTS = "events"
    PASS = "pass"
    FINISHED = "finished"


_BODY: Final = Mode.BODY
_EVENTS: Final = Mode.EVENTS
_PASS: Final = Mode.PASS
_FINISHED: Final = Mode.FINISHED


class ClientDisconnected(Exception):
    """Recorded on the inference span when the client's departure closed the stream."""

    def __init__(self) -> None:
        super().__init__("the client disconnected; the generation was aborted")


class _UpstreamCall(EventReader):
    """One instrumented upstream request: span, mode, what its answer said, timings."""

    __slots__ = (
        "_buffer",
        "_ctx",
        "_dimensions",
        "_embeddings",
        "_end_ns",
        "_ending",
        "_engine",
        "_engine_ns",
        "_headers_seen",
        "_operation",
        "_parent",
        "_payload",
        "_request",
        "_response_headers",
        "_response_model",
        "_span_id",
        "_start_ns",
        "_status",
        "_t0",
        "_trace",
        "mode",
        "model",
        "on_chunk",
        "span",
        "state",
        "stream",
        "telemetry",
    )

    def __init__(
        self,
        telemetry: Telemetry,
        state: RequestState | None,
        payload: dict[str, Any],
        operation: str,
        request: httpx.Request,
    ) -> None:
        self.telemetry = telemetry
        self.state = state
        self.model = str(payload.get("model") or telemetry.settings.default_model)
        self._embeddings = embeddings = operation == sc.GEN_AI_OPERATION_EMBEDDINGS
        self._dimensions: int | None = None
        """Embeddings: the size of the answer's first vector, when it says."""
        self.stream = stream = payload.get("stream", False) is True and not embeddings
        later = False
        """The span is data until the trace is decided (``DeferredSpan``)."""
        if state is not None and not state.recording:
            # Sampled out: the root itself (unrecorded) stands for the call's span: its
            # context is the one propagated, and nothing is built.
            self.span: trace.Span = state.root_span
        elif state is not None and (pending := state.pending) is not None and pending.kept is None:
            # The tail sampler, undecided: no span yet (LATER). The call holds what its
            # span needs (a DeferredSpan, made only when something asks for it or the
            # trace is kept); its attributes are read from the payload and the answer
            # only then. Its id is drawn now, for the traceparent.
            self._operation, self._request = operation, request
            self._response_headers: httpx.Headers | None = None
            self._ending: _Ending | None = None
            self._trace: PendingTrace = pending
            self._ctx = ctx = current_context()
            opened = open_stage()
            # Inside an open stage, its parent is found now: the stage may be gone when
            # the span is made. Else it is the span of its context, found then.
            self._parent: trace.Span | None = (
                None if opened is None else parent_under(anchor_in(ctx), opened)
            )
            self._start_ns = time.time_ns()
            self._span_id = new_id(64)
            self._end_ns = 0
            self.span = LATER
            later = True
            propagated = self._context_span()  # the context its span will have
        else:
            self.span = telemetry.tracer.start_span(
                f"{operation} {self.model}",
                kind=SpanKind.CLIENT,
                attributes=_client_attributes(self.model, stream, operation, payload, request),
            )
        if not later:
            propagated = self.span
        recording = self.span.is_recording()
        inference = None
        if state is not None:
            if state.model is None:
                state.set_model(self.model)
            inference = state.inference
            if inference is None:
                inference = state.inference = InferenceFacts()
            inference.calls += 1
            state.streamed = state.streamed or stream
            if embeddings:
                state.set_tokenless()  # an embedding has no first token
            if telemetry.fold.needs_genai:  # the GenAI metrics are on
                url = request.url
                state.genai = GenAICall(operation, stream, url.host, url.port)
        self._inference = inference
        n = payload.get("n")
        EventReader.__init__(
            self,
            recording=recording,
            chat=operation == sc.GEN_AI_OPERATION_CHAT,
            single_choice=n is None or n == 1,
            sends=state.token_times if state is not None else None,
            inference=inference,
            span_later=later,
        )
        if telemetry.settings.capture_message_content and recording:
            content = payload.get("messages", payload.get("prompt", payload.get("input")))
            self._recorded().set_attribute(sc.GEN_AI_INPUT_MESSAGES, json.dumps(content))
        if stream and not _openai.wants_usage(payload):
            # Ask for the usage event (billing needs it) and remove it from what the app
            # reads, which is then byte for byte what it would read without stagelens.
            self._asked_usage = _ask_for_usage(request, payload)
        request_id = add_upstream_headers(request, propagated, recording)
        if state is not None:
            state.request_id = request_id
        if recording and request_id is not None:
            self._recorded().set_attribute(sc.ATTR_REQUEST_ID, request_id)
        self._payload = payload
        self._t0 = time.perf_counter()
        self._buffer = bytearray()
        """BODY: the answer so far."""
        self.mode = _EVENTS if stream else _BODY
        self.on_chunk = self.read if stream else self._keep_body
        """Take one chunk of the body, as the mode says; return the bytes the app reads now
        (the chunk itself, except around the usage event stagelens asked for). Bound to
        the mode's reader, so that a stream's chunk costs one call."""
        self._status = 0
        self._headers_seen = False
        self._engine: dict[str, Any] | None = None
        self._engine_ns = 0
        """Wall clock when the engine's per-request metrics arrived (a recorded span's
        engine spans end there): with the last token, or in the event just after it."""
        self._response_model: str | None = None

    # -- response ----------------------------------------------------------------------
    def on_response(self, response: httpx.Response) -> None:
        self._headers_seen = True
        self._status = status = response.status_code
        if status >= 400:
            self.mode = _BODY  # an error body, not an event stream: read it at the end
            self.on_chunk = self._keep_body
            self._ended = True  # no last event to await
        elif self._inference is not None:
            self._inference.ok = True  # answered: the model it named is served
        if status < 400 and self._asked_usage:
            content_type = header_value(response.headers, CONTENT_TYPE_KEY) or ""
            self._strip = content_type.startswith("text/event-stream")
        span = self.span
        if self._span_later:  # undecided (LATER, or a DeferredSpan)
            if status < 400:
                self._response_headers = response.headers  # read only if kept (_built)
                return
            span = self._recorded()  # an error status is set on it (made now if LATER)
        if span.is_recording():
            vllm_id = header_value(response.headers, REQUEST_ID_KEY)
            if vllm_id:
                span.set_attribute(sc.ATTR_VLLM_REQUEST_ID, vllm_id)
            if status >= 400:
                span.set_attribute(sc.ERROR_TYPE, str(status))
                span.set_status(Status(StatusCode.ERROR, f"HTTP {status}"))

    def _keep_body(self, chunk: bytes) -> bytes:
        """BODY: keep the answer (up to ``_MAX_BODY``) for the end."""
        if len(self._buffer) + len(chunk) <= _MAX_BODY:
            self._buffer += chunk
        return chunk

    def stop_reading(self) -> bytes:
        """PASS: stop reading the stream (EventReader.stop_reading)."""
        if self.mode is _EVENTS:
            self.mode = _PASS
        return super().stop_reading()

    def flush(self) -> bytes:
        """The bytes held back for the app (an incomplete event) when the body ends."""
        return self.release()

    def _report(self, component: str, exc: BaseException) -> None:
        """Count a failure to read; logged once, by type only (``report_error`` never logs
        a message: it can quote the prompt or the completion)."""
        self.telemetry.report_error(component, exc)

    # -- end -----------------------------------------------------------------------------
    def finish(self, error: BaseException | None = None) -> None:
        """End the span and record; idempotent (close after exhaustion is a no-op)."""
        if self.mode is _FINISHED:
            return
        reading = self.mode is _EVENTS
        self.mode = _FINISHED
        try:
            if reading:
                self.settle()
            self._finish(error)
        except Exception as exc:
            self.telemetry.report_error("upstream", exc)
            self._recorded().end()
        # A bound method of the call held by the call is a cycle that only the garbage
        # collector frees, with everything the call holds: nothing is read after the end.
        self.on_chunk = _passed

    def closed(self) -> None:
        """The caller closed the body (or abandoned iterating it) before it was exhausted.

        After the last event ([DONE], a finish reason, the usage chunk) that is a normal end:
        a relay may stop reading at ``[DONE]``. Before it, either the gateway cut the stream
        on purpose (stop sequence, safety check): recorded as ``closed_early``, not as an
        error, because nothing failed; or the client went away, which aborts the generation
        and leaves the answer undelivered: ``closed_early`` and an error. A backend that
        dies mid-stream raises while the body is read and also ends the span in error.
        """
        if self.mode is _FINISHED:
            return
        try:
            if self.mode is _EVENTS:
                self.settle()
                self.stop_reading()
        except Exception as exc:
            self.telemetry.report_error("upstream", exc)
        if self._ended:
            self.finish()
            return
        span = self._recorded()
        if span.is_recording():
            span.set_attribute(sc.ATTR_STREAM_CLOSED_EARLY, True)
        self._ended = True  # cut on purpose or the client gone: no failure of the server
        state = self.state
        self.finish(ClientDisconnected() if state is not None and state.disconnected else None)

    def _finish(self, error: BaseException | None) -> None:
        elapsed = time.perf_counter() - self._t0
        if self._buffer:
            self._read_body(bytes(self._buffer))
        answered = self._headers_seen and self._status < 400
        if error is not None and answered and _is_failure(error):
            self._failure = type(error).__qualname__  # the backend failed mid-answer
        elif self.stream and answered and not self._ended and error is None:
            self._failure = sc.ERROR_TYPE_INCOMPLETE_STREAM
        elif self._headers_seen and self._status >= 500:
            self._failure = str(self._status)  # a failing server, whatever the app answers
        usage, billing, counted = self._metered(answered)
        phases = _openai.phases_of(self._engine)
        upstream_ttft = (
            self._first_output_at - self._t0
            if self.stream and self._first_output_at is not None
            else None
        )
        state, inference = self.state, self._inference
        if state is not None and inference is not None:
            if usage is not None:
                state.upstream_usage = _openai.add_usage(state.upstream_usage, usage)
            inference.failure = self._failure  # the latest call decides
            inference.estimated = inference.estimated or billing == sc.BILLING_ESTIMATED
            inference.reasoning_counted = inference.reasoning_counted or counted
            inference.unbilled = inference.unbilled or billing == sc.BILLING_UNBILLED
            if inference.upstream_ttft is None:
                inference.upstream_ttft = upstream_ttft
            state.stage_times.append((_INFERENCE, elapsed))
            state.phases = phases
            answered_model = self._response_model
            if state.genai is not None and answered_model is not None:
                state.genai = state.genai._replace(response_model=answered_model)
        else:  # no request around the call: recorded now, its model label bounded here
            self._record_alone(elapsed, phases, upstream_ttft, billing, answered)
        span = self.span
        if self._span_later:  # undecided (LATER, or a DeferredSpan): only if kept
            end_ns = self._engine_ns or time.time_ns()
            self._ending = (error, usage, billing or counted, phases, end_ns)
            if span is LATER:
                self._end_ns = time.time_ns()
                self._trace.add(self)  # held as itself (HeldSpan): its span made if kept
            else:
                span.end()
            # The span is its trace's now. Let go of it: its completions hold this call,
            # and a call holding the span would make a cycle that only the garbage
            # collector frees (every dropped trace's records with it).
            self.span = INVALID_SPAN
            return
        if span.is_recording():
            self._set_response_attributes(span, error, usage, billing or counted)
            self._engine_spans(span, phases, self._engine_ns or time.time_ns())
        span.end()

    # -- a span LATER ----------------------------------------------------------------------
    def _context_span(self) -> trace.Span:
        """The context the call's span will have, as a span to propagate (LATER)."""
        return NonRecordingSpan(context_in(self._trace, self._span_id))

    def _recorded(self) -> trace.Span:
        """The call's span, made now if it was LATER (something needs it as a span: an
        attribute, an error, a child, its end in a failure)."""
        span = self.span
        if span is LATER:
            span = self.span = self._deferred(None)
        return span

    def _deferred(self, end_ns: int | None) -> DeferredSpan:
        """The ``DeferredSpan`` of a call that was LATER, as made at its start: its id,
        start, parent and completion; ``end_ns``: its end, once it ended."""
        anchor = anchor_in(self._ctx)
        span = DeferredSpan(
            self.telemetry.tracer,
            f"{self._operation} {self.model}",
            anchor,
            self._parent if self._parent is not None else anchor,
            self._trace,
            {},
            SpanKind.CLIENT,
            self._start_ns,
            complete=self._built,
        )
        span.span_id = self._span_id
        span.end_time = end_ns
        return span

    def as_deferred(self) -> DeferredSpan:
        """``HeldSpan``: the span of a call held by its kept trace, ended."""
        return self._deferred(self._end_ns)

    @property
    def anchor(self) -> trace.Span:
        """``OpenStage`` (a call open as the stage of its transport, LATER): the span
        current in the OpenTelemetry context when the call began."""
        return anchor_in(self._ctx)

    def deferred(self) -> DeferredSpan | None:
        """``OpenStage``: the call's span, made now if it was LATER; None once the call
        has handed it to its trace."""
        span = self._recorded()
        return span if type(span) is DeferredSpan else None

    def _built(self, built: trace.Span) -> None:
        """What the span built from the call's ``DeferredSpan`` holds besides the calls made
        on it, as a span recorded at once gets it (a completion run only if the trace is
        kept): the request attributes, then, as ``_finish`` sets them, the vLLM request
        id, the answer's attributes and the engine's spans. A span is built only once it
        ended, so the call has ended too (``_ending``), unless ending it failed."""
        built.set_attributes(
            _client_attributes(
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

    def _read_body(self, raw: bytes) -> None:
        """Take a whole answer (not streamed, or an error body)."""
        try:
            body = _openai.loads(raw)
        except ValueError:
            if self._status < 400:
                self._report(sc.COMPONENT_UPSTREAM_EVENT, ValueError("answer is not JSON"))
            return
        facts = _openai.EventFacts(body)
        if self._status >= 400:
            return
        self.take(facts)
        if facts.outputs and self._first_output_at is None:
            self._first_output_at = time.perf_counter()
            self.mark_first()
        if facts.answers:
            self.mark_first_answer()  # the whole answer at once: the thinking with it
        if self._embeddings:
            self._dimensions = _openai.embedding_size(body)
        elif self.telemetry.settings.capture_message_content and isinstance(body, dict):
            self._capture_output(body)

    def take(self, facts: _openai.EventFacts) -> None:
        """Apply one event's (or the answer's) facts beyond output (EventReader.take)."""
        super().take(facts)
        if facts.metrics is not None:
            self._engine = facts.metrics
            if self._recording:  # one reading a call, not one per output event
                self._engine_ns = time.time_ns()
        # Read whether or not the span is recorded: the GenAI metrics name the answering
        # model (one dict lookup on the few events that are parsed).
        self._response_model = self._response_model or facts.model

    def _metered(self, answered: bool) -> tuple[Usage | None, str | None, bool]:
        """(the call's usage, the billing label when the server's usage was missing,
        whether its reasoning tokens were counted from the events: the server's usage did
        not say them, and some reasoning came)."""
        usage, reasoning = self._usage, self._reasoning
        if usage is not None:
            if reasoning and not self._reasoning_reported:
                counted = min(reasoning, usage.output_tokens)  # a part of the output
                return replace(usage, reasoning_output_tokens=counted), None, True
            return usage, None, False
        if not answered:
            return None, None, False  # refused or never answered: nothing was generated
        outputs = self.outputs
        if outputs:
            estimate = Usage(
                input_tokens=_openai.prompt_size(self._payload),
                output_tokens=outputs,
                reasoning_output_tokens=reasoning,
            )
            return estimate, sc.BILLING_ESTIMATED, reasoning > 0
        return None, sc.BILLING_UNBILLED, False

    def _record_alone(
        self,
        elapsed: float,
        phases: list[tuple[str, float]],
        upstream_ttft: float | None,
        billing: str | None,
        answered: bool,
    ) -> None:
        """Record a call made outside any instrumented request (no middleware): a lone
        observation, through the fold like a request's record, its model label bounded
        here."""
        telemetry = self.telemetry
        served = answered and self._failure is None
        lone = LoneRecord(
            telemetry.models.label(self.model, served=served),
            StageTimes([(_INFERENCE, elapsed)]),
            PhaseTimes(phases) if phases else None,
            upstream_ttft,
            billing,
        )
        telemetry.fold.submit(lone)

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
            if usage.reasoning_output_tokens or self._reasoning_reported:
                reasoning = usage.reasoning_output_tokens
                attributes[sc.GEN_AI_USAGE_REASONING_OUTPUT_TOKENS] = reasoning
        if self._dimensions is not None:
            attributes[sc.GEN_AI_EMBEDDINGS_DIMENSION_COUNT] = self._dimensions
        if estimated is True or estimated == sc.BILLING_ESTIMATED:
            attributes[sc.ATTR_USAGE_ESTIMATED] = True
        span.set_attributes(attributes)
        if error is not None:
            # ClientDisconnected's message is stagelens' own: it says what happened.
            capture = self.telemetry.settings.capture_message_content
            record_failure(span, error, capture=capture or type(error) is ClientDisconnected)
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
        self._recorded().set_attribute(sc.GEN_AI_OUTPUT_MESSAGES, json.dumps(messages))


def _passed(chunk: bytes) -> bytes:
    """``on_chunk`` of a finished call: the chunk, as it came."""
    return chunk


def _is_failure(error: BaseException) -> bool:
    """An exception while reading an answered body that means the backend failed (the
    connection dropped, a protocol error), not that the reader was cancelled."""
    return isinstance(error, Exception) and not isinstance(error, ClientDisconnected)


def _ask_for_usage(request: httpx.Request, payload: dict[str, Any]) -> bool:
    """Make ``request`` ask for the usage event; False when its body cannot be rewritten."""
    try:
        raw = request.content
    except httpx.RequestNotRead:
        return False
    _compat.set_request_body(request, _openai.with_usage_asked(raw, payload))
    return True


def _client_attributes(
    model: str, stream: bool, operation: str, payload: dict[str, Any], request: httpx.Request
) -> dict[str, Any]:
    """The inference span's request attributes (built only for a recorded span)."""
    attributes: dict[str, Any] = {
        sc.ATTR_STAGE: _INFERENCE,
        sc.GEN_AI_OPERATION_NAME: operation,
        sc.GEN_AI_PROVIDER_NAME: sc.GEN_AI_PROVIDER_VLLM,
        sc.GEN_AI_REQUEST_MODEL: model,
        sc.SERVER_ADDRESS: request.url.host,
    }
    if request.url.port is not None:
        attributes[sc.SERVER_PORT] = request.url.port
    if operation == sc.GEN_AI_OPERATION_EMBEDDINGS:
        encoding = payload.get("encoding_format")
        if isinstance(encoding, str):
            attributes[sc.GEN_AI_REQUEST_ENCODING_FORMATS] = [encoding]
        return attributes
    attributes[sc.GEN_AI_REQUEST_STREAM] = stream
    max_tokens = payload.get("max_completion_tokens", payload.get("max_tokens"))
    if isinstance(max_tokens, int):
        attributes[sc.GEN_AI_REQUEST_MAX_TOKENS] = max_tokens
    return attributes


def start_call(telemetry: Telemetry | None, request: httpx.Request) -> _UpstreamCall | None:
    """Begin instrumenting ``request`` if it is a completion or embeddings call; else just
    propagate."""
    path = request.url.path
    if request.method != "POST":
        propagate.inject(request.headers)
        return None
    if path.endswith("/chat/completions"):
        operation = sc.GEN_AI_OPERATION_CHAT
    elif path.endswith("/completions"):
        operation = sc.GEN_AI_OPERATION_TEXT_COMPLETION
    elif path.endswith("/embeddings"):
        operation = sc.GEN_AI_OPERATION_EMBEDDINGS
    else:
        propagate.inject(request.headers)
        return None
    state = current_request()
    if telemetry is None:
        telemetry = state.telemetry if state is not None else default_telemetry()
    try:
        payload = _openai.loads(request.content or b"{}")
    except (ValueError, httpx.RequestNotRead):
        payload = {}
    if not isinstance(payload, dict):
        payload = {}
    return _UpstreamCall(telemetry, state, payload, operation, request)
