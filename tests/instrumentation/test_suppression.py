"""``opentelemetry.instrumentation.utils`` suppression is honoured as contrib instrumentors
honour it: inside ``suppress_instrumentation()`` (and, for HTTP, inside
``suppress_http_instrumentation()``) stagelens makes no span, adds no header and records
no metric; the app's work runs unchanged."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import httpx
import pytest
from opentelemetry.instrumentation.utils import (
    suppress_http_instrumentation,
    suppress_instrumentation,
)

from stagelens import Stage, instrument_httpx_client, stage
from stagelens import semconv as sc
from stagelens.telemetry import set_default_telemetry

BODY = {"model": "tiny", "stream": True, "messages": [], "x_chunks": 3}
HTTP_SUPPRESSIONS = pytest.mark.parametrize(
    "suppressed",
    [suppress_instrumentation, suppress_http_instrumentation],
    ids=["all", "http"],
)


def _no_upstream_telemetry(cap: Any, upstream: Any, seen_before: int) -> None:
    """No inference span, no metric, and the upstream got neither trace context nor id."""
    assert cap.spans() == []
    assert cap.value(sc.STAGE_DURATION + "_count", stage="inference", model="tiny") is None
    (headers,) = upstream.state.seen_headers[seen_before:]
    assert "traceparent" not in headers
    assert sc.HEADER_REQUEST_ID.lower() not in headers


@pytest.mark.anyio
class TestAsyncUpstream:
    """The async transport under suppression."""

    @HTTP_SUPPRESSIONS
    async def test_a_suppressed_call_passes_through(
        self, cap, upstream, suppressed: Callable[[], AbstractContextManager[None]]
    ) -> None:
        """The call is answered as usual, with nothing of stagelens on it."""
        client = httpx.AsyncClient(base_url=upstream.state.url, timeout=10)
        instrument_httpx_client(client, telemetry=cap.telemetry)
        before = len(upstream.state.seen_headers)
        async with client:
            with suppressed():
                response = await client.post("/v1/chat/completions", json=BODY)
        assert response.text.endswith("data: [DONE]\n\n")
        _no_upstream_telemetry(cap, upstream, before)


class TestSyncUpstream:
    """The sync transport under suppression."""

    @HTTP_SUPPRESSIONS
    def test_a_suppressed_call_passes_through(
        self, cap, upstream, suppressed: Callable[[], AbstractContextManager[None]]
    ) -> None:
        """The sync call is answered as usual, with nothing of stagelens on it."""
        client = httpx.Client(base_url=upstream.state.url, timeout=10)
        instrument_httpx_client(client, telemetry=cap.telemetry)
        before = len(upstream.state.seen_headers)
        with client, suppressed():
            response = client.post("/v1/chat/completions", json=BODY)
        assert response.text.endswith("data: [DONE]\n\n")
        _no_upstream_telemetry(cap, upstream, before)


@pytest.fixture
def default_is(cap: Any) -> Iterator[Any]:
    """Make the capture the default Telemetry (stage() outside a request uses it)."""
    set_default_telemetry(cap.telemetry)
    yield cap
    set_default_telemetry(None)


class TestSyncStage:
    """stage() as a context manager and decorator under suppression."""

    def test_a_suppressed_stage_records_nothing(self, default_is) -> None:
        """No span and no stage observation; the block runs and its exception propagates."""

        @stage("retrieval")
        def retrieve() -> str:
            return "found"

        with suppress_instrumentation():
            with stage(Stage.TOKENIZER) as block:
                assert not block.span.is_recording()
            assert retrieve() == "found"
            with pytest.raises(KeyError), stage(Stage.ROUTER):
                raise KeyError("k")
        assert default_is.spans() == []
        for name in ("tokenizer", "retrieval", "router"):
            assert (
                default_is.value(sc.STAGE_DURATION + "_count", stage=name, model="unknown") is None
            )
        with stage(Stage.TOKENIZER):  # and back on once the suppression ends
            pass
        assert default_is.span_names() == ["tokenizer"]


@pytest.mark.anyio
class TestAsyncStage:
    """stage() as an async context manager under suppression."""

    async def test_a_suppressed_async_stage_records_nothing(self, default_is) -> None:
        """No span and no observation for ``async with stage(...)``."""
        with suppress_instrumentation():
            async with stage(Stage.ROUTER):
                pass
        assert default_is.spans() == []
        assert (
            default_is.value(sc.STAGE_DURATION + "_count", stage="router", model="unknown") is None
        )


@pytest.mark.anyio
class TestMiddleware:
    """The ASGI middleware under suppression."""

    @HTTP_SUPPRESSIONS
    async def test_a_suppressed_request_is_served_without_telemetry(
        self, cap, proxy_factory, client_factory, suppressed: Callable[[], Any]
    ) -> None:
        """The app answers as usual; no root span, stage span or request metric exists."""
        app, upstream_client = proxy_factory(cap)
        async with client_factory(app) as gateway, upstream_client:
            with suppressed():
                response = await gateway.post("/v1/chat/completions", json=BODY)
            assert response.status_code == 200
            assert response.text.endswith("data: [DONE]\n\n")
            assert cap.spans() == []
            assert cap.value(sc.REQUESTS, model="tiny", code="200") is None
            await gateway.post("/v1/chat/completions", json=BODY)  # unsuppressed: recorded
        assert cap.value(sc.REQUESTS, model="tiny", code="200") == 1


@pytest.mark.parametrize("plain", [False, True], ids=["", "plain-key"])
@pytest.mark.parametrize("every", [False, True], ids=["", "all"])
@pytest.mark.parametrize("http", [False, True], ids=["", "http"])
def test_one_lookup_reads_what_the_public_functions_read(
    plain: bool, every: bool, http: bool
) -> None:
    """The suppression keys are read where ``stagelens._compat`` says (the one-lookup
    readers are active) and answer as ``is_(http_)instrumentation_enabled()`` do, for
    every combination of keys set."""
    from opentelemetry import context
    from opentelemetry.instrumentation.utils import (
        is_http_instrumentation_enabled,
        is_instrumentation_enabled,
    )
    from stagelens.instrumentation import _suppress

    from stagelens import _compat

    keys = _compat.suppression_keys()
    assert keys is not None
    (every_key, plain_key), (*_, http_key) = keys
    assert _suppress.http_instrumentation_enabled is not is_http_instrumentation_enabled
    ctx = context.get_current()
    for key, on in ((every_key, every), (plain_key, plain), (http_key, http)):
        if on:
            ctx = context.set_value(key, True, ctx)
    token = context.attach(ctx)
    try:
        assert _suppress.instrumentation_enabled() is is_instrumentation_enabled()
        assert _suppress.http_instrumentation_enabled() is is_http_instrumentation_enabled()
        assert is_http_instrumentation_enabled() is not (every or plain or http)
    finally:
        context.detach(token)
