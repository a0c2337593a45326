"""Root span names stay bounded: a method that is not known is named ``HTTP`` and recorded
as ``_OTHER``, with the method the client sent beside it (HTTP semconv)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from stagelens.instrumentation.asgi import StageLensMiddleware

from stagelens import semconv
from stagelens.testing import TRACERS, capture_telemetry

TOKEN = st.from_regex(r"[A-Za-z0-9!#$%&'*+.^_`|~-]{1,24}", fullmatch=True)
"""Any method a client can put on a request line (an RFC 9110 token)."""


async def _answer(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 405, "headers": []})
    await send({"type": "http.response.body", "body": b""})


def _serve(method: str, tracer: Any = "deferred") -> Any:
    """The root span of one ``method /v1/models`` request through the middleware."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": "/v1/models",
        "raw_path": b"/v1/models",
        "query_string": b"",
        "headers": [],
        "client": ("127.0.0.1", 5000),
        "server": ("127.0.0.1", 8080),
    }

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Any) -> None:
        pass

    with capture_telemetry(tracer=tracer) as cap:
        asyncio.run(StageLensMiddleware(_answer, telemetry=cap.telemetry)(scope, receive, send))
        (root,) = (s for s in cap.spans() if s.parent is None)
        return root


class TestMethodNames:
    """Sync: the root span's name and method attributes for any method."""

    @settings(max_examples=60, deadline=None)
    @given(method=TOKEN.filter(lambda m: m not in semconv.HTTP_KNOWN_METHODS))
    def test_an_unknown_method_never_names_a_span(self, method: str) -> None:
        """A made-up method (``get`` too: methods are case-sensitive) gives the name
        ``HTTP``, ``http.request.method=_OTHER`` and the sent method as the original."""
        root = _serve(method)
        assert root.name == semconv.HTTP_SPAN_NAME_OTHER
        assert root.attributes[semconv.HTTP_REQUEST_METHOD] == semconv.HTTP_METHOD_OTHER
        assert root.attributes[semconv.HTTP_REQUEST_METHOD_ORIGINAL] == method

    @pytest.mark.parametrize("tracer", TRACERS)
    @pytest.mark.parametrize("method", sorted(semconv.HTTP_KNOWN_METHODS))
    def test_a_known_method_names_the_span(self, method: str, tracer: str) -> None:
        """Each of semconv's methods is its own name and value, with no original."""
        root = _serve(method, tracer)
        assert root.name == method
        assert root.attributes[semconv.HTTP_REQUEST_METHOD] == method
        assert semconv.HTTP_REQUEST_METHOD_ORIGINAL not in root.attributes

    def test_the_known_methods_can_be_replaced(self, monkeypatch) -> None:
        """``OTEL_INSTRUMENTATION_HTTP_KNOWN_METHODS`` replaces the default list."""
        monkeypatch.setenv(semconv.ENV_HTTP_KNOWN_METHODS, "GET, PURGE")
        assert _serve("PURGE").name == "PURGE"
        post = _serve("POST")
        assert post.name == semconv.HTTP_SPAN_NAME_OTHER
        assert post.attributes[semconv.HTTP_REQUEST_METHOD_ORIGINAL] == "POST"


@pytest.mark.anyio
class TestRoutedMethodNames:
    """Async: through FastAPI, where a matched route renames the root span."""

    async def test_an_unknown_method_on_a_route_keeps_http(
        self, cap, proxy_factory, client_factory
    ) -> None:
        """A junk method on the chat route is answered 405 and its span is not named by it."""
        app, _ = proxy_factory(cap)
        async with client_factory(app) as client:
            r = await client.request("BREW", "/v1/chat/completions")
        assert r.status_code == 405
        (root,) = (s for s in cap.spans() if s.parent is None)
        assert root.name == f"{semconv.HTTP_SPAN_NAME_OTHER} /v1/chat/completions"
        assert root.attributes[semconv.HTTP_REQUEST_METHOD_ORIGINAL] == "BREW"
