"""One trace and one SERVER span per request, whatever FastAPI's built-in telemetry does.

FastAPI 0.165 and later trace requests themselves (``FastAPI(telemetry=...)``), in a trace
of their own; stagelens switches that off for an app it instruments (see
``instrumentation/_fastapi_builtin.py``). Each entry point is driven with the built-in
telemetry left at its default, switched off, and configured by the user with a tracer and a
meter provider: N requests must give N traces and N SERVER spans, each trace holding the
stage spans, and FastAPI must record no HTTP metric. On a FastAPI without built-in telemetry
(the version vLLM pins) the modes that need it skip, and the default one still runs.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from typing import Any

import fastapi
import httpx
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.trace import SpanKind
from stagelens.instrumentation import uninstrument_app
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import Mount

from stagelens import (
    FastAPIInstrumentor,
    Stage,
    StageLensMiddleware,
    _compat,
    instrument_app,
    stage,
)
from stagelens.testing import TelemetryCapture

pytestmark = pytest.mark.anyio

N = 4
"""Requests per case."""

BUILTIN = "telemetry" in inspect.signature(fastapi.FastAPI.__init__).parameters
"""The installed FastAPI has built-in OpenTelemetry (0.165 and later)."""

needs_builtin = pytest.mark.skipif(
    not BUILTIN, reason=f"FastAPI {fastapi.__version__} has no built-in telemetry"
)

MODES = [
    pytest.param("default", id="builtin-default"),
    pytest.param("off", id="builtin-off", marks=needs_builtin),
    pytest.param("configured", id="builtin-configured", marks=needs_builtin),
]


class _Builtin:
    """What FastAPI's own telemetry is given in one mode, and what it recorded."""

    def __init__(self, mode: str, cap: TelemetryCapture) -> None:
        self.reader = InMemoryMetricReader()
        self.meters = MeterProvider(metric_readers=[self.reader])
        self.kwargs: dict[str, Any] = {}
        if mode == "off":
            self.kwargs = {"telemetry": {"tracing": False, "metrics": False}}
        elif mode == "configured":
            self.kwargs = {
                "telemetry": {
                    "tracer_provider": cap.telemetry.tracer_provider,
                    "meter_provider": self.meters,
                }
            }

    def http_metrics(self) -> list[str]:
        """Names of the metrics FastAPI recorded on the meter provider it was given."""
        data = self.reader.get_metrics_data()
        if data is None:
            return []
        return [
            metric.name
            for rm in data.resource_metrics
            for sm in rm.scope_metrics
            for metric in sm.metrics
        ]


def _routes(app: fastapi.FastAPI) -> fastapi.FastAPI:
    @app.post("/v1/chat/completions")
    async def chat() -> dict[str, str]:
        with stage(Stage.TOKENIZER):
            pass
        return {"ok": "1"}

    return app


def _instrument_app(cap: TelemetryCapture, builtin: _Builtin) -> Iterator[Any]:
    app = _routes(fastapi.FastAPI(**builtin.kwargs))
    yield instrument_app(app, telemetry=cap.telemetry)


def _instrumentor(cap: TelemetryCapture, builtin: _Builtin) -> Iterator[Any]:
    instrumentor = FastAPIInstrumentor()
    instrumentor.instrument(telemetry=cap.telemetry)
    try:
        yield _routes(fastapi.FastAPI(**builtin.kwargs))
    finally:
        instrumentor.uninstrument()


def _starlette_mounting_fastapi(cap: TelemetryCapture, builtin: _Builtin) -> Iterator[Any]:
    """StageLensMiddleware on a plain Starlette app, a FastAPI app mounted in it."""
    inner = _routes(fastapi.FastAPI(**builtin.kwargs))
    middleware = [Middleware(StageLensMiddleware, telemetry=cap.telemetry)]
    yield Starlette(routes=[Mount("/", app=inner)], middleware=middleware)


def _middleware_around_fastapi(cap: TelemetryCapture, builtin: _Builtin) -> Iterator[Any]:
    """StageLensMiddleware wrapping a FastAPI app from outside (plain ASGI)."""
    yield StageLensMiddleware(_routes(fastapi.FastAPI(**builtin.kwargs)), telemetry=cap.telemetry)


ENTRY_POINTS: dict[str, Callable[[TelemetryCapture, _Builtin], Iterator[Any]]] = {
    "instrument_app": _instrument_app,
    "FastAPIInstrumentor": _instrumentor,
    "Starlette+mounted FastAPI": _starlette_mounting_fastapi,
    "middleware around FastAPI": _middleware_around_fastapi,
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
async def test_n_requests_give_n_traces_each_with_one_server_span_and_the_stages(
    cap: TelemetryCapture, entry: str, mode: str
) -> None:
    """N requests: N traces, N SERVER spans (stagelens'), each trace holding the root, the
    gateway and tokenizer stages; FastAPI records no HTTP metric of its own."""
    builtin = _Builtin(mode, cap)
    app_factory = ENTRY_POINTS[entry](cap, builtin)
    app = next(app_factory)
    try:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            for _ in range(N):
                assert (await client.post("/v1/chat/completions", json={})).status_code == 200
    finally:
        app_factory.close()
    spans = cap.spans()
    traces: dict[int, list[str]] = {}
    for span in spans:
        traces.setdefault(span.context.trace_id, []).append(span.name)
    server = [s for s in spans if s.kind is SpanKind.SERVER]
    assert len(traces) == N, traces
    assert len(server) == N, [(s.name, s.instrumentation_scope) for s in server]
    assert {s.instrumentation_scope.name for s in spans if s.instrumentation_scope} == {"stagelens"}
    for names in traces.values():
        assert sorted(names) == ["POST /v1/chat/completions", "gateway", "tokenizer"], names
    assert builtin.http_metrics() == []


@pytest.mark.parametrize("mode", MODES)
def test_add_middleware_on_fastapi_served_with_its_lifespan(
    cap: TelemetryCapture, mode: str
) -> None:
    """StageLensMiddleware added with add_middleware (no instrument_app) to a FastAPI app
    that a server runs with its lifespan, as every ASGI server does: the same one trace and
    one SERVER span per request."""
    from starlette.testclient import TestClient

    builtin = _Builtin(mode, cap)
    app = _routes(fastapi.FastAPI(**builtin.kwargs))
    app.add_middleware(StageLensMiddleware, telemetry=cap.telemetry)
    with TestClient(app) as client:
        for _ in range(N):
            assert client.post("/v1/chat/completions", json={}).status_code == 200
    spans = cap.spans()
    assert len({s.context.trace_id for s in spans}) == N
    assert sum(s.kind is SpanKind.SERVER for s in spans) == N
    assert builtin.http_metrics() == []


@needs_builtin
def test_instrument_app_switches_the_builtin_tracing_and_metrics_off_and_undo_restores(
    cap: TelemetryCapture,
) -> None:
    """instrument_app turns FastAPI's own tracing, HTTP metrics and logs off, leaves the
    rest as the app set it, and uninstrument_app gives every setting back as it was."""
    app = fastapi.FastAPI(telemetry={"tracing": True, "metrics": False, "operation_spans": False})
    config = _compat.fastapi_telemetry_config(app)
    assert config is not None
    before = dict(config)
    instrument_app(app, telemetry=cap.telemetry)
    assert (config["tracing"], config["metrics"], config["logs"]) == (False, False, False)
    assert config["operation_spans"] is False
    assert config["exclude"] is None
    instrument_app(app, telemetry=cap.telemetry)  # idempotent: the first "before" is kept
    uninstrument_app(app)
    assert config == before


@needs_builtin
def test_the_builtin_settings_are_read_live() -> None:
    """_compat finds the settings FastAPI reads per request (the very dict its request
    handler holds), and none on a Starlette app."""
    app = fastapi.FastAPI(telemetry={"metrics": False})
    config = _compat.fastapi_telemetry_config(app)
    assert config is not None
    assert config["metrics"] is False
    assert config is app._native_telemetry.config  # the object FastAPI consults per request
    assert _compat.fastapi_telemetry_config(Starlette()) is None
    assert _compat.fastapi_telemetry_config(object()) is None
