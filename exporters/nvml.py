"""The GPU metrics as Prometheus sees them: ``NvmlCollector`` and its registration.

Why scrape-time: ``collect()`` reads the GPUs (``GpuReader.read()``, cheap calls only; the
slow readings come from the background sampler) and yields fresh ``*MetricFamily`` objects
per scrape, so ``/metrics`` always shows the current reading and no state is kept here.
Tolerant: NVML errors are handled by the reader (a failing reading or GPU drops only
itself, NVML down gives ``stagelens_gpu_collector_up 0``), and a family that fails to build
is left out of that scrape (reported to ``on_error``) while the others are served.

The layers below: ``nvml_read`` (NVML calls -> ``GpuSample``) and ``nvml_sampler``
(``GpuReader``: session, backoff, background GPM/process sampler). The OpenTelemetry
``hw.*`` variant over the same reader is ``gpu_otel``; the standalone exporter is the
``stagelens gpu-exporter`` subcommand (``stagelens/cli/gpu_exporter.py``).
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final

from prometheus_client import REGISTRY
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector, CollectorRegistry
from stagelens.exporters.nvml_read import LOGGER_NAME, GpuSample, load_nvml
from stagelens.exporters.nvml_sampler import GpuReader

from stagelens import semconv

_log = logging.getLogger(LOGGER_NAME)

COST_ENV: Final = "STAGELENS_GPU_COST_USD_PER_HOUR"
"""Env var: price of one GPU-hour in USD, exported as a gauge per GPU."""

ENABLE_ENV: Final = "STAGELENS_GPU_COLLECTOR"
"""Env var: ``0``/``false`` turns the automatic GPU collector off, ``1``/``true`` forces it on."""


def _cost_from_env() -> float | None:
    raw = os.environ.get(COST_ENV)
    if not raw:
        return None
    try:
        return float(raw)
    except ValueError:
        _log.warning("ignoring non-numeric %s=%r", COST_ENV, raw)
        return None


_LABELS: Final = (semconv.LABEL_GPU, semconv.LABEL_UUID, semconv.LABEL_NAME)
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
"""Per-GPU gauges: exposed name, ``GpuSample`` field, HELP text."""

_Key = list[str]
_Build = Callable[[Sequence[GpuSample], Sequence[_Key]], Metric]


def _keys(samples: Sequence[GpuSample]) -> list[_Key]:
    """The ``gpu``, ``uuid``, ``name`` label values of each sample."""
    return [[str(s.index), s.uuid, s.name] for s in samples]


def _gauge(name: str, attr: str, doc: str) -> _Build:
    """A builder of one per-GPU gauge family from the ``GpuSample`` field ``attr``."""

    def build(samples: Sequence[GpuSample], keys: Sequence[_Key]) -> Metric:
        family = GaugeMetricFamily(name, doc, labels=_LABELS)
        for key, s in zip(keys, samples, strict=True):
            value = getattr(s, attr)
            if value is not None:
                family.add_metric(key, float(value))
        return family

    return build


def _energy(samples: Sequence[GpuSample], keys: Sequence[_Key]) -> Metric:
    """The energy counter (exposed with ``_total``; the family name is without it)."""
    family = CounterMetricFamily(
        semconv.GPU_ENERGY.removesuffix("_total"), "Energy since driver load", labels=_LABELS
    )
    for key, s in zip(keys, samples, strict=True):
        if s.energy_joules is not None:
            family.add_metric(key, float(s.energy_joules))
    return family


def _processes(samples: Sequence[GpuSample], keys: Sequence[_Key]) -> Metric:
    """Framebuffer per compute process, one series per ``pid`` (with its ``process`` name)."""
    family = GaugeMetricFamily(
        semconv.GPU_PROCESS_MEMORY_USED,
        "Framebuffer used per compute process (from the background sampler)",
        labels=[*_LABELS, semconv.LABEL_PID, semconv.LABEL_PROCESS],
    )
    for key, s in zip(keys, samples, strict=True):
        for p in s.processes:
            family.add_metric([*key, str(p.pid), p.name], float(p.used_bytes))
    return family


def _cost(cost_usd_per_hour: float) -> _Build:
    """A builder of the configured GPU-hour price, one series per GPU."""

    def build(samples: Sequence[GpuSample], keys: Sequence[_Key]) -> Metric:
        family = GaugeMetricFamily(
            semconv.GPU_COST_PER_HOUR, "Price of one GPU-hour", labels=_LABELS
        )
        for key in keys:
            family.add_metric(key, cost_usd_per_hour)
        return family

    return build


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
        """Use ``reader`` or build one over ``nvml`` (default: import ``pynvml``).

        Unexpected failures (a read, a family that fails to build) go to the reader's
        ``on_error``.
        """
        self.reader = (
            reader
            if reader is not None
            else GpuReader(nvml, interval_s=interval_s, gpm=gpm, on_error=on_error)
        )
        self._cost = cost_usd_per_hour if cost_usd_per_hour is not None else _cost_from_env()
        builders = [_gauge(*spec) for spec in _GAUGES]
        builders += [_energy, _processes]
        if self._cost is not None:
            builders.append(_cost(self._cost))
        self._builders: tuple[_Build, ...] = tuple(builders)

    @property
    def cost_usd_per_hour(self) -> float | None:
        """The configured GPU-hour price (argument or ``$STAGELENS_GPU_COST_USD_PER_HOUR``)."""
        return self._cost

    def close(self) -> None:
        """Stop the background sampler."""
        self.reader.close()

    def describe(self) -> list[Metric]:
        """Nothing: registering must not read NVML (``REGISTRY`` would call ``collect()``)."""
        return []

    def collect(self) -> Iterator[Metric]:
        """Read NVML once and yield ``up`` plus one family per metric that has samples.

        Never raises: a family that fails to build is reported and left out of this
        scrape; the others are still served.
        """
        snapshot = self.reader.read()
        up = GaugeMetricFamily(semconv.GPU_COLLECTOR_UP, "1 when NVML answered on this scrape")
        up.add_metric([], 1.0 if snapshot.up else 0.0)
        yield up
        samples = snapshot.samples
        if not samples:
            return
        keys = _keys(samples)
        for build in self._builders:
            try:
                family = build(samples, keys)
            except Exception as exc:  # one family's bug must not fail the whole scrape
                self.reader.report(exc)
                continue
            if family.samples:
                yield family


def gpu_collector_enabled(gpu: bool | None = None) -> bool:
    """Resolve the GPU opt-in: ``True``/``False`` as given; ``None`` (automatic) means on when
    ``$STAGELENS_GPU_COLLECTOR`` says so (``1``/``true``), off when it says ``0``/``false``,
    and otherwise on exactly when the NVML binding (nvidia-ml-py) imports."""
    if gpu is not None:
        return gpu
    # Imported here: stagelens.config needs pydantic, and this module must import with
    # prometheus-client alone (examples/gpu_check.py on a bare GPU machine).
    from stagelens.config import env_flag

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
