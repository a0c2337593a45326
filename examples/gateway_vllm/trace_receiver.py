"""A small OTLP/HTTP trace receiver on loopback: what ``stagelens demo`` sends its spans to
when no collector is configured, and what ``stagelens trace`` asks.

Why in the demo: without it a new user's spans, the product's core, go nowhere. It speaks
the real protocol (``POST /v1/traces``, protobuf decoded with ``opentelemetry-proto``,
gzip or deflate bodies), so the gateway exports to it exactly as it would to a collector,
and it answers a query API in OTLP/JSON (``stagelens.views.traces``):

- ``GET /api/traces/<trace id>``: the trace's spans, 404 when unknown;
- ``GET /api/traces?order=slowest|recent&limit=N``: trace summaries.

Memory is bounded: the oldest traces are forgotten past ``max_traces``, and a trace keeps
at most ``max_spans_per_trace`` spans. Bodies are untrusted: a malformed one is answered
400 and changes nothing.
"""

from __future__ import annotations

import gzip
import http.server
import json
import re
import threading
import zlib
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any, Final
from urllib.parse import parse_qs, urlsplit

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from stagelens.views.traces import (
    SERVICE_NAME,
    TRACE_API_PATH,
    AttributeValue,
    SpanRecord,
    TraceSummary,
    local_roots,
    summarize,
    summary_json,
    to_otlp_json,
)

TRACES_PATH: Final = "/v1/traces"
"""The OTLP/HTTP traces path."""

MAX_BODY_BYTES: Final = 16 * 1024 * 1024
"""Largest request body accepted (compressed or not); larger ones are answered 413."""

_TRACE_URL = re.compile(re.escape(TRACE_API_PATH) + r"/([0-9a-fA-F]{32})")


def _value(value: AnyValue) -> AttributeValue:
    kind = value.WhichOneof("value")
    if kind == "string_value":
        return value.string_value
    if kind == "bool_value":
        return value.bool_value
    if kind == "int_value":
        return value.int_value
    if kind == "double_value":
        return value.double_value
    if kind == "array_value":
        items = (_value(v) for v in value.array_value.values)
        return tuple(i for i in items if not isinstance(i, tuple))
    return str(value).strip()


def decode_request(body: bytes) -> list[SpanRecord]:
    """The spans of one OTLP protobuf ``ExportTraceServiceRequest`` (``DecodeError`` when
    the body is not one)."""
    message = ExportTraceServiceRequest.FromString(body)
    spans: list[SpanRecord] = []
    for resource_spans in message.resource_spans:
        resource = {a.key: a.value for a in resource_spans.resource.attributes}
        service = resource[SERVICE_NAME].string_value if SERVICE_NAME in resource else ""
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                if len(span.trace_id) != 16 or len(span.span_id) != 8:
                    raise DecodeError("a span without a valid trace or span id")
                spans.append(
                    SpanRecord(
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_span_id=span.parent_span_id.hex(),
                        name=span.name,
                        start_ns=span.start_time_unix_nano,
                        end_ns=max(span.start_time_unix_nano, span.end_time_unix_nano),
                        kind=span.kind,
                        status_code=span.status.code,
                        attributes={a.key: _value(a.value) for a in span.attributes},
                        service=service,
                    )
                )
    return spans


class TraceStore:
    """Received spans by trace, oldest trace forgotten first; safe across threads."""

    def __init__(self, max_traces: int = 2000, max_spans_per_trace: int = 1000) -> None:
        self.max_traces = max_traces
        self.max_spans_per_trace = max_spans_per_trace
        self._traces: OrderedDict[str, list[SpanRecord]] = OrderedDict()
        self._lock = threading.Lock()
        self.spans_received = 0

    def add(self, spans: Iterable[SpanRecord]) -> None:
        with self._lock:
            for span in spans:
                self.spans_received += 1
                kept = self._traces.get(span.trace_id)
                if kept is None:
                    kept = self._traces[span.trace_id] = []
                    while len(self._traces) > self.max_traces:
                        self._traces.popitem(last=False)
                if len(kept) < self.max_spans_per_trace:
                    kept.append(span)

    def __len__(self) -> int:
        with self._lock:
            return len(self._traces)

    def get(self, trace_id: str) -> list[SpanRecord]:
        """The spans of one trace (empty when unknown)."""
        with self._lock:
            return list(self._traces.get(trace_id.lower(), ()))

    def summaries(self, order: str = "slowest", limit: int = 20) -> list[TraceSummary]:
        """``slowest`` first, or most ``recent`` (by start) first."""
        with self._lock:
            all_summaries = [summarize(spans) for spans in self._traces.values()]
        if order == "recent":
            all_summaries.sort(key=lambda s: -s.start_ns)
        else:
            all_summaries.sort(key=lambda s: (-s.duration_ns, s.trace_id))
        return all_summaries[: max(0, limit)]

    def roots(self) -> int:
        """Traces whose root span (``local_roots``: a request that continued its client's
        ``traceparent`` has a root whose parent is the client's span) has arrived."""
        with self._lock:
            return sum(bool(local_roots(spans)) for spans in self._traces.values())


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    store: TraceStore


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        if urlsplit(self.path).path != TRACES_PATH:
            return self._answer(404, b"", "text/plain")
        try:
            length = int(self.headers.get("content-length") or 0)
        except ValueError:
            length = -1
        if length < 0:
            self.close_connection = True
            return self._answer(400, b"bad content-length", "text/plain")
        if length > MAX_BODY_BYTES:
            self.close_connection = True
            return self._answer(413, b"body too large", "text/plain")
        body = self.rfile.read(length)
        try:
            body = _decompress(body, self.headers.get("content-encoding", ""))
            spans = decode_request(body)
        except (DecodeError, OSError, zlib.error, EOFError, ValueError):
            return self._answer(400, b"not an OTLP protobuf trace request", "text/plain")
        self.server.store.add(spans)
        ok = ExportTraceServiceResponse().SerializeToString()
        self._answer(200, ok, "application/x-protobuf")

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        store = self.server.store
        match = _TRACE_URL.fullmatch(url.path)
        if match:
            spans = store.get(match.group(1))
            if not spans:
                return self._answer(404, b'{"error": "unknown trace"}', "application/json")
            return self._json(to_otlp_json(spans))
        if url.path == TRACE_API_PATH:
            query = parse_qs(url.query)
            order = query.get("order", ["slowest"])[0]
            try:
                limit = int(query.get("limit", ["20"])[0])
            except ValueError:
                limit = 20
            summaries = store.summaries(order, limit)
            return self._json({"traces": [summary_json(s) for s in summaries]})
        self._answer(404, b"", "text/plain")

    def _json(self, document: Any) -> None:
        self._answer(200, json.dumps(document).encode(), "application/json")

    def _answer(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        return None


def _decompress(body: bytes, encoding: str) -> bytes:
    """The body as sent before ``Content-Encoding`` (gzip or deflate), at most
    ``MAX_BODY_BYTES`` once inflated."""
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding == "gzip":
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    elif encoding == "deflate":
        inflater = zlib.decompressobj()
    else:
        raise ValueError(f"unsupported content-encoding {encoding!r}")
    out = inflater.decompress(body, MAX_BODY_BYTES + 1)
    if len(out) > MAX_BODY_BYTES:
        raise ValueError("body too large once inflated")
    if not inflater.eof:
        raise gzip.BadGzipFile("truncated body")
    return out


class TraceReceiver:
    """The receiver on ``host:port`` (port 0: any free port), served by a daemon thread."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, store: TraceStore | None = None):
        self.store = store if store is not None else TraceStore()
        self._server = _Server((host, port), _Handler)
        self._server.store = self.store
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="stagelens-trace-receiver", daemon=True
        )

    @property
    def url(self) -> str:
        """``http://host:port``: the base of the OTLP path and of the query API."""
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def traces_endpoint(self) -> str:
        return self.url + TRACES_PATH

    def start(self) -> TraceReceiver:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> TraceReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
