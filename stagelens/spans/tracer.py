"""``DeferredTracer``: starts ``RecordedSpan`` objects, the sampling decided once per
local root.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Final

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace.sampling import Decision
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    TraceFlags,
    TraceState,
)
from opentelemetry.util.types import Attributes

from stagelens import _compat
from stagelens.spans.pending import DeferredSpan, PendingTrace, new_id
from stagelens.spans.recorded import RecordedSpan
from stagelens.spans.stages import child_parent, open_stage

if TYPE_CHECKING:
    from stagelens.spans.provider import DeferredTracerProvider

_NOT_SAMPLED: Final = TraceFlags(TraceFlags.DEFAULT)
_EMPTY_STATE: Final = TraceState()
_SPAN_KEY: Final = _compat.span_key()
_current_context: Final = _compat.current_context_getter()


class DeferredTracer(trace.Tracer):
    """Starts ``RecordedSpan`` objects; sampling decided once per local root."""

    def __init__(self, provider: DeferredTracerProvider, scope: InstrumentationScope) -> None:
        self._provider = provider
        self._scope = scope

    def start_span(
        self,
        name: str,
        context: otel_context.Context | None = None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
    ) -> trace.Span:
        provider = self._provider
        ctx = context if context is not None else _current_context()
        found = ctx.get(_SPAN_KEY) if _SPAN_KEY is not None else None
        # A local parent is found with one lookup; anything else as the API finds it.
        parent = found if isinstance(found, RecordedSpan) else trace.get_current_span(ctx)
        if open_stage() is not None:  # inside a stage of a pending trace, its child
            parent = child_parent(parent)
        extra: Attributes = None
        if isinstance(parent, RecordedSpan):
            # A local parent that was sampled: its children are, as with parent-based
            # sampling, and no sampler call is needed.
            trace_id = parent._trace_id
            parent_id: int | None = parent._span_id
            parent_remote = False
            trace_state = parent._trace_state
            pending = parent._pending
            local_root = False
        elif isinstance(parent, DeferredSpan):
            # A stage of a pending trace (tail sampler): the same, its id drawn now.
            parent_ctx = parent.get_span_context()
            trace_id, parent_id = parent_ctx.trace_id, parent_ctx.span_id
            parent_remote = False
            trace_state = parent_ctx.trace_state
            pending = parent.pending
            local_root = False
        else:
            local_root = True
            parent_ctx = parent.get_span_context()
            if parent_ctx.is_valid:
                trace_id, parent_id = parent_ctx.trace_id, parent_ctx.span_id
                parent_remote = parent_ctx.is_remote
            else:
                trace_id, parent_id, parent_remote = new_id(128), None, False
            decision = provider.sampler.should_sample(
                context, trace_id, name, kind, attributes, links
            )
            trace_state = decision.trace_state or _EMPTY_STATE
            tail = provider.tail
            if tail is not None:
                # Every trace is recorded; its spans wait for the request's end unless the
                # start already decided (RECORD_AND_SAMPLE: a sampled parent or the ratio).
                pending = PendingTrace(
                    provider._release,
                    trace_id,
                    trace_state,
                    tail.head_reason(parent_ctx.trace_flags.sampled)
                    if decision.decision is Decision.RECORD_AND_SAMPLE
                    else None,
                )
            elif decision.decision is not Decision.RECORD_AND_SAMPLE:
                # RECORD_ONLY is treated as DROP: a span that is never exported is not
                # worth recording here.
                return NonRecordingSpan(
                    SpanContext(trace_id, new_id(64), False, _NOT_SAMPLED, trace_state)
                )
            else:
                pending = None
            extra = decision.attributes
        attrs: dict[str, Any] = dict(attributes) if attributes else {}
        if extra:
            attrs.update(extra)
        span = RecordedSpan(
            provider,
            self._scope,
            name,
            trace_id,
            parent_id,
            parent_remote,
            trace_state,
            kind,
            start_time if start_time is not None else time.time_ns(),
            attrs,
            list(links) if links else None,
            pending,
        )
        if pending is not None and local_root:
            pending.owner = span
        return span

    @contextmanager
    def start_as_current_span(  # type: ignore[override]
        self,
        name: str,
        context: otel_context.Context | None = None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
        end_on_exit: bool = True,
    ) -> Iterator[trace.Span]:
        span = self.start_span(name, context, kind, attributes, links, start_time)
        with trace.use_span(
            span,
            end_on_exit=end_on_exit,
            record_exception=record_exception,
            set_status_on_exception=set_status_on_exception,
        ) as current:
            yield current
