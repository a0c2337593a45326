"""Tail sampling: keep a request's trace by what happened to it, decided when it ends.

Why here, not in a Collector: OpenTelemetry's answer to "keep the slow and failed traces"
is the Collector's tail-sampling processor, which holds every span of every request in
memory until it decides. stagelens' deferred tracer (``exporters/deferred.py``) already
records a request's spans as plain data and builds them only after export is decided, so
the decision can be taken in the serving process, with the outcome in hand, at no cost to
the traces it drops: their spans are never built, encoded or queued.

Three parts, each with one job:

- ``TailSampler``, the OpenTelemetry ``Sampler`` that ``OTEL_TRACES_SAMPLER=stagelens_tail``
  (``OTEL_TRACES_SAMPLER_ARG`` = the base keep ratio, default ``DEFAULT_RATIO``) or
  ``configure(sampler=TailSampler(ratio))`` installs. At a trace's start it decides what
  can be decided then: a sampled parent, or the trace id under the base ratio (as
  ``TraceIdRatioBased``, so services sampling by ratio agree), is kept; every other trace
  is ``RECORD_ONLY``, recorded but not (yet) sampled, and its ``traceparent`` says so.
- ``PendingTrace``, the spans of one trace while its decision waits, released to the
  export queue when it is kept and discarded when it is not.
- ``DeferredSpan``, what a ``stage()`` of such a trace records instead of a span: its name,
  clock readings and attributes, turned into a span by the deferred tracer only when the
  trace is kept. It is not made current in the OpenTelemetry context (attaching a context
  costs as much as the rest of the record); ``open_stage`` names it to the tracer instead,
  so spans started inside the stage are still its children.
- ``keep_reason`` and ``ExemplarSlots``: the rules the middleware applies at the request's
  end (failed, client gone, slow against the SLO thresholds, needed as an exemplar).

Under the SDK's own ``TracerProvider`` (``opentelemetry-instrument``, or a provider given to
``configure()``) only the start-time part applies: ``RECORD_ONLY`` spans are not exported.
"""

from __future__ import annotations

import contextvars
import os
import random
import time
from bisect import bisect_left
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, Protocol

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace.sampling import (
    Decision,
    Sampler,
    SamplingResult,
    TraceIdRatioBased,
)
from opentelemetry.trace import (
    Link,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    get_current_span,
)
from opentelemetry.trace.span import TraceState
from opentelemetry.util.types import Attributes, AttributeValue

from stagelens import _compat
from stagelens import semconv as sc
from stagelens.errors import ConfigurationError

DEFAULT_RATIO: Final = 0.01
"""Base keep ratio when ``OTEL_TRACES_SAMPLER_ARG`` is unset: one fine request in a hundred
(every failed, slow, abandoned and exemplar request is kept besides)."""

EXEMPLAR_REFRESH_SECONDS: Final = 15.0
"""The default of ``Settings.tail_exemplar_refresh_seconds``: a request-duration bucket of
a model that no kept trace filled for this long gets the next request that lands in it
kept as its exemplar: about one Prometheus scrape interval, so each scrape can find a fresh
exemplar that opens a trace, at a bounded cost (at most one kept trace per model and
bucket per interval)."""

_ENV_SAMPLER: Final = "OTEL_TRACES_SAMPLER"
_ENV_ARG: Final = "OTEL_TRACES_SAMPLER_ARG"
_LIMIT: Final = TraceIdRatioBased.TRACE_ID_LIMIT
_HEAD_KEEP: Final = SamplingResult(Decision.RECORD_AND_SAMPLE)
_PENDING: Final = SamplingResult(Decision.RECORD_ONLY)
_SLOW_SLIS: Final = frozenset({sc.SLI_TTFT, sc.SLI_ITL, sc.SLI_GOODPUT})
_SPAN_KEY: Final = _compat.span_key()
_SAMPLED: Final = TraceFlags(TraceFlags.SAMPLED)
_NOT_SAMPLED: Final = TraceFlags(TraceFlags.DEFAULT)
_time_ns: Final = time.time_ns
_perf_counter: Final = time.perf_counter


class TailSampler(Sampler):
    """Keep at the start what a sampled parent or the base ratio chooses; leave every other
    trace ``RECORD_ONLY``, for the request's end to decide (``PendingTrace``).

    ``ratio`` is the base keep ratio in [0, 1]; ConfigurationError otherwise."""

    def __init__(self, ratio: float = DEFAULT_RATIO) -> None:
        if not 0.0 <= ratio <= 1.0:
            raise ConfigurationError(f"tail sampler: base ratio must be in [0, 1], got {ratio}")
        self.ratio = float(ratio)
        self.bound = TraceIdRatioBased.get_bound_for_rate(self.ratio)
        """Trace ids whose low 64 bits are under this are kept by ratio (the SDK's rule)."""

    def should_sample(
        self,
        parent_context: Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        trace_state: TraceState | None = None,
    ) -> SamplingResult:
        parent = get_current_span(parent_context).get_span_context()
        if parent.is_valid:
            state = parent.trace_state
            if parent.trace_flags.sampled or trace_id & _LIMIT < self.bound:
                return SamplingResult(Decision.RECORD_AND_SAMPLE, None, state)
            return SamplingResult(Decision.RECORD_ONLY, None, state)
        return _HEAD_KEEP if trace_id & _LIMIT < self.bound else _PENDING

    def head_reason(self, parent_sampled: bool) -> str:
        """Why a trace this sampler kept at its start was kept."""
        return sc.REASON_PARENT if parent_sampled else sc.REASON_RATIO

    def get_description(self) -> str:
        return f"StagelensTail{{{self.ratio}}}"


def tail_sampler(arg: str | float | None = None) -> TailSampler:
    """The ``opentelemetry_traces_sampler`` entry point ``stagelens_tail``: a TailSampler at
    the base ratio ``arg`` (``OTEL_TRACES_SAMPLER_ARG`` as the SDK passes it: a string, or
    None when unset, for ``DEFAULT_RATIO``). ConfigurationError for a bad ratio."""
    if arg is None or (isinstance(arg, str) and not arg.strip()):
        return TailSampler()
    try:
        ratio = float(arg)
    except ValueError:
        raise ConfigurationError(
            f"{_ENV_ARG}: the {sc.TRACES_SAMPLER_TAIL} base ratio must be a number in [0, 1], "
            f"got {arg!r}"
        ) from None
    return TailSampler(ratio)


def sampler_from_env() -> TailSampler | None:
    """A TailSampler when ``OTEL_TRACES_SAMPLER`` names ``stagelens_tail``, else None."""
    if os.environ.get(_ENV_SAMPLER, "").strip().lower() != sc.TRACES_SAMPLER_TAIL:
        return None
    return tail_sampler(os.environ.get(_ENV_ARG))


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
    if type(span) is not tuple:
        return span
    tracer, name, given, parent, started, elapsed = span
    start_ns = wall_clock_ns(started, now_ns, now)
    return (tracer, name, given, parent, start_ns, start_ns + int(elapsed * 1e9))


def wall_clock_ns(perf: float, now_ns: int, now: float) -> int:
    """``perf`` (a ``perf_counter`` reading) on the wall clock ``time_ns`` reads, where
    ``now_ns`` and ``now`` are one moment on each."""
    return now_ns - int((now - perf) * 1e9)


class OpenStage(Protocol):
    """A stage of an undecided trace, open in a context (``enter_stage``): ``stage()``
    itself, which records a ``DeferredSpan`` only when something asks for its span, or a
    ``DeferredSpan``."""

    @property
    def anchor(self) -> trace.Span:
        """The span current in the OpenTelemetry context when the stage began."""
        ...

    def deferred(self) -> DeferredSpan | None:
        """The stage's span as data, made on the first call; None once the stage has
        closed without one (its record is held already)."""
        ...


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

_OPEN: contextvars.ContextVar[OpenStage | None] = contextvars.ContextVar(
    "stagelens_open_stage", default=None
)
open_stage: Final[Callable[[], OpenStage | None]] = _OPEN.get
"""The innermost stage open in this context, or None (one C call)."""


def anchor_in(ctx: Context) -> trace.Span:
    """The span current in ``ctx``: one lookup where ``_compat.span_key`` knows the key,
    else as the OpenTelemetry API finds it."""
    found: Any = ctx.get(_SPAN_KEY) if _SPAN_KEY is not None else None
    return found if found is not None else get_current_span(ctx)


def parent_under(anchor: trace.Span, opened: OpenStage | None) -> trace.Span:
    """The parent of what begins with ``anchor`` current while ``opened`` is the open
    stage: that stage (its span as data) when it began under ``anchor`` too, else
    ``anchor``."""
    if opened is not None and opened.anchor is anchor:
        span = opened.deferred()
        if span is not None:
            return span
    return anchor


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


def deferred_span(
    tracer: trace.Tracer,
    name: str,
    ctx: Context,
    pending: PendingTrace,
    attributes: dict[str, Any],
    kind: SpanKind = SpanKind.INTERNAL,
) -> DeferredSpan:
    """A ``DeferredSpan`` beginning now in ``ctx``, under the stage open there."""
    anchor = anchor_in(ctx)
    parent = parent_under(anchor, _OPEN.get())
    return DeferredSpan(tracer, name, anchor, parent, pending, attributes, kind)


enter_stage: Final[Callable[[OpenStage], contextvars.Token[OpenStage | None]]] = _OPEN.set
"""Open a stage in this context (``open_stage``), until ``leave_stage`` with the token it
returns, in the same context (a ``with`` block's exit). The token's ``old_value`` is the
stage open around it (``contextvars.Token.MISSING`` for none yet in this context)."""
leave_stage: Final[Callable[[contextvars.Token[OpenStage | None]], None]] = _OPEN.reset
"""Close the stage ``enter_stage`` opened."""


def outer_stage(token: contextvars.Token[OpenStage | None]) -> OpenStage | None:
    """The stage that was open when ``enter_stage`` gave ``token``, or None."""
    outer = token.old_value
    return None if outer is contextvars.Token.MISSING else outer


def new_id(bits: int) -> int:
    """A random id of ``bits`` bits, never all zero (invalid in W3C trace context): span
    ids (64) and trace ids (128) of the deferred tracer and of ``DeferredSpan``."""
    value = random.getrandbits(bits)
    while value == 0:
        value = random.getrandbits(bits)
    return value


def child_parent(parent: trace.Span) -> trace.Span:
    """The parent a span started now under ``parent`` (the context's current span) has:
    the stage open in this context when it began under ``parent`` (its span as data),
    else ``parent`` itself."""
    return parent_under(parent, _OPEN.get())


def keep_reason(
    *,
    server_failed: bool,
    client_gone: bool,
    verdicts: Sequence[tuple[str, bool]],
    worst_gap: float | None,
    duration: float,
    stall_seconds: float,
    slow_seconds: float,
) -> str | None:
    """Why a finished request's trace must be kept whatever the ratio, or None.

    ``server_failed``: answered 5xx, failed after its headers, or the app raised (the
    upstream errors among them). Slow is judged against the SLO thresholds the gateway
    already applied (the ``ttft``, ``itl`` and ``goodput`` verdicts), one inter-token gap
    over ``stall_seconds`` (``worst_gap``: the longest, None without two output events; the
    SLI verdicts are taken from it too, so it is found once), or the whole request over
    ``slow_seconds``. The first that applies names the reason: error, then client gone,
    then slow."""
    if server_failed:
        return sc.REASON_ERROR
    if client_gone:
        return sc.REASON_CLIENT_LEFT
    if duration > slow_seconds or (worst_gap is not None and worst_gap > stall_seconds):
        return sc.REASON_SLOW
    for sli, bad in verdicts:
        if bad and sli in _SLOW_SLIS:
            return sc.REASON_SLOW
    return None


class ExemplarSlots:
    """When a kept trace last fell in each request-duration bucket of each model, and the
    slowest request of each model in the current window.

    Why: a histogram bucket's exemplar is the latest kept request in it, and with a small
    base ratio a bucket that fine requests fill would get none for long stretches. A
    request whose bucket no kept trace filled for ``refresh_seconds`` is kept as that
    bucket's exemplar, so every bucket in use names a trace that exists. So is a request
    slower than every earlier one of its model in the same window (windows of
    ``refresh_seconds``, one after the other): the slowest request of any stretch of
    traffic is always kept, for a few traces more per window (a new slowest among ``n``
    requests in random order comes about ``ln n`` times). Bounded: one entry per model
    label and bucket, and one per model label (both bounded)."""

    __slots__ = ("_bounds", "_filled", "_refresh", "_slowest")

    def __init__(
        self, bounds: Sequence[float], refresh_seconds: float = EXEMPLAR_REFRESH_SECONDS
    ) -> None:
        self._bounds = list(bounds)
        self._refresh = refresh_seconds
        self._filled: dict[tuple[str, int], float] = {}
        self._slowest: dict[str, tuple[float, float]] = {}
        """Per model: (when its window began, the slowest duration in it so far)."""

    def claim(self, model: str, duration: float, now: float, kept: bool) -> bool:
        """Note a finished request (``now``: a monotonic clock); True when it is kept: it
        was already (``kept``), its bucket needs a fresh exemplar, or it is the slowest of
        its model in this window."""
        refresh = self._refresh
        window = self._slowest.get(model)
        if window is None or now - window[0] >= refresh:
            self._slowest[model] = (now, duration)
            slowest = True
        elif duration > window[1]:
            self._slowest[model] = (window[0], duration)
            slowest = True
        else:
            slowest = False
        key = (model, bisect_left(self._bounds, duration))
        if not (kept or slowest):
            last = self._filled.get(key)
            if last is not None and now - last < refresh:
                return False
        self._filled[key] = now
        return True
