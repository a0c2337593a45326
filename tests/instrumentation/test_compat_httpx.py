"""``stagelens._compat``, httpx / httpcore section: each private name it reads is there on
the installed versions (so its fast path is active), and each public fallback gives the
same result as the fast path."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry import propagate, trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
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
    else:  # an unrecorded call names no trace: a random key, for the engine's answer
        assert fast_id.startswith("0" * 32 + "-")
        assert len(fast_id) == 49
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


def test_a_built_requests_body_is_replaced_everywhere_httpx_reads_it() -> None:
    """What is sent, what ``request.content`` returns and ``Content-Length`` agree."""
    request = httpx.Request("POST", "http://up/v1/chat/completions", json={"a": 1})
    _compat.set_request_body(request, b'{"a":1,"b":2}')
    assert request.content == b'{"a":1,"b":2}'
    assert isinstance(request.stream, httpx.ByteStream)
    assert b"".join(request.stream) == b'{"a":1,"b":2}'
    assert request.headers["Content-Length"] == "13"


_HEADER_NAMES = st.sampled_from(
    [b"X-Request-Id", b"x-request-id", b"X-REQUEST-ID", b"content-type", b"Content-Type", b"x-a"]
)
_HEADER_VALUES = st.binary(max_size=12).filter(lambda v: b"\r" not in v and b"\n" not in v)


@given(
    headers=st.lists(st.tuples(_HEADER_NAMES, _HEADER_VALUES), max_size=6),
    wanted=st.sampled_from([_headers.REQUEST_ID_KEY, _headers.CONTENT_TYPE_KEY]),
)
def test_header_value_equals_the_public_get(
    headers: list[tuple[bytes, bytes]], wanted: bytes
) -> None:
    """The shortcut read of one header (httpx's entry list) and its plain twin
    (``Headers.get``) agree on any header list: absent, once, repeated (joined), with
    values that are not ASCII (decoded in the encoding httpx picks from every header)."""
    built = httpx.Headers(headers)
    assert _compat.header_entries(built) is not None  # the fast path is what is compared
    assert _headers.header_value(built, wanted) == built.get(wanted.decode("ascii"))


@given(
    trace_id=st.integers(min_value=0, max_value=2**128 - 1),
    span_id=st.integers(min_value=0, max_value=2**64 - 1),
    sampled=st.booleans(),
    state=st.lists(
        st.tuples(
            st.from_regex(r"[a-z][a-z0-9]{0,6}", fullmatch=True),
            st.from_regex(r"[a-z0-9]{1,6}", fullmatch=True),
        ),
        max_size=3,
        unique_by=lambda pair: pair[0],
    ),
    entries=st.dictionaries(
        st.from_regex(r"[a-z]{1,6}", fullmatch=True), st.text(max_size=6), max_size=3
    ),
)
def test_inject_equals_propagate_inject(
    trace_id: int,
    span_id: int,
    sampled: bool,
    state: list[tuple[str, str]],
    entries: dict[str, str],
) -> None:
    """The formatted ``traceparent``/``tracestate`` and baggage (the shortcut, for the
    default W3C propagators) and ``propagate.inject`` (its plain twin) write the same
    headers for any span context, valid or not, with any trace state and baggage."""
    from opentelemetry import baggage
    from opentelemetry.trace import TraceState

    span_context = SpanContext(
        trace_id,
        span_id,
        is_remote=False,
        trace_flags=TraceFlags(TraceFlags.SAMPLED if sampled else TraceFlags.DEFAULT),
        trace_state=TraceState(state),
    )
    ctx = trace.set_span_in_context(NonRecordingSpan(span_context))
    for key, value in entries.items():
        ctx = baggage.set_baggage(key, value, context=ctx)
    fast: dict[str, str] = {}
    public: dict[str, str] = {}
    _headers._inject(fast, ctx)
    propagate.inject(public, context=ctx)
    assert fast == public
