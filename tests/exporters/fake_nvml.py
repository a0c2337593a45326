"""A fake of ``pynvml`` (nvidia-ml-py) for CI: same call names, units and error classes.

Readings from the real H100 measurement in GPU-FACTS.md: memory total 80 GiB-class HBM3,
power in mW (idle ~73 W, matmul ~690 W), SM clock 345-1980 MHz, clock-event reasons 0x1
(idle), GPM SM activity 96.7 % under a bf16 matmul. Energy (mJ) and temperature are
plausible, not measured. Module-level state is set through ``configure()``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1
NVML_GPM_METRICS_GET_VERSION = 1
NVML_GPM_METRIC_SM_UTIL = 2


class NVMLError(Exception):
    """Base class, as in pynvml."""


class NVMLError_NotSupported(NVMLError):
    """A call the device does not support (e.g. MIG, older GPUs)."""


class NVMLError_Uninitialized(NVMLError):
    """Raised when nvmlInit was not called."""


class NVMLError_DriverNotLoaded(NVMLError):
    """Raised by nvmlInit on a machine without the NVIDIA driver."""


class NVMLError_LibraryNotFound(NVMLError):
    """Raised by nvmlInit when libnvidia-ml.so is absent."""


@dataclass
class FakeGpu:
    """One fake GPU; ``unsupported`` names the calls that raise NotSupported."""

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
    processes: list[tuple[int, int]] = field(default_factory=lambda: [(4242, 1_500_000_000)])
    gpm: bool = True
    sm_util_percent: float = 96.7
    unsupported: set[str] = field(default_factory=set)


_state: dict[str, Any] = {"gpus": [FakeGpu()], "init_error": None, "initialised": False}


def configure(gpus: list[FakeGpu], init_error: type[NVMLError] | None = None) -> None:
    """Replace the fake machine's GPUs and the error nvmlInit raises (if any)."""
    _state.update(gpus=gpus, init_error=init_error, initialised=False)


def nvmlInit() -> None:
    """Initialise, or raise the configured init error."""
    if _state["init_error"] is not None:
        raise _state["init_error"]()
    _state["initialised"] = True


def nvmlShutdown() -> None:
    """Forget initialisation."""
    _state["initialised"] = False


def _gpu(handle: Any, call: str) -> FakeGpu:
    if not _state["initialised"]:
        raise NVMLError_Uninitialized()
    gpu: FakeGpu = handle
    if call in gpu.unsupported:
        raise NVMLError_NotSupported()
    return gpu


def nvmlDeviceGetCount() -> int:
    """Number of GPUs."""
    if not _state["initialised"]:
        raise NVMLError_Uninitialized()
    return len(_state["gpus"])


def nvmlDeviceGetHandleByIndex(index: int) -> FakeGpu:
    """Handle = the FakeGpu itself."""
    if not _state["initialised"]:
        raise NVMLError_Uninitialized()
    gpu: FakeGpu = _state["gpus"][index]
    return gpu


def nvmlDeviceGetUUID(h: Any) -> str:
    return _gpu(h, "uuid").uuid


def nvmlDeviceGetName(h: Any) -> str:
    return _gpu(h, "name").name


def nvmlDeviceGetUtilizationRates(h: Any) -> Any:
    return SimpleNamespace(gpu=_gpu(h, "util").util_gpu, memory=0)


def nvmlDeviceGetMemoryInfo(h: Any) -> Any:
    g = _gpu(h, "memory")
    return SimpleNamespace(used=g.mem_used, total=g.mem_total, free=g.mem_total - g.mem_used)


def nvmlDeviceGetPowerUsage(h: Any) -> int:
    return _gpu(h, "power").power_mw


def nvmlDeviceGetTotalEnergyConsumption(h: Any) -> int:
    return _gpu(h, "energy").energy_mj


def nvmlDeviceGetTemperature(h: Any, sensor: int) -> int:
    return _gpu(h, "temperature").temp_c


def nvmlDeviceGetClockInfo(h: Any, clock: int) -> int:
    return _gpu(h, "clock").sm_clock_mhz


def nvmlDeviceGetCurrentClocksEventReasons(h: Any) -> int:
    return _gpu(h, "reasons").reasons


def nvmlDeviceGetComputeRunningProcesses(h: Any) -> list[Any]:
    g = _gpu(h, "processes")
    return [SimpleNamespace(pid=p, usedGpuMemory=m) for p, m in g.processes]


def nvmlGpmQueryDeviceSupport(h: Any) -> Any:
    return SimpleNamespace(isSupportedDevice=1 if _gpu(h, "gpm").gpm else 0)


def nvmlGpmSampleAlloc() -> Any:
    return SimpleNamespace(gpu=None)


def nvmlGpmSampleGet(h: Any, sample: Any) -> Any:
    sample.gpu = _gpu(h, "gpm")
    return sample


def nvmlGpmSampleFree(sample: Any) -> None:
    sample.gpu = None


def c_nvmlGpmMetricsGet_t() -> Any:
    return SimpleNamespace(
        version=0,
        sample1=None,
        sample2=None,
        numMetrics=0,
        metrics=[SimpleNamespace(metricId=0, value=0.0) for _ in range(8)],
    )


def nvmlGpmMetricsGet(request: Any) -> Any:
    gpu = request.sample2.gpu
    if request.sample1.gpu is not gpu:
        raise NVMLError_NotSupported()
    request.metrics[0].value = gpu.sm_util_percent
    return request
