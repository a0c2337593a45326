"""Fuzz the reference gateway over real vLLM: status distribution and the event loop's stall.

Starts real vLLM (the tiny model on CPU, or ``--vllm-url``) and the gateway in a process of
its own (``create_app`` on uvicorn, the default telemetry) with a loop-lag probe: a task
that sleeps 5 ms at a time and records how late it wakes up, from the moment the gateway
has started. Then sends ``--requests`` fuzzed requests, ``--concurrency`` at a time, drawn
by the strategies of ``tests/_fuzz.py`` (hostile headers on each):

- ``valid``: a body drawn from the chat, completions, Responses, Messages or count-tokens
  schema (at most 4 tokens), forwarded to vLLM: any answer below 500;
- ``hostile``: such a body with one hostile change (a lone surrogate, a non-finite number,
  nesting deeper than the limit, a body over ``max_body_bytes``): its 400/413 and code;
- ``random``: random bytes or random JSON: 400;
- ``big``: a chat body with a ~1 MB prompt (accepted, tokenized off the loop, refused by
  the context check): 400 ``context_length_exceeded``.

Prints the status distribution per kind, the answers that were not what the kind expects,
and the probe's worst stall; exits 1 on any answer >= 500 or a stall over 50 ms.

    nice .venv/bin/python benchmarks/fuzz_gateway.py [--requests 5000] [--vllm-url URL]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import hypothesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests._fuzz import (  # noqa: E402
    HOSTILE_HEADERS,
    HOSTILE_KINDS,
    JSON,
    ROUTES,
    bodies,
    bounded,
    error_code,
    expected_code,
    hostile,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _vllm_stack import free_port, tiny_vllm  # noqa: E402

PROBE_SECONDS = 0.005
"""The loop-lag probe's sleep: it wakes up late by as long as the loop was busy."""
MAX_BODY_BYTES = 2 * 1024 * 1024
"""The gateway's body limit here: a ~1 MB prompt is accepted (and tokenized), more is 413."""
STALL_LIMIT = 0.050
"""The worst stall the issue allows (seconds)."""
API_KEY = "sk-stagelens-demo"
PAD = "@pad@"
"""Stands for the padding of an oversized body until it is sent (not held in memory)."""


# -- the gateway process ------------------------------------------------------------------
async def _serve(config_json: str, port: int, report: Path) -> None:
    """The gateway on ``port`` with the loop-lag probe, whose figures go to ``report`` as
    JSON once a second (uvicorn ends the process with the signal that stopped it).

    Each probe interval also reads the loop thread's own CPU time and the process's: a
    stall the loop thread spent computing is the loop's doing; one during which the whole
    process hardly ran was the machine's (other processes had the CPU); one during which
    the process ran but not the loop is the loop waiting for its own threads (the GIL)."""
    import logging

    import uvicorn
    from stagelens.reference import GatewayConfig, create_app

    # A hostile baggage header makes OpenTelemetry's propagator log a warning per request.
    logging.getLogger("opentelemetry.baggage.propagation").setLevel(logging.ERROR)
    app = create_app(GatewayConfig.model_validate_json(config_json))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    lags: list[float] = []
    busy: list[float] = []
    process: list[float] = []
    walls: list[float] = []

    def write() -> None:
        ordered = sorted(lags)
        n = len(ordered)
        figures = {
            "samples": n,
            "max": ordered[-1] if n else 0.0,
            "p99": ordered[int(n * 0.99)] if n else 0.0,
            "p999": ordered[int(n * 0.999)] if n else 0.0,
            "over_10ms": sum(lag > 0.010 for lag in ordered),
            "max_busy": max(busy, default=0.0),
            # The worst stall while this process ran (its threads used at least half the
            # interval's CPU): the loop waiting for one of its own threads (the GIL).
            "max_running": max(
                (
                    lag
                    for lag, cpu, wall in zip(lags, process, walls, strict=True)
                    if cpu >= wall / 2
                ),
                default=0.0,
            ),
        }
        report.with_suffix(".tmp").write_text(json.dumps(figures))
        report.with_suffix(".tmp").replace(report)

    async def probe() -> None:
        while not server.started:
            await asyncio.sleep(0.05)
        perf_counter, thread_time, process_time = (
            time.perf_counter,
            time.thread_time,
            time.process_time,
        )
        last_write = perf_counter()
        while True:
            t0, c0, p0 = perf_counter(), thread_time(), process_time()
            await asyncio.sleep(PROBE_SECONDS)
            wall = perf_counter() - t0
            lags.append(wall - PROBE_SECONDS)
            busy.append(thread_time() - c0)
            process.append(process_time() - p0)
            walls.append(wall)
            if perf_counter() - last_write > 1.0:
                write()
                last_write = perf_counter()

    task = asyncio.get_running_loop().create_task(probe())
    await server.serve()
    task.cancel()


@contextlib.contextmanager
def _gateway(vllm_url: str, model: str, workdir: Path) -> Iterator[tuple[str, Path]]:
    """(URL, report file) of the gateway process over ``vllm_url``; stopped with SIGTERM."""
    from stagelens.reference import demo_config

    config = demo_config(
        [vllm_url],
        model,
        api_key=API_KEY,
        rate_limit_per_second=100_000,
        rate_limit_burst=100_000,
        max_body_bytes=MAX_BODY_BYTES,
    )
    port = free_port()
    report = workdir / "loop-lag.json"
    env = {
        **os.environ,
        "STAGELENS_LEDGER_URL": f"sqlite://{workdir / 'ledger.sqlite3'}",
        "PYTHONPATH": str(REPO),
    }
    command = [sys.executable, __file__, "serve", config.model_dump_json(), str(port), str(report)]
    proc = subprocess.Popen(command, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            assert proc.poll() is None, "the gateway process exited"
            assert time.monotonic() < deadline, "the gateway did not start"
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            time.sleep(0.2)
        yield url, report
    finally:
        proc.terminate()
        proc.wait(timeout=60)


# -- the cases ------------------------------------------------------------------------------
Case = tuple[str, str, bytes, dict[str, Any], int | None, str | None]
"""(kind, path, body, headers, expected status or None for any below 500, expected code)."""

MIX = ["valid", "hostile", "random", "valid", "hostile"] * 3 + ["valid"] * 3 + ["random", "hostile"]
"""The kinds of case in turn (20: 9 valid, 7 hostile, 4 random)."""
GENERATED = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/responses",
    "/v1/messages",
    "/v1/messages/count_tokens",
)
"""The routes fuzzed: only the chat server runs here (one vLLM at a time on this machine)."""


def draw_cases(n: int, seed: int) -> list[Case]:
    """``n`` cases drawn by hypothesis (generation only, no shrinking): each example draws
    a case of every kind, and the kind kept is set by its position (45 % valid, 35 %
    hostile, each change in turn, 20 % random), since hypothesis' own choices favour the
    first of a list; a ~1 MB prompt in one case of 250."""
    drawn_cases: list[dict[str, Case]] = []

    @settings(
        max_examples=n,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @hypothesis.seed(seed)
    @given(data=st.data())
    def draw(data: st.DataObject) -> None:
        path = data.draw(st.sampled_from(GENERATED))
        kind, model = ROUTES[path]
        headers = data.draw(HOSTILE_HEADERS)
        drawn = bounded(data.draw(bodies(kind)), model, path)
        each: dict[str, Case] = {
            "valid": ("valid", path, json.dumps(drawn).encode(), headers, None, None)
        }
        for how in HOSTILE_KINDS:
            case = data.draw(hostile(drawn, 16, how))
            raw = case.raw
            if how == "oversize":  # padded over the gateway's limit when it is sent
                raw = json.dumps({**drawn, "x-pad": PAD}).encode()
            each[how] = (f"hostile:{how}", path, raw, headers, case.status, case.code)
        raw = data.draw(st.binary(max_size=64) | JSON.map(lambda v: json.dumps(v).encode()))
        each["random"] = ("random", path, raw, headers, 400, None)
        drawn_cases.append(each)

    draw()
    content = "lorem ipsum dolor " * 58_000  # ~1 MB
    body = {"model": "tiny", "messages": [{"role": "user", "content": content}]}
    big: Case = ("big", GENERATED[0], json.dumps(body).encode(), {}, 400, "context_length_exceeded")
    cases = []
    for i, each in enumerate(drawn_cases[:n]):
        kind = MIX[i % len(MIX)]
        if kind == "hostile":
            kind = HOSTILE_KINDS[(i // len(MIX)) % len(HOSTILE_KINDS)]
        cases.append(big if i % 250 == 249 else each[kind])
    return cases


async def _send(url: str, cases: list[Case], concurrency: int) -> tuple[Counter[str], list[str]]:
    statuses: Counter[str] = Counter()
    unexpected: list[str] = []
    queue = iter(cases)

    async def worker(client: httpx.AsyncClient) -> None:
        for kind, path, raw, headers, status, code in queue:
            if kind == "hostile:oversize":
                raw = raw.replace(PAD.encode(), b"x" * (MAX_BODY_BYTES + 1))
            response = await client.post(path, content=raw, headers=headers)
            text = (await response.aread()).decode(errors="replace")
            statuses[f"{kind} {response.status_code}"] += 1
            if response.status_code >= 500:
                unexpected.append(f"{kind} {response.status_code}: {text[:200]}")
            elif status is not None and response.status_code != status:
                unexpected.append(f"{kind} {response.status_code} != {status}: {text[:200]}")
            elif code is not None and error_code(path, json.loads(text)) != expected_code(
                path, response.status_code, code
            ):
                unexpected.append(f"{kind} code != {code}: {text[:200]}")

    headers = {"authorization": f"Bearer {API_KEY}"}
    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=120, limits=limits) as c:
        await asyncio.gather(*(worker(c) for _ in range(concurrency)))
    return statuses, unexpected


def main() -> int:
    if len(sys.argv) == 5 and sys.argv[1] == "serve":
        asyncio.run(_serve(sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--seed", type=int, default=19)
    parser.add_argument("--vllm-url", default=None)
    args = parser.parse_args()
    t0 = time.monotonic()
    cases = draw_cases(args.requests, args.seed)
    print(f"drew {len(cases)} cases in {time.monotonic() - t0:.1f}s", flush=True)
    with (
        tempfile.TemporaryDirectory() as tmp,
        tiny_vllm(args.vllm_url) as (vllm_url, model),
    ):
        with _gateway(vllm_url, model, Path(tmp)) as (url, report):
            t0 = time.monotonic()
            statuses, unexpected = asyncio.run(_send(url, cases, args.concurrency))
            wall = time.monotonic() - t0
        lag = json.loads(report.read_text())
    by_status: Counter[int] = Counter()
    for key, count in statuses.items():
        by_status[int(key.rsplit(" ", 1)[1])] += count
    print(f"requests: {sum(statuses.values())} in {wall:.0f}s, concurrency {args.concurrency}")
    print(f"status distribution: {dict(sorted(by_status.items()))}")
    for key, count in sorted(statuses.items()):
        print(f"  {key}: {count}")
    print(f"answers >= 500: {sum(c for s, c in by_status.items() if s >= 500)}")
    print(f"answers not as expected: {len(unexpected)}")
    for line in unexpected[:20]:
        print(f"  {line}")
    print(
        f"event loop stall (probe every {PROBE_SECONDS * 1000:.0f} ms, {lag['samples']} "
        f"samples): max {lag['max'] * 1000:.1f} ms, p99.9 {lag['p999'] * 1000:.1f} ms, "
        f"p99 {lag['p99'] * 1000:.1f} ms, {lag['over_10ms']} over 10 ms; the loop thread's "
        f"most CPU in one interval {lag['max_busy'] * 1000:.1f} ms; worst stall while the "
        f"process had the CPU {lag['max_running'] * 1000:.1f} ms"
    )
    bad = any(s >= 500 for s in by_status) or lag["max"] > STALL_LIMIT or unexpected
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
