"""A kept trace's spans held as data, built into ``RecordedSpan`` objects: a
``DeferredSpan`` (``built``) and a stage's ``StageRecord`` (``built_stage``).
"""

from __future__ import annotations

from opentelemetry import context as otel_context
from opentelemetry.trace import SpanKind

from stagelens import semconv
from stagelens.spans.pending import COMPLETE, DeferredSpan, StageRecord
from stagelens.spans.recorded import RecordedSpan
from stagelens.spans.stages import anchor_in
from stagelens.spans.tracer import DeferredTracer


def built(stage: DeferredSpan) -> RecordedSpan:
    """The span a ``DeferredSpan`` stands for, as ``start_span`` would have made it under
    its parent, with its ids, clock readings, attributes and calls replayed in order."""
    tracer = stage.tracer
    if not isinstance(tracer, DeferredTracer):
        raise TypeError(f"a DeferredSpan of {type(tracer).__name__}, not of a DeferredTracer")
    pending = stage.pending  # its trace, as its own context says (get_span_context)
    span = RecordedSpan(
        tracer._provider,
        tracer._scope,
        stage.name,
        pending.trace_id,
        stage.parent.get_span_context().span_id,
        False,
        pending.trace_state,
        stage.kind,
        stage.start_time,
        {},
        None,
    )
    if stage.span_id:  # drawn for a child or a context: the span keeps it
        span._span_id = stage.span_id
    span.set_attributes(stage.attributes)
    for method, args in stage.calls:
        if method == COMPLETE:
            args[0](span)
        else:
            getattr(span, method)(*args)
    span._end = stage.end_time if stage.end_time is not None else stage.start_time
    return span


def built_stage(record: StageRecord) -> RecordedSpan:
    """The span of a stage held as a ``StageRecord``, as ``stage()`` makes it when the
    trace is sampled from its start: its name as ``stagelens.stage``, then the attributes
    given to ``stage()``."""
    tracer, name, given, parent, start, end = record
    if not isinstance(tracer, DeferredTracer):
        raise TypeError(f"a stage of {type(tracer).__name__}, not of a DeferredTracer")
    if isinstance(parent, otel_context.Context):
        parent = anchor_in(parent)
    parent_ctx = parent.get_span_context()
    span = RecordedSpan(
        tracer._provider,
        tracer._scope,
        name,
        parent_ctx.trace_id,
        parent_ctx.span_id,
        False,
        parent_ctx.trace_state,
        SpanKind.INTERNAL,
        start,
        {semconv.ATTR_STAGE: name},
        None,
    )
    if given:
        span.set_attributes(given)
    span._end = end
    return span
