"""``StageLensMiddleware``: the root span, the gateway stage, TTFT, ITL and request metrics.

Pure ASGI (no BaseHTTPMiddleware) so that streamed bodies pass through untouched: every
``http.response.body`` message is forwarded as it comes, and only timestamps are taken on
the way (STYLE rules 8, 9). The middleware object is shared; everything about a request
lives in a ``_RequestTracker`` made per request.

Every non-empty body sent is timestamped (the hot path: nothing else); the upstream
instrumentation marks each output-bearing event it reads with the number of bodies sent so
far. At the request's end the first token is the first body sent after the first output
arrived (never the headers, a role-only chunk, a comment or an error event), and each
inter-token gap is read per choice from the same sends (``_outcome``): so the readings are
what the client was sent, however the app re-frames the stream. The root span ends at the
last byte or when the client goes away, with the cancellation in its status.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from opentelemetry import context, trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from stagelens.instrumentation import _fastapi_builtin, _outcome
from stagelens.instrumentation._decision import _sampled_trace, _settle
from stagelens.instrumentation._header_logs import quiet_propagator_logs
from stagelens.instrumentation._scope import (
    Message,
    Receive,
    Scope,
    Send,
    _expects_continue,
    _extract,
    _is_cancellation,
    _noting_departure,
    _read_body,
    _reports_departure_by_send,
    _server_attributes,
    known_http_methods,
)
from stagelens.instrumentation._span_errors import record_failure
from stagelens.instrumentation._suppress import http_instrumentation_enabled
from stagelens.instrumentation.hooks import Rejected, bill, stage

from stagelens import _compat, tail_sampling
from stagelens import semconv as sc
from stagelens.config import PromptSizeClasses, Settings
from stagelens.record import ExemplarRef, PhaseTimes, RequestRecord
from stagelens.request import RequestState, _enter, _exit
from stagelens.stages import Stage
from stagelens.telemetry import Telemetry, default_telemetry

ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
GatewayHook = Callable[[Scope], Any]
"""``hook(scope)`` (sync or async). Return a tenant name (auth) or None; raise ``Rejected``
to answer the client (401, 429, ...)."""
BodyHook = Callable[[Scope, bytes], Any]
"""``hook(scope, body)`` (sync or async): validate the request body inside the gateway stage
(schema checks); raise ``Rejected`` to answer 400. The body is read once and replayed."""
SpanHook = Callable[[trace.Span, Scope], None]
"""Telemetry hook: customise the root span. A raising hook is counted, never propagated."""

STATUS_CLIENT_CLOSED = 499
"""``code`` label for a request whose client went away before it received the whole answer
(nginx's "client closed request"): never the 200 nobody received."""
_CODE_LABELS = {code: str(code) for code in range(100, 600)}
"""``code`` label strings, made once."""
_CLIENT_CLOSED_LABEL = _CODE_LABELS[STATUS_CLIENT_CLOSED]


_FASTAPI_TELEMETRY = _compat.FASTAPI_TELEMETRY_SCOPE_KEY


async def _maybe_await(value: Any) -> Any:
    if inspect.isawaitable(value):
        return await value
    return value


class StageLensMiddleware:
    """Wrap an ASGI app: one trace per request, gateway stage, TTFT/ITL/request metrics."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        telemetry: Telemetry | None = None,
        settings: Settings | None = None,
        auth_hook: GatewayHook | None = None,
        rate_limit_hook: GatewayHook | None = None,
        body_hook: BodyHook | None = None,
        request_hook: SpanHook | None = None,
        response_hook: SpanHook | None = None,
        metrics_path: str | None = None,
    ) -> None:
        if telemetry is None:
            telemetry = Telemetry(settings) if settings is not None else default_telemetry()
        quiet_propagator_logs()  # trace headers come from clients: see _header_logs
        self.app = app
        self.telemetry = telemetry
        self.auth_hook = auth_hook
        self.rate_limit_hook = rate_limit_hook
        self.body_hook = body_hook
        self.request_hook = request_hook
        self.response_hook = response_hook
        self.metrics_path = metrics_path
        self._excluded = frozenset(telemetry.settings.excluded_paths)
        self.prompt_sizes = PromptSizeClasses(telemetry.settings)
        """A request's ``prompt_size`` class and its TTFT threshold."""
        self.known_methods = known_http_methods()
        """Methods a root span may be named by; any other is ``_OTHER`` (HTTP semconv)."""
        self._metrics_app: ASGIApp | None = None
        if metrics_path is not None:
            self._metrics_app = telemetry.metrics_app()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "lifespan":
                # Added with add_middleware() rather than instrument_app(): the FastAPI app
                # around us is known only now, before its startup reads its settings.
                _fastapi_builtin.switch_off(scope.get("app"))
                await self.app(scope, receive, self._flush_on_shutdown(send))
            else:
                await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        if self._metrics_app is not None and path == self.metrics_path:
            await self._metrics_app(scope, receive, send)
            return
        if path in self._excluded or not http_instrumentation_enabled():
            await self.app(scope, receive, send)
            return
        await _RequestTracker(self, scope).run(receive, send)

    def _flush_on_shutdown(self, send: Send) -> Send:
        """Export queued spans before the server reports shutdown complete: servers that
        re-raise SIGTERM (uvicorn) skip atexit hooks, which would lose the last batch."""
        telemetry = self.telemetry

        async def wrapped(message: Message) -> None:
            if message["type"] == "lifespan.shutdown.complete":
                try:
                    await asyncio.to_thread(telemetry.force_flush, 5000)
                except Exception as exc:
                    telemetry.report_error("shutdown_flush", exc)
            await send(message)

        return wrapped


class _RequestTracker:
    """Everything about one request; lives exactly as long as it."""

    __slots__ = (
        "_last_body",
        "_mw",
        "_pending",
        "_receive",
        "_received",
        "_receiving",
        "_response_started",
        "_scope",
        "_sse",
        "_state",
    )

    def __init__(self, middleware: StageLensMiddleware, scope: Scope) -> None:
        self._mw = middleware
        self._scope = scope
        self._sse = False
        self._response_started = False
        self._last_body: Message | None = None
        """The latest body message sent: the response is done once one says no more."""
        self._state: RequestState | None = None
        self._receive: Receive | None = None
        """The app's receive, looked into before the answer is sent (``_look_for_departure``);
        None where the server reports a departed client by a failing send (ASGI >= 2.4)."""
        self._pending: Message | None = None
        """A message that look took from ``receive``, handed to the app on its next call."""
        self._receiving = False
        """The app is waiting in ``receive`` (it listens for the departure itself)."""
        self._received = False
        """The app has called ``receive`` (the server has answered any 100-continue)."""

    @property
    def _response_done(self) -> bool:
        """The last body message was sent (read when needed, not tested on each send)."""
        last = self._last_body
        return last is not None and not last.get("more_body", False)

    async def run(self, receive: Receive, send: Send) -> None:
        mw, scope = self._mw, self._scope
        telemetry = mw.telemetry
        method = scope.get("method", "GET")
        known = method in mw.known_methods
        parent = _extract(scope)
        # A FastAPI app inside (wrapped, or mounted in a Starlette app) makes no SERVER span
        # of its own for this request: ours is the one (see _fastapi_builtin).
        scope.setdefault(_FASTAPI_TELEMETRY, None)
        root = telemetry.tracer.start_span(
            method if known else sc.HTTP_SPAN_NAME_OTHER,
            context=parent,
            kind=SpanKind.SERVER,
            attributes=_server_attributes(scope, method, known),
        )
        state = RequestState(telemetry, root)
        self._state = state
        ctx_token = context.attach(trace.set_span_in_context(root, parent))
        state_token = _enter(state)
        error: BaseException | None = None
        try:
            if mw.request_hook is not None:
                self._run_span_hook(mw.request_hook, root, "request_hook")
            rejection, receive = await self._gateway(receive)
            if rejection is not None:
                await self._send_rejection(rejection, send)
            else:
                if not _reports_departure_by_send(scope):
                    self._receive = receive
                await mw.app(scope, self._wrap_receive(receive), self._wrap_send(send))
        except BaseException as exc:
            error = exc
            raise
        finally:
            self._finish(error)
            _exit(state_token)
            context.detach(ctx_token)

    # -- gateway stage -----------------------------------------------------------------
    async def _gateway(self, receive: Receive) -> tuple[Rejected | None, Receive]:
        mw, state = self._mw, self._state
        assert state is not None
        if mw.auth_hook is None and mw.rate_limit_hook is None and mw.body_hook is None:
            with stage(Stage.GATEWAY):
                return None, receive
        try:
            with stage(Stage.GATEWAY):
                if mw.auth_hook is not None:
                    tenant = await _maybe_await(mw.auth_hook(self._scope))
                    if isinstance(tenant, str):
                        state.set_tenant(tenant)
                if mw.rate_limit_hook is not None:
                    await _maybe_await(mw.rate_limit_hook(self._scope))
                if mw.body_hook is not None:
                    body, receive = await _read_body(receive)
                    await _maybe_await(mw.body_hook(self._scope, body))
        except Rejected as rejection:
            return rejection, receive
        return None, receive

    async def _send_rejection(self, rejection: Rejected, send: Send) -> None:
        body = json.dumps(rejection.body()).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            *(
                (k.lower().encode("latin-1"), v.encode("latin-1"))
                for k, v in rejection.headers.items()
            ),
        ]
        wrapped = self._wrap_send(send)
        await wrapped(
            {"type": "http.response.start", "status": rejection.status_code, "headers": headers}
        )
        await wrapped({"type": "http.response.body", "body": body})

    # -- I/O wrappers ------------------------------------------------------------------
    def _wrap_receive(self, receive: Receive) -> Receive:
        state = self._state
        assert state is not None

        async def wrapped_receive() -> Message:
            message = self._pending
            if message is not None:
                self._pending = None
            else:
                self._receiving = self._received = True
                try:
                    message = await receive()
                finally:
                    self._receiving = False
            if message["type"] == "http.disconnect" and not self._response_done:
                state.disconnected = True
            return message

        return wrapped_receive

    def _look_for_departure(self) -> None:
        """Find out, without waiting, whether the client has gone, just before the answer's
        headers or its last (empty) body are sent; mark the request disconnected if so.

        Why: a server before ASGI 2.4 drops what is sent to a departed client without a
        word (uvicorn's ``send`` returns), and a non-streamed answer is sent once, after
        the wait the client gave up on: without a look it would be recorded as the 200
        nobody received. Such a server's ``receive`` answers ``http.disconnect`` at once
        when the client has gone and otherwise waits for a message: its awaitable is
        stepped once, and closed unfinished when it would wait (the client is still
        there). A message it gives (``http.disconnect``, or request body the app has not
        read) is handed to the app on its next ``receive``, as if it had been waiting.
        Skipped while the app itself waits in ``receive`` (Starlette's streamed response
        listens for the departure): it will learn it there. A failed look changes nothing:
        telemetry never breaks serving."""
        receive = self._receive
        state = self._state
        if receive is None or state is None or state.disconnected:
            return
        if self._receiving or self._pending is not None:
            return
        if not self._received and _expects_continue(self._scope):
            return  # a server's receive would answer "100 Continue" to a body never asked for
        try:
            step = receive().__await__()
            try:
                step.send(None)
            except StopIteration as done:
                message = done.value
            else:
                close = getattr(step, "close", None)
                if close is not None:
                    close()  # it would wait: the client is still there
                return
        except Exception:
            self._receive = None  # a receive that cannot be looked into: never again
            return
        if isinstance(message, MutableMapping):
            self._pending = message
            if message.get("type") == "http.disconnect":
                state.disconnected = True

    def _wrap_send(self, send: Send) -> Send:
        state = self._state
        assert state is not None
        times = state.token_times
        perf_counter = time.perf_counter
        if _reports_departure_by_send(self._scope):
            send = _noting_departure(send, state)

        def wrapped_send(message: Message) -> Awaitable[None]:
            # The hot path of a stream: a timestamp per body with bytes, and no look at
            # the bytes. Every message is passed on as it came, once, in its order; TTFT
            # and the inter-token gaps are worked out when the request ends.
            # Not a coroutine itself: it notes the message when called (an ASGI app awaits
            # ``send(message)`` at once) and returns the server's own awaitable, so no
            # coroutine of ours is created and stepped per message.
            if message.get("body"):  # a body message with bytes (only those carry "body")
                times.append(perf_counter())
                self._last_body = message
            elif message["type"] == "http.response.body":
                if self._receive is not None and not message.get("more_body", False):
                    self._look_for_departure()  # before a stream's empty last body
                self._last_body = message  # an empty one: the last, usually
            elif message["type"] == "http.response.start":
                if self._receive is not None:
                    self._look_for_departure()  # before a non-streamed answer's headers
                self._response_started = True
                state.code = int(message["status"])
                for key, value in message.get("headers", ()):
                    if key.lower() == b"content-type":
                        self._sse = value.startswith(b"text/event-stream")
            return send(message)

        return wrapped_send

    # -- end of request ----------------------------------------------------------------
    def _run_span_hook(self, hook: SpanHook, span: trace.Span, name: str) -> None:
        try:
            hook(span, self._scope)
        except Exception as exc:
            self._mw.telemetry.report_error(name, exc)
            if span.is_recording():  # a failing hook does not fail the request
                capture = self._mw.telemetry.settings.capture_message_content
                record_failure(span, exc, capture=capture, status=False)

    def _finish(self, error: BaseException | None) -> None:
        state = self._state
        assert state is not None
        telemetry = state.telemetry
        try:
            if state.usage is not None or state.upstream_usage is not None:
                bill()
        except Exception as exc:
            telemetry.report_error("billing", exc)
        end = time.perf_counter()
        disconnected = state.disconnected or (
            error is not None and not self._response_done and _is_cancellation(error)
        )
        if state.code is not None:
            code = state.code
        elif disconnected:
            code = STATUS_CLIENT_CLOSED
        else:
            code = 500
        if error is not None and not self._response_started and not disconnected:
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
        ttft = (
            first_token_at - state.started_at if first_token_at is not None and code < 400 else None
        )
        first_answer_at = state.first_answer_at if ttft is not None else None
        ttfat = first_answer_at - state.started_at if first_answer_at is not None else None
        gaps = (
            _outcome.inter_token_gaps(state.token_times, inference)
            if self._sse and inference is not None
            else []
        )
        worst_gap = max(gaps) if gaps else None
        duration = end - state.started_at
        settings = telemetry.settings
        usage = state.usage or state.upstream_usage
        prompt_size, ttft_threshold = self._mw.prompt_sizes.of(
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
            answer_threshold=settings.answer_slo_threshold_seconds,
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
                decision, exemplar = _settle(
                    pending, reason, slots, state.root_span, model, duration
                )
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
                )
            )
        except Exception as exc:
            telemetry.report_error("metrics", exc)
        self._end_root(error, code, code_label, (ttft, ttfat), disconnected, failure, dropped)

    def _end_root(
        self,
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
        state = self._state
        assert state is not None
        root = state.root_span
        if root.is_recording() and not dropped:
            attributes: dict[str, Any] = {sc.HTTP_RESPONSE_STATUS_CODE: code}  # one call
            route = self._scope.get("route")
            route_path = getattr(route, "path", None)
            if isinstance(route_path, str):
                method = self._scope.get("method", "GET")
                if method not in self._mw.known_methods:
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
                capture = self._mw.telemetry.settings.capture_message_content
                record_failure(root, error, capture=capture)
                root.set_attribute(sc.ERROR_TYPE, type(error).__qualname__)
            elif code >= 500:
                root.set_status(Status(StatusCode.ERROR))
                root.set_attribute(sc.ERROR_TYPE, code_label)
            elif failure is not None:
                root.set_status(Status(StatusCode.ERROR, "the answer failed after its headers"))
                root.set_attribute(sc.ERROR_TYPE, failure)
            if self._mw.response_hook is not None:
                self._run_span_hook(self._mw.response_hook, root, "response_hook")
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
