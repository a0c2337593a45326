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
from stagelens.reference.config import DEMO_API_KEY, GatewayConfig, demo_config
from stagelens.reference.demo_traces import DemoTraces
from stagelens.reference.serve import GatewayProcess, GatewayStartError, write_config

from stagelens import semconv
from stagelens.errors import ConfigurationError

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


def _series(metrics_url: str, name: str) -> list[tuple[dict[str, str], float]]:
    text = httpx.get(metrics_url, timeout=30).text
    return [
        (dict(s.labels), s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    ]


def _chat(url: str, model: str) -> int:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    headers = {"Authorization": f"Bearer {DEMO_API_KEY}"}
    return httpx.post(
        f"{url}/v1/chat/completions", json=body, headers=headers, timeout=60
    ).status_code


class TestOperatorSettings:
    """The operators' table through the gateway's start-up: ``STAGELENS_*`` as operators
    write them apply, a typo is warned about, a bad value stops the start with the reason
    (exit 2, no traceback), before any worker starts."""

    def test_the_comma_forms_apply_and_a_typo_is_warned(
        self, tiny_model, tmp_path, port_factory
    ) -> None:
        """Lists and maps written comma-separated reach the metrics: the budgets
        (``acme=100,globex=50``), the served models (``tiny,big``: a request for
        ``tiny-chat`` is ``other``), the excluded paths (``/health,/nothing-here``: 5
        requests there are not counted, 12 unauthorized chats are); ``STAGELENS_TENANT``
        is warned about once, naming ``STAGELENS_TENANTS``."""
        log = tmp_path / "gateway.log"
        config = write_config(
            demo_config(["http://127.0.0.1:9"], str(tiny_model)), tmp_path / "gateway.yaml"
        )
        env = {
            **ENV,
            "STAGELENS_TENANTS": "acme, globex",
            "STAGELENS_MODELS": "tiny,big",
            "STAGELENS_EXCLUDED_PATHS": "/health,/nothing-here",
            "STAGELENS_DAILY_BUDGETS_USD": "acme=100,globex=50",
            "STAGELENS_TENANT": "acme",
        }
        with GatewayProcess(
            config, port_factory(), env=env, log_path=log, metrics_port=port_factory()
        ) as gateway:
            budgets = _series(gateway.metrics_url, semconv.BUDGET_USD)
            excluded = [httpx.get(f"{gateway.url}/nothing-here", timeout=30) for _ in range(5)]
            _unauthorized(gateway.url, 12)
            answered = {model: _chat(gateway.url, model) for model in ("tiny", "tiny-chat")}
            requests = _series(gateway.metrics_url, semconv.REQUESTS)
        assert sorted((labels["tenant"], usd) for labels, usd in budgets) == [
            ("acme", 100.0),
            ("globex", 50.0),
        ]
        assert {r.status_code for r in excluded} == {404}  # not the 401 of a counted path
        assert sum(v for labels, v in requests if labels["code"] == "401") == 12
        assert sum(v for labels, v in requests if labels["code"] == "404") == 0
        failed = {labels["model"] for labels, _ in requests if labels["code"] != "401"}
        assert set(answered.values()) <= {502, 503, 504}, answered
        assert failed == {"tiny", "other"}
        text = log.read_text()
        assert text.count("STAGELENS_TENANT is no stagelens variable") == 1, text
        assert "did you mean STAGELENS_TENANTS?" in text

    @pytest.mark.parametrize(
        ("env", "said"),
        [
            (
                {"STAGELENS_MAX_TENANTS": "lots"},
                "STAGELENS_MAX_TENANTS='lots': Input should be a valid integer",
            ),
            (
                {"STAGELENS_PROMPT_SIZE_BOUNDS": "1024,512"},
                "STAGELENS_PROMPT_SIZE_BOUNDS='1024,512': prompt_size_bounds must be positive "
                "and strictly increasing; got 512 after 1024",
            ),
            (
                {"STAGELENS_TENANTS": "acme,globex,initech", "STAGELENS_MAX_TENANTS": "2"},
                "3 tenants configured but max_tenants=2",
            ),
            (
                {"STAGELENS_TENANT": "acme", "STAGELENS_STRICT": "1"},
                "STAGELENS_TENANT is no stagelens variable and is ignored "
                "(did you mean STAGELENS_TENANTS?)",
            ),
        ],
    )
    def test_a_bad_setting_stops_the_start_with_the_reason(
        self, tiny_model, tmp_path, port_factory, env, said
    ) -> None:
        """Exit status 2, one line naming the variable and what is wrong, no traceback."""
        log = tmp_path / "gateway.log"
        config = write_config(
            demo_config(["http://127.0.0.1:9"], str(tiny_model)), tmp_path / "gateway.yaml"
        )
        process = GatewayProcess(config, port_factory(), env={**ENV, **env}, log_path=log)
        with pytest.raises(GatewayStartError, match="exited with 2"):
            process.start(timeout=120)
        text = log.read_text()
        assert text.startswith("stagelens: error: "), text
        assert said in text
        assert "Traceback" not in text

    def test_a_bad_gateway_config_names_the_field_never_a_key(self, tmp_path) -> None:
        """The gateway's own YAML: each bad field with what it got; an API key is never
        quoted."""
        path = tmp_path / "gateway.yaml"
        path.write_text(
            "api_keys: {sk-secret-1: 5}\n"
            "models: {tiny: {backends: [http://x], tokenizer: t, max_inflight: -1}}\n"
            "rate_limit_burst: lots\n"
        )
        with pytest.raises(ConfigurationError) as raised:
            GatewayConfig.load(path)
        message = str(raised.value)
        assert "models.tiny.max_inflight: Input should be greater than 0 (got -1)" in message
        assert "rate_limit_burst: Input should be a valid integer" in message
        assert "api_keys.<key>: Input should be a valid string" in message
        assert "sk-secret" not in message
        assert "pydantic" not in message
