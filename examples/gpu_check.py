"""One command for a real GPU machine: NVML readings idle, under a spin kernel, under a matmul.

Reproduces the contrast in docs/gpu.md's H100 reference measurements: a one-thread,
one-block spinning kernel and a bf16 8192^3 matmul loop both give NVML util.gpu ~100 %,
while GPM SM activity is ~1 % for the first and ~97 % for the second. Prints one table
(GPU 0), the scrape cost, and a verdict.

Needs only torch (CUDA), nvidia-ml-py and prometheus-client: the stagelens package
``__init__`` modules (which import OpenTelemetry, pydantic, ...) are not run; the two
folders are mapped by hand and only the GPU modules ``stagelens.exporters.nvml``,
``nvml_sampler`` and ``nvml_read`` (prometheus-client + ``stagelens.semconv``) are
imported; ``tests/exporters/test_gpu_check.py`` checks that with pydantic and OpenTelemetry
blocked. Run from anywhere:

    python examples/gpu_check.py [--out docs/gpu-check-DATE.md]

Exit status: 0 when the readings were taken (whatever they show), 1 when NVML or the load
failed (no GPU, NVML down, the torch load thread died).
"""

from __future__ import annotations

import argparse
import datetime
import sys
import threading
import time
import types
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for _name, _folder in (("stagelens", "stagelens"), ("stagelens.exporters", "exporters")):
    if _name not in sys.modules:
        _pkg = types.ModuleType(_name)
        _pkg.__path__ = [str(ROOT / _folder)]
        sys.modules[_name] = _pkg

from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402
from stagelens.exporters.nvml import NvmlCollector  # noqa: E402
from stagelens.exporters.nvml_sampler import GpuReader  # noqa: E402

WANTED = ("utilization_ratio", "sm_active_ratio", "power_watts", "memory_used_bytes")
WARMUP_S = 4.0
"""Load runs this long before the reading: several GPM intervals and the power ramp."""


def readings(registry: CollectorRegistry) -> dict[str, float]:
    """GPU-0 values of the wanted metrics (short names)."""
    out: dict[str, float] = {}
    for family in registry.collect():
        for s in family.samples:
            short = s.name.removeprefix("stagelens_gpu_")
            if s.labels.get("gpu") == "0" and short in WANTED:
                out[short] = s.value
    return out


def spin(stop: threading.Event) -> None:
    """One thread in one block spinning (torch.cuda._sleep): util high, SMs idle."""
    import torch

    while not stop.is_set():
        torch.cuda._sleep(100_000_000)
        torch.cuda.synchronize()


def matmul(stop: threading.Event) -> None:
    """bf16 8192^3 matmul loop: util high and SMs busy."""
    import torch

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(a)
    while not stop.is_set():
        for _ in range(10):
            torch.matmul(a, a, out=out)
        torch.cuda.synchronize()


def loaded(
    registry: CollectorRegistry, load: Callable[[threading.Event], None]
) -> dict[str, float]:
    """Run ``load`` on a thread, warm up, read, stop; raise if the thread died."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            load(stop)
        except BaseException as exc:
            errors.append(exc)

    worker = threading.Thread(target=run, name=load.__name__, daemon=True)
    worker.start()
    time.sleep(WARMUP_S)
    if errors or not worker.is_alive():
        stop.set()
        raise RuntimeError(f"the {load.__name__} load thread died: {errors[:1]!r}")
    values = readings(registry)
    stop.set()
    worker.join(timeout=30)
    if errors:
        raise RuntimeError(f"the {load.__name__} load thread failed: {errors[0]!r}")
    return values


def main() -> int:
    """Idle, spin and matmul readings for GPU 0, one table, scrape cost; --out writes it."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    reader = GpuReader(interval_s=0.5)
    registry = CollectorRegistry()
    registry.register(NvmlCollector(reader=reader))
    try:
        if registry.get_sample_value("stagelens_gpu_collector_up") != 1.0:
            print("FAIL: NVML is not answering (stagelens_gpu_collector_up 0)", file=sys.stderr)
            return 1
        time.sleep(2.0)  # two GPM intervals at idle
        columns = {"idle": readings(registry)}
        try:
            columns["spin (1 thread)"] = loaded(registry, spin)
            time.sleep(2.0)  # let the GPM window leave the spin load
            columns["bf16 matmul"] = loaded(registry, matmul)
        except Exception as exc:
            print(f"FAIL: {exc}", file=sys.stderr)
            return 1
        n = sum(1 for f in registry.collect() for s in f.samples if s.name.endswith("power_watts"))
        start = time.perf_counter()
        for _ in range(50):
            generate_latest(registry)
        per = (time.perf_counter() - start) / 50 * 1e6
    finally:
        reader.close()
    lines = ["| metric (GPU 0) | " + " | ".join(columns) + " |"]
    lines.append("|---" * (len(columns) + 1) + "|")
    for key in WANTED:
        cells = [f"{c[key]:.3g}" if key in c else "-" for c in columns.values()]
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    spin_sm = columns["spin (1 thread)"].get("sm_active_ratio")
    mm_sm = columns["bf16 matmul"].get("sm_active_ratio")
    if spin_sm is None or mm_sm is None:
        verdict = "no GPM SM activity on this GPU (pre-Hopper or not permitted)"
    elif spin_sm < 0.1 and mm_sm > 0.8:
        verdict = "util-vs-SM-activity contrast reproduced"
    else:
        verdict = f"contrast NOT reproduced (spin {spin_sm:.3f}, matmul {mm_sm:.3f})"
    lines.append("")
    lines.append(f"scrape cost: {per:.0f} us for {n} GPU(s), {per / max(n, 1):.0f} us per GPU")
    lines.append(f"verdict: {verdict}")
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(f"# GPU check {datetime.date.today()}\n\n{text}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
