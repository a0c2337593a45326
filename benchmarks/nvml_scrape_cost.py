"""Scrape cost of NvmlCollector against the NVML FAKE (stagelens' own Python work only).

What it measures: one ``generate_latest()`` of a registry holding only the GPU collector,
for 1 and 8 fake GPUs, and how many NVML calls one scrape makes. Real NVML adds its own
latency per call (docs/gpu.md, reference measurements: three core calls ~30 us together on
an H100, so ~10 us per call); the script prints that estimate beside the measured figure,
labelled as an estimate.
The process list and GPM run on the background sampler, not in the scrape.
Run: .venv/bin/python benchmarks/nvml_scrape_cost.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prometheus_client import CollectorRegistry, generate_latest
from stagelens.exporters.nvml import NvmlCollector
from stagelens.exporters.nvml_sampler import GpuReader

from tests.exporters import fake_nvml

REAL_US_PER_CALL = 10.0
"""~30 us for three core calls on a real H100 (docs/gpu.md, reference measurements)."""


def main() -> None:
    """Print fake-NVML scrape cost and NVML calls per scrape for 1 and 8 GPUs."""
    for n in (1, 8):
        fake_nvml.configure([fake_nvml.FakeGpu(uuid=f"GPU-{i}") for i in range(n)])
        reader = GpuReader(fake_nvml, interval_s=3600)  # sampler started, then idle
        registry = CollectorRegistry()
        registry.register(NvmlCollector(reader=reader))
        generate_latest(registry)  # identity cache warm, as after the first scrape
        before = sum(fake_nvml.calls.values())
        rounds = 500
        start = time.perf_counter()
        for _ in range(rounds):
            generate_latest(registry)
        per = (time.perf_counter() - start) / rounds * 1e6
        calls = (sum(fake_nvml.calls.values()) - before) / rounds
        reader.close()
        print(
            f"fake NVML, {n} GPU(s): {per:.0f} us per scrape ({per / n:.0f} us per GPU), "
            f"{calls:.0f} NVML calls per scrape; estimated real NVML time "
            f"{calls * REAL_US_PER_CALL:.0f} us (at {REAL_US_PER_CALL:.0f} us/call, not measured)"
        )


if __name__ == "__main__":
    main()
