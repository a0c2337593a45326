"""A trace whose keep decision waits for its request's end, and what its spans are held
as meanwhile (the tail sampler): ``PendingTrace``, ``DeferredSpan``, a stage's clock tuple
(``StageClock``, on the wall clock a ``StageRecord``) and ``HeldSpan``.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, Protocol

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState
from opentelemetry.util.types import Attributes, AttributeValue

_SAMPLED: Final = TraceFlags(TraceFlags.SAMPLED)
_NOT_SAMPLED: Final = TraceFlags(TraceFlags.DEFAULT)
_time_ns: Final = time.time_ns
_perf_counter: Final = time.perf_counter


class PendingTrace:
    """The spans of one trace whose keep decision waits for its request's end.

    Made by the deferred tracer at the trace's local root; every local span of the trace
    holds it. A span that ends before the decision is held here; once decided, the held
    spans and every later one go to ``release`` (the export queue) when kept and are
    dropped, never built, when not. ``kept`` is None while undecided; a trace kept at its
    start (``head`` names why) is made decided. No lock: a request's spans end on its
    event loop, where the middleware decides; a span ended on another thread at the very
    moment of the decision could be left out of a kept trace (never added to a dropped
    one)."""

    __slots__ = ("_release", "_spans", "head", "kept", "owner", "trace_id", "trace_state")

    def __init__(
        self,
        release: Callable[[Any], None],
        trace_id: int,
        trace_state: TraceState,
        head: str | None = None,
    ) -> None:
        self._release = release
        self.trace_id = trace_id
        self.trace_state = trace_state
        """The trace's id and state: those of every span recorded with it."""
        self._spans: list[Any] = []
        self.head = head
        """``parent`` or ``ratio`` when kept at the start, else None."""
        self.kept: bool | None = True if head is not None else None
        self.owner: object | None = None
        """The local root span, until it ends (the tracer sets it)."""

    def add(self, span: Any) -> None:
        """A span of the trace ended: hold it, export it or drop it, as decided so far."""
        kept = self.kept
        if kept is None:
            self._spans.append(span)
        elif kept:
            self._release(on_wall_clock(span, _time_ns(), _perf_counter()))

    def settle(self, keep: bool) -> None:
        """Decide once (later calls change nothing): release the held spans or drop them."""
        if self.kept is not None:
            return
        self.kept = keep
        spans, self._spans = self._spans, []
        if keep:
            release = self._release
            now_ns, now = _time_ns(), _perf_counter()  # one reading for every record
            for span in spans:
                release(on_wall_clock(span, now_ns, now))


def on_wall_clock(span: Any, now_ns: int, now: float) -> Any:
    """``span`` as the deferred tracer builds it: a stage held as a ``StageClock`` (its
    start on the ``perf_counter`` clock) as a ``StageRecord``, on the wall clock that
    ``time_ns`` reads, where ``now_ns`` and ``now`` are one moment on each; anything else
    as it is.

    Why a stage is timed on ``perf_counter`` while its trace is undecided: the stage
    reads that clock for its duration metric anyway, so its record needs no ``time_ns``
    reading of its own, and a dropped trace's stages are never put on the wall clock at
    all. Invariant: the span's start is ``now_ns`` less the time from the stage's start
    to ``now``, and its length is the duration the metric recorded."""
    if not isinstance(span, tuple):
        return span
    tracer, name, given, parent, started, elapsed = span
    start_ns = wall_clock_ns(started, now_ns, now)
    return (tracer, name, given, parent, start_ns, start_ns + int(elapsed * 1e9))


def wall_clock_ns(perf: float, now_ns: int, now: float) -> int:
    """``perf`` (a ``perf_counter`` reading) on the wall clock ``time_ns`` reads, where
    ``now_ns`` and ``now`` are one moment on each."""
    return now_ns - int((now - perf) * 1e9)


StageClock = tuple[
    trace.Tracer, str, "Mapping[str, Any] | None", "trace.Span | Context", float, float
]
"""A stage of an undecided trace that nothing asked the span of, held with its trace as
``(tracer, name, attributes given to stage(), parent, start, duration)``, its start on the
``perf_counter`` clock and its duration in seconds (what its metric records): a tuple, the
cheapest record there is. The parent is a span, or the context the stage began in, whose
current span it is (``anchor_in``, read only for a kept trace). A kept trace's records
are put on the wall clock (``on_wall_clock``: a ``StageRecord``) as they are released."""
StageRecord = tuple[trace.Tracer, str, "Mapping[str, Any] | None", "trace.Span | Context", int, int]
"""A ``StageClock`` on the wall clock: ``(tracer, name, attributes, parent, start, end)``
in ``time_ns``, what the deferred tracer builds a stage's span from."""


class DeferredSpan(trace.Span):
    """A stage of a trace whose keep decision is pending, recorded as data, not as a span.

    Why: under the tail sampler most traces are dropped at their request's end, so what a
    stage records before then should cost as little as the metric it feeds. This holds
    the name, the start and end (``time_ns``), the attributes set and, in order, any other
    call made on it (events, status, exceptions, renames, links; rare, replayed on the span
    built from it). Its span id is drawn only when something needs it (a child span, its
    context); a trace that is dropped never draws one. ``tracer`` builds the span when the
    trace is kept (``DeferredTracer.build``); ``pending.add`` is told when it ends.

    It is not attached to the OpenTelemetry context: ``trace.get_current_span()`` inside
    the stage gives the span current when it began (``anchor``). ``enter_stage`` names it
    as the open stage (``open_stage``) instead, and the deferred tracer starts a span whose
    parent would be ``anchor`` under it (``child_parent``): so spans started inside the
    stage, with stagelens' tracer or any tracer of its provider, are its children, as they
    are when the stage is a span. The upstream call's span of a pending trace is one too
    (``kind`` CLIENT) once something needs it as a span: until then the call itself holds
    what it needs, is the stage open around the wrapped transport
    (``instrumentation.httpx``) and is held with the trace when it ends (``HeldSpan``);
    its response attributes are left to ``when_built``."""

    __slots__ = (
        "_calls",
        "_context",
        "anchor",
        "attributes",
        "end_time",
        "kind",
        "name",
        "parent",
        "pending",
        "span_id",
        "start_time",
        "tracer",
    )

    def __init__(
        self,
        tracer: trace.Tracer,
        name: str,
        anchor: trace.Span,
        parent: trace.Span,
        pending: PendingTrace,
        attributes: dict[str, Any],
        kind: SpanKind = SpanKind.INTERNAL,
        start_time: int | None = None,
        complete: Callable[[trace.Span], None] | None = None,
    ) -> None:
        self.tracer = tracer
        self.kind = kind
        self.name = name
        self.anchor = anchor
        """The span current in the OpenTelemetry context when it began."""
        self.parent = parent
        """Its parent: the stage open around it (``parent_under``), else ``anchor``."""
        self.pending = pending
        self.attributes = attributes
        self.start_time = start_time if start_time is not None else _time_ns()
        self.end_time: int | None = None
        self.span_id = 0
        """0 until drawn (``get_span_context``)."""
        self._calls: list[tuple[str, tuple[Any, ...]]] | None = (
            None if complete is None else [(COMPLETE, (complete,))]
        )
        """Calls to replay on the span built from it (``calls``); ``complete`` given at
        its start is its first ``when_built`` function."""
        self._context: SpanContext | None = None

    def deferred(self) -> DeferredSpan:
        """Itself (``OpenStage``)."""
        return self

    def as_deferred(self) -> DeferredSpan:
        """Itself (``HeldSpan``)."""
        return self

    @property
    def calls(self) -> Sequence[tuple[str, tuple[Any, ...]]]:
        """The Span API calls made on it other than attributes, in order."""
        return self._calls or ()

    def when_built(self, complete: Callable[[trace.Span], None]) -> None:
        """Have ``complete(span)`` run on the span built from this one, in order with the
        other calls, if the trace is kept: work only a kept span needs (attributes that
        take parsing, child spans), never done for a dropped one."""
        self._call(COMPLETE, complete)

    def _call(self, method: str, *args: Any) -> None:
        if self.end_time is None:
            if self._calls is None:
                self._calls = []
            self._calls.append((method, args))

    # -- the Span API --------------------------------------------------------------------
    def get_span_context(self) -> SpanContext:
        """Draws the span id on first use; sampled only once the trace is kept (as a
        span of a pending trace says). The trace is its pending trace's: no span around
        it is asked for its context (the upstream call's ``traceparent`` names it alone)."""
        ctx = self._context
        if ctx is None:
            if not self.span_id:
                self.span_id = new_id(64)
            ctx = self._context = context_in(self.pending, self.span_id)
        return ctx

    def is_recording(self) -> bool:
        return self.end_time is None

    def set_attribute(self, key: str, value: AttributeValue) -> None:
        if self.end_time is None and value is not None:
            self.attributes[key] = value

    def set_attributes(self, attributes: Mapping[str, AttributeValue]) -> None:
        if self.end_time is None:
            mine = self.attributes
            for key, value in attributes.items():
                if value is not None:
                    mine[key] = value

    def add_event(
        self, name: str, attributes: Attributes = None, timestamp: int | None = None
    ) -> None:
        self._call("add_event", name, dict(attributes or {}), timestamp or time.time_ns())

    def add_link(self, context: SpanContext, attributes: Attributes = None) -> None:
        self._call("add_link", context, attributes)

    def update_name(self, name: str) -> None:
        self._call("update_name", name)

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        self._call("set_status", status, description)

    def record_exception(
        self,
        exception: BaseException,
        attributes: Attributes = None,
        timestamp: int | None = None,
        escaped: bool = False,
    ) -> None:
        self._call("record_exception", exception, attributes, timestamp or time.time_ns(), escaped)

    def end(self, end_time: int | None = None) -> None:
        """Hand it to its trace: held, built or dropped, as the trace is decided."""
        if self.end_time is not None:
            return
        self.end_time = end_time if end_time is not None else _time_ns()
        self.pending.add(self)


def context_in(pending: PendingTrace, span_id: int) -> SpanContext:
    """The context of the span ``span_id`` of ``pending``'s trace, as it stands now:
    sampled only once the trace is kept (what a ``traceparent`` sent upstream says)."""
    flags = _SAMPLED if pending.kept else _NOT_SAMPLED
    return SpanContext(pending.trace_id, span_id, False, flags, pending.trace_state)


class HeldSpan(Protocol):
    """A finished span of a pending trace held as something other than a span or a
    stage's tuple (the upstream call of ``instrumentation.httpx``, whose span nothing
    asked for): made into its ``DeferredSpan`` only if the trace is kept."""

    def as_deferred(self) -> DeferredSpan:
        """The ``DeferredSpan`` it stands for, ended."""
        ...


COMPLETE: Final = "when_built"
"""The method name under which ``DeferredSpan.calls`` lists a ``when_built`` function."""


def new_id(bits: int) -> int:
    """A random id of ``bits`` bits, never all zero (invalid in W3C trace context): span
    ids (64) and trace ids (128) of the deferred tracer and of ``DeferredSpan``."""
    value = random.getrandbits(bits)
    while value == 0:
        value = random.getrandbits(bits)
    return value
