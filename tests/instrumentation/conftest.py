"""Fixtures for the core instrumentation tests: an isolated capture, a local upstream that
answers like vLLM, and an ordinary FastAPI proxy instrumented with stagelens.

Why not vLLM here: these tests check parsing, timing and span structure deterministically
and fast; real-vLLM behaviour is covered end to end in tests/e2e. The upstream's bodies
mirror what vLLM 0.32 sends with --enable-per-request-metrics and
--enable-prompt-tokens-details (content chunks, then a usage chunk carrying ``metrics``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from starlette.applications import Starlette
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from stagelens import Stage, instrument_app, instrument_httpx_client, stage
from stagelens.testing import TelemetryCapture, capture_telemetry
from tests._scaffold import Served, relayed, scripted_upstream

ENGINE_METRICS = {
    "time_to_first_token_ms": 12.0,
    "generation_time_ms": 30.0,
    "queue_time_ms": 2.0,
    "mean_itl_ms": 2.0,
    "tokens_per_second": 400.0,
}
USAGE = {
    "prompt_tokens": 300,
    "completion_tokens": 16,
    "total_tokens": 316,
    "prompt_tokens_details": {"cached_tokens": 256},
}


def make_upstream() -> Starlette:
    """Upstream app: streams ``x_chunks`` content chunks (default 16), ``x_delay`` s apart
    after ``x_first_delay`` s, then the usage chunk when ``stream_options.include_usage``
    asks for it (as vLLM); the ``x_*`` knobs ride in the body.
    A model named ``no-such-...`` is refused with 404, as vLLM refuses a model it does not
    serve."""
    seen: list[dict[str, str]] = []

    async def chat(request: Request) -> Response:
        body = await request.json()
        chunks = int(body.get("x_chunks", 16))
        delay = float(body.get("x_delay", 0.0))
        first_delay = float(body.get("x_first_delay", 0.0))
        seen.append({k.decode(): v.decode() for k, v in request.headers.raw})
        rid = request.headers.get("x-request-id", "none")
        if str(body.get("model", "")).startswith("no-such-"):  # as vLLM answers a bad name
            error = {"message": "The model does not exist.", "type": "NotFoundError"}
            return JSONResponse({"error": {**error, "code": 404}}, status_code=404)
        if not body.get("stream"):
            return JSONResponse(
                {
                    "id": f"chatcmpl-{rid}",
                    "object": "chat.completion",
                    "model": body["model"],
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": "hi " * chunks},
                            "finish_reason": "length",
                        }
                    ],
                    "usage": USAGE,
                    "metrics": ENGINE_METRICS,
                },
                headers={"x-request-id": rid},
            )

        async def events() -> AsyncIterator[bytes]:
            if first_delay:
                await asyncio.sleep(first_delay)
            for i in range(chunks):
                if delay and i:
                    await asyncio.sleep(delay)
                chunk: dict[str, Any] = {
                    "id": f"chatcmpl-{rid}",
                    "model": body["model"],
                    "choices": [
                        {
                            "index": 0,
                            "delta": {"content": f"t{i} "},
                            "finish_reason": "length" if i == chunks - 1 else None,
                        }
                    ],
                }
                yield f"data: {json.dumps(chunk, separators=(',', ':'))}\n\n".encode()
            if (body.get("stream_options") or {}).get("include_usage"):  # as vLLM does
                final = {
                    "id": f"chatcmpl-{rid}",
                    "model": body["model"],
                    "choices": [],
                    "usage": USAGE,
                    "metrics": ENGINE_METRICS,
                }
                yield f"data: {json.dumps(final, separators=(',', ':'))}\n\n".encode()
            yield b"data: [DONE]\n\n"

        return StreamingResponse(
            events(), media_type="text/event-stream", headers={"x-request-id": rid}
        )

    app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])
    app.state.seen_headers = seen
    return app


@pytest.fixture
def cap(request: pytest.FixtureRequest) -> Iterator[TelemetryCapture]:
    """A fresh in-memory tracer provider and Prometheus registry for one test: the deferred
    tracer ``configure()`` builds, or the one a test names with
    ``@pytest.mark.parametrize("cap", TRACERS, indirect=True)`` (where span shapes are
    checked: both tracers must give the same)."""
    with capture_telemetry(tracer=getattr(request, "param", "deferred")) as capture:
        yield capture


def build_proxy(
    capture: TelemetryCapture, upstream_url: str, **middleware_options: Any
) -> tuple[FastAPI, httpx.AsyncClient]:
    """An ordinary FastAPI proxy to an OpenAI-compatible upstream, instrumented."""
    client = httpx.AsyncClient(base_url=upstream_url)
    instrument_httpx_client(client, telemetry=capture.telemetry)
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        body = await request.json()
        with stage(Stage.TOKENIZER):
            body.setdefault("messages", [])
        with stage(Stage.ROUTER):
            pass
        upstream_request = client.build_request("POST", "/v1/chat/completions", json=body)
        if not body.get("stream"):
            answer = await client.send(upstream_request)
            with stage(Stage.POSTPROCESS):
                payload = answer.json()
            return JSONResponse(payload, status_code=answer.status_code)
        answer = await client.send(upstream_request, stream=True)

        return relayed(answer)

    instrument_app(app, telemetry=capture.telemetry, **middleware_options)
    return app, client


def gateway_client(app: FastAPI, raise_app_exceptions: bool = True) -> httpx.AsyncClient:
    """An httpx client talking to ``app`` in-process."""
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app, raise_app_exceptions=raise_app_exceptions),
        base_url="http://gateway.local",
    )


@pytest.fixture(scope="session")
def upstream(port_factory: Any) -> Iterator[Starlette]:
    """The local upstream, served by uvicorn on a free loopback port for the session
    (a real socket, so streamed chunks arrive one by one)."""
    app = make_upstream()
    with Served(app, port_factory(), lifespan="off") as served:
        app.state.url = served.url
        yield app


@pytest.fixture(scope="session")
def scripted_url() -> Iterator[str]:
    """The scripted upstream (``tests._scaffold.scripted_upstream``) on a loopback port,
    for the session."""
    with Served(scripted_upstream(), lifespan="off", log_level="critical") as served:
        yield served.url


@pytest.fixture
def proxy_factory(upstream: Starlette) -> Any:
    """``build_proxy(capture, **middleware_options) -> (app, upstream_client)``."""

    def factory(capture: TelemetryCapture, **options: Any) -> tuple[FastAPI, httpx.AsyncClient]:
        return build_proxy(capture, upstream.state.url, **options)

    return factory


@pytest.fixture
def client_factory() -> Any:
    """``gateway_client(app, raise_app_exceptions=True)``."""
    return gateway_client
