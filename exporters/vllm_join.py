"""Each request's engine time back to the gateway that sent it, in the vLLM server's answer.

``EngineSecondsMiddleware`` is an ASGI middleware for vLLM's API server (vLLM's own
``--middleware stagelens.exporters.vllm_join.EngineSecondsMiddleware``). For a request whose
``X-Request-Id`` a stagelens gateway minted (``stagelens.engine_join``) it adds the request's
share of the engine's time, as the vLLM plugin worked it out when the request finished:

- an answer that is not streamed gets the header ``x-stagelens-engine: seconds=S; gpus=N``;
- a stream gets the SSE comment ``: x-stagelens-engine seconds=S; gpus=N`` before the
  first event sent once the request finished (its last content event, or its usage event,
  or ``[DONE]``), so a reader that stops at ``[DONE]`` has read it (SSE parsers skip
  comments; the stagelens gateway reads it and removes it, so its clients read the stream
  byte for byte as vLLM wrote it).

Any other request passes untouched. Why it can: the stat logger runs on the API server's
event loop (``vllm/v1/engine/async_llm.py``, ``output_handler``), where it records a step
right after handing the step's outputs to the requests' queues and before it awaits again,
so the figure is there before the handler that awaits those outputs writes its answer's
end. When a step had more outputs than vLLM hands over at once
(``VLLM_V1_OUTPUT_PROC_CHUNK_SIZE``), the middleware gives the loop a few turns for it.

What joins the two: the key (``<trace>-<span>``) of the minted id, which the plugin finds in
``FinishedRequestStats.request_id`` and the middleware in the header. The plugin keeps the
figures of finished requests only while a middleware is installed, at most ``MAX_KEPT`` of
them (the oldest are dropped: a client gone before its answer's end leaves one behind).
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from typing import Any, Final

from stagelens import semconv as sc
from stagelens.engine_join import engine_comment, engine_value, read_id

MAX_KEPT: Final = 4096
"""Figures kept for answers not yet ended (a few seconds' worth on a busy server)."""
TURNS: Final = 8
"""Loop turns the middleware waits for a figure not recorded yet (then it adds none)."""
_REQUEST_ID: Final = sc.HEADER_REQUEST_ID.encode("ascii")
_HEADER: Final = sc.HEADER_ENGINE_SECONDS.encode("ascii")


class RecentShares:
    """The engine time of recently finished requests, by key, until their answer takes it."""

    def __init__(self, limit: int = MAX_KEPT) -> None:
        self._limit = limit
        self._shares: OrderedDict[str, tuple[float, int]] = OrderedDict()
        self._lock = threading.Lock()
        self.active = False
        """A middleware is installed: without one nothing is kept."""

    def put(self, key: str, seconds: float, gpus: int) -> None:
        """Add ``seconds`` to ``key`` (the several sequences of one request add up)."""
        with self._lock:
            found = self._shares.get(key)
            self._shares[key] = (seconds + (found[0] if found else 0.0), gpus)
            if len(self._shares) > self._limit:
                self._shares.popitem(last=False)

    def take(self, key: str) -> tuple[float, int] | None:
        """The figure of ``key``, removed; None when there is none."""
        with self._lock:
            return self._shares.pop(key, None)

    def __len__(self) -> int:
        return len(self._shares)


RECENT: Final = RecentShares()
"""The process's figures: the plugin puts, the middleware takes (one API server process)."""


async def _figure(key: str, recent: RecentShares) -> tuple[float, int] | None:
    found = recent.take(key)
    for _ in range(TURNS):
        if found is not None:
            break
        await asyncio.sleep(0)
        found = recent.take(key)
    return found


def _key_of(scope: dict[str, Any]) -> str | None:
    for name, value in scope.get("headers", ()):
        if name.lower() == _REQUEST_ID:
            found = read_id(value.decode("latin-1"))
            return None if found is None else found[0]
    return None


class EngineSecondsMiddleware:
    """Adds a stagelens request's engine time to vLLM's answer (the module docstring)."""

    def __init__(self, app: Any, recent: RecentShares | None = None) -> None:
        self.app = app
        self.recent = recent if recent is not None else RECENT
        self.recent.active = True

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        key = _key_of(scope) if scope.get("type") == "http" else None
        if key is None:
            await self.app(scope, receive, send)
            return
        recent = self.recent
        streaming = delivered = False

        async def answer(message: dict[str, Any]) -> None:
            nonlocal streaming, delivered
            comment: bytes | None = None
            try:
                kind = message.get("type")
                if kind == "http.response.start":
                    headers = list(message.get("headers", ()))
                    content_type = next(
                        (v for k, v in headers if k.lower() == b"content-type"), b""
                    )
                    streaming = content_type.startswith(b"text/event-stream")
                    if not streaming and message.get("status", 200) < 400:
                        found = await _figure(key, recent)
                        if found is not None:
                            value = engine_value(*found).encode("ascii")
                            message = {**message, "headers": [*headers, (_HEADER, value)]}
                elif kind == "http.response.body" and streaming and not delivered:
                    # Each event of the stream: one look (a dict lookup); at its end a few
                    # loop turns, for a step whose stats come after its outputs.
                    last = not message.get("more_body")
                    found = await _figure(key, recent) if last else recent.take(key)
                    if found is not None:
                        comment = engine_comment(*found)
                        delivered = True
            except Exception as exc:  # never the answer's problem: it goes as vLLM wrote it
                _report(exc)
            if comment is not None:  # between two events: vLLM sends whole events
                await send({"type": "http.response.body", "body": comment, "more_body": True})
            await send(message)

        await self.app(scope, receive, answer)


def _report(exc: BaseException) -> None:
    """Count a failure of the middleware where the plugin counts its own."""
    from stagelens.exporters.vllm_metrics import engine_metrics

    engine_metrics().errors.report(sc.COMPONENT_VLLM_PLUGIN, exc, "vLLM middleware: failed")
