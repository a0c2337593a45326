"""stagelens.instrumentation: the middleware, stage hooks and upstream instrumentation."""

from __future__ import annotations

from stagelens.instrumentation.asgi import StageLensMiddleware
from stagelens.instrumentation.fastapi import (
    FastAPIInstrumentor,
    instrument_app,
    uninstrument_app,
)
from stagelens.instrumentation.hooks import Rejected, bill, record_usage, stage
from stagelens.instrumentation.httpx import (
    StageLensAsyncTransport,
    StageLensTransport,
    instrument_httpx_client,
    uninstrument_httpx_client,
)

from stagelens.request import RequestState, current_request
from stagelens.telemetry import Telemetry, default_telemetry

__all__ = [
    "FastAPIInstrumentor",
    "Rejected",
    "RequestState",
    "StageLensAsyncTransport",
    "StageLensMiddleware",
    "StageLensTransport",
    "Telemetry",
    "bill",
    "current_request",
    "default_telemetry",
    "instrument_app",
    "instrument_httpx_client",
    "record_usage",
    "stage",
    "uninstrument_app",
    "uninstrument_httpx_client",
]
