"""A service that calls its upstream through the official openai SDK, as most do: the
instrumented httpx client passed as ``http_client=`` (docs/openai-sdk.md), sync and async,
streamed and not, the answer a tool call.

Per request: one trace (one SERVER span, the ``chat {model}`` client span under it), the
tokens billed equal to the upstream's usage, and TTFT and inter-token latency as defined
(docs/telemetry.md), checked against the client's own clock and the upstream's script: TTFT
is at least the upstream's first-token delay and at most what the client measured from its
send to its first output chunk; one inter-token gap per output event after the first, their
sum the client's time from its first output chunk to its last.

The upstream is scripted (a tool call streamed in argument fragments, then vLLM's usage
chunk when asked), on a real socket, as is the service, so that chunks arrive one by one.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import openai
import pytest
import uvicorn
from fastapi import FastAPI, Request
from opentelemetry.trace import SpanKind
from starlette.applications import Starlette
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from stagelens import instrument_app, instrument_httpx_client, semconv
from stagelens.testing import TelemetryCapture

FIRST_DELAY = 0.08
"""Seconds the upstream waits before its first output event."""
GAP = 0.02
"""Seconds between the upstream's output events."""
FRAGMENTS = ['{"ci', 'ty": ', '"Par', 'is"}']
"""The tool call's arguments, streamed in these pieces (after the event naming the tool)."""
USAGE = {"prompt_tokens": 41, "completion_tokens": 9, "total_tokens": 50}
SLACK = 0.05
"""How much later than the client's clock the service's may read (same process clock; the
service stamps a send when it returns, and a busy machine can preempt in between)."""
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


def _upstream() -> Starlette:
    """Answers a chat with a tool call, as vLLM streams one (name first, then arguments)."""

    async def chat(request: Request) -> Response:
        body = await request.json()
        model = body["model"]
        await asyncio.sleep(FIRST_DELAY)
        if not body.get("stream"):
            call = {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": "".join(FRAGMENTS)},
            }
            message = {"role": "assistant", "content": None, "tool_calls": [call]}
            choice = {"index": 0, "message": message, "finish_reason": "tool_calls"}
            return JSONResponse(
                {
                    "id": "chatcmpl-1",
                    "object": "chat.completion",
                    "created": 1,
                    "model": model,
                    "choices": [choice],
                    "usage": USAGE,
                }
            )

        def event(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
            choice = {"index": 0, "delta": delta, "finish_reason": finish}
            chunk = {
                "id": "chatcmpl-1",
                "object": "chat.completion.chunk",
                "created": 1,
                "model": model,
                "choices": [choice],
                **extra,
            }
            return f"data: {json.dumps(chunk)}\n\n".encode()

        async def events() -> AsyncIterator[bytes]:
            yield event({"role": "assistant", "content": ""})  # no output: not a token
            head = {"index": 0, "id": "call_1", "type": "function"}
            yield event(
                {"tool_calls": [{**head, "function": {"name": "get_weather", "arguments": ""}}]}
            )
            for piece in FRAGMENTS:
                await asyncio.sleep(GAP)
                yield event({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})
            yield event({}, "tool_calls")
            if (body.get("stream_options") or {}).get("include_usage"):
                usage_chunk = {
                    "id": "chatcmpl-1",
                    "object": "chat.completion.chunk",
                    "created": 1,
                    "model": model,
                    "choices": [],
                    "usage": USAGE,
                }
                yield f"data: {json.dumps(usage_chunk)}\n\n".encode()
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


OUTPUT_EVENTS = 1 + len(FRAGMENTS)
"""Output-bearing events per streamed answer: the tool's name, then each fragment."""


def _service(cap: TelemetryCapture, upstream_url: str) -> FastAPI:
    """An ordinary service: its routes call the upstream through the openai SDK, the async
    client on ``/async``, the sync one on ``/sync`` (run in FastAPI's thread pool)."""
    async_http = httpx.AsyncClient()
    instrument_httpx_client(async_http, telemetry=cap.telemetry)
    async_sdk = openai.AsyncOpenAI(
        base_url=f"{upstream_url}/v1", api_key="sk-test", http_client=async_http
    )
    sync_http = httpx.Client()
    instrument_httpx_client(sync_http, telemetry=cap.telemetry)
    sync_sdk = openai.OpenAI(
        base_url=f"{upstream_url}/v1", api_key="sk-test", http_client=sync_http
    )
    app = FastAPI()

    @app.post("/async/v1/chat/completions")
    async def chat_async(request: Request) -> Response:
        body = await request.json()
        if not body.get("stream"):
            answer = await async_sdk.chat.completions.create(**body)
            return JSONResponse(answer.model_dump())
        stream = await async_sdk.chat.completions.create(**body)

        async def relay() -> AsyncIterator[str]:
            async for chunk in stream:
                yield f"data: {chunk.model_dump_json()}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(relay(), media_type="text/event-stream")

    @app.post("/sync/v1/chat/completions")
    def chat_sync(body: dict[str, Any]) -> Response:
        if not body.get("stream"):
            return JSONResponse(sync_sdk.chat.completions.create(**body).model_dump())
        stream = sync_sdk.chat.completions.create(**body)

        def relay() -> Iterator[str]:
            for chunk in stream:
                yield f"data: {chunk.model_dump_json()}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(relay(), media_type="text/event-stream")

    return instrument_app(app, telemetry=cap.telemetry)


@contextmanager
def _serving(app: Any, port: int) -> Iterator[str]:
    """``app`` on a real loopback socket, served by uvicorn in a thread."""
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=5)


@pytest.fixture(scope="module")
def upstream_url(port_factory: Any) -> Iterator[str]:
    with _serving(_upstream(), port_factory()) as url:
        yield url


class _Timed:
    """The client's own clock around one request."""

    def __init__(self) -> None:
        self.sent = 0.0
        self.outputs: list[float] = []
        self.done = 0.0


def _ask(url: str, flavour: str, model: str, stream: bool) -> _Timed:
    """One chat request asking for a tool; the client stamps its send, every output chunk
    (a tool-call delta) it receives, and the end."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "tools": TOOLS,
        "stream": stream,
    }
    timed = _Timed()
    with httpx.Client(base_url=url, timeout=30) as client:
        timed.sent = time.perf_counter()
        with client.stream("POST", f"/{flavour}/v1/chat/completions", json=body) as response:
            assert response.status_code == 200
            data = b""
            for chunk in response.iter_raw():
                now = time.perf_counter()
                if b'"tool_calls":[{' in chunk.replace(b" ", b"") and not stream:
                    timed.outputs.append(now)
                elif stream:
                    for line in chunk.split(b"\n"):
                        if b'"tool_calls":[{' in line.replace(b" ", b""):
                            timed.outputs.append(now)
                data += chunk
        timed.done = time.perf_counter()
    if not stream:
        call = json.loads(data)["choices"][0]["message"]["tool_calls"][0]
        assert call["function"]["arguments"] == "".join(FRAGMENTS)
    else:
        assert b'"usage":{' not in data.replace(b" ", b"")  # the usage stagelens asked is kept
    return timed


@pytest.mark.parametrize("flavour", ["async", "sync"])
@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "not-streamed"])
def test_one_trace_tokens_ttft_and_itl_through_the_official_sdk(
    cap: TelemetryCapture, upstream_url: str, port_factory: Any, flavour: str, stream: bool
) -> None:
    """One trace per request with the SDK's call as its inference span; tokens as the
    upstream's usage; TTFT and ITL within what the client and the upstream's script say."""
    model = f"m-{flavour}-{'s' if stream else 'p'}"
    with _serving(_service(cap, upstream_url), port_factory()) as url:
        timed = _ask(url, flavour, model, stream)
    spans = cap.spans()
    assert len({s.context.trace_id for s in spans}) == 1, [s.name for s in spans]
    server = [s for s in spans if s.kind is SpanKind.SERVER]
    assert len(server) == 1
    root = server[0]
    call = cap.span(f"chat {model}")
    assert call.kind is SpanKind.CLIENT
    assert call.parent is not None
    assert call.parent.span_id == root.context.span_id
    attributes = dict(call.attributes or {})
    assert attributes[semconv.GEN_AI_USAGE_INPUT_TOKENS] == USAGE["prompt_tokens"]
    assert attributes[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] == USAGE["completion_tokens"]
    assert attributes[semconv.GEN_AI_RESPONSE_FINISH_REASONS] == ("tool_calls",)
    labels = {"model": model, "tenant": "other"}
    assert cap.value("stagelens_tokens_total", **labels, type="input") == USAGE["prompt_tokens"]
    output = cap.value("stagelens_tokens_total", **labels, type="output")
    assert output == USAGE["completion_tokens"]

    if stream:
        ttft = (root.attributes or {})[semconv.ATTR_TTFT]
    else:  # its first byte is its whole answer: kept apart from every first-token figure
        assert semconv.ATTR_TTFT not in (root.attributes or {})
        size = {"model": model, "prompt_size": "1024"}
        assert cap.value(f"{semconv.TIME_TO_FIRST_TOKEN}_count", **size) is None
        ttft = cap.value(f"{semconv.NON_STREAMED_RESPONSE}_sum", **size)
    assert isinstance(ttft, float)
    assert timed.outputs, "the client saw no tool call"
    assert FIRST_DELAY <= ttft <= timed.outputs[0] - timed.sent + SLACK
    gaps = cap.value("stagelens_inter_token_latency_seconds_count", model=model)
    if not stream:
        assert gaps in (None, 0)  # one answer: no gap between tokens
        return
    assert len(timed.outputs) == OUTPUT_EVENTS
    assert gaps == OUTPUT_EVENTS - 1
    total = cap.value("stagelens_inter_token_latency_seconds_sum", model=model)
    assert total is not None
    # The gaps add up to the time from the first output event sent to the last, which the
    # client saw as the time from its first output chunk to its last.
    seen = timed.outputs[-1] - timed.outputs[0]
    assert seen - SLACK <= total <= seen + SLACK
