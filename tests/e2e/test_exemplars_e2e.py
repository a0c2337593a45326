"""Exemplars resolve to traces: real Prometheus, with exemplar storage on, scrapes the
reference gateway over real vLLM, and every trace id it returns for the latency histograms
is a trace an OTLP receiver got, on the root span it names, with the value that span
recorded; the slowest request's exemplar is on the highest bucket any request fell in.

The traffic is the official ``openai`` SDK's, timed by the client's own clock. The slowest
request is made so on purpose and sent last: the pool has one admission slot, and it
arrives while a long answer holds it, so its time to first token includes that wait.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from prometheus_client import CollectorRegistry
from stagelens.reference import GatewayConfig, create_app, metrics_app
from stagelens.reference.config import DEMO_API_KEY

import stagelens
from stagelens import semconv as sc
from stagelens.metrics.buckets import ttft_buckets
from stagelens.slo import prometheus_server
from tests._otlp_receiver import OtlpReceiver, otlp_receiver
from tests._promstack import PROMETHEUS, WebhookSink, prom_stack

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.prometheus,
    pytest.mark.skipif(not Path(PROMETHEUS).exists(), reason="prometheus missing"),
]

QUICK_REQUESTS = 8


def _roots(receiver: OtlpReceiver) -> dict[str, tuple[str, float | None, float]]:
    """trace id -> (root span id, its ``stagelens.time_to_first_token``, its duration in
    seconds), decoded from what the receiver got (the SERVER span of each trace)."""
    found: dict[str, tuple[str, float | None, float]] = {}
    for path, message in list(receiver.received):
        if path != "/v1/traces":
            continue
        for rs in message.resource_spans:
            for ss in rs.scope_spans:
                for span in ss.spans:
                    if span.kind != Span.SPAN_KIND_SERVER:
                        continue
                    attrs = {a.key: a.value for a in span.attributes}
                    ttft = attrs.get(sc.ATTR_TTFT)
                    found[span.trace_id.hex()] = (
                        span.span_id.hex(),
                        ttft.double_value if ttft is not None else None,
                        (span.end_time_unix_nano - span.start_time_unix_nano) / 1e9,
                    )
    return found


def _stream(
    client: openai.OpenAI,
    max_tokens: int,
    started: threading.Event | None = None,
    **extra: Any,
) -> tuple[float, float]:
    """One streamed chat completion: (client-clock time to the first content, total);
    ``started`` is set at its first content."""
    t0 = time.perf_counter()
    first: float | None = None
    stream = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Where does the time of a request go?"}],
        max_tokens=max_tokens,
        stream=True,
        extra_body=extra or None,
    )
    for chunk in stream:
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.perf_counter() - t0
            if started is not None:
                started.set()
    assert first is not None
    return first, time.perf_counter() - t0


@pytest.fixture
def traced_gateway(
    vllm_server: Any, tiny_model: Path, serve_app: Any
) -> Iterator[tuple[str, str, OtlpReceiver, stagelens.Telemetry]]:
    """The reference gateway over the session's vLLM, its spans over OTLP/HTTP to a real
    receiver, one admission slot for ``tiny``: (API URL, metrics host:port, receiver,
    telemetry)."""
    config = GatewayConfig.model_validate(
        {
            "api_keys": {DEMO_API_KEY: "demo"},
            "models": {
                "tiny": {
                    "backends": [vllm_server.base_url],
                    "tokenizer": str(tiny_model),
                    "max_inflight": 1,
                    "admission_timeout_seconds": 60,
                }
            },
        }
    )
    with otlp_receiver() as receiver:
        telemetry = stagelens.configure(
            registry=CollectorRegistry(),
            set_global=False,
            span_exporters=[OTLPSpanExporter(endpoint=f"{receiver.url}/v1/traces")],
            gpu=False,
        )
        app = create_app(config, telemetry=telemetry)
        try:
            with serve_app(app) as url, serve_app(metrics_app(app)) as metrics_url:
                yield url, metrics_url.removeprefix("http://"), receiver, telemetry
        finally:
            telemetry.shutdown()


class TestExemplarsResolveToTraces:
    """Real Prometheus, exemplar storage on, against the spans a real receiver got."""

    def test_exemplars_resolve_to_traces(self, traced_gateway: Any, port_factory: Any) -> None:
        """After real traffic, /api/v1/query_exemplars for the TTFT, duration and stage
        histograms returns trace ids the OTLP receiver got, each naming its trace's root span
        with the value that request recorded, in the bucket that value falls in; the slowest
        request (by the spans and by the client's clock) is the exemplar of the highest bucket
        any request fell in."""
        url, metrics, receiver, telemetry = traced_gateway
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=DEMO_API_KEY, max_retries=0)
        sink = WebhookSink(port_factory())
        targets = {prometheus_server.GATEWAY_JOB: metrics}
        ports = (port_factory(), port_factory(), port_factory())
        with (
            sink.running(),
            prom_stack(ports, targets, [], f"http://127.0.0.1:{sink.port}/") as prom,
        ):
            start = time.time() - 5
            client_ttft = [_stream(client, 8, ignore_eos=True)[0] for _ in range(QUICK_REQUESTS)]
            # The slowest, sent last: it waits for the slot a long answer holds.
            holding = threading.Event()
            long_answer: list[tuple[float, float]] = []
            holder = threading.Thread(
                target=lambda: long_answer.append(_stream(client, 600, holding, ignore_eos=True))
            )
            holder.start()
            assert holding.wait(60)
            slowest_client_ttft, _ = _stream(client, 8, ignore_eos=True)
            holder.join()
            client_ttft += [long_answer[0][0], slowest_client_ttft]
            assert max(client_ttft) == slowest_client_ttft
            telemetry.force_flush()

            def exemplars(metric: str) -> list[tuple[dict[str, str], dict[str, Any]]]:
                """(series labels, exemplar) of the metric's buckets, oldest first."""
                series = prom.query_exemplars(f"{metric}_bucket", start, time.time() + 5)
                found = [(s["seriesLabels"], e) for s in series for e in s["exemplars"]]
                return sorted(found, key=lambda pair: float(pair[1]["timestamp"]))

            # Until every trace has reached the receiver and Prometheus scraped the last one.
            deadline = time.monotonic() + 30
            while True:
                roots = _roots(receiver)
                ttfts = {trace: ttft for trace, (_, ttft, _) in roots.items() if ttft is not None}
                if len(ttfts) == QUICK_REQUESTS + 2:
                    values = {float(e["value"]) for _, e in exemplars(sc.TIME_TO_FIRST_TOKEN)}
                    if max(ttfts.values()) in values:
                        break
                assert time.monotonic() < deadline, (len(ttfts), roots)
                time.sleep(1)

            bounds = ttft_buckets(0.5)
            # Every exemplar: a trace the receiver got, its root span, its value, its bucket.
            for metric in (sc.TIME_TO_FIRST_TOKEN, sc.REQUEST_DURATION, sc.STAGE_DURATION):
                found = exemplars(metric)
                assert found, metric
                for series, exemplar in found:
                    trace = exemplar["labels"][sc.EXEMPLAR_TRACE_ID]
                    assert trace in roots, (metric, trace)
                    assert exemplar["labels"][sc.EXEMPLAR_SPAN_ID] == roots[trace][0]
                    le = float(series["le"])
                    value = float(exemplar["value"])
                    assert value <= le, (metric, series, value)
                    if metric == sc.REQUEST_DURATION:
                        assert value == pytest.approx(roots[trace][2], abs=0.005)
                    if metric == sc.TIME_TO_FIRST_TOKEN:
                        assert value == ttfts[trace]
                        below = [b for b in bounds if b < le]
                        assert not below or value > below[-1]
            # The slowest request: its exemplar is on the highest bucket any request fell in.
            slowest = max(ttfts, key=lambda t: ttfts[t])
            highest = min(b for b in [*bounds, float("inf")] if b >= ttfts[slowest])
            on_highest = [
                e for s, e in exemplars(sc.TIME_TO_FIRST_TOKEN) if float(s["le"]) == highest
            ]
            assert [e["labels"][sc.EXEMPLAR_TRACE_ID] for e in on_highest][-1] == slowest
            # ... and it is the slowest by the client's own clock, seen a little after the
            # gateway sent its first token.
            assert ttfts[slowest] <= slowest_client_ttft < ttfts[slowest] + 0.5
            counts = {
                m: len(exemplars(m))
                for m in (sc.TIME_TO_FIRST_TOKEN, sc.REQUEST_DURATION, sc.STAGE_DURATION)
            }
            print(
                f"\nexemplars: {counts} from {len(roots)} traces; slowest TTFT "
                f"{ttfts[slowest]:.3f} s (span), {slowest_client_ttft:.3f} s (client), le={highest}"
            )
