"""One of two backends freezes (a TCP proxy in front of the real vLLM server stops
forwarding: connections accepted, nothing answered, like a SIGSTOPped server): requests
arriving after the freeze finish on the other backend, with no admission timeout, whether
the health check marks it down (releasing the requests waiting on it) or only the
per-attempt first-byte timeout notices."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from stagelens.reference import GatewayConfig

pytestmark = pytest.mark.vllm


class FreezableProxy:
    """Forwards TCP connections on a loopback port to ``target``; :meth:`freeze` makes it
    accept and read as before but forward nothing, either way, on old and new connections."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        self.frozen = threading.Event()
        self.closed = threading.Event()
        self.sockets: list[socket.socket] = []
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def freeze(self) -> None:
        self.frozen.set()

    def close(self) -> None:
        self.closed.set()
        self.frozen.clear()
        for sock in [self.server, *self.sockets]:
            with contextlib.suppress(OSError):
                sock.close()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            self.connections += 1
            upstream = socket.create_connection(self.target)
            self.sockets += [client, upstream]
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(src, dst), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                while self.frozen.is_set():  # hold what arrived: never forwarded
                    time.sleep(0.05)
                if self.closed.is_set():
                    return
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


@pytest.fixture
def proxy(vllm_server: Any) -> Iterator[FreezableProxy]:
    """A freezable proxy in front of the session's vLLM server (the second backend)."""
    proxy = FreezableProxy(("127.0.0.1", vllm_server.port))
    yield proxy
    proxy.close()


def _config(proxy: FreezableProxy, vllm_server: Any, tiny_model: Any, **over: Any) -> Any:
    data = {
        "api_keys": {"sk-good": "acme"},
        "models": {
            "tiny": {
                "backends": [proxy.url, vllm_server.base_url],
                "tokenizer": str(tiny_model),
                "max_inflight": 4,
                "admission_timeout_seconds": 5.0,
            }
        },
        "balancing": "least_outstanding",
        "rate_limit_per_second": 1000,
        "rate_limit_burst": 1000,
        "upstream_timeout_seconds": 20,
        **over,
    }
    return GatewayConfig.model_validate(data)


async def _after_freeze(url: str, proxy: FreezableProxy, n: int) -> list[tuple[int, float, str]]:
    """Traffic through both backends, then the freeze, then ``n`` requests 8 at a time:
    (status, seconds on the client's clock, body) of each of those."""
    headers = {"authorization": "Bearer sk-good"}

    async def one(client: httpx.AsyncClient, i: int) -> tuple[int, float, str]:
        body = {
            "model": "tiny",
            "max_tokens": 8,
            "stream": i % 2 == 0,
            "messages": [{"role": "user", "content": f"frozen {i}"}],
        }
        t0 = time.perf_counter()
        r = await client.post("/v1/chat/completions", json=body)
        return r.status_code, time.perf_counter() - t0, r.text

    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as client:
        warm = await asyncio.gather(*(one(client, i) for i in range(8)))
        assert [s for s, _, _ in warm] == [200] * 8, warm
        assert proxy.connections > 0  # the proxy's backend served before the freeze
        proxy.freeze()
        results: list[tuple[int, float, str]] = []
        for start in range(0, n, 8):
            results += await asyncio.gather(*(one(client, i) for i in range(start, start + 8)))
    return results


def _all_answered_p99(results: list[tuple[int, float, str]], n: int) -> float:
    """Assert all ``n`` requests after the freeze answered 200; their p99 on the client's
    clock, seconds."""
    statuses = [status for status, _, _ in results]
    assert statuses == [200] * n, [r for r in results if r[0] != 200][:3]
    ordered = sorted(seconds for _, seconds, _ in results)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


class TestFrozenBackend:
    """One of two backends frozen mid-run (sync tests driving an asyncio client)."""

    def test_marked_down_backend_releases_its_waiting_requests(
        self, proxy, vllm_server, tiny_model, gateway_factory
    ) -> None:
        """With the health check on (0.5 s), requests caught waiting on the frozen backend
        fail over once it is marked down, and every request after the freeze answers 200
        from the other backend: no admission timeout, no upstream timeout."""
        config = _config(proxy, vllm_server, tiny_model, health_interval_seconds=0.5)
        with gateway_factory(config) as gw:
            results = asyncio.run(_after_freeze(gw.url, proxy, 32))
        p99 = _all_answered_p99(results, 32)
        print(f"\nfrozen backend, marked down by the health check: p99 {p99:.2f} s")
        assert p99 < 5.0  # the admission timeout: nobody waited that long

    def test_first_byte_timeout_fails_over_without_the_health_check(
        self, proxy, vllm_server, tiny_model, gateway_factory
    ) -> None:
        """With the health check too slow to notice (60 s), a request that got no first
        byte from the frozen backend within the first-byte timeout (1 s) is sent to the
        other one: every request after the freeze answers 200."""
        config = _config(
            proxy,
            vllm_server,
            tiny_model,
            health_interval_seconds=60,
            upstream_first_byte_timeout_seconds=1.0,
        )
        with gateway_factory(config) as gw:
            results = asyncio.run(_after_freeze(gw.url, proxy, 24))
        p99 = _all_answered_p99(results, 24)
        print(f"\nfrozen backend, first-byte timeout 1 s only: p99 {p99:.2f} s")
