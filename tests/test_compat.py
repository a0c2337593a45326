"""stagelens._compat: every third-party internal stagelens reads is active on the installed
versions, and its public fallback gives the same result."""

from __future__ import annotations

import http.server
import math
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tomllib
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry import baggage, propagate, trace
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.metrics import NoOpMeter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    MetricExporter,
    MetricExportResult,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanContext, SpanKind, TraceFlags
from prometheus_client import CollectorRegistry, Counter, Histogram, values
from prometheus_client import multiprocess as mp

from stagelens import _compat
from stagelens.metrics.buckets import INTER_TOKEN_LATENCY_BUCKETS
from stagelens.metrics.series import FastCounter, FastHistogram
from stagelens.spans import provider as deferred
from stagelens.spans.provider import DeferredTracerProvider

ROOT = Path(__file__).resolve().parents[1]

# --- prometheus-client -------------------------------------------------------------------


def _samples(registry: CollectorRegistry) -> list[tuple[str, dict[str, str], float]]:
    return [
        (s.name, s.labels, s.value)
        for m in registry.collect()
        for s in m.samples
        if not s.name.endswith("_created")
    ]


@pytest.fixture(params=[False, True], ids=["in-process", "multiprocess"])
def multiprocess(request, tmp_path, monkeypatch) -> bool:
    """prometheus-client in its default mode, or in multiprocess mode (values in files)."""
    if request.param:
        monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
        monkeypatch.setattr(values, "ValueClass", values.get_value_class())
    return bool(request.param)


def test_in_process_values_is_read_as_prometheus_client_chose(multiprocess, monkeypatch) -> None:
    """``values.ValueClass`` is there and tells the mode; without it, the environment
    variable gives the same answer."""
    assert isinstance(values.ValueClass, type) or callable(values.ValueClass)
    assert _compat.in_process_values() is not multiprocess
    monkeypatch.delattr(values, "ValueClass")
    assert _compat.in_process_values() is not multiprocess


@pytest.mark.parametrize("path", ["storage", "fallback"])
def test_fast_recording_equals_prometheus_client(multiprocess, monkeypatch, path) -> None:
    """FastHistogram (one by one and in bulk) and FastCounter, through the value storage
    (active on the installed version) or through the public fallback, give exactly the
    samples of prometheus-client's own observe()/inc(), also on multiprocess values."""
    if path == "fallback":
        monkeypatch.setattr(_compat, "histogram_storage", lambda child: None)
        monkeypatch.setattr(_compat, "counter_storage", lambda child: None)
    observed = [0.0001, 0.0005, 0.001, 0.0011, 0.004, 0.004, 0.3, 2.5, 7.0, 0.0, 1e9]
    amounts = [1, 3.5, 0, 12]

    def build(prefix: str, registry: CollectorRegistry) -> tuple[Any, Any, Any]:
        buckets = INTER_TOKEN_LATENCY_BUCKETS
        h = Histogram(f"{prefix}_h", "h", ["m"], buckets=buckets, registry=registry)
        c = Counter(f"{prefix}_c", "c", ["m"], registry=registry)
        return h.labels("x"), h.labels("y"), c.labels("x")

    a, b = CollectorRegistry(), CollectorRegistry()
    ha, ha2, ca = build("a", a)
    hb, hb2, cb = build("b", b)
    for v in observed:
        ha.observe(v)
        ha2.observe(v)
    for n in amounts:
        ca.inc(n)
    fast = FastHistogram(hb)
    counter = FastCounter(cb)
    active = path == "storage"
    assert (fast._bounds is not None) is active
    assert (counter._value is not None) is active
    for v in observed:
        fast.observe(v)
    bulk = FastHistogram(hb2)
    bulk.observe_many(observed)
    assert (fast.lowest, fast.highest) == (bulk.lowest, bulk.highest) == (0.0, 1e9)
    for n in amounts:
        counter.inc(n)
    counter.inc(-5)  # dropped: a counter never goes down
    if multiprocess:
        a = CollectorRegistry()
        mp.MultiProcessCollector(a)
        got = [(n.removeprefix("b_"), lbl, v) for n, lbl, v in _samples(a) if n.startswith("b_")]
        want = [(n.removeprefix("a_"), lbl, v) for n, lbl, v in _samples(a) if n.startswith("a_")]
    else:
        got = [(n.removeprefix("b_"), lbl, v) for n, lbl, v in _samples(b)]
        want = [(n.removeprefix("a_"), lbl, v) for n, lbl, v in _samples(a)]
    assert got
    assert sorted(got, key=repr) == sorted(want, key=repr)


_BOUNDS = st.sampled_from(INTER_TOKEN_LATENCY_BUCKETS)
_VALUES = st.lists(
    st.one_of(st.floats(), _BOUNDS, st.integers(-3, 3), st.floats(0, 3).map(round)), max_size=60
)


@settings(max_examples=200, deadline=None)
@given(values=_VALUES)
def test_observe_many_counts_as_observe_would(values: list[float]) -> None:
    """Any values (bounds, ints, infinities, NaN) observed at once land in the buckets, and
    add to the count and sum, as observing each in turn through ``observe()`` would; the
    smallest and largest kept are those of the values that are numbers."""
    a, b = CollectorRegistry(), CollectorRegistry()
    ha = Histogram("h", "h", buckets=INTER_TOKEN_LATENCY_BUCKETS, registry=a)
    hb = Histogram("h", "h", buckets=INTER_TOKEN_LATENCY_BUCKETS, registry=b)
    for value in values:
        if value == value:  # FastHistogram drops NaN; observe() adds it to the sum
            ha.observe(value)
    fast = FastHistogram(hb)
    fast.observe_many(list(values))
    numbers = [v for v in values if v == v]
    assert (fast.lowest, fast.highest) == (
        (min(numbers), max(numbers)) if numbers else (math.inf, -math.inf)
    )
    want = {(n, repr(lbl)): v for n, lbl, v in _samples(a) if not n.endswith("_sum")}
    got = {(n, repr(lbl)): v for n, lbl, v in _samples(b) if not n.endswith("_sum")}
    assert got == want
    total = [v for n, _, v in _samples(b) if n.endswith("_sum")]
    assert total == [sum((v for v in values if v == v), 0.0)] or total[0] != total[0]


@pytest.mark.parametrize("path", ["storage", "exemplar-fallback", "fallback"])
def test_exemplars_kept_equal_prometheus_client(monkeypatch, path) -> None:
    """FastHistogram.observe_many with exemplar candidates, through the buckets' exemplar
    storage (active on the installed version), through the public ``observe(value,
    exemplar)`` (no exemplar storage, or no storage at all), gives the samples and the
    per-bucket exemplars (labels and value) of prometheus-client's own observe() with the
    candidates in order."""
    from stagelens.metrics.series import ExemplarRef, exemplar_labels

    if path != "storage":
        monkeypatch.setattr(_compat, "exemplar_storage", lambda storage: None)
    if path == "fallback":
        monkeypatch.setattr(_compat, "histogram_storage", lambda child: None)
    observed = [0.0001, 0.0005, 0.001, 0.0011, 0.004, 0.004, 0.3, 2.5, 7.0, 0.0, 1e9, 0.3]
    refs = [ExemplarRef(i + 1, i + 100, 1.7e9 + i) for i in range(len(observed))]
    candidates = [(v, r) for i, (v, r) in enumerate(zip(observed, refs, strict=True)) if i % 3]
    a, b = CollectorRegistry(), CollectorRegistry()
    buckets = INTER_TOKEN_LATENCY_BUCKETS
    ha = Histogram("h", "h", ["m"], buckets=buckets, registry=a).labels("x")
    hb = Histogram("h", "h", ["m"], buckets=buckets, registry=b).labels("x")
    for i, (v, r) in enumerate(zip(observed, refs, strict=True)):
        ha.observe(v, exemplar_labels(r) if i % 3 else None)
    fast = FastHistogram(hb)
    assert (fast._exemplars is not None) is (path == "storage")
    fast.observe_many(list(observed), candidates)

    def exemplars(registry: CollectorRegistry) -> dict[str, Any]:
        return {
            s.labels["le"]: (s.exemplar.labels, s.exemplar.value)
            for m in registry.collect()
            for s in m.samples
            if s.exemplar is not None
        }

    # The public path observes the candidates first: the sum differs by float rounding only.
    want = {(n, repr(lbl)): v for n, lbl, v in _samples(a)}
    assert {(n, repr(lbl)): pytest.approx(v) for n, lbl, v in _samples(b)} == want
    assert exemplars(b) == exemplars(a)
    assert len(exemplars(b)) >= 5


def test_storage_that_is_not_as_tested_is_refused() -> None:
    """A child whose internals changed shape gets the public path, never a crash."""

    class Moved:
        _upper_bounds = (1.0, float("inf"))  # a tuple, not the tested list
        _buckets = [object(), object()]
        _sum = None
        _value = 3

    assert _compat.histogram_storage(Moved()) is None
    assert _compat.counter_storage(Moved()) is None

    class NoExemplars:
        def inc(self, amount: float) -> None:
            pass

    storage = _compat.HistogramStorage([1.0, float("inf")], [NoExemplars()] * 2, NoExemplars())
    assert _compat.exemplar_storage(storage) is None


# --- opentelemetry -----------------------------------------------------------------------


class _Receiver(http.server.BaseHTTPRequestHandler):
    bodies: list[bytes] = []

    def do_POST(self) -> None:
        type(self).bodies.append(self.rfile.read(int(self.headers["content-length"])))
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[tuple[str, list[bytes]]]:
    """An OTLP/HTTP endpoint on a free loopback port keeping every request body."""
    bodies: list[bytes] = []
    handler = type("Handler", (_Receiver,), {"bodies": bodies})
    server = http.server.HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1/traces", bodies
    server.shutdown()


def _recorded_spans() -> list[Any]:
    """A small trace from the deferred tracer: remote parent, attributes, event, error."""
    provider = DeferredTracerProvider([], lambda reason, n: None)
    tracer = provider.get_tracer("stagelens", "1.0")
    remote = SpanContext(0xABC, 0xDEF, is_remote=True, trace_flags=TraceFlags(1))
    root = tracer.start_span(
        "POST /v1/chat/completions",
        context=trace.set_span_in_context(trace.NonRecordingSpan(remote)),
        kind=SpanKind.SERVER,
        attributes={"http.request.method": "POST", "server.port": 8000, "tags": ["a", "b"]},
    )
    child = tracer.start_span("tokenizer", context=trace.set_span_in_context(root))
    child.add_event("cache", {"hit": True})
    child.record_exception(ValueError("bad"))
    child.set_status(trace.StatusCode.ERROR, "bad")
    child.end()
    root.end()
    provider.shutdown()
    return [child, root]


def test_otlp_client_is_used_and_sends_what_the_public_export_sends(receiver, monkeypatch) -> None:
    """The OTLP/HTTP span exporter's client is found on the installed SDK; the batch it
    is sent (our encoding) decodes to the same request the exporter's own ``export()``
    (the SDK's encoding, the fallback) sends."""
    endpoint, bodies = receiver
    resource = Resource.create({"service.name": "compat"})
    spans = _recorded_spans()
    exporter = OTLPSpanExporter(endpoint=endpoint)
    assert _compat.otlp_http_span_client(exporter) is not None
    assert deferred._sink_for(exporter, resource)(spans)
    monkeypatch.setattr(_compat, "otlp_http_span_client", lambda exporter: None)
    assert deferred._sink_for(exporter, resource)(spans)
    ours, theirs = (ExportTraceServiceRequest.FromString(body) for body in bodies)
    assert len(ours.resource_spans[0].scope_spans[0].spans) == 2
    assert ours == theirs


def test_otlp_client_is_not_taken_from_other_exporters() -> None:
    """A subclass (which may override export()) or another exporter keeps the public path."""

    class Custom(OTLPSpanExporter):
        pass

    assert _compat.otlp_http_span_client(Custom(endpoint="http://127.0.0.1:9/v1/traces")) is None
    assert _compat.otlp_http_span_client(InMemorySpanExporter()) is None


class _Capturing(MetricExporter):
    """Keeps the value and temporality of every exported counter point."""

    def __init__(self, preferences: tuple[Any, Any]) -> None:
        super().__init__(preferred_temporality=preferences[0], preferred_aggregation=preferences[1])
        self.points: list[tuple[float, AggregationTemporality]] = []

    def export(self, metrics_data: Any, timeout_millis: float = 10_000, **kwargs: Any) -> Any:
        for resource in metrics_data.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    for point in metric.data.data_points:
                        self.points.append((point.value, metric.data.aggregation_temporality))
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        pass


def _counted_twice(preferences: tuple[Any, Any]) -> list[tuple[float, AggregationTemporality]]:
    """A counter added 1, exported, added 1, exported, by an exporter with ``preferences``."""
    exporter = _Capturing(preferences)
    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=3_600_000)
    provider = MeterProvider(metric_readers=[reader])
    counter = provider.get_meter("t").create_counter("c")
    for _ in range(2):
        counter.add(1)
        provider.force_flush()
    provider.shutdown()
    return exporter.points[:2]


def test_metric_exporter_preferences_are_read_and_default_like_the_sdk(monkeypatch) -> None:
    """The OTLP metric exporter's preferences are found and, handed on to another exporter,
    export as it would: cumulative by default, as the SDK's defaults (the fallback) do, and
    delta when the environment asks for it (which only the read preferences carry)."""
    found = _compat.metric_exporter_preferences(OTLPMetricExporter())
    assert found != (None, None)
    cumulative = AggregationTemporality.CUMULATIVE
    assert _counted_twice(found) == [(1, cumulative), (2, cumulative)]
    assert _counted_twice((None, None)) == _counted_twice(found)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", "delta")
    delta = _compat.metric_exporter_preferences(OTLPMetricExporter())
    assert _counted_twice(delta) == [(1, AggregationTemporality.DELTA)] * 2


def test_gauges_match_the_protocol_stagelens_types_them_with() -> None:
    """``create_gauge()`` returns a ``SyncGauge`` for the SDK's meter and the API's no-op."""
    sdk = MeterProvider().get_meter("t").create_gauge("g")
    noop = NoOpMeter("t").create_gauge("g")
    assert isinstance(sdk, _compat.SyncGauge)
    assert isinstance(noop, _compat.SyncGauge)
    sdk.set(1.0, {"a": "b"})


def test_composite_parts_are_the_default_pair_and_inject_as_the_composite() -> None:
    """The default global propagator's parts are found (W3C trace context, then baggage);
    injecting through them gives the carrier the composite itself (the fallback) gives."""
    textmap = propagate.get_global_textmap()
    parts = _compat.composite_parts(textmap)
    assert parts is not None
    assert [type(p).__name__ for p in parts] == [
        "TraceContextTextMapPropagator",
        "W3CBaggagePropagator",
    ]
    with TracerProvider().get_tracer("t").start_as_current_span("s"):
        ctx = baggage.set_baggage("k", "v")
        by_parts: dict[str, str] = {}
        for part in parts:
            part.inject(by_parts, ctx)
        by_composite: dict[str, str] = {}
        textmap.inject(by_composite, ctx)
    assert by_parts == by_composite
    assert set(by_parts) == {"traceparent", "baggage"}
    assert _compat.composite_parts(parts[0]) is None


def test_the_env_sampler_is_the_sdks(monkeypatch) -> None:
    """The deferred provider samples as ``OTEL_TRACES_SAMPLER[_ARG]`` say, read through the
    SDK's public provider (no private reader)."""
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0.25")
    provider = DeferredTracerProvider([], lambda reason, n: None)
    try:
        assert provider.sampler.get_description() == "TraceIdRatioBased{0.25}"
    finally:
        provider.shutdown()


# --- versions ------------------------------------------------------------------------------


def _lower_bound(requirement: str) -> str:
    found = re.search(r">=\s*([^,;\s]+)", requirement)
    assert found, requirement
    return found.group(1)


def test_lower_bounds_are_the_tested_versions() -> None:
    """pyproject.toml allows no release older than the one the internals were tested on."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = project["dependencies"] + [
        r for extra in project["optional-dependencies"].values() for r in extra
    ]
    by_name = {re.split(r"[<>=!~\[ ;]", r, maxsplit=1)[0].lower(): r for r in requirements}
    assert _lower_bound(by_name["prometheus-client"]) == _compat.PROMETHEUS_CLIENT_TESTED
    for name in (
        "opentelemetry-api",
        "opentelemetry-sdk",
        "opentelemetry-exporter-otlp-proto-http",
    ):
        assert _lower_bound(by_name[name]) == _compat.OPENTELEMETRY_TESTED, name


def test_the_span_key_finds_what_get_current_span_finds() -> None:
    """The current span read from the context by its key is the one the public
    ``get_current_span`` returns, given a context or not; none set, the key finds None."""
    from opentelemetry import context as otel_context

    key = _compat.span_key()
    assert key is not None
    assert otel_context.get_current().get(key) is None
    with TracerProvider().get_tracer("t").start_as_current_span("s") as span:
        assert otel_context.get_current().get(key) is span is trace.get_current_span()
        inner = trace.NonRecordingSpan(span.get_span_context())
        ctx = trace.set_span_in_context(inner)
        assert ctx.get(key) is inner is trace.get_current_span(ctx)


def test_the_current_context_getter_is_get_current() -> None:
    """The one-call reader of the current context is the ContextVar's ``get`` with the
    API's default runtime context, and returns what ``get_current`` returns, inside an
    attached context and outside it."""
    from contextvars import ContextVar

    from opentelemetry import context as otel_context

    getter = _compat.current_context_getter()
    assert isinstance(getattr(getter, "__self__", None), ContextVar)
    assert getter() is otel_context.get_current()
    token = otel_context.attach(otel_context.set_value("k", "v"))
    try:
        assert getter() is otel_context.get_current()
        assert getter().get("k") == "v"
    finally:
        otel_context.detach(token)
    assert getter() is otel_context.get_current()
