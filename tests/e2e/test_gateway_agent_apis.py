"""The reference gateway's agent routes over real vLLM, with the official clients:
``/v1/responses`` (``openai``, ``Authorization: Bearer``) and ``/v1/messages``
(``anthropic``, ``x-api-key``), streamed and not, each one trace with the seven stages and
billed the engine's usage; errors in each API's own shape (the SDKs raise their own error
types from them); ``/v1/messages/count_tokens`` answered by vLLM; a client leaving
mid-stream billed from the engine's own count where vLLM says it as it goes (chat, with
continuous usage stats; the Messages API's input), else estimated and marked so."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from stagelens import Stage
from stagelens import semconv as sc
from tests.e2e.conftest import RunningGateway
from tests.e2e.test_truth import _vllm_tokens

pytestmark = pytest.mark.vllm
openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")
httpx2 = pytest.importorskip("httpx2")

PROMPT = "hello the gateway please explain the budget"
STAGES = {s.value for s in Stage} - {Stage.INFERENCE.value}


@pytest.fixture(scope="module")
def sdks(gateway: RunningGateway) -> tuple[Any, Any]:
    """The official clients for the gateway, each with the demo key its own way."""
    oai = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=gateway.api_key, max_retries=0)
    claude = anthropic.Anthropic(base_url=gateway.url, api_key=gateway.api_key, max_retries=0)
    return oai, claude


def _settle(gateway: RunningGateway) -> None:
    time.sleep(0.3)  # the request's end is recorded just after its last byte


def _trace_of(gateway: RunningGateway, response_id: str) -> list[Any]:
    """The spans of the trace whose inference span answered ``response_id``."""
    spans = gateway.capture.spans()
    (call,) = [s for s in spans if (s.attributes or {}).get(sc.GEN_AI_RESPONSE_ID) == response_id]
    return [s for s in spans if s.context.trace_id == call.context.trace_id]


def _check_trace(spans: list[Any], usage: tuple[int, int]) -> None:
    """One root (the gateway's SERVER span), the six stages and the inference span under
    it, the inference and billing spans with the API's usage."""
    roots = [s for s in spans if s.parent is None]
    assert len(roots) == 1
    names = {s.name for s in spans}
    assert names >= STAGES, names
    (inference,) = [s for s in spans if s.name == "chat tiny"]
    (billing,) = [s for s in spans if s.name == "billing"]
    for span in (inference, billing):
        attributes = span.attributes
        assert (
            attributes[sc.GEN_AI_USAGE_INPUT_TOKENS],
            attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS],
        ) == usage


def _anthropic_total(usage: Any) -> tuple[int, int]:
    read, written = usage.cache_read_input_tokens or 0, usage.cache_creation_input_tokens or 0
    return usage.input_tokens + read + written, usage.output_tokens


def test_responses_through_the_gateway(gateway: RunningGateway, sdks: Any) -> None:
    """``client.responses.create``, whole and streamed: 200, one trace of seven stages,
    billed the engine's usage."""
    oai, _ = sdks
    answer = oai.responses.create(model="tiny", input=PROMPT, max_output_tokens=8)
    _settle(gateway)
    _check_trace(
        _trace_of(gateway, answer.id), (answer.usage.input_tokens, answer.usage.output_tokens)
    )
    final = None
    with oai.responses.create(
        model="tiny", input=PROMPT, max_output_tokens=8, stream=True
    ) as events:
        for event in events:
            if event.type in ("response.completed", "response.incomplete"):
                final = event.response
    assert final is not None
    _settle(gateway)
    _check_trace(
        _trace_of(gateway, final.id), (final.usage.input_tokens, final.usage.output_tokens)
    )


def test_messages_through_the_gateway(gateway: RunningGateway, sdks: Any) -> None:
    """``messages.create`` and ``messages.stream`` with ``x-api-key``: 200, one trace of
    seven stages, billed the engine's usage (cache reads and writes in the input)."""
    _, claude = sdks
    request = {"model": "tiny", "max_tokens": 8, "messages": [{"role": "user", "content": PROMPT}]}
    message = claude.messages.create(**request)
    _settle(gateway)
    _check_trace(_trace_of(gateway, message.id), _anthropic_total(message.usage))
    with claude.messages.stream(**request) as stream:
        final = stream.get_final_message()
    _settle(gateway)
    _check_trace(_trace_of(gateway, final.id), _anthropic_total(final.usage))


def test_errors_come_in_each_apis_shape(gateway: RunningGateway, sdks: Any) -> None:
    """A missing key, an unknown model, a bad body: the Messages API's routes answer
    Anthropic's shape (the SDK raises its own types), the Responses API's OpenAI's."""
    oai, claude = sdks
    anonymous = anthropic.Anthropic(base_url=gateway.url, api_key="sk-wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        anonymous.messages.create(
            model="tiny", max_tokens=4, messages=[{"role": "user", "content": "x"}]
        )
    with pytest.raises(anthropic.NotFoundError) as found:
        claude.messages.create(
            model="no-such", max_tokens=4, messages=[{"role": "user", "content": "x"}]
        )
    assert found.value.body["error"]["type"] == "not_found_error"
    with httpx.Client(base_url=gateway.url, timeout=60) as http:
        bad = http.post(
            "/v1/messages", json={"model": "tiny"}, headers={"x-api-key": gateway.api_key}
        )
        assert bad.status_code == 400
        assert bad.json()["type"] == "error"
        assert bad.json()["error"]["type"] == "invalid_request_error"
        missing = http.post("/v1/messages/count_tokens", json={})
        assert missing.status_code == 401
        assert missing.json()["error"]["type"] == "authentication_error"
    with pytest.raises(openai.NotFoundError) as refused:
        oai.responses.create(model="no-such", input="x")
    assert refused.value.body["code"] == "model_not_found"


def test_count_tokens_is_passed_to_vllm(
    gateway: RunningGateway, sdks: Any, vllm_server: Any
) -> None:
    """``messages.count_tokens`` through the gateway answers what vLLM answers itself."""
    _, claude = sdks
    messages = [{"role": "user", "content": PROMPT}]
    counted = claude.messages.count_tokens(model="tiny", messages=messages)
    direct = httpx.post(
        f"{vllm_server.base_url}/v1/messages/count_tokens",
        json={"model": "tiny", "messages": messages},
        timeout=60,
    ).json()
    assert counted.input_tokens == direct["input_tokens"] > 0


def _unmetered(gateway: RunningGateway) -> float:
    value = gateway.capture.value(sc.UNMETERED_REQUESTS, model="tiny", billing="estimated")
    return value or 0.0


def _tokens(gateway: RunningGateway, kind: str) -> float:
    labels = {"model": "tiny", "tenant": "demo", "type": kind}
    return gateway.capture.value(sc.TOKENS, **labels) or 0.0


def _leave_after(gateway: RunningGateway, path: str, body: dict[str, Any], events: int) -> int:
    """Stream ``body`` and leave after ``events`` events; the events received."""
    headers = {"authorization": f"Bearer {gateway.api_key}"}
    seen = 0
    with (
        httpx.Client(base_url=gateway.url, timeout=120) as http,
        http.stream("POST", path, json=body, headers=headers) as answer,
    ):
        assert answer.status_code == 200
        for line in answer.iter_lines():
            if line.startswith("data:"):
                seen += 1
                if seen >= events:
                    break
    return seen


def test_a_chat_client_leaving_is_billed_the_engines_count(
    gateway: RunningGateway, vllm_server: Any
) -> None:
    """The gateway asks vLLM for its running usage (continuous usage stats): a client that
    leaves mid-stream is billed the prompt vLLM counted and the tokens its last event said,
    never more than vLLM generated, and not as an estimate."""
    before_vllm = _vllm_tokens(vllm_server.base_url)
    before = (_tokens(gateway, "input"), _tokens(gateway, "output"), _unmetered(gateway))
    body = {"model": "tiny", "stream": True, "max_tokens": 400, "temperature": 0,
            "messages": [{"role": "user", "content": PROMPT}], "ignore_eos": True}  # fmt: skip
    received = _leave_after(gateway, "/v1/chat/completions", body, 6)
    time.sleep(2.0)  # the engine aborts the request; the gateway records its end
    prompt, generated = (
        a - b for a, b in zip(_vllm_tokens(vllm_server.base_url), before_vllm, strict=True)
    )
    billed_in = _tokens(gateway, "input") - before[0]
    billed_out = _tokens(gateway, "output") - before[1]
    assert billed_in == prompt
    assert received - 1 <= billed_out <= generated  # (the first event is the role's)
    assert _unmetered(gateway) == before[2]


def test_a_messages_client_leaving_is_billed_the_input_the_engine_counted(
    gateway: RunningGateway, vllm_server: Any
) -> None:
    """The Messages API says the input as it starts, not the output as it goes: a client
    that leaves mid-stream is billed that input exactly, its output estimated (the text
    the gateway relayed, re-tokenized) and marked so."""
    before_vllm = _vllm_tokens(vllm_server.base_url)
    before = (_tokens(gateway, "input"), _unmetered(gateway))
    body = {"model": "tiny", "stream": True, "max_tokens": 400, "temperature": 0,
            "messages": [{"role": "user", "content": PROMPT}], "ignore_eos": True}  # fmt: skip
    _leave_after(gateway, "/v1/messages", body, 6)
    time.sleep(2.0)
    prompt, _ = (
        a - b for a, b in zip(_vllm_tokens(vllm_server.base_url), before_vllm, strict=True)
    )
    assert _tokens(gateway, "input") - before[0] == prompt
    assert _unmetered(gateway) == before[1] + 1


def test_the_demo_traffic_speaks_all_three_apis(gateway: RunningGateway) -> None:
    """``stagelens demo``'s traffic run sends chat, Responses and Messages requests,
    streamed and not; each is answered 200 and traced."""
    import asyncio

    from stagelens.reference.demo import _traffic

    asyncio.run(_traffic(gateway.url, gateway.api_key, 10, embeddings=False))
    _settle(gateway)
    routes = {
        (s.attributes.get(sc.HTTP_ROUTE), s.attributes.get(sc.HTTP_RESPONSE_STATUS_CODE))
        for s in gateway.capture.spans()
        if s.parent is None
    }
    for route in ("/v1/chat/completions", "/v1/responses", "/v1/messages"):
        assert (route, 200) in routes, routes
