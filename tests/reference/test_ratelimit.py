"""Rate limits in a real Redis: one bucket per key for every process that shares it."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import time

import pytest
from redis.asyncio import Redis
from stagelens.reference.policy import SCOPE_KEY, TokenBucketLimiter
from stagelens.reference.ratelimit import RedisTokenBucket, bucket_key, rate_limiter

from stagelens import Rejected
from stagelens.errors import ConfigurationError

pytestmark = pytest.mark.anyio

REPLICA = textwrap.dedent(
    """
    import asyncio, sys
    from stagelens.reference.ratelimit import RedisTokenBucket

    async def main(url, key, n):
        bucket = RedisTokenBucket(url, rate=0.001, burst=10, on_error=print)
        waits = await asyncio.gather(*(bucket.take(key) for _ in range(n)))
        await bucket.aclose()
        print(sum(1 for w in waits if w == 0))

    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
    """
)


class TestSharedBucket:
    """Several replicas, one bucket per key."""

    def test_replicas_together_get_one_burst(self, redis_url) -> None:
        """Three processes take 10 tokens each at once from a burst-10 bucket: 10 in all."""
        key = f"sk-{time.monotonic_ns()}"
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", REPLICA, redis_url, key, "10"], stdout=subprocess.PIPE
            )
            for _ in range(3)
        ]
        allowed = [int(p.communicate(timeout=60)[0]) for p in procs]
        assert sum(allowed) == 10, allowed


class TestSharedBucketAsync:
    """The bucket's refill and the hook, against a real Redis."""

    async def test_a_burst_larger_than_the_connection_pool_is_still_limited(
        self, redis_url
    ) -> None:
        """300 requests at once in one process: they queue for Redis connections (none
        fails open), and exactly the burst passes. The wait for a connection is given room
        here because a loaded test machine serves the queue slower than a gateway would."""
        errors: list[BaseException] = []
        bucket = RedisTokenBucket(
            redis_url, rate=0.001, burst=50, on_error=errors.append, timeout=30.0
        )
        scope = {SCOPE_KEY: f"sk-{time.monotonic_ns()}"}

        async def one() -> bool:
            try:
                await bucket(scope)
            except Rejected:
                return False
            return True

        passed = await asyncio.gather(*(one() for _ in range(300)))
        await bucket.aclose()
        assert errors == []
        assert sum(passed) == 50

    async def test_refills_at_rate_after_the_burst(self, redis_url) -> None:
        """Burst 2 at 20/s: two taken, the third waits ~50 ms, taken after that wait."""
        bucket = RedisTokenBucket(redis_url, rate=20, burst=2, on_error=print)
        key = f"sk-{time.monotonic_ns()}"
        assert [await bucket.take(key) for _ in range(2)] == [0.0, 0.0]
        wait = await bucket.take(key)
        assert 0.03 < wait <= 0.05
        await asyncio.sleep(wait + 0.01)
        assert await bucket.take(key) == 0.0
        await bucket.aclose()

    async def test_hook_answers_429_with_retry_after(self, redis_url) -> None:
        """The hook rejects with the same 429 as the in-process limiter."""
        bucket = RedisTokenBucket(redis_url, rate=0.5, burst=1, on_error=print)
        scope = {SCOPE_KEY: f"sk-{time.monotonic_ns()}"}
        await bucket(scope)
        with pytest.raises(Rejected) as info:
            await bucket(scope)
        assert info.value.status_code == 429
        assert info.value.headers == {"retry-after": "2"}
        await bucket.aclose()

    async def test_redis_holds_no_key_material(self, redis_url) -> None:
        """Redis stores a hash of the API key, never the key."""
        key = f"sk-secret-{time.monotonic_ns()}"
        bucket = RedisTokenBucket(redis_url, rate=1, burst=1, on_error=print)
        await bucket.take(key)
        await bucket.aclose()
        client = Redis.from_url(redis_url)
        names = [k.decode() for k in await client.keys("*")]
        await client.aclose()
        assert bucket_key(key) in names
        assert not any(key in n for n in names)

    async def test_unreachable_redis_lets_requests_through_and_reports(self, port_factory) -> None:
        """Redis down: the request passes (fail open) and the error is reported."""
        errors: list[BaseException] = []
        bucket = RedisTokenBucket(
            f"redis://127.0.0.1:{port_factory()}/0", rate=1, burst=1, on_error=errors.append
        )
        scope = {SCOPE_KEY: "sk-any"}
        await bucket(scope)
        await bucket(scope)
        assert len(errors) == 2
        await bucket.aclose()

    async def test_a_malformed_url_fails_at_start_without_its_password(self) -> None:
        """A URL redis-py cannot read is a ConfigurationError; the password stays out."""
        with pytest.raises(ConfigurationError) as info:
            RedisTokenBucket("http://u:hunter2@h:6379/0", rate=1, burst=1, on_error=print)
        assert "hunter2" not in str(info.value)

    async def test_without_a_url_the_bucket_is_per_process(self, monkeypatch) -> None:
        """No redis_url and no $STAGELENS_REDIS_URL: the in-process token bucket."""
        monkeypatch.delenv("STAGELENS_REDIS_URL", raising=False)
        assert isinstance(rate_limiter(None, 1, 1, print), TokenBucketLimiter)
        monkeypatch.setenv("STAGELENS_REDIS_URL", "redis://127.0.0.1:1/0")
        limiter = rate_limiter(None, 1, 1, print)
        assert isinstance(limiter, RedisTokenBucket)
        await limiter.aclose()
