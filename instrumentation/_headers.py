"""The headers the upstream call adds: ``X-Request-Id`` and the trace context.

Why written out: each public lookup or assignment on ``httpx.Headers`` scans and re-encodes
every header, and ``propagate.inject`` walks the composite propagator and reads the
current context once per propagator. The upstream call reads one name and adds two or three
headers per request, and reads one or two of the response's, which through the generic APIs
cost about as much as the rest of the call's start. Part of the shortcut ``context_headers``
(``stagelens._plain``): each piece falls back to the public API where its assumptions do not
hold (and always under ``STAGELENS_PLAIN=context_headers``). Invariant: the headers written
and the values read are the public API's, for any header list, span context, trace state
and baggage (property tests in tests/instrumentation/test_compat_httpx.py).
"""

from __future__ import annotations

import random
from operator import itemgetter
from typing import Final

import httpx
from opentelemetry import baggage, propagate, trace
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.context import Context
from opentelemetry.trace import NonRecordingSpan
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from stagelens.instrumentation._suppress import current_context

from stagelens import _compat
from stagelens import semconv as sc
from stagelens.engine_join import minted_id

REQUEST_ID_KEY: Final = sc.HEADER_REQUEST_ID.lower().encode("ascii")
CONTENT_TYPE_KEY: Final = b"content-type"
ENGINE_KEY: Final = sc.HEADER_ENGINE_SECONDS.lower().encode("ascii")

_ENTRY_KEY: Final = itemgetter(1)
"""The lower-cased name of one of httpx's header entries (name, lower name, value)."""


def _header_names(headers: httpx.Headers) -> list[bytes] | None:
    """The lower-cased names in ``headers``, read from httpx's entry list; None where that
    list is not as expected (the public API is used then)."""
    entries = _compat.header_entries(headers)
    if entries is None:
        return None
    return list(map(_ENTRY_KEY, entries))  # in C; a handful of names: a list is enough


def header_value(headers: httpx.Headers, lower_name: bytes) -> str | None:
    """``headers.get(name)`` for the lower-cased ASCII ``lower_name``: read from httpx's
    entry list when the name is absent or present once with an ASCII value (every ASCII
    -compatible encoding httpx picks decodes it alike); anything else (the name repeated,
    a value that is not ASCII, an entry list not as expected) through the public API,
    which joins repeats and picks the encoding from every header."""
    entries = _compat.header_entries(headers)
    if entries is not None:
        names = list(map(_ENTRY_KEY, entries))  # in C
        if lower_name not in names:
            return None
        if names.count(lower_name) == 1:
            value: bytes = entries[names.index(lower_name)][2]
            if value.isascii():
                return value.decode("ascii")
    found: str | None = headers.get(lower_name.decode("ascii"))
    return found


_NAME_BYTES: dict[str, tuple[bytes, ...]] = {}
"""Header name -> (as sent, lower-cased) in ASCII, or () for a name that is not ASCII.
The names come from the propagators (a fixed few); the cache is bounded all the same."""


def _name_bytes(name: str) -> tuple[bytes, ...]:
    found = _NAME_BYTES.get(name)
    if found is None:
        if len(_NAME_BYTES) >= 64:
            _NAME_BYTES.clear()
        found = _NAME_BYTES[name] = (
            (name.encode("ascii"), name.lower().encode("ascii")) if name.isascii() else ()
        )
    return found


def _add_headers(
    headers: httpx.Headers, added: dict[str, str], present: list[bytes] | None
) -> None:
    """Set ``added`` on ``headers`` as ``headers[name] = value`` would: a new ASCII name is
    appended to httpx's entry list, anything else goes through the public API."""
    entries = _compat.header_entries(headers) if present is not None else None
    for name, value in added.items():
        encoded = _NAME_BYTES.get(name) or _name_bytes(name)  # a handful of names, cached
        if (
            entries is None
            or present is None
            or not encoded
            or encoded[1] in present
            or not value.isascii()
        ):
            headers[name] = value
        else:
            entries.append((encoded[0], encoded[1], value.encode("ascii")))
            present.append(encoded[1])


_textmap: tuple[object, W3CBaggagePropagator | None] = (None, None)
"""The global propagator last seen, and its baggage propagator when it is the default
pair (W3C trace context, then W3C baggage); None otherwise."""


def _w3c_default(textmap: object) -> W3CBaggagePropagator | None:
    pair = _compat.composite_parts(textmap)  # None for anything but a CompositePropagator
    if (
        pair is not None
        and len(pair) == 2
        and type(pair[0]) is TraceContextTextMapPropagator
        and type(pair[1]) is W3CBaggagePropagator
    ):
        return pair[1]
    return None


def _default_baggage_propagator() -> W3CBaggagePropagator | None:
    """The global propagator's baggage half when it is the default W3C pair, else None."""
    global _textmap
    textmap = propagate.get_global_textmap()
    if _textmap[0] is not textmap:
        _textmap = (textmap, _w3c_default(textmap))
    return _textmap[1]


def _traceparent(span_context: trace.SpanContext) -> str:
    """The ``traceparent`` value the W3C propagator writes for ``span_context``."""
    return "00-%032x-%016x-%02x" % (  # noqa: UP031 (the W3C propagator's own format)
        span_context.trace_id,
        span_context.span_id,
        span_context.trace_flags,
    )


def _inject(carrier: dict[str, str], context: Context | None) -> None:
    """``propagate.inject(carrier, context=context)``, written out for the default
    propagators: ``traceparent`` (and ``tracestate``) formatted as the W3C propagator does,
    baggage through its own propagator when there is any. Any other propagator set is
    called as it is. Equivalence with ``propagate.inject`` is tested.
    """
    baggage_propagator = _default_baggage_propagator()
    if baggage_propagator is None:
        propagate.inject(carrier, context=context)
        return
    if context is None:
        context = current_context()
    span_context = trace.get_current_span(context).get_span_context()
    _inject_w3c(carrier, span_context, context, baggage_propagator)


def _inject_w3c(
    carrier: dict[str, str],
    span_context: trace.SpanContext,
    context: Context,
    baggage_propagator: W3CBaggagePropagator,
) -> None:
    """The default propagators' headers for ``span_context`` and the baggage of
    ``context`` (``_inject`` once the span is found)."""
    if span_context != trace.INVALID_SPAN_CONTEXT:
        carrier["traceparent"] = _traceparent(span_context)
        if span_context.trace_state:
            carrier["tracestate"] = span_context.trace_state.to_header()
    if baggage.get_all(context):
        baggage_propagator.inject(carrier, context=context)


_random64: Final = random.getrandbits
"""Random bits for the id of a call whose trace is not recorded (unique, not secret)."""


def _request_id_of(span_context: trace.SpanContext | None, tenant: str | None) -> str:
    """``<trace-id>-<span-id>`` of the recorded and sampled inference span, through which
    the engine side (the vLLM plugin) joins its spans to this trace; ``0...0-<random>`` for
    any other call (its answer finds it by the id, no trace is named); then the tenant."""
    if span_context is None:
        return minted_id(0, _random64(64), tenant)
    return minted_id(span_context.trace_id, span_context.span_id, tenant)


_SPAN_KEY: Final = _compat.span_key()


def _current_span_context(context: Context) -> trace.SpanContext:
    """The context of ``context``'s span: a sampled-out request's root (a
    ``NonRecordingSpan``) found with one lookup, any other span as the API finds it."""
    found = context.get(_SPAN_KEY) if _SPAN_KEY is not None else None
    current = found if type(found) is NonRecordingSpan else trace.get_current_span(context)
    return current.get_span_context()


def add_upstream_headers(
    request: httpx.Request, span: trace.Span, recording: bool, tenant: str | None = None
) -> str:
    """Add the trace context of ``span`` (the current context when it is not recorded) to
    ``request``, and ``X-Request-Id`` when the app set none: naming ``span`` when it is
    recorded and sampled, a random key else (a span recorded but not sampled, under the tail
    sampler before the request's end decides, names no trace: the engine's spans would name
    a trace that may be dropped), then ``tenant`` (the bounded label). Return the id sent.

    Why an id on every call: the vLLM server answers a stagelens id with the request's
    share of the engine's time (``stagelens.engine_join``), and the plugin there counts
    that share by the tenant the id carries. vLLM uses the id as its own request id.

    With the default propagators the span context is read once, from the span itself when
    it is recorded (no context built around it) and from the current context otherwise.
    """
    headers = request.headers
    present = _header_names(headers)
    request_id: str | None = None
    if present is None or REQUEST_ID_KEY in present:
        request_id = headers.get(sc.HEADER_REQUEST_ID)
    added: dict[str, str] = {}
    baggage_propagator = _default_baggage_propagator()
    if baggage_propagator is None:  # other propagators: called as they are
        if request_id is None:
            span_context = span.get_span_context() if recording else None
            if span_context is not None and not span_context.trace_flags.sampled:
                span_context = None
            request_id = added[sc.HEADER_REQUEST_ID] = _request_id_of(span_context, tenant)
        _inject(added, trace.set_span_in_context(span) if recording else None)
    else:
        context = current_context()  # the span's, but for the span: baggage is read from it
        span_context = span.get_span_context() if recording else _current_span_context(context)
        # Recorded but not sampled (the tail sampler's decision still pending): the engine
        # side would export spans for a trace that may be dropped, so no id names it.
        if request_id is None:
            named = span_context if recording and span_context.trace_flags.sampled else None
            request_id = added[sc.HEADER_REQUEST_ID] = _request_id_of(named, tenant)
        _inject_w3c(added, span_context, context, baggage_propagator)
    _add_headers(headers, added, present)
    return request_id
