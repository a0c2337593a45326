"""What tail sampling costs and saves, side by side in one run: CPU per request and bytes of
spans exported per request for always_on, the tail sampler and metrics only.

The proxy, client and measurement are ``overhead.py``'s (uvicorn, one worker, real
sockets, interleaved rounds, medians); the upstream is its 16-event stream, except that one
request in 100 is answered 503 (the proxy relays it: a failure the tail sampler must keep)
and two in 100 send their first event after 1 s (slow: ``STAGELENS_TAIL_SLOW_SECONDS`` is
set to 0.6 s, well above a fine request's time at the default concurrency of 2, even on a
shared machine). The OTLP sink counts the
bytes it receives; each variant's bytes are divided by the requests its ``/metrics`` counted.

Variants: ``bare`` (no stagelens), ``always_on`` (every trace exported), ``tail``
(``OTEL_TRACES_SAMPLER=stagelens_tail``, ``OTEL_TRACES_SAMPLER_ARG`` = ``--ratio``, default
0.01), ``metrics`` (``always_off``: no trace at all).

    .venv/bin/python benchmarks/tail_sampling.py [--rounds 3] [--seconds 4] [--concurrency 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from overhead import (  # the same proxy, client and measurement, one definition
    CHUNKS,
    free_port,
    measure,
    proxy_env,
    serve,
    wait_up,
    write_programs,
)

VARIANTS = ("bare", "always_on", "tail", "metrics")

UPSTREAM = textwrap.dedent(
    """
    import asyncio, itertools, json
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    USAGE = {"prompt_tokens": 300, "completion_tokens": CHUNKS, "total_tokens": 300 + CHUNKS,
             "prompt_tokens_details": {"cached_tokens": 128}}
    METRICS = {"time_to_first_token_ms": 5.0, "generation_time_ms": 20.0, "queue_time_ms": 0.1}
    served = itertools.count()

    async def chat(request):
        body = await request.json()
        n = next(served)
        if n % 100 == 50:  # 1 %: refused, as an overloaded engine
            return JSONResponse({"error": {"message": "overloaded", "code": 503}}, 503)
        slow = n % 50 == 25  # 2 %: first event late
        async def events():
            if slow:
                await asyncio.sleep(1.0)
            for i in range(CHUNKS):
                chunk = {"id": "chatcmpl-1", "model": body["model"], "choices": [
                    {"index": 0, "delta": {"content": f"tok{i} "},
                     "finish_reason": "length" if i == CHUNKS - 1 else None}]}
                yield f"data: {json.dumps(chunk)}\\n\\n"
            if (body.get("stream_options") or {}).get("include_usage"):
                final = {"id": "chatcmpl-1", "model": body["model"], "choices": [],
                         "usage": USAGE, "metrics": METRICS}
                yield f"data: {json.dumps(final)}\\n\\n"
            yield "data: [DONE]\\n\\n"
        return StreamingResponse(events(), media_type="text/event-stream")

    app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])
    """
)

SINK = textwrap.dedent(
    """
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    received = {"bytes": 0, "posts": 0}

    async def traces(request):
        received["bytes"] += len(await request.body())
        received["posts"] += 1
        return Response(b"", media_type="application/x-protobuf")

    async def count(request):
        return JSONResponse(received)

    app = Starlette(routes=[Route("/v1/traces", traces, methods=["POST"]),
                            Route("/count", count)])
    """
)


def _env(variant: str, up: int, sink: int, ratio: float) -> dict[str, str]:
    if variant == "bare":
        return proxy_env("bare", up, sink)
    if variant == "metrics":
        return proxy_env("metrics", up, sink)
    env = proxy_env("stagelens", up, sink)
    if variant == "tail":
        env["OTEL_TRACES_SAMPLER"] = "stagelens_tail"
        env["OTEL_TRACES_SAMPLER_ARG"] = str(ratio)
    env["STAGELENS_TAIL_SLOW_SECONDS"] = "0.6"
    return env


def _scrape(url: str) -> tuple[float, dict[str, float]]:
    """Requests counted and the tail sampler's decisions, from the proxy's ``/metrics``."""
    requests, decisions = 0.0, {}
    for line in httpx.get(url, timeout=10).text.splitlines():
        if line.startswith("stagelens_requests_total{"):
            requests += float(line.rsplit(" ", 1)[1])
        elif line.startswith("stagelens_trace_decisions_total{"):
            decisions[line.split("{", 1)[1].split("}", 1)[0]] = float(line.rsplit(" ", 1)[1])
    return requests, decisions


def _sink_bytes(port: int) -> float:
    return float(httpx.get(f"http://127.0.0.1:{port}/count", timeout=10).json()["bytes"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--ratio", type=float, default=0.01)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    args = parser.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    work = write_programs(Path(tempfile.mkdtemp(prefix="stagelens-tail-")))
    (work / "bench_upstream.py").write_text(UPSTREAM.replace("CHUNKS", str(CHUNKS)))
    (work / "bench_sink.py").write_text(SINK)
    up, sink = free_port(), free_port()
    procs = [serve(work, "bench_upstream", up, {}), serve(work, "bench_sink", sink, {})]
    rows: dict[str, list[tuple[float, float, float]]] = {v: [] for v in variants}
    decided: dict[str, dict[str, float]] = {}
    try:
        wait_up(f"http://127.0.0.1:{up}/")
        wait_up(f"http://127.0.0.1:{sink}/count")
        for r in range(args.rounds):
            for variant in variants:
                port = free_port()
                proxy = serve(work, "bench_proxy", port, _env(variant, up, sink, args.ratio))
                try:
                    wait_up(f"http://127.0.0.1:{port}/docs", timeout=180)  # a busy machine
                    before = _sink_bytes(sink)
                    rps, _p50, cpu = asyncio.run(
                        measure(
                            f"http://127.0.0.1:{port}", args.seconds, args.concurrency, proxy.pid
                        )
                    )
                    per_request = float("nan")
                    if variant != "bare":
                        time.sleep(2.5)  # the export worker's schedule delay (1 s), twice
                        served, decisions = _scrape(f"http://127.0.0.1:{port}/metrics")
                        per_request = (_sink_bytes(sink) - before) / max(served, 1)
                        for key, value in decisions.items():
                            decided.setdefault(variant, {}).setdefault(key, 0.0)
                            decided[variant][key] += value
                finally:
                    proxy.terminate()
                    proxy.wait(10)
                rows[variant].append((rps, cpu, per_request))
                print(
                    f"round {r + 1}/{args.rounds} {variant:9s} {rps:7.1f} req/s  "
                    f"cpu {cpu * 1000:5.2f} ms/req  {per_request:8.1f} B/req",
                    flush=True,
                )
    finally:
        for p in procs:
            p.terminate()
            p.wait(10)
    base_cpu = statistics.median(x[1] for x in rows["bare"]) if "bare" in rows else None
    on_bytes = statistics.median(x[2] for x in rows["always_on"]) if "always_on" in rows else None
    print()
    print(f"{'variant':9s} {'req/s':>8s} {'cpu ms/req':>11s} {'vs bare':>8s} {'B/req':>9s} "
          f"{'vs always_on':>13s}")  # fmt: skip
    summary = {}
    for variant in variants:
        rps = statistics.median(x[0] for x in rows[variant])
        cpu = statistics.median(x[1] for x in rows[variant])
        per_request = statistics.median(x[2] for x in rows[variant])
        cpu_ratio = cpu / base_cpu if base_cpu else float("nan")
        bytes_ratio = per_request / on_bytes if on_bytes else float("nan")
        summary[variant] = {
            "rps": rps,
            "cpu_ms_per_request": cpu * 1000,
            "cpu_vs_bare": cpu_ratio,
            "bytes_per_request": per_request,
            "bytes_vs_always_on": bytes_ratio,
        }
        print(
            f"{variant:9s} {rps:8.1f} {cpu * 1000:11.3f} {cpu_ratio:8.3f} {per_request:9.1f} "
            f"{bytes_ratio:13.4f}"
        )
    if "tail" in decided:
        print()
        print("tail sampler decisions (all rounds):")
        for key, value in sorted(decided["tail"].items()):
            print(f"  {key:45s} {value:8.0f}")
    print()
    print(json.dumps({"summary": summary, "decisions": decided.get("tail", {})}))


if __name__ == "__main__":
    main()
