"""The ASGI side of the middleware: the types, the request's headers and body, and how a
server tells that the client has gone. Plain functions of the scope and its messages, with
no telemetry state.
"""

from __future__ import annotations

import asyncio
import inspect
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from opentelemetry.propagators.textmap import Getter

from stagelens import _compat
from stagelens import semconv as sc
from stagelens.request import RequestState

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class _HeaderGetter(Getter[Scope]):
    """Read W3C trace headers from an ASGI scope."""

    def get(self, carrier: Scope, key: str) -> list[str] | None:
        name = key.lower().encode("latin-1")
        values = [v.decode("latin-1") for k, v in carrier.get("headers", ()) if k == name]
        return values or None

    def keys(self, carrier: Scope) -> list[str]:
        return [k.decode("latin-1") for k, _ in carrier.get("headers", ())]


HEADERS = _HeaderGetter()
"""The getter ``propagate.extract`` reads a request's trace headers with."""
FASTAPI_TELEMETRY = _compat.FASTAPI_TELEMETRY_SCOPE_KEY


async def maybe_await(value: Any) -> Any:
    if inspect.isawaitable(value):
        return await value
    return value


async def read_body(receive: Receive) -> tuple[bytes, Receive]:
    """Read the whole request body; return it and a receive that replays it first."""
    chunks: list[bytes] = []
    pending: Message | None = None
    while True:
        message = await receive()
        if message["type"] != "http.request":
            pending = message  # the client left while sending: replay that instead
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    body = b"".join(chunks)
    replayed = False

    async def replay() -> Message:
        nonlocal replayed
        if not replayed:
            replayed = True
            if pending is not None:
                return pending
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return body, replay


SPEC_2_4: dict[str, bool] = {}
"""ASGI ``spec_version`` strings seen, and whether each is 2.4 or later."""


def reports_departure_by_send(scope: Scope) -> bool:
    """Under ASGI spec >= 2.4 a departed client shows as a send that raises ``OSError``
    (Starlette then stops listening on ``receive``); before 2.4, as ``http.disconnect``
    from ``receive``, which ``wrapped_receive`` notes."""
    spec = scope.get("asgi", {}).get("spec_version", "2.0")
    found = SPEC_2_4.get(spec)
    if found is None:
        try:
            found = tuple(int(part) for part in str(spec).split(".")) >= (2, 4)
        except ValueError:
            found = True  # unknown: assume the newer behaviour (catching costs little)
        SPEC_2_4[spec] = found
    return found


def noting_departure(send: Send, state: RequestState) -> Send:
    """``send`` that marks the request disconnected when it raises ``OSError``, so that
    the upstream stream closed on the way out records the client's departure."""

    async def send_noting_departure(message: Message) -> None:
        try:
            await send(message)
        except OSError:
            state.disconnected = True
            raise

    return send_noting_departure


def expects_continue(scope: Scope) -> bool:
    """The client sent ``Expect: 100-continue`` (it waits to be asked for its body)."""
    return any(
        key.lower() == b"expect" and value.lower() == b"100-continue"
        for key, value in scope.get("headers", ())
    )


def is_cancellation(error: BaseException) -> bool:
    """The request was cut short by the client leaving (or the server cancelling it).

    A send to a departed client raises ``OSError``; frameworks may turn that into their
    own exception raised while handling it (Starlette's ``ClientDisconnect`` under ASGI
    spec >= 2.4), so the error's context counts too.
    """
    return isinstance(error, asyncio.CancelledError | OSError) or isinstance(
        error.__context__, OSError
    )


def known_http_methods() -> frozenset[str]:
    """``OTEL_INSTRUMENTATION_HTTP_KNOWN_METHODS`` (comma-separated, case-sensitive, a full
    replacement, as HTTP semconv requires of an instrumentation that maps methods to
    ``_OTHER``) or semconv's default list."""
    raw = os.environ.get(sc.ENV_HTTP_KNOWN_METHODS, "")
    given = frozenset(m.strip() for m in raw.split(",") if m.strip())
    return given or sc.HTTP_KNOWN_METHODS


def server_attributes(scope: Scope, method: str, known: bool) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        sc.HTTP_REQUEST_METHOD: method if known else sc.HTTP_METHOD_OTHER,
        sc.URL_PATH: scope.get("path", ""),
        sc.URL_SCHEME: scope.get("scheme", "http"),
    }
    if not known:
        attributes[sc.HTTP_REQUEST_METHOD_ORIGINAL] = method
    server = scope.get("server")
    if server:
        attributes[sc.SERVER_ADDRESS] = str(server[0])
        if server[1] is not None:
            attributes[sc.SERVER_PORT] = int(server[1])
    client = scope.get("client")
    if client:
        attributes[sc.CLIENT_ADDRESS] = str(client[0])
    return attributes
