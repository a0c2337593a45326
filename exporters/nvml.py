"""GPU metrics from NVML: pure readings, a Prometheus collector, the standalone exporter.

Why this shape: collection is separate from export. ``read_gpu_samples()`` turns NVML answers
into plain ``GpuSample`` dataclasses; ``GpuReader`` owns the NVML session (init, retry with
backoff, per-handle identity cache) and a background sampler; ``NvmlCollector`` (Prometheus)
and ``stagelens.exporters.gpu_otel`` (OpenTelemetry ``hw.*``) only format those samples.

What runs where. A scrape makes only the cheap per-GPU calls (utilisation, memory, power,
energy, temperature, SM clock, clock-event reasons: ~10 us each on a real H100 per
GPU-FACTS.md). The slow readings run on a background thread at ``interval_s``: GPM SM
activity (needs two samples some time apart) and the compute-process list (part of the
~25 ms snapshot measured on the H100), so a scrape never waits on them.

Errors, per NVML's own classes (``pynvml.NVMLError_*``, checked by class name so the fake
and every nvidia-ml-py version agree):

- per call (NotSupported on MIG/older GPUs, NoPermission, FunctionNotFound, NotFound, ...):
  that one reading is skipped for that GPU, everything else is reported;
- per GPU (GpuIsLost, ResetRequired, GpuNotFound, or any error getting the handle): that GPU
  is dropped from this scrape, the others are reported;
- fatal (Uninitialized, DriverNotLoaded, LibraryNotFound, LibRmVersionMismatch): this scrape
  reports ``stagelens_gpu_collector_up 0`` and nothing else; ``nvmlInit`` is retried on a
  later scrape with exponential backoff. One warning per outage, one info on recovery.

The ``nvml`` module is a parameter so CI injects a fake (``tests/exporters/fake_nvml.py``);
by default ``pynvml`` (nvidia-ml-py) is imported lazily. Verified against that fake only;
no real-GPU run was made by this module's author.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final

from prometheus_client import REGISTRY
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from stagelens import semconv
from stagelens.config import env_flag

_log = logging.getLogger(__name__)

COST_ENV: Final = "STAGELENS_GPU_COST_USD_PER_HOUR"
"""Env var: price of one GPU-hour in USD, exported as a gauge per GPU."""

NVML_MODULE_ENV: Final = "STAGELENS_NVML_MODULE"
"""Env var: import path of the NVML module (default ``pynvml``); tests point it at the fake."""

ENABLE_ENV: Final = "STAGELENS_GPU_COLLECTOR"
"""Env var: ``0``/``false`` turns the automatic GPU collector off, ``1``/``true`` forces it on."""

FATAL_ERRORS: Final[frozenset[str]] = frozenset(
    {
        "NVMLError_Uninitialized",
        "NVMLError_DriverNotLoaded",
        "NVMLError_LibraryNotFound",
        "NVMLError_LibRmVersionMismatch",
    }
)
"""NVML itself is unusable: the scrape reports up 0 and nvmlInit is retried later."""

GPU_ERRORS: Final[frozenset[str]] = frozenset(
    {"NVMLError_GpuIsLost", "NVMLError_ResetRequired", "NVMLError_GpuNotFound"}
)
"""One GPU is unusable: that GPU is dropped from the scrape, the others are reported."""

PROCESS_NAME_MAX: Final = 64
"""Longest ``process`` label value (basename of the executable, truncated)."""

_NVML_SUCCESS: Final = 0


def _kind(exc: BaseException) -> str:
    name = type(exc).__name__
    if name in FATAL_ERRORS:
        return "fatal"
    if name in GPU_ERRORS:
        return "gpu"
    return "call"


class NvmlFatalError(Exception):
    """NVML as a whole stopped answering (raised by ``read_gpu_samples``; wraps the cause)."""


@dataclass(frozen=True)
class ProcessSample:
    """One compute process on one GPU; ``name`` is ``""`` when NVML cannot tell."""

    pid: int
    name: str
    used_bytes: int


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
    processes: list[ProcessSample] = field(default_factory=list)
    sm_active: float | None = None


@dataclass(frozen=True)
class SlowReadings:
    """What the background sampler last saw, keyed by GPU index (stable within a session)."""

    sm_active: dict[int, float] = field(default_factory=dict)
    processes: dict[int, list[ProcessSample]] = field(default_factory=dict)


@dataclass(frozen=True)
class GpuSnapshot:
    """One read of every GPU: ``up`` is False when NVML was unusable for this read."""

    up: bool
    samples: list[GpuSample]


def _text(value: Any) -> str:
    """NVML returns bytes in old bindings and str in new ones."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _call(nvml: Any, name: str, *args: Any) -> Any:
    """One NVML call; a per-call error (or a function this binding lacks) becomes ``None``.

    Per-GPU and fatal errors propagate: the caller drops the GPU or the whole scrape.
    """
    fn = getattr(nvml, name, None)
    if fn is None:
        return None
    try:
        return fn(*args)
    except nvml.NVMLError as exc:
        if _kind(exc) == "call":
            return None
        raise


@dataclass(frozen=True)
class _Device:
    handle: Any
    uuid: str
    name: str


class DeviceCache:
    """Handle, UUID and name per GPU index, read once per NVML session (they do not change).

    Thread-safe: the scrape path and the background sampler share it.
    """

    def __init__(self) -> None:
        """Start empty."""
        self._devices: dict[int, _Device] = {}
        self._lock = threading.Lock()

    def get(self, nvml: Any, index: int) -> _Device:
        """The cached device, or read handle/UUID/name now; raises what NVML raised."""
        with self._lock:
            device = self._devices.get(index)
        if device is not None:
            return device
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        uuid = _call(nvml, "nvmlDeviceGetUUID", handle)
        name = _call(nvml, "nvmlDeviceGetName", handle)
        device = _Device(handle, _text(uuid) if uuid is not None else "", _text(name or ""))
        with self._lock:
            self._devices[index] = device
        return device

    def forget(self, index: int | None = None) -> None:
        """Drop one GPU (lost) or every GPU (NVML re-initialised)."""
        with self._lock:
            if index is None:
                self._devices.clear()
            else:
                self._devices.pop(index, None)

    def known(self) -> list[tuple[int, _Device]]:
        """The devices read so far, by index."""
        with self._lock:
            return sorted(self._devices.items())


_CLOCK_REASON_CALLS: Final = (
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetCurrentClocksThrottleReasons",  # nvidia-ml-py < 12.535.77
)


def _read_one(nvml: Any, index: int, device: _Device, slow: SlowReadings) -> GpuSample:
    handle = device.handle
    sample = GpuSample(index=index, uuid=device.uuid, name=device.name)
    util = _call(nvml, "nvmlDeviceGetUtilizationRates", handle)
    if util is not None:
        sample.utilization = util.gpu / 100.0
    mem = _call(nvml, "nvmlDeviceGetMemoryInfo", handle)
    if mem is not None:
        sample.memory_used_bytes = int(mem.used)
        sample.memory_total_bytes = int(mem.total)
    power = _call(nvml, "nvmlDeviceGetPowerUsage", handle)
    if power is not None:
        sample.power_watts = power / 1000.0
    energy = _call(nvml, "nvmlDeviceGetTotalEnergyConsumption", handle)
    if energy is not None:
        sample.energy_joules = energy / 1000.0
    temp = _call(nvml, "nvmlDeviceGetTemperature", handle, nvml.NVML_TEMPERATURE_GPU)
    if temp is not None:
        sample.temperature_celsius = float(temp)
    clock = _call(nvml, "nvmlDeviceGetClockInfo", handle, nvml.NVML_CLOCK_SM)
    if clock is not None:
        sample.sm_clock_hertz = clock * 1e6
    for call in _CLOCK_REASON_CALLS:
        if hasattr(nvml, call):
            reasons = _call(nvml, call, handle)
            if reasons is not None:
                sample.clock_event_reasons = int(reasons)
            break
    sample.sm_active = slow.sm_active.get(index)
    sample.processes = list(slow.processes.get(index, ()))
    return sample


def read_gpu_samples(
    nvml: Any, devices: DeviceCache | None = None, slow: SlowReadings | None = None
) -> list[GpuSample]:
    """Read every GPU once (NVML must be initialised); units converted to SI.

    A per-call error skips that reading; a per-GPU error (or any error getting the handle)
    drops that GPU; a fatal error raises ``NvmlFatalError``. ``slow`` supplies the
    background sampler's SM activity and process lists.
    """
    devices = devices if devices is not None else DeviceCache()
    slow = slow if slow is not None else SlowReadings()
    try:
        count = int(nvml.nvmlDeviceGetCount())
    except nvml.NVMLError as exc:
        raise NvmlFatalError(exc) from exc
    samples: list[GpuSample] = []
    for index in range(count):
        try:
            device = devices.get(nvml, index)
            samples.append(_read_one(nvml, index, device, slow))
        except nvml.NVMLError as exc:
            if _kind(exc) == "fatal":
                raise NvmlFatalError(exc) from exc
            devices.forget(index)
            _log.debug("GPU %d dropped from this read: %s", index, type(exc).__name__)
    return samples


class _Session:
    """NVML init state: ``ensure()`` (re)initialises, with exponential backoff after failures."""

    def __init__(
        self,
        nvml: Any | None,
        *,
        backoff_s: float,
        backoff_max_s: float,
        clock: Callable[[], float],
    ) -> None:
        self.nvml = nvml
        self.devices = DeviceCache()
        self.generation = 0
        self._ok = False
        self._lock = threading.Lock()
        self._clock = clock
        self._backoff_initial = backoff_s
        self._backoff_max = backoff_max_s
        self._backoff = backoff_s
        self._next_try = 0.0
        self._warned = False
        if nvml is None:
            self._warn("NVML library (nvidia-ml-py) is not installed")

    @property
    def ok(self) -> bool:
        return self._ok

    def _warn(self, message: str) -> None:
        if not self._warned:
            self._warned = True
            _log.warning("GPU metrics unavailable (stagelens_gpu_collector_up 0): %s", message)

    def ensure(self) -> bool:
        """True when NVML is initialised now; tries ``nvmlInit`` when the backoff allows."""
        if self._ok:
            return True
        nvml = self.nvml
        if nvml is None:
            return False
        with self._lock:
            if self._ok:
                return True
            now = self._clock()
            if now < self._next_try:
                return False
            try:
                nvml.nvmlInit()
            except Exception as exc:
                self._next_try = now + self._backoff
                self._backoff = min(self._backoff * 2, self._backoff_max)
                self._warn(f"nvmlInit failed ({type(exc).__name__}: {exc}); retrying with backoff")
                return False
            self.devices.forget()
            self.generation += 1
            self._ok = True
            self._backoff = self._backoff_initial
            if self._warned:
                _log.info("GPU metrics available again: NVML initialised")
            self._warned = False
            return True

    def fail(self, exc: BaseException) -> None:
        """NVML stopped answering: give our init back, report up 0 until a retry succeeds."""
        with self._lock:
            if not self._ok:
                return
            self._ok = False
            self._next_try = self._clock() + self._backoff
            self._warn(f"NVML stopped answering ({type(exc).__name__}: {exc}); will re-initialise")
            nvml = self.nvml
            if nvml is not None:
                with contextlib.suppress(Exception):
                    nvml.nvmlShutdown()

    def close(self) -> None:
        """Give our ``nvmlInit`` reference back (NVML is reference counted per process)."""
        with self._lock:
            if self._ok:
                self._ok = False
                self._next_try = float("inf")
                nvml: Any = self.nvml
                with contextlib.suppress(Exception):
                    nvml.nvmlShutdown()


class BackgroundSampler:
    """Daemon thread: GPM SM activity and the compute-process list, once per interval.

    Why: GPM needs two samples some time apart (the previous one is kept and diffed against
    the next), and the process list is the slow part of an NVML snapshot; neither may run on
    the scrape path. ``sample_once()`` is public so tests drive it without a thread.
    """

    def __init__(
        self,
        session: _Session,
        interval_s: float = 1.0,
        *,
        gpm: bool = True,
        processes: bool = True,
    ) -> None:
        """Share the session's NVML module and device cache; call ``start()`` to run."""
        self._session = session
        self._interval_s = interval_s
        self._gpm = gpm
        self._processes = processes
        self._previous: dict[int, Any] = {}
        self._gpm_supported: dict[int, bool] = {}
        self._generation = -1
        self._names: dict[int, str] = {}
        self._latest = SlowReadings()
        self._lock = threading.Lock()
        self._sample_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def latest(self) -> SlowReadings:
        """The readings of the last completed interval."""
        with self._lock:
            return self._latest

    def _free(self, sample: Any) -> None:
        nvml: Any = self._session.nvml
        with contextlib.suppress(Exception):
            nvml.nvmlGpmSampleFree(sample)

    def _drop_previous(self) -> None:
        for sample in self._previous.values():
            self._free(sample)
        self._previous.clear()

    def _process_name(self, pid: int) -> str:
        """NVML's name for ``pid`` (basename, bounded length), cached for the pid's lifetime.

        Only NVML is asked, not ``/proc``: NVML reports PIDs as the driver sees them, which
        in a container need not be this PID namespace's.
        """
        name = self._names.get(pid)
        if name is None:
            raw = _call(self._session.nvml, "nvmlSystemGetProcessName", pid)
            name = os.path.basename(_text(raw))[:PROCESS_NAME_MAX] if raw else ""
            self._names[pid] = name
        return name

    def _gpm_once(self, nvml: Any, index: int, device: _Device) -> float | None:
        """Take one GPM sample and diff it against the kept one (freed afterwards)."""
        supported = self._gpm_supported.get(index)
        if supported is None:
            support = _call(nvml, "nvmlGpmQueryDeviceSupport", device.handle)
            supported = bool(support is not None and support.isSupportedDevice)
            self._gpm_supported[index] = supported
        if not supported:
            return None
        current = nvml.nvmlGpmSampleAlloc()
        try:
            nvml.nvmlGpmSampleGet(device.handle, current)
        except BaseException:
            self._free(current)
            raise
        previous = self._previous.pop(index, None)
        self._previous[index] = current
        if previous is None:
            return None
        try:
            request = nvml.c_nvmlGpmMetricsGet_t()
            request.version = nvml.NVML_GPM_METRICS_GET_VERSION
            request.numMetrics = 1
            request.sample1 = previous
            request.sample2 = current
            request.metrics[0].metricId = nvml.NVML_GPM_METRIC_SM_UTIL
            result = _call(nvml, "nvmlGpmMetricsGet", request)
        finally:
            self._free(previous)
        if result is None or int(result.metrics[0].nvmlReturn) != _NVML_SUCCESS:
            return None  # the call succeeded but this metric did not (per-metric status)
        return float(result.metrics[0].value) / 100.0

    def _processes_once(self, nvml: Any, device: _Device, seen: set[int]) -> list[ProcessSample]:
        listed = _call(nvml, "nvmlDeviceGetComputeRunningProcesses", device.handle)
        rows: list[ProcessSample] = []
        for proc in listed or []:
            pid = int(proc.pid)
            seen.add(pid)
            if proc.usedGpuMemory is not None:  # None: not available (e.g. MIG, no permission)
                rows.append(ProcessSample(pid, self._process_name(pid), int(proc.usedGpuMemory)))
        return rows

    def sample_once(self) -> None:
        """One interval: GPM diff and process list per GPU. Never raises NVML errors."""
        session = self._session
        nvml = session.nvml
        if nvml is None or not session.ok:
            return
        with self._sample_lock:
            if self._generation != session.generation:
                self._drop_previous()  # samples of an old NVML session are not diffable
                self._gpm_supported.clear()
                self._generation = session.generation
            sm: dict[int, float] = {}
            procs: dict[int, list[ProcessSample]] = {}
            seen: set[int] = set()
            try:
                count = int(nvml.nvmlDeviceGetCount())
            except nvml.NVMLError:
                return  # the scrape path notices and re-initialises
            for index in range(count):
                try:
                    device = session.devices.get(nvml, index)
                    if self._gpm:
                        try:
                            value = self._gpm_once(nvml, index, device)
                        except nvml.NVMLError as exc:
                            if _kind(exc) != "call":
                                raise
                            value = None  # e.g. NoPermission for GPM on this GPU
                        if value is not None:
                            sm[index] = value
                    if self._processes:
                        procs[index] = self._processes_once(nvml, device, seen)
                except nvml.NVMLError as exc:
                    if _kind(exc) == "fatal":
                        return  # the scrape path notices and re-initialises
                    session.devices.forget(index)
                    kept = self._previous.pop(index, None)
                    if kept is not None:
                        self._free(kept)
            self._names = {pid: n for pid, n in self._names.items() if pid in seen}
            with self._lock:
                self._latest = SlowReadings(sm_active=sm, processes=procs)

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self.sample_once()
            except Exception:
                _log.debug("GPU background sampling failed", exc_info=True)

    def start(self) -> None:
        """Take the first sample now, then start the daemon thread."""
        try:
            self.sample_once()
        except Exception:
            _log.debug("GPU background sampling failed", exc_info=True)
        self._thread = threading.Thread(target=self._run, name="stagelens-gpu", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread, wait for it, and free the GPM samples kept for the next diff."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self._sample_lock:
            self._drop_previous()

    @property
    def kept_samples(self) -> int:
        """GPM samples held for the next diff (one per GPM GPU while running, 0 after stop)."""
        return len(self._previous)


def load_nvml(module_name: str | None = None) -> Any | None:
    """Import the NVML binding (``pynvml`` or ``$STAGELENS_NVML_MODULE``); ``None`` if absent."""
    name = module_name or os.environ.get(NVML_MODULE_ENV) or "pynvml"
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


class GpuReader:
    """NVML session, device cache and background sampler behind one ``read()`` that never raises.

    Shared by the Prometheus collector and the OpenTelemetry gauges, so a process that
    exports both reads NVML once per scrape and runs one sampler thread.
    """

    def __init__(
        self,
        nvml: Any | None = None,
        *,
        interval_s: float = 1.0,
        gpm: bool = True,
        processes: bool = True,
        backoff_s: float = 1.0,
        backoff_max_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        on_error: Callable[[BaseException], None] | None = None,
    ) -> None:
        """Use ``nvml`` or import it (``load_nvml()``; absent = up 0), then try ``nvmlInit``."""
        module = nvml if nvml is not None else load_nvml()
        self._session = _Session(
            module, backoff_s=backoff_s, backoff_max_s=backoff_max_s, clock=clock
        )
        self._on_error = on_error
        self._want_sampler = gpm or processes
        self._gpm = gpm
        self._processes = processes
        self._interval_s = interval_s
        self._sampler: BackgroundSampler | None = None
        self._sampler_lock = threading.Lock()
        self._cache: tuple[float, GpuSnapshot] | None = None
        self._clock = clock
        self._closed = False
        self._ensure()

    @property
    def sampler(self) -> BackgroundSampler | None:
        """The background sampler, started on the first successful ``nvmlInit``."""
        return self._sampler

    @property
    def devices(self) -> DeviceCache:
        """The per-session identity cache (UUID, name per handle)."""
        return self._session.devices

    def _ensure(self) -> bool:
        ok = self._session.ensure()
        if ok and self._want_sampler and self._sampler is None and not self._closed:
            with self._sampler_lock:
                if self._sampler is None:
                    self._sampler = BackgroundSampler(
                        self._session, self._interval_s, gpm=self._gpm, processes=self._processes
                    )
                    self._sampler.start()
        return ok

    def read(self) -> GpuSnapshot:
        """Read every GPU now; ``up`` False (and no samples) when NVML is unusable."""
        try:
            if not self._ensure():
                return GpuSnapshot(False, [])
            slow = self._sampler.latest() if self._sampler is not None else SlowReadings()
            samples = read_gpu_samples(self._session.nvml, self._session.devices, slow)
        except NvmlFatalError as exc:
            self._session.fail(exc.__cause__ or exc)
            return GpuSnapshot(False, [])
        except Exception as exc:  # a bug or an unexpected binding: never break the scrape
            if self._on_error is not None:
                self._on_error(exc)
            else:
                _log.debug("GPU read failed", exc_info=True)
            return GpuSnapshot(False, [])
        return GpuSnapshot(True, samples)

    def read_cached(self, max_age_s: float = 0.5) -> GpuSnapshot:
        """``read()``, reused for ``max_age_s`` (OTel calls one callback per instrument)."""
        now = self._clock()
        cached = self._cache
        if cached is not None and now - cached[0] <= max_age_s:
            return cached[1]
        snapshot = self.read()
        self._cache = (now, snapshot)
        return snapshot

    def close(self) -> None:
        """Stop the background sampler (frees its GPM samples) and give our NVML init back."""
        self._closed = True
        if self._sampler is not None:
            self._sampler.stop()
        self._session.close()


def _cost_from_env() -> float | None:
    raw = os.environ.get(COST_ENV)
    if not raw:
        return None
    try:
        return float(raw)
    except ValueError:
        _log.warning("ignoring non-numeric %s=%r", COST_ENV, raw)
        return None


_LABELS: Final = [semconv.LABEL_GPU, semconv.LABEL_UUID, semconv.LABEL_NAME]
_GAUGES: Final[tuple[tuple[str, str, str], ...]] = (
    (semconv.GPU_UTILIZATION, "utilization", "NVML util.gpu: fraction of time a kernel ran"),
    (semconv.GPU_SM_ACTIVE, "sm_active", "GPM SM activity ratio"),
    (semconv.GPU_MEMORY_USED, "memory_used_bytes", "Framebuffer in use"),
    (semconv.GPU_MEMORY_TOTAL, "memory_total_bytes", "Framebuffer size"),
    (semconv.GPU_POWER, "power_watts", "Board power"),
    (semconv.GPU_TEMPERATURE, "temperature_celsius", "Core temperature"),
    (semconv.GPU_SM_CLOCK, "sm_clock_hertz", "Current SM clock"),
    (semconv.GPU_CLOCK_EVENT_REASONS, "clock_event_reasons", "Clock-event reasons bitmask"),
)


class NvmlCollector(Collector):
    """Prometheus collector yielding fresh metric families from NVML on each scrape."""

    def __init__(
        self,
        nvml: Any | None = None,
        *,
        reader: GpuReader | None = None,
        interval_s: float = 1.0,
        gpm: bool = True,
        cost_usd_per_hour: float | None = None,
        on_error: Callable[[BaseException], None] | None = None,
    ) -> None:
        """Use ``reader`` or build one over ``nvml`` (default: import ``pynvml``)."""
        self.reader = (
            reader
            if reader is not None
            else GpuReader(nvml, interval_s=interval_s, gpm=gpm, on_error=on_error)
        )
        self._cost = cost_usd_per_hour if cost_usd_per_hour is not None else _cost_from_env()

    @property
    def cost_usd_per_hour(self) -> float | None:
        """The configured GPU-hour price (argument or ``$STAGELENS_GPU_COST_USD_PER_HOUR``)."""
        return self._cost

    def close(self) -> None:
        """Stop the background sampler."""
        self.reader.close()

    def describe(self) -> list[Any]:
        """Nothing: registering must not read NVML (``REGISTRY`` would call ``collect()``)."""
        return []

    def collect(self) -> Iterator[Any]:
        """Read NVML and yield one family per metric; never raises."""
        snapshot = self.reader.read()
        up = GaugeMetricFamily(semconv.GPU_COLLECTOR_UP, "1 when NVML answered on this scrape")
        up.add_metric([], 1.0 if snapshot.up else 0.0)
        yield up
        samples = snapshot.samples
        if not samples:
            return
        keys = [[str(s.index), s.uuid, s.name] for s in samples]
        for metric_name, attr, doc in _GAUGES:
            family = GaugeMetricFamily(metric_name, doc, labels=_LABELS)
            for key, s in zip(keys, samples, strict=True):
                value = getattr(s, attr)
                if value is not None:
                    family.add_metric(key, float(value))
            if family.samples:
                yield family
        energy = CounterMetricFamily(
            semconv.GPU_ENERGY.removesuffix("_total"), "Energy since driver load", labels=_LABELS
        )
        for key, s in zip(keys, samples, strict=True):
            if s.energy_joules is not None:
                energy.add_metric(key, s.energy_joules)
        if energy.samples:
            yield energy
        procs = GaugeMetricFamily(
            semconv.GPU_PROCESS_MEMORY_USED,
            "Framebuffer used per compute process (from the background sampler)",
            labels=[*_LABELS, semconv.LABEL_PID, semconv.LABEL_PROCESS],
        )
        for key, s in zip(keys, samples, strict=True):
            for p in s.processes:
                procs.add_metric([*key, str(p.pid), p.name], float(p.used_bytes))
        if procs.samples:
            yield procs
        if self._cost is not None:
            cost = GaugeMetricFamily(
                semconv.GPU_COST_PER_HOUR, "Price of one GPU-hour", labels=_LABELS
            )
            for key in keys:
                cost.add_metric(key, self._cost)
            yield cost


def gpu_collector_enabled(gpu: bool | None = None) -> bool:
    """Resolve the GPU opt-in: ``True``/``False`` as given; ``None`` (automatic) means on when
    ``$STAGELENS_GPU_COLLECTOR`` says so (``1``/``true``), off when it says ``0``/``false``,
    and otherwise on exactly when the NVML binding (nvidia-ml-py) imports."""
    if gpu is not None:
        return gpu
    flag = env_flag(ENABLE_ENV)
    return flag if flag is not None else load_nvml() is not None


_registered: weakref.WeakKeyDictionary[CollectorRegistry, NvmlCollector] = (
    weakref.WeakKeyDictionary()
)
_registered_lock = threading.Lock()


def register_gpu_collector(
    registry: CollectorRegistry | None = None,
    nvml: Any | None = None,
    *,
    gpu: bool | None = True,
    interval_s: float = 1.0,
    cost_usd_per_hour: float | None = None,
    reader: GpuReader | None = None,
    on_error: Callable[[BaseException], None] | None = None,
) -> NvmlCollector | None:
    """Register one ``NvmlCollector`` on ``registry`` (default ``REGISTRY``); idempotent.

    For the gateway (``configure()``), the vLLM plugin and the standalone exporter. Returns
    the collector already on that registry if there is one, ``None`` when ``gpu`` resolves
    to off (see ``gpu_collector_enabled``). ``registry`` must be the one ``/metrics`` serves:
    in prometheus-client multiprocess mode that is the serving process's aggregate registry.
    """
    if not gpu_collector_enabled(gpu):
        return None
    target = registry if registry is not None else REGISTRY
    with _registered_lock:
        existing = _registered.get(target)
        if existing is not None:
            return existing
        collector = NvmlCollector(
            nvml,
            reader=reader,
            interval_s=interval_s,
            cost_usd_per_hour=cost_usd_per_hour,
            on_error=on_error,
        )
        target.register(collector)
        _registered[target] = collector
        return collector


def gpu_collector_for(registry: CollectorRegistry | None = None) -> NvmlCollector | None:
    """The collector ``register_gpu_collector`` put on ``registry`` (default ``REGISTRY``)."""
    with _registered_lock:
        return _registered.get(registry if registry is not None else REGISTRY)


def unregister_gpu_collector(registry: CollectorRegistry | None = None) -> None:
    """Undo ``register_gpu_collector`` on ``registry`` and stop its sampler (tests, shutdown)."""
    target = registry if registry is not None else REGISTRY
    with _registered_lock:
        existing = _registered.pop(target, None)
    if existing is not None:
        target.unregister(existing)
        existing.close()


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
        if collector is not None:
            collector.close()
        server.shutdown()
    return 0


def add_parser(subparsers: Any) -> None:
    """Register ``stagelens gpu-exporter [--port] [--host] [--interval]``."""
    parser = subparsers.add_parser("gpu-exporter", help="Serve NVML GPU metrics on /metrics.")
    parser.add_argument("--port", type=int, default=9400)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument(
        "--interval", type=float, default=1.0, help="background sampling interval (s)"
    )
    parser.set_defaults(func=_serve)
