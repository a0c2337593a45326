"""The standalone gpu-exporter serves /metrics with the NVML fake injected via env var."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tests.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]
_RUN = (
    "import sys, argparse; sys.path.insert(0, sys.argv[1]);"
    "from stagelens.exporters import nvml;"
    "p = argparse.ArgumentParser(); s = p.add_subparsers(); nvml.add_parser(s);"
    "a = p.parse_args(sys.argv[2:]); sys.exit(a.func(a))"
)


class TestGpuExporter:
    """Subprocess exporter behaviour."""

    def test_serves_metrics(self) -> None:
        """A real HTTP scrape returns collector_up 1 and the power gauge from the fake."""
        port = free_port()
        env = {**os.environ, "STAGELENS_NVML_MODULE": "tests.exporters.fake_nvml"}
        args = [str(ROOT), "gpu-exporter", "--port", str(port), "--interval", "0.2"]
        proc = subprocess.Popen([sys.executable, "-c", _RUN, *args], env=env, cwd=ROOT)
        try:
            body = ""
            for _ in range(100):
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics") as r:
                        body = r.read().decode()
                    break
                except OSError:
                    time.sleep(0.1)
            assert "stagelens_gpu_collector_up 1.0" in body
            assert "stagelens_gpu_power_watts{" in body
        finally:
            proc.terminate()
            proc.wait(timeout=10)
