"""GPU metrics from NVML as a Prometheus collector.

Why a custom collector: NVML is read at scrape time for the cheap calls (~30 us for
utilisation, memory, power on a real H100) and a background thread keeps the slow GPM
samples (SM activity needs two samples some time apart), so a scrape never waits on them.
The ``nvml`` module is a parameter so CI can inject a fake (``tests/exporters/fake_nvml.py``);
by default ``pynvml`` (nvidia-ml-py) is imported lazily. Telemetry never breaks the host:
a missing library or driver yields ``stagelens_gpu_collector_up 0`` and one warning.

NOT yet verified on a real GPU by this module's author: only against the fake, whose
values come from the H100 readings in GPU-FACTS.md.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from stagelens import semconv

_log = logging.getLogger(__name__)

COST_ENV: str = "STAGELENS_GPU_COST_USD_PER_HOUR"
"""Env var: price of one GPU-hour in USD, exported as a gauge per GPU."""

NVML_MODULE_ENV: str = "STAGELENS_NVML_MODULE"
"""Env var: import path of the NVML module (default ``pynvml``); tests point it at the fake."""

_FATAL_ERRORS: tuple[str, ...] = (
    "NVMLError_LibraryNotFound",
    "NVMLError_DriverNotLoaded",
    "NVMLError_Uninitialized",
    "NVMLError_NoPermission",
)


@dataclass
class GpuSample:
    """One GPU's readings in SI units; ``None`` means NVML did not answer for that reading."""

    index: int
    uuid: str
    name: str
    utilization: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    power_watts: float | None = None
    energy_joules: float | None = None
    temperature_celsius: float | None = None
    sm_clock_hertz: float | None = None
    clock_event_reasons: int | None = None
    processes: list[tuple[int, int]] = field(default_factory=list)
    sm_active: float | None = None


def _text(value: Any) -> str:
    """NVML returns bytes in old bindings and str in new ones."""
    return value.decode() if isinstance(value, bytes) else str(value)


def _try(nvml: Any, call: Any, *args: Any) -> Any:
    """Call one NVML function; a per-GPU error (NotSupported, MIG) becomes ``None``."""
    try:
        return call(*args)
    except nvml.NVMLError as exc:
        if type(exc).__name__ in _FATAL_ERRORS:
            raise
        return None


def read_gpu_samples(nvml: Any, sm_active: dict[int, float] | None = None) -> list[GpuSample]:
    """Read every GPU once (NVML must be initialised); units converted to SI.

    ``sm_active`` maps GPU index to the latest GPM SM activity from the background sampler.
    """
    samples: list[GpuSample] = []
    for index in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        sample = GpuSample(
            index=index,
            uuid=_text(_try(nvml, nvml.nvmlDeviceGetUUID, handle) or ""),
            name=_text(_try(nvml, nvml.nvmlDeviceGetName, handle) or ""),
        )
        util = _try(nvml, nvml.nvmlDeviceGetUtilizationRates, handle)
        if util is not None:
            sample.utilization = util.gpu / 100.0
        mem = _try(nvml, nvml.nvmlDeviceGetMemoryInfo, handle)
        if mem is not None:
            sample.memory_used_bytes = int(mem.used)
            sample.memory_total_bytes = int(mem.total)
        power = _try(nvml, nvml.nvmlDeviceGetPowerUsage, handle)
        if power is not None:
            sample.power_watts = power / 1000.0
        energy = _try(nvml, nvml.nvmlDeviceGetTotalEnergyConsumption, handle)
        if energy is not None:
            sample.energy_joules = energy / 1000.0
        temp = _try(nvml, nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU)
        if temp is not None:
            sample.temperature_celsius = float(temp)
        clock = _try(nvml, nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_SM)
        if clock is not None:
            sample.sm_clock_hertz = clock * 1e6
        reasons = _try(nvml, nvml.nvmlDeviceGetCurrentClocksEventReasons, handle)
        if reasons is not None:
            sample.clock_event_reasons = int(reasons)
        procs = _try(nvml, nvml.nvmlDeviceGetComputeRunningProcesses, handle)
        for proc in procs or []:
            if proc.usedGpuMemory is not None:
                sample.processes.append((int(proc.pid), int(proc.usedGpuMemory)))
        if sm_active is not None and index in sm_active:
            sample.sm_active = sm_active[index]
        samples.append(sample)
    return samples


class GpmSampler:
    """Background thread: one GPM sample per interval, diffed against the previous one.

    Why: GPM metrics need two samples apart in time; waiting inside a scrape would block it.
    """

    def __init__(self, nvml: Any, interval_s: float = 1.0) -> None:
        """Keep the NVML module and the sampling interval; call ``start()`` to run."""
        self._nvml = nvml
        self._interval_s = interval_s
        self._previous: dict[int, Any] = {}
        self._latest: dict[int, float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def latest(self) -> dict[int, float]:
        """SM activity ratio per GPU index from the last completed interval."""
        with self._lock:
            return dict(self._latest)

    def sample_once(self) -> None:
        """Take one GPM sample per supported GPU and compute SM activity against the last one."""
        nvml = self._nvml
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            support = _try(nvml, nvml.nvmlGpmQueryDeviceSupport, handle)
            if support is None or not support.isSupportedDevice:
                continue
            current = nvml.nvmlGpmSampleAlloc()
            if _try(nvml, nvml.nvmlGpmSampleGet, handle, current) is None:
                nvml.nvmlGpmSampleFree(current)
                continue
            previous = self._previous.get(index)
            self._previous[index] = current
            if previous is None:
                continue
            request = nvml.c_nvmlGpmMetricsGet_t()
            request.version = nvml.NVML_GPM_METRICS_GET_VERSION
            request.sample1 = previous
            request.sample2 = current
            request.numMetrics = 1
            request.metrics[0].metricId = nvml.NVML_GPM_METRIC_SM_UTIL
            result = _try(nvml, nvml.nvmlGpmMetricsGet, request)
            nvml.nvmlGpmSampleFree(previous)
            if result is not None:
                with self._lock:
                    self._latest[index] = float(result.metrics[0].value) / 100.0

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self.sample_once()
            except Exception:
                _log.debug("GPM sampling failed", exc_info=True)

    def start(self) -> None:
        """Start the daemon thread (first sample immediately)."""
        try:
            self.sample_once()
        except Exception:
            _log.debug("GPM sampling failed", exc_info=True)
        self._thread = threading.Thread(target=self._run, name="stagelens-gpm", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread and wait for it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


def load_nvml(module_name: str | None = None) -> Any | None:
    """Import the NVML binding (``pynvml`` or ``$STAGELENS_NVML_MODULE``); ``None`` if absent."""
    name = module_name or os.environ.get(NVML_MODULE_ENV) or "pynvml"
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


class NvmlCollector(Collector):
    """Prometheus collector yielding fresh metric families from NVML on each scrape."""

    def __init__(
        self,
        nvml: Any | None = None,
        *,
        interval_s: float = 1.0,
        gpm: bool = True,
        cost_usd_per_hour: float | None = None,
    ) -> None:
        """Initialise NVML once; on failure the collector only reports ``up 0``."""
        self._nvml = nvml if nvml is not None else load_nvml()
        self._warned = False
        self._ok = False
        self._sampler: GpmSampler | None = None
        if cost_usd_per_hour is None and os.environ.get(COST_ENV):
            try:
                cost_usd_per_hour = float(os.environ[COST_ENV])
            except ValueError:
                _log.warning("ignoring non-numeric %s", COST_ENV)
        self._cost = cost_usd_per_hour
        if self._nvml is None:
            self._warn("NVML library (nvidia-ml-py) is not installed")
            return
        try:
            self._nvml.nvmlInit()
            self._ok = True
        except Exception as exc:
            self._warn(f"NVML init failed: {type(exc).__name__}: {exc}")
            return
        if gpm:
            self._sampler = GpmSampler(self._nvml, interval_s)
            self._sampler.start()

    def _warn(self, message: str) -> None:
        if not self._warned:
            self._warned = True
            _log.warning("GPU metrics disabled: %s", message)

    def close(self) -> None:
        """Stop the background sampler."""
        if self._sampler is not None:
            self._sampler.stop()

    def collect(self) -> Iterator[Any]:
        """Read NVML and yield one family per metric; never raises."""
        up = GaugeMetricFamily(semconv.GPU_COLLECTOR_UP, "1 when NVML answered on this scrape")
        samples: list[GpuSample] = []
        if self._ok:
            try:
                sm = self._sampler.latest() if self._sampler is not None else None
                samples = read_gpu_samples(self._nvml, sm)
            except Exception as exc:
                self._warn(f"NVML read failed: {type(exc).__name__}: {exc}")
                samples = []
                self._ok = False
        up.add_metric([], 1.0 if self._ok else 0.0)
        yield up
        if not samples:
            return
        labels = [semconv.LABEL_GPU, semconv.LABEL_UUID, semconv.LABEL_NAME]
        gauges: list[tuple[str, str, str]] = [
            (
                semconv.GPU_UTILIZATION,
                "utilization",
                "NVML util.gpu: fraction of time a kernel ran",
            ),
            (semconv.GPU_SM_ACTIVE, "sm_active", "GPM SM activity ratio"),
            (semconv.GPU_MEMORY_USED, "memory_used_bytes", "Framebuffer in use"),
            (semconv.GPU_MEMORY_TOTAL, "memory_total_bytes", "Framebuffer size"),
            (semconv.GPU_POWER, "power_watts", "Board power"),
            (semconv.GPU_TEMPERATURE, "temperature_celsius", "Core temperature"),
            (semconv.GPU_SM_CLOCK, "sm_clock_hertz", "Current SM clock"),
            (semconv.GPU_CLOCK_EVENT_REASONS, "clock_event_reasons", "Clock-event reasons bitmask"),
        ]
        for metric_name, attr, doc in gauges:
            family = GaugeMetricFamily(metric_name, doc, labels=labels)
            for s in samples:
                value = getattr(s, attr)
                if value is not None:
                    family.add_metric([str(s.index), s.uuid, s.name], float(value))
            if family.samples:
                yield family
        energy = CounterMetricFamily(
            semconv.GPU_ENERGY.removesuffix("_total"), "Energy since driver load", labels=labels
        )
        for s in samples:
            if s.energy_joules is not None:
                energy.add_metric([str(s.index), s.uuid, s.name], s.energy_joules)
        if energy.samples:
            yield energy
        procs = GaugeMetricFamily(
            semconv.GPU_PROCESS_MEMORY_USED,
            "Framebuffer used per compute process",
            labels=[*labels, semconv.LABEL_PID],
        )
        for s in samples:
            for pid, used in s.processes:
                procs.add_metric([str(s.index), s.uuid, s.name, str(pid)], float(used))
        if procs.samples:
            yield procs
        if self._cost is not None:
            cost = GaugeMetricFamily(
                semconv.GPU_COST_PER_HOUR, "Price of one GPU-hour", labels=labels
            )
            for s in samples:
                cost.add_metric([str(s.index), s.uuid, s.name], self._cost)
            yield cost


def register_gpu_collector(
    registry: CollectorRegistry, nvml: Any | None = None, *, interval_s: float = 1.0
) -> NvmlCollector:
    """Register an ``NvmlCollector`` on ``registry`` (for the gateway or the vLLM plugin)."""
    collector = NvmlCollector(nvml, interval_s=interval_s)
    registry.register(collector)
    return collector


def _serve(args: argparse.Namespace) -> int:
    """Run the standalone exporter until interrupted."""
    from prometheus_client import start_http_server

    registry = CollectorRegistry()
    collector = register_gpu_collector(registry, interval_s=args.interval)
    server, thread = start_http_server(args.port, addr=args.host, registry=registry)
    print(f"stagelens gpu-exporter on http://{args.host}:{server.server_port}/metrics", flush=True)
    try:
        thread.join()
    except KeyboardInterrupt:
        pass
    finally:
        collector.close()
        server.shutdown()
    return 0


def add_parser(subparsers: Any) -> None:
    """Register ``stagelens gpu-exporter [--port] [--host] [--interval]``."""
    parser = subparsers.add_parser("gpu-exporter", help="Serve NVML GPU metrics on /metrics.")
    parser.add_argument("--port", type=int, default=9400)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--interval", type=float, default=1.0, help="GPM sampling interval (s)")
    parser.set_defaults(func=_serve)
