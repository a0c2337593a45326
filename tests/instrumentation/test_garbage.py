"""A finished request leaves no cycle of stagelens' objects for the garbage collector.

Why: a cycle is freed only when the collector runs, and everything it holds waits with it:
the request's state, its upstream call with the payload and the answer's readings and,
under the tail sampler, a dropped trace's records. The collector's walks over them cost
every request more than freeing them on the spot (``benchmarks/overhead_instructions.py``
counts them). httpx's response and its stream hold each other, so what they hold of ours
must be let go when the call finishes.
"""

from __future__ import annotations

import asyncio
import gc
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON
from prometheus_client import CollectorRegistry
from starlette.responses import StreamingResponse

import stagelens
from stagelens import Stage, stage
from stagelens.tail_sampling import TailSampler
from tests._scaffold import relayed, serve_one_stream

_USAGE = {"prompt_tokens": 12, "completion_tokens": 4, "total_tokens": 16}
_METRICS = {"time_to_first_token_ms": 5.0, "generation_time_ms": 20.0, "queue_time_ms": 0.1}


def _events() -> list[bytes]:
    out = []
    for i in range(4):
        delta = {"index": 0, "delta": {"content": f"t{i} "}, "finish_reason": None}
        out.append(f"data: {json.dumps({'id': 'c', 'model': 'm', 'choices': [delta]})}\n\n")
    final = {"id": "c", "model": "m", "choices": [], "usage": _USAGE, "metrics": _METRICS}
    out += [f"data: {json.dumps(final)}\n\n", "data: [DONE]\n\n"]
    return [e.encode() for e in out]


class _Answer(httpx.AsyncByteStream):
    async def __aiter__(self) -> AsyncIterator[bytes]:
        for event in _events():
            yield event


def _proxy(sampler: Any) -> tuple[FastAPI, Any]:
    telemetry = stagelens.configure(
        span_exporters=[InMemorySpanExporter()],
        registry=CollectorRegistry(),
        set_global=False,
        gpu=False,
        sampler=sampler,
    )
    client = httpx.AsyncClient(
        base_url="http://upstream",
        transport=httpx.MockTransport(
            lambda request: httpx.Response(
                200, headers={"content-type": "text/event-stream"}, stream=_Answer()
            )
        ),
    )
    stagelens.instrument_httpx_client(client, telemetry=telemetry)
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> StreamingResponse:
        body = await request.json()
        body["stream_options"] = {"include_usage": True}
        with stage(Stage.TOKENIZER):
            pass
        request_up = client.build_request("POST", "/v1/chat/completions", json=body)
        upstream = await client.send(request_up, stream=True)

        return relayed(upstream)

    stagelens.instrument_app(app, telemetry=telemetry)
    return app, telemetry


_OURS = ("stagelens.",)
_HTTPX_CYCLE = {"_AsyncStream", "_SyncStream"}
"""The response's stream, ours in httpx's cycle: there, but holding nothing once done."""


@pytest.mark.parametrize(
    "sampler", [ALWAYS_OFF, ALWAYS_ON, TailSampler(0.0)], ids=["off", "on", "tail"]
)
def test_a_finished_request_leaves_nothing_of_ours_to_the_collector(sampler: Any) -> None:
    """Streamed requests through an instrumented FastAPI proxy and httpx client: none of
    stagelens' objects (request state, upstream call, spans, records, pending trace) is
    left in a cycle once each request is done, under each sampler (the tail sampler at
    ratio 0 drops the trace)."""
    app, telemetry = _proxy(sampler)
    asyncio.run(serve_one_stream(app))  # one-time set-up (series bound, caches) out of the count
    gc.collect()
    gc.disable()
    try:
        asyncio.run(serve_one_stream(app))
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        ours = sorted(
            {type(o).__qualname__ for o in gc.garbage if type(o).__module__.startswith(_OURS)}
            - _HTTPX_CYCLE
        )
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
        telemetry.shutdown()
    assert ours == []
