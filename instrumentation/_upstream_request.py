"""What an upstream call writes into its request and reads from it before it is sent: the
usage event asked for, the inference span's request attributes.
"""

from __future__ import annotations

from typing import Any, Final

import httpx
from stagelens.instrumentation import _openai

from stagelens import _compat
from stagelens import semconv as sc
from stagelens.stages import Stage

_INFERENCE: Final = Stage.INFERENCE.value


def _ask_for_usage(request: httpx.Request, payload: dict[str, Any]) -> bool:
    """Make ``request`` ask for the usage event; False when its body cannot be rewritten."""
    try:
        raw = request.content
    except httpx.RequestNotRead:
        return False
    _compat.set_request_body(request, _openai.with_usage_asked(raw, payload))
    return True


def _client_attributes(
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
    if isinstance(max_tokens, int):
        attributes[sc.GEN_AI_REQUEST_MAX_TOKENS] = max_tokens
    return attributes
