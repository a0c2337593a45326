"""Scrape cost of NvmlCollector per GPU against the NVML FAKE (our overhead only).

Real NVML calls add their own cost (~30 us for three core calls on an H100, GPU-FACTS.md);
this measures only stagelens' Python work to build the metric families.
Run: .venv/bin/python benchmarks/nvml_scrape_cost.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prometheus_client import CollectorRegistry, generate_latest
from stagelens.exporters.nvml import NvmlCollector

from tests.exporters import fake_nvml


def main() -> None:
    """Print fake-NVML scrape cost for 1 and 8 GPUs."""
    for n in (1, 8):
        fake_nvml.configure([fake_nvml.FakeGpu(uuid=f"GPU-{i}") for i in range(n)])
        registry = CollectorRegistry()
        registry.register(NvmlCollector(fake_nvml, gpm=False))
        rounds = 500
        start = time.perf_counter()
        for _ in range(rounds):
            generate_latest(registry)
        per = (time.perf_counter() - start) / rounds * 1e6
        print(f"fake NVML, {n} GPU(s): {per:.0f} us per scrape, {per / n:.0f} us per GPU")


if __name__ == "__main__":
    main()
