"""``stage()``, ``record_usage()``, ``bill()`` and ``Rejected``: the API an app's own code calls.

Why a class that is both context manager and decorator: stages are blocks of user code
(``with stage(Stage.TOKENIZER): ...``) or whole functions (``@stage("retrieval")``), sync or
async. Each entry makes a fresh span and one histogram observation; when tracing is off the
span is a no-op object and only the metric is recorded; under the tail sampler, while the
request's trace is undecided, it is a ``DeferredSpan``: data, built into a span only if the
trace is kept (docs/tail-sampling.md).

An exception inside a stage is recorded on its span and propagates unchanged. An exception
carrying an HTTP status >= 400 (``Rejected``, Starlette/FastAPI ``HTTPException``) also
marks the stage as the one that rejected the request.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import time
from collections.abc import Awaitable, Callable, Mapping
from types import TracebackType
from typing import Any, Final, ParamSpec, TypeVar, overload

from opentelemetry import context, trace
from opentelemetry.context import Context
from stagelens.instrumentation._span_errors import record_failure
from stagelens.instrumentation._suppress import current_context, instrumentation_enabled_in

from stagelens import semconv as sc
from stagelens.metrics.record import BillingRecord, LoneRecord, StageTimes
from stagelens.pricing import Usage
from stagelens.request import RequestState, current_request
from stagelens.spans.pending import DeferredSpan, StageClock, wall_clock_ns
from stagelens.spans.stages import (
    OpenStage,
    anchor_in,
    enter_stage,
    leave_stage,
    outer_stage,
    parent_under,
)
from stagelens.stages import Stage
from stagelens.telemetry import Telemetry, default_telemetry

P = ParamSpec("P")
R = TypeVar("R")


class Rejected(Exception):
    """Raise from a stage or hook to answer the client with an OpenAI-style error.

    The middleware turns it into ``{"error": {"message", "type", "param", "code"}}`` with
    ``status`` and ``headers``; the stage it escaped from is recorded as the rejecting stage.
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status_code = status
        self.message = message
        self.type = type
        self.code = code
        self.param = param
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        """The JSON error body."""
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


_perf_counter: Final = time.perf_counter
_time_ns: Final = time.time_ns
_STAGE_NAMES: dict[object, str] = {member: member.value for member in Stage}
"""Stage members to label values without the enum's ``.value`` descriptor on each use."""


def _status_of(exc: BaseException) -> int | None:
    status = getattr(exc, "status_code", None)
    return status if isinstance(status, int) else None


class stage:
    """Time a block or function as one stage: a child span plus ``stagelens_stage_duration``."""

    __slots__ = (
        "_attributes",
        "_ctx",
        "_ctx_token",
        "_given",
        "_name",
        "_open",
        "_span",
        "_state",
        "_t0",
        "_telemetry",
    )
    _state: RequestState | None
    _telemetry: Telemetry | None
    _t0: float
    _ctx: Context
    _given: dict[str, Any] | None

    def __init__(self, name: Stage | str, attributes: Mapping[str, Any] | None = None) -> None:
        self._name = _STAGE_NAMES.get(name) or str(name)
        self._attributes = attributes
        self._span: trace.Span | None = None
        self._ctx_token: contextvars.Token[Context] | None = None
        self._open: contextvars.Token[OpenStage | None] | None = None
        """Set while the stage is open as a stage of an undecided trace (``enter_stage``):
        it is data then, and becomes a ``DeferredSpan`` only when something asks for its
        span (``deferred``)."""
        # _state, _telemetry and _t0 are set by every path of __enter__; _ctx and _given
        # by the one that sets _open.

    @property
    def name(self) -> str:
        """The stage label value."""
        return self._name

    @property
    def span(self) -> trace.Span:
        """The stage's span (valid inside the block): a ``DeferredSpan`` while its trace
        waits for the tail sampler's decision, with the Span API all the same."""
        span = self._span
        if span is None and self._open is not None:
            span = self._span = self._deferred(self._open)
        return span if span is not None else trace.INVALID_SPAN

    # -- a stage of an undecided trace (OpenStage) ------------------------------------
    @property
    def anchor(self) -> trace.Span:
        """The span current in the OpenTelemetry context when the stage began."""
        return anchor_in(self._ctx)

    def deferred(self) -> DeferredSpan | None:
        """The stage's span as data, made now if nothing asked for it before (a span
        started inside the stage, a stage inside it); None once the stage has closed
        (a task begun inside it starting a span later): its record is held already, and
        the span goes under the stage's parent instead."""
        span = self._span
        if isinstance(span, DeferredSpan):
            return span
        if self._open is None:
            return None
        deferred = self._deferred(self._open)
        self._span = deferred
        return deferred

    def _deferred(self, token: contextvars.Token[OpenStage | None]) -> DeferredSpan:
        """The ``DeferredSpan`` this stage stands for, as it began (``token``: its
        ``enter_stage``, which knows the stage open around it)."""
        state, telemetry = self._state, self._telemetry
        assert state is not None  # set with _open by __enter__
        assert state.pending is not None
        assert telemetry is not None
        attributes = {sc.ATTR_STAGE: self._name}
        if self._given:
            attributes.update(self._given)
        anchor = anchor_in(self._ctx)
        return DeferredSpan(
            telemetry.tracer,
            self._name,
            anchor,
            parent_under(anchor, outer_stage(token)),
            state.pending,
            attributes,
            # its start, read on perf_counter (StageClock), put on the wall clock now
            start_time=wall_clock_ns(self._t0, _time_ns(), _perf_counter()),
        )

    def _set_span_attributes(self, attributes: Mapping[str, Any]) -> None:
        """Set ``attributes`` on the stage's span, inside the block; while the stage is data
        (a stage of an undecided trace that nothing asked the span of), on its record:
        they join those given to ``stage()`` and are set after them when the span is
        built, as on a span, so that a trace that is dropped never makes a
        ``DeferredSpan`` for them. Invariant: the span built from the record holds what
        ``span.set_attributes(attributes)`` would have left on it (None values skipped)."""
        if self._open is not None and self._span is None:
            if None in attributes.values():  # a span skips them (and keeps what was set)
                attributes = {k: v for k, v in attributes.items() if v is not None}
            given = self._given
            if given is None:
                self._given = dict(attributes)
            else:
                given.update(attributes)
            return
        span = self.span
        if span.is_recording():
            span.set_attributes(attributes)

    # -- context manager --------------------------------------------------------------
    def __enter__(self) -> stage:
        ctx = current_context()
        if not instrumentation_enabled_in(ctx):
            # Suppressed (opentelemetry.instrumentation.utils.suppress_instrumentation()):
            # no span and no metric, as contrib instrumentors do; the block just runs.
            self._state = self._telemetry = None
            self._t0 = 0.0
            return self
        state = current_request()
        if state is None:
            telemetry = default_telemetry()
        else:
            if not state.recording:
                # Trace sampled out (parent-based sampling): no child span, timing only.
                self._state = state
                self._telemetry = None
                self._t0 = _perf_counter()
                return self
            telemetry = state.telemetry
            pending = state.pending
            if pending is not None and pending.kept is None:
                # Its trace's keep decision waits for the request's end (the tail
                # sampler), which drops most: the stage is recorded as data (a StageClock
                # at its exit), a span only if kept.
                self._state, self._telemetry = state, telemetry
                self._ctx = ctx
                given = self._attributes
                self._given = dict(given) if given else None  # as a span takes them, now
                self._open = enter_stage(self)
                self._t0 = _perf_counter()
                return self
        self._state, self._telemetry = state, telemetry
        span = telemetry.tracer.start_span(
            self._name, context=ctx, attributes={sc.ATTR_STAGE: self._name}
        )
        if self._attributes and span.is_recording():
            span.set_attributes(dict(self._attributes))
        self._span = span
        self._ctx_token = context.attach(trace.set_span_in_context(span, ctx))
        self._t0 = _perf_counter()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        elapsed = _perf_counter() - self._t0
        telemetry, state = self._telemetry, self._state
        if telemetry is None:
            if state is not None:  # sampled out: the timing is all there is
                self._state = None
                state.stage_times.append((self._name, elapsed))
                if exc is not None:
                    status = _status_of(exc)
                    if status is not None and status >= 400:
                        state.reject(self._name)
            return
        token = self._open
        span = self._span
        if token is not None:  # a stage of an undecided trace (see __enter__)
            self._open = None
            try:
                leave_stage(token)
            except Exception as err:  # as detach: never breaks the app
                telemetry.report_error("context", err)
            if span is None:
                if exc is None and state is not None and (pending := state.pending) is not None:
                    # Nothing asked for its span: its time, and its record held with its
                    # trace as a StageClock. Its parent is the span of its context, found
                    # when built; inside another open stage (which may be gone or entered
                    # anew by then), that stage's span, found now.
                    name = self._name
                    state.stage_times.append((name, elapsed))
                    outer = outer_stage(token)
                    record: StageClock = (
                        telemetry.tracer,
                        name,
                        self._given,
                        self._ctx if outer is None else parent_under(anchor_in(self._ctx), outer),
                        self._t0,  # on the perf_counter clock, as its duration (on_wall_clock)
                        elapsed,
                    )
                    pending.add(record)
                    return
                span = self._deferred(token)  # the failure is recorded on its span
        elif self._ctx_token is not None:
            try:
                context.detach(self._ctx_token)
            except Exception as err:  # a detach in another context must not break the app
                telemetry.report_error("context", err)
            self._ctx_token = None
        if state is not None:
            state.stage_times.append((self._name, elapsed))
        else:  # outside any request: a lone observation, through the fold like any other
            lone = LoneRecord(telemetry.settings.default_model, StageTimes([(self._name, elapsed)]))
            telemetry.fold.submit(lone)
        if exc is not None:
            status = _status_of(exc)
            if status is not None and status >= 400 and state is not None:
                state.reject(self._name)
            if span is not None and span.is_recording():
                record_failure(span, exc, capture=telemetry.settings.capture_message_content)
                span.set_attribute(
                    sc.ERROR_TYPE, str(status) if status is not None else type(exc).__qualname__
                )
        if span is not None:
            span.end()
            self._span = None

    async def __aenter__(self) -> stage:
        return self.__enter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.__exit__(exc_type, exc, tb)

    # -- decorator --------------------------------------------------------------------
    @overload
    def __call__(self, func: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]: ...
    @overload
    def __call__(self, func: Callable[P, R]) -> Callable[P, R]: ...
    def __call__(self, func: Callable[P, Any]) -> Callable[P, Any]:
        name, attributes = self._name, self._attributes
        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def async_wrapper(*args: P.args, **kwargs: P.kwargs) -> Any:
                async with stage(name, attributes):
                    return await func(*args, **kwargs)

            return async_wrapper

        @functools.wraps(func)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> Any:
            with stage(name, attributes):
                return func(*args, **kwargs)

        return wrapper


def record_usage(
    *,
    input_tokens: int,
    output_tokens: int,
    cached_input_tokens: int = 0,
    model: str | None = None,
    tenant: str | None = None,
    reasoning_output_tokens: int | None = None,
) -> None:
    """Attach the request's token usage (input includes cached, output includes
    reasoning); billing prices it.

    Explicit usage wins over what the upstream instrumentation parsed from the server's
    response; ``reasoning_output_tokens`` left out, the reasoning part of the output is the
    one the upstream instrumentation read (at most the output given). Outside a request
    this does nothing.
    """
    state = current_request()
    if state is None:
        return
    if model is not None:
        state.set_model(model)
    if tenant is not None:
        state.set_tenant(tenant)
    output = max(int(output_tokens), 0)
    if reasoning_output_tokens is None:
        upstream = state.upstream_usage
        reasoning = min(upstream.reasoning_output_tokens, output) if upstream else 0
    else:
        reasoning = max(int(reasoning_output_tokens), 0)
    state.usage = Usage(
        input_tokens=max(int(input_tokens), 0),
        output_tokens=output,
        cached_input_tokens=max(int(cached_input_tokens), 0),
        reasoning_output_tokens=reasoning,
    )


def bill() -> float | None:
    """Run the billing stage now for the current request; return its cost in USD.

    Counts ``stagelens_tokens_total`` and ``stagelens_cost_usd_total`` once per request (a
    second call returns the first cost). The middleware calls it at the end of every request
    that has usage and was not billed yet.
    """
    state = current_request()
    if state is None:
        return None
    if state.billed:
        return state.cost_usd
    usage = state.usage or state.upstream_usage
    if usage is None:
        return None
    with stage(Stage.BILLING) as billing:
        state.billed = True
        telemetry = state.telemetry
        model = state.model_label
        tenant = telemetry.tenants.label(state.tenant)
        cost = telemetry.prices.cost(model, usage)
        # Counted with the request's other figures when it ends (see Fold.submit).
        state.billing = BillingRecord(
            tenant,
            usage.input_tokens,
            usage.output_tokens,
            usage.cached_input_tokens,
            cost,
            usage.reasoning_output_tokens,
        )
        state.cost_usd = cost
        if state.recording:
            billing._set_span_attributes(
                {
                    sc.ATTR_COST_USD: cost,
                    sc.ATTR_TENANT: tenant,
                    sc.GEN_AI_USAGE_INPUT_TOKENS: usage.input_tokens,
                    sc.GEN_AI_USAGE_OUTPUT_TOKENS: usage.output_tokens,
                    sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: usage.cached_input_tokens,
                }
            )
    return cost
