"""Issue 30 against real vLLM started with a reasoning parser (the tiny model's reasoning
variant, ``tiny-think``): per request, the reasoning tokens stagelens records equal vLLM's
``usage.completion_tokens_details.reasoning_tokens``, the output tokens its
``completion_tokens``, and the time to the first answer token is within 5 ms of the official
OpenAI SDK's own clock at the first chunk with ``content`` (timed from when the SDK's
request left, as in test_truth.py). The model thinks for the request's
``thinking_token_budget`` tokens (vLLM then forces ``</think>``) and answers after."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from stagelens import semconv as sc
from stagelens.testing import TelemetryCapture, capture_telemetry
from tests.e2e.test_truth import (
    TTFT_BOUND,
    Readings,
    Served,
    _key,
    _metrics,
    _quiet,
    relay_app,
    sent_at,
)
from tests.e2e.test_truth import sdk_client as truth_sdk_client

pytestmark = pytest.mark.vllm
MESSAGES = [{"role": "user", "content": "hello the gateway please explain the budget"}]


@dataclass
class Thought:
    """What the client saw of one streamed request, on its own clock."""

    started: float
    wall_started: int
    id: str = ""
    first_output: float | None = None
    first_answer: float | None = None
    reasoning_chunks: int = 0
    usage: Any = None


def think(client: Any, budget: int, max_tokens: int = 12) -> Thought:
    """One streamed request that thinks ``budget`` tokens, through the SDK."""
    seen = Thought(started=time.perf_counter(), wall_started=time.time_ns())
    events = client.chat.completions.create(
        model="tiny-think",
        messages=MESSAGES,
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"thinking_token_budget": budget},
    )
    try:
        for chunk in events:
            now = time.perf_counter()
            seen.id = seen.id or chunk.id
            for choice in chunk.choices:
                delta = choice.delta
                reasoning = getattr(delta, "reasoning", None)
                if reasoning:
                    seen.reasoning_chunks += 1
                if (reasoning or delta.content) and seen.first_output is None:
                    seen.first_output = now
                if delta.content and seen.first_answer is None:
                    seen.first_answer = now
            if chunk.usage is not None:
                seen.usage = chunk.usage
    finally:
        events.close()
    sent_at(client, seen)  # type: ignore[arg-type]  # (it reads .started / .wall_started)
    return seen


@pytest.fixture(scope="module")
def service(
    vllm_reasoning_server: Any, port_factory: Any
) -> Iterator[tuple[Any, TelemetryCapture]]:
    """An ordinary relay in front of the reasoning vLLM, an SDK client for it."""
    with (
        capture_telemetry() as cap,
        Served(relay_app(cap, vllm_reasoning_server.base_url), port_factory()) as s,
    ):
        client = truth_sdk_client(f"{s.url}/v1")
        think(client, 2, max_tokens=4)  # warm: connections, first compile
        yield client, cap


def _one(service: tuple[Any, TelemetryCapture], budget: int) -> tuple[Readings, Thought]:
    """One request and its readings, retried (four times at most, waiting longer each
    time) only when the client's time to its first token or first answer token exceeds
    the service's by more than the bound (as test_truth's ``_one``): what the client's
    clock holds beyond the service's is the time before the receipt and after the send,
    longer than the bound only when this shared machine did not schedule one end in
    between, which can last a few seconds while the rest of a suite loads it. A reading
    longer than the client's is never retried: one that is wrong is wrong in every
    attempt."""
    client, cap = service
    for pause in (0.5, 1.0, 2.0, 4.0, None):
        _quiet(cap)
        before = _metrics(cap)
        seen = think(client, budget)
        time.sleep(0.05)
        readings = Readings(cap, before, seen.id)
        if pause is None or not _stalled(readings, seen):
            break
        time.sleep(pause)
    return readings, seen


def _stalled(readings: Readings, seen: Thought) -> bool:
    """The client's TTFT or TTFAT exceeds the service's by more than the bound."""
    if seen.first_output is None or seen.first_answer is None:
        return False
    ttft = readings.root.attributes.get(sc.ATTR_TTFT)
    ttfat = readings.root.attributes.get(sc.ATTR_TTFAT)
    if not (isinstance(ttft, float) and isinstance(ttfat, float)):
        return False  # a reading missing is wrong in every attempt
    return (seen.first_output - seen.started) - ttft > TTFT_BOUND or (
        seen.first_answer - seen.started
    ) - ttfat > TTFT_BOUND


@pytest.mark.parametrize("budget", [3, 7])
def test_reasoning_tokens_and_time_to_first_answer_agree_with_vllm_and_the_client(
    service: tuple[Any, TelemetryCapture], budget: int
) -> None:
    """Reasoning and output tokens are vLLM's own, on both spans and in the counters;
    the first answer token is the client's within 5 ms, after the first token."""
    readings, seen = _one(service, budget)
    assert seen.usage is not None
    assert seen.first_answer is not None
    assert seen.reasoning_chunks
    vllm_reasoning = seen.usage.completion_tokens_details.reasoning_tokens
    assert vllm_reasoning > 0
    for span in (readings.inference, readings.root):
        assert span.attributes[sc.GEN_AI_USAGE_REASONING_OUTPUT_TOKENS] == vllm_reasoning
        assert sc.ATTR_USAGE_ESTIMATED not in span.attributes
    assert readings.usage() == (seen.usage.prompt_tokens, seen.usage.completion_tokens)
    tokens = {
        kind: readings.delta.get(_key(sc.TOKENS, model="tiny-think", tenant="other", type=kind))
        for kind in (sc.TOKEN_TYPE_OUTPUT, sc.TOKEN_TYPE_REASONING)
    }
    assert tokens == {
        sc.TOKEN_TYPE_OUTPUT: seen.usage.completion_tokens,
        sc.TOKEN_TYPE_REASONING: vllm_reasoning,
    }
    ttfat = float(readings.root.attributes[sc.ATTR_TTFAT])
    client_ttfat = seen.first_answer - seen.started
    assert abs(ttfat - client_ttfat) <= TTFT_BOUND, (ttfat, client_ttfat)
    assert seen.first_output is not None
    client_ttft = seen.first_output - seen.started
    assert abs(readings.ttft - client_ttft) <= TTFT_BOUND
    assert ttfat > readings.ttft  # the thinking came first
    print(  # the figures, for a run with -s
        f"budget {budget}: reasoning {vllm_reasoning} of {seen.usage.completion_tokens} output; "
        f"TTFT {readings.ttft * 1000:.2f} ms (client {client_ttft * 1000:.2f})"
        f"; TTFAT {ttfat * 1000:.2f} ms (client {client_ttfat * 1000:.2f})"
    )
