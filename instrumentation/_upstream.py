"""One instrumented upstream call, as an explicit state machine.

The call's ``mode`` says what it does with the next chunk of the upstream body:

- ``BODY``: a non-streamed answer: kept (up to ``_MAX_BODY``) and parsed when it ends;
- ``EVENTS``: a stream whose events are parsed as they arrive: until its first event is
  read (a recorded span shows the response id and model), or throughout with ``n > 1``
  (a choice may finish long before the others);
- ``TAIL``: a stream that only keeps its last bytes: with one choice every event that
  matters but the first sits at the end of the stream, so a content chunk costs an append
  and no scan, and the final events are read from the tail once, when the stream ends;
- ``FINISHED``: the span ended and the figures were handed to the request.

``EVENTS`` moves to ``TAIL`` once the first event is read (one choice). Any mode moves to
``FINISHED`` when the body was read to its end, failed, or was closed (``finish`` /
``closed``). How the stream ended is a separate fact (``_ended``: its last event arrived),
which decides the span's status.
"""

from __future__ import annotations

import enum
import json
import time
from typing import Any, Final

import httpx
from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from stagelens.instrumentation import _sse
from stagelens.instrumentation._headers import add_upstream_headers

from stagelens import semconv as sc
from stagelens.pricing import Usage
from stagelens.request import RequestState, current_request
from stagelens.stages import Stage
from stagelens.telemetry import Telemetry, default_telemetry

_MAX_BODY: Final = 4 * 1024 * 1024
"""Non-streamed bodies are kept up to this size for parsing usage (bigger: not parsed)."""
_NS: Final = 1_000_000_000
_INFERENCE: Final = Stage.INFERENCE.value
_TAIL_KEEP: Final = 16 * 1024
_TAIL_MAX: Final = 48 * 1024
"""A stream's body is not scanned as it passes: only its last ``_TAIL_KEEP`` to
``_TAIL_MAX`` bytes are kept, and the final events are read from them once, when the
stream ends."""


class Mode(enum.Enum):
    """What an upstream call does with the next chunk of the body (module docstring)."""

    BODY = "body"
    EVENTS = "events"
    TAIL = "tail"
    FINISHED = "finished"


_BODY: Final = Mode.BODY
_EVENTS: Final = Mode.EVENTS
_TAIL: Final = Mode.TAIL
_FINISHED: Final = Mode.FINISHED


class ClientDisconnected(Exception):
    """Recorded on the inference span when the client's departure closed the stream."""

    def __init__(self) -> None:
        super().__init__("the client disconnected; the generation was aborted")


class _UpstreamCall:
    """One instrumented upstream request: span, mode, parsed facts, timings."""

    __slots__ = (
        "_buffer",
        "_ended",
        "_engine",
        "_finish_reasons",
        "_last_data_ns",
        "_recording",
        "_refused",
        "_response_id",
        "_response_model",
        "_single_choice",
        "_t0",
        "_tail_cut",
        "_unread_first",
        "_usage",
        "mode",
        "model",
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
        self.stream = bool(payload.get("stream", False))
        if state is not None and state.model is None:
            state.set_model(self.model)
        if state is not None and not state.recording:
            # Sampled out: propagate the root's (unsampled) context, build nothing.
            self.span: trace.Span = trace.NonRecordingSpan(state.root_span.get_span_context())
        else:
            self.span = telemetry.tracer.start_span(
                f"{operation} {self.model}",
                kind=SpanKind.CLIENT,
                attributes=_client_attributes(self.model, self.stream, operation, payload, request),
            )
        self._recording = recording = self.span.is_recording()
        if telemetry.settings.capture_message_content and recording:
            content = payload.get("messages", payload.get("prompt"))
            self.span.set_attribute(sc.GEN_AI_INPUT_MESSAGES, json.dumps(content))
        request_id = add_upstream_headers(request, self.span, recording)
        if state is not None:
            state.request_id = request_id
        if recording:
            self.span.set_attribute(sc.ATTR_REQUEST_ID, request_id)
        self._t0 = time.perf_counter()
        self._buffer = bytearray()
        """BODY: the body; EVENTS: the partial line; TAIL: the stream's tail."""
        self._ended = False
        """The stream's last event arrived ([DONE], a finish reason or the usage chunk).
        It decides the span's status only: a sampled-out stream's tail is not searched."""
        self._unread_first = recording
        """The first event is still to be read for the span's response id and model (a
        sampled-out request has no span, so nothing to read before the final events)."""
        n = payload.get("n")
        self._single_choice = n is None or n == 1
        if not self.stream:
            self.mode = _BODY
        elif self._unread_first or not self._single_choice:
            self.mode = _EVENTS
        else:
            self.mode = _TAIL
        self._tail_cut = False
        self._last_data_ns = 0
        self._response_id: str | None = None
        self._response_model: str | None = None
        self._finish_reasons: list[str] = []
        self._usage: Usage | None = None
        self._engine: dict[str, Any] | None = None
        self._refused = False
        """The server answered with an error status."""

    # -- response ----------------------------------------------------------------------
    def on_response(self, response: httpx.Response) -> None:
        self._last_data_ns = time.time_ns()
        if response.status_code >= 400:
            self._refused = True
            self._ended = True  # an error body, not an event stream: no last event to await
        if self.span.is_recording():
            vllm_id = response.headers.get(sc.HEADER_REQUEST_ID)
            if vllm_id:
                self.span.set_attribute(sc.ATTR_VLLM_REQUEST_ID, vllm_id)
            if response.status_code >= 400:
                self.span.set_attribute(sc.ERROR_TYPE, str(response.status_code))
                self.span.set_status(Status(StatusCode.ERROR, f"HTTP {response.status_code}"))

    def on_chunk(self, chunk: bytes) -> None:
        """Take one chunk of the body, as the mode says (the hot path of every stream)."""
        mode = self.mode
        if mode is _TAIL:
            tail = self._buffer
            tail += chunk
            if len(tail) > _TAIL_MAX:
                self.trim_tail()
            if self._recording:  # the latest chunk's time ends the engine spans
                self._last_data_ns = time.time_ns()
        elif mode is _EVENTS:
            payloads, self._buffer = _sse.data_lines(self._buffer, chunk)
            for payload in payloads:
                if payload == _sse.DONE:
                    self._ended = True
                elif payload:
                    self._on_event(payload)
            if not self._unread_first and self._single_choice:
                self.mode = _TAIL  # the first event is read: from here on, keep the tail
        elif mode is _BODY and len(self._buffer) + len(chunk) <= _MAX_BODY:
            self._buffer += chunk

    def trim_tail(self) -> None:
        """Keep the last ``_TAIL_KEEP`` bytes of the stream's tail."""
        tail = self._buffer
        del tail[: len(tail) - _TAIL_KEEP]
        self._tail_cut = True

    def _settle(self) -> None:
        """Read the final events from the kept tail (once, when a TAIL stream ended)."""
        if self.mode is not _TAIL:
            return
        self.mode = _EVENTS  # read: a second call finds nothing to do
        data, self._buffer = self._buffer, bytearray()
        start = data.find(b"\n") + 1 if self._tail_cut else 0  # a cut leaves a partial line
        ended, payloads = _sse.final_events(data, start, self._recording)
        self._ended = self._ended or ended
        for payload in payloads:
            try:  # not contextlib.suppress: a context manager costs more than the parse
                self._absorb(_sse.loads(payload))
            except ValueError:
                continue  # not JSON: nothing to learn from it

    def _on_event(self, payload: bytes) -> None:
        """Apply one event read as it arrived: end of stream, time of the latest token,
        and what it carries."""
        finishes = _sse.is_final_choice(payload)
        usage = _sse.has_usage(payload)
        usage_only = usage and _sse.has_no_choices(payload)
        if not usage_only:
            self._last_data_ns = time.time_ns()
        if finishes or usage_only:
            self._ended = True
        # A recorded span gets the first event's id and model and the finish reasons; a
        # sampled-out request only needs what feeds metrics and billing (usage, timings).
        if self._unread_first or usage or (finishes and self._recording):
            self._unread_first = False
            try:
                self._absorb(_sse.loads(payload))
            except ValueError:
                return

    def _absorb(self, body: dict[str, Any]) -> None:
        if self._recording:  # what only the span shows
            self._response_id = self._response_id or body.get("id")
            self._response_model = self._response_model or body.get("model")
            self._finish_reasons += _sse.finish_reasons_of(body)
        usage = _sse.usage_of(body)
        if usage is not None:
            self._usage = usage
        metrics = body.get("metrics")
        if isinstance(metrics, dict):
            self._engine = metrics

    # -- end -----------------------------------------------------------------------------
    def finish(self, error: BaseException | None = None) -> None:
        """End the span and record; idempotent (close after exhaustion is a no-op)."""
        if self.mode is _FINISHED:
            return
        try:
            self._settle()
            self.mode = _FINISHED
            self._finish(error)
        except Exception as exc:
            self.mode = _FINISHED
            self.telemetry.report_error("upstream", exc)
            self.span.end()

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
            self._settle()
        except Exception as exc:
            self.telemetry.report_error("upstream", exc)
        if self._ended:
            self.finish()
            return
        if self.span.is_recording():
            self.span.set_attribute(sc.ATTR_STREAM_CLOSED_EARLY, True)
        self._ended = True
        state = self.state
        self.finish(ClientDisconnected() if state is not None and state.disconnected else None)

    def _finish(self, error: BaseException | None) -> None:
        elapsed = time.perf_counter() - self._t0
        if not self.stream and self._buffer:
            try:
                body = _sse.loads(bytes(self._buffer))
                if isinstance(body, dict):
                    self._absorb(body)
                    if self.telemetry.settings.capture_message_content:
                        self._capture_output(body)
            except ValueError:
                pass
        state, span, telemetry = self.state, self.span, self.telemetry
        if self._usage is not None and state is not None:
            state.upstream_usage = self._usage
        phases = _sse.phases_of(self._engine)
        if state is not None:  # recorded with the request's other figures at its end
            state.stage_times.append((_INFERENCE, elapsed))
            state.phases = phases
        else:  # no request around the call: recorded now, its model label bounded here
            model = telemetry.models.label(self.model, served=error is None and not self._refused)
            series = telemetry.instruments.for_model(model)
            series.stage(_INFERENCE).observe(elapsed)
            for phase, seconds in phases:
                series.phase(phase).observe(seconds)
        if span.is_recording():
            self._set_response_attributes(span, error)
            self._engine_spans(phases)
        span.end()

    def _engine_spans(self, phases: list[tuple[str, float]]) -> None:
        """Child spans laid back to back, ending when the last token arrived."""
        if not phases:
            return
        parent = trace.set_span_in_context(self.span)
        end_ns = self._last_data_ns or time.time_ns()
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

    def _set_response_attributes(self, span: trace.Span, error: BaseException | None) -> None:
        if self._response_id:
            span.set_attribute(sc.GEN_AI_RESPONSE_ID, self._response_id)
        if self._response_model:
            span.set_attribute(sc.GEN_AI_RESPONSE_MODEL, self._response_model)
        if self._finish_reasons:
            span.set_attribute(sc.GEN_AI_RESPONSE_FINISH_REASONS, self._finish_reasons)
        if self._usage is not None:
            span.set_attribute(sc.GEN_AI_USAGE_INPUT_TOKENS, self._usage.input_tokens)
            span.set_attribute(sc.GEN_AI_USAGE_OUTPUT_TOKENS, self._usage.output_tokens)
            span.set_attribute(
                sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS, self._usage.cached_input_tokens
            )
        if error is not None:
            span.record_exception(error)
            span.set_attribute(sc.ERROR_TYPE, type(error).__qualname__)
            span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
        elif self.stream and not self._ended:
            span.set_attribute(sc.ERROR_TYPE, "incomplete_stream")
            span.set_status(Status(StatusCode.ERROR, "stream closed before the last event"))

    def _capture_output(self, body: dict[str, Any]) -> None:
        messages = [c.get("message") or {"text": c.get("text")} for c in body.get("choices") or ()]
        self.span.set_attribute(sc.GEN_AI_OUTPUT_MESSAGES, json.dumps(messages))


def _client_attributes(
    model: str, stream: bool, operation: str, payload: dict[str, Any], request: httpx.Request
) -> dict[str, Any]:
    """The inference span's request attributes (built only for a recorded span)."""
    attributes: dict[str, Any] = {
        sc.ATTR_STAGE: _INFERENCE,
        sc.GEN_AI_OPERATION_NAME: operation,
        sc.GEN_AI_PROVIDER_NAME: sc.GEN_AI_PROVIDER_VLLM,
        sc.GEN_AI_REQUEST_MODEL: model,
        sc.GEN_AI_REQUEST_STREAM: stream,
        sc.SERVER_ADDRESS: request.url.host,
    }
    if request.url.port is not None:
        attributes[sc.SERVER_PORT] = request.url.port
    max_tokens = payload.get("max_completion_tokens", payload.get("max_tokens"))
    if isinstance(max_tokens, int):
        attributes[sc.GEN_AI_REQUEST_MAX_TOKENS] = max_tokens
    return attributes


def start_call(telemetry: Telemetry | None, request: httpx.Request) -> _UpstreamCall | None:
    """Begin instrumenting ``request`` if it is a completion call; else just propagate."""
    path = request.url.path
    if request.method != "POST":
        propagate.inject(request.headers)
        return None
    if path.endswith("/chat/completions"):
        operation = sc.GEN_AI_OPERATION_CHAT
    elif path.endswith("/completions"):
        operation = sc.GEN_AI_OPERATION_TEXT_COMPLETION
    else:
        propagate.inject(request.headers)
        return None
    state = current_request()
    if telemetry is None:
        telemetry = state.telemetry if state is not None else default_telemetry()
    try:
        payload = _sse.loads(request.content or b"{}")
    except (ValueError, httpx.RequestNotRead):
        payload = {}
    if not isinstance(payload, dict):
        payload = {}
    return _UpstreamCall(telemetry, state, payload, operation, request)
