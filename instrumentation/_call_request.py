"""What an upstream call reads from, and asks of, the request it sends.

The inference span's request attributes (built only for a recorded span) and the usage
option stagelens adds to a stream that did not ask for its usage event.
"""

from __future__ import annotations

from typing import Any, Final

import httpx
from stagelens.instrumentation import _openai

from stagelens import _compat
from stagelens import semconv as sc
from stagelens.stages import Stage

_INFERENCE: Final = Stage.INFERENCE.value


def ask_for_usage(request: httpx.Request, payload: dict[str, Any]) -> bool:
    """Make ``request`` ask for the usage event; False when its body cannot be rewritten."""
    try:
        raw = request.content
    except httpx.RequestNotRead:
        return False
    _compat.set_request_body(request, _openai.with_usage_asked(raw, payload))
    return True


def client_attributes(
    model: str, stream: bool, operation: str, payload: dict[str, Any], request: httpx.Request
) -> dict[str, Any]:
    """The inference span's request attributes (built only for a recorded span)."""
    attributes: dict[str, Any] = {
        sc.ATTR_STAGE: _INFERENCE,
        sc.GEN_AI_OPERATION_NAME: operation,
        sc.GEN_AI_PROVIDER_NAME: sc.GEN_AI_PROVIDER_VLLM,
        sc.GEN_AI_REQUEST_MODEL: model,
        sc.SERVER_ADDRESS: request.url.host,
    }
    if request.url.port is not None:
        attributes[sc.SERVER_PORT] = request.url.port
    if operation == sc.GEN_AI_OPERATION_EMBEDDINGS:
        encoding = payload.get("encoding_format")
        if isinstance(encoding, str):
            attributes[sc.GEN_AI_REQUEST_ENCODING_FORMATS] = [encoding]
        return attributes
    attributes[sc.GEN_AI_REQUEST_STREAM] = stream
    max_tokens = payload.get("max_completion_tokens", payload.get("max_tokens"))
    if max_tokens is None:
        max_tokens = payload.get("max_output_tokens")  # the Responses API's name
    if isinstance(max_tokens, int):
        attributes[sc.GEN_AI_REQUEST_MAX_TOKENS] = max_tokens
    level = reasoning_level(payload)
    if level is not None:
        attributes[sc.GEN_AI_REQUEST_REASONING_LEVEL] = level
    return attributes


_LEVEL_MAX: Final = 32
"""A reasoning level longer than this is no level a server knows: not recorded."""


def reasoning_level(payload: dict[str, Any]) -> str | None:
    """The reasoning effort a request asks for, as it wrote it: chat's ``reasoning_effort``,
    the Responses API's ``reasoning.effort``, the Messages API's ``output_config.effort``
    (or ``none`` for ``thinking`` of type ``disabled``); None when it asks none."""
    level = payload.get("reasoning_effort")
    for holder, key in (("reasoning", "effort"), ("output_config", "effort")):
        if level is None and isinstance(found := payload.get(holder), dict):
            level = found.get(key)
    thinking = payload.get("thinking")
    if level is None and isinstance(thinking, dict) and thinking.get("type") == "disabled":
        level = "none"
    return level if isinstance(level, str) and 0 < len(level) <= _LEVEL_MAX else None
