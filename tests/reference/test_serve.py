"""The gateway as a server of its own with several workers (``stagelens.reference.serve``),
as ``stagelens demo --workers N`` runs it, its metrics on the internal port; no engine
needed (the backend is dead)."""

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
from stagelens.reference.demo_traces import DemoTraces
from stagelens.reference.serve import GatewayProcess, write_config

from stagelens import semconv

ENV = {"OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none"}


def _unauthorized(url: str, n: int) -> None:
    """``n`` requests without a key, a connection each, 8 at a time: 401s."""

    def one(_: int) -> int:
        return httpx.post(f"{url}/v1/chat/completions", json={}, timeout=30).status_code

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        assert set(pool.map(one, range(n))) == {401}


def _count_401(metrics_url: str) -> float:
    text = httpx.get(metrics_url, timeout=30).text
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == semconv.REQUESTS and s.labels.get("code") == "401"
    )


class TestWorkers:
    """One or several workers, one set of metrics on the internal port."""

    def test_metrics_of_every_worker_add_up_and_stale_files_are_removed(
        self, tiny_model, tmp_path, port_factory
    ) -> None:
        """A stale metrics file is removed at start; 40 requests answered by several
        workers are 40 on the internal metrics port, scrape after scrape, and the API's
        port serves no /metrics."""
        metrics = tmp_path / "metrics"
        metrics.mkdir()
        stale = metrics / "counter_999999.db"
        stale.write_bytes(b"left by a previous run")
        config = write_config(
            demo_config(["http://127.0.0.1:9"], str(tiny_model)), tmp_path / "gateway.yaml"
        )
        env = {**ENV, "PROMETHEUS_MULTIPROC_DIR": str(metrics)}
        with GatewayProcess(
            config, port_factory(), workers=3, env=env, metrics_port=port_factory()
        ) as gateway:
            assert not stale.exists()
            _unauthorized(gateway.url, 40)
            scrapes = [_count_401(gateway.metrics_url) for _ in range(6)]
            on_api_port = httpx.get(f"{gateway.url}/metrics", timeout=30).status_code
            pids = {p.stem.rsplit("_", 1)[-1] for p in metrics.glob("counter_*.db")}
        assert scrapes == [40.0] * 6
        assert len(pids) >= 2, pids
        assert on_api_port == 404

    def test_one_worker_serves_its_metrics_on_the_internal_port(
        self, tiny_model, tmp_path, port_factory, monkeypatch
    ) -> None:
        """One worker (no multiprocess directory): its 12 requests are 12 on the internal
        metrics port, which the config names when no --metrics-port is given."""
        monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
        metrics_port = port_factory()
        config = write_config(
            demo_config(["http://127.0.0.1:9"], str(tiny_model), metrics_port=metrics_port),
            tmp_path / "gateway.yaml",
        )
        with GatewayProcess(config, port_factory(), env=ENV) as gateway:
            _unauthorized(gateway.url, 12)
            scrape = _count_401(gateway.metrics_url)
        assert gateway.metrics_url == f"http://127.0.0.1:{metrics_port}/metrics"
        assert scrape == 12.0


class TestDemo:
    """``stagelens demo --workers N``'s gateway."""

    def test_demo_runs_the_gateway_with_workers_and_stops_it(
        self, tiny_model, tmp_path, port_factory, monkeypatch
    ) -> None:
        """--workers 2: the gateway answers on the port (down: its backend is dead), its
        metrics on the configured internal port, and both are gone after the demo."""
        for name, value in ENV.items():
            monkeypatch.setenv(name, value)
        port, metrics_port = port_factory(), port_factory()
        args = argparse.Namespace(workers=2, host="127.0.0.1", port=port)
        config = demo_config(["http://127.0.0.1:9"], str(tiny_model), metrics_port=metrics_port)
        traces = DemoTraces.start(0)
        try:
            with demo._gateway(args, config, tmp_path, traces) as served:
                url, metrics = served.url, served.metrics
                assert url == f"http://127.0.0.1:{port}"
                assert metrics == f"http://127.0.0.1:{metrics_port}/metrics"
                health = httpx.get(f"{url}/health", timeout=10)
                scrape = httpx.get(metrics, timeout=10)
        finally:
            traces.stop()
        assert (health.status_code, health.json()) == (503, {"status": "down"})
        assert scrape.status_code == 200
        assert semconv.STAGE_BUDGET in scrape.text  # from the workers' files
        for gone in (f"{url}/health", metrics):
            with pytest.raises((urllib.error.URLError, OSError)):
                urllib.request.urlopen(gone, timeout=2)
        assert Path(tmp_path / f"gateway-{port}.log").exists()
