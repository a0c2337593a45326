"""``stagelens._compat``, httpx / httpcore section: each private name it reads is there on
the installed versions (so its fast path is active), and each public fallback gives the
same result as the fast path."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from opentelemetry import propagate, trace
from opentelemetry.trace import NonRecordingSpan
from stagelens.instrumentation import _headers

from stagelens import _compat
from stagelens import semconv as sc
from stagelens.testing import capture_telemetry


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
def test_upstream_headers_carry_the_trace_and_keep_the_apps(
    existing: Any, recording: bool, with_baggage: bool
) -> None:
    """The upstream request gets the trace context of the call's span (recorded) or of the
    current one (sampled out), the baggage when there is any, and ``X-Request-Id`` naming
    the recorded span unless the app set its own; every header the app set stays."""
    from opentelemetry import baggage, context

    request = httpx.Request("POST", "http://up/v1/chat/completions", headers=existing)
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
            request_id = _headers.add_upstream_headers(request, target, recording=recording)
            want: dict[str, str] = {}
            propagate.inject(want, context=trace.set_span_in_context(target) if recording else None)
        finally:
            context.detach(token)
        if span is not None:
            span.end()
        root.end()
    assert request.headers.get(sc.HEADER_REQUEST_ID) == request_id
    if "X-Request-ID" in dict(existing):
        assert request_id == "from-the-app"  # the app's own id is kept, recorded or not
    elif recording:
        assert span is not None
        assert request_id == f"{span.get_span_context().trace_id:032x}-" + (
            f"{span.get_span_context().span_id:016x}"
        )
    else:
        assert request_id is None  # an unrecorded call names no request: no id is sent
    traceparent = request.headers["traceparent"]
    assert traceparent == want["traceparent"]
    assert traceparent.split("-")[1] == f"{root.get_span_context().trace_id:032x}"
    sender = (span or root).get_span_context().span_id if recording else None
    if sender is not None:
        assert traceparent.split("-")[2] == f"{sender:016x}"
    assert ("baggage" in request.headers) is (with_baggage or "baggage" in dict(existing))
    if with_baggage:
        assert "tenant=t1" in request.headers["baggage"]
    for name, value in httpx.Headers(existing).multi_items():
        if name not in ("traceparent", "baggage"):
            assert value in request.headers.get_list(name)


def test_a_built_requests_body_is_replaced_everywhere_httpx_reads_it() -> None:
    """What is sent, what ``request.content`` returns and ``Content-Length`` agree."""
    request = httpx.Request("POST", "http://up/v1/chat/completions", json={"a": 1})
    _compat.set_request_body(request, b'{"a":1,"b":2}')
    assert request.content == b'{"a":1,"b":2}'
    assert isinstance(request.stream, httpx.ByteStream)
    assert b"".join(request.stream) == b'{"a":1,"b":2}'
    assert request.headers["Content-Length"] == "13"
