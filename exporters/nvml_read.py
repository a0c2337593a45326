"""Reading NVML: plain calls in, ``GpuSample`` dataclasses in SI units out. No state over time.

Why a module of its own: the Prometheus collector (``stagelens.exporters.nvml``), the
OpenTelemetry gauges (``stagelens.exporters.gpu_otel``) and the background sampler
(``stagelens.exporters.nvml_sampler``) all consume these readings; none of them calls NVML
for a per-scrape reading itself. What is kept between reads (the NVML session, the GPM
sample to diff against, process-name cache) lives in ``nvml_sampler``.

Errors, per NVML's own classes (``pynvml.NVMLError_*``, checked by class name so the fake
and every nvidia-ml-py version agree):

- per call (NotSupported on MIG/older GPUs, NoPermission, FunctionNotFound, NotFound, ...):
  that one reading is skipped for that GPU, everything else is reported;
- per GPU (GpuIsLost, ResetRequired, GpuNotFound, or any error getting the handle): that GPU
  is dropped from this read, the others are reported;
- fatal (Uninitialized, DriverNotLoaded, LibraryNotFound, LibRmVersionMismatch): the read
  raises ``NvmlFatalError``; the caller reports ``up 0`` and re-initialises later.

The ``nvml`` module is a parameter so CI injects a fake (``tests/exporters/fake_nvml.py``);
``load_nvml()`` imports ``pynvml`` (nvidia-ml-py) or ``$STAGELENS_NVML_MODULE``.
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Final, Literal

LOGGER_NAME: Final = "stagelens.exporters.nvml"
"""One logger for every GPU module (reading, sampling, collector): configure it once."""

_log = logging.getLogger(LOGGER_NAME)

NVML_MODULE_ENV: Final = "STAGELENS_NVML_MODULE"
"""Env var: import path of the NVML module (default ``pynvml``); tests point it at the fake."""

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

ErrorKind = Literal["fatal", "gpu", "call"]
"""How far an NVML error reaches: all of NVML, one GPU, or one reading."""


def error_kind(exc: BaseException) -> ErrorKind:
    """Classify an NVML error by its class name (see the module docstring)."""
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


def load_nvml(module_name: str | None = None) -> Any | None:
    """Import the NVML binding (``pynvml`` or ``$STAGELENS_NVML_MODULE``); ``None`` if absent."""
    name = module_name or os.environ.get(NVML_MODULE_ENV) or "pynvml"
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def _text(value: Any) -> str:
    """NVML returns bytes in old bindings and str in new ones."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def nvml_call(nvml: Any, name: str, *args: Any) -> Any:
    """One NVML call; a per-call error (or a function this binding lacks) becomes ``None``.

    Per-GPU and fatal errors propagate: the caller drops the GPU or the whole read.
    """
    fn = getattr(nvml, name, None)
    if fn is None:
        return None
    try:
        return fn(*args)
    except nvml.NVMLError as exc:
        if error_kind(exc) == "call":
            return None
        raise


@dataclass(frozen=True)
class Device:
    """A GPU's NVML handle and identity (UUID, product name), fixed within a session."""

    handle: Any
    uuid: str
    name: str


class DeviceCache:
    """Handle, UUID and name per GPU index, read once per NVML session (they do not change).

    Thread-safe: the scrape path and the background sampler share it.
    """

    def __init__(self) -> None:
        """Start empty."""
        self._devices: dict[int, Device] = {}
        self._lock = threading.Lock()

    def get(self, nvml: Any, index: int) -> Device:
        """The cached device, or read handle/UUID/name now; raises what NVML raised."""
        with self._lock:
            device = self._devices.get(index)
        if device is not None:
            return device
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        uuid = nvml_call(nvml, "nvmlDeviceGetUUID", handle)
        name = nvml_call(nvml, "nvmlDeviceGetName", handle)
        device = Device(handle, _text(uuid) if uuid is not None else "", _text(name or ""))
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

    def known(self) -> list[tuple[int, Device]]:
        """The devices read so far, by index."""
        with self._lock:
            return sorted(self._devices.items())


_CLOCK_REASON_CALLS: Final = (
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetCurrentClocksThrottleReasons",  # nvidia-ml-py < 12.535.77
)


def _read_one(nvml: Any, index: int, device: Device, slow: SlowReadings) -> GpuSample:
    """The scrape-path readings of one GPU (~10 us per call on a real H100), plus ``slow``."""
    handle = device.handle
    sample = GpuSample(index=index, uuid=device.uuid, name=device.name)
    util = nvml_call(nvml, "nvmlDeviceGetUtilizationRates", handle)
    if util is not None:
        sample.utilization = util.gpu / 100.0
    mem = nvml_call(nvml, "nvmlDeviceGetMemoryInfo", handle)
    if mem is not None:
        sample.memory_used_bytes = int(mem.used)
        sample.memory_total_bytes = int(mem.total)
    power = nvml_call(nvml, "nvmlDeviceGetPowerUsage", handle)
    if power is not None:
        sample.power_watts = power / 1000.0
    energy = nvml_call(nvml, "nvmlDeviceGetTotalEnergyConsumption", handle)
    if energy is not None:
        sample.energy_joules = energy / 1000.0
    temp = nvml_call(nvml, "nvmlDeviceGetTemperature", handle, nvml.NVML_TEMPERATURE_GPU)
    if temp is not None:
        sample.temperature_celsius = float(temp)
    clock = nvml_call(nvml, "nvmlDeviceGetClockInfo", handle, nvml.NVML_CLOCK_SM)
    if clock is not None:
        sample.sm_clock_hertz = clock * 1e6
    for call in _CLOCK_REASON_CALLS:
        if hasattr(nvml, call):
            reasons = nvml_call(nvml, call, handle)
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
            if error_kind(exc) == "fatal":
                raise NvmlFatalError(exc) from exc
            devices.forget(index)
            _log.debug("GPU %d dropped from this read: %s", index, type(exc).__name__)
    return samples


def process_name(nvml: Any, pid: int) -> str:
    """NVML's name for ``pid``: the executable's basename, bounded; ``""`` when unknown.

    Only NVML is asked, not ``/proc``: NVML reports PIDs as the driver sees them, which in
    a container need not be this PID namespace's.
    """
    raw = nvml_call(nvml, "nvmlSystemGetProcessName", pid)
    return os.path.basename(_text(raw))[:PROCESS_NAME_MAX] if raw else ""


def gpm_supported(nvml: Any, device: Device) -> bool:
    """Whether the GPU has GPM (Hopper and later); False when NVML cannot tell."""
    support = nvml_call(nvml, "nvmlGpmQueryDeviceSupport", device.handle)
    return bool(support is not None and support.isSupportedDevice)


def gpm_sm_active(nvml: Any, earlier: Any, later: Any) -> float | None:
    """SM activity (0-1) between two GPM samples of one GPU; ``None`` when NVML gave none.

    Checks the per-metric status too: the call can succeed while the metric did not.
    """
    request = nvml.c_nvmlGpmMetricsGet_t()
    request.version = nvml.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = 1
    request.sample1 = earlier
    request.sample2 = later
    request.metrics[0].metricId = nvml.NVML_GPM_METRIC_SM_UTIL
    result = nvml_call(nvml, "nvmlGpmMetricsGet", request)
    if result is None or int(result.metrics[0].nvmlReturn) != _NVML_SUCCESS:
        return None
    return float(result.metrics[0].value) / 100.0
