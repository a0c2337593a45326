"""Load balancing across the backends of a pool, with active and passive health checks.

Why both: active checks (``GET /health`` every few seconds) bring a backend back; passive
marking (a connection error on a real request) takes a dead one out at once, so a request
that hit it can fail over without waiting for the next check.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import Iterable, Iterator

import anyio
import httpx

from stagelens import Rejected


class Backend:
    """One vLLM server: URL, requests in flight, health.

    Marking a backend down (``healthy = False``, by the health check or a failed call)
    cancels every attempt still waiting on it for its first byte (:meth:`waiting_on`): they
    fail over at once instead of holding their admission slots until a timeout.
    """

    __slots__ = ("_healthy", "_waiting", "outstanding", "url")

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self.outstanding = 0
        self._healthy = True
        self._waiting: set[anyio.CancelScope] = set()

    @property
    def healthy(self) -> bool:
        return self._healthy

    @healthy.setter
    def healthy(self, value: bool) -> None:
        self._healthy = value
        if not value:
            for scope in self._waiting:
                scope.cancel()

    @contextlib.contextmanager
    def waiting_on(self, scope: anyio.CancelScope) -> Iterator[None]:
        """While inside, ``scope`` is cancelled when this backend is marked down (or
        at once, when it already is)."""
        if not self._healthy:
            scope.cancel()
        self._waiting.add(scope)
        try:
            yield
        finally:
            self._waiting.discard(scope)

    def __repr__(self) -> str:
        return f"Backend({self.url!r}, outstanding={self.outstanding}, healthy={self.healthy})"


def _score(url: str, key: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{url}|{key}".encode(), digest_size=8).digest(), "big")


class Balancer:
    """Chooses a healthy backend: least outstanding requests, or prefix affinity
    (rendezvous hashing of the prompt prefix, so a repeated prefix lands where its KV
    cache already is, and only the keys of a lost backend move)."""

    def __init__(self, backends: Iterable[Backend], mode: str) -> None:
        self.backends = list(backends)
        self.mode = mode

    def choose(self, prefix: str, exclude: Iterable[Backend] = ()) -> Backend:
        """A healthy backend not in ``exclude``; 503 when there is none."""
        excluded = set(map(id, exclude))
        candidates = [b for b in self.backends if b.healthy and id(b) not in excluded]
        if not candidates:
            raise Rejected(
                503,
                "No healthy backend for this model.",
                type="server_error",
                code="no_healthy_backend",
            )
        if self.mode == "prefix_affinity":
            return max(candidates, key=lambda b: _score(b.url, prefix))
        return min(candidates, key=lambda b: b.outstanding)

    def assign(self, prefix: str, exclude: Iterable[Backend] = ()) -> Backend:
        """:meth:`choose`, counting the request as outstanding on the backend at once: a
        request still waiting for admission is already that backend's load, so the next
        choice sees it (the caller decrements ``outstanding`` when the request ends)."""
        backend = self.choose(prefix, exclude)
        backend.outstanding += 1
        return backend


class HealthChecker:
    """Polls every backend's ``/health`` in the background."""

    def __init__(self, backends: Iterable[Backend], interval: float) -> None:
        self.backends = list(backends)
        self.interval = interval
        self._task: asyncio.Task[None] | None = None

    async def check_once(self, client: httpx.AsyncClient) -> None:
        async def one(backend: Backend) -> None:
            try:
                r = await client.get(f"{backend.url}/health", timeout=2.0)
                backend.healthy = r.status_code == 200
            except httpx.HTTPError:
                backend.healthy = False

        await asyncio.gather(*(one(b) for b in self.backends))

    async def _run(self) -> None:
        async with httpx.AsyncClient() as client:
            while True:
                await self.check_once(client)
                await asyncio.sleep(self.interval)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
