"""Tail sampling through an ordinary instrumented app, a scripted upstream and a real OTLP
receiver: what the sampler keeps arrives whole, what it drops never leaves the process.

The upstream is scripted (the tiny model cannot fail on cue): the model name a request asks
for picks what happens to it (``_KINDS``). Every request's trace is compared with the same
request's trace under always_on, so "whole" means the same spans, not a count written here.
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import uvicorn
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, Decision, TraceIdRatioBased
from prometheus_client import CollectorRegistry
from prometheus_client.openmetrics.exposition import generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from stagelens import TailSampler, configure, engine_join, semconv
from stagelens.config import Settings, load_settings
from stagelens.errors import ConfigurationError
from stagelens.telemetry import Telemetry
from tests._otlp_receiver import OtlpReceiver, otlp_receiver
from tests._scaffold import chat_scope
from tests.instrumentation.conftest import ENGINE_METRICS, USAGE, build_proxy, gateway_client

pytestmark = pytest.mark.anyio

TTFT_SLO = 0.25
STALL = 0.3
SLOW = 0.8
_KINDS = ("fine", "slow", "stall", "long", "fail", "die", "left")
"""Model names = what the upstream does: answer at once; first token after 0.4 s (TTFT
SLO 0.25 s); one 0.45 s gap in a stream whose mean gap meets the ITL SLO (stall 0.3 s);
a non-streamed answer after 1 s (end to end 0.8 s); 503; cut after 3 events; a client
that leaves after 3 events."""


def _scripted_upstream() -> Starlette:
    """An OpenAI-compatible upstream whose behaviour is the requested model's name; it
    keeps the ``traceparent`` and ``x-request-id`` of every call."""
    seen: list[tuple[str, str | None]] = []

    async def chat(request: Request) -> Response:
        body = await request.json()
        kind = body["model"]
        seen.append((request.headers.get("traceparent", ""), request.headers.get("x-request-id")))
        if kind == "fail":
            return JSONResponse({"error": {"message": "overloaded", "code": 503}}, 503)
        if kind == "long":
            await asyncio.sleep(1.0)
            message = {"role": "assistant", "content": "hi"}
            return JSONResponse(
                {
                    "model": kind,
                    "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                    "usage": USAGE,
                    "metrics": ENGINE_METRICS,
                }
            )
        count = 40 if kind == "left" else 8

        async def events() -> AsyncIterator[bytes]:
            if kind == "slow":
                await asyncio.sleep(0.4)
            for i in range(count):
                if kind == "stall" and i == 4:
                    await asyncio.sleep(0.45)
                elif kind == "left":
                    await asyncio.sleep(0.01)
                if kind == "die" and i == 3:
                    raise RuntimeError("engine died mid-stream")
                last = i == count - 1
                finish = "stop" if last else None
                delta = {"index": 0, "delta": {"content": f"t{i} "}, "finish_reason": finish}
                chunk = {"id": f"chatcmpl-{kind}", "model": kind, "choices": [delta]}
                yield f"data: {json.dumps(chunk)}\n\n".encode()
            final = {"model": kind, "choices": [], "usage": USAGE, "metrics": ENGINE_METRICS}
            yield f"data: {json.dumps(final)}\n\n".encode()
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])
    app.state.seen = seen
    return app


@pytest.fixture(scope="module")
def scripted(port_factory: Any) -> Iterator[Starlette]:
    """The scripted upstream on a loopback port (a real socket: events arrive one by one)."""
    app = _scripted_upstream()
    port = port_factory()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="critical", lifespan="off")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    app.state.url = f"http://127.0.0.1:{port}"
    yield app
    server.should_exit = True
    thread.join(timeout=5)


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with otlp_receiver() as server:
        yield server


def _configure(receiver: OtlpReceiver, sampler: Any) -> Telemetry:
    """``configure()`` as an app calls it, exporting to the receiver over OTLP/HTTP."""
    return configure(
        span_exporters=[OTLPSpanExporter(endpoint=f"{receiver.url}/v1/traces")],
        registry=CollectorRegistry(),
        set_global=False,
        gpu=False,
        sampler=sampler,
        ttft_slo_threshold_seconds=TTFT_SLO,
        tail_stall_seconds=STALL,
        tail_slow_seconds=SLOW,
    )


async def _request(app: Any, kind: str, headers: dict[str, str] | None = None) -> None:
    """One request of ``kind`` through the gateway, as a client sends it."""
    if kind == "left":
        await _leave_after_three_events(app)
        return
    body = {"model": kind, "stream": kind != "long", "messages": []}
    async with gateway_client(app, raise_app_exceptions=False) as client:
        await client.post("/v1/chat/completions", json=body, headers=headers or {})


async def _leave_after_three_events(app: Any) -> None:
    """A client that reads three events of a long stream and goes away."""
    gone = asyncio.Event()
    received: list[bytes] = []
    started = False

    async def receive() -> dict[str, Any]:
        nonlocal started
        if not started:
            started = True
            body = json.dumps({"model": "left", "stream": True, "messages": []}).encode()
            return {"type": "http.request", "body": body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body" and message.get("body"):
            received.append(message["body"])
            if len(received) == 3:
                gone.set()

    await asyncio.wait_for(app(chat_scope(), receive, send), timeout=10)


def _traces(receiver: OtlpReceiver) -> dict[str, list[dict[str, Any]]]:
    """Spans received, by trace id."""
    by_trace: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for span in receiver.spans():
        by_trace[span["trace_id"]].append(span)
    return by_trace


def _kind(spans: list[dict[str, Any]]) -> str:
    """Which scripted behaviour a trace came from: its inference span is ``chat <model>``."""
    names = [s["name"] for s in spans if s["name"].startswith("chat ")]
    assert len(names) == 1, [s["name"] for s in spans]
    return names[0].removeprefix("chat ")


_DECIDED_AT_START_ONLY = frozenset({semconv.ATTR_REQUEST_ID})
"""Set only on a trace sampled from its start: the X-Request-Id that names the inference
span to vLLM is sent only then (docs/tail-sampling.md, "What the upstream is told")."""


def _shape(spans: list[dict[str, Any]]) -> Counter[tuple[str, str | None, frozenset[str]]]:
    """Each span's name with its parent's (None for the root) and its attribute names:
    the trace's tree, so a span recorded as data and built when kept must sit where its
    span sits and say what it says."""
    names = {s["span_id"]: s["name"] for s in spans}
    return Counter(
        (
            s["name"],
            names.get(s["parent_span_id"]),
            frozenset(s["attributes"]) - _DECIDED_AT_START_ONLY,
        )
        for s in spans
    )


def _ratio_chosen(trace_id_hex: str, ratio: float) -> bool:
    """OpenTelemetry's TraceIdRatioBased rule, read from the SDK itself."""
    result = TraceIdRatioBased(ratio).should_sample(None, int(trace_id_hex, 16), "x")
    return result.decision is Decision.RECORD_AND_SAMPLE


def _decisions(telemetry: Telemetry) -> dict[tuple[str, str], float]:
    found: dict[tuple[str, str], float] = {}
    for metric in telemetry.registry.collect():
        for sample in metric.samples:
            if sample.name == semconv.TRACE_DECISIONS:
                key = (sample.labels[semconv.LABEL_DECISION], sample.labels[semconv.LABEL_REASON])
                found[key] = sample.value
    return found


def _exemplar_traces(telemetry: Telemetry) -> set[str]:
    """Trace ids the OpenMetrics exposition's exemplars name."""
    text = generate_latest(telemetry.registry).decode()
    found = set()
    for line in text.splitlines():
        if "# {" in line and "trace_id=" in line:
            found.add(line.split('trace_id="', 1)[1][:32])
    return found


async def _whole_shapes(
    scripted: Starlette,
) -> dict[str, Counter[tuple[str, str | None, frozenset[str]]]]:
    """Each kind's trace under always_on: the spans a whole trace has."""
    with otlp_receiver() as server:
        telemetry = _configure(server, ALWAYS_ON)
        app, _ = build_proxy(SimpleNamespace(telemetry=telemetry), scripted.state.url)  # type: ignore[arg-type]
        for kind in _KINDS:
            await _request(app, kind)
        telemetry.force_flush()
        assert server.wait_for(lambda: len(_traces(server)) == len(_KINDS))
        shapes = {_kind(spans): _shape(spans) for spans in _traces(server).values()}
        telemetry.shutdown()
    assert set(shapes) == set(_KINDS)
    return shapes


class TestTailSampling:
    """The keep rules, end to end."""

    async def test_every_trace_worth_reading_arrives_whole_and_fine_ones_at_the_ratio(
        self, scripted: Starlette, receiver: OtlpReceiver
    ) -> None:
        """At a base ratio of 0.2: each failed, slow, stalled, abandoned request's trace
        arrives, with the spans the same request has under always_on; of the fine ones,
        those the trace id chooses (OpenTelemetry's rule) arrive, within binomial error of
        the ratio, plus the few kept as exemplars; every exemplar names a trace that
        arrived whole; the decisions counter adds up to every request, and the traceparent
        sent upstream said sampled only for traces decided at the start."""
        shapes = await _whole_shapes(scripted)
        ratio, fine = 0.2, 300
        telemetry = _configure(receiver, TailSampler(ratio))
        app, _ = build_proxy(SimpleNamespace(telemetry=telemetry), scripted.state.url)  # type: ignore[arg-type]
        scripted.state.seen.clear()
        worth = ("slow", "stall", "long", "fail", "die", "left")
        plan = ["fine"] * fine + [kind for kind in worth for _ in range(3)]
        for kind in plan:
            await _request(app, kind)
        telemetry.force_flush()
        traces = _traces(receiver)
        by_kind: dict[str, list[str]] = defaultdict(list)
        for trace_id, spans in traces.items():
            kind = _kind(spans)
            by_kind[kind].append(trace_id)
            assert _shape(spans) == shapes[kind], (kind, trace_id)  # whole
        for kind in worth:
            assert len(by_kind[kind]) == 3, kind
        decisions = _decisions(telemetry)
        assert sum(decisions.values()) == len(plan)  # every request decided, counted once
        chosen = [t for t in by_kind["fine"] if _ratio_chosen(t, ratio)]
        others = len(by_kind["fine"]) - len(chosen)
        sigma = math.sqrt(fine * ratio * (1 - ratio))
        assert abs(len(chosen) - fine * ratio) <= 4 * sigma, len(chosen)
        assert others <= decisions.get((semconv.DECISION_KEPT, semconv.REASON_EXEMPLAR), 0)
        assert decisions[(semconv.DECISION_KEPT, semconv.REASON_ERROR)] == 6  # fail, die
        assert decisions[(semconv.DECISION_KEPT, semconv.REASON_CLIENT_LEFT)] == 3
        assert decisions[(semconv.DECISION_KEPT, semconv.REASON_SLOW)] >= 9
        dropped = decisions[(semconv.DECISION_DROPPED, semconv.REASON_FINE)]
        assert dropped == fine - len(by_kind["fine"])  # what was not received was dropped
        exemplars = _exemplar_traces(telemetry)
        assert exemplars
        assert exemplars <= set(traces)
        # The traceparent sent upstream: sampled exactly when the ratio chose the trace,
        # and only such calls name the trace in X-Request-Id.
        for traceparent, request_id in scripted.state.seen:
            sampled = traceparent.endswith("-01")
            assert sampled == _ratio_chosen(traceparent.split("-")[1], ratio), traceparent
            named = engine_join.trace_of(request_id.split("~")[0]) is not None
            assert named == sampled, request_id
        telemetry.shutdown()

    async def test_a_child_of_a_sampled_parent_is_kept(
        self, scripted: Starlette, receiver: OtlpReceiver
    ) -> None:
        """At a base ratio of 0, a fine request whose caller's traceparent says sampled is
        kept (reason ``parent``) under the caller's span, and its upstream call says
        sampled; one whose caller says not sampled is not (kept only as an exemplar)."""
        telemetry = _configure(receiver, TailSampler(0.0))
        app, _ = build_proxy(SimpleNamespace(telemetry=telemetry), scripted.state.url)  # type: ignore[arg-type]
        for _ in range(3):  # fills the duration bucket's exemplar slot
            await _request(app, "fine")
        telemetry.force_flush()
        before = set(_traces(receiver))
        scripted.state.seen.clear()
        parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331"
        await _request(app, "fine", {"traceparent": f"{parent}-01"})
        unsampled = "00-1af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"
        await _request(app, "fine", {"traceparent": unsampled})
        telemetry.force_flush()
        new = {t: s for t, s in _traces(receiver).items() if t not in before}
        exemplars = _decisions(telemetry).get((semconv.DECISION_KEPT, semconv.REASON_EXEMPLAR))
        if "1af7651916cd43dd8448eb211c80319c" in new:  # only when it fell in a new bucket
            assert exemplars == 1 + len(before)
        assert "0af7651916cd43dd8448eb211c80319c" in new
        spans = new["0af7651916cd43dd8448eb211c80319c"]
        ids = {s["span_id"] for s in spans}
        roots = [s for s in spans if s["parent_span_id"] not in ids]
        assert [r["parent_span_id"] for r in roots] == ["b7ad6b7169203331"]  # the caller's
        assert scripted.state.seen[0][0].endswith("-01")
        assert scripted.state.seen[1][0].endswith("-00")
        decisions = _decisions(telemetry)
        assert decisions[(semconv.DECISION_KEPT, semconv.REASON_PARENT)] == 1
        telemetry.shutdown()


@given(st.integers(1, 2**128 - 1), st.floats(0.0, 1.0))
def test_the_ratio_rule_is_opentelemetrys(trace_id: int, ratio: float) -> None:
    """For any trace id and ratio, the tail sampler keeps at the start exactly the traces
    OpenTelemetry's TraceIdRatioBased samples (so services sampling by ratio agree)."""
    ours = TailSampler(ratio).should_sample(None, trace_id, "x").decision
    theirs = TraceIdRatioBased(ratio).should_sample(None, trace_id, "x").decision
    assert (ours is Decision.RECORD_AND_SAMPLE) == (theirs is Decision.RECORD_AND_SAMPLE)
    assert ours in (Decision.RECORD_AND_SAMPLE, Decision.RECORD_ONLY)


@pytest.mark.parametrize("window", [15.0, 60.0])
def test_the_exemplar_window_is_the_setting(window: float) -> None:
    """``tail_exemplar_refresh_seconds`` is the window of the exemplar rule: a fine request
    in a bucket that a kept trace filled less than that long ago is not kept, one after it
    is, and a new window starts a new slowest (``STAGELENS_TAIL_EXEMPLAR_REFRESH_SECONDS``)."""
    telemetry = Telemetry(
        Settings(tail_exemplar_refresh_seconds=window), registry=CollectorRegistry()
    )
    slots = telemetry.instruments.exemplar_slots
    assert slots is not None
    assert slots.claim("m", 0.2, 100.0, kept=False)  # first in its bucket and window
    assert not slots.claim("m", 0.2, 100.0 + window * 0.99, kept=False)  # filled, not slowest
    assert slots.claim("m", 0.2, 100.0 + window, kept=False)  # the bucket's exemplar is stale
    telemetry.shutdown()


def test_the_exemplar_window_must_be_positive() -> None:
    with pytest.raises(ConfigurationError, match="tail_exemplar_refresh_seconds"):
        load_settings(tail_exemplar_refresh_seconds=0)
