"""Which upstream calls are instrumented: picked once per call by its method and path."""

from __future__ import annotations

import httpx
from opentelemetry import propagate
from stagelens.instrumentation import _openai
from stagelens.instrumentation._upstream import _UpstreamCall

from stagelens import semconv as sc
from stagelens.request import current_request
from stagelens.telemetry import Telemetry, default_telemetry


def start_call(telemetry: Telemetry | None, request: httpx.Request) -> _UpstreamCall | None:
    """Begin instrumenting ``request`` if it is a completion or embeddings call; else just
    propagate."""
    path = request.url.path
    if request.method != "POST":
        propagate.inject(request.headers)
        return None
    if path.endswith("/chat/completions"):
        operation = sc.GEN_AI_OPERATION_CHAT
    elif path.endswith("/completions"):
        operation = sc.GEN_AI_OPERATION_TEXT_COMPLETION
    elif path.endswith("/embeddings"):
        operation = sc.GEN_AI_OPERATION_EMBEDDINGS
    else:
        propagate.inject(request.headers)
        return None
    state = current_request()
    if telemetry is None:
        telemetry = state.telemetry if state is not None else default_telemetry()
    try:
        payload = _openai.loads(request.content or b"{}")
    except (ValueError, httpx.RequestNotRead):
        payload = {}
    if not isinstance(payload, dict):
        payload = {}
    return _UpstreamCall(telemetry, state, payload, operation, request)
