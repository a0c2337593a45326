"""Every private name of a third-party package that stagelens reads, in one place.

Why: a few shortcuts on the request path and in the span exporter read internals that
their packages do not promise to keep (a histogram's bucket storage, the OTLP exporter's
HTTP client). Each is named here once, with the version it was tested on, behind a
function that returns None (or the public equivalent) when the internal is not as tested,
so a future release falls back to the public API instead of failing. For each one
``tests/test_compat.py`` asserts that the shortcut is active on the installed versions and
that its public fallback gives the same result. ``pyproject.toml``'s lower bounds are the
tested versions.

Sections are per package; a module that needs another package's internals adds its own
section rather than reading them where it uses them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Final, NamedTuple, Protocol, runtime_checkable

from stagelens._plain import plain

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.propagators.textmap import TextMapPropagator
    from opentelemetry.sdk.metrics.export import AggregationTemporality, MetricExporter
    from opentelemetry.sdk.metrics.view import Aggregation
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.util.types import Attributes

# --- prometheus-client -------------------------------------------------------------------

PROMETHEUS_CLIENT_TESTED: Final = "0.26.0"
"""The prometheus-client release the internals below were read from and tested on."""


_MULTIPROC_ENV: Final = ("PROMETHEUS_MULTIPROC_DIR", "prometheus_multiproc_dir")
"""Either selects prometheus-client's multiprocess mode (the second is its old name)."""


def in_process_values() -> bool:
    """True when prometheus-client keeps metric values in this process, False in its
    multiprocess mode (values in files that a scrape reads from every worker).

    Private: ``prometheus_client.values.ValueClass`` (chosen once, when the package is
    imported) compared with ``values.MutexValue``. Fallback: the environment variable that
    selects multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``, or its old lower-case name),
    as prometheus-client reads it.
    """
    from prometheus_client import values

    value_class = getattr(values, "ValueClass", None)
    mutex = getattr(values, "MutexValue", None)
    if value_class is None or mutex is None:
        return not any(name in os.environ for name in _MULTIPROC_ENV)
    return bool(value_class is mutex)


class HistogramStorage(NamedTuple):
    """Where one histogram child keeps its counts (see ``histogram_storage``)."""

    bounds: list[float]
    """The upper bounds, ``+Inf`` last."""
    buckets: list[Any]
    """One value per bound (not cumulative); each has ``inc(amount)``."""
    total: Any
    """The sum's value; has ``inc(amount)``."""


def histogram_storage(child: Any) -> HistogramStorage | None:
    """The bucket storage of a histogram child, or None when it is not as tested (then
    ``child.observe()`` is the public fallback).

    Private: ``_upper_bounds``, ``_buckets`` and ``_sum`` (unchanged since 0.4; the same in
    multiprocess mode, where the values are file-backed).
    """
    if plain("series_storage"):
        return None
    bounds = getattr(child, "_upper_bounds", None)
    buckets = getattr(child, "_buckets", None)
    total = getattr(child, "_sum", None)
    if (
        isinstance(bounds, list)
        and isinstance(buckets, list)
        and bounds
        and len(bounds) == len(buckets)
        and bounds[-1] == float("inf")
        and callable(getattr(total, "inc", None))
        and all(callable(getattr(b, "inc", None)) for b in buckets)
    ):
        return HistogramStorage(bounds, buckets, total)
    return None


def exemplar_storage(storage: HistogramStorage | None) -> list[Any] | None:
    """The bucket values of ``storage`` when each can hold an exemplar (has
    ``set_exemplar(Exemplar)``), or None when not as tested (then ``child.observe(value,
    exemplar)`` is the public fallback: it counts the value and keeps its exemplar).

    Private: the values' ``set_exemplar``, which ``Histogram.observe(amount, exemplar)``
    calls on the bucket the amount falls in (unchanged since exemplars came, 0.10). In
    multiprocess mode it exists and keeps nothing: the files hold no exemplars.
    """
    if storage is None:
        return None
    buckets = storage.buckets
    if all(callable(getattr(b, "set_exemplar", None)) for b in buckets):
        return buckets
    return None


def counter_storage(child: Any) -> Any | None:
    """The value of a counter child (has ``inc(amount)``), or None when it is not as
    tested (then ``child.inc()`` is the public fallback).

    Private: ``_value``.
    """
    if plain("series_storage"):
        return None
    value = getattr(child, "_value", None)
    return value if callable(getattr(value, "inc", None)) else None


# --- opentelemetry-api / opentelemetry-sdk / opentelemetry-exporter-otlp-proto-http -------

OPENTELEMETRY_TESTED: Final = "1.45.2"
"""The opentelemetry-api, -sdk and -exporter-otlp-proto-http release the internals below
were read from and tested on."""


class _Result(Protocol):
    success: bool


class OtlpHttpClient(Protocol):
    """What the SDK's OTLP/HTTP span exporter sends encoded bytes with."""

    def export(self, data: bytes) -> _Result: ...


def otlp_http_span_client(exporter: SpanExporter) -> OtlpHttpClient | None:
    """The byte-sending client inside the SDK's OTLP/HTTP span exporter, or None (for any
    other exporter, a subclass, or a release where it moved): the public fallback is
    ``exporter.export(ReadableSpan...)``, which encodes with the SDK's encoder and sends
    through that same client.

    Private: ``OTLPSpanExporter._client`` (``export(bytes)``). Going around ``export()``
    also skips what it adds around the send: its ``max_request_size`` check and its
    opt-in self-metrics.
    """
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError:
        return None
    if type(exporter) is not OTLPSpanExporter:  # a subclass may override export()
        return None
    client = getattr(exporter, "_client", None)
    return client if callable(getattr(client, "export", None)) else None


def metric_exporter_preferences(
    exporter: MetricExporter,
) -> tuple[
    dict[type, AggregationTemporality] | None,
    dict[type, Aggregation] | None,
]:
    """The temporality and aggregation ``exporter`` asks for, to hand on to a wrapping
    exporter; (None, None) when not as tested (the SDK's defaults: cumulative, default
    aggregation). ``OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE`` is read by the
    OTLP exporter into the first.

    Private: ``MetricExporter._preferred_temporality`` and ``_preferred_aggregation`` (the
    SDK's own reader reads them the same way; there is no public getter).
    """
    temporality = getattr(exporter, "_preferred_temporality", None)
    aggregation = getattr(exporter, "_preferred_aggregation", None)
    if isinstance(temporality, dict) and isinstance(aggregation, dict):
        return temporality, aggregation
    return None, None


@runtime_checkable
class SyncGauge(Protocol):
    """What ``Meter.create_gauge()`` returns.

    Its class, ``opentelemetry.metrics._Gauge``, is still private in the API; stagelens
    types it with this protocol instead of importing it.
    """

    def set(
        self,
        amount: int | float,
        attributes: Attributes | None = None,
        context: Context | None = None,
    ) -> None: ...


def composite_parts(textmap: object) -> Sequence[TextMapPropagator] | None:
    """The propagators of the API's ``CompositePropagator``, in order, or None (any other
    propagator, or a release where they moved): the public fallback is to call the
    composite itself (``propagate.inject``).

    Private: ``CompositePropagator._propagators``. Read by the upstream instrumentation to
    recognise the default W3C pair and format ``traceparent`` itself.
    """
    from opentelemetry.propagators.composite import CompositePropagator

    if plain("context_headers"):
        return None
    if type(textmap) is not CompositePropagator:
        return None
    parts = getattr(textmap, "_propagators", None)
    return parts if isinstance(parts, list | tuple) else None


def current_context_getter() -> Callable[[], Context]:
    """``opentelemetry.context.get_current``, as one C call where the runtime context is
    the API's default (``ContextVarsRuntimeContext``): the bound ``get`` of its ContextVar.
    Any other runtime context (``OTEL_PYTHON_CONTEXT``): ``get_current`` itself.

    Private: ``opentelemetry.context._RUNTIME_CONTEXT`` and its ``_current_context``.
    ``get_current`` is two Python calls around that ``get``; a request reads the current
    context about ten times (each ``stage()``, each suppression check, each span start).
    """
    from opentelemetry import context
    from opentelemetry.context.contextvars_context import ContextVarsRuntimeContext

    runtime = getattr(context, "_RUNTIME_CONTEXT", None)
    if type(runtime) is ContextVarsRuntimeContext and not plain("context_headers"):
        var = getattr(runtime, "_current_context", None)
        if isinstance(var, ContextVar):
            getter: Callable[[], Context] = var.get
            return getter
    return context.get_current


def span_key() -> str | None:
    """The context key under which the API keeps the current span, or None where these
    versions keep it elsewhere (``trace.get_current_span`` is used then).

    Private: ``opentelemetry.trace.propagation._SPAN_KEY``. Read by the deferred tracer,
    which starts every span of a request from its parent: ``get_current_span`` takes two
    Python calls and an ``isinstance`` against the abstract ``Span`` (an ABC check) for
    what one ``Context.get`` finds.
    """
    from opentelemetry.trace import propagation

    key = getattr(propagation, "_SPAN_KEY", None)
    return key if isinstance(key, str) and not plain("context_headers") else None


# --- httpx / httpcore ------------------------------------------------------------------
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
# And of opentelemetry-api (1.45.2) and opentelemetry-instrumentation (0.66b2), used by the
# same instrumentation (and by ``stage()`` and the middleware for suppression):
# - ``CompositePropagator._propagators``: see ``composite_parts`` above.
# - ``opentelemetry.trace.propagation._SPAN_KEY``: see ``span_key`` above.
# - ``opentelemetry.context._RUNTIME_CONTEXT._current_context``: see
#   ``current_context_getter`` above.
# - ``opentelemetry.context._SUPPRESS_INSTRUMENTATION_KEY``,
#   ``_SUPPRESS_HTTP_INSTRUMENTATION_KEY`` and ``opentelemetry.instrumentation.utils.
#   _SUPPRESS_INSTRUMENTATION_KEY_PLAIN``: the context keys ``suppress_instrumentation()``
#   and ``suppress_http_instrumentation()`` set, read from one context lookup (the public
#   ``is_instrumentation_enabled()`` makes one per key, and a request checks seven
#   times). Fallback: those public functions (same answer, tested).

HTTPX_TESTED: Final = "0.28.1"
_PLAIN_HEADERS: Final = plain("context_headers")
"""``header_entries`` runs per request: the switch is read once."""
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
    if _PLAIN_HEADERS or type(entries) is not list or (entries and len(entries[0]) != 3):
        return None
    return entries


def suppression_keys() -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """(the context keys that suppress all instrumentation, those that suppress HTTP
    instrumentation), as ``opentelemetry.instrumentation.utils`` reads them; None when
    these versions keep them elsewhere."""
    from opentelemetry import context
    from opentelemetry.instrumentation import utils

    every = getattr(context, "_SUPPRESS_INSTRUMENTATION_KEY", None)
    http = getattr(context, "_SUPPRESS_HTTP_INSTRUMENTATION_KEY", None)
    bare = getattr(utils, "_SUPPRESS_INSTRUMENTATION_KEY_PLAIN", None)
    if not (isinstance(every, str) and isinstance(http, str) and isinstance(bare, str)):
        return None  # pragma: no cover - depends on the installed versions
    if plain("context_headers"):
        return None
    return (every, bare), (every, bare, http)


# --- fastapi -----------------------------------------------------------------------------

FASTAPI_TELEMETRY_TESTED: Final = "0.165.0"
"""The FastAPI release whose built-in OpenTelemetry the internals below were read from."""

FASTAPI_TELEMETRY_SCOPE_KEY: Final = "fastapi.telemetry"
"""The ASGI scope key under which FastAPI's built-in telemetry keeps a request's state.

A FastAPI app handed a scope that already holds this key (None included) makes no span and
records no metric for the request: that is how FastAPI keeps a FastAPI app mounted in
another from tracing a request twice, and how its ``exclude`` option skips one. An older
FastAPI (or any other app) ignores the key."""


def fastapi_telemetry_config(app: Any) -> dict[str, Any] | None:
    """The settings of a FastAPI app's built-in OpenTelemetry, as a dict the app reads on
    every request (what ``FastAPI(telemetry={...})`` set, defaults filled in), or None for
    an app without them (FastAPI before its built-in telemetry, Starlette, anything else).

    Private: ``FastAPI._telemetry``, the ``TelemetryConfig`` dict that
    ``FastAPI._native_telemetry.config`` shares. No public fallback: FastAPI takes the
    settings only at construction, so without the internal an app is left as it is.
    """
    config = getattr(app, "_telemetry", None)
    if not isinstance(config, dict):
        return None
    shared = getattr(getattr(app, "_native_telemetry", None), "config", None) is config
    if not shared or not {"tracing", "metrics", "logs"} <= config.keys():
        return None  # pragma: no cover - depends on the installed version
    return config
