"""FastAPIInstrumentor follows BaseInstrumentor: idempotent, undoable, discoverable."""

from __future__ import annotations

import importlib.metadata

import fastapi
import httpx
import pytest
from stagelens.instrumentation import uninstrument_app

from stagelens import FastAPIInstrumentor, StageLensMiddleware, instrument_app

pytestmark = pytest.mark.anyio


def _count(app: fastapi.FastAPI) -> int:
    return sum(1 for m in app.user_middleware if m.cls is StageLensMiddleware)


def test_instrument_app_is_idempotent_and_undone_exactly(cap) -> None:
    """Twice instrumented = once; uninstrument_app removes exactly our middleware."""
    app = fastapi.FastAPI()
    instrument_app(app, telemetry=cap.telemetry)
    instrument_app(app, telemetry=cap.telemetry)
    assert _count(app) == 1
    uninstrument_app(app)
    assert _count(app) == 0


async def test_instrument_patches_new_apps_and_uninstrument_restores(cap) -> None:
    """instrument() makes every later FastAPI app traced; uninstrument() restores __init__."""
    original = fastapi.FastAPI.__init__
    instrumentor = FastAPIInstrumentor()
    instrumentor.instrument(telemetry=cap.telemetry)
    try:
        app = fastapi.FastAPI()

        @app.get("/ping")
        async def ping() -> dict[str, str]:
            return {"pong": "1"}

        assert _count(app) == 1
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            assert (await client.get("/ping")).status_code == 200
        assert cap.span_names()[-1] == "GET /ping"
    finally:
        instrumentor.uninstrument()
    assert fastapi.FastAPI.__init__ is original
    assert _count(fastapi.FastAPI()) == 0


def test_opentelemetry_instrumentor_entry_point_resolves() -> None:
    """OTel auto-instrumentation finds the instrumentor through its entry point."""
    eps = importlib.metadata.entry_points(group="opentelemetry_instrumentor")
    ep = next(e for e in eps if e.name == "stagelens_fastapi")
    assert ep.load() is FastAPIInstrumentor


def test_unknown_option_fails_at_instrument_time() -> None:
    """A misspelt option is refused at once, not on the app's first request."""
    from stagelens.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="auth_hok"):
        instrument_app(fastapi.FastAPI(), auth_hok=lambda scope: None)


async def test_instrument_accepts_otel_tracer_provider(cap) -> None:
    """instrument(tracer_provider=...) (OTel's convention) traces into that provider."""
    instrumentor = FastAPIInstrumentor()
    instrumentor.instrument(tracer_provider=cap.telemetry.tracer_provider)
    try:
        app = fastapi.FastAPI()

        @app.get("/ping")
        async def ping() -> dict[str, str]:
            return {"pong": "1"}

        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            assert (await client.get("/ping")).status_code == 200
        assert cap.span_names()[-1] == "GET /ping"
    finally:
        instrumentor.uninstrument()
