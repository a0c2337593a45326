"""``StageLensMiddleware``: the root span, the gateway stage, TTFT, ITL and request metrics.

Pure ASGI (no BaseHTTPMiddleware) so that streamed bodies pass through untouched: every
``http.response.body`` message is forwarded as it comes, and only timestamps are taken on
the way. The middleware object is shared; everything about a request lives in a
``_RequestTracker`` made per request (the ASGI plumbing is ``_asgi_io``'s, the request's
end ``_request_end``'s).

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
import json
import time
from collections.abc import Callable, MutableMapping
from typing import Any

from opentelemetry import context, propagate, trace
from opentelemetry.trace import SpanKind
from stagelens.instrumentation import _fastapi_builtin
from stagelens.instrumentation._asgi_io import (
    FASTAPI_TELEMETRY,
    HEADERS,
    ASGIApp,
    Message,
    Receive,
    Scope,
    Send,
    expects_continue,
    known_http_methods,
    maybe_await,
    noting_departure,
    read_body,
    reports_departure_by_send,
    server_attributes,
)
from stagelens.instrumentation._header_logs import quiet_propagator_logs
from stagelens.instrumentation._request_end import finish
from stagelens.instrumentation._span_errors import record_failure
from stagelens.instrumentation._suppress import http_instrumentation_enabled
from stagelens.instrumentation.hooks import Rejected, stage

from stagelens import semconv as sc
from stagelens.config import PromptSizeClasses, Settings
from stagelens.request import RequestState, _enter, _exit
from stagelens.stages import Stage
from stagelens.telemetry import Telemetry, default_telemetry

GatewayHook = Callable[[Scope], Any]
"""``hook(scope)`` (sync or async). Return a tenant name (auth) or None; raise ``Rejected``
to answer the client (401, 429, ...)."""
BodyHook = Callable[[Scope, bytes], Any]
"""``hook(scope, body)`` (sync or async): validate the request body inside the gateway stage
(schema checks); raise ``Rejected`` to answer 400. The body is read once and replayed."""
SpanHook = Callable[[trace.Span, Scope], None]
"""Telemetry hook: customise the root span. A raising hook is counted, never propagated."""


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
        "_pending",
        "_receive",
        "_received",
        "_receiving",
        "mw",
        "response_started",
        "scope",
        "sse",
        "state",
    )

    def __init__(self, middleware: StageLensMiddleware, scope: Scope) -> None:
        self.mw = middleware
        self.scope = scope
        self.sse = False
        self.response_started = False
        self._last_body: Message | None = None
        """The latest body message sent: the response is done once one says no more."""
        self.state: RequestState | None = None
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
    def response_done(self) -> bool:
        """The last body message was sent (read when needed, not tested on each send)."""
        last = self._last_body
        return last is not None and not last.get("more_body", False)

    async def run(self, receive: Receive, send: Send) -> None:
        mw, scope = self.mw, self.scope
        telemetry = mw.telemetry
        method = scope.get("method", "GET")
        known = method in mw.known_methods
        parent = propagate.extract(scope, getter=HEADERS)
        # A FastAPI app inside (wrapped, or mounted in a Starlette app) makes no SERVER span
        # of its own for this request: ours is the one (see _fastapi_builtin).
        scope.setdefault(FASTAPI_TELEMETRY, None)
        root = telemetry.tracer.start_span(
            method if known else sc.HTTP_SPAN_NAME_OTHER,
            context=parent,
            kind=SpanKind.SERVER,
            attributes=server_attributes(scope, method, known),
        )
        state = RequestState(telemetry, root)
        self.state = state
        ctx_token = context.attach(trace.set_span_in_context(root, parent))
        state_token = _enter(state)
        error: BaseException | None = None
        try:
            if mw.request_hook is not None:
                self.run_span_hook(mw.request_hook, root, "request_hook")
            rejection, receive = await self._gateway(receive)
            if rejection is not None:
                await self._send_rejection(rejection, send)
            else:
                if not reports_departure_by_send(scope):
                    self._receive = receive
                await mw.app(scope, self._wrap_receive(receive), self._wrap_send(send))
        except BaseException as exc:
            error = exc
            raise
        finally:
            finish(self, error)
            _exit(state_token)
            context.detach(ctx_token)

    # -- gateway stage -----------------------------------------------------------------
    async def _gateway(self, receive: Receive) -> tuple[Rejected | None, Receive]:
        mw, state = self.mw, self.state
        assert state is not None
        if mw.auth_hook is None and mw.rate_limit_hook is None and mw.body_hook is None:
            with stage(Stage.GATEWAY):
                return None, receive
        try:
            with stage(Stage.GATEWAY):
                if mw.auth_hook is not None:
                    tenant = await maybe_await(mw.auth_hook(self.scope))
                    if isinstance(tenant, str):
                        state.set_tenant(tenant)
                if mw.rate_limit_hook is not None:
                    await maybe_await(mw.rate_limit_hook(self.scope))
                if mw.body_hook is not None:
                    body, receive = await read_body(receive)
                    await maybe_await(mw.body_hook(self.scope, body))
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
        state = self.state
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
            if message["type"] == "http.disconnect" and not self.response_done:
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
        state = self.state
        if receive is None or state is None or state.disconnected:
            return
        if self._receiving or self._pending is not None:
            return
        if not self._received and expects_continue(self.scope):
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
        state = self.state
        assert state is not None
        times = state.token_times
        perf_counter = time.perf_counter
        if reports_departure_by_send(self.scope):
            send = noting_departure(send, state)

        async def wrapped_send(message: Message) -> None:
            # The hot path of a stream: a timestamp per body with bytes, and no look at
            # the bytes. Every message is passed on as it came, once, in its order; TTFT
            # and the inter-token gaps are worked out when the request ends.
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
                self.response_started = True
                state.code = int(message["status"])
                for key, value in message.get("headers", ()):
                    if key.lower() == b"content-type":
                        self.sse = value.startswith(b"text/event-stream")
            await send(message)

        return wrapped_send

    # -- end of request ----------------------------------------------------------------
    def run_span_hook(self, hook: SpanHook, span: trace.Span, name: str) -> None:
        try:
            hook(span, self.scope)
        except Exception as exc:
            self.mw.telemetry.report_error(name, exc)
            if span.is_recording():  # a failing hook does not fail the request
                capture = self.mw.telemetry.settings.capture_message_content
                record_failure(span, exc, capture=capture, status=False)
