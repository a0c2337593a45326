"""Whole-process CPU cost of stagelens per request, as instructions counted by valgrind.

Why beside ``overhead.py``: on a shared 2-core VM whole-process timings swing by 10-40 %
between rounds (bare alone ranged 387-540 req/s in one run), which hides the few percent
the targets are about. Instructions retired are deterministic: the same proxy, upstream and
requests give the same count to a fraction of a percent, so ratios of a few percent are
measurable. For a CPU-bound proxy, throughput is inversely proportional to CPU per request,
so ``1 / (instructions ratio)`` is the throughput ratio the instrumentation leaves
(instructions are a proxy for time: they do not weigh cache misses or lock waits, and only
user-space ones count: the kernel's socket work, a share of the bare proxy's cost, is left
out, so the ratios are upper bounds on the overhead).

The proxy of ``overhead.py`` (uvicorn, one worker, real sockets) runs under
``valgrind --tool=cachegrind --cache-sim=no``; the upstream (16 SSE chunks) and the OTLP
sink run natively. Each variant runs twice, serving ``--small`` and ``--large`` sequential
requests; the difference divided by the request difference is the per-request count, with
start-up and shutdown cancelled out. All threads count: the ``stagelens`` variant includes
its export worker encoding and POSTing spans (in full batches of 512, as at real speed).

    .venv/bin/python benchmarks/overhead_instructions.py [--variants bare,floor,metrics,stagelens]
        [--small 30] [--large 230] [--events 16]

``--events N`` makes the upstream stream N content events per answer (then its usage
event and ``[DONE]``): the difference between two event counts, divided by the events'
difference, is the cost of one streamed event (``--events 16`` and ``--events 1000
--small 4 --large 14`` take about the same time).

Needs ``valgrind`` (Debian package); a run takes ~3 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from overhead import free_port, one, proxy_env, serve, wait_up, write_programs

_IREFS = re.compile(r"I\s+refs:\s+([\d,]+)")


def _count(work: Path, variant: str, requests: int, upstream: int, sink: int) -> int:
    """Instructions of one proxy process that served ``requests`` requests, start to exit."""
    port = free_port()
    env = {
        **proxy_env(variant, upstream, sink),
        "STAGELENS_GPU_COLLECTOR": "0",
        # Under valgrind requests are ~50x slower, so the 1 s export timer would fire every
        # few requests and POST tiny batches a real-speed proxy never sends (it fills a
        # 512-span batch in well under a second). Full batches only, as at real speed;
        # what is left goes out in the shutdown flush of both runs.
        "OTEL_BSP_SCHEDULE_DELAY": "3600000",
        # One string hash layout for every run: with random ones, counts moved by ~0.5 %.
        "PYTHONHASHSEED": "0",
    }
    valgrind = (
        "valgrind",
        "--tool=cachegrind",
        "--cache-sim=no",
        "--cachegrind-out-file=/dev/null",
    )
    proc = serve(work, "bench_proxy", port, env, prefix=valgrind, stderr=subprocess.PIPE)
    try:
        wait_up(f"http://127.0.0.1:{port}/docs", timeout=300)

        async def drive() -> None:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=120) as c:
                for _ in range(requests):
                    await one(c)

        asyncio.run(drive())
    finally:
        proc.terminate()  # uvicorn shuts down cleanly: the lifespan flush runs, valgrind reports
        _, raw = proc.communicate(timeout=300)
    err = raw.decode(errors="replace")
    found = _IREFS.search(err)
    if found is None:
        raise SystemExit(f"no instruction count from valgrind for {variant}:\n{err[-2000:]}")
    return int(found.group(1).replace(",", ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variants", default="bare,floor,metrics,stagelens")
    parser.add_argument("--small", type=int, default=30)
    parser.add_argument("--large", type=int, default=230)
    parser.add_argument("--events", type=int, default=16, help="content events per answer")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    if args.large <= args.small:
        raise SystemExit("--large must exceed --small")
    variants = [v for v in args.variants.split(",") if v]
    work = write_programs(Path(tempfile.mkdtemp(prefix="stagelens-instr-")), args.events)
    up_port, sink_port = free_port(), free_port()
    servers = [serve(work, "bench_upstream", up_port, {}), serve(work, "bench_sink", sink_port, {})]
    per_request: dict[str, float] = {}
    try:
        wait_up(f"http://127.0.0.1:{up_port}/")
        wait_up(f"http://127.0.0.1:{sink_port}/")
        jobs = [(v, n) for v in variants for n in (args.small, args.large)]
        started = time.monotonic()
        with ThreadPoolExecutor(max_workers=2) as pool:  # one valgrind per core
            counts = dict(
                zip(
                    jobs,
                    pool.map(lambda j: _count(work, j[0], j[1], up_port, sink_port), jobs),
                    strict=True,
                )
            )
        for variant in variants:
            small, large = counts[(variant, args.small)], counts[(variant, args.large)]
            per_request[variant] = (large - small) / (args.large - args.small)
            print(f"{variant:10s} {per_request[variant] / 1e6:7.3f} M instructions per request")
        print(f"({args.events} content events per answer)")
        print(f"({len(jobs)} valgrind runs in {time.monotonic() - started:.0f} s)")
    finally:
        for p in servers:
            p.terminate()
            p.wait(10)
    base = per_request.get("bare")
    if base:
        print()
        print(f"{'variant':10s} {'instr/req':>10s} {'vs bare':>8s} {'throughput left':>16s}")
        for variant, n in per_request.items():
            print(f"{variant:10s} {n / 1e6:9.3f}M {n / base:8.3f} {base / n:16.3f}")


if __name__ == "__main__":
    main()
