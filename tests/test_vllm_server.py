"""How ``VllmServer`` places the engine's processes (no vLLM needed: the command is swapped)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from stagelens.reference.vllm_server import VllmServer


class _Sleeper(VllmServer):
    """A ``VllmServer`` whose "engine" is a sleeping Python child with its own child."""

    def command(self) -> list[str]:
        code = (
            "import subprocess, sys, time;"
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']);"
            "time.sleep(60)"
        )
        return [sys.executable, "-c", code]


def test_engine_gets_its_own_process_group_but_shares_our_session(tmp_path: Path) -> None:
    """Own process group: stop() reaches the engine's children. Same session, hence the same
    scheduler autogroup: in a session of its own a busy CPU engine starved the gateway for
    seconds (a disconnected client's generation then ran to max_tokens)."""
    server = _Sleeper(model="unused", port=1, log_path=tmp_path / "log")
    server.start()
    pid = server.pid
    assert pid is not None
    try:
        assert os.getpgid(pid) == pid
        assert os.getpgid(pid) != os.getpgid(0)
        assert os.getsid(pid) == os.getsid(0)
    finally:
        server.stop(grace=5)
    # The whole group is gone, the grandchild included (given a moment to be reaped).
    deadline = time.monotonic() + 5
    while True:
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            break
        assert time.monotonic() < deadline, "the engine's process group outlived stop()"
        time.sleep(0.05)
