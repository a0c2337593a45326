"""Dashboards and alerts against real Prometheus + Alertmanager scraping a real stack.

A FastAPI gateway instrumented with the public stagelens API proxies to the session's real
vLLM server; Prometheus scrapes both. Every dashboard panel query is evaluated through the
HTTP API and must return series; then an admission delay pushes TTFT over the threshold and
StagelensTTFTP95High must reach the Alertmanager webhook, and a tiny daily budget must make
StagelensCostBudgetBurn do the same. The alert rules used here come from the same generator
as alerts/*.yaml, with second-scale windows so the test takes about a minute.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI, Request
from prometheus_client import CollectorRegistry
from starlette.responses import JSONResponse, Response, StreamingResponse

import stagelens
from stagelens import semconv as sc
from stagelens.alert_rules import dump_yaml, render_alerts, render_rules
from stagelens.slo import BurnWindow, SloConfig
from tests._promstack import PROMETHEUS, PromStack, WebhookSink, prom_stack

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = ROOT / "dashboards"
TINY_BUDGET_TENANT = "acme"
SERVED_MODEL = "tiny"
GPU_PRICE_USD_PER_HOUR = 2.5
"""Per-GPU price the gpu-exporter publishes here; differs from the SLO config default (2.0)."""

pytestmark = pytest.mark.skipif(not Path(PROMETHEUS).exists(), reason="prometheus missing")


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Gateway:
    """The instrumented gateway, served by uvicorn on a loopback port in a thread."""

    def __init__(self, upstream_url: str) -> None:
        self.admission_delay = 0.0
        self.port = free_port()
        telemetry = stagelens.configure(
            registry=CollectorRegistry(),
            set_global=False,
            span_exporters=[],
            daily_budgets_usd={TINY_BUDGET_TENANT: 0.000001, "big": 1000.0},
            tenants=(TINY_BUDGET_TENANT, "big"),
        )
        client = httpx.AsyncClient(base_url=upstream_url, timeout=60)
        stagelens.instrument_httpx_client(client, telemetry=telemetry)
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> Response:
            body = await request.json()
            with stagelens.stage(stagelens.Stage.TOKENIZER):
                body.setdefault("max_tokens", 8)
            try:
                with stagelens.stage(stagelens.Stage.ROUTER):
                    if body.get("model") != SERVED_MODEL:
                        raise stagelens.Rejected(404, "no such model", code="model_not_found")
                    if self.admission_delay:
                        await asyncio.sleep(self.admission_delay)
            except stagelens.Rejected as rejection:
                return JSONResponse(rejection.body(), status_code=rejection.status_code)
            upstream = client.build_request("POST", "/v1/chat/completions", json=body)
            if not body.get("stream"):
                answer = await client.send(upstream)
                with stagelens.stage(stagelens.Stage.POSTPROCESS):
                    payload = answer.json()
                return JSONResponse(payload, status_code=answer.status_code)
            answer = await client.send(upstream, stream=True)

            async def relay() -> AsyncIterator[bytes]:
                try:
                    async for chunk in answer.aiter_raw():
                        yield chunk
                finally:
                    await answer.aclose()

            return StreamingResponse(relay(), media_type="text/event-stream")

        def tenant_of(scope: Any) -> str:
            headers = dict(scope.get("headers", []))
            value = headers.get(b"x-tenant")
            if not value:
                raise stagelens.Rejected(401, "missing x-tenant", type="authentication_error")
            return str(value.decode())

        stagelens.instrument_app(
            app, telemetry=telemetry, metrics_path="/metrics", auth_hook=tenant_of
        )
        self.server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning")
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> Gateway:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert time.monotonic() < deadline, "gateway did not start"
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def send_traffic(gateway: Gateway, seconds: float, concurrency: int = 2) -> int:
    """Streamed and plain chat requests from two tenants, plus rejections: a 404 from the router
    (unknown model) and a 401 from the gateway (no tenant); returns the count."""
    prefix = "You are a helpful assistant that answers briefly. " * 30  # > 128 tokens: cache hits

    async def worker(n: int, stop: float, client: httpx.AsyncClient) -> int:
        sent = 0
        while time.monotonic() < stop:
            tenant = TINY_BUDGET_TENANT if (n + sent) % 2 else "big"
            body: dict[str, Any] = {
                "model": "tiny",
                "messages": [{"role": "user", "content": f"{prefix} question {sent % 3}"}],
                "max_tokens": 8,
                "stream": bool(sent % 2),
            }
            headers = {"x-tenant": tenant}
            if sent % 7 == 6:
                body["model"] = "no-such-model"  # rejected by the router: 404
            if sent % 11 == 10:
                headers = {}  # rejected by the gateway: 401
            response = await client.post("/v1/chat/completions", json=body, headers=headers)
            await response.aread()
            sent += 1
        return sent

    async def run() -> int:
        stop = time.monotonic() + seconds
        async with httpx.AsyncClient(base_url=gateway.url, timeout=60) as client:
            counts = await asyncio.gather(*(worker(i, stop, client) for i in range(concurrency)))
        return sum(counts)

    return asyncio.run(run())


def fast_config() -> SloConfig:
    """The default SLOs with second-scale windows and `for`, for a one-minute test."""
    return SloConfig(
        ttft_p95_window="15s",
        ttft_p95_for="5s",
        ttft_burn_windows=(BurnWindow(long="30s", short="10s", factor=1, severity="page"),),
        cost_burn_windows=(
            BurnWindow(long="30s", short="10s", factor=6, severity="page", **{"for": "3s"}),
        ),
    )


def _rule_files(tmp: Path) -> list[Path]:
    """Default rules (what the SLO dashboard reads) plus the fast test alerts."""
    default = SloConfig()
    fast = fast_config()
    files = {
        "rules.yaml": render_rules(default),
        "alerts.yaml": render_alerts(default),
    }
    default_records = {r["record"] for g in render_rules(default)["groups"] for r in g["rules"]}
    fast_rules = render_rules(fast)
    for group in fast_rules["groups"]:
        group["name"] = "fast-" + group["name"]
        group["rules"] = [r for r in group["rules"] if r["record"] not in default_records]
    fast_rules["groups"] = [g for g in fast_rules["groups"] if g["rules"]]
    fast_alerts = render_alerts(fast)
    for group in fast_alerts["groups"]:
        group["name"] = "fast-" + group["name"]
        group["rules"] = [
            {**r, "labels": {**r["labels"], "test": "fast"}}
            for r in group["rules"]
            if r["alert"] in {sc.ALERT_TTFT_P95_HIGH, sc.ALERT_COST_BUDGET_BURN}
        ]
    fast_alerts["groups"] = [g for g in fast_alerts["groups"] if g["rules"]]
    files["fast-rules.yaml"] = fast_rules
    files["fast-alerts.yaml"] = fast_alerts
    paths = []
    for name, data in files.items():
        path = tmp / name
        path.write_text(dump_yaml(data))
        paths.append(path)
    return paths


def concrete(expr: str) -> str:
    """A panel query with Grafana's variables replaced as Grafana would for this test."""
    return (
        expr.replace("$__rate_interval", "20s")
        .replace("$__range", "2m")
        .replace("$model", ".*")
        .replace("$tenant", ".*")
    )


def dashboard_queries() -> list[tuple[str, str, str]]:
    """(dashboard file, panel title, expr) for every panel query of the plain dashboards."""
    out = []
    for path in sorted(DASHBOARDS.glob("*.json")):
        if path.name.endswith(".gnet.json"):
            continue
        board = json.loads(path.read_text())
        for panel in board["panels"]:
            if panel["type"] == "row":
                continue
            out.extend((path.name, panel["title"], t["expr"]) for t in panel["targets"])
    return out


@contextlib.contextmanager
def gpu_exporter(port: int) -> Iterator[None]:
    """``stagelens gpu-exporter`` with the NVML fake (no GPU here; the fake mirrors readings
    from a real H100, see tests/exporters/fake_nvml.py)."""
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]);"
        "from stagelens.cli import main; sys.exit(main(sys.argv[2:]))"
    )
    env = {
        **os.environ,
        "STAGELENS_NVML_MODULE": "tests.exporters.fake_nvml",
        "STAGELENS_GPU_COST_USD_PER_HOUR": str(GPU_PRICE_USD_PER_HOUR),
    }
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            code,
            str(ROOT),
            "gpu-exporter",
            "--port",
            str(port),
            "--interval",
            "0.5",
        ],
        env=env,
        cwd=ROOT,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=1)
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, "gpu-exporter did not start"
                time.sleep(0.1)
        yield
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture(scope="module")
def stack(
    vllm_server: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Gateway, PromStack, WebhookSink]]:
    """Gateway + real vLLM + Prometheus + Alertmanager + webhook sink, for this module."""
    tmp = tmp_path_factory.mktemp("rules")
    sink = WebhookSink(free_port())
    gpu_port = free_port()
    with sink.running(), Gateway(vllm_server.base_url) as gateway, gpu_exporter(gpu_port):
        targets = {
            "gateway": f"127.0.0.1:{gateway.port}",
            "vllm": f"127.0.0.1:{vllm_server.port}",
            "gpu": f"127.0.0.1:{gpu_port}",
        }
        with prom_stack(
            (free_port(), free_port(), free_port()),
            targets,
            _rule_files(tmp),
            f"http://127.0.0.1:{sink.port}/",
        ) as prom:
            yield gateway, prom, sink


class TestPrometheusEndToEnd:
    def test_every_panel_query_returns_series(
        self, stack: tuple[Gateway, PromStack, WebhookSink], tmp_path: Path
    ) -> None:
        """Under real traffic every panel query evaluates and returns series; previews render."""
        gateway, prom, _ = stack
        started = time.monotonic()
        sent = send_traffic(gateway, seconds=25)
        assert sent > 10
        time.sleep(3)  # one more scrape and evaluation
        empty: list[str] = []
        queries = dashboard_queries()
        for board, title, expr in queries:
            result = prom.query(concrete(expr))
            if not result:
                empty.append(f"{board} / {title}: {expr}")
        assert not empty, "panels without series:\n" + "\n".join(empty)
        assert len(queries) > 30
        rejected = {s["metric"]["stage"] for s in prom.query(sc.REJECTIONS)}
        assert rejected == {"gateway", "router"}, rejected
        # GPU-time cost per output token is priced from the exporter's per-GPU gauge.
        cost = next(e for _, t, e in queries if t == "GPU-time cost per output token")
        output = f'sum(rate({sc.TOKENS}{{{sc.LABEL_TYPE}="{sc.TOKEN_TYPE_OUTPUT}"}}[20s]))'
        price = prom.query(f"({concrete(cost)}) * {output} * 3600 / count({sc.GPU_COST_PER_HOUR})")
        assert float(price[0]["value"][1]) == pytest.approx(GPU_PRICE_USD_PER_HOUR)
        print(
            f"e2e panels: {len(queries)} queries, {sent} requests,"
            f" {time.monotonic() - started:.1f}s"
        )
        from stagelens.previews import render_previews

        out = Path(os.environ.get("STAGELENS_PREVIEWS_OUT") or tmp_path)
        pictures = render_previews(
            prom.prometheus_url, out, minutes=(time.monotonic() - started) / 60
        )
        assert [p.name for p in pictures] == [
            "stagelens-request-path.png",
            "stagelens-tokens-cost.png",
            "stagelens-engine-gpu.png",
            "stagelens-slos.png",
        ]
        assert all(p.stat().st_size > 10_000 for p in pictures)

    def test_ttft_breach_reaches_alertmanager(
        self, stack: tuple[Gateway, PromStack, WebhookSink]
    ) -> None:
        """An admission delay past 0.5 s fires StagelensTTFTP95High into the webhook receiver."""
        gateway, prom, sink = stack
        started = time.monotonic()
        gateway.admission_delay = 0.7
        try:
            deadline = time.monotonic() + 90
            while not sink.alerts(sc.ALERT_TTFT_P95_HIGH) and time.monotonic() < deadline:
                send_traffic(gateway, seconds=4)
        finally:
            gateway.admission_delay = 0.0
        alerts = [
            a for a in sink.alerts(sc.ALERT_TTFT_P95_HIGH) if a["labels"].get("test") == "fast"
        ]
        assert alerts, prom.query("ALERTS")
        assert alerts[0]["labels"]["model"] == "tiny"
        assert alerts[0]["labels"]["severity"] == "page"
        assert alerts[0]["annotations"]["runbook_url"].endswith("#stagelensttftp95high")
        print(f"e2e TTFT alert in {time.monotonic() - started:.1f}s")

    def test_cost_budget_burn_reaches_alertmanager(
        self, stack: tuple[Gateway, PromStack, WebhookSink]
    ) -> None:
        """A tenant with a tiny daily budget fires StagelensCostBudgetBurn into the webhook."""
        gateway, prom, sink = stack
        started = time.monotonic()
        deadline = time.monotonic() + 90
        while not sink.alerts(sc.ALERT_COST_BUDGET_BURN) and time.monotonic() < deadline:
            send_traffic(gateway, seconds=3)
        alerts = [
            a for a in sink.alerts(sc.ALERT_COST_BUDGET_BURN) if a["labels"].get("test") == "fast"
        ]
        assert alerts, prom.query("ALERTS")
        for alert in alerts:
            assert alert["labels"] == {
                "alertname": sc.ALERT_COST_BUDGET_BURN,
                "tenant": TINY_BUDGET_TENANT,
                "severity": "page",
                "long_window": "30s",
                "test": "fast",
            }
            assert alert["annotations"]["runbook_url"].endswith("#stagelenscostbudgetburn")
        print(f"e2e cost alert in {time.monotonic() - started:.1f}s")
