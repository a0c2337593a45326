"""The deferred tracer under the tail sampler: a trace's spans wait for its decision, are
exported whole when kept, and are never queued, built or encoded when dropped."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanContext, StatusCode, TraceFlags

from stagelens import semconv
from stagelens.errors import ConfigurationError
from stagelens.spans.pending import PendingTrace
from stagelens.spans.provider import DeferredTracerProvider
from stagelens.spans.recorded import RecordedSpan, pending_of
from stagelens.tail_sampling import ExemplarSlots, TailSampler, keep_reason, tail_sampler


@pytest.fixture
def tail(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[DeferredTracerProvider, Any, list]]:
    """A provider with the tail sampler at ratio 0, counting what reaches its queue and
    what is built for an exporter."""
    exporter = InMemorySpanExporter()
    provider = DeferredTracerProvider(
        [exporter], lambda reason, n: None, resource=Resource({}), sampler=TailSampler(0.0)
    )
    queued: list[RecordedSpan] = []
    enqueue = provider._enqueue

    def counting(span: RecordedSpan) -> None:
        queued.append(span)
        enqueue(span)

    monkeypatch.setattr(provider, "_enqueue", counting)
    yield provider, exporter, queued
    provider.shutdown()


def _trace(provider: DeferredTracerProvider) -> tuple[Any, Any, PendingTrace]:
    tracer = provider.get_tracer("t")
    root = tracer.start_span("root")
    child = tracer.start_span("child", context=trace.set_span_in_context(root))
    pending = pending_of(root)
    assert pending is not None
    assert pending_of(child) is pending
    return root, child, pending


class TestPendingTraces:
    def test_a_dropped_trace_is_never_queued_built_or_exported(self, tail) -> None:
        """Settled dropped: no span of the trace reaches the queue or an exporter."""
        provider, exporter, queued = tail
        root, child, pending = _trace(provider)
        child.end()
        pending.settle(False)
        root.end()
        late = provider.get_tracer("t").start_span("late", trace.set_span_in_context(root))
        late.end()  # a span ending after the decision follows it
        provider.force_flush()
        assert queued == []
        assert exporter.get_finished_spans() == ()

    def test_a_kept_trace_is_exported_whole(self, tail) -> None:
        """Settled kept: the spans held so far and the ones ending later are exported."""
        provider, exporter, queued = tail
        root, child, pending = _trace(provider)
        child.end()
        assert queued == []  # held until the decision
        pending.settle(True)
        root.end()
        late = provider.get_tracer("t").start_span("late", trace.set_span_in_context(root))
        late.end()
        provider.force_flush()
        assert sorted(s.name for s in exporter.get_finished_spans()) == ["child", "late", "root"]
        assert all(s.context.trace_flags.sampled for s in exporter.get_finished_spans())

    def test_a_pending_span_says_not_sampled_upstream(self, tail) -> None:
        """Before its decision a trace's context is not sampled (what traceparent sends);
        a trace kept at its start by a sampled parent says sampled."""
        provider, _, _ = tail
        _root, child, pending = _trace(provider)
        assert not child.get_span_context().trace_flags.sampled
        remote = SpanContext(0xABC, 0xDEF, is_remote=True, trace_flags=TraceFlags(1))
        kept = provider.get_tracer("t").start_span(
            "r", context=trace.set_span_in_context(trace.NonRecordingSpan(remote))
        )
        assert kept.get_span_context().trace_flags.sampled
        assert pending_of(kept).head == semconv.REASON_PARENT
        pending.settle(False)

    def test_a_root_nobody_decided_for_is_kept_when_it_failed(self, tail) -> None:
        """A trace begun outside the middleware decides at its root's end: kept on error."""
        provider, exporter, _ = tail
        ok_root, ok_child, _ = _trace(provider)
        ok_child.end()
        ok_root.end()
        bad_root, bad_child, _ = _trace(provider)
        bad_child.end()
        bad_root.set_status(StatusCode.ERROR)
        bad_root.end()
        provider.force_flush()
        ids = {s.context.trace_id for s in exporter.get_finished_spans()}
        assert ids == {bad_root.get_span_context().trace_id}

    def test_settling_from_another_thread_keeps_every_span(self, tail) -> None:
        """Spans ending on a worker thread while the request decides are not lost."""
        provider, exporter, _ = tail
        root, _, pending = _trace(provider)
        tracer = provider.get_tracer("t")
        spans = [tracer.start_span(f"s{i}", trace.set_span_in_context(root)) for i in range(200)]
        worker = threading.Thread(target=lambda: [s.end() for s in spans])
        worker.start()
        worker.join()
        pending.settle(True)
        root.end()
        provider.force_flush()
        assert len(exporter.get_finished_spans()) == 201


class TestRules:
    def test_reasons_in_order(self) -> None:
        """Error before client gone before slow; nothing for a fine request."""
        common: dict[str, Any] = {"stall_seconds": 1.0, "slow_seconds": 10.0}
        fine = {"verdicts": [(semconv.SLI_TTFT, False)], "worst_gap": 0.01, "duration": 1.0}
        assert keep_reason(server_failed=False, client_gone=False, **fine, **common) is None
        assert (
            keep_reason(server_failed=True, client_gone=True, **fine, **common)
            == semconv.REASON_ERROR
        )
        assert (
            keep_reason(server_failed=False, client_gone=True, **fine, **common)
            == semconv.REASON_CLIENT_LEFT
        )
        for slow in (
            {**fine, "verdicts": [(semconv.SLI_ITL, True)]},
            {**fine, "worst_gap": 1.5},
            {**fine, "duration": 11.0},
        ):
            assert (
                keep_reason(server_failed=False, client_gone=False, **slow, **common)
                == semconv.REASON_SLOW
            )
        # An availability verdict is no slowness.
        bad = {**fine, "verdicts": [(semconv.SLI_AVAILABILITY, True)]}
        assert keep_reason(server_failed=False, client_gone=False, **bad, **common) is None

    def test_the_entry_point_reads_the_ratio(self) -> None:
        """``OTEL_TRACES_SAMPLER_ARG`` as the SDK passes it: a string, or None."""
        assert tail_sampler(None).ratio == 0.01
        assert tail_sampler(" ").ratio == 0.01
        assert tail_sampler("0.25").ratio == 0.25
        for bad in ("lots", "1.5", "-0.1"):
            with pytest.raises(ConfigurationError):
                tail_sampler(bad)


class TestExemplarSlots:
    def test_a_stale_bucket_and_a_new_slowest_are_kept(self) -> None:
        """Per model: the first request in a bucket is kept, the next in the same bucket
        within the refresh interval is not, unless it is the slowest of the window; after
        the interval the bucket takes a new one; a kept trace refreshes its bucket."""
        slots = ExemplarSlots([0.1, 1.0, 10.0], refresh_seconds=15.0)
        assert slots.claim("m", 0.5, now=0.0, kept=False)  # first: bucket and slowest
        assert not slots.claim("m", 0.4, now=1.0, kept=False)  # same bucket, not slowest
        assert slots.claim("m", 0.6, now=2.0, kept=False)  # a new slowest of the window
        assert slots.claim("other", 0.4, now=2.0, kept=False)  # models apart
        assert slots.claim("m", 0.05, now=3.0, kept=True)  # kept stays kept
        assert not slots.claim("m", 0.05, now=4.0, kept=False)  # that kept one filled it
        assert slots.claim("m", 0.3, now=17.1, kept=False)  # a new window and a stale bucket

    def test_the_slowest_of_any_run_is_kept(self) -> None:
        """Whatever the order, the slowest request of a run is kept."""
        import random

        rng = random.Random(7)
        for _ in range(50):
            durations = [rng.uniform(0.01, 5.0) for _ in range(40)]
            slots = ExemplarSlots([0.1, 1.0, 10.0], refresh_seconds=15.0)
            kept = [slots.claim("m", d, now=i * 0.5, kept=False) for i, d in enumerate(durations)]
            assert kept[durations.index(max(durations))]
