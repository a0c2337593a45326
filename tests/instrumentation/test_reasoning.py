"""Issue 30 through an ordinary instrumented relay and a scripted upstream on a real socket:
reasoning tokens (from the server's usage, else counted from the reasoning events and said
to be estimated), the time to the first answer token past the thinking, and the ``answer``
SLI. The shapes are those vLLM 0.32 streams with a reasoning parser (``reasoning`` deltas,
then ``content`` deltas, ``completion_tokens_details.reasoning_tokens`` in the usage); the
scripted upstream gives the ones the tiny model cannot (no usage details, a cut stream).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from stagelens import instrument_app, instrument_httpx_client
from stagelens import semconv as sc
from stagelens.testing import TelemetryCapture, capture_telemetry
from tests._scaffold import relayed

pytestmark = pytest.mark.anyio

ROLE = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
USAGE = {"prompt_tokens": 7, "completion_tokens": 5}
"""The usage of a server without a reasoning parser: no completion_tokens_details."""
ROOT = "POST /v1/chat/completions"
INFERENCE = "chat tiny"


def thinking(text: str) -> dict[str, Any]:
    return {"id": "c1", "choices": [{"index": 0, "delta": {"reasoning": text}}]}


def content(text: str, **extra: Any) -> dict[str, Any]:
    return {"id": "c1", "choices": [{"index": 0, "delta": {"content": text}, **extra}]}


def event(body: Any) -> str:
    return f"data: {json.dumps(body, separators=(',', ':'))}\n\n"


def _scripted() -> Starlette:
    """Streams ``x_script`` ([seconds to wait, text]), then the usage event when asked
    (``x_usage``, else ``USAGE``) and ``[DONE]``; ``x_die`` drops the connection instead."""

    async def chat(request: Request) -> Response:
        body = await request.json()

        async def events() -> AsyncIterator[bytes]:
            for wait, text in body.get("x_script", []):
                if wait:
                    await asyncio.sleep(wait)
                yield text.encode()
            if body.get("x_die"):
                raise RuntimeError("engine died")
            if (body.get("stream_options") or {}).get("include_usage"):
                usage = body.get("x_usage") or USAGE
                yield event({"id": "c1", "choices": [], "usage": usage}).encode()
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


@pytest.fixture(scope="module")
def scripted_url(port_factory: Any) -> Iterator[str]:
    """The scripted upstream on a loopback port, for this module."""
    port = port_factory()
    server = uvicorn.Server(
        uvicorn.Config(
            _scripted(), host="127.0.0.1", port=port, log_level="critical", lifespan="off"
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=5)


def _relay(cap: TelemetryCapture, url: str) -> FastAPI:
    """An ordinary relay: it never looks at the events."""
    client = httpx.AsyncClient(base_url=url, timeout=10)
    instrument_httpx_client(client, telemetry=cap.telemetry)
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        body = await request.json()
        upstream = await client.send(
            client.build_request("POST", "/v1/chat/completions", json=body), stream=True
        )

        return relayed(upstream)

    instrument_app(app, telemetry=cap.telemetry)
    return app


async def _stream(cap: TelemetryCapture, url: str, **knobs: Any) -> httpx.Response:
    transport = httpx.ASGITransport(app=_relay(cap, url), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
        body = {"model": "tiny", "stream": True, **knobs}
        return await client.post("/v1/chat/completions", json=body)


def _summed(cap: TelemetryCapture, name: str, **labels: str) -> float | None:
    """The sum of ``name``'s samples carrying ``labels``, whatever their other labels
    (``prompt_size`` on the TTFT histogram and the SLI counters); None when there is none."""
    found = [
        sample.value
        for metric in cap.registry.collect()
        for sample in metric.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    ]
    return sum(found) if found else None


def _only(cap: TelemetryCapture, histogram: str) -> float | None:
    """The one observation of ``histogram`` for model tiny, or None when there is none."""
    count = _summed(cap, histogram + "_count", model="tiny") or 0
    assert count in (0, 1)
    return _summed(cap, histogram + "_sum", model="tiny") if count else None


def _tokens(cap: TelemetryCapture, kind: str) -> float | None:
    return cap.value(sc.TOKENS, model="tiny", tenant="other", type=kind)


def _answer(cap: TelemetryCapture) -> tuple[float | None, float | None]:
    """(requests counted, bad) for the answer SLI."""
    counted = _summed(cap, sc.SLI_REQUESTS, model="tiny", sli=sc.SLI_ANSWER)
    return counted, _summed(cap, sc.SLI_ERRORS, model="tiny", sli=sc.SLI_ANSWER)


def _assert_ttft_verdict(cap: TelemetryCapture) -> None:
    """The ``ttft`` SLI judged the first token alone (the thinking's): bad only if it was
    itself later than 0.5 s (a stalled machine), whatever the answer did."""
    ttft = _only(cap, sc.TIME_TO_FIRST_TOKEN)
    assert ttft is not None
    bad = _summed(cap, sc.SLI_ERRORS, model="tiny", sli=sc.SLI_TTFT)
    assert bad == (1 if ttft > 0.5 else 0)


class TestReasoningStream:
    """A stream that thinks, then answers."""

    THINK_THEN_ANSWER = [
        [0, event(ROLE)],
        [0, event(thinking("a"))],
        [0.01, event(thinking("b"))],
        [0.01, event(thinking("c"))],
        [0.1, event(content("x"))],
        [0.01, event(content("y", finish_reason="stop"))],
    ]

    async def test_without_usage_details_reasoning_is_counted_from_its_events(
        self, cap, scripted_url
    ) -> None:
        """Three reasoning events, two content events, a usage without details: 3
        reasoning tokens of 5 output on both spans and in the counter, marked estimated;
        the first answer token comes >= 100 ms after the first token."""
        r = await _stream(cap, scripted_url, x_script=self.THINK_THEN_ANSWER)
        assert r.status_code == 200
        for name in (ROOT, INFERENCE):
            attributes = cap.span(name).attributes
            assert attributes[sc.GEN_AI_USAGE_REASONING_OUTPUT_TOKENS] == 3, name
            assert attributes[sc.ATTR_USAGE_ESTIMATED] is True, name
        assert cap.span(INFERENCE).attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 5
        assert _tokens(cap, sc.TOKEN_TYPE_OUTPUT) == 5
        assert _tokens(cap, sc.TOKEN_TYPE_REASONING) == 3
        # The server's usage was there: the bill is exact, only its thinking part counted.
        assert cap.value(sc.UNMETERED_REQUESTS, model="tiny", billing="estimated") is None
        ttft, ttfat = _only(cap, sc.TIME_TO_FIRST_TOKEN), _only(cap, sc.TIME_TO_FIRST_ANSWER_TOKEN)
        assert ttft is not None
        assert ttfat is not None
        assert ttfat - ttft >= 0.1
        root = cap.span(ROOT).attributes
        assert root[sc.ATTR_TTFAT] == ttfat
        assert root[sc.ATTR_TTFT] == ttft
        assert _answer(cap) == (1, 0)  # 10 s threshold by default

    async def test_the_servers_reasoning_tokens_win_over_the_events(
        self, cap, scripted_url
    ) -> None:
        """The usage says 4 reasoning tokens (one event may carry several): 4, not the 3
        events, and nothing is estimated."""
        usage = {**USAGE, "completion_tokens_details": {"reasoning_tokens": 4}}
        await _stream(cap, scripted_url, x_script=self.THINK_THEN_ANSWER, x_usage=usage)
        for name in (ROOT, INFERENCE):
            attributes = cap.span(name).attributes
            assert attributes[sc.GEN_AI_USAGE_REASONING_OUTPUT_TOKENS] == 4, name
            assert sc.ATTR_USAGE_ESTIMATED not in attributes, name
        assert _tokens(cap, sc.TOKEN_TYPE_REASONING) == 4
        assert _tokens(cap, sc.TOKEN_TYPE_OUTPUT) == 5

    async def test_a_slow_answer_is_bad_for_the_answer_sli_only(self, scripted_url) -> None:
        """Threshold 0.1 s: the answer 150 ms after a fast first token is bad for ``answer``
        and good for ``ttft``."""
        script = [[0, event(thinking("a"))], [0.15, event(content("x", finish_reason="stop"))]]
        with capture_telemetry(answer_slo_threshold_seconds=0.1) as cap:
            await _stream(cap, scripted_url, x_script=script)
            assert _answer(cap) == (1, 1)
            _assert_ttft_verdict(cap)


class TestCutWhileThinking:
    """A stream that ends before any answer token."""

    SCRIPT = [[0, event(ROLE)], [0, event(thinking("a"))], [0.01, event(thinking("b"))]]

    async def test_a_stream_dying_during_reasoning_records_reasoning_and_no_answer(
        self, cap, scripted_url
    ) -> None:
        """The backend dies after two reasoning events: 2 reasoning tokens (of 2 output,
        estimated), a first token, no first answer token, bad for the answer SLI."""
        await _stream(cap, scripted_url, x_script=self.SCRIPT, x_die=True)
        for name in (ROOT, INFERENCE):
            attributes = cap.span(name).attributes
            assert attributes[sc.GEN_AI_USAGE_REASONING_OUTPUT_TOKENS] == 2, name
            assert attributes[sc.ATTR_USAGE_ESTIMATED] is True, name
            assert sc.ATTR_TTFAT not in attributes
        assert _tokens(cap, sc.TOKEN_TYPE_REASONING) == 2
        assert _tokens(cap, sc.TOKEN_TYPE_OUTPUT) == 2
        assert _only(cap, sc.TIME_TO_FIRST_TOKEN) is not None
        assert _only(cap, sc.TIME_TO_FIRST_ANSWER_TOKEN) is None
        assert _answer(cap) == (1, 1)

    async def test_a_stream_ending_at_its_limit_while_thinking_is_bad_for_the_answer(
        self, cap, scripted_url
    ) -> None:
        """The stream ends normally (finish_reason length, the server's usage) before any
        answer: nothing failed, yet the user got no answer: bad for ``answer`` only."""
        last = {"index": 0, "delta": {"reasoning": "c"}, "finish_reason": "length"}
        script = [*self.SCRIPT, [0, event({"id": "c1", "choices": [last]})]]
        usage = {
            "prompt_tokens": 7,
            "completion_tokens": 3,
            "completion_tokens_details": {"reasoning_tokens": 3},
        }
        await _stream(cap, scripted_url, x_script=script, x_usage=usage)
        assert _tokens(cap, sc.TOKEN_TYPE_REASONING) == 3
        assert _only(cap, sc.TIME_TO_FIRST_ANSWER_TOKEN) is None
        assert _answer(cap) == (1, 1)
        _assert_ttft_verdict(cap)
        assert _summed(cap, sc.SLI_ERRORS, model="tiny", sli=sc.SLI_AVAILABILITY) == 0


class TestModelThatDoesNotReason:
    """A plain content stream."""

    async def test_first_answer_token_is_the_first_token_and_no_reasoning_is_recorded(
        self, cap, scripted_url
    ) -> None:
        """TTFAT equals TTFT exactly (the same body), no reasoning tokens anywhere."""
        script = [[0, event(ROLE)], [0.03, event(content("a"))]]
        script += [[0.01, event(content("b", finish_reason="stop"))]]
        await _stream(cap, scripted_url, x_script=script)
        ttft, ttfat = _only(cap, sc.TIME_TO_FIRST_TOKEN), _only(cap, sc.TIME_TO_FIRST_ANSWER_TOKEN)
        assert ttft is not None
        assert ttfat == ttft
        root = cap.span(ROOT).attributes
        assert root[sc.ATTR_TTFAT] == root[sc.ATTR_TTFT] == ttft
        for name in (ROOT, INFERENCE):
            attributes = cap.span(name).attributes
            assert sc.GEN_AI_USAGE_REASONING_OUTPUT_TOKENS not in attributes, name
            assert sc.ATTR_USAGE_ESTIMATED not in attributes, name
        assert not _tokens(cap, sc.TOKEN_TYPE_REASONING)
        assert _tokens(cap, sc.TOKEN_TYPE_OUTPUT) == 5
        assert _answer(cap) == (1, 0)
