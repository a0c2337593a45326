"""instrument_httpx_client / uninstrument_httpx_client: every transport of a client (the
default one, proxies from ``HTTP_PROXY``, ``mounts=``) is instrumented, and undone exactly.

The proxy is a real loopback HTTP forward proxy (absolute-form requests, no CONNECT), so a
request really travels client -> proxy -> upstream and the upstream's headers show what
the proxied request carried.
"""

from __future__ import annotations

import asyncio
import threading
import urllib.parse
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from stagelens.instrumentation.httpx import StageLensAsyncTransport, StageLensTransport

from stagelens import instrument_httpx_client, uninstrument_httpx_client
from stagelens import semconv as sc
from stagelens.testing import TelemetryCapture

BODY = {"model": "tiny", "stream": True, "messages": [], "x_chunks": 4}
_HOP_BY_HOP = {"connection", "proxy-connection", "keep-alive", "proxy-authorization"}


class ForwardProxy:
    """A loopback HTTP forward proxy: one request per connection, forwarded to the host
    its absolute URL names, the answer piped back byte for byte."""

    def __init__(self) -> None:
        self.targets: list[str] = []
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.base_events.Server | None = None
        self.url = ""

    def start(self) -> None:
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(self._loop)
            self._server = self._loop.run_until_complete(
                asyncio.start_server(self._handle, "127.0.0.1", 0)
            )
            port = self._server.sockets[0].getsockname()[1]
            self.url = f"http://127.0.0.1:{port}"
            ready.set()
            self._loop.run_forever()

        threading.Thread(target=run, daemon=True).start()
        assert ready.wait(10)

    def stop(self) -> None:
        def close() -> None:
            assert self._server is not None
            self._server.close()
            self._loop.stop()

        self._loop.call_soon_threadsafe(close)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            line, *lines = head.decode("latin-1").split("\r\n")
            method, target, _ = line.split(" ")
            self.targets.append(target)
            url = urllib.parse.urlsplit(target)
            headers = [h.split(":", 1) for h in lines if h]
            length = int(next((v for k, v in headers if k.lower() == "content-length"), "0"))
            body = await reader.readexactly(length)
            up_reader, up_writer = await asyncio.open_connection(url.hostname, url.port)
            kept = [f"{k}:{v}" for k, v in headers if k.strip().lower() not in _HOP_BY_HOP]
            path = url.path + (f"?{url.query}" if url.query else "")
            request = [f"{method} {path} HTTP/1.1", *kept, "Connection: close", "", ""]
            up_writer.write("\r\n".join(request).encode("latin-1") + body)
            while data := await up_reader.read(65536):
                writer.write(data)
                await writer.drain()
            up_writer.close()
        finally:
            writer.close()


@pytest.fixture(scope="module")
def forward_proxy() -> Iterator[ForwardProxy]:
    """The loopback forward proxy, for this module."""
    proxy = ForwardProxy()
    proxy.start()
    yield proxy
    proxy.stop()


@pytest.fixture
def proxied_env(monkeypatch: pytest.MonkeyPatch, forward_proxy: ForwardProxy) -> ForwardProxy:
    """``HTTP_PROXY`` names the forward proxy; nothing exempts loopback from it."""
    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy", "http_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", forward_proxy.url)
    forward_proxy.targets.clear()
    return forward_proxy


def _assert_instrumented(cap: TelemetryCapture, upstream: Any, seen_before: int) -> None:
    """The call made an inference span with usage, and the upstream got its trace context."""
    span = cap.span("chat tiny")
    assert span.attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 16
    headers = upstream.state.seen_headers[seen_before:]
    assert len(headers) == 1
    trace_id = f"{span.context.trace_id:032x}"
    assert headers[0]["traceparent"].split("-")[1] == trace_id
    assert sc.HEADER_REQUEST_ID.lower() in headers[0]


def _transports(client: httpx.AsyncClient | httpx.Client) -> list[Any]:
    return [client._transport, *client._mounts.values()]


@pytest.mark.anyio
class TestAsyncClient:
    """An ``httpx.AsyncClient`` with a proxy or mounts."""

    async def test_a_call_through_an_environment_proxy_is_instrumented(
        self, cap, upstream, proxied_env
    ) -> None:
        """With ``HTTP_PROXY`` set the call goes through the proxy's mount: it still gets
        the inference span, ``traceparent`` and usage."""
        client = httpx.AsyncClient(base_url=upstream.state.url, timeout=10)
        assert client._mounts  # httpx really mounted the proxy
        instrument_httpx_client(client, telemetry=cap.telemetry)
        before = len(upstream.state.seen_headers)
        async with client:
            response = await client.post("/v1/chat/completions", json=BODY)
        assert response.status_code == 200
        assert proxied_env.targets == [f"{upstream.state.url}/v1/chat/completions"]
        _assert_instrumented(cap, upstream, before)

    async def test_a_call_through_an_explicit_mount_is_instrumented(self, cap, upstream) -> None:
        """A transport given with ``mounts=`` is instrumented like the default one."""
        mounted = httpx.AsyncHTTPTransport()
        client = httpx.AsyncClient(
            base_url=upstream.state.url, mounts={"http://127.0.0.1": mounted}, timeout=10
        )
        instrument_httpx_client(client, telemetry=cap.telemetry)
        (ours,) = client._mounts.values()
        assert isinstance(ours, StageLensAsyncTransport)
        assert ours.wrapped is mounted
        before = len(upstream.state.seen_headers)
        async with client:
            await client.post("/v1/chat/completions", json=BODY)
        _assert_instrumented(cap, upstream, before)

    async def test_uninstrument_restores_the_original_transports(
        self, cap, upstream, proxied_env
    ) -> None:
        """Uninstrumenting puts back the very transports the client had, mounts included,
        and calls are no longer instrumented; both calls are idempotent."""
        client = httpx.AsyncClient(base_url=upstream.state.url, timeout=10)
        original = _transports(client)
        instrument_httpx_client(client, telemetry=cap.telemetry)
        instrument_httpx_client(client, telemetry=cap.telemetry)
        wrapped = _transports(client)
        assert all(isinstance(t, StageLensAsyncTransport) for t in wrapped)
        assert [t.wrapped for t in wrapped] == original
        uninstrument_httpx_client(client)
        uninstrument_httpx_client(client)
        assert all(a is b for a, b in zip(_transports(client), original, strict=True))
        async with client:
            await client.post("/v1/chat/completions", json=BODY)
        assert "chat tiny" not in cap.span_names()

    async def test_an_apps_own_stagelens_transport_stays(self, cap) -> None:
        """A transport the app built as a stagelens one is not wrapped again, and
        uninstrumenting leaves it in place."""
        own = StageLensAsyncTransport(httpx.AsyncHTTPTransport(), cap.telemetry)
        client = httpx.AsyncClient(transport=own)
        instrument_httpx_client(client, telemetry=cap.telemetry)
        assert client._transport is own
        uninstrument_httpx_client(client)
        assert client._transport is own
        await client.aclose()


class TestSyncClient:
    """An ``httpx.Client`` with a proxy."""

    def test_a_call_through_an_environment_proxy_is_instrumented(
        self, cap, upstream, proxied_env
    ) -> None:
        """The sync client's proxy mount gets the same instrumentation."""
        client = httpx.Client(base_url=upstream.state.url, timeout=10)
        instrument_httpx_client(client, telemetry=cap.telemetry)
        assert all(isinstance(t, StageLensTransport) for t in _transports(client))
        before = len(upstream.state.seen_headers)
        with client:
            response = client.post("/v1/chat/completions", json=BODY)
        assert response.status_code == 200
        assert proxied_env.targets == [f"{upstream.state.url}/v1/chat/completions"]
        _assert_instrumented(cap, upstream, before)

    def test_uninstrument_restores_the_original_transports(
        self, cap, upstream, proxied_env
    ) -> None:
        """The sync client gets its own transports back, and calls are plain again."""
        client = httpx.Client(base_url=upstream.state.url, timeout=10)
        original = _transports(client)
        instrument_httpx_client(client, telemetry=cap.telemetry)
        uninstrument_httpx_client(client)
        assert all(a is b for a, b in zip(_transports(client), original, strict=True))
        with client:
            client.post("/v1/chat/completions", json=BODY)
        assert "chat tiny" not in cap.span_names()
