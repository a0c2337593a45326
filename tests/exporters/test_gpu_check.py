"""``examples/gpu_check.py`` runs on a bare GPU machine: torch, nvidia-ml-py, prometheus-client.

It maps the ``stagelens`` folders by hand and imports only the GPU modules, so those must
not pull in pydantic (``stagelens.config``) or OpenTelemetry. The example's own module code
runs in a subprocess with both blocked, then scrapes one collector over the NVML fake.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_RUN = """
import runpy, sys
for blocked in ("pydantic", "pydantic_settings", "opentelemetry"):
    sys.modules[blocked] = None
example = runpy.run_path(sys.argv[1], run_name="gpu_check")
from tests.exporters import fake_nvml
fake_nvml.configure([fake_nvml.FakeGpu(uuid="GPU-a")])
registry = example["CollectorRegistry"]()
reader = example["GpuReader"](fake_nvml, interval_s=3600)
registry.register(example["NvmlCollector"](reader=reader))
print(sorted(example["readings"](registry)))
reader.close()
"""


class TestGpuCheckExample:
    """The real-GPU check script's import footprint."""

    def test_imports_without_pydantic_or_opentelemetry(self) -> None:
        """The example's modules load and read the fake with pydantic and OTel unimportable."""
        env = {k: v for k, v in os.environ.items() if k != "STAGELENS_NVML_MODULE"}
        done = subprocess.run(
            [sys.executable, "-c", _RUN, str(ROOT / "examples" / "gpu_check.py")],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        wanted = "['memory_used_bytes', 'power_watts', 'utilization_ratio']"
        assert done.stdout.strip() == wanted
