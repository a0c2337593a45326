"""A vLLM API server killed with SIGKILL leaves its engine process running in its process
group; the demo's supervisor sweeps it and starts the server again, which serves again.
Starts a vLLM server of its own (never the session's): run this module on its own."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from stagelens.reference.vllm_server import Supervisor, VllmServer

from tests.conftest import ARTIFACTS
from tests.test_vllm_server import group_alive

pytestmark = pytest.mark.vllm


def _members(pgid: int) -> list[int]:
    """Live (not zombie) processes of the process group ``pgid``, from /proc."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members


class TestKilledBackend:
    """A real vLLM server killed under the supervisor (sync)."""

    def test_sigkilled_api_server_is_swept_and_serves_again(
        self, tiny_model: Path, port_factory: Any
    ) -> None:
        """After SIGKILL of the API server alone, no process of its group is left within
        seconds (the engine core held ~1.7 GB as an orphan), and the restarted server
        answers a completion."""
        server = VllmServer(
            model=str(tiny_model),
            port=port_factory(),
            served_model_names=("tiny",),
            log_path=ARTIFACTS / "vllm-restart.log",
        )
        events: list[str] = []
        server.start()
        try:
            server.wait_ready(timeout=600)
            pid = server.pid
            assert pid is not None
            engines = [p for p in _members(pid) if p != pid]
            assert engines, "vLLM runs its engine in a child process of the API server"
            with Supervisor([server], interval=0.5, backoff=1.0, say=events.append):
                os.kill(pid, signal.SIGKILL)
                deadline = time.monotonic() + 60
                while group_alive(pid):
                    assert time.monotonic() < deadline, f"orphans left: {_members(pid)}"
                    time.sleep(0.2)
                server.wait_ready(timeout=600)  # raises if the restarted server exits
                assert server.pid not in (None, pid)
                r = httpx.post(
                    f"{server.base_url}/v1/completions",
                    json={"model": "tiny", "prompt": "again", "max_tokens": 2},
                    timeout=60,
                )
                assert r.status_code == 200, r.text
            assert events == [f"vLLM on port {server.port} died; restarting in 1s"]
        finally:
            server.stop()
