"""Sizing inputs, measured: Prometheus series per gateway replica and OTLP span bytes per request.

Runs the reference gateway (in-process, telemetry captured in memory) in front of real vLLM
(the tiny model on CPU, or ``--vllm-url``), sends a mixed run (streamed and not, several
tenants, some requests for a model that does not exist), then counts:

- the series the gateway's ``/metrics`` exposes, by family, and how many belong to one
  model (what each more served model adds);
- the spans of one request and their size encoded as OTLP protobuf (what the exporter sends).

and prints what that means at 1,000 requests per second. docs/sizing.md quotes its output.

    .venv/bin/python benchmarks/sizing.py [--requests 200] [--vllm-url URL]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from prometheus_client import generate_latest
from stagelens.reference import create_app, demo_config
from stagelens.reference.config import DEMO_API_KEY

from stagelens.testing import capture_telemetry

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _vllm_stack import free_port, tiny_vllm

RATE = 1000
"""Requests per second the printed estimate is for."""
SCRAPE_SECONDS = 15
"""Scrape interval of the printed estimate (the generated monitors use 15s)."""


async def _traffic(url: str, n: int) -> int:
    """``n`` requests, 4 at a time, with the demo's key (one tenant): streamed and not, to both
    served models, one in ten for a model that does not exist (a 404). Returns the 200s."""
    prefix = "You are a helpful assistant that answers briefly. " * 20
    ok = 0

    async def one(client: httpx.AsyncClient, i: int) -> None:
        nonlocal ok
        body: dict[str, Any] = {
            "model": "nope" if i % 10 == 9 else ("tiny" if i % 3 else "tiny-chat"),
            "messages": [{"role": "user", "content": f"{prefix} question {i}"}],
            "max_tokens": 16,
            "stream": bool(i % 2),
        }
        response = await client.post("/v1/chat/completions", json=body)
        await response.aread()
        ok += response.status_code == 200

    headers = {"Authorization": f"Bearer {DEMO_API_KEY}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=120) as client:
        for start in range(0, n, 4):
            await asyncio.gather(*(one(client, i) for i in range(start, min(n, start + 4))))
    return ok


def _series(text: str) -> tuple[Counter[str], int, int]:
    """Series per family of an exposition, series with model="tiny", and the total."""
    families: Counter[str] = Counter()
    per_model = 0
    total = 0
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name = line.split("{")[0].split(" ")[0]
        for suffix in ("_bucket", "_count", "_sum", "_created", "_total"):
            if name.endswith(suffix):
                name = name[: -len(suffix)]
        families[name] += 1
        total += 1
        per_model += 'model="tiny"' in line
    return families, per_model, total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--vllm-url", default=None)
    args = parser.parse_args()
    with tiny_vllm(args.vllm_url) as (vllm_url, model), capture_telemetry() as capture:
        app = create_app(demo_config([vllm_url], model), telemetry=capture.telemetry)
        port = free_port()
        server = uvicorn.Server(uvicorn.Config(app, port=port, log_level="warning"))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        while not server.started:
            time.sleep(0.05)
        try:
            ok = asyncio.run(_traffic(f"http://127.0.0.1:{port}", args.requests))
            time.sleep(1)  # the last requests' ends are recorded
            spans = capture.spans()
            text = generate_latest(capture.telemetry.exposition_registry).decode()
        finally:
            server.should_exit = True
            thread.join(timeout=10)
    families, per_model, total = _series(text)
    stagelens = sum(n for f, n in families.items() if f.startswith("stagelens_"))
    roots = [s for s in spans if s.parent is None]
    encoded = len(encode_spans(spans).SerializeToString())
    per_request = encoded / max(1, len(roots))
    print(f"requests: {args.requests} sent, {ok} answered 200, {len(roots)} traces")
    print(f"series on /metrics: {total} ({stagelens} stagelens_*), {per_model} with model=tiny")
    for family, n in families.most_common(8):
        print(f"  {family}: {n}")
    print(f"spans: {len(spans)} ({len(spans) / max(1, len(roots)):.1f} per request)")
    print(f"OTLP protobuf: {encoded} bytes, {per_request:.0f} bytes per request")
    print(
        f"at {RATE} requests/s: {per_request * RATE / 1e6:.2f} MB/s of spans "
        f"({per_request * RATE * 86400 / 1e9:.0f} GB/day) before any sampling; "
        f"{total / SCRAPE_SECONDS:.0f} samples/s per replica scraped every {SCRAPE_SECONDS}s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
