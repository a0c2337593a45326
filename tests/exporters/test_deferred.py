"""The deferred tracer: SDK-equivalent spans, a protobuf encoding equal to the SDK's, a
bounded queue whose drops are counted, flush, sampling and fork safety."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry import context, trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased, TraceIdRatioBased
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from stagelens.spans.otlp_encode import encode_request
from stagelens.spans.provider import (
    REASON_EXPORT_FAILED,
    REASON_QUEUE_FULL,
    DeferredTracerProvider,
)
from stagelens.spans.recorded import RecordedSpan

RESOURCE = Resource({"service.name": "test", "team": "x"})


class _Drops:
    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.lock = threading.Lock()

    def __call__(self, reason: str, n: int) -> None:
        with self.lock:
            self.counts[reason] = self.counts.get(reason, 0) + n


@pytest.fixture
def memory() -> Iterator[tuple[DeferredTracerProvider, InMemorySpanExporter, _Drops]]:
    exporter = InMemorySpanExporter()
    drops = _Drops()
    provider = DeferredTracerProvider([exporter], drops, resource=RESOURCE)
    yield provider, exporter, drops
    provider.shutdown()


def _request_tree(provider: DeferredTracerProvider) -> list[RecordedSpan]:
    """A root SERVER span with a remote parent, a stage child with an exception and a
    CLIENT grandchild with explicit times, links, events and every attribute type."""
    tracer = provider.get_tracer("stagelens", "1.2.3")
    remote = SpanContext(0xABC, 0xDEF, is_remote=True, trace_flags=TraceFlags(1))
    parent_ctx = trace.set_span_in_context(trace.NonRecordingSpan(remote))
    root = tracer.start_span(
        "POST /v1/chat",
        context=parent_ctx,
        kind=SpanKind.SERVER,
        attributes={"http.request.method": "POST", "server.port": 8000},
    )
    token = context.attach(trace.set_span_in_context(root))
    try:
        child = tracer.start_span("tokenizer", attributes={"stagelens.stage": "tokenizer"})
        child.set_attributes({"ratio": 0.5, "ok": True, "ids": (1, 2, 3), "tags": ["a", "b"]})
        child.set_attribute("dropped", None)  # the SDK drops None too
        child.record_exception(ValueError("bad"), attributes={"extra": 1})
        child.set_status(Status(StatusCode.ERROR, "ValueError: bad"))
        child.add_link(remote, {"why": "batch"})
        grandchild = tracer.start_span(
            "chat tiny",
            context=trace.set_span_in_context(child),
            kind=SpanKind.CLIENT,
            start_time=1_000,
        )
        grandchild.add_event("first_token", {"at": 1}, timestamp=1_500)
        grandchild.set_status(StatusCode.OK)
        grandchild.set_status(StatusCode.ERROR, "ignored: OK is final")
        grandchild.end(end_time=2_000)
        child.end()
    finally:
        context.detach(token)
    root.set_attribute("http.response.status_code", 200)
    root.update_name("POST /v1/chat/completions")
    root.end()
    spans = [grandchild, child, root]
    assert all(isinstance(s, RecordedSpan) for s in spans)
    return spans  # type: ignore[return-value]


def test_spans_reach_an_sdk_exporter_with_the_sdk_shape(memory) -> None:
    """Names, kinds, ids, parent links, status, events and attributes as the SDK's spans."""
    provider, exporter, _ = memory
    _request_tree(provider)
    assert provider.force_flush(5000)
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert set(spans) == {"POST /v1/chat/completions", "tokenizer", "chat tiny"}
    root, child, leaf = (spans[n] for n in ("POST /v1/chat/completions", "tokenizer", "chat tiny"))
    assert root.kind is SpanKind.SERVER
    assert leaf.kind is SpanKind.CLIENT
    assert root.context.trace_id == child.context.trace_id == leaf.context.trace_id == 0xABC
    assert root.parent is not None
    assert root.parent.span_id == 0xDEF
    assert root.parent.is_remote
    assert child.parent is not None
    assert child.parent.span_id == root.context.span_id
    assert leaf.parent is not None
    assert leaf.parent.span_id == child.context.span_id
    assert not child.parent.is_remote
    assert root.attributes["http.response.status_code"] == 200
    assert isinstance(root.attributes["server.port"], int)
    assert "dropped" not in child.attributes
    assert child.status.status_code is StatusCode.ERROR
    assert child.status.description == "ValueError: bad"
    (event,) = child.events
    assert event.name == "exception"
    assert event.attributes is not None
    assert event.attributes["exception.type"] == "ValueError"
    assert event.attributes["exception.message"] == "bad"
    assert str(event.attributes["exception.stacktrace"]).startswith("ValueError: bad")
    assert event.attributes["extra"] == 1
    assert leaf.status.status_code is StatusCode.OK
    assert (leaf.start_time, leaf.end_time) == (1_000, 2_000)
    assert leaf.events[0].timestamp == 1_500
    assert root.resource.attributes["team"] == "x"
    assert root.instrumentation_scope is not None
    assert root.instrumentation_scope.version == "1.2.3"


def test_protobuf_encoding_equals_the_sdk_encoder(memory) -> None:
    """Our direct encoding decodes to the very message the SDK's encode_spans builds."""
    provider, _, _ = memory
    spans = _request_tree(provider)
    ours = ExportTraceServiceRequest.FromString(encode_request(spans, RESOURCE))
    sdk = encode_spans([s.readable(RESOURCE) for s in spans])
    assert ours == sdk
    assert len(ours.resource_spans[0].scope_spans[0].spans) == 3


def test_ended_span_ignores_further_calls(memory) -> None:
    provider, exporter, _ = memory
    span = provider.get_tracer("t").start_span("once")
    span.end()
    span.set_attribute("late", 1)
    span.end()
    assert not span.is_recording()
    provider.force_flush(5000)
    (exported,) = exporter.get_finished_spans()
    assert "late" not in exported.attributes


def test_attribute_count_is_bounded(memory) -> None:
    provider, exporter, _ = memory
    span = provider.get_tracer("t").start_span("many")
    for i in range(300):
        span.set_attribute(f"k{i}", i)
    span.end()
    provider.force_flush(5000)
    assert len(exporter.get_finished_spans()[0].attributes) == 128


class _Failing(SpanExporter):
    def __init__(self) -> None:
        self.calls = 0

    def export(self, spans) -> SpanExportResult:
        self.calls += 1
        return SpanExportResult.FAILURE


class _Raising(SpanExporter):
    def export(self, spans) -> SpanExportResult:
        raise ConnectionError("collector gone")


@pytest.mark.parametrize("exporter_type", [_Failing, _Raising])
def test_failed_exports_are_counted_and_logged_once(exporter_type, caplog) -> None:
    """Every span of a failed batch is counted; the failure is logged once, not per batch."""
    drops = _Drops()
    provider = DeferredTracerProvider([exporter_type()], drops, resource=RESOURCE)
    tracer = provider.get_tracer("t")
    with caplog.at_level("WARNING", logger="stagelens"):
        for _ in range(3):
            for _ in range(4):
                tracer.start_span("s").end()
            provider.force_flush(5000)
    provider.shutdown()
    assert drops.counts == {REASON_EXPORT_FAILED: 12}
    assert len([r for r in caplog.records if "span export failed" in r.getMessage()]) == 1


def test_queue_bound_counts_what_it_drops() -> None:
    """With the worker unable to keep up, spans past the bound are dropped and counted."""
    release = threading.Event()

    class _Blocking(SpanExporter):
        exported = 0

        def export(self, spans) -> SpanExportResult:
            release.wait(10)
            _Blocking.exported += len(spans)
            return SpanExportResult.SUCCESS

    drops = _Drops()
    provider = DeferredTracerProvider(
        [_Blocking()], drops, resource=RESOURCE, max_queue_size=8, max_export_batch_size=8
    )
    tracer = provider.get_tracer("t")
    for _ in range(8):  # one full batch wakes the worker, which blocks in export
        tracer.start_span("s").end()
    deadline = threading.Event()
    while provider._queue and not deadline.wait(0.01):
        pass
    for _ in range(20):  # 8 fit in the queue again, 12 are dropped
        tracer.start_span("s").end()
    release.set()
    provider.shutdown()
    assert drops.counts == {REASON_QUEUE_FULL: 12}
    assert _Blocking.exported == 16


def test_a_full_batch_is_sent_alone_and_the_rest_waits_for_the_next() -> None:
    """Woken by a full batch, the worker sends full batches only: the spans that arrive
    while it wakes wait for the next batch (or the timer, or a flush) instead of going out
    as a tiny POST of their own."""
    sizes: list[int] = []
    first = threading.Event()
    release = threading.Event()

    class _Recording(SpanExporter):
        def export(self, spans) -> SpanExportResult:
            sizes.append(len(spans))
            first.set()
            release.wait(10)
            return SpanExportResult.SUCCESS

    provider = DeferredTracerProvider(
        [_Recording()],
        _Drops(),
        resource=RESOURCE,
        max_export_batch_size=4,
        schedule_delay_seconds=60,
    )
    tracer = provider.get_tracer("t")
    for _ in range(4):  # a full batch wakes the worker
        tracer.start_span("s").end()
    assert first.wait(10)
    for _ in range(3):  # arrive while the first batch is being sent
        tracer.start_span("s").end()
    release.set()
    deadline = threading.Event()
    while provider._queue and len(provider._queue) != 3 and not deadline.wait(0.01):
        pass
    deadline.wait(0.2)
    assert sizes == [4]
    assert len(provider._queue) == 3
    assert provider.force_flush(5000)
    assert sizes == [4, 3]
    provider.shutdown()


def test_sampler_decides_for_local_roots_and_children_follow() -> None:
    exporter = InMemorySpanExporter()
    provider = DeferredTracerProvider([exporter], _Drops(), resource=RESOURCE, sampler=ALWAYS_OFF)
    tracer = provider.get_tracer("t")
    root = tracer.start_span("root")
    assert not root.is_recording()
    assert root.get_span_context().is_valid
    assert not root.get_span_context().trace_flags.sampled
    child = tracer.start_span("child", context=trace.set_span_in_context(root))
    assert not child.is_recording()
    assert child.get_span_context().trace_id == root.get_span_context().trace_id
    child.end()
    root.end()
    provider.shutdown()
    assert exporter.get_finished_spans() == ()


def test_ratio_sampling_keeps_about_the_ratio() -> None:
    exporter = InMemorySpanExporter()
    provider = DeferredTracerProvider(
        [exporter], _Drops(), resource=RESOURCE, sampler=ParentBased(TraceIdRatioBased(0.25))
    )
    tracer = provider.get_tracer("t")
    for _ in range(2000):
        tracer.start_span("root").end()
    provider.shutdown()
    kept = len(exporter.get_finished_spans())
    assert 350 < kept < 650, kept


def test_sampled_out_remote_parent_is_respected(memory) -> None:
    provider, _exporter, _ = memory
    remote = SpanContext(0xABC, 0xDEF, is_remote=True, trace_flags=TraceFlags(0))
    ctx = trace.set_span_in_context(trace.NonRecordingSpan(remote))
    span = provider.get_tracer("t").start_span("s", context=ctx)
    assert not span.is_recording()
    assert span.get_span_context().trace_id == 0xABC


def test_start_as_current_span_records_an_escaping_exception(memory) -> None:
    provider, exporter, _ = memory
    tracer = provider.get_tracer("t")
    current = []

    def work() -> None:
        with tracer.start_as_current_span("outer") as outer:
            current.append(trace.get_current_span() is outer)
            raise KeyError("x")

    with pytest.raises(KeyError):
        work()
    assert current == [True]
    provider.force_flush(5000)
    (span,) = exporter.get_finished_spans()
    assert span.status.status_code is StatusCode.ERROR
    assert span.events[0].name == "exception"


def test_sdk_spans_under_a_recorded_parent_join_its_trace(memory) -> None:
    """User code on a separate SDK provider (its own pipeline) still nests under our span."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    provider, _, _ = memory
    sdk_memory = InMemorySpanExporter()
    sdk = TracerProvider()
    sdk.add_span_processor(SimpleSpanProcessor(sdk_memory))
    root = provider.get_tracer("t").start_span("root")
    with sdk.get_tracer("user").start_as_current_span(
        "user", context=trace.set_span_in_context(root)
    ):
        pass
    root.end()
    (user,) = sdk_memory.get_finished_spans()
    assert isinstance(user, ReadableSpan)
    assert user.context.trace_id == root.get_span_context().trace_id
    assert user.parent is not None
    assert user.parent.span_id == root.get_span_context().span_id


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_child_exports_through_a_new_worker(tmp_path) -> None:
    """A pre-fork server's worker gets its own export thread (the parent's is not copied)."""
    out = tmp_path / "child.txt"
    exporter = InMemorySpanExporter()
    provider = DeferredTracerProvider([exporter], _Drops(), resource=RESOURCE)
    pid = os.fork()
    if pid == 0:  # child
        try:
            provider.get_tracer("t").start_span("in-child").end()
            ok = provider.force_flush(5000)
            out.write_text(f"{ok} {len(exporter.get_finished_spans())}")
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    provider.shutdown()
    assert out.read_text() == "True 1"


def test_encoding_edge_cases_equal_the_sdk_encoder(memory) -> None:
    """Trace state, two scopes, ints on each side of the varint lengths, negative and huge
    ints, bytes, unicode, empty strings, long (multi-byte length) values and keys, a key
    that is True on one span and 1 on the other, and an ERROR without description."""
    from opentelemetry.trace import TraceState

    provider, _, _ = memory
    state = TraceState([("vendor", "abc"), ("other", "1")])
    remote = SpanContext(7, 9, is_remote=True, trace_flags=TraceFlags(1), trace_state=state)
    ctx = trace.set_span_in_context(trace.NonRecordingSpan(remote))
    first = provider.get_tracer("a", "1", schema_url="https://opentelemetry.io/schemas/1.26.0")
    second = provider.get_tracer("b")
    spans = []
    for tracer in (first, second):
        span = tracer.start_span("é" * 200, context=ctx, kind=SpanKind.PRODUCER)
        span.set_attributes(
            {
                "neg": -5,
                "big": 2**63 - 1,
                "raw": b"\x00\xff",
                "empty": "",
                "long": "x" * 20_000,
                "floats": [0.1, -2.5],
                "bools": (True, False),
                "unicode": "日本",
                **{f"int{n}": n for n in (0, 127, 128, 300, 0x3FFF, 0x4000, 2**32)},
                "float": 0.25,
                "true": True,
                "false": False,
                "k" * 200: 1.5,  # a pair longer than 127 bytes
                # Equal as dict keys, not as attributes: the pair cache tells them apart.
                "same": True if tracer is first else 1,
            }
        )
        span.set_status(StatusCode.ERROR)
        span.end()
        spans.append(span)
    ours = ExportTraceServiceRequest.FromString(encode_request(spans, RESOURCE))
    assert ours == encode_spans([s.readable(RESOURCE) for s in spans])
    assert len(ours.resource_spans[0].scope_spans) == 2


def test_attributes_are_bounded_like_the_sdks(memory) -> None:
    """At most MAX_ATTRIBUTES per span whichever call sets them; a present key can still
    change, None is skipped, and an ended span changes no more."""
    from stagelens.spans.recorded import MAX_ATTRIBUTES

    provider, _, _ = memory
    span = provider.get_tracer("t").start_span("s")
    span.set_attributes({f"a{i}": i for i in range(MAX_ATTRIBUTES - 2)})
    span.set_attributes({"b0": 0, "b1": None, "b2": 2, "b3": 3})
    span.set_attribute("c", 1)
    span.set_attributes({"a0": "changed"})
    attributes = span.attributes
    assert len(attributes) == MAX_ATTRIBUTES
    assert "b1" not in attributes
    assert "b3" not in attributes  # over the bound
    assert "c" not in attributes
    assert attributes["a0"] == "changed"
    span.end()
    span.set_attributes({"a1": "late"})
    span.set_attribute("a2", "late")
    assert attributes["a1"] == 1
    assert attributes["a2"] == 2


ATTRIBUTE_VALUES = (
    st.text(max_size=3)
    | st.integers(-(2**63), 2**63 - 1)
    | st.booleans()
    | st.floats(allow_nan=False)
    | st.none()
    | st.binary(max_size=3)
    | st.lists(st.integers(0, 3) | st.text(max_size=2) | st.none(), max_size=3)
    | st.tuples(st.lists(st.integers(), max_size=2))
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.dictionaries(st.sampled_from(["a", "b", "stage", "ø"]), ATTRIBUTE_VALUES), max_size=4
    ),
    st.sampled_from([b"\x4a", b"\x1a", b"\x0a"]),
)
def test_cached_attribute_encoding_equals_its_plain_twin(
    batches: list[dict[str, Any]], tag: bytes
) -> None:
    """Any attributes, encoded one set after another (the caches warm, ``True`` beside
    ``1``, a key under several tags): the cached encoding writes the bytes its plain twin,
    which encodes every pair, writes."""
    from stagelens.spans import otlp_encode

    for attributes in batches:
        plain = otlp_encode.attributes_plain(attributes, tag)
        assert otlp_encode._attributes(attributes, tag) == plain
        assert otlp_encode._attributes(attributes, tag) == plain  # from the caches
