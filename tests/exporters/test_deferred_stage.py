"""A stage of a pending trace is recorded as data (``DeferredSpan``) and built into a span
only when its trace is kept: the span built is the one ``start_span`` makes for the same
calls, it sits where that span would in the tree, and a dropped trace builds nothing."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from opentelemetry import context, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_ON
from opentelemetry.trace import StatusCode
from prometheus_client import CollectorRegistry
from stagelens.instrumentation.hooks import stage

from stagelens import configure
from stagelens.request import RequestState, _enter, _exit
from stagelens.spans import provider as deferred
from stagelens.spans import recorded
from stagelens.spans.provider import DeferredTracerProvider
from stagelens.spans.recorded import pending_of
from stagelens.spans.stages import deferred_span, enter_stage, leave_stage, open_stage
from stagelens.stages import Stage
from stagelens.tail_sampling import TailSampler

_KEYS = st.sampled_from([f"k{i}" for i in range(6)])
_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=False),
    st.text(max_size=8),
    st.lists(st.text(max_size=4), max_size=3),
)
_TIMES = st.integers(1, 2**62)
_CALLS = st.one_of(
    st.tuples(st.just("set_attribute"), _KEYS, _VALUES),
    st.tuples(st.just("set_attributes"), st.dictionaries(_KEYS, _VALUES, max_size=4)),
    st.tuples(
        st.just("add_event"),
        st.text(max_size=6),
        st.dictionaries(_KEYS, _VALUES.filter(lambda v: v is not None), max_size=3),
        _TIMES,
    ),
    st.tuples(
        st.just("set_status"),
        st.sampled_from([StatusCode.UNSET, StatusCode.OK, StatusCode.ERROR]),
        st.one_of(st.none(), st.text(max_size=6)),
    ),
    st.tuples(st.just("update_name"), st.text(min_size=1, max_size=6)),
    st.tuples(st.just("record_exception"), st.text(max_size=6), _TIMES, st.booleans()),
    st.tuples(st.just("end")),
)


def _apply(span: trace.Span, calls: list[tuple[Any, ...]]) -> None:
    for method, *args in calls:
        if method == "record_exception":
            message, timestamp, escaped = args
            span.record_exception(ValueError(message), None, timestamp, escaped)
        elif method == "end":
            span.end()
        else:
            getattr(span, method)(*args)
    span.end()


def _provider(sampler: Any) -> tuple[DeferredTracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = DeferredTracerProvider(
        [exporter], lambda reason, n: None, resource=Resource({}), sampler=sampler
    )
    return provider, exporter


@pytest.fixture(scope="module")
def providers() -> Iterator[tuple[Any, Any, Any, Any]]:
    """A tail-sampled provider (ratio 0: every trace pending) and an always_on one."""
    tail, tail_out = _provider(TailSampler(0.0))
    always, always_out = _provider(ALWAYS_ON)
    yield tail, tail_out, always, always_out
    tail.shutdown()
    always.shutdown()


def _view(span: ReadableSpan, root: ReadableSpan) -> tuple[Any, ...]:
    """What an exporter reads of a stage span, its ids and clock readings aside."""
    assert span.parent is not None
    assert root.context is not None
    assert span.context is not None
    assert span.parent.span_id == root.context.span_id
    assert span.context.trace_id == root.context.trace_id
    return (
        span.name,
        span.kind,
        span.instrumentation_scope,
        dict(span.attributes or {}),
        [(e.name, dict(e.attributes or {}), e.timestamp) for e in span.events],
        (span.status.status_code, span.status.description),
        span.context.trace_flags.sampled,
    )


def _exported(provider: DeferredTracerProvider, exporter: InMemorySpanExporter) -> list[Any]:
    provider.force_flush()
    spans = list(exporter.get_finished_spans())
    exporter.clear()
    return spans


@settings(max_examples=150, deadline=None)
@given(st.lists(_CALLS, max_size=12))
@example(calls=[("update_name", "root")])
def test_a_kept_stage_is_built_as_start_span_makes_it(
    providers: tuple[Any, Any, Any, Any], calls: list[tuple[Any, ...]]
) -> None:
    """Any sequence of Span API calls (after its end too) gives the same exported span
    whether it was made on a span (always_on) or recorded as data and built when kept."""
    tail, tail_out, always, always_out = providers
    attributes = {"stagelens.stage": "tokenizer"}

    root = always.get_tracer("t").start_span("root")
    span = always.get_tracer("t").start_span(
        "tokenizer", context=trace.set_span_in_context(root), attributes=dict(attributes)
    )
    _apply(span, calls)
    root.end()
    # The root is the span without a parent: the calls may rename the stage "root" too.
    want_root, want = sorted(_exported(always, always_out), key=lambda s: s.parent is not None)

    tracer = tail.get_tracer("t")
    root = tracer.start_span("root")
    pending = pending_of(root)
    stage = deferred_span(
        tracer, "tokenizer", trace.set_span_in_context(root), pending, dict(attributes)
    )
    _apply(stage, calls)
    pending.settle(True)
    root.end()
    got_root, got = sorted(_exported(tail, tail_out), key=lambda s: s.parent is not None)
    assert got_root.name == want_root.name == "root"
    assert _view(got, got_root) == _view(want, want_root)
    assert got.start_time <= got.end_time


def test_the_attribute_limit_holds_as_on_a_span(providers: tuple[Any, Any, Any, Any]) -> None:
    """More attributes than a span keeps: the same first 128 (and later values of those)."""
    tail, tail_out, _, _ = providers
    tracer = tail.get_tracer("t")
    root = tracer.start_span("root")
    stage = deferred_span(tracer, "s", trace.set_span_in_context(root), pending_of(root), {})
    for i in range(200):
        stage.set_attribute(f"a{i}", i)
    stage.set_attribute("a5", "again")
    stage.end()
    pending_of(root).settle(True)
    root.end()
    (built,) = [s for s in _exported(tail, tail_out) if s.name == "s"]
    assert len(built.attributes) == recorded.MAX_ATTRIBUTES
    assert built.attributes["a5"] == "again"
    assert "a127" in built.attributes
    assert "a128" not in built.attributes


def test_spans_started_inside_a_stage_are_its_children(
    providers: tuple[Any, Any, Any, Any],
) -> None:
    """A span started (by any tracer of the provider) inside a stage, and a stage inside
    a stage, hang under it; the ids drawn for them are the ids exported; outside the
    stage a span hangs under the root again."""
    tail, tail_out, _, _ = providers
    tracer = tail.get_tracer("t")
    root = tracer.start_span("root")
    token = context.attach(trace.set_span_in_context(root))
    try:
        outer = deferred_span(
            tracer, "outer", trace.set_span_in_context(root), pending_of(root), {}
        )
        outer_open = enter_stage(outer)
        inner = deferred_span(
            tracer, "inner", trace.set_span_in_context(root), pending_of(root), {}
        )
        inner_open = enter_stage(inner)
        assert inner.parent is outer
        child = tail.get_tracer("other").start_span("child")  # the current context's
        assert trace.get_current_span() is root  # the stage is not made current
        child.end()
        leave_stage(inner_open)
        inner.end()
        assert open_stage() is outer
        sibling = tracer.start_span("sibling")
        sibling.end()
        leave_stage(outer_open)
        outer.end()
        after = tracer.start_span("after")
        after.end()
    finally:
        context.detach(token)
    pending_of(root).settle(True)
    root.end()
    spans = {s.name: s for s in _exported(tail, tail_out)}
    ids = {name: s.context.span_id for name, s in spans.items()}
    parents = {name: s.parent.span_id if s.parent else None for name, s in spans.items()}
    assert parents == {
        "root": None,
        "outer": ids["root"],
        "inner": ids["outer"],
        "child": ids["inner"],
        "sibling": ids["outer"],
        "after": ids["root"],
    }
    assert len(set(ids.values())) == len(ids)


def test_a_dropped_trace_builds_nothing_and_draws_no_id(
    providers: tuple[Any, Any, Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dropped: the stage's data is discarded, never built, and its id never drawn."""
    tail, tail_out, _, _ = providers
    built: list[Any] = []
    monkeypatch.setattr(deferred, "built", lambda stage: built.append(stage))
    tracer = tail.get_tracer("t")
    root = tracer.start_span("root")
    stage = deferred_span(tracer, "s", trace.set_span_in_context(root), pending_of(root), {})
    stage.set_attribute("k", 1)
    stage.end()
    pending_of(root).settle(False)
    root.end()
    assert _exported(tail, tail_out) == []
    assert built == []
    assert stage.span_id == 0


def test_a_stage_ending_after_the_decision_follows_it(
    providers: tuple[Any, Any, Any, Any],
) -> None:
    """A stage still open when its trace is kept is built when it ends; one of a trace
    dropped meanwhile is discarded."""
    tail, tail_out, _, _ = providers
    tracer = tail.get_tracer("t")
    for keep in (True, False):
        root = tracer.start_span("root")
        stage = deferred_span(tracer, "late", trace.set_span_in_context(root), pending_of(root), {})
        pending_of(root).settle(keep)
        root.end()
        stage.end()
        names = sorted(s.name for s in _exported(tail, tail_out))
        assert names == (["late", "root"] if keep else [])


def test_a_span_that_fails_to_build_is_dropped_alone_counted_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A when_built function that raises drops its span only: the trace's other spans are
    exported, the drop is counted as a failed export, the log says the type and not the
    message, and nothing reaches the code that decided or ended the span."""
    dropped: list[tuple[str, int]] = []
    exporter = InMemorySpanExporter()
    provider = DeferredTracerProvider(
        [exporter],
        lambda reason, n: dropped.append((reason, n)),
        resource=Resource({}),
        sampler=TailSampler(0.0),
    )
    try:
        tracer = provider.get_tracer("t")
        root = tracer.start_span("root")
        pending = pending_of(root)
        ctx = trace.set_span_in_context(root)
        bad = deferred_span(tracer, "bad", ctx, pending, {})

        def broken(span: trace.Span) -> None:
            raise ValueError("the prompt was: secret")

        bad.when_built(broken)
        bad.end()
        good = deferred_span(tracer, "good", ctx, pending, {})
        good.end()
        with caplog.at_level("WARNING", logger="stagelens"):
            pending.settle(True)  # does not raise
            late = deferred_span(tracer, "late", ctx, pending, {})
            late.when_built(broken)
            late.end()  # nor does an end after the decision
        root.end()
        provider.force_flush()
        assert sorted(s.name for s in exporter.get_finished_spans()) == ["good", "root"]
        assert dropped == [(deferred.REASON_EXPORT_FAILED, 1)] * 2
        assert len(caplog.records) == 1
        assert "ValueError" in caplog.text
        assert "secret" not in caplog.text
    finally:
        provider.shutdown()


def _telemetry(sampler: Any) -> tuple[Any, InMemorySpanExporter]:
    """stagelens configured as an app configures it, under ``sampler``, its spans kept in
    memory."""
    exporter = InMemorySpanExporter()
    telemetry = configure(
        span_exporters=[exporter],
        registry=CollectorRegistry(),
        set_global=False,
        gpu=False,
        sampler=sampler,
    )
    return telemetry, exporter


def _stages_of(sampler: Any) -> list[tuple[Any, ...]]:
    """One request's stages through ``stage()`` under ``sampler`` (the trace kept at its
    end under the tail sampler): plain, with attributes, nested, a span started inside
    one, ``.span`` used, a failure, one object entered twice, a decorated coroutine.
    Returns the exported tree: each span's name, parent's name, attributes, events'
    names and attribute names, status."""
    telemetry, exporter = _telemetry(sampler)

    @stage("decorated")
    async def decorated() -> None:
        with stage("inside"):
            await asyncio.sleep(0)

    root = telemetry.tracer.start_span("root")
    state = RequestState(telemetry, root)
    entered = _enter(state)
    attached = context.attach(trace.set_span_in_context(root))
    try:
        with stage(Stage.TOKENIZER):
            pass
        with stage("retrieval", {"k": 1, "none": None}) as outer:
            outer.span.set_attribute("found", 3)
            with stage("inner"):
                telemetry.tracer.start_span("child").end()
            with stage("leaf"):
                pass
        again = stage("again")
        for _ in range(2):
            with again:
                pass
        with pytest.raises(ValueError, match="boom"), stage("fails"):
            raise ValueError("boom")
        given = {"k": 1}
        with stage("mutated", given):
            given["k"] = 2  # a span takes the attributes given as they were at the start
        asyncio.run(decorated())
    finally:
        context.detach(attached)
        _exit(entered)
    if state.pending is not None:
        state.pending.settle(True)
    root.end()
    telemetry.force_flush()
    spans = exporter.get_finished_spans()
    telemetry.shutdown()
    names = {s.context.span_id: s.name for s in spans}
    return sorted(
        (
            s.name,
            names.get(s.parent.span_id) if s.parent else None,
            sorted(dict(s.attributes or {}).items()),
            [(e.name, sorted(e.attributes or {})) for e in s.events],
            s.status.status_code,
        )
        for s in spans
    )


def test_stage_records_build_the_tree_always_on_records() -> None:
    """Through ``stage()`` itself: every stage of a kept trace, recorded as data (a
    StageRecord, or a DeferredSpan where its span was asked for), is exported as
    always_on exports it: names, parents, attributes, events, statuses."""
    kept = _stages_of(TailSampler(0.0))
    assert kept == _stages_of(ALWAYS_ON)
    assert len(kept) == 12  # root, 10 stage spans (one entered twice), the child


def test_a_span_started_after_its_stage_closed_goes_under_the_stage_parent() -> None:
    """A task begun inside a stage of a pending trace that starts a span after the stage
    has closed (its record held already) neither fails nor loses the span: the span hangs
    under the stage's parent (docs/tail-sampling.md says so)."""
    telemetry, exporter = _telemetry(TailSampler(0.0))
    root = telemetry.tracer.start_span("root")
    state = RequestState(telemetry, root)

    async def late() -> None:
        await asyncio.sleep(0.01)
        telemetry.tracer.start_span("late").end()

    async def request() -> None:
        with stage("spawner"):
            task = asyncio.create_task(late())
        await task

    entered = _enter(state)
    attached = context.attach(trace.set_span_in_context(root))
    try:
        asyncio.run(request())
    finally:
        context.detach(attached)
        _exit(entered)
    assert state.pending is not None
    state.pending.settle(True)
    root.end()
    telemetry.force_flush()
    spans = {s.name: s for s in exporter.get_finished_spans()}
    telemetry.shutdown()
    assert set(spans) == {"root", "spawner", "late"}
    assert spans["late"].parent.span_id == spans["root"].context.span_id
    assert spans["spawner"].parent.span_id == spans["root"].context.span_id


@pytest.fixture(scope="module")
def telemetries() -> Iterator[dict[str, tuple[Any, InMemorySpanExporter]]]:
    """stagelens under the tail sampler (ratio 0: every trace pending) and always_on."""
    made = {}
    for name, sampler in (("tail", TailSampler(0.0)), ("always_on", ALWAYS_ON)):
        made[name] = _telemetry(sampler)
    yield made
    for telemetry, _ in made.values():
        telemetry.shutdown()


def _stage_attributes(
    telemetry: Any,
    exporter: InMemorySpanExporter,
    given: dict[str, Any],
    sets: list[dict[str, Any]],
    span_at: int,
) -> dict[str, Any]:
    """The exported attributes of one stage given ``given``, then each of ``sets`` set
    with ``_set_span_attributes`` (its ``.span`` read before set number ``span_at``)."""
    root = telemetry.tracer.start_span("root")
    state = RequestState(telemetry, root)
    entered = _enter(state)
    try:
        with stage("billing", given) as billing:
            for i, attributes in enumerate(sets):
                if i == span_at:
                    assert billing.span.is_recording()
                billing._set_span_attributes(attributes)
    finally:
        _exit(entered)
    if state.pending is not None:
        state.pending.settle(True)
    root.end()
    telemetry.force_flush()
    spans = exporter.get_finished_spans()
    exporter.clear()
    (built,) = [s for s in spans if s.name == "billing"]
    return dict(built.attributes or {})


@settings(max_examples=100, deadline=None)
@given(
    st.dictionaries(_KEYS, _VALUES, max_size=4),
    st.lists(st.dictionaries(_KEYS, _VALUES, max_size=4), max_size=4),
    st.integers(0, 4),
)
def test_attributes_set_on_a_stage_record_are_those_a_span_keeps(
    telemetries: dict[str, tuple[Any, InMemorySpanExporter]],
    given: dict[str, Any],
    sets: list[dict[str, Any]],
    span_at: int,
) -> None:
    """``stage._set_span_attributes`` (what ``bill()`` uses) on a stage of a pending
    trace, which keeps them on its record rather than making a span, leaves on the span
    built when the trace is kept what the same calls leave on a span under always_on:
    None values skipped and earlier values kept, whether or not the span was asked for
    in between (``span_at``; past the end: never)."""
    got = _stage_attributes(*telemetries["tail"], given, sets, span_at)
    want = _stage_attributes(*telemetries["always_on"], given, sets, span_at)
    assert got == want
    assert got["stagelens.stage"] == "billing"


def test_a_kept_stage_record_lies_on_the_wall_clock_between_readings_around_it() -> None:
    """A stage held as data is timed on ``perf_counter`` (``StageClock``) and put on the
    wall clock only when its trace is kept: its span starts and ends between ``time_ns``
    readings the test takes around the block, and lasts the duration its metric
    recorded (the request's stage time), to the nanosecond the conversion rounds to."""
    telemetry, exporter = _telemetry(TailSampler(0.0))
    root = telemetry.tracer.start_span("root")
    state = RequestState(telemetry, root)
    entered = _enter(state)
    attached = context.attach(trace.set_span_in_context(root))
    try:
        before = time.time_ns()
        with stage("timed"):
            time.sleep(0.002)
        after = time.time_ns()
        time.sleep(0.002)  # the decision comes later than the stage's end
    finally:
        context.detach(attached)
        _exit(entered)
    assert state.pending is not None
    state.pending.settle(True)
    root.end()
    telemetry.force_flush()
    (span,) = [s for s in exporter.get_finished_spans() if s.name == "timed"]
    telemetry.shutdown()
    assert span.start_time is not None
    assert span.end_time is not None
    slack = 50_000  # two clocks read a few microseconds apart
    assert before - slack <= span.start_time < span.end_time <= after + slack
    (recorded,) = [seconds for name, seconds in state.stage_times if name == "timed"]
    assert abs((span.end_time - span.start_time) - recorded * 1e9) <= 1
