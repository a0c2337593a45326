"""The agent APIs through an instrumented service, with scripted upstreams for the shapes
the tiny model cannot give (real vLLM: tests/e2e/test_agent_apis_vllm.py): a Responses
``response.failed`` and an ``error`` event, an Anthropic ``error`` event, cache writes,
``ping`` events, a stream cut before its final usage, and the request's reasoning level.
The scripted bytes are the shapes OpenAI and Anthropic document; each test checks what
stagelens read from them, and that no message text reaches a span."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from opentelemetry.trace import StatusCode
from stagelens.instrumentation._call_request import reasoning_level
from starlette.responses import Response

from stagelens import engine_join, instrument_app, instrument_httpx_client
from stagelens import semconv as sc
from stagelens.testing import TelemetryCapture, capture_telemetry
from tests._scaffold import relayed

pytestmark = pytest.mark.anyio
SECRET = "the secret prompt text"


def sse(name: str, body: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(body, separators=(',', ':'))}\n\n".encode()


def messages_stream(*, usage: dict[str, Any], end: bool = True, error: bool = False) -> list[bytes]:
    """A Messages API stream as Anthropic documents it: ``message_start`` with the input
    usage, a ``ping``, a text block of two deltas, the final ``message_delta`` and
    ``message_stop`` (or an ``error`` event after the text, or nothing after it)."""
    start = {"id": "msg_1", "type": "message", "role": "assistant", "content": []}
    start |= {"model": "claude-x", "stop_reason": None, "usage": usage}
    chunks = [
        sse("message_start", {"type": "message_start", "message": start}),
        sse("ping", {"type": "ping"}),
        sse(
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
        ),
    ]
    for text in ("Hel", "lo"):
        delta = {"type": "text_delta", "text": text}
        chunks.append(
            sse("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta})
        )
    if error:
        failure = {"type": "overloaded_error", "message": SECRET}
        return [*chunks, sse("error", {"type": "error", "error": failure})]
    if not end:
        return chunks
    final = {
        "type": "message_delta",
        "delta": {"stop_reason": "end_turn", "stop_sequence": None},
        "usage": {"output_tokens": 2},
    }
    return [
        *chunks,
        sse("content_block_stop", {"type": "content_block_stop", "index": 0}),
        sse("message_delta", final),
        sse("message_stop", {"type": "message_stop"}),
    ]


def responses_stream(final: str = "response.completed", *, error: bool = False) -> list[bytes]:
    """A Responses API stream as OpenAI documents it (``type`` first): created, a message
    item, two text deltas, then the final event (or an ``error`` event)."""
    response = {"id": "resp_1", "object": "response", "model": "gpt-x", "status": "in_progress"}
    chunks = [
        sse(
            "response.created",
            {
                "type": "response.created",
                "sequence_number": 0,
                "response": {**response, "usage": None},
            },
        ),
        sse(
            "response.output_item.added",
            {"type": "response.output_item.added", "item": {"type": "message", "content": []}},
        ),
    ]
    for seq, text in enumerate(("Hel", "lo"), 2):
        chunks.append(
            sse(
                "response.output_text.delta",
                {"type": "response.output_text.delta", "sequence_number": seq, "delta": text},
            )
        )
    if error:
        failure = {"type": "error", "code": "server_error", "message": SECRET, "param": None}
        return [*chunks, sse("error", failure)]
    usage = {
        "input_tokens": 30,
        "input_tokens_details": {"cached_tokens": 16},
        "output_tokens": 2,
        "output_tokens_details": {"reasoning_tokens": 0},
    }
    status = {"response.completed": "completed", "response.failed": "failed"}[final]
    done = {**response, "status": status, "usage": usage}
    if final == "response.failed":
        done["error"] = {"code": "server_error", "message": SECRET}
    return [*chunks, sse(final, {"type": final, "sequence_number": 9, "response": done})]


class _Body(httpx.AsyncByteStream):
    def __init__(self, chunks: list[bytes]) -> None:
        self._chunks = chunks

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self._chunks:
            yield chunk


def service(cap: TelemetryCapture, chunks: list[bytes] | dict[str, Any]) -> FastAPI:
    """An ordinary relay for both APIs, its upstream answering ``chunks`` (a stream) or a
    JSON body."""

    def answer(request: httpx.Request) -> httpx.Response:
        if isinstance(chunks, dict):  # a body read as it arrives, as from a socket
            headers = {"content-type": "application/json"}
            return httpx.Response(200, headers=headers, stream=_Body([json.dumps(chunks).encode()]))
        headers = {"content-type": "text/event-stream"}
        return httpx.Response(200, headers=headers, stream=_Body(chunks))

    client = httpx.AsyncClient(transport=httpx.MockTransport(answer), base_url="http://up")
    instrument_httpx_client(client, telemetry=cap.telemetry)
    app = FastAPI()

    async def relay(request: Request) -> Response:
        body = await request.body()
        upstream = await client.send(
            client.build_request("POST", request.url.path, content=body), stream=True
        )
        if not json.loads(body).get("stream"):
            raw = await upstream.aread()
            return Response(raw, media_type="application/json")
        return relayed(upstream)

    app.add_api_route("/v1/responses", relay, methods=["POST"])
    app.add_api_route("/v1/messages", relay, methods=["POST"])
    instrument_app(app, telemetry=cap.telemetry)
    return app


@pytest.fixture
def cap() -> Iterator[TelemetryCapture]:
    with capture_telemetry() as capture:
        yield capture


async def call(app: FastAPI, path: str, body: dict[str, Any]) -> bytes:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
        answer = await client.post(path, json=body)
        return answer.content


def _spans(cap: TelemetryCapture) -> tuple[Any, Any]:
    (inference,) = [s for s in cap.spans() if s.name.startswith("chat ")]
    (root,) = [s for s in cap.spans() if s.parent is None]
    return inference, root


def _total(cap: TelemetryCapture, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples with ``labels``, whatever their other labels."""
    return sum(
        sample.value
        for family in cap.registry.collect()
        for sample in family.samples
        if sample.name == name and labels.items() <= sample.labels.items()
    )


def _no_secret(cap: TelemetryCapture) -> None:
    for span in cap.spans():
        text = json.dumps(
            [dict(span.attributes or {}), span.status.description, [e.name for e in span.events]],
            default=str,
        )
        assert SECRET not in text, span.name


async def test_a_messages_stream_bills_its_cache_reads_and_writes(cap) -> None:
    """The input is the tokens computed plus those read from and written to the cache:
    each type is counted, and the spans carry them; ``ping`` is no first token."""
    usage = {
        "input_tokens": 5,
        "cache_read_input_tokens": 100,
        "cache_creation_input_tokens": 40,
        "output_tokens": 1,
    }
    app = service(cap, messages_stream(usage=usage))
    await call(app, "/v1/messages", {"model": "claude-x", "stream": True, "max_tokens": 9})
    inference, root = _spans(cap)
    assert inference.attributes[sc.GEN_AI_USAGE_INPUT_TOKENS] == 145
    assert inference.attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 2
    assert inference.attributes[sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] == 100
    assert inference.attributes[sc.GEN_AI_USAGE_CACHE_WRITE_INPUT_TOKENS] == 40
    assert inference.attributes[sc.GEN_AI_RESPONSE_FINISH_REASONS] == ("end_turn",)
    assert inference.attributes[sc.GEN_AI_RESPONSE_ID] == "msg_1"
    labels = {"model": "claude-x", "tenant": "other"}
    assert cap.value(sc.TOKENS, type="input", **labels) == 145
    assert cap.value(sc.TOKENS, type="cached_input", **labels) == 100
    assert cap.value(sc.TOKENS, type="cache_write", **labels) == 40
    assert cap.value(sc.INTER_TOKEN_LATENCY + "_count", model="claude-x") == 1  # two deltas
    assert root.attributes[sc.ATTR_TTFT] > 0
    assert root.status.status_code is not StatusCode.ERROR


@pytest.mark.parametrize(
    ("path", "chunks", "reason"),
    [
        (
            "/v1/messages",
            messages_stream(usage={"input_tokens": 5}, error=True),
            "overloaded_error",
        ),
        ("/v1/responses", responses_stream(error=True), "server_error"),
        ("/v1/responses", responses_stream("response.failed"), "server_error"),
    ],
    ids=["messages-error", "responses-error", "responses-failed"],
)
async def test_an_error_after_the_headers_fails_the_request_with_its_reason(
    cap, path: str, chunks: list[bytes], reason: str
) -> None:
    """An ``error`` event or ``response.failed`` inside a 200 stream: the request failed
    after its headers (``upstream_error_event``, the availability SLI bad), the span's
    status names the error's code, and its message is recorded nowhere."""
    app = service(cap, chunks)
    await call(app, path, {"model": "m", "stream": True})
    inference, root = _spans(cap)
    assert inference.attributes[sc.ERROR_TYPE] == sc.ERROR_TYPE_UPSTREAM_ERROR_EVENT
    assert inference.status.status_code is StatusCode.ERROR
    assert reason in (inference.status.description or "")
    assert root.attributes[sc.ERROR_TYPE] == sc.ERROR_TYPE_UPSTREAM_ERROR_EVENT
    assert _total(cap, sc.SLI_ERRORS, model="m", sli="availability") == 1
    _no_secret(cap)


async def test_a_responses_stream_is_read_as_openai_writes_it(cap) -> None:
    """The final response's usage (cached included), id and status; the text deltas are
    the output (two events: one gap), not ``response.created`` or the item's start."""
    app = service(cap, responses_stream())
    await call(app, "/v1/responses", {"model": "gpt-x", "stream": True, "input": "hi"})
    inference, _ = _spans(cap)
    assert inference.attributes[sc.GEN_AI_USAGE_INPUT_TOKENS] == 30
    assert inference.attributes[sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] == 16
    assert inference.attributes[sc.GEN_AI_USAGE_REASONING_OUTPUT_TOKENS] == 0
    assert inference.attributes[sc.GEN_AI_RESPONSE_FINISH_REASONS] == ("completed",)
    assert inference.attributes[sc.GEN_AI_RESPONSE_ID] == "resp_1"
    assert cap.value(sc.INTER_TOKEN_LATENCY + "_count", model="gpt-x") == 1


async def test_a_messages_stream_cut_before_its_end_bills_the_input_the_engine_counted(
    cap,
) -> None:
    """Cut after its text, before ``message_delta``: the input is ``message_start``'s
    (the engine's own count), the output the text events received, the usage marked
    estimated, and the request a failure after its headers (``incomplete_stream``)."""
    usage = {"input_tokens": 11, "cache_read_input_tokens": 7, "output_tokens": 1}
    app = service(cap, messages_stream(usage=usage, end=False))
    await call(app, "/v1/messages", {"model": "m", "stream": True, "messages": []})
    inference, root = _spans(cap)
    assert inference.attributes[sc.GEN_AI_USAGE_INPUT_TOKENS] == 18
    assert inference.attributes[sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] == 7
    assert inference.attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 2
    assert inference.attributes[sc.ATTR_USAGE_ESTIMATED] is True
    assert root.attributes[sc.ERROR_TYPE] == sc.ERROR_TYPE_INCOMPLETE_STREAM
    assert cap.value(sc.UNMETERED_REQUESTS, model="m", billing="estimated") == 1


async def test_a_responses_stream_cut_before_its_end_estimates_the_input_from_its_text(
    cap,
) -> None:
    """Cut before its final response (no usage seen): the input is estimated from the
    request's ``instructions`` and ``input`` (bytes / 4), the output the deltas received."""
    app = service(cap, responses_stream()[:-1])
    body = {"model": "m", "stream": True, "instructions": "x" * 40, "input": "y" * 40}
    await call(app, "/v1/responses", body)
    inference, _ = _spans(cap)
    assert inference.attributes[sc.GEN_AI_USAGE_INPUT_TOKENS] == 20
    assert inference.attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 2
    assert inference.attributes[sc.ATTR_USAGE_ESTIMATED] is True


@pytest.mark.parametrize(
    ("path", "answer", "usage"),
    [
        (
            "/v1/messages",
            {
                "id": "msg_2",
                "type": "message",
                "model": "m",
                "stop_reason": "tool_use",
                "content": [{"type": "tool_use", "id": "t", "name": "get_weather", "input": {}}],
                "usage": {"input_tokens": 3, "cache_read_input_tokens": 4, "output_tokens": 6},
            },
            (7, 6),
        ),
        (
            "/v1/responses",
            {
                "id": "resp_2",
                "object": "response",
                "model": "m",
                "status": "completed",
                "output": [
                    {"type": "reasoning", "summary": [{"type": "summary_text", "text": "h"}]},
                    {"type": "message", "content": [{"type": "output_text", "text": "a"}]},
                ],
                "usage": {
                    "input_tokens": 9,
                    "output_tokens": 5,
                    "output_tokens_details": {"reasoning_tokens": 3},
                },
            },
            (9, 5),
        ),
    ],
    ids=["messages", "responses"],
)
async def test_a_whole_answer_is_read_as_its_api_writes_it(
    cap, path: str, answer: dict[str, Any], usage: tuple[int, int]
) -> None:
    """Not streamed: usage, id and finish reason from the answer; its first byte sent (the
    whole answer arrived) is the whole-answer time, not a first token."""
    app = service(cap, answer)
    await call(app, path, {"model": "m"})
    inference, root = _spans(cap)
    attributes = inference.attributes
    assert (
        attributes[sc.GEN_AI_USAGE_INPUT_TOKENS],
        attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS],
    ) == usage
    assert attributes[sc.GEN_AI_RESPONSE_ID] == answer["id"]
    assert sc.ATTR_TTFT not in (root.attributes or {})
    assert _total(cap, f"{sc.NON_STREAMED_RESPONSE}_count") == 1


@pytest.mark.parametrize(
    ("payload", "level"),
    [
        ({"reasoning_effort": "high"}, "high"),
        ({"reasoning": {"effort": "low", "summary": "auto"}}, "low"),
        ({"output_config": {"effort": "max"}}, "max"),
        ({"thinking": {"type": "disabled"}}, "none"),
        ({"thinking": {"type": "enabled", "budget_tokens": 2048}}, None),
        ({"reasoning": {"effort": 3}}, None),
        ({"reasoning_effort": "x" * 33}, None),
        ({}, None),
    ],
)
def test_the_reasoning_level_is_the_effort_the_request_asked_for(
    payload: dict[str, Any], level: str | None
) -> None:
    """Chat's ``reasoning_effort``, the Responses API's ``reasoning.effort``, the Messages
    API's ``output_config.effort`` or ``thinking`` disabled; nothing else."""
    assert reasoning_level(payload) == level


async def test_the_span_says_the_reasoning_level_and_the_limit_asked(cap) -> None:
    """``gen_ai.request.reasoning.level`` and ``max_output_tokens`` on the inference span."""
    app = service(cap, responses_stream())
    body = {"model": "m", "stream": True, "reasoning": {"effort": "medium"}, "max_output_tokens": 7}
    await call(app, "/v1/responses", body)
    inference, _ = _spans(cap)
    assert inference.attributes[sc.GEN_AI_REQUEST_REASONING_LEVEL] == "medium"
    assert inference.attributes[sc.GEN_AI_REQUEST_MAX_TOKENS] == 7


async def test_counting_tokens_is_no_generation_call(cap) -> None:
    """``/v1/messages/count_tokens`` generates nothing: no inference span, only the trace
    context carried on."""
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"input_tokens": 12})

    client = httpx.AsyncClient(transport=httpx.MockTransport(answer))
    instrument_httpx_client(client, telemetry=cap.telemetry)
    await client.post("http://up/v1/messages/count_tokens", json={"model": "m", "messages": []})
    assert not [s for s in cap.spans() if s.name.startswith("chat ")]


class TestThroughTheOpenaiSdk:
    """A service that calls its upstream's Responses API through the official ``openai``
    SDK, its ``http_client=`` an instrumented httpx client (docs/openai-sdk.md)."""

    @staticmethod
    def _sdk(chunks: list[bytes] | dict[str, Any], cap: TelemetryCapture) -> Any:
        openai = pytest.importorskip("openai")

        def answer(request: httpx.Request) -> httpx.Response:
            if isinstance(chunks, dict):
                body = _Body([json.dumps(chunks).encode()])
                return httpx.Response(
                    200, headers={"content-type": "application/json"}, stream=body
                )
            headers = {"content-type": "text/event-stream"}
            return httpx.Response(200, headers=headers, stream=_Body(chunks))

        http = httpx.AsyncClient(transport=httpx.MockTransport(answer))
        instrument_httpx_client(http, telemetry=cap.telemetry)
        return openai.AsyncOpenAI(base_url="http://up/v1", api_key="x", http_client=http)

    async def test_a_streamed_response(self, cap) -> None:
        """``responses.create(stream=True)`` through the SDK: the call's span has the
        final response's usage and id, and the SDK read every event."""
        sdk = self._sdk(responses_stream(), cap)
        seen = []
        async with await sdk.responses.create(model="gpt-x", input="hi", stream=True) as events:
            async for event in events:
                seen.append(event.type)
        assert seen.count("response.output_text.delta") == 2
        assert seen[-1] == "response.completed"
        inference = cap.span("chat gpt-x")
        assert inference.attributes[sc.GEN_AI_USAGE_INPUT_TOKENS] == 30
        assert inference.attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 2
        assert inference.attributes[sc.GEN_AI_RESPONSE_ID] == "resp_1"

    async def test_a_whole_response(self, cap) -> None:
        """``responses.create()`` not streamed: the answer's usage on the span."""
        answer = {
            "id": "resp_3",
            "object": "response",
            "model": "gpt-x",
            "status": "completed",
            "output": [],
            "usage": {"input_tokens": 4, "output_tokens": 2},
        }
        sdk = self._sdk(answer, cap)
        response = await sdk.responses.create(model="gpt-x", input="hi")
        assert response.id == "resp_3"
        inference = cap.span("chat gpt-x")
        assert inference.attributes[sc.GEN_AI_USAGE_INPUT_TOKENS] == 4
        assert inference.attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 2


@pytest.mark.parametrize("api", ["responses", "messages"])
@pytest.mark.parametrize("where", ["own-chunk", "before-an-event", "after-an-event"])
async def test_the_engines_comment_gives_the_share_and_the_client_reads_vllms_bytes(
    cap, api: str, where: str
) -> None:
    """vLLM's stagelens middleware sends the engine's share as an SSE comment between two
    events (a body of its own): the span gets the share and the client reads the stream as
    vLLM wrote it. Coalesced after an event (a proxy between), the share is read still and
    the comment passed on, which a client's SSE reader skips."""
    chunks = (
        responses_stream()
        if api == "responses"
        else messages_stream(usage={"input_tokens": 5, "output_tokens": 1})
    )
    comment = engine_join.engine_comment(0.25, 2)
    *head, before, last = chunks
    sent = {
        "own-chunk": [*head, before, comment, last],
        "before-an-event": [*head, before, comment + last],
        "after-an-event": [*head, before + comment, last],
    }[where]
    body = {"model": "m", "stream": True, "input": "hi", "max_tokens": 8}
    read = await call(service(cap, sent), f"/v1/{api}", body)
    assert read == b"".join(sent if where == "after-an-event" else chunks)
    inference, _ = _spans(cap)
    assert inference.attributes[sc.ATTR_ENGINE_SECONDS] == pytest.approx(0.25)
    assert inference.attributes[sc.ATTR_ENGINE_GPU_SECONDS] == pytest.approx(0.5)
