"""The agent APIs against real vLLM, through the official clients: ``openai``
(``client.responses.create``) and ``anthropic`` (``Anthropic(base_url=...)``,
``messages.create`` and ``messages.stream``).

An ordinary service (a relay that never looks at the events) is instrumented with
stagelens and served on a loopback port in front of the session's vLLM, which serves
``/v1/responses`` and ``/v1/messages`` itself. Each request is joined to its trace by the
response id the client saw, and compared with readings stagelens did not produce:

- TTFT within 5 ms of the client's clock, from when its request left (an httpx hook in
  the SDK's client) to its first output event (a text delta; a tool call's first event;
  a thinking delta), the median of several requests, as tests/e2e/test_truth.py compares
  chat; ITL samples equal to the client's output events - 1;
- tokens equal to the API's own usage as the client parsed it (for the Messages API the
  input is ``input_tokens + cache_read_input_tokens + cache_creation_input_tokens``), the
  prompt cache's reads and writes included;
- a reasoning model's thinking: the Responses API's ``reasoning_tokens``; on the Messages
  API (whose usage does not say them) the client's thinking deltas, and the time to the
  first answer token within 5 ms of the client's first text delta.
"""

from __future__ import annotations

import json
import statistics
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from starlette.responses import JSONResponse, Response

from stagelens import instrument_app, instrument_httpx_client
from stagelens import semconv as sc
from stagelens.testing import TelemetryCapture, capture_telemetry
from tests._scaffold import Served, relayed
from tests.e2e.test_truth import TTFT_BOUND, Readings, _key, _metrics, _quiet

pytestmark = pytest.mark.vllm
openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")

PROMPT = "hello the gateway please explain the budget"
REPEATS = 5
"""Requests per comparison: the median of their TTFT differences is compared."""
RESPONSES_TOOL = {
    "type": "function",
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
MESSAGES_TOOL = {
    "name": "get_weather",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def agent_relay(capture: TelemetryCapture, upstream_url: str) -> FastAPI:
    """An ordinary service: the client's body to the upstream's route of the same path,
    the answer relayed, streamed or whole, without looking at it."""
    client = httpx.AsyncClient(base_url=upstream_url, timeout=300)
    instrument_httpx_client(client, telemetry=capture.telemetry)
    app = FastAPI()

    async def relay(request: Request) -> Response:
        body = await request.body()
        headers = {"content-type": "application/json"}
        upstream = await client.send(
            client.build_request("POST", request.url.path, content=body, headers=headers),
            stream=True,
        )
        if not json.loads(body).get("stream"):
            raw = await upstream.aread()
            await upstream.aclose()
            return Response(raw, status_code=upstream.status_code, media_type="application/json")
        return relayed(upstream)

    app.add_api_route("/v1/responses", relay, methods=["POST"])
    app.add_api_route("/v1/messages", relay, methods=["POST"])
    app.add_api_route("/health", lambda: JSONResponse({"ok": True}), methods=["GET"])
    instrument_app(app, telemetry=capture.telemetry)
    return app


class SendClock:
    """When the client's latest request left (an httpx request hook, as test_truth's)."""

    def __init__(self) -> None:
        self.at = 0.0

    def __call__(self, request: Any) -> None:
        self.at = time.perf_counter()


_CLOCKS: weakref.WeakKeyDictionary[Any, SendClock] = weakref.WeakKeyDictionary()


def clients(url: str) -> tuple[Any, Any]:
    """The official ``openai`` and ``anthropic`` clients for the service at ``url``, each
    timing its requests (the ``anthropic`` SDK sends through ``httpx2``, httpx's next
    major version, and takes only its clients)."""
    import httpx2

    options: dict[str, Any] = {"api_key": "none", "max_retries": 0}
    clock = SendClock()
    http = httpx.Client(event_hooks={"request": [clock]}, timeout=300)
    oai = openai.OpenAI(base_url=f"{url}/v1", http_client=http, **options)
    _CLOCKS[oai] = clock
    clock = SendClock()
    http2 = httpx2.Client(event_hooks={"request": [clock]}, timeout=300)
    claude = anthropic.Anthropic(base_url=url, http_client=http2, **options)
    _CLOCKS[claude] = clock
    return oai, claude


@dataclass
class Seen:
    """What the client saw of one request, on its own clock."""

    id: str = ""
    started: float = 0.0
    first_output: float | None = None
    first_answer: float | None = None
    outputs: list[float] = field(default_factory=list)
    thinking: int = 0
    usage: tuple[int, int] | None = None
    details: dict[str, int] = field(default_factory=dict)

    @property
    def ttft(self) -> float:
        assert self.first_output is not None, "the client got no output"
        return self.first_output - self.started

    def output(self, at: float, *, answer: bool = True) -> None:
        self.first_output = self.first_output if self.first_output is not None else at
        if answer and self.first_answer is None:
            self.first_answer = at
        self.outputs.append(at)


def _sent(client: Any, seen: Seen) -> Seen:
    seen.started = _CLOCKS[client].at
    return seen


def responses_stream(client: Any, **request: Any) -> Seen:
    """One streamed ``responses.create``; output: text, refusal, reasoning and tool-call
    argument deltas, and a tool call's added item."""
    seen = Seen()
    events = client.responses.create(stream=True, **request)
    with events:
        for event in events:
            now = time.perf_counter()
            kind = event.type
            if kind in ("response.output_text.delta", "response.function_call_arguments.delta"):
                if event.delta:
                    seen.output(now)
            elif kind in ("response.reasoning_text.delta", "response.reasoning_summary_text.delta"):
                if event.delta:
                    seen.output(now, answer=False)
                    seen.thinking += 1
            elif kind == "response.output_item.added" and event.item.type.endswith("_call"):
                seen.output(now)
            elif kind in ("response.completed", "response.incomplete"):
                response = event.response
                seen.id = response.id
                usage = response.usage
                seen.usage = (usage.input_tokens, usage.output_tokens)
                seen.details = {
                    "cached": usage.input_tokens_details.cached_tokens,
                    "reasoning": usage.output_tokens_details.reasoning_tokens,
                }
    return _sent(client, seen)


def messages_stream(client: Any, **request: Any) -> Seen:
    """One streamed ``messages.create``; output: text, thinking and tool-input deltas,
    and a tool call's block start."""
    seen = Seen()
    start: Any = None
    with client.messages.create(stream=True, **request) as events:
        for event in events:
            now = time.perf_counter()
            if event.type == "message_start":
                seen.id, start = event.message.id, event.message.usage
            elif event.type == "content_block_start" and event.content_block.type == "tool_use":
                seen.output(now)
            elif event.type == "content_block_delta":
                delta = event.delta
                if (delta.type == "text_delta" and delta.text) or (
                    delta.type == "input_json_delta" and delta.partial_json
                ):
                    seen.output(now)
                elif delta.type == "thinking_delta" and delta.thinking:
                    seen.output(now, answer=False)
                    seen.thinking += 1
            elif event.type == "message_delta":
                _anthropic_usage(seen, start, event.usage)
    return _sent(client, seen)


def _anthropic_usage(seen: Seen, start: Any, final: Any) -> None:
    """The Messages API's usage as the client parsed it: the final counts laid over
    ``message_start``'s, the input with its cache reads and writes."""

    def count(name: str) -> int:
        value = getattr(final, name, None)
        value = getattr(start, name, None) if value is None else value
        return int(value or 0)

    read, written = count("cache_read_input_tokens"), count("cache_creation_input_tokens")
    seen.usage = (count("input_tokens") + read + written, count("output_tokens"))
    seen.details = {"cached": read, "written": written}


def ask_responses(client: Any, **request: Any) -> Seen:
    """``responses_stream`` of the tiny model with the prompt (``request`` overrides)."""
    return responses_stream(client, **{"model": "tiny", "input": PROMPT, **request})


def ask_messages(client: Any, **request: Any) -> Seen:
    """``messages_stream`` of the tiny model with the prompt (``request`` overrides),
    greedy (the SDK has no ``temperature``; vLLM takes it)."""
    messages = [{"role": "user", "content": PROMPT}]
    greedy = {"extra_body": {"temperature": 0}}
    return messages_stream(client, **{"model": "tiny", "messages": messages, **greedy, **request})


RESPONSES_CALL = {
    "tools": [RESPONSES_TOOL],
    "tool_choice": {"type": "function", "name": "get_weather"},
}
MESSAGES_CALL = {"tools": [MESSAGES_TOOL], "tool_choice": {"type": "tool", "name": "get_weather"}}


@pytest.fixture(scope="module")
def service(vllm_server: Any, port_factory: Any) -> Iterator[tuple[Any, Any, TelemetryCapture]]:
    """The relay in front of the session's vLLM, the two official clients, the capture."""
    with capture_telemetry() as cap:
        app = agent_relay(cap, vllm_server.base_url)
        with Served(app, port_factory()) as s:
            oai, claude = clients(s.url)
            # Warm each shape once (connections, the SDKs' first parse of each event type).
            ask_responses(oai, max_output_tokens=4)
            ask_messages(claude, max_tokens=4)
            ask_responses(oai, max_output_tokens=8, **RESPONSES_CALL)
            ask_messages(claude, max_tokens=8, **MESSAGES_CALL)
            yield oai, claude, cap


def _one(cap: TelemetryCapture, send: Any) -> tuple[Readings, Seen]:
    """One request and its readings; retried (twice at most) only when the client's TTFT
    holds more than the bound beyond the service's (the machine did not schedule the
    client or the service in between: see test_truth's ``_one``)."""
    for _ in range(3):
        _quiet(cap)
        before = _metrics(cap)
        seen = send()
        time.sleep(0.05)  # the request's end is recorded just after its last byte
        readings = Readings(cap, before, seen.id)
        if seen.first_output is None or seen.ttft - readings.ttft <= TTFT_BOUND:
            break
        time.sleep(0.5)
    return readings, seen


def _compare(cap: TelemetryCapture, send: Any) -> list[tuple[Readings, Seen]]:
    """``REPEATS`` requests: per request, tokens equal to the usage and ITL samples to the
    client's output events - 1; the median TTFT difference within the bound."""
    runs = [_one(cap, send) for _ in range(REPEATS)]
    for readings, seen in runs:
        assert readings.usage() == seen.usage, (readings.usage(), seen.usage)
        model = readings.root.attributes[sc.GEN_AI_REQUEST_MODEL]
        samples = readings.delta.get(_key(f"{sc.INTER_TOKEN_LATENCY}_count", model=model), 0)
        assert samples == max(len(seen.outputs) - 1, 0)
    differences = [abs(r.ttft - s.ttft) for r, s in runs]
    print(
        f"\nTTFT - client's: median {statistics.median(differences) * 1e3:.2f} ms of {differences}"
    )
    assert statistics.median(differences) <= TTFT_BOUND, differences
    return runs


def test_responses_streamed(service) -> None:
    """``client.responses.create(stream=True)``: TTFT, gaps and tokens as chat's."""
    oai, _, cap = service
    _compare(cap, lambda: ask_responses(oai, max_output_tokens=16, temperature=0))


def test_messages_streamed(service) -> None:
    """``messages.create(stream=True)``: TTFT, gaps and tokens as chat's."""
    _, claude, cap = service
    _compare(cap, lambda: ask_messages(claude, max_tokens=16))


def test_a_tool_call_on_each_api(service) -> None:
    """A named tool call: the first token is the event naming the tool (the Responses
    API's added ``function_call`` item, the Messages API's ``tool_use`` block start),
    then each fragment of its arguments a gap."""
    oai, claude, cap = service
    _compare(cap, lambda: ask_responses(oai, max_output_tokens=40, **RESPONSES_CALL))
    _compare(cap, lambda: ask_messages(claude, max_tokens=40, **MESSAGES_CALL))


def test_whole_answers_and_the_stream_helper(service) -> None:
    """Not streamed, and the Anthropic SDK's ``messages.stream`` helper: tokens equal to
    the usage the client got."""
    oai, claude, cap = service
    _quiet(cap)
    answer = oai.responses.create(model="tiny", input=PROMPT, max_output_tokens=9)
    time.sleep(0.05)
    readings = Readings(cap, _metrics(cap), answer.id)
    assert readings.usage() == (answer.usage.input_tokens, answer.usage.output_tokens)
    request = {"model": "tiny", "max_tokens": 9, "messages": [{"role": "user", "content": PROMPT}]}
    message = claude.messages.create(**request)
    with claude.messages.stream(**request) as stream:
        final = stream.get_final_message()
    time.sleep(0.05)
    for answered in (message, final):
        usage = answered.usage
        read, written = usage.cache_read_input_tokens, usage.cache_creation_input_tokens
        total = usage.input_tokens + (read or 0) + (written or 0)
        assert Readings(cap, _metrics(cap), answered.id).usage() == (total, usage.output_tokens)


@pytest.mark.parametrize("api", ["responses", "messages"])
def test_whole_answers_time_their_first_byte(service, api: str) -> None:
    """Not streamed, the answer's first byte, sent once it was all generated, is recorded
    as the whole-answer time (``stagelens_non_streamed_response_seconds``, as chat's), not
    as a first token: within 5 ms of the client's first body byte (a raw httpx client's
    clock, from its send), the median of five; tokens equal to the answer's usage."""
    oai, _, cap = service
    clock = SendClock()
    path = api  # the route, under the client's /v1/
    body = (
        {"model": "tiny", "input": PROMPT, "max_output_tokens": 9}
        if api == "responses"
        else {"model": "tiny", "max_tokens": 9, "messages": [{"role": "user", "content": PROMPT}]}
    )
    differences = []

    def whole(readings: Readings) -> float:
        """The request's whole-answer time (one request at a time: the histogram's delta)."""
        assert sc.ATTR_TTFT not in (readings.root.attributes or {})
        name = f"{sc.NON_STREAMED_RESPONSE}_sum{{"
        return sum(v for k, v in readings.delta.items() if k.startswith(name))

    def one(http: httpx.Client) -> tuple[Readings, dict[str, Any], float]:
        """One request: its readings, its answer, the client's time to its first byte."""
        _quiet(cap)
        chunks: list[bytes] = []
        first = 0.0
        before = _metrics(cap)
        with http.stream("POST", path, json=body, timeout=120) as answer:
            for chunk in answer.iter_raw():
                first = first or time.perf_counter()
                chunks.append(chunk)
        time.sleep(0.05)
        payload = json.loads(b"".join(chunks))
        return Readings(cap, before, payload["id"]), payload, first - clock.at

    with httpx.Client(base_url=str(oai.base_url), event_hooks={"request": [clock]}) as http:
        for _ in range(REPEATS):
            for _ in range(3):  # retried only on a stall of the client's clock (as ``_one``)
                readings, payload, seen = one(http)
                if seen - whole(readings) <= TTFT_BOUND:
                    break
                time.sleep(0.5)
            usage = payload["usage"]
            if api == "responses":
                expected = (usage["input_tokens"], usage["output_tokens"])
            else:
                cached = usage.get("cache_read_input_tokens", 0)
                written = usage.get("cache_creation_input_tokens", 0)
                expected = (usage["input_tokens"] + cached + written, usage["output_tokens"])
            assert readings.usage() == expected
            differences.append(abs(whole(readings) - seen))
    print(f"\nwhole-answer time - client's: median {statistics.median(differences) * 1e3:.2f} ms")
    assert statistics.median(differences) <= TTFT_BOUND, differences


def test_the_prompt_cache_reads_and_writes(service) -> None:
    """A prompt long enough to fill prefix-cache blocks, sent twice on each API: the
    cache reads (and, on the Messages API, the writes) stagelens records equal the
    usage's (vLLM caches in blocks of 128 tokens)."""
    oai, claude, cap = service
    for api in ("responses", "messages"):
        long = f"{api} " + " ".join(["alpha beta gamma delta epsilon"] * 60)
        text = [{"role": "user", "content": long}]
        ask = {
            "responses": partial(ask_responses, oai, input=long, max_output_tokens=2),
            "messages": partial(ask_messages, claude, max_tokens=2, messages=text),
        }[api]
        for _ in range(2):
            readings, seen = _one(cap, ask)
            attributes = readings.inference.attributes
            assert readings.usage() == seen.usage
            assert attributes[sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] == seen.details["cached"]
            written = attributes.get(sc.GEN_AI_USAGE_CACHE_WRITE_INPUT_TOKENS, 0)
            assert written == seen.details.get("written", written)
        assert seen.details["cached"] >= 128  # the second time, read from the cache


@pytest.fixture(scope="module")
def thinking(
    vllm_reasoning_server: Any, port_factory: Any
) -> Iterator[tuple[Any, Any, TelemetryCapture]]:
    """The relay in front of the reasoning vLLM (``tiny-think``)."""
    with capture_telemetry() as cap:
        app = agent_relay(cap, vllm_reasoning_server.base_url)
        with Served(app, port_factory()) as s:
            oai, claude = clients(s.url)
            ask_responses(oai, model="tiny-think", max_output_tokens=4)
            yield oai, claude, cap


def test_thinking_on_the_responses_api(thinking) -> None:
    """The Responses API has no thinking budget: the tiny model thinks through its limit.
    Its reasoning tokens are the usage's ``reasoning_tokens``, the first token is its
    first reasoning delta, and no answer token came."""
    oai, _, cap = thinking
    request = {"model": "tiny-think", "max_output_tokens": 12, "reasoning": {"effort": "low"}}
    runs = _compare(cap, lambda: ask_responses(oai, **request))
    for readings, seen in runs:
        attributes = readings.inference.attributes
        assert attributes[sc.GEN_AI_USAGE_REASONING_OUTPUT_TOKENS] == seen.details["reasoning"] > 0
        assert attributes[sc.GEN_AI_REQUEST_REASONING_LEVEL] == "low"
        assert sc.ATTR_TTFAT not in readings.root.attributes


def test_thinking_on_the_messages_api(thinking) -> None:
    """Extended thinking with a budget (vLLM then ends the thinking): the thinking tokens
    are the client's thinking deltas (the Messages API's usage does not say them apart,
    so they are counted, and marked estimated), part of the output the usage says; the
    first answer token is within 5 ms of the client's first text delta."""
    _, claude, cap = thinking
    budget = 1024  # the API's least budget; the answer follows it

    def send() -> Seen:
        extended = {"type": "enabled", "budget_tokens": budget}
        return ask_messages(claude, model="tiny-think", max_tokens=budget + 6, thinking=extended)

    differences = []
    for _ in range(3):
        readings, seen = _one(cap, send)
        attributes = readings.root.attributes
        assert readings.usage() == seen.usage
        assert attributes[sc.GEN_AI_USAGE_REASONING_OUTPUT_TOKENS] == seen.thinking > 0
        assert seen.first_answer is not None, "the model never answered after thinking"
        differences.append(abs(attributes[sc.ATTR_TTFAT] - (seen.first_answer - seen.started)))
    print(f"\nTTFAT - client's: median {statistics.median(differences) * 1e3:.2f} ms")
    assert statistics.median(differences) <= TTFT_BOUND, differences
