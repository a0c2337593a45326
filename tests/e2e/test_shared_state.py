"""State that survives restarts and is shared by workers and replicas, on the real stack:
real vLLM, the gateway as real processes (``stagelens.reference.serve``), a real SQLite
file, a real PostgreSQL and a real Redis.

The truth is what the clients were given: each response's own ``usage`` (vLLM's counts),
priced with the default price table. ``/v1/usage`` and the Prometheus counters of every
process must add up to exactly that.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from stagelens.reference import GatewayConfig
from stagelens.reference.serve import GatewayProcess, write_config

from stagelens import semconv
from stagelens.pricing import PriceTable, Usage

pytestmark = pytest.mark.vllm

ARTIFACTS = Path(__file__).resolve().parent.parent.parent / ".cache" / "test-artifacts"
BURST = 40
"""Bucket size of every key where the limit is probed (the traffic key stays under it);
the refill (0.01/s) adds under one token during a test."""

Totals = dict[str, float]
RUN = time.time_ns()
"""Part of every API key: the buckets in Redis outlive a test, new keys each run."""


def _key(tenant: str) -> str:
    return f"sk-{tenant}-{RUN}"


def _config(tmp_path: Path, vllm: Any, model: Path, tenant: str, **over: Any) -> Path:
    """A gateway config file: one model, two keys (traffic and rate-limit probe) of the
    tenant and its ``-limited`` twin, new keys each run (the buckets in Redis outlive a
    test)."""
    pool = {"backends": [vllm.base_url], "tokenizer": str(model), "max_inflight": 16}
    config = GatewayConfig.model_validate(
        {
            "api_keys": {_key(tenant): tenant, _key(f"{tenant}-limited"): f"{tenant}-limited"},
            "models": {"tiny": pool},
            "rate_limit_per_second": 0.01,
            "rate_limit_burst": 1000,
            "health_interval_seconds": 60,
            **over,
        }
    )
    return write_config(config, tmp_path / f"gateway-{tenant}.yaml")


@contextlib.contextmanager
def _gateway(
    config: Path, port: int, metrics_port: int, workers: int = 1, **env: str
) -> Iterator[GatewayProcess]:
    process = GatewayProcess(
        config,
        port,
        workers=workers,
        env={"OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none", **env},
        log_path=ARTIFACTS / f"gateway-{port}.log",
        metrics_port=metrics_port,
    )
    process.start(timeout=300)
    try:
        yield process
    finally:
        process.stop()


def _headers(tenant: str) -> dict[str, str]:
    return {"authorization": f"Bearer {_key(tenant)}"}


def _body(i: int, stream: bool, max_tokens: int | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "tiny",
        "max_tokens": max_tokens or 4 + i % 5,
        "messages": [{"role": "user", "content": f"shared state request {i}"}],
    }
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    return body


def _events(text: str) -> list[dict[str, Any]]:
    return [json.loads(x[6:]) for x in text.split("\n\n") if x.startswith("data: {")]


async def _one(client: httpx.AsyncClient, url: str, tenant: str, i: int) -> dict[str, Any]:
    """One chat request (every other one streamed); the usage its client was given."""
    stream = i % 2 == 1
    body, headers = _body(i, stream), _headers(tenant)
    r = await client.post(f"{url}/v1/chat/completions", json=body, headers=headers)
    assert r.status_code == 200, r.text
    usage: dict[str, Any] = _events(r.text)[-1]["usage"] if stream else r.json()["usage"]
    return usage


async def _traffic(
    urls: list[str], tenant: str, n: int, concurrency: int = 4
) -> list[dict[str, Any]]:
    """``n`` requests spread over ``urls``, a new connection each (so over every worker)."""
    limits = httpx.Limits(max_keepalive_connections=0)
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:

        async def one(i: int) -> dict[str, Any]:
            async with gate:
                return await _one(client, urls[i % len(urls)], tenant, i)

        return list(await asyncio.gather(*(one(i) for i in range(n))))


def _sum(usages: list[dict[str, Any]]) -> Totals:
    """What the clients were billed: their usages' tokens, priced by the price table."""
    prices = PriceTable.default()
    total: Totals = dict.fromkeys(
        ("requests", "input_tokens", "output_tokens", "cached_input_tokens", "cost_usd"), 0
    )
    for u in usages:
        cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        total["requests"] += 1
        total["input_tokens"] += u["prompt_tokens"]
        total["output_tokens"] += u["completion_tokens"]
        total["cached_input_tokens"] += cached
        total["cost_usd"] += prices.cost(
            "tiny", Usage(u["prompt_tokens"], u["completion_tokens"], cached)
        )
    return total


def _ledger(url: str, tenant: str) -> Totals:
    """``GET /v1/usage`` of ``tenant``'s key, without the tenant name."""
    r = httpx.get(f"{url}/v1/usage", headers=_headers(tenant), timeout=30)
    assert r.status_code == 200, r.text
    return {k: v for k, v in r.json().items() if k != "tenant"}


def _assert_equal(got: Totals, expected: Totals) -> None:
    assert {k: v for k, v in got.items() if k != "cost_usd"} == {
        k: v for k, v in expected.items() if k != "cost_usd"
    }
    assert got["cost_usd"] == pytest.approx(expected["cost_usd"], rel=1e-9)


def _scrape(metrics_urls: list[str], tenant: str) -> Totals:
    """The Prometheus counters of every replica (its internal metrics port: its workers'
    figures added up), added up as ``sum()`` would."""
    total: Totals = dict.fromkeys(
        ("requests", "input", "output", "cached_input", "cache_write", "reasoning", "cost"), 0
    )
    for url in metrics_urls:
        text = httpx.get(url, timeout=30).text
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == semconv.REQUESTS and s.labels == {"model": "tiny", "code": "200"}:
                    total["requests"] += s.value
                elif s.name == semconv.TOKENS and s.labels.get("tenant") == tenant:
                    total[s.labels["type"]] += s.value
                elif s.name == semconv.COST_USD and s.labels.get("tenant") == tenant:
                    total["cost"] += s.value
    return total


def _assert_counters(urls: list[str], tenant: str, expected: Totals) -> Totals:
    """Prometheus equals the clients' figures (a request is counted just after its last
    byte reached the client: wait up to 10 s for the last ones)."""
    deadline = time.monotonic() + 10
    while (got := _scrape(urls, tenant))["requests"] < expected["requests"]:
        assert time.monotonic() < deadline, got
        time.sleep(0.1)
    assert got["requests"] == expected["requests"]
    assert got["input"] == expected["input_tokens"]
    assert got["output"] == expected["output_tokens"]
    assert got["cached_input"] == expected["cached_input_tokens"]
    assert got["reasoning"] == 0  # this vLLM runs no reasoning parser: no usage says any
    assert got["cost"] == pytest.approx(expected["cost_usd"], rel=1e-9)
    return got


async def _probe_rate_limit(urls: list[str], tenant: str, n: int) -> int:
    """``n`` requests at once with the limited key, over every process (model ``nope``:
    past the limiter they end at the router, 404, without engine work); how many passed."""
    body = {"model": "nope", "messages": [{"role": "user", "content": "x"}]}
    limits = httpx.Limits(max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        answers = await asyncio.gather(
            *(
                client.post(
                    f"{urls[i % len(urls)]}/v1/chat/completions",
                    json=body,
                    headers=_headers(f"{tenant}-limited"),
                )
                for i in range(n)
            )
        )
    codes = [a.status_code for a in answers]
    assert set(codes) <= {404, 429}, codes
    return codes.count(404)


class _LongStream:
    """A streamed request of many tokens, read until it ends or its gateway dies."""

    def __init__(self, url: str, tenant: str, i: int, max_tokens: int) -> None:
        self.started = asyncio.Event()
        self.usage: dict[str, Any] | None = None
        self.headers = _headers(tenant)
        self.task = asyncio.create_task(self._run(url, i, max_tokens))

    async def _run(self, url: str, i: int, max_tokens: int) -> None:
        body = _body(i, stream=True, max_tokens=max_tokens) | {"ignore_eos": True}
        buffer = ""
        with contextlib.suppress(httpx.HTTPError):
            async with (
                httpx.AsyncClient(timeout=120) as client,
                client.stream(
                    "POST", f"{url}/v1/chat/completions", json=body, headers=self.headers
                ) as r,
            ):
                async for text in r.aiter_text():
                    self.started.set()
                    buffer += text
            events = _events(buffer)
            if buffer.endswith("data: [DONE]\n\n") and events and events[-1].get("usage"):
                self.usage = events[-1]["usage"]
        self.started.set()


async def _streams_then(
    url: str, tenant: str, k: int, max_tokens: int, action: Any
) -> list[_LongStream]:
    """Start ``k`` long streams, run ``action`` (in a thread) once each has received its
    first bytes, and wait for the streams to end."""
    streams = [_LongStream(url, tenant, 100 + i, max_tokens) for i in range(k)]
    await asyncio.gather(*(s.started.wait() for s in streams))
    await asyncio.to_thread(action)
    await asyncio.gather(*(s.task for s in streams))
    return streams


class TestRestart:
    """The ledger survives a restart, graceful or not."""

    def test_usage_after_restarts_is_what_clients_were_billed(
        self, vllm_server, tiny_model, tmp_path, port_factory
    ) -> None:
        """Traffic, a SIGTERM while streams run (they finish, billed), traffic, a SIGKILL
        while streams run (they are cut), traffic: /v1/usage equals the sum of every usage
        the clients were given, before and after each restart."""
        ledger = f"sqlite://{tmp_path}/ledger.sqlite3"
        config = _config(tmp_path, vllm_server, tiny_model, "restart", ledger_url=ledger)
        port = port_factory()
        url = f"http://127.0.0.1:{port}"
        seen: list[dict[str, Any]] = []
        cut = 0

        gateway = GatewayProcess(
            config, port, env={"OTEL_TRACES_EXPORTER": "none"}, metrics_port=port_factory()
        )
        try:
            for restart in ("sigterm", "sigkill"):
                gateway.log_path = ARTIFACTS / f"gateway-restart-{restart}.log"
                gateway.start(timeout=300)
                seen += asyncio.run(_traffic([url], "restart", 6))
                _assert_equal(_ledger(url, "restart"), _sum(seen))
                action = gateway.stop if restart == "sigterm" else gateway.kill
                tokens = 96 if restart == "sigterm" else 1000
                streams = asyncio.run(_streams_then(url, "restart", 3, tokens, action))
                finished = [s.usage for s in streams if s.usage is not None]
                if restart == "sigterm":
                    assert len(finished) == 3  # a graceful stop lets them finish
                seen += finished
                cut += 3 - len(finished)
            gateway.log_path = ARTIFACTS / "gateway-restart-after.log"
            gateway.start(timeout=300)
            seen += asyncio.run(_traffic([url], "restart", 6))
            got = _ledger(url, "restart")
        finally:
            gateway.stop()
        expected = _sum(seen)
        print(f"\nrestart: ledger {got}, clients {expected}, streams cut by SIGKILL: {cut}")
        assert cut >= 1  # the kill did land mid-traffic
        _assert_equal(got, expected)


class TestWorkersAndReplicas:
    """Several processes, one ledger and one bucket per key."""

    def test_four_workers_on_sqlite(
        self, vllm_server, tiny_model, tmp_path, port_factory, redis_url
    ) -> None:
        """Four uvicorn workers, one SQLite file, buckets in Redis: /v1/usage and the
        counters equal the clients' sum, and a key gets one burst in all."""
        ledger = f"sqlite://{tmp_path}/ledger.sqlite3"
        metrics_dir = tmp_path / "metrics"
        config = _config(
            tmp_path,
            vllm_server,
            tiny_model,
            "workers",
            ledger_url=ledger,
            redis_url=redis_url,
            rate_limit_burst=BURST,
        )
        port = port_factory()
        env = {"PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)}
        with _gateway(config, port, port_factory(), workers=4, **env) as gw:
            seen = asyncio.run(_traffic([gw.url], "workers", 24, concurrency=8))
            reads = [_ledger(gw.url, "workers") for _ in range(8)]  # a connection each
            got = reads[0]
            counters = _assert_counters([gw.metrics_url], "workers", _sum(seen))
            passed = asyncio.run(_probe_rate_limit([gw.url], "workers", 3 * BURST))
            pids = {p.stem.rsplit("_", 1)[-1] for p in metrics_dir.glob("counter_*.db")}
        print(
            f"\n4 workers: ledger {got}, counters {counters}, rate-limited key passed "
            f"{passed} of {3 * BURST} (burst {BURST}), worker processes with metrics {len(pids)}"
        )
        for read in reads:
            _assert_equal(read, _sum(seen))
        assert len(pids) >= 2  # the traffic did reach several workers
        assert passed == BURST

    def test_two_replicas_on_postgresql_and_redis(
        self, vllm_server, tiny_model, tmp_path, port_factory, postgres_url, redis_url
    ) -> None:
        """Two gateway replicas (each its own processes and metrics) on one PostgreSQL and
        one Redis: either replica's /v1/usage and the sum of both replicas' counters equal
        the clients' sum, and a key gets one burst across both."""
        config = _config(
            tmp_path,
            vllm_server,
            tiny_model,
            "replicas",
            ledger_url=postgres_url,
            redis_url=redis_url,
            rate_limit_burst=BURST,
        )
        with (
            _gateway(config, port_factory(), port_factory(), workers=2) as one,
            _gateway(config, port_factory(), port_factory(), workers=2) as two,
        ):
            urls = [one.url, two.url]
            metrics = [one.metrics_url, two.metrics_url]
            seen = asyncio.run(_traffic(urls, "replicas", 16, concurrency=8))
            ledgers = [_ledger(u, "replicas") for u in urls]
            counters = _assert_counters(metrics, "replicas", _sum(seen))
            per_replica = [_scrape([m], "replicas")["requests"] for m in metrics]
            passed = asyncio.run(_probe_rate_limit(urls, "replicas", 3 * BURST))
        print(
            f"\n2 replicas: ledgers {ledgers}, counters {counters} ({per_replica} per "
            f"replica), rate-limited key passed {passed} of {3 * BURST} (burst {BURST})"
        )
        for got in ledgers:
            _assert_equal(got, _sum(seen))
        assert all(n > 0 for n in per_replica)
        assert passed == BURST
