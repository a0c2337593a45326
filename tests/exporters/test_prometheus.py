"""Registry policy: /metrics app, collectors, and multiprocess aggregation."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import httpx
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from stagelens.exporters.prometheus import exposition_registry, register_collector

from stagelens import semconv
from stagelens.testing import capture_telemetry

pytestmark = pytest.mark.anyio

WORKER = textwrap.dedent(
    """
    import asyncio, httpx
    from fastapi import FastAPI
    from stagelens import instrument_app, configure
    from opentelemetry.trace import NoOpTracerProvider

    telemetry = configure(tracer_provider=NoOpTracerProvider(), set_global=False)
    app = FastAPI()

    @app.get("/x")
    async def x():
        return {}

    instrument_app(app, telemetry=telemetry)

    async def main():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://w") as c:
            for _ in range(COUNT):
                await c.get("/x")

    asyncio.run(main())
    """
)


def test_multiprocess_mode_aggregates_every_worker(tmp_path, monkeypatch) -> None:
    """Two worker processes with PROMETHEUS_MULTIPROC_DIR: /metrics counts both."""
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    for count in (3, 4):
        subprocess.run(
            [sys.executable, "-c", WORKER.replace("COUNT", str(count))],
            env=env,
            check=True,
            timeout=120,
        )
    registry = exposition_registry()
    assert registry.get_sample_value(semconv.REQUESTS, {"model": "unknown", "code": "200"}) == 7.0
    assert registry.get_sample_value(semconv.STAGE_BUDGET, {"stage": "inference"}) == 0.8


async def test_metrics_path_is_served_by_the_middleware() -> None:
    """instrument_app(..., metrics_path='/metrics') serves the exposition format."""
    from fastapi import FastAPI

    from stagelens import instrument_app

    with capture_telemetry(daily_budgets_usd={"acme": 5.0}) as cap:
        app = FastAPI()

        @app.get("/x")
        async def x() -> dict[str, str]:
            return {}

        instrument_app(app, telemetry=cap.telemetry, metrics_path="/metrics")
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://g"
        ) as c:
            await c.get("/x")
            await c.get("/metrics")
            text = (await c.get("/metrics")).text  # would count the first scrape if it could
    assert 'stagelens_requests_total{code="200",model="unknown"} 1.0' in text
    assert 'stagelens_budget_usd{tenant="acme",window="1d"} 5.0' in text
    assert 'stagelens_stage_budget_seconds{stage="gateway"} 0.005' in text


def test_register_collector_lands_on_the_exposition_registry() -> None:
    """A scrape-time collector registered through the policy module is exposed."""

    class One:
        def collect(self):
            yield GaugeMetricFamily("stagelens_test_one", "one", value=1.0)

    registry = CollectorRegistry()
    register_collector(One(), registry)
    assert registry.get_sample_value("stagelens_test_one") == 1.0


def test_multiprocess_collectors_land_on_the_served_registry(tmp_path, monkeypatch) -> None:
    """In multiprocess mode a collector registered without a registry is what /metrics
    (the per-process aggregate registry) serves."""
    from stagelens.exporters.prometheus import metrics_app

    class Two:
        def collect(self):
            yield GaugeMetricFamily("stagelens_test_two", "two", value=2.0)

    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    register_collector(Two())
    assert exposition_registry().get_sample_value("stagelens_test_two") == 2.0
    assert metrics_app() is not None


def test_fast_histogram_ignores_nan() -> None:
    """A NaN would turn observe()'s sum into NaN for good; FastHistogram drops it."""
    from prometheus_client import Histogram

    from stagelens.metrics.series import FastHistogram

    registry = CollectorRegistry()
    child = Histogram("h", "h", ["m"], buckets=(1.0,), registry=registry).labels("x")
    FastHistogram(child).observe(float("nan"))
    FastHistogram(child).observe(0.5)
    assert registry.get_sample_value("h_sum", {"m": "x"}) == 0.5
    assert registry.get_sample_value("h_count", {"m": "x"}) == 1.0
