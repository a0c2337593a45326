"""Per-request state: one object per request, reached through a context variable.

Why: the middleware instance is shared by every concurrent request, so nothing about a
request may live on it (STYLE rule 9). The state carries the request's telemetry wiring,
its timestamps, model, tenant and usage; ``stage()``, ``record_usage()`` and the upstream
instrumentation find it with one ContextVar lookup.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from opentelemetry import trace

from stagelens import semconv as sc
from stagelens.metrics.genai_call import GenAICall
from stagelens.metrics.record import BillingRecord, StageTimes
from stagelens.pricing import Usage
from stagelens.spans.recorded import pending_of
from stagelens.stages import Stage

if TYPE_CHECKING:
    from stagelens.spans.pending import PendingTrace
    from stagelens.telemetry import Telemetry

_CURRENT: contextvars.ContextVar[RequestState | None] = contextvars.ContextVar(
    "stagelens_request", default=None
)


class RequestState:
    """What stagelens knows about one in-flight request."""

    __slots__ = (
        "billed",
        "billing",
        "code",
        "cost_usd",
        "disconnected",
        "genai",
        "inference",
        "model",
        "pending",
        "phases",
        "recording",
        "rejected_by",
        "request_id",
        "root_span",
        "stage_times",
        "started_at",
        "streamed",
        "telemetry",
        "tenant",
        "token_times",
        "tokenless",
        "upstream_usage",
        "usage",
    )

    def __init__(self, telemetry: Telemetry, root_span: trace.Span) -> None:
        self.telemetry = telemetry
        self.root_span = root_span
        self.recording = recording = root_span.is_recording()
        """The trace is sampled in: stages and the upstream call make spans."""
        self.pending: PendingTrace | None = pending_of(root_span) if recording else None
        """The trace's keep decision under the tail sampler (None under any other): while
        it is undecided, stages record ``DeferredSpan`` data rather than spans."""
        self.started_at = time.perf_counter()
        self.model: str | None = None
        self.tenant: str | None = None
        self.usage: Usage | None = None
        self.upstream_usage: Usage | None = None
        self.billed = False
        self.billing: BillingRecord | None = None
        """What ``bill()`` counted, recorded with the request's other figures at its end."""
        self.phases: list[tuple[str, float]] | None = None
        """The engine's (phase, seconds) from the upstream response, recorded at the end."""
        self.cost_usd: float | None = None
        self.rejected_by: str | None = None
        self.token_times: list[float] = []
        """``perf_counter()`` of every non-empty body chunk sent to the client (the first
        token is the first of them sent after the first output arrived from upstream)."""
        self.inference: InferenceFacts | None = None
        """What the request's upstream completion calls produced (None: it made none)."""
        self.streamed = False
        """The request asked for a streamed completion (set by the upstream instrumentation
        from the call's ``stream``, or by an app that streams its own way); such requests
        are the population of the ``ttft`` and ``goodput`` SLIs."""
        self.disconnected = False
        self.code: int | None = None
        self.request_id: str | None = None
        """The ``X-Request-Id`` of the latest upstream call: the app's own, or the one
        stagelens minted for a recorded inference span; None when none was sent."""
        self.stage_times = StageTimes([])
        """(stage, seconds) recorded at request end, when the model label is known."""
        self.tokenless = False
        """The answer carries no generated tokens (embeddings): it has no first token."""
        self.genai: GenAICall | None = None
        """The upstream GenAI call, set only while the GenAI metrics are on."""

    @property
    def first_token_at(self) -> float | None:
        """When the first token went to the client (``perf_counter()``), or None: the first
        body sent after the first output-bearing event (content, tool call, reasoning,
        completion text) arrived from an upstream completion call, or, for a call that is
        not streamed, after its whole answer arrived. A request that made no such call, or
        whose answer generates no tokens (``set_tokenless``), has none."""
        inference = self.inference
        if inference is None or self.tokenless:
            return None
        at = inference.first_output
        times = self.token_times
        return times[at] if at is not None and at < len(times) else None

    @property
    def first_answer_at(self) -> float | None:
        """When the first answer token went to the client (``perf_counter()``), or None: as
        ``first_token_at``, for the first answer-bearing event (anything but reasoning).
        None for a stream that ended (or was cut) while the model was still thinking."""
        inference = self.inference
        if inference is None or self.tokenless:
            return None
        at = inference.first_answer
        times = self.token_times
        return times[at] if at is not None and at < len(times) else None

    @property
    def model_label(self) -> str:
        """The ``model`` label value for this request."""
        return self.model or self.telemetry.settings.default_model

    def set_model(self, model: str) -> None:
        """Name the served model (labels every metric of this request; the root span
        says it as it ends, with the request's other figures)."""
        self.model = model

    def set_tenant(self, tenant: str) -> None:
        """Name the tenant (a configured name or a key fingerprint, never a key)."""
        self.tenant = tenant
        if self.root_span.is_recording():
            self.root_span.set_attribute(sc.ATTR_TENANT, self.telemetry.tenants.label(tenant))

    def set_streamed(self) -> None:
        """Say that the client asked for a streamed completion: the ``ttft`` and ``goodput``
        SLIs count the request. The upstream instrumentation says so for every streamed
        call it sends; an app says it itself so that a request it answers before any call
        (a 503 at admission, a backend refused) is counted too: no first token, because
        the request failed, is bad for the TTFT SLI."""
        self.streamed = True

    def set_tokenless(self) -> None:
        """Say that the answer generates no tokens (an embedding): its first body byte is no
        first token, so the request records no time to first token."""
        self.tokenless = True

    def add_stage_time(self, stage: Stage | str, seconds: float) -> None:
        """Add ``seconds`` of work done in pieces outside a ``stage()`` block (a stream's
        per-event post-processing) to the stage's time for this request: added to the last
        time recorded for that stage (one observation per stage), or recorded alone."""
        name = stage.value if isinstance(stage, Stage) else str(stage)
        times = self.stage_times
        for i in range(len(times) - 1, -1, -1):
            if times[i][0] == name:
                times[i] = (name, times[i][1] + seconds)
                return
        times.append((name, seconds))

    def reject(self, stage: Stage | str) -> None:
        """Record that ``stage`` answered the request with an error."""
        self.rejected_by = stage.value if isinstance(stage, Stage) else str(stage)
        if self.root_span.is_recording():
            self.root_span.set_attribute(sc.ATTR_REJECTED_BY, self.rejected_by)


class InferenceFacts:
    """What a request's upstream completion calls produced, kept for its end.

    Written by the upstream instrumentation as events arrive, read once by the middleware.
    Output events are not timed here: each is marked with the number of bodies sent to
    the client so far (``len(token_times)``), which is the index of the first body sent
    after it arrived. The request's first token and each inter-token gap are read from
    those sends, so they are what the client was sent, however the app re-frames the
    stream, and cost no clock read per event.
    """

    __slots__ = (
        "calls",
        "choices",
        "estimated",
        "failure",
        "first_answer",
        "first_output",
        "ok",
        "reasoning_counted",
        "unbilled",
        "upstream_ttft",
    )

    def __init__(self) -> None:
        self.calls = 0
        """Upstream completion calls made."""
        self.first_output: int | None = None
        """Mark of the first output-bearing event of any call (see the class docstring)."""
        self.first_answer: int | None = None
        """Mark of the first answer-bearing event of any call: output that is not reasoning
        (``first_output`` itself for a model that does not reason)."""
        self.choices: list[list[int]] = []
        """Per choice of each streamed call: the marks of its output-bearing events."""
        self.failure: str | None = None
        """``error.type`` when the latest call failed after its response headers (backend
        gone mid-stream, an error event, a stream ending before its last event)."""
        self.ok = False
        """Some call was answered successfully (a model it named is a served one)."""
        self.estimated = False
        """Some call's usage was estimated from what was received."""
        self.reasoning_counted = False
        """Some call's reasoning tokens were counted from its reasoning events (its usage
        did not say them): the root span's usage is marked estimated."""
        self.unbilled = False
        """Some answered call left nothing to bill (no usage, no output received)."""
        self.upstream_ttft: float | None = None
        """Seconds from sending the first streamed call that produced output to its first
        output-bearing event (``stagelens_upstream_time_to_first_token_seconds``)."""


current_request: Final[Callable[[], RequestState | None]] = _CURRENT.get
"""The state of the request being served in this context, or None outside one: the
context variable's own ``get``, one C call (every stage and upstream call reads it)."""


def _enter(state: RequestState) -> contextvars.Token[RequestState | None]:
    return _CURRENT.set(state)


def _exit(token: contextvars.Token[RequestState | None]) -> None:
    _CURRENT.reset(token)
