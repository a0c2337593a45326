"""The headers the upstream call adds: ``X-Request-Id`` and the trace context.

Written with the public APIs (``httpx.Headers`` lookups and assignments,
``propagate.inject``), so that whatever propagators the process configured are honoured
as they are.
"""

from __future__ import annotations

import httpx
from opentelemetry import propagate, trace

from stagelens import semconv as sc


def _request_id_of(span_context: trace.SpanContext) -> str:
    """``<trace-id>-<span-id>`` of the recorded inference span: the engine side (the vLLM
    plugin) joins its spans to this trace from the request id alone."""
    return "%032x-%016x" % (span_context.trace_id, span_context.span_id)  # noqa: UP031


def add_upstream_headers(request: httpx.Request, span: trace.Span, recording: bool) -> str | None:
    """Add the trace context of ``span`` (the current context when it is not recorded) to
    ``request``, and ``X-Request-Id`` naming ``span`` when it is recorded and sampled and
    the app set none; return the request id sent (the app's own, or the one minted), None
    when none is. A span recorded but not sampled (the tail sampler, before the request's
    end decides) gets no id: the engine's spans would name a trace that may be dropped.

    Why no id for a span that is not recorded: the id is what joins the engine's side of a
    request to its trace, and an unrecorded trace has nothing to join; a random id would be
    recorded nowhere, and each added header costs httpx and h11 work on every request
    (their header validation and the cookie jar's re-reading of every header). vLLM then
    names the request itself, as it does for any client.
    """
    headers = request.headers
    request_id: str | None = headers.get(sc.HEADER_REQUEST_ID)
    added: dict[str, str] = {}
    if recording and request_id is None:
        span_context = span.get_span_context()
        if span_context.trace_flags.sampled:
            request_id = added[sc.HEADER_REQUEST_ID] = _request_id_of(span_context)
    propagate.inject(added, context=trace.set_span_in_context(span) if recording else None)
    for name, value in added.items():
        headers[name] = value
    return request_id
