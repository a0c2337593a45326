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


_ENGINE = """
import runpy, sys
for blocked in ("pydantic", "pydantic_settings", "opentelemetry"):
    sys.modules[blocked] = None
example = runpy.run_path(sys.argv[1], run_name="gpu_check")
from tests.exporters import fake_nvml
gpus = [fake_nvml.FakeGpu(uuid="GPU-a", util_gpu=100), fake_nvml.FakeGpu(uuid="GPU-b", util_gpu=40)]
fake_nvml.configure(gpus)
fake_nvml.nvmlInit()
busy = example["NvmlBusy"](fake_nvml, [0, 1])
busy.sample(2.0)
print(busy.busy)
"""


class TestEngineCheck:
    """``--engine``: GPU-seconds by tenant against NVML's busy time (the logic; the run
    itself needs a GPU machine with vLLM)."""

    @staticmethod
    def _example() -> dict[str, object]:
        import runpy

        return runpy.run_path(str(ROOT / "examples" / "gpu_check.py"), run_name="gpu_check")

    def test_nvml_busy_time_is_utilisation_integrated(self) -> None:
        """Two GPUs at 100 % and 40 % for 2 s: 2.0 and 0.8 busy seconds, read through the
        NVML fake with pydantic and OpenTelemetry unimportable."""
        done = subprocess.run(
            [sys.executable, "-c", _ENGINE, str(ROOT / "examples" / "gpu_check.py")],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "[2.0, 0.8]"

    def test_the_engines_page_is_read_as_the_plugin_writes_it(self) -> None:
        """The engine's series as the vLLM plugin serves them (its own instruments, on a
        registry rendered by prometheus-client) are read back by tenant."""
        from prometheus_client import CollectorRegistry, generate_latest
        from stagelens.exporters.vllm_metrics import EngineMetrics

        registry = CollectorRegistry()
        metrics = EngineMetrics(registry)
        assert metrics.engine_seconds is not None
        metrics.engine_seconds.labels("m", "acme").inc(1.5)
        metrics.engine_seconds.labels("m", "globex").inc(0.5)
        metrics.busy.labels("host/engine0", "m").inc(2.25)
        metrics.idle.labels("host/engine0", "m").inc(7.0)
        read = self._example()["engine_readings"](generate_latest(registry).decode())
        assert read["stagelens_engine_seconds_total"] == {"acme": 1.5, "globex": 0.5}
        assert read["stagelens_engine_busy_seconds_total"] == {"": 2.25}
        assert read["stagelens_engine_idle_seconds_total"] == {"": 7.0}

    def test_the_report_adds_the_tenants_up_against_busy_and_nvml(self) -> None:
        """Tenants' shares times the GPUs, their sum against the engine's busy time, busy
        plus idle against the wall time, and NVML's kernel time as a share of busy."""
        report = self._example()["engine_report"]
        before = {
            "stagelens_engine_seconds_total": {"a": 1.0},
            "stagelens_engine_busy_seconds_total": {"": 1.0},
            "stagelens_engine_idle_seconds_total": {"": 5.0},
        }
        after = {
            "stagelens_engine_seconds_total": {"a": 4.0, "b": 2.0},
            "stagelens_engine_busy_seconds_total": {"": 6.0},
            "stagelens_engine_idle_seconds_total": {"": 10.0},
        }
        answers = {"a": [(1.5, 2), (1.5, 2)], "b": [(2.0, 2)]}
        text, ok = report(before, after, answers, [4.0, 4.0], 10.0)
        assert ok
        assert "| a | 2 | 6.000 | 6.000 |" in text
        assert "| b | 1 | 4.000 | 4.000 |" in text
        assert "| all tenants | | 10.000 | |" in text
        assert "NVML busy (kernel time) 8.000 GPU-s: 80.0% of the engine's busy time" in text
        lost = {**after, "stagelens_engine_seconds_total": {"a": 4.0, "b": 1.0}}
        assert not report(before, lost, answers, [4.0, 4.0], 10.0)[1]
