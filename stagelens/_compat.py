"""Every private name of a third-party library that stagelens uses, in one place.

Why one module: a private attribute can change in any release. Named here, each with the
versions it was tested on, an upgrade that moves one is found by reading one file, and
each fast path has a test (tests/test_compat.py) that asserts it is active on the
installed versions and that its public fallback gives the same result. Where there is no
public way at all, the fallback is stated.

Nothing here imports the libraries at module import: each function takes the library's
object, or imports lazily, so that importing this module costs nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Final

# --- httpx / httpcore ---
# Tested with httpx 0.28.1 and httpcore 1.0.9 (pyproject: httpx>=0.28.1). Private names:
# - ``Client._transport`` / ``AsyncClient._transport``: the client's default transport.
#   httpx has no public way to swap it after construction (opentelemetry-instrumentation-
#   httpx replaces it the same way). Fallback: none; a client without it is left alone.
# - ``Client._mounts`` / ``AsyncClient._mounts``: {URL pattern: transport or None}, the
#   transports of proxies (``HTTP(S)_PROXY``, ``proxy=``) and of ``mounts=``. Fallback:
#   none; without it only the default transport is instrumented.
# - ``Headers._list``: the (raw name, lower-cased name, value) entries of a header set.
#   Fallback: the public mapping API (same result, tested).
# - ``Request._content``: the body ``Request.content`` returns, set beside ``Request.stream``
#   when the upstream instrumentation asks a stream for its usage event (httpx has no
#   public way to replace a built request's body). Fallback: none needed; written as
#   ``Request.read()`` writes it.
# - ``httpx._transports.default.AsyncResponseStream``, its ``_httpcore_stream`` and
#   ``map_httpcore_exceptions``: the default transport's body relays httpcore's stream
#   inside httpx's exception mapping. Fallback: the stream iterated as it is (same chunks,
#   same exceptions, tested).
# And of opentelemetry-api (1.45.2) and opentelemetry-instrumentation (0.66b2), used by the
# same instrumentation (and by ``stage()`` and the middleware for suppression):
# - ``CompositePropagator._propagators``: to recognise the default W3C pair. Fallback:
#   ``propagate.inject`` (same headers, tested).
# - ``opentelemetry.context._SUPPRESS_INSTRUMENTATION_KEY``,
#   ``_SUPPRESS_HTTP_INSTRUMENTATION_KEY`` and ``opentelemetry.instrumentation.utils.
#   _SUPPRESS_INSTRUMENTATION_KEY_PLAIN``: the context keys ``suppress_instrumentation()``
#   and ``suppress_http_instrumentation()`` set, read from one context lookup (the public
#   ``is_instrumentation_enabled()`` makes one per key: about 1 % of a request's cost
#   over a request's seven checks). Fallback: those public functions (same answer, tested).

HTTPX_TESTED: Final = "0.28.1"
HTTPCORE_TESTED: Final = "1.0.9"


def client_transports(client: Any) -> tuple[Any, dict[Any, Any] | None]:
    """A client's default transport (None where this httpx keeps none) and its mounts
    ({pattern: transport or None}; None where this httpx keeps none)."""
    mounts = getattr(client, "_mounts", None)
    transport = getattr(client, "_transport", None)
    return transport, dict(mounts) if isinstance(mounts, dict) else None


def set_client_transports(client: Any, transport: Any, mounts: dict[Any, Any] | None) -> None:
    """Give ``client`` this default transport and these mounts (same patterns, same order:
    httpx matches them in the order it sorted them at construction)."""
    if transport is not None:
        client._transport = transport
    if mounts is not None:
        client._mounts = mounts


def set_request_body(request: Any, body: bytes) -> None:
    """Replace a built ``httpx.Request``'s body: what is sent (``stream``), what
    ``request.content`` returns, and ``Content-Length``."""
    import httpx

    request.stream = httpx.ByteStream(body)
    request._content = body
    request.headers["Content-Length"] = str(len(body))


def header_entries(headers: Any) -> list[tuple[bytes, bytes, bytes]] | None:
    """httpx's (raw name, lower-cased name, value) entries of ``headers``, the list itself;
    None where it is not as expected (the public API is used then)."""
    entries = getattr(headers, "_list", None)
    if type(entries) is not list or (entries and len(entries[0]) != 3):
        return None
    return entries


def httpx_default_stream() -> tuple[type | None, Callable[[], AbstractContextManager[Any]]]:
    """httpx's ``AsyncResponseStream`` (the body type of its default async transport) and
    ``map_httpcore_exceptions``; (None, nullcontext) when an httpx moves them."""
    try:
        from httpx._transports import default
    except ImportError:  # pragma: no cover - depends on the installed httpx
        return None, nullcontext
    stream_type = getattr(default, "AsyncResponseStream", None)
    mapping = getattr(default, "map_httpcore_exceptions", None)
    if not isinstance(stream_type, type) or not callable(mapping):
        return None, nullcontext  # pragma: no cover - depends on the installed httpx
    return stream_type, mapping


def httpcore_stream(stream: Any) -> Any:
    """The httpcore stream an ``AsyncResponseStream`` relays; None when not readable."""
    inner = getattr(stream, "_httpcore_stream", None)
    return inner if hasattr(inner, "__aiter__") else None


def composite_propagators(textmap: Any) -> Sequence[Any] | None:
    """The propagators inside an OTel ``CompositePropagator``; None when not readable."""
    found = getattr(textmap, "_propagators", None)
    return found if isinstance(found, list | tuple) else None


def suppression_keys() -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """(the context keys that suppress all instrumentation, those that suppress HTTP
    instrumentation), as ``opentelemetry.instrumentation.utils`` reads them; None when
    these versions keep them elsewhere."""
    from opentelemetry import context
    from opentelemetry.instrumentation import utils

    every = getattr(context, "_SUPPRESS_INSTRUMENTATION_KEY", None)
    http = getattr(context, "_SUPPRESS_HTTP_INSTRUMENTATION_KEY", None)
    plain = getattr(utils, "_SUPPRESS_INSTRUMENTATION_KEY_PLAIN", None)
    if not (isinstance(every, str) and isinstance(http, str) and isinstance(plain, str)):
        return None  # pragma: no cover - depends on the installed versions
    return (every, plain), (every, plain, http)


# --- end httpx / httpcore ---
