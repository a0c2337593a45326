"""Test scaffolding written once: an app served on a loopback socket, and the scripted
upstream the instrumentation tests drive.

Why a real socket: streamed chunks then arrive one by one through httpx's real transport
(httpcore), as they do in production; an in-process transport coalesces nothing and
splits nothing. Why a scripted upstream beside real vLLM: some shapes the tiny model
cannot be made to produce (an error event, a backend dying mid-stream, events coalesced in
one read, a second choice, JSON spaced as ``json.dumps`` spaces it); the script names the
exact bytes, and the tests check what stagelens read from them.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Served:
    """``app`` served by uvicorn in a thread on a loopback port (``url``), while entered.

    ``lifespan`` as uvicorn takes it (``"off"`` for a bare Starlette app without startup
    work); ``timeout`` bounds the wait for the server to start."""

    def __init__(
        self,
        app: Any,
        port: int | None = None,
        *,
        lifespan: str = "auto",
        log_level: str = "warning",
        timeout: float = 30.0,
    ) -> None:
        self.port = port if port is not None else free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._timeout = timeout
        self._server = uvicorn.Server(
            uvicorn.Config(
                app, host="127.0.0.1", port=self.port, log_level=log_level, lifespan=lifespan
            )
        )
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    def __enter__(self) -> Served:
        self._thread.start()
        deadline = time.monotonic() + self._timeout
        while not self._server.started:
            assert time.monotonic() < deadline, "the served app did not start"
            assert self._thread.is_alive(), "the served app's server stopped"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)


def event(body: Any, *, spaced: bool = False) -> str:
    """One SSE event of ``body`` as JSON: compact as vLLM writes it, or ``spaced`` as
    ``json.dumps`` writes it by default."""
    text = json.dumps(body) if spaced else json.dumps(body, separators=(",", ":"))
    return f"data: {text}\n\n"


USAGE = {"prompt_tokens": 7, "completion_tokens": 3}
"""The usage the scripted upstream reports unless the request names another."""


def scripted_upstream() -> Starlette:
    """An OpenAI-compatible upstream that sends what each request scripts in its body:

    - ``x_script``: ``[seconds to wait, text]`` pairs, each text sent as one chunk (an
      empty text: only the wait);
    - then, when ``stream_options.include_usage`` asks (as vLLM), the usage event: the
      event of ``x_usage_event`` (a JSON body) if given, else ``{"id": "c1", "choices":
      [], "usage": x_usage or USAGE}``, not with ``x_no_usage`` (as vLLM after an error
      event); then after ``x_done_delay`` seconds ``[DONE]``, not with ``x_no_done``;
    - ``x_die``: raise after the script instead of ending (the server drops the
      connection mid-body);
    - ``x_status``: answer that status with an error body instead;
    - not streamed: ``x_answer`` (a JSON body) if given, else one choice and the usage.
    """

    async def chat(request: Request) -> Response:
        body = await request.json()
        usage = body.get("x_usage") or USAGE
        if body.get("x_status"):
            error = {"error": {"message": "nope", "type": "X", "code": body["x_status"]}}
            return JSONResponse(error, status_code=int(body["x_status"]))
        if not body.get("stream"):
            answer = body.get("x_answer") or {
                "id": "c1",
                "choices": [{"message": {"content": "hi"}}],
                "usage": usage,
            }
            return JSONResponse(answer)

        async def events() -> AsyncIterator[bytes]:
            for wait, text in body.get("x_script", []):
                if wait:
                    await asyncio.sleep(wait)
                if text:
                    yield text.encode()
            if body.get("x_die"):
                raise RuntimeError("engine died")
            wants = (body.get("stream_options") or {}).get("include_usage")
            if wants and not body.get("x_no_usage"):
                final = body.get("x_usage_event") or {"id": "c1", "choices": [], "usage": usage}
                yield event(final, spaced=bool(body.get("x_spaced_usage"))).encode()
            if body.get("x_no_done"):
                return
            if body.get("x_done_delay"):
                await asyncio.sleep(float(body["x_done_delay"]))
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


def chat_scope(spec_version: str | None = None) -> dict[str, Any]:
    """The ASGI scope of ``POST /v1/chat/completions``, as a server passes it."""
    asgi = (
        {"version": "3.0"}
        if spec_version is None
        else {"version": "3.0", "spec_version": spec_version}
    )
    return {
        "type": "http",
        "asgi": asgi,
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json"), (b"host", b"gw")],
        "client": ("127.0.0.1", 5000),
        "server": ("127.0.0.1", 8080),
    }


async def serve_one_stream(app: Any) -> None:
    """One streamed chat request through the ASGI ``app``, as a server passes it: the
    body at once, then the client waits until the answer's last body has been sent."""
    body = json.dumps({"model": "m", "stream": True, "messages": []}).encode()
    sent: list[bool] = []
    done = asyncio.Event()

    async def receive() -> dict[str, Any]:
        if not sent:
            sent.append(True)
            return {"type": "http.request", "body": body, "more_body": False}
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            done.set()

    await app(chat_scope(), receive, send)


def relayed(upstream: Any) -> Any:
    """A streamed upstream answer (an ``httpx.Response`` sent with ``stream=True``) relayed
    to the client byte for byte as an event stream, the upstream closed when the relay
    ends: the proxy endpoint of the tests' gateways."""
    from starlette.responses import StreamingResponse

    async def relay() -> Any:
        try:
            async for chunk in upstream.aiter_raw():
                yield chunk
        finally:
            await upstream.aclose()

    return StreamingResponse(relay(), media_type="text/event-stream")
