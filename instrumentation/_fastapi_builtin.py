"""FastAPI's built-in OpenTelemetry, switched off where stagelens makes the SERVER span.

FastAPI (0.165 and later) traces every request itself as soon as a tracer provider is
configured globally (``stagelens.configure()`` installs one) or given to
``FastAPI(telemetry={"tracer_provider": ...})``, and records ``http.server.request.duration``
and ``http.server.active_requests`` on a configured meter provider. Its SERVER span starts
its own trace (it continues only the request's ``traceparent``, never the current span),
so an app that stagelens also instruments would send two SERVER spans per request, in two
traces, and pay for both; with ``FASTAPI_OTEL_AUTO_CONFIGURE=true`` FastAPI also adds its
own span processor and metric reader, each with an exporter thread.

Why off rather than continued: stagelens' root is the request's trace root (the W3C context
continued), ends at the last byte and carries what a trace of an LLM request is read for
(TTFT, tokens, the outcome a tail sampler keeps a trace by); FastAPI's span would sit above
it with the same HTTP facts. FastAPI itself makes the same choice for
opentelemetry-instrumentation-fastapi: finding that package's ``OpenTelemetryMiddleware`` in
the app's stack, it switches its own tracing, metrics and logs off, and so does stagelens.
Its HTTP metrics measure what ``stagelens_request_duration_seconds`` measures (receipt to
last byte, by status code). Its logs record an unhandled exception's message and stack
trace, which can quote a prompt; stagelens records the exception on the root span, its
message only where content capture is on; and with its automatic configuration they would
bring an exporter thread of their own.
"""

from __future__ import annotations

import logging
from typing import Any, Final

from stagelens import _compat

SIGNALS: Final = ("tracing", "metrics", "logs")
"""The settings of FastAPI's built-in telemetry that stagelens switches off."""
_PROVIDERS: Final = ("tracer_provider", "meter_provider", "logger_provider")

_log = logging.getLogger("stagelens")


def switch_off(app: Any) -> dict[str, Any] | None:
    """Switch FastAPI's built-in tracing, HTTP metrics and logs off for ``app``; return what
    they were (for :func:`restore`), or None when ``app`` has no built-in telemetry. Says so
    once in the log when the app gave FastAPI a provider of its own."""
    config = _compat.fastapi_telemetry_config(app)
    if config is None:
        return None
    before = {key: config.get(key) for key in SIGNALS}
    if any(config.get(key) is not None for key in _PROVIDERS) and any(before.values()):
        _log.info(
            "FastAPI's built-in tracing, HTTP metrics and logs are off for this app: "
            "stagelens' root span is the request's SERVER span"
        )
    for key in SIGNALS:
        config[key] = False
    return before


def restore(app: Any, before: dict[str, Any]) -> None:
    """Put back the settings :func:`switch_off` returned."""
    config = _compat.fastapi_telemetry_config(app)
    if config is not None:
        config.update(before)
