"""The middleware + upstream instrumentation on an ordinary FastAPI proxy."""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.trace import SpanKind, StatusCode
from starlette.requests import ClientDisconnect

from stagelens import Rejected, semconv
from stagelens.testing import TRACERS
from tests._scaffold import chat_scope

BOTH_TRACERS = pytest.mark.parametrize("cap", TRACERS, indirect=True)
"""Run a test once per tracer a capture can record through: span shapes must agree."""

pytestmark = pytest.mark.anyio

STAGE_SPANS = {"gateway", "tokenizer", "router", "chat tiny", "billing"}


def _label_values(cap: Any, label: str) -> set[str]:
    """Every value of ``label`` exposed by the capture's registry."""
    return {
        sample.labels[label]
        for metric in cap.telemetry.registry.collect()
        for sample in metric.samples
        if label in sample.labels
    }


def _by_name(cap: Any) -> dict[str, Any]:
    return {s.name: s for s in cap.spans()}


class TestRequestTraces:
    """Streaming and non-streaming requests produce one trace with a span per stage."""

    @BOTH_TRACERS
    async def test_streaming_request_produces_root_and_stage_spans(
        self, cap, proxy_factory, client_factory
    ) -> None:
        """A streamed chat completion gives root SERVER span, stage spans and engine phases."""
        app, _ = proxy_factory(cap)
        async with client_factory(app) as client:
            r = await client.post(
                "/v1/chat/completions", json={"model": "tiny", "stream": True, "max_tokens": 16}
            )
        assert r.status_code == 200
        # 16 chunks + [DONE], passed through; the usage event stagelens asked for is not
        assert r.text.count("data: ") == 17
        assert '"usage"' not in r.text
        spans = _by_name(cap)
        root = spans["POST /v1/chat/completions"]
        assert root.kind is SpanKind.SERVER
        assert root.parent is None
        assert set(spans) == STAGE_SPANS | {
            "POST /v1/chat/completions",
            "queue",
            "prefill",
            "decode",
        }
        assert len({s.context.trace_id for s in cap.spans()}) == 1
        for name in STAGE_SPANS:
            assert spans[name].parent.span_id == root.context.span_id, name
        inference = spans["chat tiny"]
        assert inference.kind is SpanKind.CLIENT
        attrs = inference.attributes
        assert attrs[semconv.ATTR_STAGE] == "inference"
        assert attrs[semconv.GEN_AI_OPERATION_NAME] == "chat"
        assert attrs[semconv.GEN_AI_PROVIDER_NAME] == "vllm"
        assert attrs[semconv.GEN_AI_REQUEST_MODEL] == "tiny"
        assert attrs[semconv.GEN_AI_REQUEST_STREAM] is True
        assert attrs[semconv.GEN_AI_REQUEST_MAX_TOKENS] == 16
        assert attrs[semconv.GEN_AI_RESPONSE_FINISH_REASONS] == ("length",)
        assert type(attrs[semconv.GEN_AI_USAGE_INPUT_TOKENS]) is int
        assert attrs[semconv.GEN_AI_USAGE_INPUT_TOKENS] == 300
        assert attrs[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] == 16
        assert attrs[semconv.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] == 256
        assert attrs[semconv.SERVER_ADDRESS] == "127.0.0.1"
        assert type(attrs[semconv.SERVER_PORT]) is int
        assert isinstance(attrs[semconv.GEN_AI_RESPONSE_ID], str)
        for name in ("gateway", "tokenizer", "router", "billing"):
            assert spans[name].attributes[semconv.ATTR_STAGE] == name
            assert spans[name].kind is SpanKind.INTERNAL
        assert type(attrs[semconv.GEN_AI_USAGE_OUTPUT_TOKENS]) is int
        assert type(attrs[semconv.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS]) is int
        assert type(attrs[semconv.GEN_AI_REQUEST_MAX_TOKENS]) is int
        assert type(attrs[semconv.ATTR_REQUEST_ID]) is str
        assert type(spans["billing"].attributes[semconv.ATTR_COST_USD]) is float
        assert type(root.attributes[semconv.ATTR_TTFT]) is float
        assert type(root.attributes["http.response.status_code"]) is int
        queue, prefill, decode = spans["queue"], spans["prefill"], spans["decode"]
        for child in (queue, prefill, decode):
            assert child.parent.span_id == inference.context.span_id
            assert child.kind is SpanKind.INTERNAL
        assert queue.end_time == prefill.start_time
        assert prefill.end_time == decode.start_time
        assert (decode.end_time - decode.start_time) == 30_000_000
        assert (prefill.end_time - prefill.start_time) == 12_000_000
        assert (queue.end_time - queue.start_time) == 2_000_000

    @BOTH_TRACERS
    async def test_non_streaming_request_produces_the_same_structure(
        self, cap, proxy_factory, client_factory
    ) -> None:
        """A non-streamed completion is parsed from the body and gets the same spans."""
        app, _ = proxy_factory(cap)
        async with client_factory(app) as client:
            r = await client.post("/v1/chat/completions", json={"model": "tiny"})
        assert r.status_code == 200
        spans = _by_name(cap)
        assert {"queue", "prefill", "decode", "postprocess"} <= set(spans)
        assert spans["chat tiny"].attributes[semconv.GEN_AI_REQUEST_STREAM] is False
        assert spans["chat tiny"].attributes[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] == 16
        assert cap.value(semconv.REQUESTS, model="tiny", code="200") == 1.0
        assert cap.value(semconv.ENGINE_PHASE_DURATION + "_sum", phase="decode", model="tiny") == (
            pytest.approx(0.030)
        )

    @BOTH_TRACERS
    async def test_traceparent_and_request_id_reach_the_upstream(
        self, cap, proxy_factory, client_factory, upstream
    ) -> None:
        """The upstream sees the inference span as parent and an X-Request-Id."""
        app, _ = proxy_factory(cap)
        async with client_factory(app) as client:
            await client.post("/v1/chat/completions", json={"model": "tiny"})
        headers = upstream.state.seen_headers[-1]
        inference = _by_name(cap)["chat tiny"]
        trace_id = f"{inference.context.trace_id:032x}"
        span_id = f"{inference.context.span_id:016x}"
        assert headers["traceparent"].startswith(f"00-{trace_id}-{span_id}-")
        assert headers["x-request-id"] == f"{trace_id}-{span_id}"
        assert inference.attributes[semconv.ATTR_VLLM_REQUEST_ID] == headers["x-request-id"]

    @BOTH_TRACERS
    async def test_incoming_traceparent_is_continued(
        self, cap, proxy_factory, client_factory
    ) -> None:
        """A caller's W3C trace context becomes the root span's parent."""
        app, _ = proxy_factory(cap)
        parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        async with client_factory(app) as client:
            await client.post(
                "/v1/chat/completions", json={"model": "tiny"}, headers={"traceparent": parent}
            )
        root = _by_name(cap)["POST /v1/chat/completions"]
        assert f"{root.context.trace_id:032x}" == "0af7651916cd43dd8448eb211c80319c"
        assert f"{root.parent.span_id:016x}" == "b7ad6b7169203331"

    @BOTH_TRACERS
    async def test_the_configured_propagator_is_honoured(
        self, cap, proxy_factory, client_factory
    ) -> None:
        """A propagator set after the app was built, reading its own header, continues the
        caller's trace; without the header a root starts."""
        from opentelemetry import propagate, trace
        from opentelemetry.propagators.textmap import TextMapPropagator
        from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

        class SingleHeader(TextMapPropagator):
            """``b3: {trace}-{span}-1``, the B3 single-header form, extract only."""

            def extract(self, carrier, context=None, getter=None):  # type: ignore[no-untyped-def]
                values = getter.get(carrier, "b3") if getter else None
                if not values:
                    return context or Context()
                trace_id, span_id, _ = values[0].split("-")
                ctx = SpanContext(int(trace_id, 16), int(span_id, 16), True, TraceFlags(1))
                return trace.set_span_in_context(NonRecordingSpan(ctx), context)

            def inject(self, carrier, context=None, setter=None) -> None:  # type: ignore[no-untyped-def]
                return None

            @property
            def fields(self) -> set[str]:
                return {"b3"}

        from opentelemetry.context import Context

        app, _ = proxy_factory(cap)
        previous = propagate.get_global_textmap()
        propagate.set_global_textmap(SingleHeader())
        try:
            async with client_factory(app) as client:
                b3 = "80f198ee56343ba864fe8b2a57d3eff7-e457b5a2e4d86bd1-1"
                await client.post(
                    "/v1/chat/completions", json={"model": "tiny"}, headers={"b3": b3}
                )
                await client.post("/v1/chat/completions", json={"model": "tiny"})
        finally:
            propagate.set_global_textmap(previous)
        continued, fresh = [s for s in cap.spans() if s.name == "POST /v1/chat/completions"]
        assert f"{continued.context.trace_id:032x}" == "80f198ee56343ba864fe8b2a57d3eff7"
        assert f"{continued.parent.span_id:016x}" == "e457b5a2e4d86bd1"
        assert fresh.parent is None


class TestMetrics:
    """Per-request metrics: TTFT, ITL, stage durations, tokens and cost."""

    async def test_ttft_is_taken_at_the_first_token_not_the_headers(
        self, cap, proxy_factory, client_factory
    ) -> None:
        """Headers go out at once; TTFT waits for the first content chunk (0.2 s later)."""
        app, _ = proxy_factory(cap)
        body = {"model": "tiny", "stream": True, "x_chunks": 4, "x_first_delay": 0.2}
        async with client_factory(app) as client:
            await client.post("/v1/chat/completions", json=body)
        ttft_sum = cap.value(semconv.TIME_TO_FIRST_TOKEN + "_sum", model="tiny", prompt_size="1024")
        assert (
            cap.value(semconv.TIME_TO_FIRST_TOKEN + "_count", model="tiny", prompt_size="1024")
            == 1.0
        )
        assert 0.2 <= ttft_sum < 1.0
        root = _by_name(cap)["POST /v1/chat/completions"]
        assert root.attributes[semconv.ATTR_TTFT] == pytest.approx(ttft_sum)

    async def test_inter_token_latency_is_recorded_per_streamed_chunk(
        self, cap, proxy_factory, client_factory
    ) -> None:
        """Each gap between streamed token chunks is one ITL observation; the usage-only
        event and DONE are not tokens."""
        app, _ = proxy_factory(cap)
        body = {"model": "tiny", "stream": True, "x_chunks": 5, "x_delay": 0.02}
        async with client_factory(app) as client:
            await client.post("/v1/chat/completions", json=body)
        # 5 content chunks -> 4 gaps (the usage chunk and DONE are not tokens)
        assert cap.value(semconv.INTER_TOKEN_LATENCY + "_count", model="tiny") == 4.0
        assert cap.value(semconv.INTER_TOKEN_LATENCY + "_sum", model="tiny") >= 0.06

    async def test_every_stage_is_counted_with_the_model_label(
        self, cap, proxy_factory, client_factory
    ) -> None:
        """Stage histograms carry the request's model, learned after the gateway stage."""
        app, _ = proxy_factory(cap)
        async with client_factory(app) as client:
            for _ in range(3):
                await client.post("/v1/chat/completions", json={"model": "tiny", "stream": True})
        for stage_name in ("gateway", "tokenizer", "router", "inference", "billing"):
            count = cap.value(semconv.STAGE_DURATION + "_count", stage=stage_name, model="tiny")
            assert count == 3.0, stage_name
        assert cap.value(semconv.REQUESTS, model="tiny", code="200") == 3.0
        assert cap.value(semconv.REQUEST_DURATION + "_count", model="tiny", code="200") == 3.0

    async def test_usage_is_billed_once_with_cached_input_at_its_own_rate(
        self, cap, proxy_factory, client_factory
    ) -> None:
        """Tokens by type and the cost follow the default price table exactly."""
        app, _ = proxy_factory(cap)
        async with client_factory(app) as client:
            await client.post("/v1/chat/completions", json={"model": "tiny", "stream": True})
        tokens = semconv.TOKENS
        assert cap.value(tokens, model="tiny", tenant="other", type="input") == 300.0
        assert cap.value(tokens, model="tiny", tenant="other", type="output") == 16.0
        assert cap.value(tokens, model="tiny", tenant="other", type="cached_input") == 256.0
        # default: $1/M input, $4/M output, $0.5/M cached input
        expected = (44 * 1.0 + 256 * 0.5 + 16 * 4.0) / 1e6
        assert cap.value(semconv.COST_USD, model="tiny", tenant="other") == pytest.approx(expected)

    async def test_an_estimate_the_app_bills_is_marked_so(self, cap, client_factory) -> None:
        """``record_usage(estimated=True)``: billed as given (cache writes at their own
        type), counted as an estimated request, and the billing span says so."""
        import httpx
        from fastapi import FastAPI

        from stagelens import instrument_app, instrument_httpx_client, record_usage

        async def upstream(request: httpx.Request) -> httpx.Response:
            return httpx.Response(200, json={"choices": [], "usage": None})

        client = httpx.AsyncClient(transport=httpx.MockTransport(upstream))
        instrument_httpx_client(client, telemetry=cap.telemetry)
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def chat() -> dict[str, Any]:
            await client.post("http://vllm/v1/chat/completions", json={"model": "tiny"})
            record_usage(
                input_tokens=40,
                output_tokens=7,
                cached_input_tokens=16,
                cache_write_input_tokens=8,
                estimated=True,
            )
            return {}

        instrument_app(app, telemetry=cap.telemetry)
        async with client_factory(app) as http:
            await http.post("/v1/chat/completions", json={})
        tokens = semconv.TOKENS
        assert cap.value(tokens, model="tiny", tenant="other", type="cache_write") == 8.0
        assert cap.value(tokens, model="tiny", tenant="other", type="input") == 40.0
        assert cap.value(semconv.UNMETERED_REQUESTS, model="tiny", billing="estimated") == 1.0
        billing = _by_name(cap)["billing"]
        assert billing.attributes[semconv.GEN_AI_USAGE_CACHE_WRITE_INPUT_TOKENS] == 8
        assert billing.attributes[semconv.ATTR_USAGE_ESTIMATED] is True


class TestFailures:
    """Telemetry never breaks serving; app errors propagate unchanged."""

    @BOTH_TRACERS
    async def test_exception_inside_a_stage_is_recorded_and_propagates(
        self, cap, client_factory
    ) -> None:
        """A ValueError in a stage marks the span and reaches the caller unchanged."""
        from fastapi import FastAPI

        from stagelens import instrument_app, stage

        app = FastAPI()

        @app.get("/boom")
        async def boom() -> None:
            with stage("retrieval"):
                raise ValueError("index offline")

        instrument_app(app, telemetry=cap.telemetry)
        async with client_factory(app) as client:
            with pytest.raises(ValueError, match="index offline"):
                await client.get("/boom")
        span = _by_name(cap)["retrieval"]
        assert span.status.status_code is StatusCode.ERROR
        assert span.attributes[semconv.ERROR_TYPE] == "ValueError"
        assert [e.name for e in span.events] == ["exception"]
        root = _by_name(cap)["GET /boom"]
        assert root.status.status_code is StatusCode.ERROR
        assert cap.value(semconv.REQUESTS, model="unknown", code="500") == 1.0

    @BOTH_TRACERS
    async def test_raising_user_hook_does_not_fail_the_request(
        self, cap, proxy_factory, client_factory, caplog
    ) -> None:
        """A broken request/response hook is counted and logged once; requests succeed."""

        def bad_hook(span: Any, scope: Any) -> None:
            raise RuntimeError("hook bug")

        app, _ = proxy_factory(cap, request_hook=bad_hook, response_hook=bad_hook)
        with caplog.at_level(logging.WARNING, logger="stagelens"):
            async with client_factory(app) as client:
                for _ in range(3):
                    r = await client.post("/v1/chat/completions", json={"model": "tiny"})
                    assert r.status_code == 200
        assert cap.value(semconv.TELEMETRY_ERRORS, component="request_hook") == 3.0
        assert cap.value(semconv.TELEMETRY_ERRORS, component="response_hook") == 3.0
        warnings = [r for r in caplog.records if "hook failed" in r.getMessage()]
        assert len(warnings) == 2  # once per hook, not per request

    @BOTH_TRACERS
    async def test_gateway_rejection_answers_and_names_the_stage(
        self, cap, proxy_factory, client_factory
    ) -> None:
        """An auth hook raising Rejected answers 401 with an OpenAI-style body."""

        def auth(scope: Any) -> str:
            raise Rejected(
                401, "invalid API key", type="authentication_error", code="invalid_api_key"
            )

        app, _ = proxy_factory(cap, auth_hook=auth)
        async with client_factory(app) as client:
            r = await client.post("/v1/chat/completions", json={"model": "tiny"})
        assert r.status_code == 401
        assert r.json()["error"]["code"] == "invalid_api_key"
        root = _by_name(cap)["POST"]
        assert root.attributes[semconv.ATTR_REJECTED_BY] == "gateway"
        assert cap.value(semconv.REQUESTS, model="unknown", code="401") == 1.0
        assert cap.value(semconv.REJECTIONS, stage="gateway", model="unknown", code="401") == 1.0
        # an error body is not a first token: the TTFT SLI only sees answers
        assert cap.value(semconv.TIME_TO_FIRST_TOKEN + "_count", model="unknown") is None
        assert semconv.ATTR_TTFT not in root.attributes

    async def test_tenant_label_is_capped_through_the_middleware(
        self, proxy_factory, client_factory
    ) -> None:
        """With max_tenants=2, a third and fourth tenant are billed under ``other``."""
        from stagelens.testing import capture_telemetry

        def auth(scope: Any) -> str:
            headers = dict(scope["headers"])
            return str(headers[b"x-tenant"].decode())

        with capture_telemetry(max_tenants=2) as cap:
            app, _ = proxy_factory(cap, auth_hook=auth)
            async with client_factory(app) as client:
                for tenant in ("acme", "globex", "initech", "umbrella", "acme"):
                    r = await client.post(
                        "/v1/chat/completions",
                        json={"model": "tiny"},
                        headers={"x-tenant": tenant},
                    )
                    assert r.status_code == 200
            output = semconv.TOKENS
            assert cap.value(output, model="tiny", tenant="acme", type="output") == 32.0
            assert cap.value(output, model="tiny", tenant="globex", type="output") == 16.0
            assert cap.value(output, model="tiny", tenant="other", type="output") == 32.0
            assert _label_values(cap, "tenant") == {"acme", "globex", "other"}

    async def test_model_label_is_bounded_to_served_models(
        self, proxy_factory, client_factory
    ) -> None:
        """Names the engine refused are ``other`` and never take a slot; with max_models=2
        the first two models served keep their name, a third is ``other``."""
        from stagelens.testing import capture_telemetry

        with capture_telemetry(max_models=2) as cap:
            app, _ = proxy_factory(cap)
            async with client_factory(app) as client:
                for model in [f"no-such-{i}" for i in range(5)] + ["tiny", "m2", "m3", "tiny"]:
                    r = await client.post("/v1/chat/completions", json={"model": model})
                    assert r.status_code == (404 if model.startswith("no-such") else 200)
            assert cap.value(semconv.REQUESTS, model="other", code="404") == 5.0
            assert cap.value(semconv.REQUESTS, model="tiny", code="200") == 2.0
            assert cap.value(semconv.REQUESTS, model="m2", code="200") == 1.0
            assert cap.value(semconv.REQUESTS, model="other", code="200") == 1.0
            tokens = cap.value(semconv.TOKENS, model="other", tenant="other", type="output")
            assert tokens == 16.0  # m3's usage, billed under other
            assert _label_values(cap, "model") == {"tiny", "m2", "other"}
            inference = _by_name(cap)
            assert "chat no-such-0" in inference  # spans keep the name the client sent

    @BOTH_TRACERS
    async def test_client_disconnect_mid_stream_ends_the_trace(self, cap, proxy_factory) -> None:
        """The client leaves after 3 chunks: spans end, the root says it was cancelled."""
        app, _ = proxy_factory(cap)
        received: list[bytes] = []
        gone = asyncio.Event()
        body_sent = False

        async def receive() -> dict[str, Any]:
            nonlocal body_sent
            if not body_sent:
                body_sent = True
                return {
                    "type": "http.request",
                    "body": b'{"model": "tiny", "stream": true, "x_chunks": 50, "x_delay": 0.01}',
                    "more_body": False,
                }
            await gone.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.body" and message.get("body"):
                received.append(message["body"])
                if len(received) == 3:
                    gone.set()

        scope = chat_scope()
        await asyncio.wait_for(app(scope, receive, send), timeout=10)
        assert len(received) < 50
        spans = _by_name(cap)
        root = spans["POST /v1/chat/completions"]
        assert root.status.status_code is StatusCode.ERROR
        assert root.status.description == "client disconnected"
        assert root.attributes[semconv.ATTR_CLIENT_DISCONNECTED] is True
        inference = spans["chat tiny"]
        assert inference.status.status_code is StatusCode.ERROR
        assert inference.end_time is not None

    @BOTH_TRACERS
    async def test_client_gone_seen_by_a_failing_send(self, cap, proxy_factory) -> None:
        """ASGI spec 2.4: the departure shows only as a send raising OSError (Starlette
        stops listening on receive and raises its own ClientDisconnect from it)."""
        app, _ = proxy_factory(cap)
        sent: list[bytes] = []

        async def receive() -> dict[str, Any]:
            return {
                "type": "http.request",
                "body": b'{"model": "tiny", "stream": true, "x_chunks": 50, "x_delay": 0.01}',
                "more_body": False,
            }

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.body" and message.get("body"):
                if len(sent) == 3:
                    raise ConnectionResetError("client went away")
                sent.append(message["body"])

        scope = chat_scope(spec_version="2.4")
        with pytest.raises(ClientDisconnect) as raised:
            await asyncio.wait_for(app(scope, receive, send), timeout=10)
        assert isinstance(raised.value.__context__, OSError)
        assert len(sent) == 3
        spans = _by_name(cap)
        root = spans["POST /v1/chat/completions"]
        assert root.status.description == "client disconnected"
        assert root.attributes[semconv.ATTR_CLIENT_DISCONNECTED] is True
        # The 200 headers went out, the answer did not: 499, never the 200 nobody received;
        # the span keeps the status the app sent.
        assert cap.value(semconv.REQUESTS, model="tiny", code="499") == 1.0
        assert cap.value(semconv.REQUESTS, model="tiny", code="200") is None
        assert root.attributes["http.response.status_code"] == 200
        # Starlette leaves the relay generator to the event loop's finaliser, which closes
        # the upstream stream once the generator is collected (the traceback holds it).
        del raised
        gc.collect()
        for _ in range(100):
            if "chat tiny" in _by_name(cap):
                break
            await asyncio.sleep(0.01)
        inference = _by_name(cap)["chat tiny"]
        assert inference.status.status_code is StatusCode.ERROR
        assert "client disconnected" in (inference.status.description or "")


class TestContentCapture:
    """Prompt and completion text are recorded only when opted in."""

    async def test_content_is_not_captured_by_default(
        self, cap, proxy_factory, client_factory
    ) -> None:
        """Without the env opt-in, no gen_ai message attributes exist."""
        app, _ = proxy_factory(cap)
        async with client_factory(app) as client:
            await client.post(
                "/v1/chat/completions",
                json={"model": "tiny", "messages": [{"role": "user", "content": "secret"}]},
            )
        for span in cap.spans():
            assert semconv.GEN_AI_INPUT_MESSAGES not in (span.attributes or {})
            assert "secret" not in str(dict(span.attributes or {}))

    async def test_content_is_captured_when_enabled(self, proxy_factory, client_factory) -> None:
        """capture_message_content=True records the prompt and the completion."""
        from stagelens.testing import capture_telemetry

        with capture_telemetry(capture_message_content=True) as cap:
            app, _ = proxy_factory(cap)
            async with client_factory(app) as client:
                await client.post(
                    "/v1/chat/completions",
                    json={"model": "tiny", "messages": [{"role": "user", "content": "hello"}]},
                )
            attrs = _by_name(cap)["chat tiny"].attributes
            assert "hello" in attrs[semconv.GEN_AI_INPUT_MESSAGES]
            assert "hi" in attrs[semconv.GEN_AI_OUTPUT_MESSAGES]

    @pytest.mark.parametrize("tracer", TRACERS)
    @pytest.mark.parametrize("capture", [False, True])
    async def test_exception_messages_reach_spans_only_with_content_capture(
        self, tracer: Any, capture: bool, client_factory
    ) -> None:
        """An app error and a failing span hook may quote the request: without content
        capture the root span keeps their types and frames, never their messages (event,
        stack trace, status); with capture on they are recorded as the SDK records them."""
        from fastapi import FastAPI

        from stagelens import instrument_app
        from stagelens.testing import capture_telemetry

        secret = " ".join(("secret", "prompt", "text"))  # built: the frames show code only

        def bad_hook(span: Any, scope: Any) -> None:
            raise RuntimeError(f"hook saw {secret}")

        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def chat() -> None:
            raise ValueError(f"invalid input_value={secret!r}")

        with capture_telemetry(tracer=tracer, capture_message_content=capture) as cap:
            instrument_app(app, telemetry=cap.telemetry, request_hook=bad_hook)
            async with client_factory(app) as client:
                with pytest.raises(ValueError, match="invalid input_value"):
                    await client.post("/v1/chat/completions", json={"model": "tiny"})
            root = _by_name(cap)["POST /v1/chat/completions"]
        assert root.status.status_code is StatusCode.ERROR
        types = [e.attributes["exception.type"] for e in root.events if e.name == "exception"]
        assert types == ["RuntimeError", "ValueError"]
        shown = repr(
            (root.status.description, [dict(e.attributes) for e in root.events], root.attributes)
        )
        assert (secret in shown) is capture


@pytest.fixture
def unsampled() -> Iterator[Any]:
    """A capture whose tracer samples every trace out (ALWAYS_OFF)."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
    from stagelens.instrumentation import Telemetry

    from stagelens.testing import TelemetryCapture, capture_telemetry

    with capture_telemetry() as base:
        exporter = InMemorySpanExporter()
        provider = TracerProvider(sampler=ALWAYS_OFF)
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        telemetry = Telemetry(tracer_provider=provider, registry=base.registry)
        yield TelemetryCapture(telemetry, exporter)


class TestSampledOut:
    """With the trace sampled out, metrics stay complete and no span is built."""

    async def test_a_rejecting_stage_is_named_without_a_span(
        self, unsampled, proxy_factory, client_factory
    ) -> None:
        """The stage a Rejected escaped from is counted even when no span records it."""

        def auth(scope: Any) -> str:
            raise Rejected(429, "slow down", type="rate_limit_error")

        app, _ = proxy_factory(unsampled, auth_hook=auth)
        async with client_factory(app) as client:
            r = await client.post("/v1/chat/completions", json={"model": "tiny"})
        assert r.status_code == 429
        assert unsampled.spans() == []
        labels = {"stage": "gateway", "model": "unknown", "code": "429"}
        assert unsampled.value(semconv.REJECTIONS, **labels) == 1.0
        count = semconv.STAGE_DURATION + "_count"
        assert unsampled.value(count, stage="gateway", model="unknown") == 1.0

    async def test_metrics_without_spans_and_unsampled_traceparent(
        self, unsampled, proxy_factory, client_factory, upstream
    ) -> None:
        """ALWAYS_OFF: zero spans exported, every metric recorded, unsampled flag propagated."""
        cap = unsampled
        app, _ = proxy_factory(cap)
        async with client_factory(app) as client:
            r = await client.post("/v1/chat/completions", json={"model": "tiny", "stream": True})
        assert r.status_code == 200
        assert cap.spans() == []
        flags = int(upstream.state.seen_headers[-1]["traceparent"].rsplit("-", 1)[1], 16)
        assert flags & 0x01 == 0  # W3C "sampled" bit off
        for stage_name in ("gateway", "tokenizer", "router", "inference", "billing"):
            assert (
                cap.value(semconv.STAGE_DURATION + "_count", stage=stage_name, model="tiny") == 1.0
            )
        assert cap.value(semconv.TOKENS, model="tiny", tenant="other", type="input") == 300.0


class TestHostileTraceHeaders:
    """Trace headers are client input: they never flood the logs or land in them."""

    async def test_malformed_trace_headers_are_served_and_never_logged(
        self, cap, proxy_factory, client_factory, caplog
    ) -> None:
        """Twenty requests with an oversized traceparent and a baggage entry quoting a key
        all answer 200 and start their own trace; the propagators' loggers pass at most one
        record each, and no record holds the header's text."""
        import logging

        from stagelens.instrumentation._header_logs import PROPAGATOR_LOGGERS

        caplog.set_level(logging.WARNING)
        app, _ = proxy_factory(cap)
        headers = {
            "traceparent": "00-" + "a" * 600,
            "baggage": "sk-live-DO-NOT-LOG with spaces;;==",
        }
        async with client_factory(app) as client:
            for _ in range(20):
                response = await client.post(
                    "/v1/chat/completions", json={"model": "tiny"}, headers=headers
                )
                assert response.status_code == 200
        roots = [s for s in cap.spans() if s.name == "POST /v1/chat/completions"]
        assert len(roots) == 20
        assert all(s.parent is None for s in roots)
        records = [r for r in caplog.records if r.name in PROPAGATOR_LOGGERS]
        assert len([r for r in records if "tracecontext" in r.name]) <= 1
        assert len([r for r in records if "baggage" in r.name]) <= 1
        assert not any("DO-NOT-LOG" in r.getMessage() for r in caplog.records)
        assert not any("a" * 100 in r.getMessage() for r in caplog.records)
