"""A local OpenAI-compatible upstream for core tests: vLLM's response shapes, no engine.

Why not vLLM here: these tests check the instrumentation's parsing, timing and span
structure deterministically and fast; the real-vLLM behaviour is covered end to end in
tests/e2e. The bodies mirror what vLLM 0.32 sends with --enable-per-request-metrics and
--enable-prompt-tokens-details (chunks, the final usage chunk with ``metrics``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

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


def make_upstream(chunks: int = 16, delay: float = 0.0, first_delay: float = 0.0) -> Starlette:
    """Upstream app: streams ``chunks`` content chunks, ``delay`` s apart, then usage."""
    seen: list[dict[str, str]] = []

    async def chat(request: Request) -> Response:
        body = await request.json()
        seen.append({k.decode(): v.decode() for k, v in request.headers.raw})
        rid = request.headers.get("x-request-id", "none")
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
