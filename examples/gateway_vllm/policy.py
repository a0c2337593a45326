"""Gateway policy: API-key authentication and per-key token-bucket rate limiting.

Both run inside stagelens's ``gateway`` stage as the middleware's auth and rate-limit hooks,
and answer through ``stagelens.Rejected`` (401 / 429 with ``Retry-After``).
"""

from __future__ import annotations

import hmac
import math
import threading
import time
from collections.abc import Mapping
from typing import Any

from stagelens import Rejected

SCOPE_KEY = "stagelens.reference.api_key"
"""Where the authenticated key's tenant is left in the ASGI scope for the app."""


def _bearer(scope: Mapping[str, Any]) -> str | None:
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            text = bytes(value).decode("latin-1")
            if text.lower().startswith("bearer "):
                return str(text[7:].strip())
    return None


class ApiKeyAuth:
    """Checks ``Authorization: Bearer <key>`` in constant time; returns the key's tenant.
    ``public_paths`` are served without a key (no tenant)."""

    def __init__(self, keys: Mapping[str, str], public_paths: tuple[str, ...] = ()) -> None:
        self._keys = [(k.encode(), tenant) for k, tenant in keys.items()]
        self._public = frozenset(public_paths)

    def __call__(self, scope: dict[str, Any]) -> str | None:
        if scope.get("path") in self._public:
            return None
        presented = _bearer(scope)
        if presented is None:
            raise Rejected(
                401,
                "Missing API key: send 'Authorization: Bearer <key>'.",
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
