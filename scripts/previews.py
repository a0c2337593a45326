"""Draw docs/previews from a real run: the reference stack under mixed traffic for 16 minutes.

Starts real vLLM (the tiny model on CPU), the reference gateway with three tenants and daily
budgets of a realistic size for this traffic, ``stagelens gpu-exporter`` on the NVML test
fake (this machine has no GPU), and real Prometheus with the generated rules scraping all of
them; sends mixed traffic (streamed and not, both served models, prefix-sharing prompts,
answers of varied length, a few rejections), then draws every dashboard from Prometheus with
``stagelens.views.previews``. Costs about 20 minutes of a CPU; run it by hand, never in CI:

    .venv/bin/python scripts/previews.py [--minutes 16] [--out docs/previews]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
from stagelens.reference import GatewayConfig, create_app  # noqa: E402
from stagelens.reference.serve import serving_in_threads  # noqa: E402
from stagelens.reference.tinymodel import ensure_tiny_model  # noqa: E402
from stagelens.reference.vllm_server import VllmServer  # noqa: E402

import stagelens  # noqa: E402
from stagelens.slo.alert_rules import dump_yaml, render_alerts  # noqa: E402
from stagelens.slo.config import SloConfig  # noqa: E402
from stagelens.slo.recording_rules import render_rules  # noqa: E402
from stagelens.views.previews import render_previews  # noqa: E402
from tests._promstack import prom_stack  # noqa: E402

TENANTS = {"sk-acme": "acme", "sk-globex": "globex", "sk-initech": "initech"}
BUDGETS_USD = {"acme": 40.0, "globex": 15.0, "initech": 4.0}
"""Daily caps sized to this traffic (tiny prices, a few requests a second): acme spends well
inside its cap, initech near it."""
SHARE = {"sk-acme": 0.5, "sk-globex": 0.3, "sk-initech": 0.2}


_GPU_EXPORTER = """
import sys, time
from prometheus_client import CollectorRegistry, start_http_server
from stagelens.exporters.nvml import register_gpu_collector
from tests.exporters import fake_nvml

fake_nvml.configure([fake_nvml.FakeGpu(uuid="GPU-preview-0")])
registry = CollectorRegistry()
register_gpu_collector(registry, fake_nvml, interval_s=1.0, cost_usd_per_hour=2.5)
start_http_server(int(sys.argv[1]), addr="127.0.0.1", registry=registry)
while True:
    time.sleep(3600)
"""
"""The GPU exporter on the NVML test fake (this machine has no GPU): the collector
``stagelens gpu-exporter`` serves, handed the fake module instead of pynvml."""


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _traffic(url: str, seconds: float) -> int:
    rng = random.Random(7)
    prefixes = [f"You are assistant {i}. Answer briefly and politely. " * 25 for i in range(3)]
    stop = time.monotonic() + seconds
    sent = 0

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal sent
        while time.monotonic() < stop:
            key = rng.choices(list(SHARE), weights=list(SHARE.values()))[0]
            model = "tiny" if rng.random() < 0.7 else "tiny-chat"
            roll = rng.random()
            if roll < 0.03:
                model = "no-such-model"
            if roll > 0.98:
                key = "sk-wrong"
            body: dict[str, Any] = {
                "model": model,
                "messages": [
                    {"role": "user", "content": f"{rng.choice(prefixes)} q{rng.randint(0, 50)}"}
                ],
                "max_tokens": rng.choice((8, 16, 32, 64)),
                "stream": rng.random() < 0.7,
            }
            headers = {"Authorization": f"Bearer {key}"}
            response = await client.post("/v1/chat/completions", json=body, headers=headers)
            await response.aread()
            sent += 1
            await asyncio.sleep(rng.random() * 0.3)

    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        await asyncio.gather(*(worker(client) for _ in range(4)))
    return sent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--minutes", type=float, default=16.0)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "previews")
    args = parser.parse_args()
    model = str(ensure_tiny_model())
    vllm = VllmServer(model=model, port=_port(), served_model_names=("tiny", "tiny-chat"))
    gpu_port, gateway_port = _port(), _port()
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
    }
    exporter = subprocess.Popen(
        [sys.executable, "-c", _GPU_EXPORTER, str(gpu_port)], env=env, cwd=ROOT
    )
    vllm.start()
    try:
        vllm.wait_ready(timeout=900)
        config = GatewayConfig.model_validate(
            {
                "api_keys": TENANTS,
                "models": {
                    name: {"backends": [vllm.base_url], "tokenizer": model}
                    for name in ("tiny", "tiny-chat")
                },
                "balancing": "prefix_affinity",
            }
        )
        telemetry = stagelens.configure(
            set_global=False,
            span_exporters=[],
            daily_budgets_usd=BUDGETS_USD,
            tenants=tuple(TENANTS.values()),
        )
        app = create_app(config, telemetry=telemetry)
        # The gateway serves /metrics on an internal port of its own, never on the API's.
        metrics_port = _port()
        with (
            serving_in_threads(app, gateway_port, metrics_port),
            tempfile.TemporaryDirectory() as tmp,
        ):
            cfg = SloConfig()
            rules = Path(tmp) / "rules.yaml"
            rules.write_text(dump_yaml(render_rules(cfg)))
            alerts = Path(tmp) / "alerts.yaml"
            alerts.write_text(dump_yaml(render_alerts(cfg)))
            targets = {
                "stagelens-gateway": f"127.0.0.1:{metrics_port}",
                "vllm": f"127.0.0.1:{vllm.port}",
                "gpu": f"127.0.0.1:{gpu_port}",
            }
            ports = (_port(), _port(), _port())
            with prom_stack(ports, targets, [rules, alerts], "http://127.0.0.1:9/") as prom:
                started = time.time()
                sent = asyncio.run(_traffic(f"http://127.0.0.1:{gateway_port}", args.minutes * 60))
                time.sleep(5)
                minutes = (time.time() - started) / 60
                print(f"{sent} requests over {minutes:.1f} minutes")
                for path in render_previews(prom.prometheus_url, args.out, minutes=minutes):
                    print(path)
    finally:
        vllm.stop()
        exporter.terminate()
        exporter.wait(timeout=10)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
