"""An ordinary FastAPI service that calls an OpenAI-compatible upstream (e.g. vLLM).

This is the service *before* stagelens: ``app.py`` is the same file with five lines added
(each marked ``# stagelens``); tests/instrumentation/test_existing_service.py checks that
nothing else differs. Run it with::

    UPSTREAM_URL=http://127.0.0.1:8100 uvicorn app_before:app --app-dir examples/existing_service
"""

from __future__ import annotations

import os

import httpx
from fastapi import FastAPI, Request
from starlette.responses import JSONResponse, Response, StreamingResponse


UPSTREAM_URL = os.environ.get("UPSTREAM_URL", "http://127.0.0.1:8100")

app = FastAPI(title="existing service")
client = httpx.AsyncClient(base_url=UPSTREAM_URL, timeout=60)


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
