"""The event loop's stall while the gateway parses and counts a big chat body off the loop.

No vLLM, no HTTP: the gateway's own steps for a body over ``OFF_LOOP_BYTES``, run as it runs
them (``parse`` on a worker thread, then ``count_chat`` through ``OffLoop`` on its worker
thread with the tiny model's tokenizer, the rendered text over ``BIG_TEXT_CHARS`` counted in
its token counting process), while a probe task on the event loop sleeps 5 ms at
a time and records how late it wakes up (the loop-lag probe of ``fuzz_gateway.py``). A
stall is waiting: the worker holding the GIL, or the machine giving the process no CPU. So
each interval also reads the process's CPU time, and the figure that matters is the worst
stall while the process had the CPU (its threads used at least half the interval): the
loop waiting for the GIL. The gateway allows a stall of 50 ms at most.

    nice .venv/bin/python benchmarks/loop_stall.py [--rounds 3]

Prints, per body (a ~1 MB chat prompt; one of the default ``max_body_bytes``, 4 MiB), the
counting time and the probe's max, p99 and worst-while-running stall; exits 1 when the
worst-while-running stall exceeds 50 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from dataclasses import dataclass, field

import anyio.to_thread
from stagelens.reference.flow import OFF_LOOP_BYTES
from stagelens.reference.schema import ChatRequest, parse
from stagelens.reference.tinymodel import ensure_tiny_model
from stagelens.reference.tokens import OffLoop, TokenCounter

PROBE_SECONDS = 0.005
"""The probe's sleep: it wakes up late by as long as the loop was kept waiting."""
STALL_LIMIT = 0.050
"""The worst stall the issue allows (seconds)."""
WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "was",
    "for",
    "on",
    "that",
    "with",
    "as",
    "by",
    "at",
    "from",
    "it",
    "an",
    "be",
    "this",
    "are",
]
"""The prompt's vocabulary: short common words, ~3.4 bytes a token with the tiny model."""


@dataclass
class Probe:
    """Lag samples of the 5 ms ticker, with the process's CPU time per interval."""

    lags: list[float] = field(default_factory=list)
    running: list[bool] = field(default_factory=list)

    async def run(self) -> None:
        while True:
            t0, p0 = time.perf_counter(), time.process_time()
            await asyncio.sleep(PROBE_SECONDS)
            wall = time.perf_counter() - t0
            self.lags.append(wall - PROBE_SECONDS)
            self.running.append(time.process_time() - p0 >= wall / 2)

    def figures(self) -> tuple[float, float, float]:
        """(max, p99, worst while the process had the CPU), in seconds."""
        ordered = sorted(self.lags)
        n = len(ordered)
        held = [lag for lag, ran in zip(self.lags, self.running, strict=True) if ran]
        return ordered[-1], ordered[int(n * 0.99)], max(held, default=0.0)


def chat_body(size: int, seed: int = 0) -> bytes:
    """A chat completion body of about ``size`` bytes: one user message of random words."""
    rng = random.Random(seed)
    words: list[str] = []
    length = 0
    while length < size - 200:
        word = rng.choice(WORDS)
        words.append(word)
        length += len(word) + 1
    body = {"model": "tiny", "messages": [{"role": "user", "content": " ".join(words)}]}
    return json.dumps(body).encode()


async def measure(body: bytes, counter: TokenCounter, off_loop: OffLoop) -> float:
    """One body through the gateway's off-loop steps under the probe: prints its figures,
    returns the worst stall while the process ran."""
    assert len(body) > OFF_LOOP_BYTES
    probe = Probe()
    task = asyncio.get_running_loop().create_task(probe.run())
    await asyncio.sleep(0.05)  # the probe is ticking
    start = time.perf_counter()
    req, _ = await anyio.to_thread.run_sync(parse, body, ChatRequest)
    parsed = time.perf_counter()
    tokens = await off_loop.run(counter, lambda c: c.count_chat(req))
    done = time.perf_counter()
    await asyncio.sleep(0.05)
    task.cancel()
    worst, p99, held = probe.figures()
    print(
        f"{len(body) / 2**20:5.2f} MiB chat body, {tokens:,} tokens: parse "
        f"{(parsed - start) * 1000:.0f} ms, count {(done - parsed) * 1000:.0f} ms; stall "
        f"(probe every 5 ms, {len(probe.lags)} samples) max {worst * 1000:.1f} ms, p99 "
        f"{p99 * 1000:.1f} ms, worst while the process ran {held * 1000:.1f} ms",
        flush=True,
    )
    return held


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="times each body is measured")
    args = parser.parse_args()
    counter = TokenCounter(str(ensure_tiny_model()))
    off_loop = OffLoop()
    bodies = [chat_body(1_000_000), chat_body(4 * 2**20 - 1024, seed=1)]
    await off_loop.run(counter, lambda c: c.count_prompt("warm up"))  # loads the copy
    worst = 0.0
    try:
        for _ in range(args.rounds):
            for body in bodies:
                worst = max(worst, await measure(body, counter, off_loop))
    finally:
        await off_loop.close()
    print(f"worst stall while the process ran: {worst * 1000:.1f} ms (limit 50 ms)")
    return 1 if worst > STALL_LIMIT else 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
