"""Embeddings calls get their GenAI client span: ``embeddings {model}`` with the semconv
attributes and the upstream's usage, billed as input only, and no first token.

The upstream is scripted with vLLM 0.32's embeddings answer (``object: list``, one
``embedding`` per input, ``usage`` with ``prompt_tokens`` and ``total_tokens``, and the
vector as floats or as base64 float32 by ``encoding_format``)."""

from __future__ import annotations

import base64
import struct
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry.trace import SpanKind
from stagelens.instrumentation import _openai
from starlette.applications import Starlette
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from stagelens import instrument_app, instrument_httpx_client, semconv
from stagelens.testing import TelemetryCapture

pytestmark = pytest.mark.anyio

DIMENSIONS = 8


def _upstream() -> Starlette:
    async def embeddings(request: Request) -> Response:
        body = await request.json()
        inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
        vector = [0.25] * DIMENSIONS
        data: list[dict[str, Any]] = []
        for i, _ in enumerate(inputs):
            if body.get("encoding_format") == "base64":
                raw = struct.pack(f"<{DIMENSIONS}f", *vector)
                data.append(
                    {"index": i, "object": "embedding", "embedding": base64.b64encode(raw).decode()}
                )
            else:
                data.append({"index": i, "object": "embedding", "embedding": vector})
        tokens = sum(len(str(x).split()) for x in inputs)
        return JSONResponse(
            {
                "id": "embd-1",
                "object": "list",
                "model": body["model"],
                "data": data,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            }
        )

    return Starlette(routes=[Route("/v1/embeddings", embeddings, methods=["POST"])])


def _gateway(cap: TelemetryCapture) -> FastAPI:
    client = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=_upstream()), base_url="http://upstream"
    )
    instrument_httpx_client(client, telemetry=cap.telemetry)
    app = FastAPI()

    @app.post("/v1/embeddings")
    async def embed(request: Request) -> Response:
        answer = await client.post("/v1/embeddings", json=await request.json())
        return JSONResponse(answer.json(), status_code=answer.status_code)

    return instrument_app(app, telemetry=cap.telemetry)


@pytest.mark.parametrize(
    ("encoding", "inputs"), [(None, "one two three"), ("base64", ["a b", "c"])]
)
async def test_an_embeddings_call_is_one_genai_client_span_with_its_usage(
    cap: TelemetryCapture, encoding: str | None, inputs: Any
) -> None:
    """``embeddings {model}`` CLIENT span under the request's root: operation, provider,
    model, server, encoding formats when asked, vector size, input tokens as the upstream
    counted (no output tokens); billed as input only; no time to first token."""
    body: dict[str, Any] = {"model": "tiny-embed", "input": inputs}
    if encoding is not None:
        body["encoding_format"] = encoding
    transport = httpx.ASGITransport(app=_gateway(cap))
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
        answer = await client.post("/v1/embeddings", json=body)
    assert answer.status_code == 200
    usage = answer.json()["usage"]
    span = cap.span("embeddings tiny-embed")
    root = cap.span("POST /v1/embeddings")
    assert span.kind is SpanKind.CLIENT
    assert span.parent is not None
    assert span.parent.span_id == root.context.span_id
    attributes = dict(span.attributes or {})
    assert attributes[semconv.GEN_AI_OPERATION_NAME] == "embeddings"
    assert attributes[semconv.GEN_AI_PROVIDER_NAME] == semconv.GEN_AI_PROVIDER_VLLM
    assert attributes[semconv.GEN_AI_REQUEST_MODEL] == "tiny-embed"
    assert attributes[semconv.GEN_AI_RESPONSE_MODEL] == "tiny-embed"
    assert attributes[semconv.SERVER_ADDRESS] == "upstream"
    assert attributes[semconv.GEN_AI_USAGE_INPUT_TOKENS] == usage["prompt_tokens"]
    assert isinstance(attributes[semconv.GEN_AI_USAGE_INPUT_TOKENS], int)
    assert attributes[semconv.GEN_AI_EMBEDDINGS_DIMENSION_COUNT] == DIMENSIONS
    if encoding is None:
        assert semconv.GEN_AI_REQUEST_ENCODING_FORMATS not in attributes
    else:
        assert attributes[semconv.GEN_AI_REQUEST_ENCODING_FORMATS] == (encoding,)
    for absent in (
        semconv.GEN_AI_USAGE_OUTPUT_TOKENS,
        semconv.GEN_AI_REQUEST_STREAM,
        semconv.GEN_AI_RESPONSE_FINISH_REASONS,
    ):
        assert absent not in attributes
    assert semconv.ATTR_TTFT not in (root.attributes or {})
    model = {"model": "tiny-embed"}
    assert cap.value("stagelens_time_to_first_token_seconds_count", **model) is None
    assert (
        cap.value("stagelens_tokens_total", **model, tenant="other", type="input")
        == usage["prompt_tokens"]
    )
    assert cap.value("stagelens_tokens_total", **model, tenant="other", type="output") in (None, 0)
    assert cap.value("stagelens_stage_duration_seconds_count", stage="inference", **model) == 1


@given(
    st.recursive(
        st.none() | st.integers() | st.text() | st.floats(),
        lambda c: st.lists(c) | st.dictionaries(st.text(), c),
    )
)
def test_the_vector_size_is_read_from_any_json_without_raising(body: Any) -> None:
    """Whatever the network sends, embedding_size answers an int or None."""
    size = _openai.embedding_size(body)
    assert size is None or isinstance(size, int)


def test_the_vector_size_of_floats_and_of_base64() -> None:
    """A float list's length; base64 float32 bytes / 4; nothing for a broken base64."""
    raw = base64.b64encode(struct.pack("<3f", 1, 2, 3)).decode()
    assert _openai.embedding_size({"data": [{"embedding": [0.1, 0.2]}]}) == 2
    assert _openai.embedding_size({"data": [{"embedding": raw}]}) == 3
    assert _openai.embedding_size({"data": [{"embedding": "not base64!"}]}) is None
    assert _openai.embedding_size({"data": []}) is None
