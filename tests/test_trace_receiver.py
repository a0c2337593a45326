"""The demo's OTLP/HTTP trace receiver: the SDK's real exporter in, the query API out."""

from __future__ import annotations

import gzip
import json
import urllib.error
import urllib.request

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import Status, StatusCode
from stagelens.reference.trace_receiver import TraceReceiver, TraceStore

from stagelens.cli import main
from stagelens.errors import TraceSourceError
from stagelens.views.traces import fetch_trace, list_traces


@pytest.fixture
def receiver():
    with TraceReceiver() as running:
        yield running


def _post(url: str, body: bytes, headers: dict[str, str] | None = None) -> int:
    request = urllib.request.Request(url, data=body, headers=headers or {}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def _send(receiver: TraceReceiver, compression: Compression = Compression.NoCompression):
    """Three spans through the SDK's own OTLP/HTTP exporter; returns the SDK's spans."""
    exporter = OTLPSpanExporter(endpoint=receiver.traces_endpoint, compression=compression)
    provider = TracerProvider(resource=Resource({"service.name": "svc"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("root") as root:
        root.set_attribute("http.response.status_code", 200)
        with tracer.start_as_current_span("child", attributes={"n": 3, "tags": ["a", "b"]}):
            pass
        with tracer.start_as_current_span("failed") as failed:
            failed.set_status(Status(StatusCode.ERROR))
    provider.shutdown()
    return root


class TestReceiver:
    """What the SDK exports is what the query API answers."""

    @pytest.mark.parametrize("compression", [Compression.NoCompression, Compression.Gzip])
    def test_sdk_spans_come_back_with_their_own_times(self, receiver, compression) -> None:
        """Ids, names, parents, times to the ns, attributes and status as the SDK made them."""
        root = _send(receiver, compression)
        trace_id = f"{root.get_span_context().trace_id:032x}"
        spans = {s.name: s for s in fetch_trace(receiver.url, trace_id)}
        assert set(spans) == {"root", "child", "failed"}
        assert spans["root"].start_ns == root.start_time
        assert spans["root"].end_ns == root.end_time
        assert spans["root"].parent_span_id == ""
        assert spans["child"].parent_span_id == f"{root.get_span_context().span_id:016x}"
        assert spans["child"].attributes == {"n": 3, "tags": ("a", "b")}
        assert spans["failed"].status_code == 2
        assert spans["root"].service == "svc"
        (summary,) = list_traces(receiver.url)
        assert summary.trace_id == trace_id
        assert summary.span_count == 3
        assert summary.duration_ns == root.end_time - root.start_time

    def test_unknown_trace_and_paths_answer_404(self, receiver) -> None:
        """An id never received is a TraceSourceError for the client, a 404 on the wire."""
        with pytest.raises(TraceSourceError, match="not found"):
            fetch_trace(receiver.url, "1" * 32)
        assert _post(receiver.url + "/v1/metrics", b"") == 404

    @settings(
        max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
    )
    @given(st.binary(max_size=300))
    def test_malformed_bodies_answer_400_and_store_nothing(self, receiver, body) -> None:
        """Untrusted bytes: a body that is not a trace request is refused, nothing kept."""
        before = receiver.store.spans_received
        status = _post(receiver.traces_endpoint, body, {"content-type": "application/x-protobuf"})
        assert status in (200, 400)
        if status == 400:
            assert receiver.store.spans_received == before
        gz = _post(receiver.traces_endpoint, body, {"content-encoding": "gzip"})
        assert gz == 400 or body[:2] == b"\x1f\x8b"

    def test_bombs_and_lies_are_refused(self, receiver) -> None:
        """A body inflating past the limit and a bad content-length get 4xx, not a hang."""
        bomb = gzip.compress(b"\x00" * (17 * 1024 * 1024))
        assert _post(receiver.traces_endpoint, bomb, {"content-encoding": "gzip"}) == 400
        assert _post(receiver.traces_endpoint, b"x", {"content-encoding": "br"}) == 400

    def test_store_is_bounded(self) -> None:
        """Past max_traces the oldest trace is forgotten; a trace keeps max spans."""
        from stagelens.views.traces import SpanRecord

        store = TraceStore(max_traces=2, max_spans_per_trace=2)
        for t in range(3):
            store.add(SpanRecord(f"{t:032x}", f"{s + 1:016x}", "", "x", 0, 1) for s in range(3))
        assert len(store) == 2
        assert store.get(f"{0:032x}") == []
        assert len(store.get(f"{2:032x}")) == 2

    def test_a_root_that_continued_its_clients_trace_is_a_root(self) -> None:
        """A request that came with a ``traceparent`` has a root whose parent is the
        client's span, which never arrives here: the trace has its root all the same (the
        demo waits for roots) and is listed under the root's name."""
        from stagelens.views.traces import SpanRecord

        store = TraceStore()
        client_span, trace_id = "c" * 16, "a" * 32
        store.add(
            [
                SpanRecord(trace_id, "1" * 16, client_span, "POST", 0, 10),
                SpanRecord(trace_id, "3" * 16, "1" * 16, "gateway", 1, 2),
            ]
        )
        assert store.roots() == 1
        (summary,) = [s for s in store.summaries() if s.trace_id == trace_id]
        assert summary.name == "POST"


class TestTraceCommand:
    """``stagelens trace`` against a running receiver."""

    def test_prints_list_waterfall_and_json(self, receiver, capsys) -> None:
        """--list names the trace; the id prints its rows; --json is OTLP/JSON; unknown is 1."""
        root = _send(receiver)
        trace_id = f"{root.get_span_context().trace_id:032x}"
        assert main(["trace", "--list", "--source", receiver.url]) == 0
        assert trace_id in capsys.readouterr().out
        assert main(["trace", trace_id, "--source", receiver.url]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert lines[0].startswith(f"trace {trace_id}  root  200")
        assert [line.split()[0] for line in lines[2:]] == ["root", "child", "failed"]
        assert lines[-1].endswith("ERROR")
        assert main(["trace", trace_id, "--source", receiver.url, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["resourceSpans"]
        assert main(["trace", "f" * 32, "--source", receiver.url]) == 1
        assert "not found" in capsys.readouterr().err
