"""GPU readings as OpenTelemetry observable instruments with the ``hw.*`` semantic conventions.

Why: OTLP users get the same NVML readings as the Prometheus collector under the names an
OTel backend already knows (``hw.gpu.utilization``, ``hw.gpu.memory.usage``/``.limit``/
``.utilization``, ``hw.power``, ``hw.energy``, ``hw.temperature``). Readings that have no
``hw.*`` name (GPM SM activity, SM clock, clock-event reasons, per-process memory, cost) use
``stagelens.gpu.*`` names. Collection is shared: every callback reads one cached
``GpuReader`` snapshot, so one OTel collection cycle reads NVML once.

Attributes (per the hardware semantic conventions, ``hw.id`` required, ``hw.type="gpu"`` on
GPU metrics): ``hw.id`` = GPU UUID, ``hw.name`` = ``gpu<index>``, ``hw.model`` = product
name, ``hw.vendor`` = ``NVIDIA``; ``hw.gpu.utilization`` adds ``hw.gpu.task="general"``.
The temperature is a sensor component: ``hw.id`` = ``<uuid>/temperature``,
``hw.parent`` = GPU UUID, ``hw.type="temperature"``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from opentelemetry.metrics import CallbackOptions, Meter, MeterProvider, Observation
from stagelens.exporters.nvml_read import GpuSample, GpuSnapshot
from stagelens.exporters.nvml_sampler import GpuReader

from stagelens import semconv
from stagelens._version import __version__

_Value = Callable[[GpuSample], float | None]


def gpu_attributes(s: GpuSample) -> dict[str, str]:
    """The ``hw.*`` attributes identifying one GPU."""
    return {
        semconv.ATTR_HW_ID: s.uuid,
        semconv.ATTR_HW_NAME: f"gpu{s.index}",
        semconv.ATTR_HW_MODEL: s.name,
        semconv.ATTR_HW_VENDOR: semconv.HW_VENDOR_NVIDIA,
        semconv.ATTR_HW_TYPE: semconv.HW_TYPE_GPU,
    }


def _memory_ratio(s: GpuSample) -> float | None:
    if s.memory_used_bytes is None or not s.memory_total_bytes:
        return None
    return s.memory_used_bytes / s.memory_total_bytes


class GpuOtelMetrics:
    """Observable instruments over a ``GpuReader``, created once on a meter provider."""

    def __init__(
        self,
        reader: GpuReader,
        meter_provider: MeterProvider,
        *,
        cost_usd_per_hour: float | None = None,
        max_age_s: float = 0.5,
    ) -> None:
        """Create every instrument now; callbacks read ``reader`` at collection time."""
        self.reader = reader
        self._cost = cost_usd_per_hour
        self._max_age_s = max_age_s
        meter: Meter = meter_provider.get_meter(semconv.INSTRUMENTATION_NAME, __version__)
        gauge = meter.create_observable_gauge
        self.instruments: list[Any] = [
            gauge(
                semconv.OTEL_GPU_COLLECTOR_UP,
                [self._observe_up],
                unit="1",
                description="1 when NVML answered on the last collection, else 0.",
            ),
            gauge(
                semconv.HW_GPU_UTILIZATION,
                [self._per_gpu(lambda s: s.utilization, task=True)],
                unit="1",
                description="Fraction of time a kernel ran (NVML util.gpu; liveness, not load).",
            ),
            meter.create_observable_up_down_counter(
                semconv.HW_GPU_MEMORY_USAGE,
                [self._per_gpu(lambda s: s.memory_used_bytes)],
                unit="By",
                description="GPU memory used.",
            ),
            meter.create_observable_up_down_counter(
                semconv.HW_GPU_MEMORY_LIMIT,
                [self._per_gpu(lambda s: s.memory_total_bytes)],
                unit="By",
                description="Size of the GPU memory.",
            ),
            gauge(
                semconv.HW_GPU_MEMORY_UTILIZATION,
                [self._per_gpu(_memory_ratio)],
                unit="1",
                description="Fraction of GPU memory used.",
            ),
            gauge(
                semconv.HW_POWER,
                [self._per_gpu(lambda s: s.power_watts)],
                unit="W",
                description="Instantaneous board power.",
            ),
            meter.create_observable_counter(
                semconv.HW_ENERGY,
                [self._per_gpu(lambda s: s.energy_joules)],
                unit="J",
                description="Energy consumed since the driver loaded.",
            ),
            gauge(
                semconv.HW_TEMPERATURE,
                [self._observe_temperature],
                unit="Cel",
                description="GPU core temperature.",
            ),
            gauge(
                semconv.OTEL_GPU_SM_ACTIVE,
                [self._per_gpu(lambda s: s.sm_active)],
                unit="1",
                description="GPM SM activity (how much of the GPU the kernels used).",
            ),
            gauge(
                semconv.OTEL_GPU_SM_CLOCK,
                [self._per_gpu(lambda s: s.sm_clock_hertz)],
                unit="Hz",
                description="Current SM clock.",
            ),
            gauge(
                semconv.OTEL_GPU_CLOCK_EVENT_REASONS,
                [self._per_gpu(lambda s: s.clock_event_reasons)],
                unit="1",
                description="NVML clock-event (throttle) reasons bitmask.",
            ),
            gauge(
                semconv.OTEL_GPU_PROCESS_MEMORY_USAGE,
                [self._observe_processes],
                unit="By",
                description="GPU memory used by one compute process.",
            ),
        ]
        if cost_usd_per_hour is not None:
            self.instruments.append(
                gauge(
                    semconv.OTEL_GPU_COST_PER_HOUR,
                    [self._per_gpu(lambda s: cost_usd_per_hour)],
                    unit="USD/h",
                    description="Configured price of one GPU-hour.",
                )
            )

    def _snapshot(self) -> GpuSnapshot:
        return self.reader.read_cached(self._max_age_s)

    def _observe_up(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(1 if self._snapshot().up else 0)]

    def _per_gpu(
        self, value: _Value, *, task: bool = False
    ) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def callback(options: CallbackOptions) -> Iterable[Observation]:
            out: list[Observation] = []
            for s in self._snapshot().samples:
                v = value(s)
                if v is None:
                    continue
                attributes = gpu_attributes(s)
                if task:
                    attributes[semconv.ATTR_HW_GPU_TASK] = semconv.HW_GPU_TASK_GENERAL
                out.append(Observation(v, attributes))
            return out

        return callback

    def _observe_temperature(self, options: CallbackOptions) -> Iterable[Observation]:
        out: list[Observation] = []
        for s in self._snapshot().samples:
            if s.temperature_celsius is None:
                continue
            attributes = {
                semconv.ATTR_HW_ID: f"{s.uuid}/temperature",
                semconv.ATTR_HW_NAME: f"gpu{s.index} core",
                semconv.ATTR_HW_PARENT: s.uuid,
                semconv.ATTR_HW_TYPE: semconv.HW_TYPE_TEMPERATURE,
            }
            out.append(Observation(s.temperature_celsius, attributes))
        return out

    def _observe_processes(self, options: CallbackOptions) -> Iterable[Observation]:
        out: list[Observation] = []
        for s in self._snapshot().samples:
            for p in s.processes:
                attributes: dict[str, str | int] = {
                    **gpu_attributes(s),
                    semconv.ATTR_PROCESS_PID: p.pid,
                    semconv.ATTR_PROCESS_EXECUTABLE_NAME: p.name,
                }
                out.append(Observation(p.used_bytes, attributes))
        return out


def register_gpu_meters(
    meter_provider: MeterProvider,
    reader: GpuReader | None = None,
    *,
    cost_usd_per_hour: float | None = None,
) -> GpuOtelMetrics:
    """Create the GPU observable instruments on ``meter_provider`` over ``reader``
    (default: a new ``GpuReader`` importing ``pynvml``)."""
    return GpuOtelMetrics(
        reader if reader is not None else GpuReader(),
        meter_provider,
        cost_usd_per_hour=cost_usd_per_hour,
    )
