"""The gateway as a server of its own with several workers (``stagelens.reference.serve``),
as ``stagelens demo --workers N`` runs it; no engine needed (the backend is dead)."""

from __future__ import annotations

import argparse
import concurrent.futures
import urllib.error
import urllib.request
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from stagelens.reference import demo
from stagelens.reference.config import demo_config
from stagelens.reference.serve import GatewayProcess, write_config

from stagelens import semconv

ENV = {"OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none"}


def _unauthorized(url: str, n: int) -> None:
    """``n`` requests without a key, a connection each, 8 at a time: 401s."""

    def one(_: int) -> int:
        return httpx.post(f"{url}/v1/chat/completions", json={}, timeout=30).status_code

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        assert set(pool.map(one, range(n))) == {401}


def _count_401(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == semconv.REQUESTS and s.labels.get("code") == "401"
    )


class TestWorkers:
    """Several workers, one set of metrics."""

    def test_metrics_of_every_worker_add_up_and_stale_files_are_removed(
        self, tiny_model, tmp_path, port_factory
    ) -> None:
        """A stale metrics file is removed at start; 40 requests answered by several
        workers are 40 in /metrics whichever worker answers the scrape."""
        metrics = tmp_path / "metrics"
        metrics.mkdir()
        stale = metrics / "counter_999999.db"
        stale.write_bytes(b"left by a previous run")
        config = write_config(
            demo_config(["http://127.0.0.1:9"], str(tiny_model)), tmp_path / "gateway.yaml"
        )
        env = {**ENV, "PROMETHEUS_MULTIPROC_DIR": str(metrics)}
        with GatewayProcess(config, port_factory(), workers=3, env=env) as gateway:
            assert not stale.exists()
            _unauthorized(gateway.url, 40)
            scrapes = [_count_401(gateway.url) for _ in range(6)]
            pids = {p.stem.rsplit("_", 1)[-1] for p in metrics.glob("counter_*.db")}
        assert scrapes == [40.0] * 6
        assert len(pids) >= 2, pids


class TestDemo:
    """``stagelens demo --workers N``'s gateway."""

    def test_demo_runs_the_gateway_with_workers_and_stops_it(
        self, tiny_model, tmp_path, port_factory, monkeypatch
    ) -> None:
        """--workers 2: the gateway answers on the port, and is gone after the demo."""
        for name, value in ENV.items():
            monkeypatch.setenv(name, value)
        port = port_factory()
        args = argparse.Namespace(workers=2, host="127.0.0.1", port=port)
        config = demo_config(["http://127.0.0.1:9"], str(tiny_model))
        with demo._gateway(args, config, tmp_path) as url:
            assert url == f"http://127.0.0.1:{port}"
            assert httpx.get(f"{url}/health", timeout=10).status_code == 200
        with pytest.raises((urllib.error.URLError, OSError)):
            urllib.request.urlopen(f"{url}/health", timeout=2)
        assert Path(tmp_path / f"gateway-{port}.log").exists()
