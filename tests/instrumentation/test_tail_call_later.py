"""The upstream call of a trace whose keep decision waits records its span as data, and a
kept trace's call span is still the one always_on records.

Why: under the tail sampler most traces are dropped, so the call's span is a
``DeferredSpan`` whose response attributes are read only when the trace is kept. What the
upstream is told, and every attribute of the span, must not depend on that: these tests
compare with always_on span by span and read the ``traceparent`` the upstream received.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
from fastapi import FastAPI, Request
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_ON
from prometheus_client import CollectorRegistry
from starlette.responses import StreamingResponse

import stagelens
from stagelens import semconv as sc
from stagelens.spans.pending import DeferredSpan
from stagelens.tail_sampling import TailSampler
from tests._scaffold import relayed, serve_one_stream


class _Answer(httpx.AsyncByteStream):
    async def __aiter__(self) -> AsyncIterator[bytes]:
        delta = {"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}
        yield f"data: {json.dumps({'id': 'c', 'model': 'm', 'choices': [delta]})}\n\n".encode()
        usage = {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
        yield f"data: {json.dumps({'id': 'c', 'choices': [], 'usage': usage})}\n\n".encode()
        yield b"data: [DONE]\n\n"


def _one(
    sampler: Any, *, status: int = 200, request_id: str | None = None
) -> tuple[tuple[ReadableSpan, ...], httpx.Headers, list[Any]]:
    """One request through an instrumented app (its upstream answering ``status``, the
    app sending ``request_id`` as X-Request-Id when given): the exported spans, the
    headers the upstream received, and the call's span as the transport saw it."""
    exporter = InMemorySpanExporter()
    telemetry = stagelens.configure(
        span_exporters=[exporter],
        registry=CollectorRegistry(),
        set_global=False,
        gpu=False,
        sampler=sampler,
    )
    received: list[httpx.Headers] = []

    def answer(request: httpx.Request) -> httpx.Response:
        received.append(request.headers)
        if status >= 400:
            error = json.dumps({"error": {"message": "no", "code": status}}).encode()
            headers = {"content-type": "application/json"}
            return httpx.Response(status, headers=headers, stream=httpx.ByteStream(error))
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=_Answer())

    client = httpx.AsyncClient(base_url="http://upstream", transport=httpx.MockTransport(answer))
    stagelens.instrument_httpx_client(client, telemetry=telemetry)
    seen: list[Any] = []
    transport = client._transport
    handle = transport.handle_async_request

    async def watching(request: httpx.Request) -> httpx.Response:
        response = await handle(request)
        stream = response.stream
        seen.append(getattr(getattr(stream, "_call", None), "span", None))
        return response

    transport.handle_async_request = watching  # type: ignore[method-assign]
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> StreamingResponse:
        body = await request.json()
        headers = {sc.HEADER_REQUEST_ID: request_id} if request_id else None
        upstream = await client.send(
            client.build_request("POST", "/v1/chat/completions", json=body, headers=headers),
            stream=True,
        )

        return relayed(upstream)

    stagelens.instrument_app(app, telemetry=telemetry)
    asyncio.run(serve_one_stream(app))
    telemetry.force_flush()
    spans = exporter.get_finished_spans()
    telemetry.shutdown()
    return spans, received[0], seen


def _call(spans: tuple[ReadableSpan, ...]) -> ReadableSpan:
    (call,) = [s for s in spans if s.name == "chat m"]
    return call


def _shape(spans: tuple[ReadableSpan, ...], minted: str | None = None) -> list[tuple[Any, ...]]:
    """Each span as always_on and a kept trace must both give it: name, kind, parent's
    name, attributes, status, and whether it lies within its parent. ``minted``: the
    request id always_on's call span names itself by (``stagelens.request_id``), left out:
    a call of an undecided trace sends none (docs/tail-sampling.md)."""
    by_id = {s.context.span_id: s for s in spans}
    shape = []
    for s in spans:
        parent = by_id.get(s.parent.span_id) if s.parent else None
        within = parent is None or (
            parent.start_time <= s.start_time <= s.end_time <= parent.end_time  # type: ignore[operator]
        )
        attributes = {k: v for k, v in (s.attributes or {}).items() if "time" not in k}
        attributes.pop(sc.ATTR_TTFT, None)
        if minted is not None and attributes.get(sc.ATTR_REQUEST_ID) == minted:
            del attributes[sc.ATTR_REQUEST_ID]
        shape.append(
            (
                s.name,
                s.kind,
                parent.name if parent else None,
                sorted(attributes.items()),
                s.status.status_code,
                within,
            )
        )
    return sorted(shape, key=repr)


def test_a_kept_traces_call_span_is_always_ons() -> None:
    """The first request of a fresh gateway is kept at its end (``exemplar``): its call
    span, built from its data only then, has always_on's name, kind, parent, attributes
    and place in time. While the call ran its span was data (a DeferredSpan)."""
    kept, _, seen = _one(TailSampler(0.0))
    always, sent, _ = _one(ALWAYS_ON)
    assert [type(span) for span in seen] == [DeferredSpan]
    assert _shape(kept) == _shape(always, minted=sent[sc.HEADER_REQUEST_ID])
    call = _call(kept)
    assert call.attributes is not None
    assert call.attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 1


def test_the_traceparent_names_the_call_span_and_says_not_sampled() -> None:
    """The upstream is told the call's span (the id drawn at the call's start is the
    kept span's id) under the trace's id, not sampled: the decision was still open."""
    kept, headers, _ = _one(TailSampler(0.0))
    call = _call(kept)
    version, trace_id, span_id, flags = headers["traceparent"].split("-")
    assert (version, flags) == ("00", "00")
    assert int(trace_id, 16) == call.context.trace_id
    assert int(span_id, 16) == call.context.span_id
    # No id names a trace that may be dropped: the id is a key for the engine's answer.
    assert headers[sc.HEADER_REQUEST_ID].startswith("0" * 32 + "-")


def test_an_apps_request_id_and_an_error_status_reach_the_kept_call_span() -> None:
    """What is set on the call's span while it runs (the app's X-Request-Id, an error
    status from the upstream) makes the span then, and the kept trace shows it, as
    always_on does."""
    kept, headers, _ = _one(TailSampler(0.0), status=503, request_id="req-7")
    always, _, _ = _one(ALWAYS_ON, status=503, request_id="req-7")
    assert headers[sc.HEADER_REQUEST_ID] == "req-7"
    assert _shape(kept) == _shape(always)
    call = _call(kept)
    assert call.attributes is not None
    assert call.attributes[sc.ATTR_REQUEST_ID] == "req-7"
    assert call.attributes[sc.ERROR_TYPE] == "503"
