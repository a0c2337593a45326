"""A real OTLP/HTTP receiver for tests: accepts ``/v1/traces`` and ``/v1/metrics`` POSTs on
a loopback port and decodes them with ``opentelemetry-proto`` (the collector's own schema),
so what a test reads is what a collector would have received."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest


class OtlpReceiver(http.server.ThreadingHTTPServer):
    """Keeps every request it was sent as ``(path, decoded message)``."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.received: list[tuple[str, Any]] = []
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>`` (append ``/v1/traces`` or ``/v1/metrics``)."""
        return f"http://127.0.0.1:{self.server_address[1]}"

    def add(self, path: str, message: Any) -> None:
        with self._lock:
            self.received.append((path, message))

    def spans(self) -> list[dict[str, Any]]:
        """Every span received so far, flattened: name, ids (hex), times, attributes and
        the resource's attributes."""
        with self._lock:
            messages = [m for p, m in self.received if p == "/v1/traces"]
        out = []
        for message in messages:
            for rs in message.resource_spans:
                resource = {a.key: a.value.string_value for a in rs.resource.attributes}
                for ss in rs.scope_spans:
                    for span in ss.spans:
                        out.append(
                            {
                                "name": span.name,
                                "trace_id": span.trace_id.hex(),
                                "span_id": span.span_id.hex(),
                                "parent_span_id": span.parent_span_id.hex(),
                                "start": span.start_time_unix_nano,
                                "end": span.end_time_unix_nano,
                                "attributes": {
                                    a.key: a.value.string_value for a in span.attributes
                                },
                                "resource": resource,
                            }
                        )
        return out

    def wait_for(
        self, found: Callable[[], bool], timeout: float = 15.0, interval: float = 0.1
    ) -> bool:
        """Poll until ``found()`` is true; False after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if found():
                return True
            time.sleep(interval)
        return found()


class _Handler(http.server.BaseHTTPRequestHandler):
    server: OtlpReceiver

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["content-length"]))
        kind = {"/v1/traces": ExportTraceServiceRequest, "/v1/metrics": ExportMetricsServiceRequest}
        decoder = kind.get(self.path)
        if decoder is None:
            self.send_response(404)
            self.end_headers()
            return
        message = decoder()
        message.ParseFromString(body)
        self.server.add(self.path, message)
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def otlp_receiver() -> Iterator[OtlpReceiver]:
    """A running receiver, shut down on exit."""
    server = OtlpReceiver()
    thread = threading.Thread(target=server.serve_forever, name="otlp-receiver", daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
