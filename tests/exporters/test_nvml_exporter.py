"""The standalone ``stagelens gpu-exporter`` serves /metrics with the NVML fake injected."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tests._scaffold import free_port

ROOT = Path(__file__).resolve().parents[2]


class TestGpuExporter:
    """Subprocess exporter behaviour, started through the console script's own parser."""

    def test_serves_metrics(self) -> None:
        """A real HTTP scrape of ``stagelens gpu-exporter`` returns up 1 and the fake's power."""
        port = free_port()
        env = {**os.environ, "STAGELENS_NVML_MODULE": "tests.exporters.fake_nvml"}
        args = ["gpu-exporter", "--port", str(port), "--interval", "0.2"]
        proc = subprocess.Popen([sys.executable, "-m", "stagelens.cli", *args], env=env, cwd=ROOT)
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
            assert 'stagelens_gpu_power_watts{gpu="0"' in body
        finally:
            proc.terminate()
            proc.wait(timeout=10)
