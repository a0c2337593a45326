"""The ``floor`` variant of the overhead benchmarks: the least work any instrumentation must
do on this proxy to obtain the figures stagelens' metrics are made of, hand-written for
this one proxy. It is a yardstick, not a product.

Why: the overhead targets (3 % with tracing sampled out, the first goal) are only meaningful
against what capturing those figures costs at all. This variant captures every input of
the metrics and nothing more, with the cheapest means stagelens itself uses (httpx's
header list appended to, JSON read by the C scanner, httpcore's stream read directly):

- per body message sent, one ``perf_counter()`` (TTFT, inter-token gaps);
- the request's duration and five stage timings (gateway, tokenizer, router,
  post-processing, billing) on a per-request object found through a ContextVar;
- on the upstream call: the model and stream flag from the request body, ``traceparent``
  added (as stagelens adds it to a sampled-out call: no ``X-Request-Id``, which only names
  a recorded span), the stream's tail kept, the usage event parsed at its end
  for tokens and the engine's phase timings, the inference stage timed.

Left out, so the floor is a lower bound: recording into Prometheus, spans and every
OpenTelemetry call, the parent's trace context, tenants and prices, error and disconnect
handling, other stream shapes. The captured figures are dropped.
"""

from __future__ import annotations

import contextvars
import json
import json.scanner
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from itertools import islice
from operator import sub
from typing import Any

import httpx
from httpx._transports.default import map_httpcore_exceptions

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Any, Any], Awaitable[None]]

_SCAN = json.scanner.make_scanner(json.JSONDecoder())  # type: ignore[arg-type]
_CURRENT: contextvars.ContextVar[_Request | None] = contextvars.ContextVar("floor", default=None)
_KEPT: list[tuple[Any, ...]] = []
"""The last captured requests (bounded): figures are made, then dropped."""


class _Request:
    __slots__ = ("engine", "stages", "times")

    def __init__(self) -> None:
        self.stages: list[tuple[str, float]] = []
        self.times: list[float] = []
        self.engine: tuple[Any, ...] | None = None


class stage:
    """Times a block into the current request's stage list."""

    __slots__ = ("_name", "_t0")

    def __init__(self, name: str) -> None:
        self._name = name
        self._t0 = 0.0

    def __enter__(self) -> None:
        self._t0 = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        request = _CURRENT.get()
        if request is not None:
            request.stages.append((self._name, time.perf_counter() - self._t0))


def middleware(app: ASGIApp) -> ASGIApp:
    """Times the request, its gateway and billing stages and every body message sent."""
    perf_counter = time.perf_counter

    async def floor_app(scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        request = _Request()
        token = _CURRENT.set(request)
        started = perf_counter()
        times = request.times

        def timed_send(message: Message) -> Any:
            if message["type"] == "http.response.body" and message.get("body"):
                times.append(perf_counter())
            return send(message)

        try:
            with stage("gateway"):
                pass
            await app(scope, receive, timed_send)
        finally:
            with stage("billing"):
                pass
            duration = perf_counter() - started
            ttft = times[0] - started if times else None
            gaps = list(map(sub, islice(times, 1, None), times))  # later - earlier
            _KEPT.append((duration, ttft, gaps, request.stages, request.engine))
            if len(_KEPT) > 64:
                _KEPT.clear()
            _CURRENT.reset(token)

    return floor_app


class Transport(httpx.AsyncBaseTransport):
    """Adds ``traceparent`` and hands back a stream that keeps its tail."""

    def __init__(self, wrapped: httpx.AsyncBaseTransport) -> None:
        self._wrapped = wrapped

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        payload, _ = _SCAN(request.content.decode(), 0)
        model, streamed = payload.get("model"), payload.get("stream")
        trace_id = f"{random.getrandbits(128):032x}"
        traceparent = f"00-{trace_id}-{random.getrandbits(64):016x}-00".encode()
        request.headers._list.append(  # type: ignore[attr-defined]
            (b"traceparent", b"traceparent", traceparent)
        )
        started = time.perf_counter()
        response = await self._wrapped.handle_async_request(request)
        response.stream = _Stream(response.stream, _CURRENT.get(), started, (model, streamed))
        return response


class _Stream(httpx.AsyncByteStream):
    def __init__(
        self, wrapped: Any, request: _Request | None, started: float, call: tuple[Any, Any]
    ) -> None:
        self._wrapped = wrapped
        self._request = request
        self._started = started
        self._call = call

    async def __aiter__(self) -> AsyncIterator[bytes]:
        tail = bytearray()
        with map_httpcore_exceptions():
            async for chunk in self._wrapped._httpcore_stream:
                tail += chunk
                yield chunk
        request = self._request
        at = tail.rfind(b'"usage"')
        if request is None or at < 0:
            return
        begin = tail.rfind(b"\n", 0, at) + 1
        event, _ = _SCAN(tail[begin + 5 : tail.find(b"\n", at)].decode().strip(), 0)
        usage, engine = event["usage"], event.get("metrics") or {}
        request.engine = (
            self._call,
            usage["prompt_tokens"],
            usage["completion_tokens"],
            (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0),
            engine.get("queue_time_ms"),
            engine.get("time_to_first_token_ms"),
            engine.get("generation_time_ms"),
        )
        request.stages.append(("inference", time.perf_counter() - self._started))

    async def aclose(self) -> None:
        await self._wrapped.aclose()
