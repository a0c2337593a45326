"""A span started inside the wrapped transport, while the upstream call's trace waits for
the tail sampler's decision, is the call's child in the kept trace, as under always_on.

Why: the call's span of an undecided trace is data (``DeferredSpan``), opened as the stage
of its context around the wrapped transport rather than attached to the OpenTelemetry
context (``instrumentation.httpx._enter_call``); the deferred tracer must still parent
what is started there (a transport beneath ours, a hook) to the call.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
from fastapi import FastAPI, Request
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_ON
from prometheus_client import CollectorRegistry
from starlette.responses import StreamingResponse

import stagelens
from stagelens import Stage, stage
from stagelens.tail_sampling import TailSampler
from tests._scaffold import relayed, serve_one_stream


class _Answer(httpx.AsyncByteStream):
    async def __aiter__(self) -> AsyncIterator[bytes]:
        delta = {"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}
        yield f"data: {json.dumps({'id': 'c', 'model': 'm', 'choices': [delta]})}\n\n".encode()
        yield b"data: [DONE]\n\n"


def _tree(sampler: Any) -> tuple[list[tuple[str, str | None]], list[str]]:
    """One request through an instrumented app whose upstream transport starts a span:
    the exported (name, parent name) pairs, and the name of the span current inside the
    transport."""
    exporter = InMemorySpanExporter()
    telemetry = stagelens.configure(
        span_exporters=[exporter],
        registry=CollectorRegistry(),
        set_global=False,
        gpu=False,
        sampler=sampler,
    )
    current: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        current.append(getattr(trace.get_current_span(), "name", "?"))
        telemetry.tracer.start_span("inside the transport").end()
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=_Answer())

    client = httpx.AsyncClient(base_url="http://upstream", transport=httpx.MockTransport(answer))
    stagelens.instrument_httpx_client(client, telemetry=telemetry)
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> StreamingResponse:
        body = await request.json()
        with stage(Stage.ROUTER):
            pass
        upstream = await client.send(
            client.build_request("POST", "/v1/chat/completions", json=body), stream=True
        )

        return relayed(upstream)

    stagelens.instrument_app(app, telemetry=telemetry)
    asyncio.run(serve_one_stream(app))
    telemetry.force_flush()
    spans = exporter.get_finished_spans()
    telemetry.shutdown()
    names = {s.context.span_id: s.name for s in spans}
    tree = sorted((s.name, names.get(s.parent.span_id) if s.parent else None) for s in spans)
    return tree, current


def test_a_span_started_in_the_transport_is_the_calls_child_in_a_kept_trace() -> None:
    """The first request of a fresh gateway is kept (``exemplar``: nothing filled its
    bucket yet), decided at its end: its tree equals always_on's, the transport's span
    under the call's. Inside the transport, the current span is the call's under
    always_on and the span current when the call began while the decision waits (the
    documented difference)."""
    kept, current_kept = _tree(TailSampler(0.0))
    always, current_always = _tree(ALWAYS_ON)
    assert kept == always
    assert ("inside the transport", "chat m") in kept
    assert current_always == ["chat m"]
    assert len(current_kept) == 1
    assert current_kept[0].startswith("POST")  # the server span, named by its method so far
