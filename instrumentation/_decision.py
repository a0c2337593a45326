"""A finished request's trace: the tail sampler's decision, and the reference its
observations' exemplars carry (apart from the middleware that asks for them)."""

from __future__ import annotations

import time

from opentelemetry import trace

from stagelens import semconv as sc
from stagelens import tail_sampling
from stagelens.record import ExemplarRef


def _settle(
    pending: tail_sampling.PendingTrace,
    reason: str | None,
    slots: tail_sampling.ExemplarSlots | None,
    root: trace.Span,
    model: str,
    duration: float,
) -> tuple[tuple[str, str], ExemplarRef | None]:
    """Decide the tail-sampled trace of a finished request: kept for ``reason`` (what
    happened to it), else for the start's reason (a sampled parent, the ratio), else as an
    exemplar its duration bucket needs (``slots``; None where no exemplars are kept);
    dropped otherwise. Returns the (decision, reason) counted and the exemplar reference of
    a kept trace (None: dropped, names no trace)."""
    reason = reason or pending.head
    if slots is not None and slots.claim(model, duration, time.monotonic(), reason is not None):
        reason = reason or sc.REASON_EXEMPLAR
    if reason is None:
        pending.settle(False)
        return (sc.DECISION_DROPPED, sc.REASON_FINE), None
    pending.settle(True)
    ctx = root.get_span_context()
    return (sc.DECISION_KEPT, reason), ExemplarRef(ctx.trace_id, ctx.span_id, time.time())


def _sampled_trace(root: trace.Span) -> ExemplarRef | None:
    """The request's trace, named by the exemplars of its observations, when the trace is
    sampled (exported): a span recorded but not sampled (the SDK's ``RECORD_ONLY``) leads
    nowhere, so it names none."""
    ctx = root.get_span_context()
    if ctx.trace_flags.sampled:
        return ExemplarRef(ctx.trace_id, ctx.span_id, time.time())
    return None
