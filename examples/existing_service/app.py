"""An ordinary FastAPI service that calls an OpenAI-compatible upstream (e.g. vLLM).

The five lines marked ``# stagelens`` are all it takes to get one trace per request with
gateway, tokenizer, inference (with engine queue/prefill/decode) and billing spans, plus the
Prometheus metrics at ``/metrics``. Run it with::

    UPSTREAM_URL=http://127.0.0.1:8100 .venv/bin/uvicorn app:app --app-dir examples/existing_service
"""

from __future__ import annotations

import os

import httpx
from fastapi import FastAPI, Request
from starlette.responses import JSONResponse, Response, StreamingResponse

import stagelens  # stagelens

UPSTREAM_URL = os.environ.get("UPSTREAM_URL", "http://127.0.0.1:8100")

app = FastAPI(title="existing service")
client = httpx.AsyncClient(base_url=UPSTREAM_URL, timeout=60)
telemetry = stagelens.configure()  # stagelens
stagelens.instrument_app(app, telemetry=telemetry, metrics_path="/metrics")  # stagelens
stagelens.instrument_httpx_client(client, telemetry=telemetry)  # stagelens


@stagelens.stage(stagelens.Stage.TOKENIZER)  # stagelens
def prepare(body: dict) -> dict:
    body.setdefault("max_tokens", 64)
    return body


@app.post("/v1/chat/completions")
async def chat(request: Request) -> Response:
    body = prepare(await request.json())
    upstream_request = client.build_request("POST", "/v1/chat/completions", json=body)
    if not body.get("stream"):
        answer = await client.send(upstream_request)
        return JSONResponse(answer.json(), status_code=answer.status_code)
    answer = await client.send(upstream_request, stream=True)

    async def relay():
        try:
            async for chunk in answer.aiter_raw():
                yield chunk
        finally:
            await answer.aclose()

    return StreamingResponse(relay(), media_type="text/event-stream")


@app.get("/health")
async def health() -> dict[str, str]:
    return {"status": "ok"}
