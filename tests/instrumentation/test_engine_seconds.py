"""The gateway's side of the engine time: the request id it sends carries the tenant, and
the vLLM server's answer (a header, or a comment at the end of a stream, added by the
stagelens middleware there) becomes the inference span's ``stagelens.engine.seconds`` and
``stagelens_engine_seconds_total{model, tenant}``; the comment never reaches the client.

The upstream is the scripted vLLM of these tests behind the real middleware
(``exporters.vllm_join``); what the vLLM plugin would have recorded is put in its place
when each request arrives. The real engine is in tests/e2e/test_engine_seconds_vllm.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from stagelens.exporters.vllm_join import EngineSecondsMiddleware, RecentShares

from stagelens import engine_join
from stagelens import semconv as sc
from stagelens.testing import capture_telemetry
from tests._scaffold import Served
from tests.instrumentation.conftest import build_proxy, gateway_client, make_upstream
from tests.instrumentation.test_stream_bytes import (
    _chunked,
    _sse_call,
    _usage_events_removed,
    streams,
)

SECONDS = 0.125


class _PluginStandIn:
    """Records a share for each stagelens request as it arrives, as the plugin would when
    the request finished (the middleware takes it when the answer ends)."""

    def __init__(self, app: Any, recent: RecentShares, gpus: int) -> None:
        self.app, self.recent, self.gpus = app, recent, gpus
        self.ids: list[str] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        for name, value in scope.get("headers", ()):
            if name == b"x-request-id":
                self.ids.append(value.decode())
                found = engine_join.read_id(value.decode())
                if found is not None:
                    self.recent.put(found[0], SECONDS, self.gpus)
        await self.app(scope, receive, send)


@pytest.fixture(scope="module", params=[0, 2], ids=["cpu", "two-gpus"])
def vllm(request: pytest.FixtureRequest) -> Iterator[tuple[str, _PluginStandIn]]:
    recent = RecentShares()
    plugin = _PluginStandIn(make_upstream(), recent, request.param)
    with Served(EngineSecondsMiddleware(plugin, recent), lifespan="off") as served:
        yield served.url, plugin


def _tenant(scope: Any) -> str:
    return "acme-corp"


@pytest.mark.anyio
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_the_engines_share_reaches_the_span_and_the_tenants_counter(
    cap, vllm, stream: bool
) -> None:
    url, plugin = vllm
    app, upstream = build_proxy(cap, url, auth_hook=_tenant)
    async with gateway_client(app) as client:
        body = {"model": "tiny", "messages": [], "stream": stream, "x_chunks": 3}
        answer = await client.post("/v1/chat/completions", json=body)
    await upstream.aclose()
    assert answer.status_code == 200
    assert b"x-stagelens-engine" not in answer.content  # removed: the client reads vLLM's
    sent = plugin.ids[-1]
    assert engine_join.read_id(sent)[1] == "acme-corp"  # the tenant reached the engine
    span = next(s for s in cap.spans() if s.name == "chat tiny")
    assert span.attributes[sc.ATTR_ENGINE_SECONDS] == pytest.approx(SECONDS)
    gpus = 2 if vllm[1].gpus else 0
    if gpus:
        assert span.attributes[sc.ATTR_ENGINE_GPU_SECONDS] == pytest.approx(SECONDS * gpus)
    else:
        assert sc.ATTR_ENGINE_GPU_SECONDS not in span.attributes
    value = cap.value(sc.ENGINE_SECONDS, model="tiny", tenant="acme-corp")
    assert value == pytest.approx(SECONDS)


@pytest.mark.anyio
async def test_a_stream_reaches_the_client_as_vllm_wrote_it(cap, vllm, upstream) -> None:
    """The same request through the gateway to vLLM with and without the middleware: the
    client reads the same bytes."""
    url, _ = vllm
    bodies = []
    for target in (url, upstream.state.url):
        app, client_upstream = build_proxy(cap, target)
        async with gateway_client(app) as client:
            body = {"model": "tiny", "messages": [], "stream": True, "x_chunks": 4}
            answer = await client.post("/v1/chat/completions", json=body)
            bodies.append(answer.content.replace(_ids(answer.content), b""))
        await client_upstream.aclose()
    assert bodies[0] == bodies[1]


def _ids(content: bytes) -> bytes:
    """The request id vLLM echoes in each event (differs between two requests)."""
    start = content.index(b"chatcmpl-") + len(b"chatcmpl-")
    return content[start : content.index(b'"', start)]


@pytest.mark.anyio
async def test_without_the_engines_answer_nothing_is_recorded(cap, upstream) -> None:
    """A vLLM without the middleware: no attribute, no series (not a zero)."""
    app, client_upstream = build_proxy(cap, upstream.state.url)
    async with gateway_client(app) as client:
        await client.post("/v1/chat/completions", json={"model": "tiny", "messages": []})
    await client_upstream.aclose()
    span = next(s for s in cap.spans() if s.name == "chat tiny")
    assert sc.ATTR_ENGINE_SECONDS not in span.attributes
    assert cap.value(sc.ENGINE_SECONDS, model="tiny", tenant="other") is None


COMMENT = engine_join.engine_comment(0.25, 1)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    before=streams(raw=False),
    after=streams(raw=False),
    cuts=st.lists(st.integers(0, 400), max_size=8),
    asked=st.booleans(),
)
def test_the_engine_comment_is_read_and_removed_however_the_stream_is_chunked(
    before: bytes, after: bytes, cuts: list[int], asked: bool
) -> None:
    """Between any events, any chunking: the figure is read, and the app reads the stream
    without the comment; only a comment split over two chunks while nothing is held back
    (stagelens did not ask for the usage event) reaches the app, whole (its first part was
    handed over before it could be known)."""
    stream = before + COMMENT + after
    chunks = _chunked(stream, cuts)
    with capture_telemetry() as cap:
        payload: dict[str, Any] = {"model": "tiny", "stream": True}
        if not asked:
            payload["stream_options"] = {"include_usage": True}
        call = _sse_call(cap.telemetry, None, payload)
        out = b"".join(call.on_chunk(chunk) for chunk in chunks) + call.flush()
        call.finish()
    assert call._engine_share == (0.25, 1)
    expected = _usage_events_removed(stream) if asked else stream
    start = len(before)
    split = any(start < c < start + len(COMMENT) for c in cuts)
    if asked or not split:
        expected = expected.replace(COMMENT, b"", 1)
    assert out == expected
