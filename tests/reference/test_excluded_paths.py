"""The reference gateway's checks (API key, rate limit, body) are the middleware's hooks, and
the middleware passes an excluded path to the app untouched: a setting that excludes a
checked route would serve it unchecked, so the gateway refuses to start with it."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry
from stagelens.reference import create_app, demo_config

import stagelens
from stagelens.errors import ConfigurationError


def _telemetry(excluded: str) -> stagelens.Telemetry:
    return stagelens.configure(
        registry=CollectorRegistry(),
        set_global=False,
        gpu=False,
        span_exporters=[],
        excluded_paths=tuple(excluded.split(",")),
    )


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages", "/v1/usage"])
def test_excluding_a_checked_route_is_refused(tiny_model: Path, path: str) -> None:
    config = demo_config(["http://127.0.0.1:9"], str(tiny_model))
    with pytest.raises(ConfigurationError, match=path):
        create_app(config, telemetry=_telemetry(f"/metrics,{path}"))


@pytest.mark.anyio
async def test_the_default_exclusions_leave_every_route_checked(tiny_model: Path) -> None:
    """The defaults (``/metrics``, ``/health`` ...) start, and a request without a key to a
    checked route is refused."""
    config = demo_config(["http://127.0.0.1:9"], str(tiny_model))
    app = create_app(config, telemetry=_telemetry("/metrics,/health,/healthz,/ready"))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
        answer = await client.post("/v1/chat/completions", json={"model": "tiny"})
    assert answer.status_code == 401
