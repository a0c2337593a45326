"""Request-path cost of stagelens, paired in one process: bare vs instrumented, block by block.

Why beside ``overhead.py``: on a shared 2-core machine the whole-process benchmark swings by
10-20 points between rounds (bare alone ranged 323-439 req/s in one run), which hides
changes of a few percent. Here the same proxy app as ``overhead.py`` is loaded twice in one
process (bare, and the chosen variant), its upstream is an in-memory transport streaming the
same 16 SSE chunks + usage + ``[DONE]``, and requests are driven straight through ASGI in
alternating blocks (A B B A ...), so drift hits both alike. Figures are the event-loop
thread's CPU per request: the request path only. The export worker's share (encoding,
HTTP) is not in it (spans are queued and handed to no exporter); ``overhead.py`` measures
whole processes.

    .venv/bin/python benchmarks/overhead_paired.py [--variant metrics|stagelens]
        [--blocks 24] [--requests 300]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from overhead import APIS, CHUNKS, PROXY, UPSTREAM  # the same programs, one definition


def events_of(api: str = "chat", chunks: int = CHUNKS) -> list[bytes]:
    """The upstream of ``overhead.py`` streaming ``chunks`` content events of ``api``
    (``overhead.APIS``; chat with its usage event, as the proxy asks), one ``bytes`` per
    SSE event: its own code run once in memory, so both benchmarks serve the same events."""
    module = ModuleType("bench_upstream_in_memory")
    exec(compile(UPSTREAM.replace("CHUNKS", str(chunks)), "bench_upstream", "exec"), vars(module))
    path, body = APIS[api]
    if api == "chat":
        body = {**body, "stream_options": {"include_usage": True}}

    async def fetch() -> bytes:
        transport = httpx.ASGITransport(app=module.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://upstream") as c:
            response = await c.post(path, json=body)
            response.raise_for_status()
            return response.content

    whole = asyncio.run(fetch())
    return [event + b"\n\n" for event in whole.split(b"\n\n") if event]


EVENTS = events_of()


class _Stream(httpx.AsyncByteStream):
    def __init__(self, events: Sequence[bytes]) -> None:
        self.events = events

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for event in self.events:
            yield event


class _Upstream(httpx.AsyncBaseTransport):
    """The streaming upstream of ``overhead.py``, in memory: each event its own chunk."""

    def __init__(self, events: Sequence[bytes]) -> None:
        self.events = events

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        await request.aread()
        headers = {"content-type": "text/event-stream"}
        return httpx.Response(200, headers=headers, stream=_Stream(self.events))


def load_proxy(path: Path, variant: str, events: Sequence[bytes] = EVENTS) -> Any:
    """The proxy app of ``path`` (``overhead.PROXY``) for ``variant``, its upstream swapped
    for the in-memory one serving ``events`` (also ``overhead_bytecodes.py``'s)."""
    os.environ["BENCH_VARIANT"] = variant
    spec = importlib.util.spec_from_file_location(f"bench_proxy_{variant}", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {path}")
    module: ModuleType = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    transport = module.client._transport
    if hasattr(transport, "wrapped"):  # instrumented: keep stagelens' wrapper
        transport.wrapped = _Upstream(events)
    else:
        module.client._transport = _Upstream(events)
    return module.app


SCOPE: dict[str, Any] = {
    "type": "http",
    "asgi": {"version": "3.0", "spec_version": "2.3"},
    "http_version": "1.1",
    "method": "POST",
    "scheme": "http",
    "query_string": b"",
    "root_path": "",
    "headers": [(b"host", b"proxy"), (b"content-type", b"application/json")],
    "client": ("127.0.0.1", 50000),
    "server": ("127.0.0.1", 8000),
}


async def one_request(
    app: Any, headers: Sequence[tuple[bytes, bytes]] = (), api: str = "chat"
) -> None:
    """One streamed request of ``api`` (``overhead.APIS``) straight through the ASGI
    ``app``, ``headers`` added to the scope's; SystemExit unless it answers 200."""
    path, asked = APIS[api]
    body = json.dumps(asked).encode()
    sent = False
    never = asyncio.Event()

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await never.wait()  # the client stays until the response ends
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start" and message["status"] != 200:
            raise SystemExit(f"proxy answered {message['status']}")

    scope = {**SCOPE, "path": path, "raw_path": path.encode()}
    if headers:
        scope["headers"] = [*SCOPE["headers"], *headers]
    await app(scope, receive, send)


async def _run(apps: dict[str, Any], blocks: int, requests: int) -> dict[str, list[float]]:
    for app in apps.values():
        for _ in range(200):  # warm-up: caches, first-use imports
            await one_request(app)
    per_request: dict[str, list[float]] = {name: [] for name in apps}
    order = list(apps.items())
    for block in range(blocks):
        for name, app in order if block % 2 == 0 else reversed(order):
            t0 = time.thread_time()
            for _ in range(requests):
                await one_request(app)
            per_request[name].append((time.thread_time() - t0) / requests)
        print(f"block {block + 1}/{blocks}", end="\r", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    return per_request


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variant", choices=("metrics", "stagelens"), default="metrics")
    parser.add_argument("--blocks", type=int, default=24)
    parser.add_argument("--requests", type=int, default=300)
    args = parser.parse_args()
    os.environ["OTEL_TRACES_SAMPLER"] = "always_off" if args.variant == "metrics" else "always_on"
    os.environ.setdefault("OTEL_SERVICE_NAME", "bench-proxy")
    os.environ.setdefault("STAGELENS_GPU_COLLECTOR", "0")
    # Spans are recorded and queued as always; the worker exports them nowhere, because
    # its share is off the request path (and a dead default endpoint would measure the
    # dead-collector path instead: a full queue).
    os.environ.setdefault("OTEL_TRACES_EXPORTER", "none")
    os.environ["BENCH_UPSTREAM"] = "http://upstream.invalid"
    path = Path(tempfile.mkdtemp(prefix="stagelens-paired-")) / "bench_proxy.py"
    path.write_text(PROXY)
    apps = {"bare": load_proxy(path, "bare"), args.variant: load_proxy(path, args.variant)}
    result = asyncio.run(_run(apps, args.blocks, args.requests))
    bare, other = result["bare"], result[args.variant]
    deltas = [b - a for a, b in zip(bare, other, strict=True)]
    us = 1e6
    print(f"{'':10s} {'median':>9s} {'min':>9s}   (event-loop CPU per request)")
    for name in ("bare", args.variant):
        values = result[name]
        print(f"{name:10s} {statistics.median(values) * us:7.1f}us {min(values) * us:7.1f}us")
    added = statistics.median(deltas)
    print(
        f"added by {args.variant}: {added * us:+.1f} us per request (median of {len(deltas)} "
        f"paired blocks; {min(deltas) * us:+.1f} .. {max(deltas) * us:+.1f}), "
        f"{added / statistics.median(bare) * 100:+.1f} % of this bare in-process proxy"
    )


if __name__ == "__main__":
    main()
