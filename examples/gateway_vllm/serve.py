"""Run the reference gateway as a server of its own, with one or several worker processes.

    python -m stagelens.reference.serve --config gateway.yaml --port 8080 --workers 4

Why a module of its own: several workers need an app each process can build for itself
(uvicorn's ``--factory``, reading the config from ``$STAGELENS_GATEWAY_CONFIG``), and
Prometheus metrics that add up across them: prometheus-client's multiprocess mode, whose
directory (``$PROMETHEUS_MULTIPROC_DIR``) must be set before any worker starts and emptied
of the previous run's files (a restarted gateway's counters start again from zero, as
Prometheus expects of a restart). ``/metrics`` is never on the public API's port: this
process serves it on the internal port (``metrics_host:metrics_port`` of the config, or
``--metrics-host``/``--metrics-port``), with one worker from that worker's registry, with
several from every worker's files added up. The state requests share, the usage ledger and
the rate limits, is in SQLite/PostgreSQL and Redis (see ``ledger`` and ``ratelimit``),
never in a worker's memory. ``GatewayProcess`` starts and stops such a server for
``stagelens demo`` and the tests.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Final

import yaml
from fastapi import FastAPI
from stagelens.reference.config import GatewayConfig
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from stagelens.errors import ConfigurationError, StageLensError

CONFIG_ENV: Final = "STAGELENS_GATEWAY_CONFIG"
"""Path of the YAML config every worker loads."""

MULTIPROC_ENV: Final = "PROMETHEUS_MULTIPROC_DIR"
"""prometheus-client's multiprocess directory (see ``stagelens.exporters.prometheus``)."""

READY_ENV: Final = "STAGELENS_GATEWAY_READY_DIR"
"""When set, each worker creates a file named by its pid there once it has started."""

WORKER_HEALTHCHECK_SECONDS: Final = 60
"""How long a worker may take to answer uvicorn's supervisor before it is replaced."""

TRACES_COPY_ENV: Final = "STAGELENS_DEMO_TRACES_ENDPOINT"
"""When set, every worker also sends its spans to this OTLP/HTTP endpoint (``stagelens
demo``'s trace receiver), beside what the ``OTEL_*`` variables name."""


def app() -> Any:
    """The uvicorn factory each worker calls: the config from ``$STAGELENS_GATEWAY_CONFIG``,
    telemetry from the environment (``stagelens.configure``)."""
    from stagelens.reference.app import create_app

    from stagelens import configure

    exporters = None
    copy = os.environ.get(TRACES_COPY_ENV)
    if copy:
        from stagelens.reference.demo_traces import configured_endpoint, span_exporters_with_copy

        exporters = span_exporters_with_copy(copy, configured_endpoint())
    telemetry = configure(span_exporters=exporters)
    gateway = create_app(GatewayConfig.load(os.environ[CONFIG_ENV]), telemetry=telemetry)
    ready = os.environ.get(READY_ENV)
    return gateway if not ready else _announcing(gateway, Path(ready))


def _announcing(asgi: ASGIApp, ready: Path) -> ASGIApp:
    """``asgi``, creating ``ready/<pid>`` once its start-up is complete (the first worker up
    answers ``/health`` long before the others on a busy machine)."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await asgi(scope, receive, send)
            return

        async def announce(message: Message) -> None:
            if message["type"] == "lifespan.startup.complete":
                (ready / str(os.getpid())).touch()
            await send(message)

        await asgi(scope, receive, announce)

    return app


def check_settings() -> None:
    """Refuse, before any worker starts, what each worker's ``configure()`` would refuse:
    a bad ``STAGELENS_*`` value, or under ``STAGELENS_STRICT=1`` an unknown ``STAGELENS_*``
    variable (without it, each worker warns about one once). ConfigurationError."""
    from stagelens.config import load_settings
    from stagelens.settings_env import report_unknown_variables

    if load_settings().strict:
        report_unknown_variables(os.environ, strict=True)


def write_config(config: GatewayConfig, path: Path) -> Path:
    """Write ``config`` as the YAML that :meth:`GatewayConfig.load` reads back."""
    path.write_text(yaml.safe_dump(config.model_dump(mode="json", exclude_none=True)))
    return path


def empty_multiproc_dir(path: Path) -> None:
    """Create ``path`` or remove the metric files (``*.db``) a previous run left there."""
    path.mkdir(parents=True, exist_ok=True)
    for stale in path.glob("*.db"):
        stale.unlink()


def serve_metrics(host: str, port: int) -> None:
    """Serve ``/metrics`` on ``host:port`` from a thread of this process: what the workers
    recorded, added up from the multiprocess directory when it is set, else this process's
    own registry (one worker, running in this process). OSError when the port is taken."""
    from prometheus_client import start_http_server
    from stagelens.exporters.prometheus import exposition_registry

    start_http_server(port, addr=host, registry=exposition_registry())


@contextlib.contextmanager
def serving_in_threads(
    gateway: FastAPI, port: int, metrics_port: int, host: str = "127.0.0.1"
) -> Iterator[None]:
    """Serve ``gateway`` (built by ``create_app``) on ``host:port`` and its internal
    ``/metrics`` on ``host:metrics_port`` from threads of this process, started before the
    block and stopped after it: for scripts that drive a gateway they built themselves
    (``scripts/previews.py``, ``benchmarks/disconnect_storm.py``)."""
    import threading

    import uvicorn
    from stagelens.reference.app import metrics_app

    servers = [
        uvicorn.Server(uvicorn.Config(app, host=host, port=at, log_level="warning"))
        for app, at in ((gateway, port), (metrics_app(gateway), metrics_port))
    ]
    threads = [threading.Thread(target=server.run, daemon=True) for server in servers]
    for thread in threads:
        thread.start()
    try:
        while not all(server.started for server in servers):
            time.sleep(0.05)
        yield
    finally:
        for server in servers:
            server.should_exit = True
        for thread in threads:
            thread.join(timeout=10)


def build_parser() -> argparse.ArgumentParser:
    """The command line (its own function: the Kubernetes manifest's command is checked
    against it)."""
    parser = argparse.ArgumentParser(prog="python -m stagelens.reference.serve")
    parser.add_argument("--config", type=Path, required=True, help="gateway YAML config")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--workers", type=int, default=1, help="worker processes (default 1)")
    parser.add_argument(
        "--metrics-host", default=None, help="internal /metrics address (default: the config's)"
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="internal /metrics port (default: the config's)",
    )
    parser.add_argument("--log-level", default="warning")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Serve the gateway until SIGINT/SIGTERM (uvicorn's handling: requests in flight end),
    and its metrics on the internal port. A bad config or ``STAGELENS_*`` setting: exit
    status 2 and the reason, before any worker starts."""
    import uvicorn

    args = build_parser().parse_args(argv)
    try:  # a bad config or setting fails here, once, not in every worker
        config = GatewayConfig.load(args.config)
        check_settings()
    except ConfigurationError as exc:
        print(f"stagelens: error: {exc}", file=sys.stderr)
        return 2
    os.environ[CONFIG_ENV] = str(args.config.resolve())
    own_dir: Path | None = None
    if args.workers > 1:
        configured = os.environ.get(MULTIPROC_ENV)
        directory = Path(configured) if configured else Path(tempfile.mkdtemp(prefix="stagelens-"))
        own_dir = None if configured else directory
        empty_multiproc_dir(directory)
        os.environ[MULTIPROC_ENV] = str(directory)
    metrics_host = args.metrics_host or config.metrics_host
    metrics_port = args.metrics_port or config.metrics_port
    try:
        try:
            serve_metrics(metrics_host, metrics_port)
        except OSError as exc:
            print(f"cannot serve /metrics on {metrics_host}:{metrics_port}: {exc}", file=sys.stderr)
            return 1
        uvicorn.run(
            "stagelens.reference.serve:app",
            factory=True,
            host=args.host,
            port=args.port,
            workers=args.workers,
            log_level=args.log_level,
            # uvicorn kills a worker that does not answer its supervisor's ping within this
            # many seconds (default 5) and starts another: a worker still importing the
            # tokenizer stack on a busy machine is slow, not hung (seen: workers killed
            # and restarted for minutes at load 25 on 2 cores).
            timeout_worker_healthcheck=WORKER_HEALTHCHECK_SECONDS,
        )
    finally:
        if own_dir is not None:
            shutil.rmtree(own_dir, ignore_errors=True)
    return 0


def _answers(url: str) -> bool:
    """``url`` answers HTTP at all (``/health`` answers 503 while every backend is down:
    the gateway is up all the same)."""
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except urllib.error.HTTPError:
        return True
    except (urllib.error.URLError, OSError):
        return False


class GatewayStartError(StageLensError, RuntimeError):
    """Raised when the gateway process exits or does not answer in time."""


@dataclass
class GatewayProcess:
    """``python -m stagelens.reference.serve`` as a child process in a process group of its
    own (the workers included), its output in ``log_path``."""

    config: Path
    port: int
    workers: int = 1
    host: str = "127.0.0.1"
    env: dict[str, str] = field(default_factory=dict)
    log_path: Path | None = None
    metrics_port: int | None = None
    """The internal ``/metrics`` port; None: the config's ``metrics_port``."""
    _proc: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    _log: IO[bytes] | None = field(default=None, init=False, repr=False)

    @property
    def url(self) -> str:
        """``http://host:port`` of the gateway."""
        return f"http://{self.host}:{self.port}"

    @property
    def metrics_url(self) -> str:
        """``http://metrics_host:metrics_port/metrics``: every worker's metrics."""
        config = GatewayConfig.load(self.config)
        port = self.metrics_port or config.metrics_port
        return f"http://{config.metrics_host}:{port}/metrics"

    def start(self, timeout: float = 300.0) -> None:
        """Start the server and wait until every worker has started and ``/health`` and
        ``/metrics`` answer (a worker's start, tokenizers loaded, takes seconds on a quiet
        machine and over a minute on a loaded one)."""
        cmd = [sys.executable, "-m", "stagelens.reference.serve", "--config", str(self.config)]
        cmd += ["--host", self.host, "--port", str(self.port), "--workers", str(self.workers)]
        if self.metrics_port is not None:
            cmd += ["--metrics-port", str(self.metrics_port)]
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log = self.log_path.open("ab")
        ready = Path(tempfile.mkdtemp(prefix="stagelens-ready-"))
        try:
            self._start(cmd, ready, timeout)
        except BaseException:  # a failed start, or Ctrl-C while waiting: stop what started
            self.kill()
            raise
        finally:
            shutil.rmtree(ready, ignore_errors=True)

    def _start(self, cmd: list[str], ready: Path, timeout: float) -> None:
        self._proc = subprocess.Popen(
            cmd,
            env={**os.environ, **self.env, READY_ENV: str(ready)},
            stdin=subprocess.DEVNULL,
            stdout=self._log if self._log is not None else subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            process_group=0,
        )
        deadline = time.monotonic() + timeout
        urls = (f"{self.url}/health", self.metrics_url)
        while len(list(ready.iterdir())) < self.workers or not all(map(_answers, urls)):
            where = f" (log: {self.log_path})" if self.log_path is not None else ""
            if self._proc.poll() is not None:
                raise GatewayStartError(f"the gateway exited with {self._proc.returncode}{where}")
            if time.monotonic() > deadline:
                raise GatewayStartError(f"the gateway did not answer on {self.url}{where}")
            time.sleep(0.1)

    def stop(self, grace: float = 30.0) -> None:
        """SIGTERM (requests in flight end, pending ledger writes are committed), then
        SIGKILL the group after ``grace`` seconds."""
        self._signal(signal.SIGTERM, grace)

    def kill(self) -> None:
        """SIGKILL the server and its workers at once (a crash, a node lost)."""
        self._signal(signal.SIGKILL, 30.0)

    def _signal(self, signum: int, grace: float) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                # SIGTERM to the supervisor only: it stops its workers in order.
                (os.killpg if signum == signal.SIGKILL else os.kill)(proc.pid, signum)
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=grace)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)  # workers left behind, if any
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> GatewayProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


if __name__ == "__main__":
    raise SystemExit(main())
