"""The GenAI OpenTelemetry metrics of the reference gateway over real vLLM, per request.

The official SDK streams chat completions through the gateway (``configure(genai_metrics=
True)``) to the session's vLLM server, timing each itself; vLLM's usage arrives in the
stream. After each request the metrics are exported over OTLP/HTTP to a receiver decoding
with opentelemetry-proto; the difference between two consecutive (cumulative) exports is
that one request's observations, compared with the SDK's clock and vLLM's usage.
"""

from __future__ import annotations

import time
from typing import Any

import openai
import pytest
from prometheus_client import CollectorRegistry
from stagelens.exporters.genai_metrics import enable_genai_metrics
from stagelens.reference import create_app, demo_config
from stagelens.reference.config import DEMO_API_KEY

from stagelens import configure, semconv
from tests._otlp_receiver import OtlpReceiver, otlp_receiver

pytestmark = pytest.mark.vllm

SLACK = 0.1
"""How far the gateway's clock may run past the client's (its timestamps are taken when a
send returns, just after the client may have read the bytes) on a busy 2-core machine."""

_Totals = dict[tuple[str, tuple[tuple[str, Any], ...]], tuple[int, float]]


def _totals(receiver: OtlpReceiver) -> _Totals:
    """(instrument, attributes) -> (count, sum) of the last export (cumulative)."""
    exports = [m for p, m in receiver.received if p == "/v1/metrics"]
    out: _Totals = {}
    if not exports:
        return out
    for rm in exports[-1].resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                kind = metric.WhichOneof("data")
                for point in getattr(metric, kind).data_points:
                    key = tuple(
                        sorted(
                            (a.key, getattr(a.value, a.value.WhichOneof("value")))
                            for a in point.attributes
                        )
                    )
                    out[(metric.name, key)] = (point.count, point.sum)
    return out


def _delta(before: _Totals, after: _Totals, name: str, **match: Any) -> tuple[int, float]:
    """The (count, sum) one instrument gained between two exports, over the data points
    whose attributes include ``match``."""
    count, total = 0, 0.0
    for (metric, attributes), (c, s) in after.items():
        found = dict(attributes)
        if metric != name or any(found.get(k) != v for k, v in match.items()):
            continue
        c0, s0 = before.get((metric, attributes), (0, 0.0))
        count, total = count + c - c0, total + s - s0
    return count, total


def test_each_streamed_request_matches_the_sdk_clock_and_vllms_usage(
    vllm_server: Any, tiny_model: Any, serve_app: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Per request through the reference gateway: one duration, time-to-first-token and
    time-per-output-token observation within the SDK's own timings, and token usage equal
    to vLLM's, with the GenAI attributes of the call (chat, vllm, tiny, the engine's
    address)."""
    with otlp_receiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", f"{receiver.url}/v1/metrics")
        monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "600000")
        monkeypatch.delenv(semconv.SEMCONV_STABILITY_OPT_IN_ENV, raising=False)
        telemetry = configure(
            registry=CollectorRegistry(),
            span_exporters=[],
            set_global=False,
            gpu=False,
            genai_metrics=True,
        )
        pipeline = enable_genai_metrics(telemetry).pipeline
        assert pipeline is not None
        app = create_app(demo_config([vllm_server.base_url], str(tiny_model)), telemetry=telemetry)
        host, port = vllm_server.base_url.split("//", 1)[1].split("/")[0].rsplit(":", 1)
        common = {
            "gen_ai.operation.name": "chat",
            "gen_ai.system": "vllm",
            "gen_ai.request.model": "tiny",
            "server.address": host,
            "server.port": int(port),
        }
        try:
            with serve_app(app) as url:
                client = openai.OpenAI(base_url=f"{url}/v1", api_key=DEMO_API_KEY)
                before = _totals(receiver)
                for max_tokens in (6, 12, 20):
                    started = time.perf_counter()
                    stream = client.chat.completions.create(
                        model="tiny",
                        messages=[{"role": "user", "content": f"Count to {max_tokens}."}],
                        max_tokens=max_tokens,
                        temperature=0,
                        stream=True,
                        stream_options={"include_usage": True},
                    )
                    first = last = 0.0
                    usage = None
                    for chunk in stream:
                        now = time.perf_counter()
                        first = first or now
                        if chunk.choices:
                            last = now
                        usage = chunk.usage or usage
                    ended = time.perf_counter()
                    assert usage is not None
                    assert usage.completion_tokens >= 2
                    after = before
                    deadline = time.monotonic() + 10
                    while time.monotonic() < deadline:  # until the gateway recorded its end
                        assert pipeline.force_flush()
                        after = _totals(receiver)
                        name = semconv.OTEL_GEN_AI_SERVER_REQUEST_DURATION
                        if _delta(before, after, name)[0]:
                            break
                        time.sleep(0.05)
                    _check_request(before, after, common, usage, started, first, last, ended)
                    before = after
        finally:
            pipeline.shutdown()


def _check_request(
    before: _Totals,
    after: _Totals,
    common: dict[str, Any],
    usage: Any,
    started: float,
    first: float,
    last: float,
    ended: float,
) -> None:
    """One request's observations (the two exports' difference) against the SDK's clock
    (``started``, first and last chunk, ``ended``) and vLLM's ``usage``."""
    names = semconv
    duration = _delta(before, after, names.OTEL_GEN_AI_SERVER_REQUEST_DURATION, **common)
    assert duration[0] == 1
    assert ended - started - 0.5 < duration[1] <= ended - started + SLACK
    ttft = _delta(before, after, names.OTEL_GEN_AI_SERVER_TIME_TO_FIRST_TOKEN, **common)
    assert ttft[0] == 1
    assert first - started - 0.5 < ttft[1] <= first - started + SLACK
    tpot = _delta(before, after, names.OTEL_GEN_AI_SERVER_TIME_PER_OUTPUT_TOKEN, **common)
    assert tpot[0] == 1
    after_first = usage.completion_tokens - 1
    assert tpot[1] == pytest.approx((duration[1] - ttft[1]) / after_first)
    # Decode as the client saw it: first event to the last event with a choice.
    assert abs(tpot[1] * after_first - (last - first)) < 0.5
    print(  # the figures, for a reader running with -s
        f"duration {duration[1]:.4f}/{ended - started:.4f} s, ttft {ttft[1]:.4f}/"
        f"{first - started:.4f} s, tpot {tpot[1]:.5f}/{(last - first) / after_first:.5f} s "
        f"(gateway/SDK), tokens {usage.prompt_tokens} in, {usage.completion_tokens} out"
    )
    for kind, want in (("input", usage.prompt_tokens), ("output", usage.completion_tokens)):
        match = {**common, "gen_ai.token.type": kind}
        got = _delta(before, after, names.OTEL_GEN_AI_CLIENT_TOKEN_USAGE, **match)
        assert got == (1, want), kind
