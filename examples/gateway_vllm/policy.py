"""Gateway policy: API-key authentication, per-key token-bucket rate limiting and the
request body size limit.

The first two run inside stagelens's ``gateway`` stage as the middleware's auth and
rate-limit hooks, and answer through ``stagelens.Rejected`` (401 / 429 with
``Retry-After``); the size limit wraps stagelens's middleware and answers 413 the same way.
"""

from __future__ import annotations

import hmac
import math
import threading
import time
from collections.abc import Mapping
from typing import Any

from stagelens.reference.api_errors import for_path
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from stagelens import Rejected

SCOPE_KEY = "stagelens.reference.api_key"
"""Where the authenticated key's tenant is left in the ASGI scope for the app."""


def _presented(scope: Mapping[str, Any]) -> str | None:
    """The API key of ``Authorization: Bearer <key>`` (OpenAI's clients), else of
    ``x-api-key: <key>`` (Anthropic's)."""
    found = None
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            text = bytes(value).decode("latin-1")
            if text.lower().startswith("bearer "):
                return str(text[7:].strip())
        elif name == b"x-api-key" and found is None:
            found = bytes(value).decode("latin-1").strip()
    return found


class ApiKeyAuth:
    """Checks ``Authorization: Bearer <key>`` or ``x-api-key: <key>`` in constant time;
    returns the key's tenant. ``public_paths`` are served without a key (no tenant)."""

    def __init__(self, keys: Mapping[str, str], public_paths: tuple[str, ...] = ()) -> None:
        self._keys = [(k.encode(), tenant) for k, tenant in keys.items()]
        self._public = frozenset(public_paths)

    def __call__(self, scope: dict[str, Any]) -> str | None:
        if scope.get("path") in self._public:
            return None
        presented = _presented(scope)
        if presented is None:
            raise Rejected(
                401,
                "Missing API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'.",
                type="authentication_error",
                code="missing_api_key",
            )
        given = presented.encode()
        tenant: str | None = None
        for key, name in self._keys:  # compare against every key: no early exit
            if hmac.compare_digest(key, given):
                tenant = name
        if tenant is None:
            raise Rejected(
                401, "Invalid API key.", type="authentication_error", code="invalid_api_key"
            )
        scope[SCOPE_KEY] = presented
        scope["stagelens.reference.tenant"] = tenant
        return tenant


class TokenBucketLimiter:
    """Per-key token bucket: ``rate`` requests/second refill, ``burst`` capacity.

    In process memory: each worker process has buckets of its own, so N workers admit up
    to N times the rate. Several workers or replicas share one bucket per key through
    Redis (:mod:`stagelens.reference.ratelimit`)."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate = rate
        self.burst = float(burst)
        self._buckets: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def take(self, key: str, now: float | None = None) -> float:
        """Take one token; return 0 when allowed, else the seconds until one is available."""
        now = time.monotonic() if now is None else now
        with self._lock:
            tokens, last = self._buckets.get(key, (self.burst, now))
            tokens = min(self.burst, tokens + (now - last) * self.rate)
            if tokens >= 1.0:
                self._buckets[key] = (tokens - 1.0, now)
                return 0.0
            self._buckets[key] = (tokens, now)
            return (1.0 - tokens) / self.rate

    def __call__(self, scope: dict[str, Any]) -> None:
        key = scope.get(SCOPE_KEY)
        if key is None:
            return
        wait = self.take(key)
        if wait > 0:
            raise rate_limited(self.rate, wait)


def rate_limited(rate: float, wait: float) -> Rejected:
    """The 429 for a key whose bucket is empty, ``Retry-After`` in whole seconds."""
    return Rejected(
        429,
        f"Rate limit exceeded: {rate:g} requests/s per key. Retry after {wait:.2f}s.",
        type="rate_limit_error",
        code="rate_limit_exceeded",
        headers={"retry-after": str(max(1, math.ceil(wait)))},
    )


class BodyLimit:
    """Pure ASGI middleware, outside stagelens's: a request body over ``max_bytes`` answers
    413 ``request_too_large`` before the gateway holds it (or parses or tokenizes it).

    Why it raises from ``receive``: the body is read by the gateway stage's body hook, so the
    413 is answered and counted there, after authentication, like every other rejection
    (in the shape of the request's API, ``api_errors``).
    A declared ``Content-Length`` over the limit is refused before any byte is read; a
    chunked body as soon as what arrived passes the limit.
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.max_bytes
        declared = _content_length(scope)
        received = 0
        path = str(scope.get("path", ""))

        async def limited() -> Message:
            nonlocal received
            if declared is not None and declared > limit:
                raise for_path(path, _too_large(limit))
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise for_path(path, _too_large(limit))
            return message

        await self.app(scope, limited, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # the server refuses a malformed length itself
    return None


def _too_large(limit: int) -> Rejected:
    return Rejected(
        413,
        f"Request body is larger than this gateway's limit of {limit} bytes.",
        code="request_too_large",
    )
