"""One command for a real GPU machine: idle vs loaded NVML readings and scrape cost.

Needs only torch, nvidia-ml-py and prometheus-client. NOT yet run on a real GPU.
Run: python examples/gpu_check.py [--out docs/gpu-check-DATE.md]
Why the sys.modules setup: stagelens/__init__.py imports OpenTelemetry, absent on GPU images,
so the script maps the package folders without running that __init__.
"""

from __future__ import annotations

import argparse
import datetime
import sys
import threading
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for name, folder in (("stagelens", "stagelens"), ("stagelens.exporters", "exporters")):
    module = types.ModuleType(name)
    module.__path__ = [str(ROOT / folder)]
    sys.modules.setdefault(name, module)

from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402
from stagelens.exporters.nvml import NvmlCollector  # noqa: E402

WANTED = ("utilization_ratio", "sm_active_ratio", "power_watts", "memory_used_bytes")


def readings(registry: CollectorRegistry) -> dict[str, float]:
    """GPU-0 values of the wanted metrics."""
    out: dict[str, float] = {}
    for family in registry.collect():
        for s in family.samples:
            if s.labels.get("gpu") == "0" and s.name.endswith(WANTED):
                out[s.name.removeprefix("stagelens_gpu_")] = s.value
    return out


def load(stop: threading.Event) -> None:
    """A one-thread spinning kernel plus a bf16 matmul loop, as in GPU-FACTS.md."""
    import torch

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    while not stop.is_set():
        for _ in range(10):
            a @ a
        torch.cuda._sleep(1_000_000)  # one-thread spin kernel
        torch.cuda.synchronize()


def main() -> int:
    """Scrape idle, under load, print a table, optionally write it to --out."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    collector = NvmlCollector(interval_s=1.0)
    registry = CollectorRegistry()
    registry.register(collector)
    time.sleep(2.5)
    idle = readings(registry)
    stop = threading.Event()
    worker = threading.Thread(target=load, args=(stop,), daemon=True)
    worker.start()
    time.sleep(5)
    loaded = readings(registry)
    stop.set()
    worker.join()
    n = max(
        1, sum(1 for f in registry.collect() for s in f.samples if s.name.endswith("power_watts"))
    )
    start = time.perf_counter()
    for _ in range(50):
        generate_latest(registry)
    per = (time.perf_counter() - start) / 50 * 1e6
    collector.close()
    lines = ["| metric (GPU 0) | idle | loaded |", "|---|---|---|"]
    lines += [f"| {k} | {idle.get(k, float('nan')):.3g} | {v:.3g} |" for k, v in loaded.items()]
    lines.append(f"\nscrape cost: {per:.0f} us, {per / n:.0f} us per GPU ({n} GPUs)")
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(f"# GPU check {datetime.date.today()}\n\n{text}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
