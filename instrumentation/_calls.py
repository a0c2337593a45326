"""Which upstream calls are instrumented, and as which API: picked once per call by its
method and path.

``POST`` to a path ending in ``/chat/completions``, ``/completions`` or ``/embeddings`` is a
chat, completion or embeddings call (``_upstream._UpstreamCall``); one ending in
``/responses`` (the OpenAI Responses API) or ``/messages`` (the Anthropic Messages API,
whose ``/messages/count_tokens`` generates nothing) is an agent API's call
(``_api_call.ApiCall``), its operation ``chat``. Any other request only carries the trace
context on (``traceparent``).
"""

from __future__ import annotations

from typing import Final

import httpx
from opentelemetry import propagate
from stagelens.instrumentation import _messages, _openai, _responses
from stagelens.instrumentation._api_call import ApiCall
from stagelens.instrumentation._api_facts import ApiReading
from stagelens.instrumentation._upstream import _UpstreamCall

from stagelens import semconv as sc
from stagelens.request import current_request
from stagelens.telemetry import Telemetry, default_telemetry

_APIS: Final[tuple[tuple[str, ApiReading], ...]] = (
    ("/responses", _responses.READING),
    ("/messages", _messages.READING),
)
"""The agent APIs, by the end of their path."""


def start_call(telemetry: Telemetry | None, request: httpx.Request) -> _UpstreamCall | None:
    """Begin instrumenting ``request`` if it is a generation or embeddings call; else just
    propagate."""
    path = request.url.path
    if request.method != "POST":
        propagate.inject(request.headers)
        return None
    api: ApiReading | None = None
    if path.endswith("/chat/completions"):
        operation = sc.GEN_AI_OPERATION_CHAT
    elif path.endswith("/completions"):
        operation = sc.GEN_AI_OPERATION_TEXT_COMPLETION
    elif path.endswith("/embeddings"):
        operation = sc.GEN_AI_OPERATION_EMBEDDINGS
    else:
        for end, reading in _APIS:
            if path.endswith(end):
                operation, api = sc.GEN_AI_OPERATION_CHAT, reading
                break
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
    if api is not None:
        return ApiCall(telemetry, state, payload, operation, request, api)
    return _UpstreamCall(telemetry, state, payload, operation, request)
