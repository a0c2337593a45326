"""configure() over real OTLP: a receiver in the test, and a collector that is down."""

from __future__ import annotations

import gc
import http.server
import threading
import tracemalloc
from collections.abc import Iterator

import httpx
import pytest
from fastapi import FastAPI
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from prometheus_client import CollectorRegistry

from stagelens import Stage, configure, instrument_app, semconv, stage

pytestmark = pytest.mark.anyio


class _ReceiverServer(http.server.HTTPServer):
    received: list[tuple[str, str, ExportTraceServiceRequest]]


class _Receiver(http.server.BaseHTTPRequestHandler):
    server: _ReceiverServer

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["content-length"]))
        message = ExportTraceServiceRequest()
        message.ParseFromString(body)
        self.server.received.append((self.path, self.headers["content-type"], message))
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def otlp_receiver() -> Iterator[_ReceiverServer]:
    """An OTLP/HTTP receiver on a free loopback port that decodes with opentelemetry-proto."""
    server = _ReceiverServer(("127.0.0.1", 0), _Receiver)
    server.received = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()


def _app(telemetry) -> FastAPI:
    app = FastAPI()

    @app.get("/work")
    async def work() -> dict[str, str]:
        with stage(Stage.TOKENIZER):
            pass
        return {"ok": "yes"}

    instrument_app(app, telemetry=telemetry)
    return app


async def test_spans_reach_a_real_otlp_http_receiver(otlp_receiver) -> None:
    """Root and stage spans arrive as OTLP/protobuf with names, kinds and parent links."""
    port = otlp_receiver.server_address[1]
    telemetry = configure(
        span_exporters=[OTLPSpanExporter(endpoint=f"http://127.0.0.1:{port}/v1/traces")],
        registry=CollectorRegistry(),
        set_global=False,
    )
    app = _app(telemetry)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as c:
        assert (await c.get("/work")).status_code == 200
    assert telemetry.force_flush(5000)
    telemetry.shutdown()
    spans = [
        span
        for _path, _ctype, message in otlp_receiver.received
        for rs in message.resource_spans
        for ss in rs.scope_spans
        for span in ss.spans
    ]
    path, ctype, message = otlp_receiver.received[0]
    assert path == "/v1/traces"
    assert ctype == "application/x-protobuf"
    resource = {a.key: a.value.string_value for a in message.resource_spans[0].resource.attributes}
    assert resource["service.name"] == "stagelens-gateway"
    scope = message.resource_spans[0].scope_spans[0].scope
    assert scope.name == semconv.INSTRUMENTATION_NAME
    by_name = {s.name: s for s in spans}
    assert set(by_name) == {"GET /work", "gateway", "tokenizer"}
    root = by_name["GET /work"]
    assert root.kind == root.SPAN_KIND_SERVER
    assert root.parent_span_id == b""
    for name in ("gateway", "tokenizer"):
        child = by_name[name]
        assert child.trace_id == root.trace_id
        assert child.parent_span_id == root.span_id
        attrs = {a.key: a.value for a in child.attributes}
        assert attrs[semconv.ATTR_STAGE].string_value == name
    root_attrs = {a.key: a.value for a in root.attributes}
    assert root_attrs["http.response.status_code"].int_value == 200


async def test_refused_otlp_endpoint_never_fails_requests(port_factory) -> None:
    """Collector down: every request succeeds; spans are dropped, counted, memory bounded."""
    dead = port_factory()  # nothing listens there
    registry = CollectorRegistry()
    telemetry = configure(
        span_exporters=[OTLPSpanExporter(endpoint=f"http://127.0.0.1:{dead}/v1/traces", timeout=1)],
        registry=registry,
        set_global=False,
        span_queue_size=64,
    )
    app = _app(telemetry)
    n = 300
    tracemalloc.start()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as c:
        for _ in range(50):
            assert (await c.get("/work")).status_code == 200
        gc.collect()
        before, _ = tracemalloc.get_traced_memory()
        for _ in range(n - 50):
            assert (await c.get("/work")).status_code == 200
        gc.collect()
        after, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    telemetry.force_flush(10000)
    telemetry.shutdown()

    def dropped(reason: str) -> float:
        return registry.get_sample_value(semconv.SPANS_DROPPED, {"reason": reason}) or 0.0

    total_spans = 3 * n  # root + gateway + tokenizer per request
    assert registry.get_sample_value(semconv.REQUESTS, {"model": "unknown", "code": "200"}) == n
    assert dropped("queue_full") > 0
    assert dropped("queue_full") + dropped("export_failed") == total_spans
    # 250 more requests with a dead collector grow memory by far less than 250 kept traces
    assert after - before < 1_000_000


class TestServiceName:
    """The resource's service.name: the standard OTEL_* variables always win."""

    @pytest.mark.parametrize(
        ("env", "expected"),
        [
            ({}, "my-default"),
            ({"OTEL_SERVICE_NAME": "from-service-name"}, "from-service-name"),
            ({"OTEL_RESOURCE_ATTRIBUTES": "team=x,service.name=from-attrs"}, "from-attrs"),
        ],
    )
    def test_env_wins_over_the_default_name(self, monkeypatch, env, expected) -> None:
        """A default name is used only when neither variable names the service."""
        from stagelens.exporters.otlp import build_tracer_provider

        monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
        monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        provider = build_tracer_provider([], lambda reason, n: None, service_name="my-default")
        assert provider.resource.attributes["service.name"] == expected
        if "OTEL_RESOURCE_ATTRIBUTES" in env:
            assert provider.resource.attributes["team"] == "x"


def test_dead_collector_logs_each_failure_once(port_factory, monkeypatch, caplog) -> None:
    """The OTLP exporter configure() builds logs each kind of failure once, not per batch."""
    import logging

    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from stagelens.exporters.otlp import otlp_exporter

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", f"http://127.0.0.1:{port_factory()}")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1")
    # The once-per-template filters are process-wide: forget what earlier tests logged.
    for name in list(logging.root.manager.loggerDict):
        if name.startswith("opentelemetry.exporter"):
            for found in logging.getLogger(name).filters:
                if hasattr(found, "_seen"):
                    monkeypatch.setattr(found, "_seen", set())
    provider = TracerProvider()
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    with provider.get_tracer("test").start_as_current_span("one"):
        pass
    exporter = otlp_exporter("traces")
    with caplog.at_level(logging.WARNING, logger="opentelemetry"):
        for _ in range(3):
            exporter.export(memory.get_finished_spans())
    exporter.shutdown()
    templates = [r.msg for r in caplog.records if r.name.startswith("opentelemetry.exporter")]
    assert templates  # the failure is logged ...
    assert len(templates) == len(set(templates))  # ... once per kind, not once per batch


class TestBatchSettings:
    """The batch span processor's standard variables shape the deferred export worker."""

    def test_schedule_delay_and_batch_size_are_read(self, monkeypatch) -> None:
        from stagelens.exporters.otlp import build_tracer_provider

        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "250")
        monkeypatch.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "64")
        provider = build_tracer_provider([], lambda reason, n: None)
        try:
            assert provider._delay == 0.25
            assert provider._batch_size == 64
        finally:
            provider.shutdown()

    @pytest.mark.parametrize("value", ["soon", "0", "-5"])
    def test_a_bad_value_is_refused_by_name(self, monkeypatch, value) -> None:
        from stagelens.exporters.otlp import build_tracer_provider

        from stagelens.errors import ConfigurationError

        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", value)
        with pytest.raises(ConfigurationError, match="OTEL_BSP_SCHEDULE_DELAY"):
            build_tracer_provider([], lambda reason, n: None)


class TestOtlpExporterFactory:
    """One factory for span and metric exporters, failing with stagelens's error types."""

    @pytest.mark.parametrize("signal", ["traces", "metrics"])
    def test_unsupported_protocol_is_a_configuration_error(self, signal, monkeypatch) -> None:
        """An unknown protocol names the variable and raises ConfigurationError."""
        from stagelens.exporters.otlp import otlp_exporter

        from stagelens.errors import ConfigurationError

        monkeypatch.setenv(f"OTEL_EXPORTER_OTLP_{signal.upper()}_PROTOCOL", "carrier-pigeon")
        with pytest.raises(ConfigurationError, match=f"OTEL_EXPORTER_OTLP_{signal.upper()}"):
            otlp_exporter(signal)

    @pytest.mark.parametrize("signal", ["traces", "metrics"])
    def test_grpc_without_the_extra_is_a_dependency_error(self, signal, monkeypatch) -> None:
        """grpc asked for, the grpc exporter unimportable: DependencyMissingError (an
        ImportError) naming the extra."""
        import sys

        from stagelens.exporters.otlp import otlp_exporter

        from stagelens.errors import DependencyMissingError

        monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
        for name in ("trace_exporter", "metric_exporter"):
            monkeypatch.setitem(sys.modules, f"opentelemetry.exporter.otlp.proto.grpc.{name}", None)
        with pytest.raises(DependencyMissingError, match=r"stagelens\[grpc\]"):
            otlp_exporter(signal)

    def test_signal_protocol_wins_over_the_general_one(self, monkeypatch) -> None:
        """OTEL_EXPORTER_OTLP_METRICS_PROTOCOL=grpc beats OTEL_EXPORTER_OTLP_PROTOCOL=http."""
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from stagelens.exporters.otlp import otlp_exporter

        monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "grpc")
        metrics, traces = otlp_exporter("metrics"), otlp_exporter("traces")
        try:
            assert isinstance(metrics, OTLPMetricExporter)
            assert isinstance(traces, OTLPSpanExporter)
        finally:
            metrics.shutdown()
            traces.shutdown()
