"""Fixtures for end-to-end tests of the reference gateway over real vLLM."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from stagelens.reference import create_app, demo_config
from stagelens.reference.config import DEMO_API_KEY

from stagelens.testing import TelemetryCapture, capture_telemetry
from tests._scaffold import Served


class RunningGateway(Served):
    """The reference gateway served by uvicorn on a real loopback port, in-process, with
    its telemetry captured in memory."""

    def __init__(self, app: Any, capture: TelemetryCapture, port: int) -> None:
        super().__init__(app, port)
        self.app = app
        self.capture = capture
        self.api_key = DEMO_API_KEY


def start_gateway(config: Any, port: int, **capture_options: Any) -> Iterator[RunningGateway]:
    with capture_telemetry(**capture_options) as capture:
        app = create_app(config, telemetry=capture.telemetry)
        with RunningGateway(app, capture, port) as gateway:
            yield gateway


@pytest.fixture(scope="module")
def gateway(vllm_server: Any, tiny_model: Path, port_factory: Any) -> Iterator[RunningGateway]:
    """The demo configuration over the session's real vLLM server."""
    yield from start_gateway(demo_config([vllm_server.base_url], str(tiny_model)), port_factory())


@pytest.fixture
def gateway_factory(port_factory: Any) -> Any:
    """``with gateway_factory(config) as gw:`` a dedicated gateway for one test."""
    import contextlib

    @contextlib.contextmanager
    def factory(config: Any) -> Iterator[RunningGateway]:
        yield from start_gateway(config, port_factory())

    return factory


@pytest.fixture(scope="module")
def tight_gateway(
    vllm_server: Any, tiny_model: Path, port_factory: Any
) -> Iterator[RunningGateway]:
    """Two tenants' keys (``sk-good`` -> acme, ``sk-other`` -> globex) and a single admission
    slot for ``tiny`` with a 0.2 s wait, shared by the tests of one module."""
    from stagelens.reference import GatewayConfig

    config = GatewayConfig.model_validate(
        {
            "api_keys": {"sk-good": "acme", "sk-other": "globex"},
            "models": {
                "tiny": {
                    "backends": [vllm_server.base_url],
                    "tokenizer": str(tiny_model),
                    "max_inflight": 1,
                    "admission_timeout_seconds": 0.2,
                }
            },
            "health_interval_seconds": 60,
        }
    )
    yield from start_gateway(config, port_factory())


@pytest.fixture(scope="module")
def serve_app(port_factory: Any) -> Any:
    """``with serve_app(app) as url:`` any ASGI app (the reference gateway built with a
    telemetry of the test's own) served by uvicorn on a real loopback port."""
    import contextlib

    @contextlib.contextmanager
    def serve(app: Any) -> Iterator[str]:
        with RunningGateway(app, None, port_factory()) as running:
            yield running.url

    return serve


class OtlpSink:
    """A collector stand-in on loopback: every span it is sent over OTLP/HTTP, decoded with
    opentelemetry-proto (independently of stagelens' own receiver)."""

    def __init__(self) -> None:
        import http.server

        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        sink = self
        self.spans: list[Any] = []
        self.lock = threading.Lock()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers["content-length"])
                message = ExportTraceServiceRequest.FromString(self.rfile.read(length))
                with sink.lock:
                    for rs in message.resource_spans:
                        for ss in rs.scope_spans:
                            sink.spans.extend(ss.spans)
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"

    def by_trace(self) -> dict[str, list[Any]]:
        """The spans received so far, by trace id in hex."""
        traces: dict[str, list[Any]] = {}
        with self.lock:
            for span in self.spans:
                traces.setdefault(span.trace_id.hex(), []).append(span)
        return traces


@pytest.fixture(scope="module")
def otlp_sink() -> Iterator[OtlpSink]:
    """``OtlpSink`` serving on a free loopback port, shared by the tests of one module."""
    sink = OtlpSink()
    thread = threading.Thread(target=sink.server.serve_forever, daemon=True)
    thread.start()
    yield sink
    sink.server.shutdown()
    sink.server.server_close()


@pytest.fixture(scope="module")
def stack(
    vllm_server: Any, vllm_embed_server: Any, tiny_model: Path, port_factory: Any
) -> Iterator[RunningGateway]:
    """The demo configuration with its embedding pool (``tiny-embed``), over the session's
    real chat and embedding servers."""
    config = demo_config(
        [vllm_server.base_url], str(tiny_model), embed_backends=[vllm_embed_server.base_url]
    )
    yield from start_gateway(config, port_factory())
