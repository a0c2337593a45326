"""The record of one finished request: what every metrics sink learns from it.

Why one record, apart from its sinks: the request path knows the figures (its timings,
tokens, verdicts) and nothing of where they go; the sinks (the Prometheus series, the GenAI
OpenTelemetry metrics) know where they go and nothing of how a request was measured. Like
vLLM's ``v1/metrics`` keeps its stats apart from its loggers, the record is plain data, the
fold (``stagelens.metrics.fold``) batches records off the request path, and each sink receives the
same batches, none above another.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, NewType, Protocol

from stagelens import semconv as sc
from stagelens.metrics.genai_call import GenAICall

__all__ = [
    "BillingRecord",
    "ExemplarRef",
    "LoneRecord",
    "PhaseTimes",
    "Record",
    "RequestRecord",
    "RequestSink",
    "StageTimes",
    "Verdicts",
]

StageTimes = NewType("StageTimes", list[tuple[str, float]])
"""(stage, seconds) of one request's stages, in the order they ended.

A type of its own (not a plain list) so that stage and engine-phase timings, which have the
same shape, cannot be passed for one another: mypy rejects a swap."""

PhaseTimes = NewType("PhaseTimes", list[tuple[str, float]])
"""(engine phase, seconds) the engine reported for one request (queue, prefill, decode)."""

Verdicts = tuple[tuple[str, bool], ...]
"""(sli, bad) for each SLI that counted one request."""


class BillingRecord(NamedTuple):
    """What ``bill()`` counted for one request, recorded with its other figures."""

    tenant: str
    """The tenant label value (bounded, never a key)."""
    input_tokens: int
    output_tokens: int
    cached_input_tokens: int
    """Part of ``input_tokens``."""
    cost_usd: float
    reasoning_tokens: int = 0
    """Part of ``output_tokens``: the tokens the model spent thinking."""
    cache_write_tokens: int = 0
    """Part of ``input_tokens``: the tokens written to the prompt cache."""
    engine_seconds: float | None = None
    """The request's share of the engine's time, as the vLLM server reported it (None when
    it did not: no stagelens middleware there, or an upstream that is not vLLM)."""


class ExemplarRef(NamedTuple):
    """The sampled trace of one finished request: what its observations' exemplars name.

    Ids as integers and the time as read: the hex labels are formatted only for the few
    observations that end up kept (the latest per bucket), never per request."""

    trace_id: int
    span_id: int
    """The request's root span."""
    timestamp: float
    """When the request ended (``time.time()``), the exemplar's timestamp."""


class RequestRecord(NamedTuple):
    """Everything the metrics learn from one finished request, queued as one record.

    A NamedTuple: built by keyword at the one place that submits (the middleware), unpacked
    cheaply by the sinks."""

    model: str
    """The bounded ``model`` label value."""
    code: str
    """The ``code`` label value."""
    duration: float
    """Gateway receipt to last byte sent, seconds."""
    ttft: float | None
    """Time to first token, seconds; answers only."""
    gaps: list[float]
    """Inter-token gaps, seconds."""
    stages: StageTimes
    phases: PhaseTimes | None
    rejected_by: str | None
    """The stage that answered the request with an error."""
    billing: BillingRecord | None
    upstream_ttft: float | None = None
    """Upstream request sent to its first output-bearing event received, seconds."""
    verdicts: Verdicts = ()
    """(sli, bad) for each SLI that counted the request."""
    unmetered: str | None = None
    """The ``billing`` label value when the server's usage was missing, else None."""
    genai: GenAICall | None = None
    """The upstream GenAI call, built only while a sink needs it (``RequestSink.needs_genai``)."""
    exemplar: ExemplarRef | None = None
    """The request's trace when it was sampled (under the tail sampler: kept): its TTFT,
    worst inter-token gap, duration and stage times may become exemplars. None for a
    sampled-out (dropped) request, which never names a trace."""
    prompt_size: str = sc.PROMPT_SIZE_UNKNOWN
    """The ``prompt_size`` label value (``stagelens.config.PromptSizeClasses``) of its TTFT
    and SLI series."""
    ttfat: float | None = None
    """Time to first answer token (not reasoning), seconds; answers only."""
    trace_decision: tuple[str, str] | None = None
    """(decision, reason) of the tail sampler for the request's trace; None under any
    other sampler (``stagelens_trace_decisions_total``)."""
    streamed: bool = True
    """The answer was streamed (asked for, or an event stream): its ``ttft`` and ``ttfat``
    are first tokens. False: ``ttft`` is a whole answer's time, recorded apart
    (``stagelens_non_streamed_response_seconds``)."""


class LoneRecord(NamedTuple):
    """An observation made outside any instrumented request: a ``stage()`` run by code the
    middleware does not wrap (a background job, a start-up step), or an upstream call made
    by a client used outside a request. It reaches every sink as a request's record does,
    through the fold; it is no request, so it counts no request, token or SLI."""

    model: str
    """The bounded ``model`` label value (the default model for a stage)."""
    stages: StageTimes
    phases: PhaseTimes | None = None
    """The engine's own timings of an upstream call."""
    upstream_ttft: float | None = None
    """An upstream call: request sent to its first output-bearing event, seconds."""
    unmetered: str | None = None
    """An upstream call whose server's usage was missing: the ``billing`` label value."""


Record = RequestRecord | LoneRecord
"""What the fold queues and every sink reads."""


class RequestSink(Protocol):
    """Where folded batches of finished requests go (``Fold.add_sink``).

    A sink runs off the request path, in whichever thread folds (a scrape, or the request
    that filled the batch). It must not keep ``batch`` past the call: the fold reuses
    nothing, but other sinks read the same records."""

    needs_genai: bool
    """Whether records must carry ``genai``: building it costs the request path, so it is
    built only while some sink needs it."""

    def write(self, batch: Sequence[Record]) -> list[Exception]:
        """Record ``batch`` (finished requests and lone observations, in the order they
        were submitted); return the failures swallowed (a bad record costs only itself).
        Raising counts as one failure of the whole batch for this sink."""
        ...
