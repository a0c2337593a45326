"""``stagelens demo``: start the reference stack on this machine and show the seven stages.

Steps, each with progress: generate (or reuse) the tiny model, start real vLLM backend(s)
on consecutive ports from ``--vllm-port``, start the instrumented gateway on ``--port``
(127.0.0.1 unless ``--host``), send a short traffic run and print the per-stage table, then
keep the stack up, print the URLs, and stop everything it started on Ctrl-C / SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from stagelens.errors import StageLensError

DEMO_PROMPTS = (
    "Explain where the time of an LLM request goes, stage by stage.",
    "What is a prefix cache and why does it lower time to first token?",
    "Give three ways to lower the cost per generated token.",
)


def _say(message: str) -> None:
    print(f"==> {message}", flush=True)


def _progress(label: str) -> Any:
    def show(elapsed: float) -> None:
        print(f"\r    {label}: {elapsed:5.0f}s", end="", flush=True)

    return show


def add_parser(subparsers: Any) -> None:
    """``stagelens demo``."""
    parser = subparsers.add_parser(
        "demo", help="start the reference gateway + real vLLM stack and show the stage table"
    )
    parser.add_argument("--port", type=int, default=8080, help="gateway port (default 8080)")
    parser.add_argument("--host", default="127.0.0.1", help="gateway bind address")
    parser.add_argument(
        "--vllm-port",
        type=int,
        default=8100,
        help="first vLLM port; backends use consecutive ports (default 8100)",
    )
    parser.add_argument("--backends", type=int, default=1, help="vLLM backends (default 1)")
    parser.add_argument(
        "--model", default=None, help="model directory or name (default: the generated tiny model)"
    )
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        help="gateway YAML config (API keys, pools); default: the demo config",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="gateway worker processes (default 1); with more, Prometheus metrics go through "
        "a multiprocess directory the demo sets up",
    )
    parser.add_argument("--no-traffic", action="store_true", help="skip the traffic run")
    parser.add_argument("--requests", type=int, default=48, help="requests in the traffic run")
    parser.add_argument(
        "--exit-after-traffic",
        action="store_true",
        help="stop the stack after printing the table (for scripts and CI)",
    )
    parser.set_defaults(func=run)


class _Stopped(KeyboardInterrupt):
    """Raised in the main thread by the first SIGINT/SIGTERM, wherever the demo is (vLLM
    start-up, traffic run, serving), so every ``finally`` on the way out stops what it
    started; a KeyboardInterrupt so that code catching only Exception lets it through."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def run(args: argparse.Namespace) -> int:
    """Run the demo; returns the exit status (128 + signal number when stopped by one)."""
    stopping = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        if stopping.is_set():
            return  # already stopping: let the cleanup (vLLM SIGTERM, then SIGKILL) finish
        stopping.set()
        raise _Stopped(signum)

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        return _run(args, stopping)
    except _Stopped as stop:
        print()
        _say(f"stopped by {signal.Signals(stop.signum).name}")
        return 128 + stop.signum
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _run(args: argparse.Namespace, stopping: threading.Event) -> int:
    from stagelens.reference import GatewayConfig, demo_config
    from stagelens.reference.config import DEMO_API_KEY
    from stagelens.reference.vllm_server import VllmServer, running

    if not os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") and not os.environ.get(
        "OTEL_TRACES_EXPORTER"
    ):
        os.environ["OTEL_TRACES_EXPORTER"] = "none"
        _say(
            "traces: no OTEL_EXPORTER_OTLP_ENDPOINT set, so spans are not exported "
            "(set it to send them to a collector)"
        )

    model = args.model
    if model is None:
        _say("generating the tiny model (first run only, a few seconds)")
        from stagelens.reference.tinymodel import ensure_tiny_model

        model = str(ensure_tiny_model())
    _say(f"model: {model}")

    logs = Path(os.environ.get("STAGELENS_LOG_DIR", Path.home() / ".cache" / "stagelens" / "logs"))
    servers = [
        VllmServer(
            model=model,
            port=args.vllm_port + i,
            served_model_names=("tiny", "tiny-chat"),
            log_path=logs / f"vllm-{args.vllm_port + i}.log",
        )
        for i in range(args.backends)
    ]
    backends = [s.base_url for s in servers]
    config = (
        GatewayConfig.load(args.config) if args.config is not None else demo_config(backends, model)
    )
    api_key = next(iter(config.api_keys)) if args.config is not None else DEMO_API_KEY

    _say(
        f"starting {len(servers)} vLLM backend(s) on {', '.join(backends)} "
        f"(about a minute on a CPU; logs in {logs}; Ctrl-C stops)"
    )
    # running() stops every server in its finally, however we leave (signal included).
    with (
        running(servers, timeout=900, progress=_progress("waiting for vLLM")),
        _gateway(args, config, logs) as gateway,
    ):
        try:
            _say(f"gateway up on {gateway}")
            if not args.no_traffic:
                _say(f"traffic run: {args.requests} requests (streamed and not, repeated prefixes)")
                asyncio.run(_traffic(gateway, api_key, args.requests))
                from stagelens.report import fetch, render_table

                print()
                print(render_table(fetch(f"{gateway}/metrics")))
                print()
            _print_urls(gateway, backends, api_key)
            if not args.exit_after_traffic:
                _say("stack is up; Ctrl-C stops everything")
                while not stopping.is_set():
                    stopping.wait(0.5)
        finally:
            _say("stopping")
    return 0


@contextlib.contextmanager
def _gateway(args: argparse.Namespace, config: Any, logs: Path) -> Iterator[str]:
    """The gateway on ``args.host:args.port``, stopped on exit; yields its URL. One worker:
    a uvicorn server on a thread of the demo. Several: ``stagelens.reference.serve`` as a
    child process (uvicorn workers, the Prometheus multiprocess directory set up and emptied
    by it), the config handed over in a file."""
    print()
    if args.workers > 1:
        from stagelens.reference.serve import GatewayProcess, write_config

        with tempfile.TemporaryDirectory(prefix="stagelens-demo-") as tmp:
            process = GatewayProcess(
                write_config(config, Path(tmp) / "gateway.yaml"),
                args.port,
                workers=args.workers,
                host=args.host,
                log_path=logs / f"gateway-{args.port}.log",
            )
            _say(f"starting the gateway with {args.workers} workers (log in {process.log_path})")
            with process:
                yield process.url
        return
    import uvicorn
    from stagelens.reference import create_app

    from stagelens import configure

    telemetry = configure()
    server = _quiet_server_class()(
        uvicorn.Config(
            create_app(config, telemetry=telemetry),
            host=args.host,
            port=args.port,
            log_level="warning",
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        while not server.started:
            if not thread.is_alive():
                raise StageLensError(f"the gateway could not start on {args.host}:{args.port}")
            time.sleep(0.05)
        yield f"http://{args.host}:{args.port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        telemetry.shutdown()


def _quiet_server_class() -> Any:
    import uvicorn

    class QuietServer(uvicorn.Server):
        """uvicorn without its own signal handlers: the demo owns Ctrl-C / SIGTERM."""

        def install_signal_handlers(self) -> None:
            return None

    return QuietServer


async def _traffic(gateway: str, api_key: str, n: int) -> None:
    import httpx

    rng = random.Random(0)
    shared = " ".join(["You are a helpful assistant for a platform team."] * 30)
    headers = {"authorization": f"Bearer {api_key}"}
    done = 0

    async def one(client: httpx.AsyncClient, i: int) -> None:
        nonlocal done
        content = rng.choice(DEMO_PROMPTS)
        body = {
            "model": "tiny" if i % 3 else "tiny-chat",
            "messages": [
                {"role": "system", "content": shared},
                {"role": "user", "content": content},
            ],
            "max_tokens": rng.choice((16, 32, 64)),
            "stream": i % 2 == 0,
        }
        if body["stream"]:
            async with client.stream("POST", "/v1/chat/completions", json=body) as r:
                async for _ in r.aiter_raw():
                    pass
        else:
            await client.post("/v1/chat/completions", json=body)
        done += 1
        print(f"\r    {done}/{n} requests", end="", flush=True)

    async with httpx.AsyncClient(base_url=gateway, headers=headers, timeout=120) as client:
        for start in range(0, n, 4):
            await asyncio.gather(*(one(client, i) for i in range(start, min(start + 4, n))))
    print()


def _print_urls(gateway: str, backends: list[str], api_key: str) -> None:
    print(f"  gateway     {gateway}/v1/chat/completions   (Authorization: Bearer {api_key})")
    print(f"  metrics     {gateway}/metrics")
    for url in backends:
        print(f"  vLLM        {url}/metrics  (engine + stagelens plugin metrics)")
    print("  Prometheus  scrape the two /metrics above (job names 'stagelens-gateway', 'vllm');")
    print("              rules: alerts/stagelens-rules.yaml and alerts/stagelens-alerts.yaml")
    print("  Grafana     import dashboards/*.json (or deploy/grafana/provisioning/)")
    print(f"  report      {sys.argv[0]} report --metrics-url {gateway}/metrics")
