"""``stagelens._compat``, httpx / httpcore section: each private name it reads is there on
the installed versions (so its fast path is active), and each public fallback gives the
same result as the fast path."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from opentelemetry import propagate, trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
from stagelens.instrumentation import _headers

from stagelens import _compat, instrument_httpx_client
from stagelens import semconv as sc
from stagelens.testing import TelemetryCapture, capture_telemetry


def test_client_transports_and_mounts_are_readable() -> None:
    """Both client kinds keep their transport and a mounts dict where ``_compat`` reads
    them, and writing them back changes what the client routes to."""
    for client in (
        httpx.Client(mounts={"http://example": httpx.HTTPTransport()}),
        httpx.AsyncClient(mounts={"http://example": httpx.AsyncHTTPTransport()}),
    ):
        transport, mounts = _compat.client_transports(client)
        assert transport is not None
        assert mounts is not None
        assert len(mounts) == 1
        replacement = httpx.MockTransport(lambda request: httpx.Response(204))
        _compat.set_client_transports(client, replacement, {k: replacement for k in mounts})
        assert client._transport_for_url(httpx.URL("http://example/x")) is replacement
        assert client._transport_for_url(httpx.URL("http://other/x")) is replacement


@pytest.mark.parametrize(
    "existing",
    [
        {},
        {"X-Request-ID": "from-the-app"},
        [("baggage", "a=b"), ("Baggage", "c=d")],
        {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01", "x-other": "1"},
    ],
    ids=["none", "request-id-present", "repeated-name", "traceparent-present"],
)
@pytest.mark.parametrize("recording", [True, False])
@pytest.mark.parametrize("with_baggage", [False, True])
def test_header_entries_fast_path_and_fallback_agree(
    existing: Any, recording: bool, with_baggage: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """httpx's entry list is readable (the fast path runs), and the public API alone
    (as when it is not) leaves the same headers and the same request id, for a recorded
    span and a sampled-out one (the current span's context), with baggage or without."""
    import random

    from opentelemetry import baggage, context

    fast = httpx.Request("POST", "http://up/v1/chat/completions", headers=existing)
    public = httpx.Request("POST", "http://up/v1/chat/completions", headers=existing)
    assert _compat.header_entries(fast.headers) is not None
    with capture_telemetry() as cap:
        root = cap.telemetry.tracer.start_span("root")
        span = (
            cap.telemetry.tracer.start_span("chat tiny", context=trace.set_span_in_context(root))
            if recording
            else None
        )
        current = trace.set_span_in_context(
            root if recording else NonRecordingSpan(root.get_span_context())
        )
        if with_baggage:
            current = baggage.set_baggage("tenant", "t1", context=current)
        token = context.attach(current)
        try:
            target = span if span is not None else NonRecordingSpan(root.get_span_context())
            random.seed(7)
            fast_id = _headers.add_upstream_headers(fast, target, recording=recording)
            with monkeypatch.context() as patched:
                patched.setattr(_compat, "header_entries", lambda headers: None)
                random.seed(7)
                public_id = _headers.add_upstream_headers(public, target, recording=recording)
        finally:
            context.detach(token)
        if span is not None:
            span.end()
        root.end()
    assert fast_id == public_id
    assert fast.headers.raw == public.headers.raw
    assert fast.headers.get(sc.HEADER_REQUEST_ID) == fast_id
    if "X-Request-ID" in dict(existing):
        assert fast_id == "from-the-app"  # the app's own id is kept, recorded or not
    elif recording:
        assert fast_id == f"{span.get_span_context().trace_id:032x}-" + (
            f"{span.get_span_context().span_id:016x}"
        )
    else:
        assert fast_id is None  # an unrecorded call names no request: no id is sent
    assert ("baggage" in fast.headers) is (with_baggage or "baggage" in dict(existing))
    assert fast.headers["traceparent"].split("-")[1] == f"{root.get_span_context().trace_id:032x}"


def test_composite_parts_are_readable() -> None:
    """The default propagator's pair is read (the written-out W3C injection runs)."""
    pair = _compat.composite_parts(propagate.get_global_textmap())
    assert pair is not None
    assert len(pair) == 2
    assert _headers._w3c_default(propagate.get_global_textmap()) is pair[1]
    carrier: dict[str, str] = {}
    span = NonRecordingSpan(SpanContext(3, 4, False, TraceFlags(TraceFlags.SAMPLED)))
    _headers._inject(carrier, trace.set_span_in_context(span))
    fallback: dict[str, str] = {}
    propagate.inject(fallback, context=trace.set_span_in_context(span))
    assert carrier == fallback


def _dying(x_chunks: int, x_die_after: int | None = None) -> dict[str, Any]:
    """The scripted upstream's knobs (``tests._scaffold.scripted_upstream``) for a stream
    of ``x_chunks`` content events 2 ms apart and ``[DONE]``, no usage event; with
    ``x_die_after`` it raises after that many, so the server drops the connection
    mid-body."""
    sent = x_chunks if x_die_after is None else min(x_chunks, x_die_after)
    event = 'data: {"choices":[{"index":0,"delta":{"content":"w"}}]}\n\n'
    return {
        "x_script": [[0, event], [0.002, ""]] * sent,
        "x_die": x_die_after is not None,
        "x_no_usage": True,
    }


async def _read(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> tuple[bytes, Any]:
    chunks: list[bytes] = []
    error: Any = None
    async with client.stream("POST", url, json=body) as response:
        try:
            async for chunk in response.aiter_raw():
                chunks.append(chunk)
        except httpx.HTTPError as exc:
            error = type(exc)
    return b"".join(chunks), error


@pytest.mark.anyio
class TestHttpcoreSource:
    """The default transport's body read from httpcore, or as it is."""

    @pytest.mark.parametrize("knobs", [{}, {"x_die_after": 2}], ids=["whole", "backend-dies"])
    async def test_httpcore_source_and_fallback_give_the_same_body(
        self, scripted_url: str, knobs: dict[str, Any]
    ) -> None:
        """Read from httpcore's stream (active on this httpx) or from httpx's own stream
        (the fallback), the app gets the same bytes and the same httpx exception."""
        body = {"model": "tiny", "stream": True, "messages": [], **_dying(6, **knobs)}
        results = []
        for fast in (True, False):
            with capture_telemetry() as cap:
                results.append(await self._one(cap, scripted_url, body, fast))
        assert results[0][0] == results[1][0]
        assert results[0][1] is results[1][1]
        assert (results[0][1] is None) == (not knobs)

    async def _one(
        self, cap: TelemetryCapture, url: str, body: dict[str, Any], fast: bool
    ) -> tuple[bytes, Any]:
        client = httpx.AsyncClient(base_url=url, timeout=10)
        instrument_httpx_client(client, telemetry=cap.telemetry)
        original = _compat.httpcore_stream
        seen: list[Any] = []

        def spy(stream: Any) -> Any:
            found = original(stream) if fast else None
            seen.append(found)
            return found

        with pytest.MonkeyPatch.context() as patched:
            patched.setattr(_compat, "httpcore_stream", spy)
            async with client:
                result = await _read(client, "/v1/chat/completions", body)
        assert len(seen) == 1
        assert (seen[0] is not None) is fast  # the fast path is active on this httpx
        return result


def test_the_default_transports_stream_type_is_found() -> None:
    """httpx's default-transport body type and exception mapping are where ``_compat``
    looks (the httpcore fast path is active), and other streams have no httpcore stream."""
    stream_type, mapping = _compat.httpx_default_stream()
    assert stream_type is not None
    assert stream_type.__name__ == "AsyncResponseStream"
    assert mapping.__name__ == "map_httpcore_exceptions"

    class Other(httpx.AsyncByteStream):
        pass

    assert _compat.httpcore_stream(Other()) is None


def test_a_built_requests_body_is_replaced_everywhere_httpx_reads_it() -> None:
    """What is sent, what ``request.content`` returns and ``Content-Length`` agree."""
    request = httpx.Request("POST", "http://up/v1/chat/completions", json={"a": 1})
    _compat.set_request_body(request, b'{"a":1,"b":2}')
    assert request.content == b'{"a":1,"b":2}'
    assert isinstance(request.stream, httpx.ByteStream)
    assert b"".join(request.stream) == b'{"a":1,"b":2}'
    assert request.headers["Content-Length"] == "13"
