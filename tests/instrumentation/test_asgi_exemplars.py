"""Exemplars from the middleware: a sampled request's trace on the buckets its TTFT,
duration and stage times fell in, read back from the OpenMetrics exposition of ``/metrics``
and compared with the spans the tracer exported; nothing from a trace that is not sampled."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from opentelemetry.context import Context
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
from opentelemetry.trace import Link, SpanKind
from opentelemetry.util.types import Attributes
from prometheus_client.openmetrics.parser import text_string_to_metric_families
from stagelens.instrumentation import Telemetry

from stagelens import semconv
from stagelens.testing import TRACERS, TelemetryCapture, capture_telemetry

pytestmark = pytest.mark.anyio

OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"
HISTOGRAMS = (
    semconv.TIME_TO_FIRST_TOKEN,
    semconv.INTER_TOKEN_LATENCY,
    semconv.REQUEST_DURATION,
    semconv.STAGE_DURATION,
)


async def _scrape(cap: TelemetryCapture, client_factory: Any, accept: str) -> str:
    """``/metrics`` of the instrumented app, as a scraper sending ``accept`` reads it."""
    async with client_factory(cap.telemetry.metrics_app()) as client:
        r = await client.get("/", headers={"accept": accept})
    assert r.status_code == 200
    return str(r.text)


def _exemplars(text: str) -> list[tuple[str, dict[str, str], Any]]:
    """(metric, bucket labels, exemplar) of every bucket with an exemplar."""
    return [
        (family.name, sample.labels, sample.exemplar)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.exemplar is not None
    ]


class TestSampled:
    """A sampled request names its trace on every histogram that keeps exemplars."""

    @pytest.mark.parametrize("cap", TRACERS, indirect=True)
    async def test_exemplars_name_the_exported_root_span(
        self, cap, proxy_factory, client_factory
    ) -> None:
        """Each bucket's exemplar carries the trace id and root span id the tracer exported,
        and the value the root span recorded (TTFT) or the span's duration (stages)."""
        app, _ = proxy_factory(cap)
        async with client_factory(app) as client:
            r = await client.post(
                "/v1/chat/completions", json={"model": "tiny", "stream": True, "max_tokens": 16}
            )
        assert r.status_code == 200
        found = _exemplars(await _scrape(cap, client_factory, OPENMETRICS))
        root = next(s for s in cap.spans() if s.kind is SpanKind.SERVER)
        ids = {
            semconv.EXEMPLAR_TRACE_ID: f"{root.context.trace_id:032x}",
            semconv.EXEMPLAR_SPAN_ID: f"{root.context.span_id:016x}",
        }
        assert {name for name, _, _ in found} == set(HISTOGRAMS)
        assert all(exemplar.labels == ids for _, _, exemplar in found)
        ttft = [e for n, _, e in found if n == semconv.TIME_TO_FIRST_TOKEN]
        assert [e.value for e in ttft] == [pytest.approx(root.attributes[semconv.ATTR_TTFT])]
        stages = {lbl["stage"]: e for n, lbl, e in found if n == semconv.STAGE_DURATION}
        assert set(stages) >= {"gateway", "tokenizer", "router", "inference", "billing"}
        for span in cap.spans():
            name = (span.attributes or {}).get(semconv.ATTR_STAGE)
            if name in ("tokenizer", "router"):  # one block each: the span is the stage time
                seconds = (span.end_time - span.start_time) / 1e9
                assert stages[name].value == pytest.approx(seconds, abs=2e-4)
        # ITL: the request's worst gap, so its exemplar sits in the highest bucket holding
        # any gap (read from the bucket counts scraped, not from the fold's reasoning).
        (itl,) = [(lbl["le"], e) for n, lbl, e in found if n == semconv.INTER_TOKEN_LATENCY]
        gaps = cap.value(f"{semconv.INTER_TOKEN_LATENCY}_count", model="tiny")
        assert gaps == 15  # 16 content events, one gap between each pair
        edges = sorted(
            (float(s.labels["le"]), s.value)
            for family in cap.registry.collect()
            if family.name == semconv.INTER_TOKEN_LATENCY
            for s in family.samples
            if s.name.endswith("_bucket")
        )
        highest = next(le for le, cumulative in edges if cumulative == gaps)
        assert float(itl[0]) == highest
        assert itl[1].value <= highest
        stamp = ttft[0].timestamp  # the parser's Timestamp(sec, nsec)
        assert abs(stamp.sec + stamp.nsec / 1e9 - root.end_time / 1e9) < 1.0

    async def test_the_classic_text_format_carries_none(
        self, cap, proxy_factory, client_factory
    ) -> None:
        """Prometheus' text format 0.0.4 has no exemplars: a scraper asking for it gets
        the same series without them."""
        app, _ = proxy_factory(cap)
        async with client_factory(app) as client:
            await client.post("/v1/chat/completions", json={"model": "tiny"})
        text = await _scrape(cap, client_factory, "text/plain")
        assert semconv.TIME_TO_FIRST_TOKEN in text
        assert semconv.EXEMPLAR_TRACE_ID not in text


class _RecordOnly(Sampler):
    """Records every span but exports none (``RECORD_ONLY``)."""

    def should_sample(
        self,
        parent_context: Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        trace_state: Any = None,
    ) -> SamplingResult:
        return SamplingResult(Decision.RECORD_ONLY)

    def get_description(self) -> str:
        return "record only"


@pytest.fixture(params=["always_off", "record_only"])
def not_sampled(request: pytest.FixtureRequest) -> Iterator[TelemetryCapture]:
    """A capture whose traces are never exported: sampled out, or recorded only."""
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

    with capture_telemetry() as base:
        exporter = InMemorySpanExporter()
        sampler = ALWAYS_OFF if request.param == "always_off" else _RecordOnly()
        provider = TracerProvider(sampler=sampler)
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        yield TelemetryCapture(
            Telemetry(tracer_provider=provider, registry=base.registry), exporter
        )


class TestNotSampled:
    """A trace nobody can open is never named."""

    async def test_no_exemplar_without_a_sampled_trace(
        self, not_sampled, proxy_factory, client_factory
    ) -> None:
        """Sampled out, or recorded but not sampled: every request is counted and no
        bucket has an exemplar."""
        app, _ = proxy_factory(not_sampled)
        async with client_factory(app) as client:
            for stream in (True, False):
                body = {"model": "tiny", "stream": stream}
                r = await client.post("/v1/chat/completions", json=body)
                assert r.status_code == 200
        text = await _scrape(not_sampled, client_factory, OPENMETRICS)
        size = {"model": "tiny", "prompt_size": "1024"}
        assert not_sampled.value(f"{semconv.TIME_TO_FIRST_TOKEN}_count", **size) == 1.0
        assert not_sampled.value(f"{semconv.NON_STREAMED_RESPONSE}_count", **size) == 1.0
        assert _exemplars(text) == []
