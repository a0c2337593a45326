"""The reference gateway (``stagelens.reference``) over the local vLLM-like upstream: the
gateway's own bookkeeping (outstanding counts, error attribution, model labels, prices,
billing of cut streams) checked fast and deterministically; real vLLM runs in tests/e2e.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.trace import StatusCode
from stagelens.reference import GatewayConfig, create_app

from stagelens import semconv as sc
from stagelens.pricing import PriceTable, Usage
from stagelens.testing import TelemetryCapture

pytestmark = pytest.mark.anyio

KEY = "sk-unit"
HEADERS = {"authorization": f"Bearer {KEY}"}


def _config(backends: list[str], tokenizer: Path, **over: Any) -> GatewayConfig:
    pool = {"backends": backends, "tokenizer": str(tokenizer), **over.pop("pool", {})}
    models = {
        "tiny": pool,
        "dead": {"backends": ["http://127.0.0.1:9"], "tokenizer": str(tokenizer)},
    }
    data = {"api_keys": {KEY: "unit"}, "models": models, "balancing": "least_outstanding", **over}
    return GatewayConfig.model_validate(data)


@pytest.fixture
def gateway(cap: TelemetryCapture, upstream: Any, tiny_model: Path) -> Callable[..., Any]:
    """``async with gateway(**config_overrides) as (app, client)``: the reference gateway
    in-process (no lifespan, so no health checks: every backend starts healthy)."""

    @asynccontextmanager
    async def factory(
        backends: list[str] | None = None, **over: Any
    ) -> AsyncIterator[tuple[Any, httpx.AsyncClient]]:
        config = _config(backends or [upstream.state.url], tiny_model, **over)
        app = create_app(config, telemetry=cap.telemetry)
        client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://gw", headers=HEADERS
        )
        try:
            yield app, client
        finally:
            await client.aclose()
            await app.state.gateway.client.aclose()

    return factory


def _chat(**extra: Any) -> dict[str, Any]:
    return {"model": "tiny", "messages": [{"role": "user", "content": "hello"}], **extra}


def _root(cap: TelemetryCapture) -> Any:
    roots = [s for s in cap.spans() if s.parent is None]
    assert len(roots) == 1
    return roots[0]


class TestStreamedInference:
    """A normal streamed request through the gateway."""

    async def test_inference_span_of_a_complete_stream_is_not_an_error(self, cap, gateway) -> None:
        """The relay stops at [DONE]; the inference span stays UNSET with no error.type."""
        async with gateway() as (_, client):
            r = await client.post("/v1/chat/completions", json=_chat(stream=True))
        assert r.status_code == 200
        assert r.text.endswith("data: [DONE]\n\n")
        inference = next(s for s in cap.spans() if s.name == "chat tiny")
        assert inference.status.status_code is StatusCode.UNSET
        assert sc.ERROR_TYPE not in inference.attributes
        assert sc.ATTR_STREAM_CLOSED_EARLY not in inference.attributes


class TestLoadBalancer:
    """Least-outstanding sees requests from the moment they are assigned."""

    async def test_a_request_waiting_for_admission_counts_as_outstanding(
        self, gateway, upstream
    ) -> None:
        """With one admission slot, a queued request already counts on its backend."""
        url = upstream.state.url
        # two Backend objects (the keys differ) for the same local server
        async with gateway([url, url + "/"], pool={"max_inflight": 1}) as (app, client):
            backends = app.state.gateway.router.pools["tiny"].balancer.backends
            slow = asyncio.create_task(
                client.post(
                    "/v1/chat/completions", json=_chat(stream=True, x_chunks=20, x_delay=0.02)
                )
            )
            while sum(b.outstanding for b in backends) < 1:
                await asyncio.sleep(0.005)
            queued = asyncio.create_task(client.post("/v1/chat/completions", json=_chat()))
            await asyncio.sleep(0.1)
            assert not queued.done()  # waiting for admission behind the slow one
            assert sorted(b.outstanding for b in backends) == [1, 1]
            answers = await asyncio.gather(slow, queued)
        assert [a.status_code for a in answers] == [200, 200]
        assert [b.outstanding for b in backends] == [0, 0]


class TestErrorAttribution:
    """Errors answered outside a stage block still name the stage that failed."""

    async def test_backend_unavailable_is_rejected_by_the_load_balancer(self, cap, gateway) -> None:
        """Connection refused on the only backend: 503 backend_unavailable, load_balancer."""
        async with gateway() as (app, client):
            r = await client.post("/v1/chat/completions", json={**_chat(), "model": "dead"})
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "backend_unavailable"
        assert _root(cap).attributes[sc.ATTR_REJECTED_BY] == "load_balancer"
        labels = {"stage": "load_balancer", "model": "dead", "code": "503"}
        assert cap.value(sc.REJECTIONS, **labels) == 1.0
        assert [b.outstanding for b in app.state.gateway.backends] == [0, 0]

    async def test_unknown_model_keeps_the_default_model_label(self, cap, gateway) -> None:
        """A model name the router does not serve creates no series of its own."""
        async with gateway() as (_, client):
            r = await client.post("/v1/chat/completions", json={**_chat(), "model": "nope-123"})
        assert r.status_code == 404
        default = cap.telemetry.settings.default_model
        assert cap.value(sc.REQUESTS, model=default, code="404") == 1.0
        assert cap.value(sc.REQUESTS, model="nope-123", code="404") is None
        assert sc.GEN_AI_REQUEST_MODEL not in _root(cap).attributes


class TestBilling:
    """Prices from the gateway config; real token counts for streams cut short."""

    async def test_config_price_table_prices_the_request(self, cap, gateway, tmp_path) -> None:
        """``price_table`` in the config wins over the telemetry's default prices."""
        prices = tmp_path / "prices.yaml"
        prices.write_text("models:\n  tiny: {input: 100.0, output: 300.0, cached_input: 10.0}\n")
        async with gateway(price_table=str(prices)) as (_, client):
            r = await client.post("/v1/chat/completions", json=_chat())
        usage = r.json()["usage"]
        expected = PriceTable.load(prices).cost(
            "tiny",
            Usage(
                usage["prompt_tokens"],
                usage["completion_tokens"],
                usage["prompt_tokens_details"]["cached_tokens"],
            ),
        )
        assert expected != PriceTable.default().cost("tiny", Usage(300, 16, 256))
        assert cap.value(sc.COST_USD, model="tiny", tenant="unit") == pytest.approx(expected)

    async def test_stream_cut_by_a_stop_sequence_bills_generated_tokens(
        self, cap, gateway, tiny_model
    ) -> None:
        """A stop sequence ends the stream early: output billed as the generated text's
        tokens, cached input 0 (unknown); the inference span records the cut, no error."""
        from transformers import AutoTokenizer

        async with gateway() as (_, client):
            r = await client.post(
                "/v1/chat/completions", json=_chat(stream=True, stop="t3", x_chunks=12)
            )
        events = [json.loads(x[6:]) for x in r.text.split("\n\n") if x.startswith("data: {")]
        assert [e["choices"][0]["finish_reason"] for e in events][-1] == "stop"
        assert len(events) == 4  # t0, t1, t2 and the cut "t3" chunk
        tokenizer = AutoTokenizer.from_pretrained(str(tiny_model))
        expected = len(tokenizer("t0 t1 t2 t3 ", add_special_tokens=False)["input_ids"])
        assert expected != len(events)  # the count is of tokens, not of chunks
        labels = {"model": "tiny", "tenant": "unit"}
        assert cap.value(sc.TOKENS, type="output", **labels) == expected
        assert cap.value(sc.TOKENS, type="cached_input", **labels) == 0
        assert cap.value(sc.TOKENS, type="input", **labels) > 0
        inference = next(s for s in cap.spans() if s.name == "chat tiny")
        assert inference.attributes[sc.ATTR_STREAM_CLOSED_EARLY] is True
        assert inference.status.status_code is StatusCode.UNSET


_USAGE = {"prompt_tokens": 5, "completion_tokens": 6, "total_tokens": 11}


def _script(events: list[list[Any]]) -> dict[str, Any]:
    """The scripted upstream's knobs (``tests._scaffold.scripted_upstream``) for ``events``
    (``[choice index, text, finish reason]`` each): streamed, those events in
    ``json.dumps`` spacing, then vLLM's usage event; not streamed, one answer with a choice
    per index (their texts joined)."""
    lines = []
    texts: dict[int, str] = {}
    for index, text, finish in events:
        texts[index] = texts.get(index, "") + text
        event = {
            "id": "x",
            "object": "chat.completion.chunk",
            "choices": [{"index": index, "delta": {"content": text}, "finish_reason": finish}],
        }
        lines.append([0, f"data: {json.dumps(event)}\n\n"])
    choices = [
        {"index": i, "message": {"role": "assistant", "content": t}, "finish_reason": "length"}
        for i, t in sorted(texts.items())
    ]
    return {
        "x_script": lines,
        "x_usage_event": {"id": "x", "choices": [], "usage": _USAGE},
        "x_spaced_usage": True,
        "x_answer": {"id": "x", "object": "chat.completion", "choices": choices, "usage": _USAGE},
    }


def _choices_of(text: str) -> dict[int, tuple[str, str | None]]:
    out: dict[int, tuple[str, str | None]] = {}
    for raw in text.split("\n\n"):
        if not raw.startswith("data: {"):
            continue
        for ch in json.loads(raw[6:]).get("choices", []):
            seen, reason = out.get(ch["index"], ("", None))
            out[ch["index"]] = (
                seen + (ch["delta"].get("content") or ""),
                ch["finish_reason"] or reason,
            )
    return out


class TestChoices:
    """Stop sequences and the safety check apply per choice (``n`` > 1)."""

    async def test_stop_string_across_two_choices_ends_neither(self, gateway, scripted_url) -> None:
        """A stop string that ends one choice's text and starts the other's is in neither
        choice: both are relayed whole, each with its own finish reason."""
        script = [[0, "ab", None], [1, "cd", None], [0, "e", "length"], [1, "f", "length"]]
        async with gateway([scripted_url]) as (_, client):
            r = await client.post(
                "/v1/chat/completions", json=_chat(stream=True, n=2, stop="bc", **_script(script))
            )
        assert _choices_of(r.text) == {0: ("abe", "length"), 1: ("cdf", "length")}

    async def test_a_stop_in_one_choice_ends_only_that_one(self, gateway, scripted_url) -> None:
        """A stop string inside choice 0 ends choice 0 there (``stop``); choice 1 goes on
        to its own end; and so on a whole answer."""
        script = [[0, "a ", None], [1, "b X", None], [0, "XYz", "length"], [1, "w", "length"]]
        async with gateway([scripted_url]) as (_, client):
            streamed = await client.post(
                "/v1/chat/completions", json=_chat(stream=True, n=2, stop="XY", **_script(script))
            )
            whole = await client.post(
                "/v1/chat/completions", json=_chat(n=2, stop="XY", **_script(script))
            )
        assert _choices_of(streamed.text) == {0: ("a ", "stop"), 1: ("b Xw", "length")}
        answer = {
            c["index"]: (c["message"]["content"], c["finish_reason"])
            for c in whole.json()["choices"]
        }
        assert answer == {0: ("a ", "stop"), 1: ("b Xw", "length")}


class _CommitLog:
    """The gateway's real ledger, noting each commit in ``log`` once it returned."""

    def __init__(self, inner: Any, log: list[tuple[str, Any]]) -> None:
        self.inner = inner
        self.log = log

    async def add(self, tenant: str, usage: Any) -> None:
        await self.inner.add(tenant, usage)
        self.log.append(("commit", usage.output_tokens))

    async def get(self, tenant: str) -> Any:
        return await self.inner.get(tenant)


def _noting_sends(app: Any, log: list[tuple[str, Any]]) -> Any:
    """``app``, noting in ``log`` each response body chunk as the client is sent it."""

    async def noting(scope: Any, receive: Any, send: Any) -> None:
        async def sending(message: Any) -> None:
            if message["type"] == "http.response.body" and message.get("body"):
                log.append(("body", message["body"]))
            await send(message)

        await app(scope, receive, sending)

    return noting


SCRIPT = [[0, "a", None], [0, "b", "stop"]]
"""Two events; the scripted upstream's usage says 6 output tokens."""


class TestLedger:
    """Billing reaches the usage ledger before the client sees the usage; a ledger that
    fails does not fail the request."""

    @pytest.mark.parametrize(
        ("extra", "marker"),
        [
            ({"stream": True, "stream_options": {"include_usage": True}}, b'"usage":{'),
            ({"stream": True}, b'"finish_reason":"stop"'),
            ({}, b'"usage":{'),
        ],
        ids=["stream-with-usage", "stream", "whole"],
    )
    async def test_usage_is_committed_before_the_client_is_sent_it(
        self, gateway, scripted_url, extra, marker
    ) -> None:
        """The commit comes before the chunk with the usage (a stream whose client asked
        for it, or a whole answer), or before the final event (a stream without it)."""
        log: list[tuple[str, Any]] = []
        async with gateway([scripted_url]) as (app, _):
            app.state.gateway.ledger = _CommitLog(app.state.gateway.ledger, log)
            client = httpx.AsyncClient(
                transport=httpx.ASGITransport(app=_noting_sends(app, log)),
                base_url="http://gw",
                headers=HEADERS,
            )
            r = await client.post("/v1/chat/completions", json=_chat(**_script(SCRIPT), **extra))
        assert r.status_code == 200
        sent = next(i for i, (kind, x) in enumerate(log) if kind == "body" and marker in x)
        assert log.index(("commit", 6)) < sent, log

    async def test_an_unwritable_ledger_serves_requests_and_counts_the_failure(
        self, cap, gateway, scripted_url, tmp_path
    ) -> None:
        """A ledger file that cannot be created: answers byte for byte what a working
        ledger gives, tokens still counted, each failed commit counted under
        ``component="ledger"``; ``GET /v1/usage`` answers 503 ``ledger_error``."""
        blocker = tmp_path / "a-file"
        blocker.write_text("")
        bodies = [_chat(**_script(SCRIPT)), _chat(**_script(SCRIPT), stream=True)]
        async with gateway([scripted_url]) as (_, client):
            working = [await client.post("/v1/chat/completions", json=b) for b in bodies]
        async with gateway([scripted_url], ledger_url=f"sqlite://{blocker}/ledger.sqlite3") as (
            _,
            client,
        ):
            broken = [await client.post("/v1/chat/completions", json=b) for b in bodies]
            usage = await client.get("/v1/usage")
        assert [r.status_code for r in broken] == [200, 200]
        assert [r.content for r in broken] == [r.content for r in working]
        assert usage.status_code == 503
        assert usage.json()["error"]["code"] == "ledger_error"
        assert cap.value(sc.TELEMETRY_ERRORS, component="ledger") == 3
        assert cap.value(sc.TOKENS, type="output", model="tiny", tenant="unit") == 4 * 6


class TestStages:
    """What the gateway times as which stage."""

    async def test_per_event_work_is_postprocess_time(self, cap, gateway, scripted_url) -> None:
        """The safety check run on each of 10 events (2 ms each here) is in the request's
        postprocess stage time."""
        import time

        def slow_safety(text: str) -> bool:
            time.sleep(0.002)
            return True

        script = [[0, f"t{i} ", None] for i in range(9)] + [[0, "end", "length"]]
        async with gateway([scripted_url]) as (app, client):
            app.state.gateway.safety = slow_safety
            r = await client.post(
                "/v1/chat/completions", json=_chat(stream=True, **_script(script))
            )
        assert r.status_code == 200
        name = sc.STAGE_DURATION
        assert cap.value(name + "_count", stage="postprocess", model="tiny") == 1
        assert cap.value(name + "_sum", stage="postprocess", model="tiny") >= 0.02


class TestExposure:
    """What the public port serves without a key, and where the metrics are."""

    async def test_metrics_are_not_on_the_api_port(self, cap, gateway) -> None:
        """``/metrics`` on the API app is no metrics endpoint (404, with a key or without);
        ``metrics_app`` serves the gateway's registry."""
        from stagelens.reference import metrics_app

        async with gateway() as (app, client):
            assert (await client.get("/metrics")).status_code == 404
            anonymous = httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://gw"
            )
            assert (await anonymous.get("/metrics")).json()["error"]["code"] == "not_found"
            await client.post("/v1/chat/completions", json=_chat())
            internal = httpx.AsyncClient(
                transport=httpx.ASGITransport(app=metrics_app(app)), base_url="http://metrics"
            )
            r = await internal.get("/metrics")
        assert r.status_code == 200
        assert sc.TIME_TO_FIRST_TOKEN in r.text

    async def test_anonymous_health_says_up_or_down_only(self, gateway) -> None:
        """``/health`` needs no key and names no backend: up while every pool has a healthy
        backend, down (503) otherwise."""
        async with gateway() as (app, _):
            anonymous = httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://gw"
            )
            up = await anonymous.get("/health")
            for backend in app.state.gateway.backends:
                backend.healthy = False
            down = await anonymous.get("/health")
        assert (up.status_code, up.json()) == (200, {"status": "up"})
        assert (down.status_code, down.json()) == (503, {"status": "down"})
        assert "http" not in up.text + down.text
