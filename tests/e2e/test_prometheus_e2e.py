"""Dashboards and alerts against real Prometheus + Alertmanager scraping a real stack.

A FastAPI gateway instrumented with the public stagelens API proxies to the session's real
vLLM server; Prometheus scrapes both, two GPU exporters (the NVML fake, one of them with its
driver gone) and a backend job whose only target is dead. Every dashboard panel query is
evaluated through the HTTP API and must return series, each drawn once; then real conditions
fire the alerts into a real Alertmanager: an admission delay (TTFT p95 ticket, router stage
over budget), spend (cost page), the dead backend (backend down, no backend up), an unscraped
gateway job (gateway absent), calls that bypass the gateway (billing drift), the broken GPU
collector, and an all-503 window on streams (availability and TTFT burn pages: the gateway
names each request a stream before refusing it). The rules come from the same generator as
alerts/*.yaml, with second-scale windows, so the test takes a few minutes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Final

import httpx
import pytest
from fastapi import FastAPI, Request
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry
from starlette.responses import JSONResponse, Response

import stagelens
from stagelens import semconv as sc
from stagelens.slo import alert_rules as ar
from stagelens.slo.alert_rules import dump_yaml, render_alerts
from stagelens.slo.config import BurnWindow, SloConfig
from stagelens.slo.recording_rules import render_rules
from tests._promstack import PROMETHEUS, PromStack, WebhookSink, prom_stack
from tests._scaffold import Served, free_port, relayed

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = ROOT / "dashboards"
TINY_BUDGET_TENANT = "acme"
ACME_DAILY_BUDGET_USD = 0.01
"""Small enough that a minute of acme's traffic is on course to spend twice of it in an
hour (the cost page), large enough to read as a budget (the previews use real ones)."""
SERVED_MODEL = "tiny"
REASONING_MODEL = "tiny-think"
"""Served by the reasoning vLLM: the reasoning panels read its tokens."""
GPU_PRICE_USD_PER_HOUR = 2.5
"""Per-GPU price the gpu-exporter publishes here; differs from the SLO config default (2.0)."""
ROUTER_BUDGET_SECONDS = 0.25
"""The gateway's router budget here: the 0.7 s admission delay overruns it."""
DEAD_BACKEND_JOB = "dead-vllm"
"""A backend job whose only target has nothing listening."""
VANISHED_GATEWAY_JOB = "gateway-vanished"
"""A gateway job no target has: what Prometheus sees once every gateway pod is gone."""

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.prometheus,
    pytest.mark.skipif(not Path(PROMETHEUS).exists(), reason="prometheus missing"),
]


class Gateway(Served):
    """The instrumented gateway, served by uvicorn on a loopback port in a thread.

    ``admission_delay`` slows the router stage; ``fail_status`` makes the router answer every
    request with that status (an all-503 window). Requests for ``REASONING_MODEL`` go to
    ``reasoning_url``. Traces go through the tail sampler to memory: the sampler's
    decisions reach ``/metrics`` as they do in a traced service."""

    def __init__(self, upstream_url: str, reasoning_url: str) -> None:
        self.admission_delay = 0.0
        self.fail_status = 0
        self.port = free_port()
        telemetry = stagelens.configure(
            registry=CollectorRegistry(),
            set_global=False,
            span_exporters=[InMemorySpanExporter()],
            sampler=stagelens.TailSampler(0.1),
            daily_budgets_usd={TINY_BUDGET_TENANT: ACME_DAILY_BUDGET_USD, "big": 1000.0},
            tenants=(TINY_BUDGET_TENANT, "big"),
            models=(SERVED_MODEL, REASONING_MODEL),
            stage_budgets_seconds={"router": ROUTER_BUDGET_SECONDS},
        )
        clients = {
            SERVED_MODEL: httpx.AsyncClient(base_url=upstream_url, timeout=60),
            REASONING_MODEL: httpx.AsyncClient(base_url=reasoning_url, timeout=60),
        }
        for each in clients.values():
            stagelens.instrument_httpx_client(each, telemetry=telemetry)
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> Response:
            body = await request.json()
            state = stagelens.current_request()
            if state is not None:
                if body.get("model") in clients:  # the router's model names the series,
                    state.set_model(body["model"])  # also for a request refused before its call
                if body.get("stream"):
                    state.set_streamed()  # a stream refused at admission counts for TTFT
            with stagelens.stage(stagelens.Stage.TOKENIZER):
                body.setdefault("max_tokens", 8)
                if body.get("stream"):  # usage at the end of the stream: what billing reads
                    body.setdefault("stream_options", {"include_usage": True})
            try:
                with stagelens.stage(stagelens.Stage.ROUTER):
                    client = clients.get(body.get("model", ""))
                    if client is None:
                        raise stagelens.Rejected(404, "no such model", code="model_not_found")
                    if self.admission_delay:
                        await asyncio.sleep(self.admission_delay)
                    if self.fail_status:
                        raise stagelens.Rejected(
                            self.fail_status, "no capacity", code="admission_timeout"
                        )
            except stagelens.Rejected as rejection:
                return JSONResponse(rejection.body(), status_code=rejection.status_code)
            upstream = client.build_request("POST", "/v1/chat/completions", json=body)
            if not body.get("stream"):
                answer = await client.send(upstream)
                with stagelens.stage(stagelens.Stage.POSTPROCESS):
                    payload = answer.json()
                return JSONResponse(payload, status_code=answer.status_code)
            answer = await client.send(upstream, stream=True)

            return relayed(answer)

        def tenant_of(scope: Any) -> str:
            headers = dict(scope.get("headers", []))
            value = headers.get(b"x-tenant")
            if not value:
                raise stagelens.Rejected(401, "missing x-tenant", type="authentication_error")
            return str(value.decode())

        stagelens.instrument_app(
            app, telemetry=telemetry, metrics_path="/metrics", auth_hook=tenant_of
        )
        super().__init__(app, self.port)


PREFIX = "You are a helpful assistant that answers briefly. " * 30
"""A shared prompt prefix longer than a 128-token block: the prefix cache hits."""


def send_traffic(
    gateway: Gateway, seconds: float, concurrency: int = 2, *, direct_to: str | None = None
) -> int:
    """Streamed and plain chat requests from two tenants (every fifth to the reasoning model,
    thinking four tokens), plus rejections: a 404 from the router (unknown model) and a 401
    from the gateway (no tenant); returns the count. With
    ``direct_to`` (a vLLM base URL), every third request goes there instead, past the gateway:
    generated, never billed."""

    async def worker(n: int, stop: float, client: httpx.AsyncClient) -> int:
        sent = 0
        while time.monotonic() < stop:
            tenant = TINY_BUDGET_TENANT if (n + sent) % 2 else "big"
            body: dict[str, Any] = {
                "model": "tiny",
                "messages": [{"role": "user", "content": f"{PREFIX} question {sent % 3}"}],
                "max_tokens": 8,
                "stream": bool(sent % 2),
            }
            headers = {"x-tenant": tenant}
            url = "/v1/chat/completions"
            if direct_to is not None and sent % 3 == 2:
                url = f"{direct_to}/v1/chat/completions"
            elif sent % 5 == 3:
                body["model"] = REASONING_MODEL
                body["thinking_token_budget"] = 4
            elif sent % 7 == 6:
                body["model"] = "no-such-model"  # rejected by the router: 404
            elif sent % 11 == 10:
                headers = {}  # rejected by the gateway: 401
            response = await client.post(url, json=body, headers=headers)
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
    """The default SLOs with second-scale windows and `for`, for a test of minutes; the
    target alerts select the dead backend job and a gateway job nobody scrapes."""
    return SloConfig(
        burn_windows=(
            BurnWindow(long="30s", short="10s", factor=1, severity="page", **{"for": "3s"}),
        ),
        min_requests=5,
        ttft_p95_window="15s",
        ttft_p95_for="5s",
        cost_page_for="3s",
        stage_latency_window="15s",
        stage_budget_for="5s",
        billing_drift_for="3s",
        billing_drift_min_tokens=1,
        backend_job_regex=DEAD_BACKEND_JOB,
        backend_down_for="3s",
        no_backend_for="3s",
        gateway_job_regex=VANISHED_GATEWAY_JOB,
        gateway_absent_for="3s",
        gpu_collector_down_for="3s",
    )


FAST_ALERTS = {
    ar.ALERT_AVAILABILITY_BUDGET_BURN,
    sc.ALERT_TTFT_BUDGET_BURN,
    sc.ALERT_TTFT_P95_HIGH,
    sc.ALERT_COST_BUDGET_BURN,
    ar.ALERT_STAGE_OVER_BUDGET,
    ar.ALERT_BILLING_DRIFT,
    ar.ALERT_BACKEND_DOWN,
    ar.ALERT_NO_BACKEND_UP,
    ar.ALERT_GATEWAY_ABSENT,
    ar.ALERT_GPU_COLLECTOR_DOWN,
}
"""The alerts the test drives, rendered from the fast config and labelled test="fast"."""


def _rule_files(tmp: Path) -> list[Path]:
    """Default rules (what the dashboards read) plus the fast test alerts and the records
    only they read. Every group is evaluated at the global 1 s (the 30d group's 5m would
    leave the SLO stat panels empty for minutes)."""
    default = SloConfig()
    fast = fast_config()
    rules = render_rules(default)
    for group in rules["groups"]:
        group.pop("interval", None)
    files = {"rules.yaml": rules, "alerts.yaml": render_alerts(default)}
    default_records = {r["record"] for g in rules["groups"] for r in g["rules"]}
    fast_rules = render_rules(fast)
    for group in fast_rules["groups"]:
        group["name"] = "fast-" + group["name"]
        group.pop("interval", None)
        group["rules"] = [r for r in group["rules"] if r["record"] not in default_records]
    fast_rules["groups"] = [g for g in fast_rules["groups"] if g["rules"]]
    fast_alerts = render_alerts(fast)
    for group in fast_alerts["groups"]:
        group["name"] = "fast-" + group["name"]
        group["rules"] = [
            {**r, "labels": {**r["labels"], "test": "fast"}}
            for r in group["rules"]
            if r["alert"] in FAST_ALERTS
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


VARIABLES = ("model", "tenant", "cluster", "namespace", "instance", "gpu")


def concrete(expr: str) -> str:
    """A panel query with Grafana's variables replaced as Grafana would for this test."""
    expr = (
        expr.replace("$__rate_interval", "20s")
        .replace("$__range", "2m")
        .replace("$__interval", "20s")
    )
    for name in VARIABLES:
        expr = expr.replace(f"${name}", ".*")
    return expr


def dashboard_queries() -> list[tuple[str, str, str, str]]:
    """(dashboard file, panel title, expr, legend) for every panel query of the plain
    dashboards."""
    out = []
    for path in sorted(DASHBOARDS.glob("*.json")):
        if path.name.endswith(".gnet.json"):
            continue
        board = json.loads(path.read_text())
        for panel in board["panels"]:
            if panel["type"] == "row":
                continue
            # A table joins its instant queries on a label: a row is its labels, not a legend.
            table = panel["type"] == "table"
            out.extend(
                (path.name, panel["title"], t["expr"], "" if table else t.get("legendFormat", ""))
                for t in panel["targets"]
            )
    return out


def legend(fmt: str, labels: dict[str, str]) -> str:
    """A series' name as Grafana draws it: the legend format with its labels filled in (no
    format: all its labels, as Grafana names such a series)."""
    if not fmt:
        return json.dumps(labels, sort_keys=True)
    text = fmt
    for key, value in labels.items():
        text = text.replace("{{" + key + "}}", value)
    return text


@contextlib.contextmanager
def gpu_exporter(port: int, *, break_when: Path | None = None) -> Iterator[None]:
    """``stagelens gpu-exporter`` with the NVML fake (no GPU here; the fake mirrors readings
    from a real H100, see tests/exporters/fake_nvml.py). ``break_when``: once that file
    exists, every NVML call fails, as after a driver unload."""
    broken = (
        "import os, threading, time, tests.exporters.fake_nvml as f\n"
        "def gone(path):\n"
        "    while not os.path.exists(path): time.sleep(0.2)\n"
        "    f.break_driver(f.NVMLError_DriverNotLoaded)\n"
        f"threading.Thread(target=gone, args=({str(break_when)!r},), daemon=True).start()\n"
        if break_when is not None
        else ""
    )
    code = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        f"{broken}"
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
        stderr=subprocess.DEVNULL if break_when else None,  # its warning, once per scrape
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


@dataclass
class Stack:
    """What the tests drive and read."""

    gateway: Gateway
    prom: PromStack
    sink: WebhookSink
    vllm_url: str
    break_gpu: Path
    """Creating this file takes NVML away from the "gpu-broken" exporter."""


@pytest.fixture(scope="module")
def stack(
    vllm_server: Any, vllm_reasoning_server: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """Gateway + real vLLM (and the reasoning one, behind the gateway and scraped) + GPU
    exporters + Prometheus + Alertmanager + webhook sink."""
    tmp = tmp_path_factory.mktemp("rules")
    sink = WebhookSink(free_port())
    gpu_port, broken_port = free_port(), free_port()
    break_gpu = tmp / "break-gpu"
    with (
        sink.running(),
        Gateway(vllm_server.base_url, vllm_reasoning_server.base_url) as gateway,
        gpu_exporter(gpu_port),
        gpu_exporter(broken_port, break_when=break_gpu),
    ):
        targets = {
            "gateway": f"127.0.0.1:{gateway.port}",
            "vllm": f"127.0.0.1:{vllm_server.port}",
            "vllm-think": f"127.0.0.1:{vllm_reasoning_server.port}",
            "gpu": f"127.0.0.1:{gpu_port}",
            "gpu-broken": f"127.0.0.1:{broken_port}",
            DEAD_BACKEND_JOB: f"127.0.0.1:{free_port()}",
        }
        with prom_stack(
            (free_port(), free_port(), free_port()),
            targets,
            _rule_files(tmp),
            f"http://127.0.0.1:{sink.port}/",
        ) as prom:
            yield Stack(gateway, prom, sink, vllm_server.base_url, break_gpu)


def _fast(sink: WebhookSink, name: str) -> list[dict[str, Any]]:
    """The distinct firing alerts named ``name`` of the fast rules (Alertmanager notifies an
    alert again in every later notification of its group)."""
    unique = {
        tuple(sorted(a["labels"].items())): a
        for a in sink.alerts(name)
        if a["labels"].get("test") == "fast"
    }
    return list(unique.values())


def _wait_for(stack: Stack, names: set[str], seconds: float, **traffic: Any) -> dict[str, float]:
    """Send traffic until every alert of ``names`` reached the webhook; returns the seconds
    each took."""
    started = time.monotonic()
    arrived: dict[str, float] = {}
    deadline = started + seconds
    while time.monotonic() < deadline and len(arrived) < len(names):
        send_traffic(stack.gateway, seconds=3, **traffic)
        for name in names - set(arrived):
            if _fast(stack.sink, name):
                arrived[name] = time.monotonic() - started
    missing = names - set(arrived)
    assert not missing, (missing, stack.prom.query("ALERTS"))
    return arrived


def _epoch(stamp: str) -> float:
    """Seconds since the epoch of an Alertmanager timestamp (RFC 3339, nanoseconds cut)."""
    head, _, rest = stamp.partition(".")
    zone = rest[rest.find("Z") :] if "Z" in rest else rest[-6:]
    return datetime.fromisoformat(head + zone.replace("Z", "+00:00")).timestamp()


NEEDS_ENGINE_MIDDLEWARE: Final = frozenset({"GPU cost by tenant, beside the price table"})
"""Panels fed by the gateway's engine seconds, which only a vLLM running stagelens' engine-time
middleware reports: the session's vLLM runs without it, so these may be empty here
(tests/e2e/test_engine_seconds_vllm.py reads the figures on a server that runs it)."""


class TestPrometheusEndToEnd:
    def test_every_panel_query_returns_series_once(self, stack: Stack, tmp_path: Path) -> None:
        """Under real traffic every panel query evaluates, returns series, and draws each
        series once (no two series of a query share their legend: an engine or a GPU
        reported by two sources is one line)."""
        prom = stack.prom
        started = time.monotonic()
        sent = send_traffic(stack.gateway, seconds=25)
        assert sent > 10
        time.sleep(3)  # one more scrape and evaluation
        empty: list[str] = []
        doubled: list[str] = []
        queries = dashboard_queries()
        for board, title, expr, fmt in queries:
            result = prom.query(concrete(expr))
            if not result and title not in NEEDS_ENGINE_MIDDLEWARE:
                empty.append(f"{board} / {title}: {expr}")
            names = [legend(fmt, s["metric"]) for s in result]
            if len(names) != len(set(names)):
                doubled.append(f"{board} / {title}: {sorted(names)}")
        assert not empty, "panels without series:\n" + "\n".join(empty)
        assert not doubled, "series drawn twice:\n" + "\n".join(doubled)
        assert len(queries) > 60
        rejected = {s["metric"]["stage"] for s in prom.query(sc.REJECTIONS)}
        assert rejected == {"gateway", "router"}, rejected
        # GPU-time cost per output token is priced from the exporter's per-GPU gauge, each
        # GPU once (both exporters here see the same GPUs).
        cost = next(e for _, t, e, _ in queries if t == "GPU-time cost per output token (fleet)")
        output = f'sum(rate({sc.TOKENS}{{{sc.LABEL_TYPE}="{sc.TOKEN_TYPE_OUTPUT}"}}[20s]))'
        gpus = f"count(count by ({sc.LABEL_UUID}) ({sc.GPU_COST_PER_HOUR}))"
        price = prom.query(f"({concrete(cost)}) * {output} * 3600 / {gpus}")
        assert float(price[0]["value"][1]) == pytest.approx(GPU_PRICE_USD_PER_HOUR)
        print(
            f"e2e panels: {len(queries)} queries, "
            f"{sent} requests, {time.monotonic() - started:.1f}s"
        )

    def test_targets_and_collector_alerts_reach_alertmanager(self, stack: Stack) -> None:
        """A dead backend target opens StagelensBackendDown (ticket) and pages
        StagelensNoBackendUp; a gateway job with no target pages StagelensGatewayAbsent; a GPU
        exporter whose driver goes away opens StagelensGPUCollectorDown (the gateway, whose
        NVML never answered on this GPU-less machine, does not)."""
        stack.break_gpu.touch()
        names = {
            ar.ALERT_BACKEND_DOWN,
            ar.ALERT_NO_BACKEND_UP,
            ar.ALERT_GATEWAY_ABSENT,
            ar.ALERT_GPU_COLLECTOR_DOWN,
        }
        took = _wait_for(stack, names, 90)
        sink = stack.sink
        (down,) = _fast(sink, ar.ALERT_BACKEND_DOWN)
        assert down["labels"]["severity"] == "ticket"
        assert down["labels"]["job"] == DEAD_BACKEND_JOB
        (none,) = _fast(sink, ar.ALERT_NO_BACKEND_UP)
        assert none["labels"]["severity"] == "page"
        assert none["labels"]["job"] == DEAD_BACKEND_JOB
        (absent,) = _fast(sink, ar.ALERT_GATEWAY_ABSENT)
        assert absent["labels"]["severity"] == "page"
        assert "job" not in absent["labels"]  # nothing scraped: absent() says so
        (gpu,) = _fast(sink, ar.ALERT_GPU_COLLECTOR_DOWN)
        assert gpu["labels"]["job"] == "gpu-broken"
        assert stack.prom.query(f'{sc.GPU_COLLECTOR_UP}{{job="gateway"}} == 0')
        for alert in (down, none, absent, gpu):
            name = alert["labels"]["alertname"]
            assert alert["annotations"]["runbook_url"].endswith("#" + name.lower())
        print("e2e target alerts:", {k: round(v, 1) for k, v in took.items()})

    def test_ttft_and_router_breach_reach_alertmanager(self, stack: Stack) -> None:
        """An admission delay past 0.5 s opens StagelensTTFTP95High (a ticket) and
        StagelensStageOverBudget for the router stage (its 0.25 s budget from the gateway's
        gauge), not for inference."""
        stack.gateway.admission_delay = 0.7
        try:
            took = _wait_for(stack, {sc.ALERT_TTFT_P95_HIGH, ar.ALERT_STAGE_OVER_BUDGET}, 120)
        finally:
            stack.gateway.admission_delay = 0.0
        sink = stack.sink
        p95 = _fast(sink, sc.ALERT_TTFT_P95_HIGH)
        models = {a["labels"]["model"] for a in p95}  # the delay holds up both models
        assert SERVED_MODEL in models <= {SERVED_MODEL, REASONING_MODEL}, models
        assert all(a["labels"]["severity"] == "ticket" for a in p95)
        stages = {a["labels"]["stage"] for a in _fast(sink, ar.ALERT_STAGE_OVER_BUDGET)}
        assert "router" in stages
        assert "inference" not in stages
        print("e2e latency alerts:", {k: round(v, 1) for k, v in took.items()})

    def test_cost_page_reaches_alertmanager(self, stack: Stack) -> None:
        """A tenant on course to spend twice its daily cap within the hour pages
        StagelensCostBudgetBurn, with the tenant's label only."""
        took = _wait_for(stack, {sc.ALERT_COST_BUDGET_BURN}, 90)
        pages = [
            a
            for a in _fast(stack.sink, sc.ALERT_COST_BUDGET_BURN)
            if a["labels"]["severity"] == "page"
        ]
        assert pages, stack.prom.query("ALERTS")
        for alert in pages:
            assert alert["labels"] == {
                "alertname": sc.ALERT_COST_BUDGET_BURN,
                "tenant": TINY_BUDGET_TENANT,
                "severity": "page",
                "test": "fast",
            }
            assert alert["annotations"]["runbook_url"].endswith("#stagelenscostbudgetburn")
        print("e2e cost alert:", {k: round(v, 1) for k, v in took.items()})

    def test_billing_drift_reaches_alertmanager(self, stack: Stack) -> None:
        """Calls that go to vLLM past the gateway are generated and never billed: the
        reconciliation rule sees the gap (vLLM's generation_tokens against the gateway's
        output tokens) and StagelensBillingDrift opens a ticket, which it had not while every
        call went through the gateway."""
        (before,) = stack.prom.query("stagelens:billing_drift:ratio_rate1h")
        assert abs(float(before["value"][1])) < 0.05, before
        started = time.time()
        deadline = time.monotonic() + 120
        fresh: list[dict[str, Any]] = []
        while not fresh and time.monotonic() < deadline:
            send_traffic(stack.gateway, seconds=3, direct_to=stack.vllm_url)
            # A new firing, not one left from the first minute, when a new gateway series'
            # rate is still extrapolated over more than its data (`for:` is 3 s here).
            fresh = [
                a
                for a in _fast(stack.sink, ar.ALERT_BILLING_DRIFT)
                if _epoch(a["startsAt"]) >= started - 1
            ]
        assert fresh, stack.prom.query("ALERTS")
        assert fresh[0]["labels"]["severity"] == "ticket"
        (drift,) = stack.prom.query("stagelens:billing_drift:ratio_rate1h")
        assert float(drift["value"][1]) > 0.05
        print(f"e2e billing drift: {time.time() - started:.1f}s, drift {drift['value'][1]}")

    def test_all_503_window_pages(self, stack: Stack) -> None:
        """Every request answered 503: StagelensAvailabilityBudgetBurn and
        StagelensTTFTBudgetBurn page (a 503 is no first token)."""
        stack.gateway.fail_status = 503
        try:
            names = {ar.ALERT_AVAILABILITY_BUDGET_BURN, sc.ALERT_TTFT_BUDGET_BURN}
            took = _wait_for(stack, names, 120)
        finally:
            stack.gateway.fail_status = 0
        for name in names:
            (alert, *_) = _fast(stack.sink, name)
            assert alert["labels"]["severity"] == "page"
            assert alert["labels"]["model"] in (SERVED_MODEL, REASONING_MODEL)
        print("e2e 503 burn:", {k: round(v, 1) for k, v in took.items()})
