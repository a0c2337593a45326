"""``stagelens demo``: start the reference stack on this machine and show the seven stages.

Steps, each with progress: generate (or reuse) the tiny model, start real vLLM chat
backend(s) on consecutive ports from ``--vllm-port`` (tool calls on), and beside them, at a
lower CPU priority, the embedding (pooling) server and the reasoning model
(``demo_extras``); start the instrumented gateway on ``--port`` (127.0.0.1 unless
``--host``; in this process, or with ``--workers N`` as N worker processes of
``stagelens.reference.serve``) and its ``/metrics`` on an internal port of its own
(``--metrics-port``) as soon as the chat backends serve; send a short traffic run and print
the per-stage table; then keep the stack up, print the URLs, give each extra a traffic run
of its own when it comes up, and stop everything it started on Ctrl-C / SIGTERM."""

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stagelens.reference.demo_urls import print_prometheus, print_urls

from stagelens.errors import StageLensError

EMBED_MODEL = "tiny-embed"
"""The embedding server's model name."""
THINK_MODEL = "tiny-think"
"""The reasoning model's name."""
DEMO_PROMPTS = (
    "Explain where the time of an LLM request goes, stage by stage.",
    "What is a prefix cache and why does it lower time to first token?",
    "Give three ways to lower the cost per generated token.",
)


def _log_dir() -> Path:
    """Where the demo writes its logs and its ``prometheus.yml``."""
    return Path(os.environ.get("STAGELENS_LOG_DIR", Path.home() / ".cache" / "stagelens" / "logs"))


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
        "--metrics-port",
        type=int,
        default=None,
        help="internal port of the gateway's /metrics (default: the config's, 9464)",
    )
    parser.add_argument(
        "--no-embeddings",
        action="store_true",
        help="do not start the embedding (pooling) server beside the chat backends",
    )
    parser.add_argument(
        "--tool-call-parser",
        default=None,
        help="vLLM tool-call parser for --model (the tiny model's is 'hermes')",
    )
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
        "--trace-port",
        type=int,
        default=None,
        help="port of the demo's OTLP/HTTP trace receiver (default 4318 when no "
        "OTEL_EXPORTER_OTLP_ENDPOINT is set, else a free one)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="gateway worker processes (default 1); with more, their metrics are added up "
        "through a Prometheus multiprocess directory the demo sets up",
    )
    parser.add_argument(
        "--no-reasoning",
        action="store_true",
        help="do not start the reasoning model (tiny-think: the tiny model's reasoning "
        "variant behind vLLM's step3 reasoning parser) beside the others",
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
    from stagelens.reference.demo_extras import BESIDE_NICENESS, Beside, Extra
    from stagelens.reference.vllm_server import Supervisor, VllmServer, running

    model, parser = args.model, args.tool_call_parser
    if model is None:
        _say("generating the tiny model (first run only, a few seconds)")
        from stagelens.reference.tinymodel import TOOL_CALL_PARSER, ensure_tiny_model

        model, parser = str(ensure_tiny_model()), parser or TOOL_CALL_PARSER
    _say(f"model: {model}")

    logs = _log_dir()
    servers = [
        VllmServer(
            model=model,
            port=args.vllm_port + i,
            served_model_names=("tiny", "tiny-chat"),
            log_path=logs / f"vllm-{args.vllm_port + i}.log",
            tool_call_parser=parser,
            engine_time=True,
        )
        for i in range(args.backends)
    ]
    backends = [s.base_url for s in servers]
    embedders = []
    if not args.no_embeddings:
        port = args.vllm_port + args.backends
        embedders.append(
            VllmServer(
                model=model,
                port=port,
                served_model_names=(EMBED_MODEL,),
                log_path=logs / f"vllm-{port}-embed.log",
                embed=True,
                max_model_len=512,
                niceness=BESIDE_NICENESS,
            )
        )
    thinkers = _thinkers(args, logs, args.vllm_port + args.backends + len(embedders))
    overrides = {} if args.metrics_port is None else {"metrics_port": args.metrics_port}
    config = (
        GatewayConfig.load(args.config).model_copy(update=overrides)
        if args.config is not None
        else demo_config(
            backends,
            model,
            embed_backends=[e.base_url for e in embedders],
            think_backends=[t.base_url for t in thinkers],
            think_model_dir=thinkers[0].model if thinkers else None,
            **overrides,
        )
    )
    api_key = next(iter(config.api_keys)) if args.config is not None else DEMO_API_KEY
    extras = [Extra(e, "the embedding server", EMBED_MODEL) for e in embedders]
    extras += [Extra(t, "the reasoning model", THINK_MODEL) for t in thinkers]

    chat = "the chat backend" if len(servers) == 1 else f"{len(servers)} chat backends"
    _say(
        f"starting {chat} on {', '.join(backends)} (about a minute on two CPU cores; logs "
        f"in {logs}; Ctrl-C stops)"
    )
    if extras:
        _say(
            " and ".join(f"{e.what} ({e.server.base_url})" for e in extras)
            + " start once it serves, at a lower CPU priority: the first table does not wait "
            "for them, and each joins when it is up"
        )
    everything = [*servers, *embedders, *thinkers]
    # Each context stops what it started in its finally, however we leave (signal included).
    # The extras start once the chat backend serves: on a small machine they would slow its
    # start, and the first table needs only it.
    with (
        Beside(extras, say=_say) as beside,
        running(servers, timeout=900, progress=_progress(f"waiting for {chat}")),
    ):
        print()
        beside.start()
        traces = _start_traces(args)
        try:
            with (
                _gateway(args, config, logs, traces) as served,
                Supervisor(everything, say=_say),  # a dead backend is restarted
            ):
                try:
                    _show(args, served, traces, api_key, backends, embedders, beside, stopping)
                finally:
                    _say("stopping")
        finally:
            traces.stop()
    return 0


def _thinkers(args: argparse.Namespace, logs: Path, port: int) -> list[Any]:
    """The reasoning model's server (``tiny-think``), when the demo serves its own tiny
    model and ``--no-reasoning`` was not given: the tiny model's reasoning variant behind
    vLLM's ``step3`` reasoning parser. It thinks for the request's
    ``thinking_token_budget`` tokens (vLLM then ends the thinking), then answers."""
    if args.model is not None or args.no_reasoning or args.config is not None:
        return []
    from stagelens.reference.demo_extras import BESIDE_NICENESS
    from stagelens.reference.tinymodel import (
        REASONING_CONFIG,
        REASONING_PARSER,
        ensure_tiny_model,
    )
    from stagelens.reference.vllm_server import VllmServer

    model = str(ensure_tiny_model(THINK_MODEL, reasoning=True))
    return [
        VllmServer(
            model=model,
            port=port,
            served_model_names=(THINK_MODEL,),
            log_path=logs / f"vllm-{port}-think.log",
            niceness=BESIDE_NICENESS,
            engine_time=True,
            extra_args=(
                "--reasoning-parser",
                REASONING_PARSER,
                "--reasoning-config",
                REASONING_CONFIG,
            ),
        )
    ]


@dataclass(frozen=True)
class _Served:
    """The running gateway: its URL, its metrics' URL, and its Telemetry when it runs in
    this process (None: in worker processes, which export their spans themselves)."""

    url: str
    metrics: str
    telemetry: Any


@contextlib.contextmanager
def _gateway(args: argparse.Namespace, config: Any, logs: Path, traces: Any) -> Iterator[_Served]:
    """The gateway on ``args.host:args.port`` and its metrics on the internal port, stopped
    on exit. One worker: uvicorn servers on threads of the demo. Several:
    ``stagelens.reference.serve`` as a child process (uvicorn workers; it sets up and
    empties the Prometheus multiprocess directory and serves the workers' metrics added
    up), the config handed over in a file, each worker sending a copy of its spans to the
    demo's receiver."""
    if args.workers > 1:
        from stagelens.reference.serve import TRACES_COPY_ENV, GatewayProcess, write_config

        with tempfile.TemporaryDirectory(prefix="stagelens-demo-") as tmp:
            process = GatewayProcess(
                write_config(config, Path(tmp) / "gateway.yaml"),
                args.port,
                workers=args.workers,
                host=args.host,
                env={TRACES_COPY_ENV: traces.receiver.traces_endpoint},
                log_path=logs / f"gateway-{args.port}.log",
            )
            _say(f"starting the gateway with {args.workers} workers (log in {process.log_path})")
            with process:
                yield _Served(process.url, process.metrics_url, None)
        return
    from stagelens.reference import create_app, metrics_app

    from stagelens import configure

    telemetry = configure(span_exporters=traces.exporters)
    app = create_app(config, telemetry=telemetry)
    started = []
    try:
        started.append(_serve(app, args.host, args.port, "gateway"))
        started.append(
            _serve(metrics_app(app), config.metrics_host, config.metrics_port, "metrics")
        )
        metrics = f"http://{config.metrics_host}:{config.metrics_port}/metrics"
        yield _Served(f"http://{args.host}:{args.port}", metrics, telemetry)
    finally:
        for server, thread in started:
            server.should_exit = True
            thread.join(timeout=10)
        telemetry.shutdown()


def _show(
    args: argparse.Namespace,
    served: _Served,
    traces: Any,
    api_key: str,
    backends: list[str],
    embedders: list[Any],
    beside: Any,
    stopping: threading.Event,
) -> None:
    """The traffic run, its table and slowest trace, the URLs; then the extras' traffic as
    each comes up, and wait for Ctrl-C (or, with ``--exit-after-traffic``, for the extras)."""
    gateway, metrics = served.url, served.metrics
    _say(f"gateway up on {gateway}; its metrics on {metrics} (internal port)")
    slowest: str | None = None
    shown: set[str] = set()  # the extras' models the traffic has reached
    if not args.no_traffic:
        ready = {e.model for e in beside.ready()}
        apis = "chat, Responses and Messages APIs, streamed and not, repeated prefixes"
        also = [m for m in (EMBED_MODEL, THINK_MODEL) if m in ready]
        _say(
            f"traffic run: {args.requests} requests ({apis}"
            + (f"; {', '.join(also)} too" if also else "")
            + ")"
        )
        embeddings, thinking = EMBED_MODEL in ready, THINK_MODEL in ready
        asyncio.run(_traffic(gateway, api_key, args.requests, embeddings, thinking))
        shown |= ready
        slowest = _print_table(served, traces, metrics, args.requests, thinking)
    print_urls(gateway, metrics, backends, [e.base_url for e in embedders], api_key)
    print_prometheus(_log_dir() / "prometheus.yml", metrics, backends, args.workers)
    _print_trace_urls(traces, slowest, metrics)
    sent = args.requests if not args.no_traffic else 0
    if args.exit_after_traffic:
        for extra in beside.wait_all(900, stopping):
            _say(f"{extra.what} did not come up; its log: {extra.server.log_path}")
        _extras_traffic(args, served, traces, api_key, beside, shown, sent)
        return
    _say("stack is up; Ctrl-C stops everything")
    while not stopping.is_set():
        sent = _extras_traffic(args, served, traces, api_key, beside, shown, sent)
        stopping.wait(0.5)


def _print_table(
    served: _Served, traces: Any, metrics: str, sent: int, thinking: bool
) -> str | None:
    """The stage table of every request so far and the slowest trace; its trace id."""
    from stagelens.views.report import fetch, render_table

    # The spans first: with every request's spans received the table's percentiles are the
    # exact ones of those requests, not bucket estimates.
    traces.wait_for(served.telemetry, sent)
    print()
    print(render_table(fetch(metrics), traces.spans()))
    print()
    kept, line = sampler_summary(metrics)
    slowest: str | None = traces.print_slowest(served.telemetry, sent if kept is None else kept)
    if line is not None:
        _say(line)
    print()
    if thinking:
        traces.print_thinking()
        print()
    return slowest


def _extras_traffic(
    args: argparse.Namespace,
    served: _Served,
    traces: Any,
    api_key: str,
    beside: Any,
    shown: set[str],
    sent: int,
) -> int:
    """Each extra up since the last look gets its own short traffic run and the table
    again; returns the requests sent in all."""
    from stagelens.reference.demo_extras import EXTRA_REQUESTS, run_extra_traffic

    for extra in beside.ready():
        if extra.model in shown:
            continue
        shown.add(extra.model)
        if args.no_traffic:
            continue
        _say(f"{EXTRA_REQUESTS} requests to {extra.model}, then the table again")
        run_extra_traffic(served.url, api_key, extra, embed_model=EMBED_MODEL, prompts=DEMO_PROMPTS)
        sent += EXTRA_REQUESTS
        _print_table(served, traces, served.metrics, sent, extra.model == THINK_MODEL)
    return sent


def sampler_summary(metrics_url: str) -> tuple[int | None, str | None]:
    """What the tail sampler (``OTEL_TRACES_SAMPLER=stagelens_tail``) kept, read from the
    gateway's ``/metrics``: (traces kept, one line saying how many of how many and why), or
    (None, None) under another sampler (no decisions counted)."""
    import httpx

    from stagelens import semconv as sc

    kept: dict[str, float] = {}
    dropped = 0.0
    try:
        text = httpx.get(metrics_url, timeout=10).text
    except httpx.HTTPError:
        return None, None
    for line in text.splitlines():
        if not line.startswith(sc.TRACE_DECISIONS + "{"):
            continue
        labels = dict(
            pair.split("=", 1) for pair in line.split("{", 1)[1].split("}", 1)[0].split(",")
        )
        value = float(line.rsplit(" ", 1)[1])
        reason = labels.get(sc.LABEL_REASON, "").strip('"')
        if labels.get(sc.LABEL_DECISION, "").strip('"') == sc.DECISION_KEPT:
            kept[reason] = kept.get(reason, 0.0) + value
        else:
            dropped += value
    if not kept and not dropped:
        return None, None
    total = int(sum(kept.values()))
    why = ", ".join(f"{reason} {int(n)}" for reason, n in sorted(kept.items()) if n)
    line = (
        f"the tail sampler ({sc.TRACES_SAMPLER_TAIL}) kept {total} of {total + int(dropped)} "
        f"traces ({why or 'none'}); the other {int(dropped)} were dropped unbuilt, and the "
        "metrics above count every request"
    )
    return total, line


def _start_traces(args: argparse.Namespace) -> Any:
    """The demo's trace receiver and exporters (``demo_traces``), announced."""
    from stagelens.reference.demo_traces import DemoTraces

    traces = DemoTraces.start(args.trace_port)
    _say(traces.describe())
    return traces


def _print_trace_urls(traces: Any, slowest: str | None, metrics: str) -> None:
    for line in traces.where(slowest):
        print(line)
    print(f"  page        {sys.argv[0]} report --metrics-url {metrics} --html report.html")


def _serve(app: Any, host: str, port: int, what: str) -> tuple[Any, threading.Thread]:
    """Serve ``app`` on a thread (uvicorn without its own signal handlers); wait until up."""
    import uvicorn

    server = _quiet_server_class()(uvicorn.Config(app, host=host, port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            raise StageLensError(f"the {what} server could not start on {host}:{port}")
        time.sleep(0.05)
    return server, thread


def _quiet_server_class() -> Any:
    import uvicorn

    class QuietServer(uvicorn.Server):
        """uvicorn without its own signal handlers: the demo owns Ctrl-C / SIGTERM."""

        def install_signal_handlers(self) -> None:
            return None

    return QuietServer


async def _traffic(
    gateway: str, api_key: str, n: int, embeddings: bool, thinking: bool = False
) -> None:
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
        if thinking and i % 6 == 4:  # a reasoning model: it thinks, then answers (streamed)
            body |= {"model": THINK_MODEL, "stream": True}
            body["thinking_token_budget"] = rng.choice((8, 16, 24))
        path = "/v1/chat/completions"
        if i % 5 == 1:  # an agent on the OpenAI Responses API
            path = "/v1/responses"
            body = {"model": body["model"], "instructions": shared, "input": content,
                    "max_output_tokens": body["max_tokens"], "stream": body["stream"]}  # fmt: skip
        elif i % 5 == 3:  # an agent on the Anthropic Messages API
            path = "/v1/messages"
            body = {key: body[key] for key in ("model", "max_tokens", "stream")}
            body |= {"system": shared, "messages": [{"role": "user", "content": content}]}
        if embeddings and i % 8 == 7:
            await client.post("/v1/embeddings", json={"model": EMBED_MODEL, "input": content})
        elif body["stream"]:
            async with client.stream("POST", path, json=body) as r:
                async for _ in r.aiter_raw():
                    pass
        else:
            await client.post(path, json=body)
        done += 1
        print(f"\r    {done}/{n} requests", end="", flush=True)

    async with httpx.AsyncClient(base_url=gateway, headers=headers, timeout=120) as client:
        for start in range(0, n, 4):
            await asyncio.gather(*(one(client, i) for i in range(start, min(start + 4, n))))
    print()
