"""Rate limits shared by every worker and replica: one token bucket per API key in Redis.

Why a Lua script: the read, the refill and the take must be one step, or two replicas
reading the same bucket at once would both take its last token. Redis runs a script
atomically, and the script reads Redis's own clock (``TIME``), so replicas whose clocks
disagree still refill the bucket at one rate. Across any number of replicas a key gets at
most ``burst`` requests at once and ``rate`` per second after that.

Without a Redis URL the gateway keeps its per-process buckets
(:class:`stagelens.reference.policy.TokenBucketLimiter`): exact for one process, N times
the limit with N workers.

When Redis cannot be reached the request is let through (fail open) and the failure is
counted as ``stagelens_telemetry_errors_total{component="rate_limiter"}``: an outage of the
limiter must not become an outage of the gateway.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from typing import Any, Final

from redis.asyncio import BlockingConnectionPool, Redis
from redis.exceptions import RedisError
from stagelens.reference.ledger_url import redact
from stagelens.reference.policy import SCOPE_KEY, TokenBucketLimiter, rate_limited

from stagelens.errors import ConfigurationError

REDIS_URL_ENV: Final = "STAGELENS_REDIS_URL"
"""Where the shared rate-limit buckets live when the gateway config names no
``redis_url``; unset: per-process buckets."""

KEY_PREFIX: Final = "stagelens:ratelimit:"
"""Redis keys are this plus a SHA-256 of the API key (no key material in Redis)."""

TAKE_SCRIPT: Final = """
local now = redis.call('TIME')
now = tonumber(now[1]) + tonumber(now[2]) / 1000000
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local state = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens = tonumber(state[1])
local at = tonumber(state[2])
if tokens == nil or at == nil then
  tokens = burst
  at = now
end
tokens = math.min(burst, tokens + math.max(0, now - at) * rate)
local wait = 0
if tokens >= 1 then
  tokens = tokens - 1
else
  wait = (1 - tokens) / rate
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'at', tostring(now))
redis.call('PEXPIRE', KEYS[1], math.ceil(burst / rate * 1000) + 1000)
return tostring(wait)
"""
"""Take one token from the bucket ``KEYS[1]`` (``ARGV``: rate, burst); return the seconds
until one is available (0: taken). An idle bucket expires once it would be full anyway."""

ErrorReport = Callable[[BaseException], None]
"""Called with the exception when Redis fails (the request is let through)."""


def resolve_url(configured: str | None) -> str | None:
    """The Redis URL: the gateway config's, else ``$STAGELENS_REDIS_URL``, else None."""
    return configured or os.environ.get(REDIS_URL_ENV) or None


def bucket_key(api_key: str) -> str:
    """The Redis key of ``api_key``'s bucket."""
    return KEY_PREFIX + hashlib.sha256(api_key.encode()).hexdigest()[:32]


class RedisTokenBucket:
    """Per-key token bucket in Redis: ``rate`` requests/second refill, ``burst`` capacity,
    shared by every process given the same URL. The gateway's rate-limit hook."""

    def __init__(
        self,
        url: str,
        rate: float,
        burst: int,
        on_error: ErrorReport,
        timeout: float = 1.0,
        connections: int = 32,
    ) -> None:
        self.rate = rate
        self.burst = burst
        self._on_error = on_error
        # A blocking pool: under a burst of requests a call waits (up to ``timeout``) for
        # one of ``connections`` connections instead of failing at once, which would let
        # the burst through unlimited exactly when the limit matters.
        try:
            pool = BlockingConnectionPool.from_url(
                url,
                max_connections=connections,
                timeout=timeout,
                socket_timeout=timeout,
                socket_connect_timeout=timeout,
            )
        except ValueError as exc:
            raise ConfigurationError(f"redis URL {redact(url)!r}: {exc}") from None
        self._redis = Redis(connection_pool=pool)
        self._take = self._redis.register_script(TAKE_SCRIPT)

    async def take(self, api_key: str) -> float:
        """Take one token; return 0 when allowed, else the seconds until one is available.
        Raises RedisError / OSError when Redis cannot answer."""
        wait: Any = await self._take(keys=[bucket_key(api_key)], args=[self.rate, self.burst])
        return float(wait)

    async def __call__(self, scope: dict[str, Any]) -> None:
        key = scope.get(SCOPE_KEY)
        if key is None:
            return
        try:
            wait = await self.take(key)
        except (RedisError, OSError) as exc:
            self._on_error(exc)
            return
        if wait > 0:
            raise rate_limited(self.rate, wait)

    async def aclose(self) -> None:
        """Disconnect (at shutdown)."""
        await self._redis.aclose(close_connection_pool=True)


RateLimiter = TokenBucketLimiter | RedisTokenBucket
"""What :func:`rate_limiter` returns; both are the middleware's rate-limit hook."""


def rate_limiter(
    redis_url: str | None, rate: float, burst: int, on_error: ErrorReport
) -> RateLimiter:
    """The shared Redis bucket when ``redis_url`` (or ``$STAGELENS_REDIS_URL``) is set,
    else the per-process one."""
    url = resolve_url(redis_url)
    if url is None:
        return TokenBucketLimiter(rate, burst)
    return RedisTokenBucket(url, rate, burst, on_error)
