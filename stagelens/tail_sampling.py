"""Tail sampling: keep a request's trace by what happened to it, decided when it ends.

Why here, not in a Collector: OpenTelemetry's answer to "keep the slow and failed traces"
is the Collector's tail-sampling processor, which holds every span of every request in
memory until it decides. stagelens' deferred tracer (``stagelens.spans``) already
records a request's spans as plain data and builds them only after export is decided, so
the decision can be taken in the serving process, with the outcome in hand, at no cost to
the traces it drops: their spans are never built, encoded or queued.

Two parts, each with one job:

- ``TailSampler``, the OpenTelemetry ``Sampler`` that ``OTEL_TRACES_SAMPLER=stagelens_tail``
  (``OTEL_TRACES_SAMPLER_ARG`` = the base keep ratio, default ``DEFAULT_RATIO``) or
  ``configure(sampler=TailSampler(ratio))`` installs. At a trace's start it decides what
  can be decided then: a sampled parent, or the trace id under the base ratio (as
  ``TraceIdRatioBased``, so services sampling by ratio agree), is kept; every other trace
  is ``RECORD_ONLY``, recorded but not (yet) sampled, and its ``traceparent`` says so.
  What such a trace's spans are meanwhile, and how they are kept or dropped, is
  ``stagelens.spans``'s (``PendingTrace``, ``DeferredSpan``).
- ``keep_reason`` and ``ExemplarSlots``: the rules the middleware applies at the request's
  end (failed, client gone, slow against the SLO thresholds, needed as an exemplar).

Under the SDK's own ``TracerProvider`` (``opentelemetry-instrument``, or a provider given to
``configure()``) only the start-time part applies: ``RECORD_ONLY`` spans are not exported.
"""

from __future__ import annotations

import os
import time
from bisect import bisect_left
from collections.abc import Sequence
from typing import Final

from opentelemetry.context import Context
from opentelemetry.sdk.trace.sampling import (
    Decision,
    Sampler,
    SamplingResult,
    TraceIdRatioBased,
)
from opentelemetry.trace import (
    Link,
    SpanKind,
    TraceFlags,
    get_current_span,
)
from opentelemetry.trace.span import TraceState
from opentelemetry.util.types import Attributes

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
