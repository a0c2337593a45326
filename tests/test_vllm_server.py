"""How ``VllmServer`` places the engine's processes (no vLLM needed: the command is swapped)."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from stagelens.reference.vllm_server import Supervisor, VllmServer


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


def group_alive(pgid: int) -> bool:
    """Some process of the process group ``pgid`` still exists."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_supervisor_sweeps_a_killed_servers_orphans_and_restarts_it(tmp_path: Path) -> None:
    """SIGKILL of the server process alone leaves its child running in the group; the
    supervisor notices the exit, kills the orphan (the group is gone) and starts the
    server again, after its backoff."""
    server = _Sleeper(model="unused", port=1, log_path=tmp_path / "log")
    server.start()
    pid = server.pid
    assert pid is not None
    events: list[str] = []
    try:
        time.sleep(0.5)  # the child is started
        with Supervisor([server], interval=0.05, backoff=0.3, say=events.append) as supervisor:
            killed = time.monotonic()
            os.kill(pid, signal.SIGKILL)
            deadline = killed + 10
            while server.pid in (None, pid):
                assert time.monotonic() < deadline, "the server was not restarted"
                time.sleep(0.05)
            assert time.monotonic() - killed >= 0.3  # the backoff was waited
            deadline = time.monotonic() + 5  # swept, and reaped (given a moment)
            while group_alive(pid):
                assert time.monotonic() < deadline, "the killed server's child outlived it"
                time.sleep(0.05)
            assert supervisor.restarts == 1
            assert events == ["vLLM on port 1 died; restarting in 0s"]
            assert server.pid is not None
            assert group_alive(server.pid)
    finally:
        server.stop(grace=5)
