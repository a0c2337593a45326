"""The upstream (httpx) instrumentation's SSE parsing and stream endings, against a local
OpenAI-compatible server on a real socket.

Why a server of its own: it writes JSON the way ``json.dumps`` does by default (``"usage":
{``), unlike vLLM's compact pydantic output, and it can end a stream in each way that matters
(normally, after the usage chunk, without a last event, by dying).
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from opentelemetry.trace import StatusCode

from stagelens import instrument_httpx_client
from stagelens import semconv as sc
from stagelens.testing import TelemetryCapture

pytestmark = pytest.mark.anyio

USAGE = {
    "prompt_tokens": 40,
    "completion_tokens": 6,
    "prompt_tokens_details": {"cached_tokens": 16},
}
METRICS = {"queue_time_ms": 1.0, "time_to_first_token_ms": 5.0, "generation_time_ms": 9.0}


def _spaced(
    *,
    x_chunks: int = 6,
    x_die_after: int | None = None,
    x_no_final: bool = False,
    x_sleep: float = 0.005,
    x_done_delay: float = 0.0,
) -> dict[str, Any]:
    """The scripted upstream's knobs (``tests._scaffold.scripted_upstream``) for a stream of
    ``x_chunks`` content chunks in ``json.dumps`` default spacing, ``x_sleep`` s apart,
    then (unless ``x_no_final``, and when ``stream_options.include_usage`` asks, as vLLM
    does) the usage chunk and, after ``x_done_delay`` s, ``[DONE]``; with ``x_die_after``
    it raises after that many chunks, so the server drops the connection."""
    script: list[list[Any]] = []
    for i in range(x_chunks):
        if x_die_after is not None and i == x_die_after:
            break
        last = i == x_chunks - 1 and not x_no_final
        chunk = {
            "id": "chatcmpl-spaced",
            "model": "tiny",
            "choices": [
                {
                    "index": 0,
                    "delta": {"content": f"w{i} "},
                    "finish_reason": "length" if last else None,
                }
            ],
        }
        script += [[0, f"data: {json.dumps(chunk)}\n\n"], [x_sleep, ""]]
    final = {"id": "chatcmpl-spaced", "choices": [], "usage": USAGE, "metrics": METRICS}
    return {
        "x_script": script,
        "x_die": x_die_after is not None,
        "x_no_usage": x_no_final,
        "x_usage_event": final,
        "x_spaced_usage": True,
        "x_done_delay": x_done_delay,
        "x_no_done": x_no_final,
    }


async def _stream(
    cap: TelemetryCapture,
    url: str,
    *,
    stop_when: bytes | None = None,
    sampled: bool = True,
    **knobs: Any,
) -> tuple[bytes, Any]:
    """POST a streamed chat request; read until ``stop_when`` is seen (then close the
    response without draining it) or to the end. Returns (bytes read, inference span or
    None when ``sampled`` is False)."""
    client = httpx.AsyncClient(base_url=url, timeout=10)
    instrument_httpx_client(client, telemetry=cap.telemetry)
    script = _spaced(**{k: v for k, v in knobs.items() if k.startswith("x_")})
    rest = {k: v for k, v in knobs.items() if not k.startswith("x_")}
    body = {"model": "tiny", "stream": True, "messages": [], **rest, **script}
    seen = b""
    async with client, client.stream("POST", "/v1/chat/completions", json=body) as r:
        try:
            async for chunk in r.aiter_raw():
                seen += chunk
                if stop_when is not None and stop_when in seen:
                    break
        except httpx.HTTPError:
            pass
    spans = [s for s in cap.spans() if s.name == "chat tiny"]
    assert len(spans) == (1 if sampled else 0)
    return seen, spans[0] if spans else None


class TestSpacedJson:
    """``json.dumps`` default spacing parses like vLLM's compact JSON."""

    async def test_usage_finish_reason_and_engine_phases_from_spaced_events(
        self, cap, scripted_url
    ) -> None:
        """Usage, finish reason and engine phases are read from ``"usage": {`` events."""
        seen, span = await _stream(cap, scripted_url)
        assert b'"content": "' in seen  # the upstream really spaced its JSON
        assert b'"usage"' not in seen  # stagelens asked for the usage event, and removed it
        attrs = span.attributes
        assert attrs[sc.GEN_AI_USAGE_INPUT_TOKENS] == 40
        assert attrs[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 6
        assert attrs[sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] == 16
        assert attrs[sc.GEN_AI_RESPONSE_FINISH_REASONS] == ("length",)
        assert sc.ERROR_TYPE not in attrs
        assert span.status.status_code is StatusCode.UNSET
        phases = {
            s.name for s in cap.spans() if s.parent and s.parent.span_id == span.context.span_id
        }
        assert phases == {"queue", "prefill", "decode"}
        assert cap.value(sc.ENGINE_PHASE_DURATION + "_count", phase="decode", model="tiny") == 1


@pytest.mark.parametrize("sampled", [True, False], ids=["traced", "sampled-out"])
async def test_a_long_stream_read_through_the_client(cap, scripted_url, sampled: bool) -> None:
    """Through a real client and socket, a stream several times the kept tail still yields
    its usage and engine timings at the end, traced or sampled out."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
    from stagelens.instrumentation._events import _TAIL_MAX

    from stagelens.telemetry import Telemetry

    if not sampled:
        exporter = InMemorySpanExporter()
        provider = TracerProvider(sampler=ALWAYS_OFF)
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        telemetry = Telemetry(tracer_provider=provider, registry=cap.registry)
        cap = TelemetryCapture(telemetry, exporter)
    seen, span = await _stream(cap, scripted_url, sampled=sampled, x_chunks=1500, x_sleep=0)
    assert len(seen) > 3 * _TAIL_MAX
    assert seen.endswith(b"data: [DONE]\n\n")
    decode = cap.value(sc.ENGINE_PHASE_DURATION + "_sum", phase="decode", model="tiny")
    assert decode == METRICS["generation_time_ms"] / 1000
    inference = cap.value(sc.STAGE_DURATION + "_count", stage="inference", model="tiny")
    assert inference == 1.0
    if sampled:
        assert span.attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 6
        assert span.attributes[sc.GEN_AI_RESPONSE_FINISH_REASONS] == ("length",)
        assert span.status.status_code is StatusCode.UNSET


class TestStreamEndings:
    """How a stream ended decides whether the inference span is an error."""

    async def test_closed_at_done_without_draining_is_a_success(self, cap, scripted_url) -> None:
        """A relay that stops reading at ``data: [DONE]`` and closes leaves no error."""
        seen, span = await _stream(cap, scripted_url, stop_when=b"data: [DONE]")
        assert seen.endswith(b"data: [DONE]\n\n")
        assert span.status.status_code is StatusCode.UNSET
        assert sc.ERROR_TYPE not in span.attributes
        assert sc.ATTR_STREAM_CLOSED_EARLY not in span.attributes

    async def test_closed_after_the_usage_chunk_is_a_success(self, cap, scripted_url) -> None:
        """Closing after the usage chunk, before a late ``[DONE]``, is a normal end."""
        seen, span = await _stream(
            cap,
            scripted_url,
            stop_when=b'"usage": {',
            x_done_delay=0.5,
            stream_options={"include_usage": True},  # the app asked: it reads the event
        )
        assert b"[DONE]" not in seen
        assert span.status.status_code is StatusCode.UNSET
        assert sc.ERROR_TYPE not in span.attributes
        assert span.attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 6

    async def test_cut_by_the_caller_is_recorded_not_an_error(self, cap, scripted_url) -> None:
        """A deliberate cut mid-content (stop sequence, safety) is ``closed_early``, no error."""
        seen, span = await _stream(cap, scripted_url, stop_when=b"w2 ", x_chunks=40)
        assert b"w39" not in seen
        assert span.attributes[sc.ATTR_STREAM_CLOSED_EARLY] is True
        assert span.status.status_code is StatusCode.UNSET
        assert sc.ERROR_TYPE not in span.attributes

    async def test_backend_dying_mid_stream_is_an_error(self, cap, scripted_url) -> None:
        """The server dropping the connection mid-stream ends the span in error."""
        _, span = await _stream(cap, scripted_url, x_chunks=20, x_die_after=3)
        assert span.status.status_code is StatusCode.ERROR
        assert span.attributes[sc.ERROR_TYPE] == "RemoteProtocolError"

    async def test_stream_ending_without_a_last_event_is_an_error(self, cap, scripted_url) -> None:
        """A body that ends with neither finish reason, usage nor [DONE] is incomplete."""
        _, span = await _stream(cap, scripted_url, x_chunks=3, x_no_final=True)
        assert span.status.status_code is StatusCode.ERROR
        assert span.attributes[sc.ERROR_TYPE] == "incomplete_stream"


async def test_a_backend_dying_surfaces_as_httpxs_exception(cap, scripted_url) -> None:
    """Behind httpx's default transport, a backend dying mid-body surfaces as httpx's
    exception (never httpcore's) to the caller and on the span, after the same chunks."""
    from stagelens.instrumentation.httpx import _AsyncStream

    client = httpx.AsyncClient(base_url=scripted_url, timeout=10)
    instrument_httpx_client(client, telemetry=cap.telemetry)
    knobs = _spaced(x_chunks=20, x_die_after=3)
    body = {"model": "tiny", "stream": True, "messages": [], **knobs}
    async with client, client.stream("POST", "/v1/chat/completions", json=body) as r:
        ours = r.stream._stream  # httpx binds the transport's stream to the response
        assert isinstance(ours, _AsyncStream)
        seen: list[bytes] = []
        with pytest.raises(httpx.RemoteProtocolError):
            await _read_into(seen, r)
    assert b"".join(seen).count(b"data: ") == 3
    (span,) = [s for s in cap.spans() if s.name == "chat tiny"]
    assert span.status.status_code is StatusCode.ERROR
    (event,) = span.events
    assert event.attributes is not None
    assert "httpx" in str(event.attributes["exception.stacktrace"]).split("\n")[-2]


async def _read_into(seen: list[bytes], response: httpx.Response) -> None:
    async for chunk in response.aiter_raw():
        seen.append(chunk)


def _vllm_like_stream(
    *, spaced: bool, content: int = 5, running_usage: bool = False, choices: int = 1
) -> bytes:
    """A whole SSE body: ``content`` content events (finish reason null), a final content
    event with a finish reason, the usage event, ``[DONE]``; compact like vLLM or spaced.
    ``running_usage``: every event carries the running usage (vLLM's continuous usage
    stats). ``choices`` > 1: choice 0 finishes first, the others stream on (n > 1)."""
    dumps = json.dumps if spaced else (lambda o: json.dumps(o, separators=(",", ":")))

    def event(choice: int, text: str, reason: str | None, done: int) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": "c1",
            "model": "tiny",
            "choices": [{"index": choice, "delta": {"content": text}, "finish_reason": reason}],
        }
        if running_usage:
            out["usage"] = {"prompt_tokens": 40, "completion_tokens": done}
        return out

    events = [event(0, f"t{i}", None, i + 1) for i in range(content)]
    events.append(event(0, "!", "stop", content + 1))
    events += [event(c, f"c{c}", None, content + 1) for c in range(1, choices)]
    events += [event(c, ".", "length", content + 1) for c in range(1, choices)]
    events.append({"id": "c1", "model": "tiny", "choices": [], "usage": USAGE, "metrics": METRICS})
    return b"".join(f"data: {dumps(e)}\n\n".encode() for e in events) + b"data: [DONE]\n\n"


def _parse(body: bytes, size: int, payload: dict[str, Any], *, sampled: bool = True) -> Any:
    """Feed ``body`` in chunks of ``size`` to an upstream call, end the stream, return it."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON
    from prometheus_client import CollectorRegistry
    from stagelens.instrumentation._events import _TAIL_MAX
    from stagelens.instrumentation._upstream import _UpstreamCall

    from stagelens.telemetry import Telemetry

    provider = TracerProvider(sampler=ALWAYS_ON if sampled else ALWAYS_OFF)
    telemetry = Telemetry(tracer_provider=provider, registry=CollectorRegistry())
    request = httpx.Request("POST", "http://up/v1/chat/completions", json=payload)
    call = _UpstreamCall(telemetry, None, {"stream": True, **payload}, "chat", request)
    assert call.span.is_recording() == sampled
    for start in range(0, len(body), size):
        call.on_chunk(body[start : start + size])
    assert len(call._partial) <= _TAIL_MAX + size  # memory stays bounded, however long
    call.settle()  # the stream ended: its final events are read
    return call


@pytest.mark.parametrize("sampled", [True, False], ids=["traced", "sampled-out"])
@pytest.mark.parametrize("spaced", [False, True], ids=["compact", "spaced"])
@pytest.mark.parametrize("size", [1, 7, 64, 10_000], ids=lambda n: f"chunks-of-{n}")
@pytest.mark.parametrize("content", [5, 2000], ids=["short", "long"])
def test_parse_is_the_same_however_the_stream_is_chunked(
    spaced: bool, size: int, content: int, sampled: bool
) -> None:
    """Events split across chunks, several events per chunk, or the whole body at once,
    in a short stream or one far longer than the kept tail: the same usage, finish
    reasons, engine timings and end of stream are read."""
    from stagelens.instrumentation._events import _TAIL_MAX

    body = _vllm_like_stream(spaced=spaced, content=content)
    assert (len(body) > 2 * _TAIL_MAX) == (content == 2000)
    call = _parse(body, size, {"model": "tiny"}, sampled=sampled)
    assert call._usage is not None
    assert (call._usage.input_tokens, call._usage.output_tokens) == (40, 6)
    assert call._usage.cached_input_tokens == 16
    assert call._engine == METRICS
    if sampled:  # what only the span shows is only read for a recorded span
        assert call._ended
        assert call._finish_reasons == ["stop"]
        assert call._response_id == "c1"
    else:
        assert not call._finish_reasons
        assert call._response_id is None
    assert len(call._partial) == 0


@pytest.mark.parametrize("spaced", [False, True], ids=["compact", "spaced"])
def test_running_usage_totals_end_with_the_final_one(spaced: bool) -> None:
    """With continuous usage stats every event carries the running total: the usage
    chunk's total is billed, and the stream cut before it bills the last running one."""
    body = _vllm_like_stream(spaced=spaced, content=300, running_usage=True)
    call = _parse(body, 64, {"model": "tiny"})
    assert call._usage is not None
    assert (call._usage.input_tokens, call._usage.output_tokens) == (40, 6)
    assert call._finish_reasons == ["stop"]
    cut = body[: body.index(b"t250")]
    cut = cut[: cut.rindex(b"\n\n") + 2]  # whole events up to t249
    call = _parse(cut, 64, {"model": "tiny"})
    assert not call._ended
    assert call._usage is not None
    assert call._usage.output_tokens == 250


def test_several_choices_keep_every_finish_reason() -> None:
    """n > 1: choice 0 finishes long before the others; its finish reason is kept."""
    body = _vllm_like_stream(spaced=False, content=3000, choices=3)
    call = _parse(body, 64, {"model": "tiny", "n": 3})
    assert call._ended
    assert call._finish_reasons == ["stop", "length", "length"]
    assert call._usage is not None
    assert call._usage.output_tokens == 6


@pytest.mark.parametrize(
    "existing",
    [
        {},
        {"Traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"},
        {"X-Request-ID": "from-the-app", "Accept": "text/event-stream"},
        [("baggage", "a=b"), ("Baggage", "c=d"), ("x-custom", "1")],
    ],
    ids=["none", "traceparent-present", "request-id-present", "repeated-name"],
)
def test_headers_added_as_the_public_api_would(existing: Any) -> None:
    """The fast header path (httpx's entry list) leaves exactly the headers that
    ``headers[name] = value`` would, present names replaced, others appended."""
    from stagelens.instrumentation._headers import _add_headers, _header_names

    added = {
        "traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01",
        sc.HEADER_REQUEST_ID: "f" * 32,
        "baggage": "k=v",
        "x-note": "naïve",  # not ASCII: through the public API
    }
    fast = httpx.Request("POST", "http://upstream/v1/chat/completions", headers=existing)
    public = httpx.Request("POST", "http://upstream/v1/chat/completions", headers=existing)
    present = _header_names(fast.headers)
    assert present is not None  # the fast path is taken, not the fallback
    _add_headers(fast.headers, added, present)
    for name, value in added.items():
        public.headers[name] = value
    assert fast.headers.raw == public.headers.raw
    assert fast.headers.multi_items() == public.headers.multi_items()


def _content_only(n: int = 40) -> bytes:
    """``n`` content events and no last event (no finish reason, no usage)."""
    event = {
        "id": "c1",
        "choices": [{"index": 0, "delta": {"content": "t"}, "finish_reason": None}],
    }
    return b"".join(f"data: {json.dumps(event)}\n\n".encode() for _ in range(n))


@pytest.mark.parametrize(
    ("closing", "ended"),
    [
        (b"data: [DONE]\n\n", True),
        (b"data:[DONE]\n\n", True),
        (b"data: [DONE]\r\n\r\n", True),
        (b"data: [DONE]", True),  # the connection closed right after it
        (b"data: [DONE]x\n\n", False),
        (b'data: {"note": "[DONE]"}\n\n', False),
        (b"", False),
    ],
    ids=["spaced", "compact", "crlf", "unterminated", "trailing-garbage", "inside-json", "none"],
)
def test_done_ends_a_stream_only_as_its_own_event(closing: bytes, ended: bool) -> None:
    """A stream with no finish reason and no usage ends with ``[DONE]`` only when that is
    the whole payload of its last data line, however the line is written."""
    for size in (1, 64, 100_000):
        call = _parse(_content_only() + closing, size, {"model": "tiny"})  # a span's status
        assert call._ended is ended, size
        assert call._usage is None


def test_loads_is_json_loads() -> None:
    """The one-call JSON path gives json.loads' result, and its errors, for every input."""
    from stagelens.instrumentation._openai import loads as _loads

    good = [
        b'{"model": "tiny", "stream": true}',
        b'  {"a": 1}\n',  # whitespace around: json.loads' own path
        '{"text": "café ☕"}'.encode(),
        '{"x": [1, 2.5, null]}'.encode("utf-16"),  # UTF-16 with BOM, as json.loads detects
        b'{"v": NaN}',
        b"[]",
    ]
    for raw in good:
        got, want = _loads(raw), json.loads(raw)
        assert repr(got) == repr(want), raw
    for bad in (b'{"a": 1} trailing', b'{"a": ', b"\xff\xfe\xfa", b""):
        errors = []
        for parse in (json.loads, _loads):
            try:
                parse(bad)
            except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError alike
                errors.append(type(exc))
        assert len(errors) == 2, bad
        assert errors[0] is errors[1], bad


@pytest.mark.parametrize("sampled", [True, False], ids=["sampled", "not-sampled"])
@pytest.mark.parametrize("trace_state", [True, False], ids=["tracestate", "no-tracestate"])
@pytest.mark.parametrize("with_baggage", [True, False], ids=["baggage", "no-baggage"])
def test_inject_is_propagate_inject(sampled: bool, trace_state: bool, with_baggage: bool) -> None:
    """The written-out default propagation sets exactly what ``propagate.inject`` sets,
    from an explicit context or the current one, and nothing without a span."""
    from opentelemetry import baggage, context, propagate, trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState
    from stagelens.instrumentation._headers import _inject, _w3c_default

    assert _w3c_default(propagate.get_global_textmap()) is not None  # the fast path runs
    span = NonRecordingSpan(
        SpanContext(
            0x0AF7651916CD43DD8448EB211C80319C,
            0x00F067AA0BA902B7,
            False,
            TraceFlags(TraceFlags.SAMPLED if sampled else TraceFlags.DEFAULT),
            TraceState([("vendor", "v1"), ("other", "x")]) if trace_state else TraceState(),
        )
    )
    ctx = trace.set_span_in_context(span)
    if with_baggage:
        ctx = baggage.set_baggage("user id", "a b,c", ctx)
    empty = context.Context()
    for given in (ctx, None, empty):
        token = context.attach(ctx)
        try:
            fast: dict[str, str] = {}
            slow: dict[str, str] = {}
            _inject(fast, given)
            propagate.inject(slow, context=given)
        finally:
            context.detach(token)
        assert fast == slow
        # the span's context (given, or current) is propagated; an empty context has none
        assert bool(fast) is (given is not empty)


def test_inject_calls_other_propagators_as_they_are() -> None:
    """A propagator set other than the default W3C pair is called, not imitated."""
    from opentelemetry import propagate
    from opentelemetry.propagators.composite import CompositePropagator
    from opentelemetry.propagators.textmap import TextMapPropagator
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    from stagelens.instrumentation._headers import _inject

    class Custom(TextMapPropagator):
        def extract(self, carrier: Any, context: Any = None, getter: Any = None) -> Any:
            raise NotImplementedError

        def inject(self, carrier: Any, context: Any = None, setter: Any = None) -> None:
            carrier["x-custom"] = "1"

        @property
        def fields(self) -> set[str]:
            return {"x-custom"}

    default = propagate.get_global_textmap()
    propagate.set_global_textmap(CompositePropagator([TraceContextTextMapPropagator(), Custom()]))
    try:
        carrier: dict[str, str] = {}
        _inject(carrier, None)
        assert carrier == {"x-custom": "1"}  # no current span: no traceparent
    finally:
        propagate.set_global_textmap(default)
    carrier = {}
    _inject(carrier, None)
    assert carrier == {}
