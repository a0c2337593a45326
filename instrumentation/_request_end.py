"""The end of a request: its outcome worked out once, its record submitted to the fold,
its trace decided (the tail sampler) and its root span annotated and ended.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode
from stagelens.instrumentation import _outcome
from stagelens.instrumentation._asgi_io import is_cancellation
from stagelens.instrumentation._span_errors import record_failure
from stagelens.instrumentation.hooks import bill

from stagelens import semconv as sc
from stagelens import tail_sampling
from stagelens.metrics.record import ExemplarRef, PhaseTimes, RequestRecord
from stagelens.request import RequestState
from stagelens.spans.pending import PendingTrace
from stagelens.stages import Stage

if TYPE_CHECKING:
    from stagelens.instrumentation.asgi import _RequestTracker

STATUS_CLIENT_CLOSED = 499
"""``code`` label for a request whose client went away before it received the whole answer
(nginx's "client closed request"): never the 200 nobody received."""
_CODE_LABELS = {code: str(code) for code in range(100, 600)}
"""``code`` label strings, made once."""
_CLIENT_CLOSED_LABEL = _CODE_LABELS[STATUS_CLIENT_CLOSED]


def finish(tracker: _RequestTracker, error: BaseException | None) -> None:
    """Work out the finished request's outcome once, submit its record, decide its trace
    and end its root span; ``error``: what the app raised, if anything."""
    state = tracker.state
    assert state is not None
    telemetry = state.telemetry
    try:
        if state.usage is not None or state.upstream_usage is not None:
            bill()
    except Exception as exc:
        telemetry.report_error("billing", exc)
    end = time.perf_counter()
    disconnected = state.disconnected or (
        error is not None and not tracker.response_done and is_cancellation(error)
    )
    if state.code is not None:
        code = state.code
    elif disconnected:
        code = STATUS_CLIENT_CLOSED
    else:
        code = 500
    if error is not None and not tracker.response_started and not disconnected:
        code = 500
    # Gone before it received the whole answer: noticed before the last body was sent
    # (by receive, a failing send or a look before sending) or by the request being
    # cancelled before it; recorded as 499, whatever status the app had sent.
    client_gone = disconnected
    failure = _outcome.failed_after_headers(state, code, client_gone)
    if failure is not None and state.rejected_by is None:
        state.reject(Stage.INFERENCE)  # the stage that failed, under a 200
    inference = state.inference
    # A name is served once an upstream call for it was answered (a backend dying
    # mid-stream does not make a real model a made-up one; an app answering 200
    # around a refusal does not make a made-up name served).
    served = code < 400 and (inference is None or inference.ok)
    model = telemetry.models.label(state.model_label, served=served)
    code_label = _CLIENT_CLOSED_LABEL if client_gone else (_CODE_LABELS.get(code) or str(code))
    # TTFT is a property of answers: an error body (401, 429, 5xx...) is no first token,
    # and counting its few milliseconds would flatter the TTFT SLI.
    first_token_at = state.first_token_at
    ttft = first_token_at - state.started_at if first_token_at is not None and code < 400 else None
    first_answer_at = state.first_answer_at if ttft is not None else None
    ttfat = first_answer_at - state.started_at if first_answer_at is not None else None
    # A non-streamed answer's first byte comes once its whole generation is done: recorded
    # apart, so that no first-token figure (histogram, span, report) reads a generation.
    streamed = state.streamed or tracker.sse
    gaps = (
        _outcome.inter_token_gaps(state.token_times, inference)
        if tracker.sse and inference is not None
        else []
    )
    worst_gap = max(gaps) if gaps else None
    duration = end - state.started_at
    settings = telemetry.settings
    usage = state.usage or state.upstream_usage
    sizes = tracker.mw.prompt_sizes
    prompt_size, ttft_threshold = sizes.of(
        usage.input_tokens if usage is not None and usage.input_tokens > 0 else None
    )
    server_failed = code >= 500 or failure is not None
    verdicts = _outcome.sli_verdicts(
        streamed=state.streamed,
        code=code,
        server_failed=server_failed,
        client_gone=client_gone,
        ttft=ttft,
        waited=duration,
        worst_gap=worst_gap,
        ttft_threshold=ttft_threshold,
        stall_threshold=settings.itl_stall_threshold_seconds,
        client_left_bad_after=settings.client_left_bad_after_seconds,
        ttfat=ttfat,
        answer_threshold=sizes.answers[prompt_size],
    )
    exemplar: ExemplarRef | None = None
    decision: tuple[str, str] | None = None
    dropped = False
    if state.recording:
        pending = state.pending
        if pending is None:
            exemplar = _sampled_trace(state.root_span)
        else:  # the tail sampler: keep the trace or drop it, now the outcome is known
            reason = tail_sampling.keep_reason(
                server_failed=server_failed or (error is not None and not disconnected),
                client_gone=client_gone,
                verdicts=verdicts,
                worst_gap=worst_gap,
                duration=duration,
                stall_seconds=settings.tail_stall_seconds,
                slow_seconds=settings.tail_slow_seconds,
            )
            slots = telemetry.instruments.exemplar_slots
            decision, exemplar = _settle(pending, reason, slots, state.root_span, model, duration)
            dropped = exemplar is None
    try:
        phases = state.phases
        telemetry.fold.submit(
            RequestRecord(
                model=model,
                code=code_label,
                duration=duration,
                ttft=ttft,
                gaps=gaps,
                stages=state.stage_times,
                phases=PhaseTimes(phases) if phases else None,
                rejected_by=state.rejected_by if code >= 400 or failure is not None else None,
                billing=state.billing,
                upstream_ttft=inference.upstream_ttft if inference is not None else None,
                verdicts=verdicts,
                prompt_size=prompt_size,
                unmetered=_outcome.billing_gap(state),
                genai=state.genai,
                exemplar=exemplar,
                trace_decision=decision,
                ttfat=ttfat,
                streamed=streamed,
            )
        )
    except Exception as exc:
        telemetry.report_error("metrics", exc)
    firsts = (ttft, ttfat) if streamed else (None, None)
    end_root(tracker, error, code, code_label, firsts, disconnected, failure, dropped)


def end_root(
    tracker: _RequestTracker,
    error: BaseException | None,
    code: int,
    code_label: str,
    firsts: tuple[float | None, float | None],
    disconnected: bool,
    failure: str | None,
    dropped: bool = False,
) -> None:
    """Name, annotate and end the root span (only end it when its trace was dropped:
    nothing set on it would be exported)."""
    state = tracker.state
    assert state is not None
    root = state.root_span
    if root.is_recording() and not dropped:
        attributes: dict[str, Any] = {sc.HTTP_RESPONSE_STATUS_CODE: code}  # one call
        route = tracker.scope.get("route")
        route_path = getattr(route, "path", None)
        if isinstance(route_path, str):
            method = tracker.scope.get("method", "GET")
            if method not in tracker.mw.known_methods:
                method = sc.HTTP_SPAN_NAME_OTHER
            root.update_name(f"{method} {route_path}")
            attributes[sc.HTTP_ROUTE] = route_path
        if state.model is not None:
            attributes[sc.GEN_AI_REQUEST_MODEL] = state.model
        ttft, ttfat = firsts  # (the time to first token, to first answer token)
        if ttft is not None:
            attributes[sc.ATTR_TTFT] = ttft
        if ttfat is not None:
            attributes[sc.ATTR_TTFAT] = ttfat
        _reasoning_attributes(state, attributes)
        root.set_attributes(attributes)
        if disconnected:
            root.set_attribute(sc.ATTR_CLIENT_DISCONNECTED, True)
            root.set_status(Status(StatusCode.ERROR, "client disconnected"))
        elif error is not None:
            capture = tracker.mw.telemetry.settings.capture_message_content
            record_failure(root, error, capture=capture)
            root.set_attribute(sc.ERROR_TYPE, type(error).__qualname__)
        elif code >= 500:
            root.set_status(Status(StatusCode.ERROR))
            root.set_attribute(sc.ERROR_TYPE, code_label)
        elif failure is not None:
            root.set_status(Status(StatusCode.ERROR, "the answer failed after its headers"))
            root.set_attribute(sc.ERROR_TYPE, failure)
        if tracker.mw.response_hook is not None:
            tracker.run_span_hook(tracker.mw.response_hook, root, "response_hook")
    root.end()


def _reasoning_attributes(state: RequestState, attributes: dict[str, Any]) -> None:
    """The request's reasoning tokens (a part of its output), when it had some: the
    billed usage's (the app's, else the server's), and whether they were counted from
    the reasoning events (the server's usage did not say them)."""
    billing = state.billing
    usage = state.usage or state.upstream_usage
    reasoning = billing.reasoning_tokens if billing is not None else None
    if reasoning is None and usage is not None:
        reasoning = usage.reasoning_output_tokens
    if reasoning:
        attributes[sc.GEN_AI_USAGE_REASONING_OUTPUT_TOKENS] = reasoning
        inference = state.inference
        if inference is not None and inference.reasoning_counted and state.usage is None:
            attributes[sc.ATTR_USAGE_ESTIMATED] = True


def _settle(
    pending: PendingTrace,
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
