"""Instrument the upstream call to an OpenAI-compatible server (vLLM) made with httpx.

What it adds to every ``/v1/chat/completions``, ``/v1/completions`` and ``/v1/embeddings``
call (an embedding has no stream, output tokens or first token; its span carries the
encoding formats asked for and the vector size instead):

- the ``inference`` stage as a GenAI CLIENT span named ``{operation} {model}`` with the
  contract's ``gen_ai.*`` attributes, and ``traceparent`` + ``X-Request-Id`` injected so the
  vLLM side joins the same trace and uses the same request id;
- usage (input, output, cached input) parsed from the response, streamed or not, handed to
  the request's billing unless the app called ``record_usage()`` itself (explicit wins);
- vLLM's per-request timings (``--enable-per-request-metrics``) turned into ``queue``,
  ``prefill`` and ``decode`` child spans with real start and end times, and into
  ``stagelens_engine_phase_duration_seconds``.

Why a transport wrapper: httpx has no hook that sees a streamed body; wrapping the
transport lets chunks pass through untouched. This module holds the transports and the
body wrappers (one loop per body, sync or async, each handing every chunk to the call's
``on_chunk``); the call itself is the state machine in ``_upstream.py``, and the parsing
is in ``_sse.py``. The span ends when the body is fully read or the stream is closed
(client gone, backend died), whichever is first.

Suppression: inside ``opentelemetry.instrumentation.utils.suppress_instrumentation()``
or ``suppress_http_instrumentation()`` a call passes through untouched (no span, no
headers, no usage), as opentelemetry-instrumentation-httpx does.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx
from opentelemetry import context, trace
from stagelens.instrumentation._suppress import http_instrumentation_enabled
from stagelens.instrumentation._upstream import (
    LATER,
    ClientDisconnected,
    _UpstreamCall,
    start_call,
)

from stagelens import _compat
from stagelens.spans.pending import DeferredSpan
from stagelens.spans.stages import enter_stage, leave_stage
from stagelens.telemetry import Telemetry, default_telemetry

__all__ = [
    "ClientDisconnected",
    "StageLensAsyncTransport",
    "StageLensTransport",
    "instrument_httpx_client",
    "uninstrument_httpx_client",
]


class _AsyncStream(httpx.AsyncByteStream):
    """The body of an instrumented async call: every chunk to the call, then what it
    hands over to the app (the chunk itself, but for the usage event stagelens asked)."""

    def __init__(self, wrapped: httpx.AsyncByteStream, call: _UpstreamCall) -> None:
        self._wrapped = wrapped
        self._call: _UpstreamCall | None = call
        """None once the call has finished: httpx's response and its stream hold each
        other (a cycle only the garbage collector frees), and a finished call held by
        them would keep the request's records and spans waiting for it too."""

    async def __aiter__(self) -> AsyncIterator[bytes]:
        call = self._call
        if call is None:  # finished, and iterated again: the body as it comes
            async for chunk in self._wrapped:
                yield chunk
            return
        on_chunk = call.on_chunk
        failure: BaseException | None = None
        try:
            async for chunk in self._wrapped:
                out = on_chunk(chunk)
                if out:
                    yield out
        except GeneratorExit:
            call.closed()  # the consumer stopped iterating: see _UpstreamCall.closed
            raise
        except BaseException as exc:
            failure = exc
        held = call.flush()  # an incomplete last event held back: the app gets it too
        try:
            if held:
                yield held
        except GeneratorExit:
            call.closed()
            raise
        call.finish(failure)
        self._call = None
        if failure is not None:
            raise failure

    async def aclose(self) -> None:
        try:
            await self._wrapped.aclose()
        finally:
            call = self._call
            if call is not None:
                self._call = None
                call.closed()


class _SyncStream(httpx.SyncByteStream):
    """The body of an instrumented sync call: the same loop as ``_AsyncStream``."""

    def __init__(self, wrapped: httpx.SyncByteStream, call: _UpstreamCall) -> None:
        self._wrapped = wrapped
        self._call: _UpstreamCall | None = call
        """None once the call has finished (as ``_AsyncStream._call``)."""

    def __iter__(self) -> Iterator[bytes]:
        call = self._call
        if call is None:  # finished, and iterated again: the body as it comes
            yield from self._wrapped
            return
        on_chunk = call.on_chunk
        failure: BaseException | None = None
        try:
            for chunk in self._wrapped:
                out = on_chunk(chunk)
                if out:
                    yield out
        except GeneratorExit:
            call.closed()
            raise
        except BaseException as exc:
            failure = exc
        held = call.flush()
        try:
            if held:
                yield held
        except GeneratorExit:
            call.closed()
            raise
        call.finish(failure)
        self._call = None
        if failure is not None:
            raise failure

    def close(self) -> None:
        try:
            self._wrapped.close()
        finally:
            call = self._call
            if call is not None:
                self._call = None
                call.closed()


def _safe_start(telemetry: Telemetry | None, request: httpx.Request) -> _UpstreamCall | None:
    """The call to instrument, or None (not a completion call, instrumentation suppressed,
    or starting it failed: counted, and the request goes on uninstrumented)."""
    if not http_instrumentation_enabled():
        return None
    try:
        return start_call(telemetry, request)
    except Exception as exc:
        (telemetry or default_telemetry()).report_error("upstream", exc)
        return None


def _enter_call(call: _UpstreamCall) -> tuple[bool, Any] | None:
    """Make the call's span the parent of spans started inside the wrapped transport, until
    ``_leave_call``: (whether it was opened as a stage, the token), or None when its span
    is not recorded.

    Why a stage for a pending trace: the call's span is data then (``DeferredSpan``), or
    not made yet (``LATER``: the call itself is opened, and makes its span if something
    started inside asks for its parent), and opening it as the stage of its context
    (``enter_stage``) makes it the parent of what the deferred tracer starts inside, as
    attaching it would, without an OpenTelemetry context built around it for a trace that
    is most likely dropped. As inside any stage of a pending trace,
    ``trace.get_current_span()`` there gives the span current when the call began
    (docs/tail-sampling.md)."""
    span = call.span
    if type(span) is DeferredSpan:
        return True, enter_stage(span)
    if span.is_recording():
        if span is LATER:  # no span yet: the call is the stage, its span made if asked
            return True, enter_stage(call)
        return False, context.attach(trace.set_span_in_context(span))
    return None


def _leave_call(call: _UpstreamCall, entered: tuple[bool, Any] | None) -> None:
    """Undo ``_enter_call``; a failure to is counted and logged, never raised."""
    if entered is None:
        return
    as_stage, token = entered
    if not as_stage:
        context.detach(token)  # the API logs a failure itself
        return
    try:
        leave_stage(token)
    except Exception as err:  # a reset in another context must not break the app
        call.telemetry.report_error("context", err)


class StageLensAsyncTransport(httpx.AsyncBaseTransport):
    """Wraps an async transport; see the module docstring."""

    def __init__(
        self, wrapped: httpx.AsyncBaseTransport, telemetry: Telemetry | None = None
    ) -> None:
        self.wrapped = wrapped
        self._telemetry = telemetry
        self._installed = False
        """Put in place by ``instrument_httpx_client`` (which ``uninstrument`` undoes)."""

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        call = _safe_start(self._telemetry, request)
        if call is None:
            return await self.wrapped.handle_async_request(request)
        entered = _enter_call(call)
        try:
            response = await self.wrapped.handle_async_request(request)
        except BaseException as exc:
            call.finish(exc)
            raise
        finally:
            _leave_call(call, entered)
        call.on_response(response)
        stream = response.stream
        assert isinstance(stream, httpx.AsyncByteStream)
        response.stream = _AsyncStream(stream, call)  # the same response, its body observed
        return response

    async def aclose(self) -> None:
        await self.wrapped.aclose()


class StageLensTransport(httpx.BaseTransport):
    """Wraps a sync transport; see the module docstring."""

    def __init__(self, wrapped: httpx.BaseTransport, telemetry: Telemetry | None = None) -> None:
        self.wrapped = wrapped
        self._telemetry = telemetry
        self._installed = False
        """Put in place by ``instrument_httpx_client`` (which ``uninstrument`` undoes)."""

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        call = _safe_start(self._telemetry, request)
        if call is None:
            return self.wrapped.handle_request(request)
        entered = _enter_call(call)
        try:
            response = self.wrapped.handle_request(request)
        except BaseException as exc:
            call.finish(exc)
            raise
        finally:
            _leave_call(call, entered)
        call.on_response(response)
        stream = response.stream
        assert isinstance(stream, httpx.SyncByteStream)
        response.stream = _SyncStream(stream, call)
        return response

    def close(self) -> None:
        self.wrapped.close()


_OURS = (StageLensAsyncTransport, StageLensTransport)


def instrument_httpx_client(
    client: httpx.AsyncClient | httpx.Client, *, telemetry: Telemetry | None = None
) -> None:
    """Instrument an existing client in place: its transport and every mounted one (the
    transports of proxies from ``HTTP(S)_PROXY``/``proxy=`` and of ``mounts=``);
    idempotent, undone by :func:`uninstrument_httpx_client`.

    httpx offers no public way to swap a client's transports after construction, so this
    replaces them the way opentelemetry-instrumentation-httpx does (``stagelens._compat``).
    To avoid that, build the client with ``transport=StageLensAsyncTransport(...)``.
    """
    wrap: Callable[[Any, Telemetry | None], StageLensAsyncTransport | StageLensTransport] = (
        StageLensAsyncTransport if isinstance(client, httpx.AsyncClient) else StageLensTransport
    )

    def wrapped(transport: Any) -> Any:
        if transport is None or isinstance(transport, _OURS):
            return transport
        ours = wrap(transport, telemetry)
        ours._installed = True
        return ours

    transport, mounts = _compat.client_transports(client)
    _compat.set_client_transports(
        client,
        wrapped(transport),
        None if mounts is None else {pattern: wrapped(t) for pattern, t in mounts.items()},
    )


def uninstrument_httpx_client(client: httpx.AsyncClient | httpx.Client) -> None:
    """Undo :func:`instrument_httpx_client`: the client's original transports come back.
    Transports the app built as stagelens ones itself stay. Idempotent."""

    def unwrapped(transport: Any) -> Any:
        if isinstance(transport, _OURS) and transport._installed:
            return transport.wrapped
        return transport

    transport, mounts = _compat.client_transports(client)
    _compat.set_client_transports(
        client,
        unwrapped(transport),
        None if mounts is None else {pattern: unwrapped(t) for pattern, t in mounts.items()},
    )
