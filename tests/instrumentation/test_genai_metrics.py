"""The GenAI OpenTelemetry metrics, exported over real OTLP/HTTP and checked per request
against the client's own clock and the upstream's usage.

The gateway (an ordinary FastAPI proxy, ``configure(genai_metrics=True)``) and the local
upstream (scripted first-token delay and chunk gaps, vLLM's usage chunk) both serve real
sockets; the client times each request itself and reads the usage the upstream sent. The
metrics go through the OTLP/HTTP exporter to a receiver decoding with opentelemetry-proto.
Each request asks for a model of its own, so each histogram data point is one request.
"""

from __future__ import annotations

import io
import json
import math
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    ConsoleMetricExporter,
    ExponentialHistogramDataPoint,
    HistogramDataPoint,
    InMemoryMetricReader,
    PeriodicExportingMetricReader,
)
from prometheus_client import CollectorRegistry
from stagelens.exporters import genai_metrics
from stagelens.exporters.genai_metrics import GenAIMetrics, enable_genai_metrics
from starlette.applications import Starlette

from stagelens import configure, semconv
from stagelens.metrics.buckets import (
    GEN_AI_CLIENT_TOKEN_USAGE_BUCKETS,
    GEN_AI_SERVER_REQUEST_DURATION_BUCKETS,
    GEN_AI_SERVER_TIME_PER_OUTPUT_TOKEN_BUCKETS,
    GEN_AI_SERVER_TIME_TO_FIRST_TOKEN_BUCKETS,
)
from stagelens.metrics.genai_call import GenAICall
from stagelens.metrics.record import BillingRecord, RequestRecord, StageTimes
from stagelens.telemetry import Telemetry
from tests._otlp_receiver import OtlpReceiver, otlp_receiver
from tests._scaffold import Served

CHUNKS = 16
"""Content chunks per streamed answer: one token each, as the upstream's usage says."""
GAP = 0.01
"""Seconds between the upstream's content chunks."""
SLACK = 0.05
"""How much later than the client's clock the gateway's may stop (same process, same
monotonic clock): the gateway takes its timestamps when a send returns, just after the
client may have read those bytes, and a busy machine can preempt it in between."""

# The v1.41.0 bucket advice, spelled out here from docs/gen-ai/gen-ai-metrics.md of
# open-telemetry/semantic-conventions (tag v1.41.0), independently of stagelens.metrics.buckets.
ADVICE = {
    "gen_ai.server.request.duration": [
        0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92
    ],
    "gen_ai.server.time_per_output_token": [
        0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5
    ],
    "gen_ai.server.time_to_first_token": [
        0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0
    ],
    "gen_ai.client.token.usage": [
        1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216,
        67108864,
    ],
}  # fmt: skip


def _points(receiver: OtlpReceiver) -> dict[str, list[tuple[dict[str, Any], Any, str]]]:
    """Instrument name -> (attributes, data point, kind) of the last metrics export (the
    temporality is cumulative: the last export holds everything)."""
    exports = [m for p, m in receiver.received if p == "/v1/metrics"]
    assert exports, "no metrics export arrived"
    out: dict[str, list[tuple[dict[str, Any], Any, str]]] = {}
    for rm in exports[-1].resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                kind = metric.WhichOneof("data")
                for point in getattr(metric, kind).data_points:
                    attributes = {}
                    for a in point.attributes:
                        value = a.value
                        attributes[a.key] = getattr(value, value.WhichOneof("value"))
                    out.setdefault(metric.name, []).append((attributes, point, kind))
    return out


def _one(points: list[tuple[dict[str, Any], Any, str]], **match: Any) -> Any:
    """The single data point whose attributes include ``match`` (keys with ``_`` for ``.``)."""
    wanted = {k.replace("__", "."): v for k, v in match.items()}
    found = [p for a, p, _ in points if all(a.get(k) == v for k, v in wanted.items())]
    assert len(found) == 1, (wanted, [a for a, _, _ in points])
    return found[0]


class _Timed:
    """What the client saw of one streamed request, on its own clock."""

    def __init__(self, started: float, first: float, last_token: float, end: float) -> None:
        self.ttft = first - started
        self.duration = end - started
        self.decode = last_token - first
        self.usage: dict[str, Any] = {}


def _stream(client: httpx.Client, model: str, first_delay: float) -> _Timed:
    """One streamed chat request; the client's timestamps and the usage the upstream sent."""
    body: dict[str, Any] = {"model": model, "stream": True, "x_chunks": CHUNKS, "x_delay": GAP}
    body["stream_options"] = {"include_usage": True}  # else stagelens strips the usage it asks
    body["x_first_delay"] = first_delay
    started = time.perf_counter()
    first = last_token = 0.0
    data = b""
    with client.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        for chunk in response.iter_raw():
            now = time.perf_counter()
            if chunk and not first:
                first = now
            if b'"delta"' in chunk:
                last_token = now
            data += chunk
    timed = _Timed(started, first, last_token, time.perf_counter())
    for line in data.split(b"\n"):
        if line.startswith(b"data: {") and b'"usage"' in line:
            timed.usage = json.loads(line[6:])["usage"]
    return timed


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[OtlpReceiver]:
    """A real OTLP/HTTP receiver that the metrics exporter is pointed at by ``OTEL_*``."""
    with otlp_receiver() as server:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", f"{server.url}/v1/metrics")
        monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "600000")  # only our flushes
        monkeypatch.delenv(semconv.SEMCONV_STABILITY_OPT_IN_ENV, raising=False)
        yield server


def _gateway(upstream: Starlette, **settings: Any) -> Telemetry:
    return configure(
        registry=CollectorRegistry(), span_exporters=[], set_global=False, gpu=False, **settings
    )


class TestOverOtlp:
    """configure(genai_metrics=True) in front of a scripted upstream, read by a receiver."""

    def test_each_request_matches_the_client_clock_and_the_upstream_usage(
        self, upstream: Starlette, receiver: OtlpReceiver, port_factory: Any, proxy_factory: Any
    ) -> None:
        """Per request: one duration, TTFT and time-per-output-token observation within the
        client's own timings, the upstream's token counts, and the v1.41 attributes; a
        refused request has only a duration with error.type; a plain answer no TTFT."""
        telemetry = _gateway(upstream, genai_metrics=True)
        app, _ = proxy_factory(SimpleNamespace(telemetry=telemetry))
        delays = {"m0": 0.02, "m1": 0.06, "m2": 0.12}
        seen: dict[str, _Timed] = {}
        with (
            Served(app, port_factory(), lifespan="off") as served,
            httpx.Client(base_url=served.url) as client,
        ):
            for model, first_delay in delays.items():
                seen[model] = _stream(client, model, first_delay)
            plain = client.post("/v1/chat/completions", json={"model": "m-plain"})
            assert plain.status_code == 200
            refused = client.post("/v1/chat/completions", json={"model": "no-such-model"})
            assert refused.status_code == 404
        _export(telemetry)  # the server has stopped: every request's end was recorded
        points = _points(receiver)
        port = int(upstream.state.url.rsplit(":", 1)[1])
        duration = points["gen_ai.server.request.duration"]
        ttft = points["gen_ai.server.time_to_first_token"]
        tpot = points["gen_ai.server.time_per_output_token"]
        usage = points["gen_ai.client.token.usage"]
        for model, first_delay in delays.items():
            timed = seen[model]
            common = {
                "gen_ai.operation.name": "chat",
                "gen_ai.system": "vllm",
                "gen_ai.request.model": model,
                "gen_ai.response.model": model,
                "server.address": "127.0.0.1",
                "server.port": port,
            }
            d = _one(duration, **{k.replace(".", "__"): v for k, v in common.items()})
            assert d.count == 1
            # The gateway's clock stops when its last send returns, which may follow the
            # client's receipt of that byte by a little: SLACK either way.
            assert timed.duration - 0.25 < d.sum <= timed.duration + SLACK, model
            t = _one(ttft, gen_ai__request__model=model)
            assert t.count == 1
            assert first_delay <= t.sum <= timed.ttft + SLACK, model
            assert timed.ttft - t.sum < 0.25
            p = _one(tpot, gen_ai__request__model=model)
            assert p.count == 1
            # The client's own decode time over its tokens after the first, and the floor
            # the upstream's scripted gaps set.
            per_token = timed.decode / (timed.usage["completion_tokens"] - 1)
            # At least the scripted gaps, less the jitter of the gateway's first send: a
            # first token sent a few us late shortens the span it starts (seen: 9.999 ms).
            assert p.sum >= GAP - 0.001
            # The semconv's definition, with the upstream's token count the client read.
            tokens_after_first = timed.usage["completion_tokens"] - 1
            assert p.sum == pytest.approx((d.sum - t.sum) / tokens_after_first)
            assert abs(p.sum - per_token) < 0.25 / (CHUNKS - 1), (p.sum, per_token)
            for kind, key in (("input", "prompt_tokens"), ("output", "completion_tokens")):
                u = _one(usage, gen_ai__request__model=model, gen_ai__token__type=kind)
                assert (u.count, u.sum) == (1, timed.usage[key]), (model, kind)
            for attributes, _, _ in duration + ttft + tpot + usage:
                assert "gen_ai.provider.name" not in attributes
        plain_point = _one(duration, gen_ai__request__model="m-plain")
        assert plain_point.count == 1
        assert "error.type" not in _attrs(duration, plain_point)
        assert not [a for a, _, _ in ttft + tpot if a["gen_ai.request.model"] == "m-plain"]
        plain_usage = _one(usage, gen_ai__request__model="m-plain", gen_ai__token__type="output")
        assert plain_usage.sum == plain.json()["usage"]["completion_tokens"]
        failed = _one(duration, gen_ai__request__model=semconv.MODEL_OTHER)
        assert failed.count == 1
        assert _attrs(duration, failed)["error.type"] == "404"
        assert not [a for a, _, _ in ttft + tpot if a["gen_ai.request.model"] == "other"]
        for name, advice in ADVICE.items():
            for _, point, kind in points[name]:
                assert kind == "histogram"
                assert list(point.explicit_bounds) == [float(b) for b in advice], name

    def test_exponential_option_exports_exponential_histograms(
        self, upstream: Starlette, receiver: OtlpReceiver, port_factory: Any, proxy_factory: Any
    ) -> None:
        """With genai_metrics_exponential every GenAI instrument arrives as an exponential
        histogram holding the request's one observation (and no explicit buckets)."""
        telemetry = _gateway(upstream, genai_metrics=True, genai_metrics_exponential=True)
        app, _ = proxy_factory(SimpleNamespace(telemetry=telemetry))
        with (
            Served(app, port_factory(), lifespan="off") as served,
            httpx.Client(base_url=served.url) as client,
        ):
            timed = _stream(client, "m-exp", 0.02)
        _export(telemetry)  # the server has stopped: every request's end was recorded
        points = _points(receiver)
        assert set(points) == set(genai_metrics.GEN_AI_HISTOGRAMS)
        for name in genai_metrics.GEN_AI_HISTOGRAMS:
            for _, point, kind in points[name]:
                assert kind == "exponential_histogram", name
                assert point.count == 1
        d = _one(points["gen_ai.server.request.duration"], gen_ai__request__model="m-exp")
        assert 0 < d.sum <= timed.duration + SLACK

    def test_opted_in_the_provider_is_gen_ai_provider_name(
        self, upstream: Starlette, receiver: OtlpReceiver, port_factory: Any,
        proxy_factory: Any, monkeypatch: pytest.MonkeyPatch,
    ) -> None:  # fmt: skip
        """OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental (among other values)
        puts v1.41's gen_ai.provider.name where v1.36's gen_ai.system was, nothing else."""
        monkeypatch.setenv(semconv.SEMCONV_STABILITY_OPT_IN_ENV, "http, gen_ai_latest_experimental")
        telemetry = _gateway(upstream, genai_metrics=True)
        app, _ = proxy_factory(SimpleNamespace(telemetry=telemetry))
        with (
            Served(app, port_factory(), lifespan="off") as served,
            httpx.Client(base_url=served.url) as client,
        ):
            _stream(client, "m-new", 0.0)
        _export(telemetry)  # the server has stopped: every request's end was recorded
        points = _points(receiver)
        for name in genai_metrics.GEN_AI_HISTOGRAMS:
            for attributes, _, _ in points[name]:
                assert attributes["gen_ai.provider.name"] == "vllm"
                assert "gen_ai.system" not in attributes

    def test_off_by_default_nothing_is_created(
        self, upstream: Starlette, receiver: OtlpReceiver, port_factory: Any,
        proxy_factory: Any, monkeypatch: pytest.MonkeyPatch,
    ) -> None:  # fmt: skip
        """Without the flag no GenAI instrument, sink or pipeline exists, requests carry no
        GenAI record, and nothing is exported."""
        created: list[object] = []
        monkeypatch.setattr(genai_metrics.GenAIMetrics, "__init__", _refuse(created))
        monkeypatch.delenv("STAGELENS_GENAI_METRICS", raising=False)
        telemetry = _gateway(upstream)
        assert telemetry.settings.genai_metrics is False
        submitted: list[RequestRecord] = []
        submit = telemetry.fold.submit
        monkeypatch.setattr(telemetry.fold, "submit", lambda r: (submitted.append(r), submit(r)))
        app, _ = proxy_factory(SimpleNamespace(telemetry=telemetry))
        with (
            Served(app, port_factory(), lifespan="off") as served,
            httpx.Client(base_url=served.url) as client,
        ):
            _stream(client, "m-off", 0.0)
        telemetry.fold.fold()
        assert created == []
        assert not telemetry.fold.needs_genai
        assert len(telemetry.fold.sinks) == 1  # the Prometheus sink alone
        assert [r.genai for r in submitted] == [None]
        assert not [p for p, _ in receiver.received if p == "/v1/metrics"]

    def test_the_env_flag_turns_it_on(
        self, upstream: Starlette, receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """STAGELENS_GENAI_METRICS=1 is the documented switch; once per set of instruments."""
        monkeypatch.setenv("STAGELENS_GENAI_METRICS", "1")
        telemetry = _gateway(upstream)
        assert len(telemetry.fold.sinks) == 2
        assert enable_genai_metrics(telemetry) is enable_genai_metrics(telemetry.derive())
        assert len(telemetry.fold.sinks) == 2


class TestFlushAndShutdown:
    """Telemetry.force_flush() and shutdown() cover the GenAI metrics as they do spans."""

    def _metric_names(self, receiver: OtlpReceiver) -> set[str]:
        return {
            metric.name
            for path, message in receiver.received
            if path == "/v1/metrics"
            for rm in message.resource_metrics
            for sm in rm.scope_metrics
            for metric in sm.metrics
        }

    def test_force_flush_exports_the_requests_and_shutdown_stops_the_pipeline(
        self, upstream: Starlette, receiver: OtlpReceiver, port_factory: Any, proxy_factory: Any
    ) -> None:
        """A request's GenAI metrics reach the receiver on telemetry.force_flush() (a derived
        Telemetry's too), not before (the export interval is ten minutes); shutdown() makes
        the final export and stops the pipeline, once."""
        telemetry = _gateway(upstream, genai_metrics=True)
        app, _ = proxy_factory(SimpleNamespace(telemetry=telemetry))
        with (
            Served(app, port_factory(), lifespan="off") as served,
            httpx.Client(base_url=served.url) as client,
        ):
            _stream(client, "m-flush", 0.0)
        assert self._metric_names(receiver) == set()
        assert telemetry.derive().force_flush(5000)
        assert semconv.OTEL_GEN_AI_SERVER_REQUEST_DURATION in self._metric_names(receiver)
        posts = len(receiver.received)
        telemetry.shutdown()
        assert len(receiver.received) == posts + 1  # the final export
        pipeline = enable_genai_metrics(telemetry).pipeline
        assert pipeline is not None
        assert pipeline.provider._shutdown  # stopped: nothing more is exported at exit
        telemetry.shutdown()
        assert len(receiver.received) == posts + 1

    def test_a_given_meter_provider_is_flushed_never_shut_down(
        self, upstream: Starlette, port_factory: Any, proxy_factory: Any
    ) -> None:
        """On the user's meter provider: force_flush() and shutdown() export what stagelens
        recorded there, and the provider keeps running for its owner."""
        out = io.StringIO()
        reader = PeriodicExportingMetricReader(
            ConsoleMetricExporter(out=out), export_interval_millis=600_000
        )
        provider = MeterProvider(metric_readers=[reader])
        telemetry = configure(
            registry=CollectorRegistry(),
            span_exporters=[],
            set_global=False,
            gpu=False,
            genai_metrics=True,
            meter_provider=provider,
        )
        app, _ = proxy_factory(SimpleNamespace(telemetry=telemetry))
        with (
            Served(app, port_factory(), lifespan="off") as served,
            httpx.Client(base_url=served.url) as client,
        ):
            _stream(client, "m-given", 0.0)
        assert semconv.OTEL_GEN_AI_SERVER_REQUEST_DURATION not in out.getvalue()
        assert telemetry.force_flush(5000)
        assert semconv.OTEL_GEN_AI_SERVER_REQUEST_DURATION in out.getvalue()
        telemetry.shutdown()
        assert not provider._shutdown
        assert provider.force_flush(5000)
        provider.shutdown()


def _export(telemetry: Telemetry) -> None:
    """Export what the gateway recorded now, then stop its pipeline (no export at exit)."""
    pipeline = enable_genai_metrics(telemetry).pipeline
    assert pipeline is not None
    assert pipeline.force_flush()
    pipeline.shutdown()


def _refuse(created: list[object]) -> Any:
    def init(self: object, *args: object, **kwargs: object) -> None:
        created.append(self)
        raise AssertionError("GenAIMetrics created with the flag off")

    return init


def _attrs(points: list[tuple[dict[str, Any], Any, str]], point: Any) -> dict[str, Any]:
    return next(a for a, p, _ in points if p is point)


# -- the sink alone, in memory: untrusted figures ------------------------------------------
def _in_memory(**options: Any) -> tuple[GenAIMetrics, InMemoryMetricReader]:
    reader = InMemoryMetricReader()
    return GenAIMetrics(MeterProvider(metric_readers=[reader]), **options), reader


def _collected(reader: InMemoryMetricReader) -> dict[str, list[Any]]:
    data = reader.get_metrics_data()
    out: dict[str, list[Any]] = {}
    if data is None:
        return out
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                out.setdefault(metric.name, []).extend(metric.data.data_points)
    return out


_NUMBER = st.one_of(
    # Finite values up to 1e300: a batch of 8 such durations cannot add up past the
    # largest float, which two values near it do (the points' sum is then inf, an
    # overflow of the arithmetic, not a value recorded that should not be).
    st.floats(min_value=-1e300, max_value=1e300),
    st.sampled_from([math.nan, math.inf, -math.inf]),
    st.integers(-(2**70), 2**70),
)


@st.composite
def _records(draw: st.DrawFn) -> RequestRecord:
    billing = draw(
        st.none()
        | st.builds(
            BillingRecord,
            tenant=st.just("t"),
            input_tokens=st.integers(-(2**40), 2**40),
            output_tokens=st.integers(-(2**40), 2**40),
            cached_input_tokens=st.integers(0, 10),
            cost_usd=st.floats(0, 1),
            reasoning_tokens=st.integers(-(2**40), 2**40),
        )
    )
    call = draw(
        st.none()
        | st.builds(
            GenAICall,
            operation=st.sampled_from(["chat", "text_completion", "embeddings"]),
            stream=st.booleans(),
            server_address=st.none() | st.text(max_size=20),
            server_port=st.none() | st.integers(0, 65535),
            response_model=st.none() | st.text(max_size=300),
        )
    )
    return RequestRecord(
        model=draw(st.text(max_size=10)),
        code=str(draw(st.integers(100, 599))),
        duration=draw(_NUMBER),
        ttft=draw(st.none() | _NUMBER),
        gaps=[],
        stages=StageTimes([]),
        phases=None,
        rejected_by=None,
        billing=billing,
        genai=call,
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=st.lists(_records(), max_size=8))
def test_any_batch_is_recorded_or_skipped_never_raised(batch: list[RequestRecord]) -> None:
    """Whatever the figures (NaN, infinities, negative or huge token counts, odd names),
    recording never raises and never errs; each request with a GenAI call and a usable
    duration is one duration observation, and only usable values are observed."""
    errors: list[BaseException] = []
    metrics, reader = _in_memory(latest=False, on_error=errors.append, max_response_models=3)
    metrics.record(batch)
    assert errors == []
    got = _collected(reader)

    def usable(v: float | None) -> bool:
        return v is not None and v >= 0 and math.isfinite(v)

    expected = sum(1 for r in batch if r.genai is not None and usable(r.duration))
    points = got.get("gen_ai.server.request.duration", [])
    assert sum(p.count for p in points) == expected
    for name, values in got.items():
        for p in values:
            assert math.isfinite(p.sum), name
            assert p.sum >= 0, name
    models = {
        p.attributes.get("gen_ai.response.model")
        for values in got.values()
        for p in values
        if "gen_ai.response.model" in p.attributes
    }
    assert len(models) <= 3


def test_reasoning_tokens_are_a_third_token_usage_value() -> None:
    """A request whose model reasoned records its reasoning tokens as
    ``gen_ai.token.type=reasoning`` beside input and output; one that did not records none."""
    metrics, reader = _in_memory(latest=False)
    call = GenAICall("chat", True, "127.0.0.1", 8000)

    def record(model: str, reasoning: int) -> RequestRecord:
        return RequestRecord(
            model=model,
            code="200",
            duration=1.0,
            ttft=0.1,
            gaps=[],
            stages=StageTimes([]),
            phases=None,
            rejected_by=None,
            billing=BillingRecord("t", 7, 20, 0, 0.01, reasoning),
            genai=call,
        )

    metrics.record([record("think", 15), record("plain", 0)])
    points = _collected(reader)["gen_ai.client.token.usage"]
    sums = {
        (p.attributes["gen_ai.request.model"], p.attributes["gen_ai.token.type"]): p.sum
        for p in points
    }
    assert sums == {
        ("think", "input"): 7,
        ("think", "output"): 20,
        ("think", semconv.GEN_AI_TOKEN_TYPE_REASONING): 15,
        ("plain", "input"): 7,
        ("plain", "output"): 20,
    }


def test_buckets_are_the_semconv_advice() -> None:
    """The advisory boundaries stagelens passes are the v1.41.0 document's, in memory too."""
    assert {
        "gen_ai.server.request.duration": list(GEN_AI_SERVER_REQUEST_DURATION_BUCKETS),
        "gen_ai.server.time_per_output_token": list(GEN_AI_SERVER_TIME_PER_OUTPUT_TOKEN_BUCKETS),
        "gen_ai.server.time_to_first_token": list(GEN_AI_SERVER_TIME_TO_FIRST_TOKEN_BUCKETS),
        "gen_ai.client.token.usage": list(GEN_AI_CLIENT_TOKEN_USAGE_BUCKETS),
    } == ADVICE
    metrics, reader = _in_memory(latest=True)
    call = GenAICall("chat", True, "engine", 8000, "tiny")
    billing = BillingRecord("t", 10, 4, 0, 0.0)
    record = RequestRecord(
        "tiny", "200", 0.5, 0.1, [], StageTimes([]), None, None, billing, genai=call
    )
    metrics.record([record])
    for name, values in _collected(reader).items():
        (point,) = [p for p in values if p.attributes.get("gen_ai.token.type") != "output"]
        assert isinstance(point, HistogramDataPoint)
        assert not isinstance(point, ExponentialHistogramDataPoint)
        assert list(point.explicit_bounds) == [float(b) for b in ADVICE[name]]
        assert point.attributes["gen_ai.provider.name"] == "vllm"


@pytest.mark.parametrize(
    ("value", "latest"),
    [
        ("", False),
        ("gen_ai_latest_experimental", True),
        ("http/dup, gen_ai_latest_experimental ", True),
        ("gen_ai", False),
        ("GEN_AI_LATEST_EXPERIMENTAL", False),
    ],
)
def test_opt_in_is_read_as_contrib_reads_it(value: str, latest: bool) -> None:
    """Comma-separated, items stripped, exact (case-sensitive) match, as opentelemetry-
    instrumentation's _semconv reads OTEL_SEMCONV_STABILITY_OPT_IN."""
    assert genai_metrics.latest_experimental(value) is latest
