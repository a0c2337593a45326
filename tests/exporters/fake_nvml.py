"""A fake of ``pynvml`` (nvidia-ml-py) for CI: same call names, units and error classes.

What it mimics from the real binding (nvidia-ml-py 13.x, checked against the copy in .venv):
- errors: ``NVMLError(code)`` maps to the ``NVMLError_<Name>`` subclass, each carries
  ``.value`` (the NVML_ERROR_* code) and ``str()`` gives NVML's message; the subclass names
  are the ones pynvml generates (``NVMLError_GpuIsLost``, ``NVMLError_NoPermission``, ...);
- ``nvmlInit`` is reference counted, ``nvmlShutdown`` at count 0 raises Uninitialized, every
  call before init raises Uninitialized;
- GPM: ``c_nvmlGpmMetricsGet_t`` with ``metrics[i].metricId/nvmlReturn/value``;
  ``nvmlGpmSampleAlloc`` / ``nvmlGpmSampleFree`` (live samples are counted so tests can
  check nothing leaks);
- processes: objects with ``pid`` and ``usedGpuMemory`` (``None`` when NVML has no value).

Readings from the H100 reference measurements in docs/gpu.md: memory total 80 GiB-class HBM3,
power in mW (matmul ~690 W), SM clock 345-1980 MHz, clock-event reasons 0x1 (idle), GPM SM
activity 96.7 % under a bf16 matmul. Energy (mJ) and temperature are plausible, not
measured. Module-level state is set through ``configure()``; ``calls`` counts every call.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, ClassVar

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_UNKNOWN = 999

NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1
NVML_GPM_METRICS_GET_VERSION = 1
NVML_GPM_METRIC_GRAPHICS_UTIL = 1
NVML_GPM_METRIC_SM_UTIL = 2
NVML_GPM_METRIC_SM_OCCUPANCY = 3

_MESSAGES = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    NVML_ERROR_NOT_FOUND: "Not Found",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    NVML_ERROR_RESET_REQUIRED: "GPU requires restart",
    NVML_ERROR_LIB_RM_VERSION_MISMATCH: "RM has detected an NVML/RM version mismatch.",
    NVML_ERROR_UNKNOWN: "Unknown Error",
}


class NVMLError(Exception):
    """Base class, as in pynvml: ``NVMLError(code)`` returns the matching subclass."""

    _valClassMapping: ClassVar[dict[int, type[NVMLError]]] = {}
    code: ClassVar[int] = NVML_ERROR_UNKNOWN
    value: int

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        NVMLError._valClassMapping[cls.code] = cls

    def __new__(cls, *args: Any) -> NVMLError:
        if cls is NVMLError:
            value = int(args[0]) if args else NVML_ERROR_UNKNOWN
            cls = NVMLError._valClassMapping.get(value, NVMLError)
        else:
            value = cls.code
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    def __init__(self, *args: Any) -> None:
        super().__init__()

    def __str__(self) -> str:
        return _MESSAGES.get(self.value, f"NVML Error with code {self.value}")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NVMLError) and self.value == other.value

    __hash__ = Exception.__hash__


class NVMLError_Uninitialized(NVMLError):
    """Any call before nvmlInit (or after the last nvmlShutdown)."""

    code = NVML_ERROR_UNINITIALIZED


class NVMLError_InvalidArgument(NVMLError):
    """E.g. a GPU index out of range."""

    code = NVML_ERROR_INVALID_ARGUMENT


class NVMLError_NotSupported(NVMLError):
    """A call the device does not support (e.g. MIG, older GPUs)."""

    code = NVML_ERROR_NOT_SUPPORTED


class NVMLError_NoPermission(NVMLError):
    """The caller may not make this call (per call, e.g. in a restricted container)."""

    code = NVML_ERROR_NO_PERMISSION


class NVMLError_NotFound(NVMLError):
    """Nothing to report (e.g. process utilisation with no recent process)."""

    code = NVML_ERROR_NOT_FOUND


class NVMLError_DriverNotLoaded(NVMLError):
    """Raised by nvmlInit on a machine without the NVIDIA driver."""

    code = NVML_ERROR_DRIVER_NOT_LOADED


class NVMLError_LibraryNotFound(NVMLError):
    """Raised by nvmlInit when libnvidia-ml.so is absent."""

    code = NVML_ERROR_LIBRARY_NOT_FOUND


class NVMLError_FunctionNotFound(NVMLError):
    """The driver is older than the binding's function."""

    code = NVML_ERROR_FUNCTION_NOT_FOUND


class NVMLError_GpuIsLost(NVMLError):
    """The GPU fell off the bus; every call on its handle fails."""

    code = NVML_ERROR_GPU_IS_LOST


class NVMLError_ResetRequired(NVMLError):
    """The GPU needs a reset."""

    code = NVML_ERROR_RESET_REQUIRED


class NVMLError_LibRmVersionMismatch(NVMLError):
    """Driver updated under a running process."""

    code = NVML_ERROR_LIB_RM_VERSION_MISMATCH


class NVMLError_Unknown(NVMLError):
    """Anything else."""

    code = NVML_ERROR_UNKNOWN


@dataclass
class FakeGpu:
    """One fake GPU.

    ``errors`` maps a pynvml function name to the error class it raises on this GPU;
    ``unsupported`` is shorthand for NotSupported; ``lost`` makes every call on this GPU
    (its handle included) raise GpuIsLost. ``gpm_metric_return`` is the per-metric
    ``nvmlReturn`` that ``nvmlGpmMetricsGet`` reports.
    """

    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    name: str = "NVIDIA H100 80GB HBM3"
    util_gpu: int = 100
    mem_used: int = 2_000_000_000
    mem_total: int = 85_520_809_984
    power_mw: int = 690_000
    energy_mj: int = 123_456_789
    temp_c: int = 45
    sm_clock_mhz: int = 1980
    reasons: int = 0x1
    processes: list[tuple[int, int | None]] = field(default_factory=lambda: [(4242, 1_500_000_000)])
    gpm: bool = True
    sm_util_percent: float = 96.7
    gpm_metric_return: int = NVML_SUCCESS
    unsupported: set[str] = field(default_factory=set)
    errors: dict[str, type[NVMLError]] = field(default_factory=dict)
    lost: bool = False


calls: Counter[str] = Counter()
"""How many times each function was called since the last ``configure()``."""

_state: dict[str, Any] = {
    "gpus": [FakeGpu()],
    "init_error": None,
    "fail_all": None,
    "refcount": 0,
    "live_samples": 0,
    "process_names": {4242: b"/usr/bin/python3"},
}


def configure(
    gpus: list[FakeGpu],
    init_error: type[NVMLError] | None = None,
    process_names: dict[int, bytes | str] | None = None,
) -> None:
    """Replace the fake machine: its GPUs, the error nvmlInit raises, NVML's process names."""
    calls.clear()
    _state.update(
        gpus=gpus,
        init_error=init_error,
        fail_all=None,
        refcount=0,
        live_samples=0,
        process_names=process_names if process_names is not None else {4242: b"/usr/bin/python3"},
    )


def set_init_error(error: type[NVMLError] | None) -> None:
    """Make later nvmlInit calls raise ``error`` (None: succeed)."""
    _state["init_error"] = error


def break_driver(error: type[NVMLError] | None) -> None:
    """Every call from now on raises ``error`` (driver unloaded / library reset), and the
    init refcount is lost, as after an external nvmlShutdown; None restores the calls."""
    _state["fail_all"] = error
    if error is not None:
        _state["refcount"] = 0


def live_gpm_samples() -> int:
    """GPM samples allocated and not yet freed."""
    n: int = _state["live_samples"]
    return n


def _enter(call: str) -> None:
    calls[call] += 1
    if _state["fail_all"] is not None:
        raise _state["fail_all"]()
    if _state["refcount"] <= 0:
        raise NVMLError_Uninitialized()


def nvmlInit() -> None:
    """Initialise (reference counted), or raise the configured init error."""
    calls["nvmlInit"] += 1
    if _state["init_error"] is not None:
        raise _state["init_error"]()
    _state["refcount"] += 1


def nvmlShutdown() -> None:
    """Drop one reference; Uninitialized when none is held."""
    _enter("nvmlShutdown")
    _state["refcount"] -= 1


def _gpu(handle: Any, call: str) -> FakeGpu:
    _enter(call)
    gpu: FakeGpu = handle
    if gpu.lost:
        raise NVMLError_GpuIsLost()
    if call in gpu.errors:
        raise gpu.errors[call]()
    if call in gpu.unsupported:
        raise NVMLError_NotSupported()
    return gpu


def nvmlDeviceGetCount() -> int:
    """Number of GPUs."""
    _enter("nvmlDeviceGetCount")
    return len(_state["gpus"])


def nvmlDeviceGetHandleByIndex(index: int) -> FakeGpu:
    """Handle = the FakeGpu itself; a lost GPU raises GpuIsLost here already."""
    _enter("nvmlDeviceGetHandleByIndex")
    gpus: list[FakeGpu] = _state["gpus"]
    if not 0 <= index < len(gpus):
        raise NVMLError_InvalidArgument()
    gpu = gpus[index]
    if gpu.lost:
        raise NVMLError_GpuIsLost()
    if "nvmlDeviceGetHandleByIndex" in gpu.errors:
        raise gpu.errors["nvmlDeviceGetHandleByIndex"]()
    return gpu


def nvmlDeviceGetUUID(h: Any) -> str:
    return _gpu(h, "nvmlDeviceGetUUID").uuid


def nvmlDeviceGetName(h: Any) -> str:
    return _gpu(h, "nvmlDeviceGetName").name


def nvmlDeviceGetUtilizationRates(h: Any) -> Any:
    return SimpleNamespace(gpu=_gpu(h, "nvmlDeviceGetUtilizationRates").util_gpu, memory=0)


def nvmlDeviceGetMemoryInfo(h: Any) -> Any:
    g = _gpu(h, "nvmlDeviceGetMemoryInfo")
    return SimpleNamespace(used=g.mem_used, total=g.mem_total, free=g.mem_total - g.mem_used)


def nvmlDeviceGetPowerUsage(h: Any) -> int:
    return _gpu(h, "nvmlDeviceGetPowerUsage").power_mw


def nvmlDeviceGetTotalEnergyConsumption(h: Any) -> int:
    return _gpu(h, "nvmlDeviceGetTotalEnergyConsumption").energy_mj


def nvmlDeviceGetTemperature(h: Any, sensor: int) -> int:
    return _gpu(h, "nvmlDeviceGetTemperature").temp_c


def nvmlDeviceGetClockInfo(h: Any, clock: int) -> int:
    return _gpu(h, "nvmlDeviceGetClockInfo").sm_clock_mhz


def nvmlDeviceGetCurrentClocksEventReasons(h: Any) -> int:
    return _gpu(h, "nvmlDeviceGetCurrentClocksEventReasons").reasons


def nvmlDeviceGetComputeRunningProcesses(h: Any) -> list[Any]:
    g = _gpu(h, "nvmlDeviceGetComputeRunningProcesses")
    return [SimpleNamespace(pid=p, usedGpuMemory=m) for p, m in g.processes]


def nvmlSystemGetProcessName(pid: int) -> Any:
    _enter("nvmlSystemGetProcessName")
    names: dict[int, Any] = _state["process_names"]
    if pid not in names:
        raise NVMLError_NotFound()
    return names[pid]


def nvmlGpmQueryDeviceSupport(h: Any) -> Any:
    gpu = _gpu(h, "nvmlGpmQueryDeviceSupport")
    return SimpleNamespace(version=1, isSupportedDevice=1 if gpu.gpm else 0)


def nvmlGpmSampleAlloc() -> Any:
    _enter("nvmlGpmSampleAlloc")
    _state["live_samples"] += 1
    return SimpleNamespace(gpu=None, freed=False)


def nvmlGpmSampleGet(h: Any, sample: Any) -> Any:
    gpu = _gpu(h, "nvmlGpmSampleGet")
    if not gpu.gpm:
        raise NVMLError_NotSupported()
    sample.gpu = gpu
    return sample


def nvmlGpmSampleFree(sample: Any) -> None:
    _enter("nvmlGpmSampleFree")
    if sample.freed:
        raise NVMLError_InvalidArgument()
    sample.freed = True
    _state["live_samples"] -= 1


def c_nvmlGpmMetricsGet_t() -> Any:
    return SimpleNamespace(
        version=0,
        numMetrics=0,
        sample1=None,
        sample2=None,
        metrics=[SimpleNamespace(metricId=0, nvmlReturn=NVML_SUCCESS, value=0.0) for _ in range(8)],
    )


def nvmlGpmMetricsGet(request: Any) -> Any:
    _enter("nvmlGpmMetricsGet")
    gpu = request.sample2.gpu
    if request.version != NVML_GPM_METRICS_GET_VERSION or request.sample1.gpu is not gpu:
        raise NVMLError_InvalidArgument()
    for metric in request.metrics[: request.numMetrics]:
        metric.nvmlReturn = gpu.gpm_metric_return
        if metric.metricId == NVML_GPM_METRIC_SM_UTIL and gpu.gpm_metric_return == NVML_SUCCESS:
            metric.value = gpu.sm_util_percent
    return request
