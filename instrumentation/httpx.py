"""Instrument the upstream call to an OpenAI-compatible server (vLLM) made with httpx.

What it adds to every ``/v1/chat/completions`` and ``/v1/completions`` call:

- the ``inference`` stage as a GenAI CLIENT span named ``{operation} {model}`` with the
  contract's ``gen_ai.*`` attributes, and ``traceparent`` + ``X-Request-Id`` injected so the
  vLLM side joins the same trace and uses the same request id;
- usage (input, output, cached input) parsed from the response, streamed or not, handed to
  the request's billing unless the app called ``record_usage()`` itself (explicit wins);
- vLLM's per-request timings (``--enable-per-request-metrics``) turned into ``queue``,
  ``prefill`` and ``decode`` child spans with real start and end times, and into
  ``stagelens_engine_phase_duration_seconds``.

Why a transport wrapper: httpx has no hook that sees a streamed body; wrapping the
transport lets chunks pass through untouched. Only the events that matter are parsed: the
first (for the span's response id and model, when recorded) and the final ones (finish
reason, usage, engine timings, ``[DONE]``), read from the kept tail of the stream once it
ends, so a content chunk costs an append and no scan. The span ends when the body is fully
read or the stream is closed (client gone, backend died), whichever is first.
"""

from __future__ import annotations

import json
import json.scanner
import random
import re
import time
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from operator import itemgetter
from time import time_ns
from typing import Any, Final

import httpx
from opentelemetry import baggage, context, propagate, trace
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.context import Context
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from stagelens import semconv as sc
from stagelens.genai_call import GenAICall
from stagelens.pricing import Usage
from stagelens.request import RequestState, current_request
from stagelens.stages import Stage
from stagelens.telemetry import Telemetry, default_telemetry

_MAX_BODY: Final = 4 * 1024 * 1024
"""Non-streamed bodies are kept up to this size for parsing usage (bigger: not parsed)."""
_NS: Final = 1_000_000_000
_INFERENCE: Final = Stage.INFERENCE.value
_PHASE_KEYS: Final = (
    (sc.PHASE_QUEUE, "queue_time_ms"),
    (sc.PHASE_PREFILL, "time_to_first_token_ms"),
    (sc.PHASE_DECODE, "generation_time_ms"),
)
"""The engine phases and the per-request metric of vLLM's response that times each."""
_NUMBER: Final = (int, float)
"""What a timing in vLLM's per-request metrics may be (a tuple: ``int | float`` would be
built anew on every check)."""

# SSE event checks, run only on the few events that are read (see ``_settle``). Each key
# first gets a plain ``in`` check (vLLM's compact JSON answers it alone); the precompiled
# pattern runs only when the key is there but spaced differently, as ``json.dumps``
# defaults (``"usage": {``) write it.
_USAGE_KEY: Final = b'"usage"'
_USAGE_COMPACT: Final = b'"usage":{'
_USAGE_RE: Final = re.compile(rb'"usage"\s*:\s*\{')
_CHOICES_KEY: Final = b'"choices"'
_NO_CHOICES_COMPACT: Final = b'"choices":[]'
_NO_CHOICES_RE: Final = re.compile(rb'"choices"\s*:\s*\[\s*\]')
_FINISH_KEY: Final = b'"finish_reason"'
_FINISH_COMPACT: Final = b'"finish_reason":"'
_FINISH_NULL_COMPACT: Final = b'"finish_reason":null'
_FINISH_NULL_SPACED: Final = b'"finish_reason": null'
_FINISH_RE: Final = re.compile(rb'"finish_reason"\s*:\s*"')
_DONE: Final = b"[DONE]"
_DONE_LINE: Final = re.compile(rb"data:[ \t]*\[DONE\]")
_DONE_WINDOW: Final = 64
"""``[DONE]`` is the stream's last event: it is looked for in the tail's last bytes only."""
_USAGE_AT: Final = re.compile(rb'"usage"\s*:\s*\{')
_FINISH_AT: Final = re.compile(rb'"finish_reason"\s*:\s*"')
_TAIL_KEEP: Final = 16 * 1024
_TAIL_MAX: Final = 48 * 1024
"""A stream's body is not scanned as it passes: only its last ``_TAIL_KEEP`` to
``_TAIL_MAX`` bytes are kept, and the final events are read from them once, when the
stream ends (see ``_UpstreamCall.on_chunk``)."""


def _has(payload: bytes, key: bytes, compact: bytes, pattern: re.Pattern[bytes]) -> bool:
    """``pattern`` in ``payload``, answered by substring checks whenever possible."""
    if compact in payload:
        return True
    return key in payload and pattern.search(payload) is not None


def _has_usage(payload: bytes) -> bool:
    return _USAGE_KEY in payload and _has(payload, _USAGE_KEY, _USAGE_COMPACT, _USAGE_RE)


def _is_final_choice(payload: bytes) -> bool:
    """True when some choice in the event carries a finish reason (a string, not null)."""
    if _FINISH_COMPACT in payload:
        return True
    keys = payload.count(_FINISH_KEY)
    if not keys:
        return False
    nulls = payload.count(_FINISH_NULL_COMPACT) + payload.count(_FINISH_NULL_SPACED)
    return keys > nulls and _FINISH_RE.search(payload) is not None


_SCAN: Final[Callable[[str, int], tuple[Any, int]]] = json.scanner.make_scanner(
    json.JSONDecoder()  # type: ignore[arg-type]  # typeshed types the argument as the class
)
"""The JSON decoder's own scanner (C when available), as ``json.loads`` uses it."""


def _loads(raw: bytes) -> Any:
    """``json.loads(raw)``, in one C call for the usual case (UTF-8, no whitespace around).

    Why: ``json.loads`` spends more time finding the encoding and stepping through its
    Python layers than parsing a short event; every upstream call parses its request body
    and its usage event. Anything unusual takes ``json.loads`` itself, same result, same
    errors.
    """
    try:
        text = raw.decode()
        value, end = _SCAN(text, 0)
    except (UnicodeDecodeError, StopIteration):
        return json.loads(raw)
    if end != len(text):
        return json.loads(raw)  # trailing whitespace, or data after the value (refused)
    return value


def _line_around(data: bytearray, at: int, start: int) -> tuple[int, bytes | None]:
    """(start offset, payload) of the SSE line holding offset ``at``; the payload is the
    JSON after ``data:``, or None when the line is no data line."""
    begin = data.rfind(b"\n", start, at) + 1 or start
    end = data.find(b"\n", at)
    line = bytes(data[begin : end if end >= 0 else len(data)])
    if not line.startswith(b"data:"):
        return begin, None
    return begin, line[5:].strip()


class _UpstreamCall:
    """One instrumented upstream request: span, parse state, timings."""

    __slots__ = (
        "_buffer",
        "_done",
        "_ended",
        "_engine",
        "_finish_reasons",
        "_first_seen",
        "_last_data_ns",
        "_lazy",
        "_recording",
        "_refused",
        "_response_id",
        "_response_model",
        "_single_choice",
        "_t0",
        "_tail_cut",
        "_usage",
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
        if state is not None and telemetry.instruments.sinks:  # the GenAI metrics are on
            url = request.url
            state.genai = GenAICall(operation, self.stream, url.host, url.port)
        if state is not None and not state.recording:
            # Sampled out: propagate the root's (unsampled) context, build nothing.
            self.span: trace.Span = trace.NonRecordingSpan(state.root_span.get_span_context())
        else:
            self.span = telemetry.tracer.start_span(
                f"{operation} {self.model}",
                kind=SpanKind.CLIENT,
                attributes=_client_attributes(self.model, self.stream, operation, payload, request),
            )
        self._recording = self.span.is_recording()
        if telemetry.settings.capture_message_content and self._recording:
            content = payload.get("messages", payload.get("prompt"))
            self.span.set_attribute(sc.GEN_AI_INPUT_MESSAGES, json.dumps(content))
        added: dict[str, str] = {}
        present = _header_names(request.headers)
        if present is None or _REQUEST_ID_KEY in present:
            request_id = request.headers.get(sc.HEADER_REQUEST_ID)
        else:
            request_id = None
        if request_id is None:
            request_id = _mint_request_id(self.span)
            added[sc.HEADER_REQUEST_ID] = request_id
        if state is not None:
            state.request_id = request_id
        if self._recording:
            self.span.set_attribute(sc.ATTR_REQUEST_ID, request_id)
            _inject(added, trace.set_span_in_context(self.span))
        else:
            _inject(added, None)
        _add_headers(request.headers, added, present)
        self._t0 = time.perf_counter()
        self._buffer = bytearray()
        """Eager parsing: a non-streamed body, or the stream's unparsed partial line."""
        self._done = False
        # The stream's last event arrived ([DONE], a finish reason or the usage chunk). It
        # decides the span's status only: a sampled-out stream's tail is not searched for it.
        self._ended = False
        # The first event is parsed for the span's response id and model: a sampled-out
        # request has no span, so nothing to parse before the final events.
        self._first_seen = not self._recording
        # With one choice every event that matters but the first sits at the end of the
        # stream; with n > 1 a choice may finish long before the others: parse eagerly.
        n = payload.get("n")
        self._single_choice = n is None or n == 1
        self._lazy = self.stream and self._first_seen and self._single_choice
        """Keep only the stream's tail (in ``_buffer``) and read it when the stream ends."""
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
        if self._lazy:
            # The hot path: every content chunk of a stream comes here. Keep the tail;
            # the time of the latest chunk ends the engine spans (recorded traces only).
            tail = self._buffer
            tail += chunk
            if len(tail) > _TAIL_MAX:
                self.trim_tail()
            if self._recording:
                self._last_data_ns = time.time_ns()
            return
        if not self.stream:
            if len(self._buffer) + len(chunk) <= _MAX_BODY:
                self._buffer += chunk
            return
        self._buffer += chunk
        if b"\n" not in chunk:
            return
        lines = self._buffer.split(b"\n")
        self._buffer = bytearray(lines.pop())
        for line in lines:
            if line.startswith(b"data:"):
                payload = bytes(line[5:]).strip()
                if payload == _DONE:
                    self._ended = True
                elif payload:
                    self._on_event(payload)
        if self._first_seen and self._single_choice:
            self._lazy = True  # the first event is read: from here on, keep the tail only

    def trim_tail(self) -> None:
        """Keep the last ``_TAIL_KEEP`` bytes of the stream's tail."""
        tail = self._buffer
        del tail[: len(tail) - _TAIL_KEEP]
        self._tail_cut = True

    def _settle(self) -> None:
        """Read the final events from the kept tail (once, when the stream ended).

        With one choice, all that matters sits at the end of the stream: the last event
        carrying usage (a running total with continuous usage stats: the last is the
        final one), the choice's finish reason, and ``[DONE]``. Each is found by searching
        back from the end in C (``rfind``), not by walking the lines: a quoted key cannot
        occur inside a JSON string, where quotes are escaped. Only the usage event is
        parsed, and the finish event too when its span is recorded (finish reasons).
        Sampled out, only the usage event is looked for: how the stream ended decides the
        span's status alone.
        """
        if not self._lazy:
            return
        self._lazy = False
        data = self._buffer
        self._buffer = bytearray()
        start = data.find(b"\n") + 1 if self._tail_cut else 0  # a cut leaves a partial line
        recording = self._recording
        at = data.rfind(_DONE, max(start, len(data) - _DONE_WINDOW)) if recording else -1
        if at >= 0:
            line_start = data.rfind(b"\n", start, at) + 1 or start
            found = _DONE_LINE.match(data, line_start)
            if found is not None and found.end() == at + len(_DONE):
                line_end = data.find(b"\n", at)
                rest = data[found.end() : line_end if line_end >= 0 else len(data)]
                if not rest.strip():
                    self._ended = True
        usage_line = None
        at = data.rfind(_USAGE_KEY, start)
        while at >= 0 and _USAGE_AT.match(data, at) is None:  # "usage": null, or a value
            at = data.rfind(_USAGE_KEY, start, at)
        if at >= 0:
            usage_line = _line_around(data, at, start)
            if (
                recording
                and usage_line[1] is not None
                and _has(usage_line[1], _CHOICES_KEY, _NO_CHOICES_COMPACT, _NO_CHOICES_RE)
            ):
                self._ended = True  # the usage-only chunk comes after the last token
        finish_line = None
        at = data.rfind(_FINISH_KEY, start) if recording else -1
        if at >= 0 and _FINISH_AT.match(data, at) is not None:
            self._ended = True
            finish_line = _line_around(data, at, start)
        if finish_line is None or finish_line == usage_line:
            lines: tuple[tuple[int, bytes | None] | None, ...] = (usage_line,)
        elif usage_line is None:
            lines = (finish_line,)
        elif finish_line < usage_line:  # in stream order: the later event's usage wins
            lines = (finish_line, usage_line)
        else:
            lines = (usage_line, finish_line)
        for line in lines:
            if line is None or line[1] is None:
                continue
            try:  # not contextlib.suppress: a context manager costs more than the parse
                self._absorb(_loads(line[1]))
            except ValueError:
                continue  # not JSON: nothing to learn from it

    def _on_event(self, payload: bytes) -> None:
        self._take(payload, _is_final_choice(payload), _has_usage(payload), timed=True)

    def _take(self, payload: bytes, finishes: bool, usage: bool, *, timed: bool) -> None:
        """Apply one event: end of stream, time of the latest token, and what it carries."""
        usage_only = usage and _has(payload, _CHOICES_KEY, _NO_CHOICES_COMPACT, _NO_CHOICES_RE)
        if timed and not usage_only:
            self._last_data_ns = time.time_ns()
        if finishes or usage_only:
            self._ended = True
        # A recorded span gets the first event's id and model and the finish reasons; a
        # sampled-out request only needs what feeds metrics and billing (usage, timings).
        if not self._first_seen or usage or (finishes and self._recording):
            self._first_seen = True
            try:
                self._absorb(_loads(payload))
            except ValueError:
                return

    def _absorb(self, body: dict[str, Any]) -> None:
        self._response_model = self._response_model or body.get("model")
        if self._recording:  # what only the span shows
            self._response_id = self._response_id or body.get("id")
            for choice in body.get("choices") or ():
                reason = choice.get("finish_reason")
                if reason:
                    self._finish_reasons.append(str(reason))
        usage = body.get("usage")
        if isinstance(usage, dict):
            details = usage.get("prompt_tokens_details") or {}
            self._usage = Usage(
                input_tokens=int(usage.get("prompt_tokens") or 0),
                output_tokens=int(usage.get("completion_tokens") or 0),
                cached_input_tokens=int(details.get("cached_tokens") or 0),
            )
        metrics = body.get("metrics")
        if isinstance(metrics, dict):
            self._engine = metrics

    def finish(self, error: BaseException | None = None) -> None:
        """End the span and record; idempotent (close after exhaustion is a no-op)."""
        if self._done:
            return
        self._done = True
        try:
            self._settle()
            self._finish(error)
        except Exception as exc:
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
        if self._done:
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
                body = _loads(bytes(self._buffer))
                if isinstance(body, dict):
                    self._absorb(body)
                    if self.telemetry.settings.capture_message_content:
                        self._capture_output(body)
            except ValueError:
                pass
        state, span, telemetry = self.state, self.span, self.telemetry
        if self._usage is not None and state is not None:
            state.upstream_usage = self._usage
        phases = self._phases()
        if state is not None:  # recorded with the request's other figures at its end
            state.stage_times.append((_INFERENCE, elapsed))
            state.phases = phases
            answered = self._response_model
            if state.genai is not None and isinstance(answered, str):
                state.genai = state.genai._replace(response_model=answered)
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

    def _phases(self) -> list[tuple[str, float]]:
        engine = self._engine
        if not engine:
            return []
        out = []
        for phase, key in _PHASE_KEYS:
            value = engine.get(key)
            if isinstance(value, _NUMBER) and value >= 0:
                out.append((phase, value / 1000.0))
        return out

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


_REQUEST_ID_KEY: Final = sc.HEADER_REQUEST_ID.lower().encode("ascii")


_ENTRY_KEY: Final = itemgetter(1)
"""The lower-cased name of one of httpx's header entries (name, lower name, value)."""


def _header_names(headers: httpx.Headers) -> list[bytes] | None:
    """The lower-cased names in ``headers``, read from httpx's entry list (name, lower
    name, value); None where that list is not as expected (the public API is used then).

    Why: each public lookup or assignment scans and re-encodes every header, and the first
    one also probes the whole set for its encoding; the upstream call reads one name and adds
    two or three headers per request, which through the public API cost about as much as
    the rest of the call's start. Equivalence with the public API is tested.
    """
    entries = getattr(headers, "_list", None)
    if type(entries) is not list or (entries and len(entries[0]) != 3):
        return None
    return list(map(_ENTRY_KEY, entries))  # in C; a handful of names: a list is enough


_NAME_BYTES: dict[str, tuple[bytes, ...]] = {}
"""Header name -> (as sent, lower-cased) in ASCII, or () for a name that is not ASCII.
The names come from the propagators (a fixed few); the cache is bounded all the same."""


def _name_bytes(name: str) -> tuple[bytes, ...]:
    found = _NAME_BYTES.get(name)
    if found is None:
        if len(_NAME_BYTES) >= 64:
            _NAME_BYTES.clear()
        found = _NAME_BYTES[name] = (
            (name.encode("ascii"), name.lower().encode("ascii")) if name.isascii() else ()
        )
    return found


def _add_headers(
    headers: httpx.Headers, added: dict[str, str], present: list[bytes] | None
) -> None:
    """Set ``added`` on ``headers`` as ``headers[name] = value`` would: a new ASCII name is
    appended to httpx's entry list, anything else goes through the public API."""
    entries: list[tuple[bytes, bytes, bytes]] = getattr(headers, "_list", [])
    for name, value in added.items():
        encoded = _name_bytes(name)
        if present is None or not encoded or encoded[1] in present or not value.isascii():
            headers[name] = value
        else:
            entries.append((encoded[0], encoded[1], value.encode("ascii")))
            present.append(encoded[1])


_textmap: tuple[object, W3CBaggagePropagator | None] = (None, None)
"""The global propagator last seen, and its baggage propagator when it is the default
pair (W3C trace context, then W3C baggage); None otherwise."""


def _w3c_default(textmap: object) -> W3CBaggagePropagator | None:
    if type(textmap) is not CompositePropagator:
        return None
    pair = getattr(textmap, "_propagators", None)
    if (
        isinstance(pair, list | tuple)
        and len(pair) == 2
        and type(pair[0]) is TraceContextTextMapPropagator
        and type(pair[1]) is W3CBaggagePropagator
    ):
        return pair[1]
    return None


_current_context: Final = context.get_current
"""The module's ``get_current``, for ``_inject``, whose parameter is named ``context`` as
``propagate.inject``'s is."""


def _inject(carrier: dict[str, str], context: Context | None) -> None:
    """``propagate.inject(carrier, context=context)``, written out for the default
    propagators: ``traceparent`` (and ``tracestate``) formatted as the W3C propagator does,
    baggage through its own propagator when there is any. Any other propagator set is
    called as it is.

    Why: the generic path walks the composite and reads the current context once per
    propagator; on a sampled-out request that was the larger part of starting the call.
    Equivalence with ``propagate.inject`` is tested.
    """
    global _textmap
    textmap = propagate.get_global_textmap()
    if _textmap[0] is not textmap:
        _textmap = (textmap, _w3c_default(textmap))
    baggage_propagator = _textmap[1]
    if baggage_propagator is None:
        propagate.inject(carrier, context=context)
        return
    if context is None:
        context = _current_context()
    span_context = trace.get_current_span(context).get_span_context()
    if span_context != trace.INVALID_SPAN_CONTEXT:
        carrier["traceparent"] = (
            f"00-{span_context.trace_id:032x}-{span_context.span_id:016x}"
            f"-{span_context.trace_flags:02x}"
        )
        if span_context.trace_state:
            carrier["tracestate"] = span_context.trace_state.to_header()
    if baggage.get_all(context):
        baggage_propagator.inject(carrier, context=context)


def _mint_request_id(span: trace.Span) -> str:
    """``<trace-id>-<span-id>`` of the inference span when it is recorded, so that the engine
    side (the vLLM plugin) can join its spans to this trace from the request id alone;
    a random id otherwise."""
    ctx = span.get_span_context()
    if span.is_recording() and ctx.is_valid:
        return f"{ctx.trace_id:032x}-{ctx.span_id:016x}"
    return f"{random.getrandbits(128):032x}"  # after fork() `random` is reseeded


def _start_call(telemetry: Telemetry | None, request: httpx.Request) -> _UpstreamCall | None:
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
        payload = _loads(request.content or b"{}")
    except (ValueError, httpx.RequestNotRead):
        payload = {}
    if not isinstance(payload, dict):
        payload = {}
    return _UpstreamCall(telemetry, state, payload, operation, request)


def _httpx_relay() -> tuple[Any, Any]:
    """httpx's ``AsyncResponseStream`` and ``map_httpcore_exceptions`` (None, None when a
    future httpx moves them)."""
    try:
        from httpx._transports import default
    except ImportError:  # pragma: no cover - depends on the installed httpx
        return None, None
    stream_type = getattr(default, "AsyncResponseStream", None)
    mapping = getattr(default, "map_httpcore_exceptions", None)
    if not isinstance(stream_type, type) or not callable(mapping):
        return None, None  # pragma: no cover - depends on the installed httpx
    return stream_type, mapping


_HTTPX_STREAM, _HTTPX_EXCEPTIONS = _httpx_relay()


def _source_of(
    stream: httpx.AsyncByteStream,
) -> tuple[AsyncIterable[bytes], Callable[[], AbstractContextManager[Any]]]:
    """What to iterate for ``stream``'s chunks, and the context to iterate it in.

    Why: httpx's default transport answers with an ``AsyncResponseStream`` that only relays
    httpcore's stream inside ``map_httpcore_exceptions()``, one async generator step per
    chunk. Iterating httpcore's stream inside that same context gives the same chunks and
    the same exceptions one step sooner, so wrapping the body adds no step per chunk (an
    async generator step costs about as much as the rest of the wrapper's work). Any
    other stream, or a future httpx that changes these, is iterated as it is.
    """
    if _HTTPX_STREAM is not None and type(stream) is _HTTPX_STREAM:
        inner: Any = getattr(stream, "_httpcore_stream", None)
        if hasattr(inner, "__aiter__"):
            return inner, _HTTPX_EXCEPTIONS
    return stream, nullcontext


class _AsyncStream(httpx.AsyncByteStream):
    def __init__(self, wrapped: httpx.AsyncByteStream, call: _UpstreamCall) -> None:
        self._wrapped = wrapped
        self._call = call

    async def __aiter__(self) -> AsyncIterator[bytes]:
        call = self._call
        source, exceptions_mapped = _source_of(self._wrapped)
        chunks = aiter(source)
        try:
            with exceptions_mapped():
                if not call._lazy:  # until the first event is read (recorded), or to the end
                    async for chunk in chunks:
                        call.on_chunk(chunk)
                        yield chunk
                        if call._lazy:
                            break
                if call._lazy:
                    # From here on a stream only keeps its tail (and, recorded, the time of
                    # its latest chunk): on_chunk's hot path inlined, no check per chunk.
                    tail, limit = call._buffer, _TAIL_MAX
                    if call._recording:
                        async for chunk in chunks:
                            tail += chunk
                            if len(tail) > limit:
                                call.trim_tail()  # in place: ``tail`` stays the buffer
                            call._last_data_ns = time_ns()
                            yield chunk
                    else:
                        async for chunk in chunks:
                            tail += chunk
                            if len(tail) > limit:
                                call.trim_tail()
                            yield chunk
        except GeneratorExit:
            self._call.closed()  # the consumer stopped iterating: see _UpstreamCall.closed
            raise
        except BaseException as exc:
            self._call.finish(exc)
            raise
        self._call.finish()

    async def aclose(self) -> None:
        try:
            await self._wrapped.aclose()
        finally:
            self._call.closed()


class _SyncStream(httpx.SyncByteStream):
    def __init__(self, wrapped: httpx.SyncByteStream, call: _UpstreamCall) -> None:
        self._wrapped = wrapped
        self._call = call

    def __iter__(self) -> Iterator[bytes]:
        try:
            for chunk in self._wrapped:
                self._call.on_chunk(chunk)
                yield chunk
        except GeneratorExit:
            self._call.closed()
            raise
        except BaseException as exc:
            self._call.finish(exc)
            raise
        self._call.finish()

    def close(self) -> None:
        try:
            self._wrapped.close()
        finally:
            self._call.closed()


class ClientDisconnected(Exception):
    """Recorded on the inference span when the client's departure closed the stream."""

    def __init__(self) -> None:
        super().__init__("the client disconnected; the generation was aborted")


class StageLensAsyncTransport(httpx.AsyncBaseTransport):
    """Wraps an async transport; see the module docstring."""

    def __init__(
        self, wrapped: httpx.AsyncBaseTransport, telemetry: Telemetry | None = None
    ) -> None:
        self.wrapped = wrapped
        self._telemetry = telemetry

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        call = _safe_start(self._telemetry, request)
        if call is None:
            return await self.wrapped.handle_async_request(request)
        token = (
            context.attach(trace.set_span_in_context(call.span))
            if call.span.is_recording()
            else None
        )
        try:
            response = await self.wrapped.handle_async_request(request)
        except BaseException as exc:
            call.finish(exc)
            raise
        finally:
            if token is not None:
                context.detach(token)
        call.on_response(response)
        stream = response.stream
        assert isinstance(stream, httpx.AsyncByteStream)
        response.stream = _AsyncStream(stream, call)  # the same response, its body observed
        return response

    async def aclose(self) -> None:
        await self.wrapped.aclose()


class StageLensTransport(httpx.BaseTransport):
    """Wraps a sync transport; see the module docstring."""

    def __init__(self, wrapped: httpx.BaseTransport, telemetry: Telemetry | None = None) -> None:
        self.wrapped = wrapped
        self._telemetry = telemetry

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        call = _safe_start(self._telemetry, request)
        if call is None:
            return self.wrapped.handle_request(request)
        token = (
            context.attach(trace.set_span_in_context(call.span))
            if call.span.is_recording()
            else None
        )
        try:
            response = self.wrapped.handle_request(request)
        except BaseException as exc:
            call.finish(exc)
            raise
        finally:
            if token is not None:
                context.detach(token)
        call.on_response(response)
        stream = response.stream
        assert isinstance(stream, httpx.SyncByteStream)
        response.stream = _SyncStream(stream, call)
        return response

    def close(self) -> None:
        self.wrapped.close()


def _safe_start(telemetry: Telemetry | None, request: httpx.Request) -> _UpstreamCall | None:
    try:
        return _start_call(telemetry, request)
    except Exception as exc:
        (telemetry or default_telemetry()).report_error("upstream", exc)
        return None


def instrument_httpx_client(
    client: httpx.AsyncClient | httpx.Client, *, telemetry: Telemetry | None = None
) -> None:
    """Instrument an existing client in place (its transport and mounts); idempotent.

    httpx offers no public way to swap a client's transport after construction, so this
    replaces ``client._transport`` the way opentelemetry-instrumentation-httpx does. To
    avoid that, build the client with ``transport=StageLensAsyncTransport(...)``.
    """
    if isinstance(client, httpx.AsyncClient):
        if not isinstance(client._transport, StageLensAsyncTransport):
            client._transport = StageLensAsyncTransport(client._transport, telemetry)
        return
    if not isinstance(client._transport, StageLensTransport):
        client._transport = StageLensTransport(client._transport, telemetry)
