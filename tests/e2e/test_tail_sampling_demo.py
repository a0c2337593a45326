"""The demo under the tail sampler, over real vLLM: the slowest request (by the client's
clock) is kept and shown as the waterfall, and the demo's line of what the sampler kept
agrees with the traces a separate OTLP receiver decoded."""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry, start_http_server
from stagelens.reference import create_app, demo_config
from stagelens.reference.config import DEMO_API_KEY
from stagelens.reference.demo import sampler_summary
from stagelens.reference.demo_traces import ENDPOINT_ENV, DemoTraces

from stagelens import TailSampler, configure
from stagelens import semconv as sc

pytestmark = pytest.mark.vllm


async def _timed_traffic(url: str, n: int) -> dict[str, float]:
    """``n`` sequential requests, streamed and not, of varied lengths (the eighth three times
    the longest of the rest), each with a trace id of the client's own (its ``traceparent``
    says not sampled, so the gateway's tail sampler decides): seconds each took on the
    client's clock, by trace id."""
    rng = random.Random(1)
    took: dict[str, float] = {}
    headers = {"authorization": f"Bearer {DEMO_API_KEY}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=120) as client:
        for i in range(n):
            trace_id = f"{rng.getrandbits(128) | 1:032x}"
            traceparent = f"00-{trace_id}-{rng.getrandbits(64) | 1:016x}-00"
            body = {
                "model": "tiny" if i % 3 else "tiny-chat",
                "messages": [{"role": "user", "content": "Where does the time go?"}],
                # one request clearly the slowest: a near tie would let the client's clock
                # and the server's order the top two apart
                "max_tokens": 192 if i == 7 else (8, 24, 64)[i % 3],
                "ignore_eos": True,
                "stream": i % 2 == 0,
            }
            t0 = time.perf_counter()
            async with client.stream(
                "POST", "/v1/chat/completions", json=body, headers={"traceparent": traceparent}
            ) as answer:
                async for _ in answer.aiter_raw():
                    pass
            took[trace_id] = time.perf_counter() - t0
    return took


def test_the_slowest_request_is_kept_and_shown(
    vllm_server: Any,
    tiny_model: Any,
    serve_app: Any,
    otlp_sink: Any,
    port_factory: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Base ratio 0 (only the rules keep): the request the client waited longest for is
    kept and is the waterfall printed; the demo's summary counts every request and as many
    kept traces as the receiver got."""
    for name in (*ENDPOINT_ENV, "OTEL_TRACES_EXPORTER"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", otlp_sink.endpoint)
    traces = DemoTraces.start()
    registry = CollectorRegistry()
    telemetry = configure(
        span_exporters=traces.exporters,
        registry=registry,
        set_global=False,
        gpu=False,
        sampler=TailSampler(0.0),
    )
    port = port_factory()
    server, _thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    n = 12
    app = create_app(demo_config([vllm_server.base_url], str(tiny_model)), telemetry=telemetry)
    printed: list[str] = []
    try:
        with serve_app(app) as url:
            took = asyncio.run(_timed_traffic(url, n))
            kept, line = sampler_summary(f"http://127.0.0.1:{port}/metrics")
            assert kept is not None
            shown = traces.print_slowest(telemetry, kept, out=printed.append)
    finally:
        telemetry.shutdown()
        traces.stop()
        server.shutdown()
    slowest = max(took, key=took.__getitem__)
    received = otlp_sink.by_trace()
    assert slowest in received
    assert shown == slowest, printed
    # The ratio is 0: a trace is kept only by a rule (slow, failed, an exemplar: on a loaded
    # machine every one of the twelve may be), never by the ratio; every request is decided.
    decided = {
        (s.labels[sc.LABEL_DECISION], s.labels[sc.LABEL_REASON]): s.value
        for family in registry.collect()
        for s in family.samples
        if s.name == sc.TRACE_DECISIONS
    }
    assert decided.get((sc.DECISION_KEPT, sc.REASON_RATIO), 0.0) == 0.0, decided
    assert sum(decided.values()) == n, decided
    assert (
        len(received)
        == kept
        == sum(v for (decision, _), v in decided.items() if decision == sc.DECISION_KEPT)
    )
    assert line is not None
    assert f"kept {kept} of {n} traces" in line
