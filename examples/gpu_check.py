"""One command for a real GPU machine: NVML readings idle, under a spin kernel, under a matmul;
and, with ``--engine URL``, a vLLM server's GPU-seconds by tenant against NVML's busy time.

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
    python examples/gpu_check.py --engine http://127.0.0.1:8000 --model NAME [--seconds 30]

``--engine``: a vLLM server on this machine's GPUs with stagelens installed and its
middleware on (``--middleware stagelens.exporters.vllm_join.EngineSecondsMiddleware``).
Three tenants send requests straight to it (ids minted as the gateway mints them,
``stagelens.engine_join``) for ``--seconds``; NVML's utilisation of the engine's GPUs is
sampled ten times a second throughout. It prints each tenant's GPU-seconds (the engine's
``stagelens_engine_seconds_total`` gained, times the GPUs it holds; and the same summed
from the answers' ``x-stagelens-engine`` values), their sum, the engine's busy and idle
GPU-seconds, and NVML's busy GPU-seconds (utilisation integrated over the window: the
time a kernel ran, which engine steps' CPU work does not reach). Only the standard library
and ``stagelens.engine_join`` are added to the imports above.

Exit status: 0 when the readings were taken (whatever they show), 1 when NVML or the load
failed (no GPU, NVML down, the torch load thread died, the engine did not answer).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import sys
import threading
import time
import types
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

ROOT = Path(__file__).resolve().parents[1]
for _name, _folder in (("stagelens", "stagelens"), ("stagelens.exporters", "exporters")):
    if _name not in sys.modules:
        _pkg = types.ModuleType(_name)
        _pkg.__path__ = [str(ROOT / _folder)]
        sys.modules[_name] = _pkg

from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402
from stagelens.exporters.nvml import NvmlCollector  # noqa: E402
from stagelens.exporters.nvml_sampler import GpuReader  # noqa: E402

from stagelens.engine_join import minted_id, read_engine_value  # noqa: E402

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


ENGINE_SERIES: Final = (
    "stagelens_engine_seconds_total",
    "stagelens_engine_busy_seconds_total",
    "stagelens_engine_idle_seconds_total",
)
TENANTS: Final = {"short": (40, 16), "long": (400, 16), "chatty": (40, 128)}
"""Tenant -> (prompt words, output tokens): short prompts and answers, long prompts, long
answers (each prompt unique: no prefix-cache hit)."""
SAMPLE_S: Final = 0.1
IDLE_MARGIN_S: Final = 6.0
"""The engine counts idle time up to 5 s before now: wait this long before each reading."""


def engine_readings(text: str) -> dict[str, dict[str, float]]:
    """From a vLLM ``/metrics`` page: ``stagelens_engine_seconds_total`` by tenant, and the
    busy and idle seconds (all models, all engines of the server)."""
    out: dict[str, dict[str, float]] = {name: {} for name in ENGINE_SERIES}
    for line in text.splitlines():
        name, _, rest = line.partition("{")
        if name not in out or "}" not in rest:
            continue
        labels, _, value = rest.rpartition("}")
        tenant = ""
        for pair in labels.split(","):
            key, _, quoted = pair.partition("=")
            if key.strip() == "tenant":
                tenant = quoted.strip().strip('"')
        try:
            number = float(value.split()[0])
        except (IndexError, ValueError):
            continue
        out[name][tenant] = out[name].get(tenant, 0.0) + number
    return out


class NvmlBusy:
    """NVML's busy time of some GPUs: utilisation (the share of the last sample period in
    which a kernel ran) sampled every ``interval_s`` and integrated, per GPU."""

    def __init__(self, nvml: Any, indices: list[int], interval_s: float = SAMPLE_S) -> None:
        self._nvml = nvml
        self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in indices]
        self._interval_s = interval_s
        self.busy = [0.0] * len(indices)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nvml-busy", daemon=True)

    def sample(self, dt: float) -> None:
        """Add ``dt`` seconds at each GPU's current utilisation."""
        for i, handle in enumerate(self._handles):
            self.busy[i] += self._nvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100 * dt

    def _run(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(self._interval_s):
            now = time.monotonic()
            self.sample(now - last)
            last = now

    def __enter__(self) -> NvmlBusy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def _chat(url: str, model: str, tenant: str, words: int, tokens: int) -> tuple[float, int] | None:
    """One chat completion with a minted id; the answer's (seconds, GPUs), if it says."""
    nonce = random.getrandbits(64)
    prompt = " ".join(f"w{nonce % 97}x{i}" for i in range(words))
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": tokens,
        "ignore_eos": True,
    }
    request = urllib.request.Request(
        f"{url}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={
            "content-type": "application/json",
            "x-request-id": minted_id(0, random.getrandbits(64), tenant),
        },
    )
    with urllib.request.urlopen(request, timeout=300) as answer:
        answer.read()
        return read_engine_value(answer.headers.get("x-stagelens-engine"))


def send_load(url: str, model: str, seconds: float) -> dict[str, list[tuple[float, int]]]:
    """Each tenant of ``TENANTS`` sends requests back to back, two at a time, for
    ``seconds``; each answer's (seconds, GPUs) by tenant."""
    answers: dict[str, list[tuple[float, int]]] = {t: [] for t in TENANTS}
    errors: list[BaseException] = []
    deadline = time.monotonic() + seconds

    def tenant(name: str) -> None:
        words, tokens = TENANTS[name]
        try:
            while time.monotonic() < deadline:
                found = _chat(url, model, name, words, tokens)
                if found is not None:
                    answers[name].append(found)
        except BaseException as exc:
            errors.append(exc)

    workers = [
        threading.Thread(target=tenant, args=(name,), daemon=True)
        for name in TENANTS
        for _ in (0, 1)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    if errors:
        raise RuntimeError(f"the engine failed a request: {errors[0]!r}")
    return answers


def engine_report(
    before: dict[str, dict[str, float]],
    after: dict[str, dict[str, float]],
    answers: dict[str, list[tuple[float, int]]],
    nvml_busy: list[float],
    wall: float,
) -> tuple[str, bool]:
    """The GPU-seconds table and its verdict; True when the tenants' GPU-seconds add up to
    the engine's busy GPU-seconds within 2 %, and busy plus idle to the wall time."""
    gpus = max((g for found in answers.values() for _, g in found), default=len(nvml_busy))
    gpus = gpus or len(nvml_busy)

    def gained(name: str, tenant: str | None = None) -> float:
        new, old = after[name], before[name]
        if tenant is not None:
            return new.get(tenant, 0.0) - old.get(tenant, 0.0)
        return sum(new.values()) - sum(old.values())

    lines = [
        "| tenant | requests | GPU-seconds (engine) | GPU-seconds (answers) |",
        "|---|---|---|---|",
    ]
    total = 0.0
    for tenant, found in answers.items():
        engine = gained(ENGINE_SERIES[0], tenant) * gpus
        total += engine
        said = sum(s for s, _ in found) * gpus
        lines.append(f"| {tenant} | {len(found)} | {engine:.3f} | {said:.3f} |")
    busy = gained(ENGINE_SERIES[1]) * gpus
    idle = gained(ENGINE_SERIES[2]) * gpus
    nvml = sum(nvml_busy)
    lines.append(f"| all tenants | | {total:.3f} | |")
    lines.append("")
    lines.append(
        f"engine busy {busy:.3f} GPU-s, idle {idle:.3f} GPU-s, wall {wall:.1f} s x {gpus} GPU(s)"
    )
    lines.append(
        f"NVML busy (kernel time) {nvml:.3f} GPU-s: {nvml / busy:.1%} of the engine's busy time"
        if busy > 0
        else f"NVML busy (kernel time) {nvml:.3f} GPU-s"
    )
    conserved = busy > 0 and abs(total - busy) <= 0.02 * busy
    whole = abs(busy + idle - wall * gpus) <= 0.02 * wall * gpus
    verdict = "conserved" if conserved and whole else "NOT conserved"
    lines.append(f"verdict: tenants {total:.3f} vs busy {busy:.3f}, busy + idle vs wall: {verdict}")
    return "\n".join(lines), conserved and whole


def engine_check(url: str, model: str, seconds: float, nvml: Any) -> tuple[str, bool]:
    """Load the engine for ``seconds`` while NVML samples its GPUs; the report."""
    count = nvml.nvmlDeviceGetCount()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    indices = [int(i) for i in visible.split(",")] if visible else list(range(count))
    time.sleep(IDLE_MARGIN_S)
    started = time.monotonic()
    before = engine_readings(_get(f"{url}/metrics"))
    with NvmlBusy(nvml, indices) as sampler:
        answers = send_load(url, model, seconds)
        time.sleep(IDLE_MARGIN_S)
        after = engine_readings(_get(f"{url}/metrics"))
    wall = time.monotonic() - started
    return engine_report(before, after, answers, sampler.busy, wall)


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as answer:
        text: str = answer.read().decode()
        return text


def main() -> int:
    """Idle, spin and matmul readings for GPU 0, one table, scrape cost; --out writes it.
    With --engine: the engine's GPU-seconds by tenant against NVML's busy time."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--engine", default=None, help="a vLLM server's base URL")
    parser.add_argument("--model", default=None, help="the model it serves (--engine)")
    parser.add_argument("--seconds", type=float, default=30.0, help="load time (--engine)")
    args = parser.parse_args()
    if args.engine:
        import pynvml

        pynvml.nvmlInit()
        try:
            text, ok = engine_check(args.engine.rstrip("/"), args.model, args.seconds, pynvml)
        except Exception as exc:
            print(f"FAIL: {exc}", file=sys.stderr)
            return 1
        print(text)
        if args.out:
            args.out.write_text(f"# GPU-seconds check {datetime.date.today()}\n\n{text}\n")
        return 0 if ok else 1
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
