"""The OTel GPU variant over the NVML fake, read with an in-memory metric reader."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import Gauge, InMemoryMetricReader, Sum
from stagelens.exporters.gpu_otel import register_gpu_meters
from stagelens.exporters.nvml_sampler import GpuReader

from stagelens import semconv
from tests.exporters import fake_nvml
from tests.exporters.fake_nvml import FakeGpu

UUID = "GPU-a"
GPU_ATTRS = {
    "hw.id": UUID,
    "hw.name": "gpu0",
    "hw.model": "NVIDIA H100 80GB HBM3",
    "hw.vendor": "NVIDIA",
    "hw.type": "gpu",
}


def _collect(reader: InMemoryMetricReader) -> dict[str, Any]:
    data = reader.get_metrics_data()
    assert data is not None
    return {
        m.name: m
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        if sm.scope.name == semconv.INSTRUMENTATION_NAME
        for m in sm.metrics
    }


def _points(metric: Any) -> list[tuple[dict[str, Any], float]]:
    return [(dict(p.attributes or {}), p.value) for p in metric.data.data_points]


class TestGpuOtel:
    """hw.* instruments: exact names, units, types, attributes, values."""

    def test_names_units_attributes(self) -> None:
        """Each reading appears once per GPU under its hw.* name, unit and instrument type."""
        fake_nvml.configure([FakeGpu(uuid=UUID)])
        gpu_reader = GpuReader(fake_nvml, interval_s=3600)
        assert gpu_reader.sampler is not None
        gpu_reader.sampler.sample_once()  # second GPM sample: SM activity available
        metric_reader = InMemoryMetricReader()
        provider = MeterProvider(metric_readers=[metric_reader])
        register_gpu_meters(provider, gpu_reader, cost_usd_per_hour=2.5)
        got = _collect(metric_reader)
        expected: dict[str, tuple[str, type, float]] = {
            "hw.gpu.utilization": ("1", Gauge, 1.0),
            "hw.gpu.memory.usage": ("By", Sum, 2_000_000_000),
            "hw.gpu.memory.limit": ("By", Sum, 85_520_809_984),
            "hw.gpu.memory.utilization": ("1", Gauge, 2_000_000_000 / 85_520_809_984),
            "hw.power": ("W", Gauge, 690.0),
            "hw.energy": ("J", Sum, 123456.789),
            "stagelens.gpu.sm.activity": ("1", Gauge, 0.967),
            "stagelens.gpu.sm.clock": ("Hz", Gauge, 1980e6),
            "stagelens.gpu.clock_event_reasons": ("1", Gauge, 1),
            "stagelens.gpu.cost_per_hour": ("USD/h", Gauge, 2.5),
        }
        for name, (unit, kind, value) in expected.items():
            metric = got[name]
            assert metric.unit == unit, name
            assert isinstance(metric.data, kind), name
            points = _points(metric)
            assert len(points) == 1, name
            attrs, observed = points[0]
            assert observed == pytest.approx(value), name
            want = dict(GPU_ATTRS)
            if name == "hw.gpu.utilization":
                want["hw.gpu.task"] = "general"
            assert attrs == want, name
        assert got["hw.energy"].data.is_monotonic is True
        assert got["hw.gpu.memory.usage"].data.is_monotonic is False
        assert got["hw.temperature"].unit == "Cel"
        assert _points(got["hw.temperature"]) == [
            (
                {
                    "hw.id": f"{UUID}/temperature",
                    "hw.name": "gpu0 core",
                    "hw.parent": UUID,
                    "hw.type": "temperature",
                },
                45,
            )
        ]
        assert _points(got["stagelens.gpu.process.memory.usage"]) == [
            (
                {**GPU_ATTRS, "process.pid": 4242, "process.executable.name": "python3"},
                1_500_000_000,
            )
        ]
        assert _points(got["stagelens.gpu.collector.up"]) == [({}, 1)]
        provider.shutdown()

    def test_one_nvml_read_per_collection(self) -> None:
        """All callbacks of one collection share one NVML read."""
        fake_nvml.configure([FakeGpu(uuid=UUID), FakeGpu(uuid="GPU-b")])
        gpu_reader = GpuReader(fake_nvml, gpm=False, processes=False)
        metric_reader = InMemoryMetricReader()
        provider = MeterProvider(metric_readers=[metric_reader])
        register_gpu_meters(provider, gpu_reader)
        got = _collect(metric_reader)
        assert len(_points(got["hw.power"])) == 2
        assert fake_nvml.calls["nvmlDeviceGetPowerUsage"] == 2
        provider.shutdown()

    def test_no_nvml_reports_up_zero_only(self) -> None:
        """Without a driver only stagelens.gpu.collector.up = 0 is observed."""
        fake_nvml.configure([FakeGpu()], init_error=fake_nvml.NVMLError_DriverNotLoaded)
        metric_reader = InMemoryMetricReader()
        provider = MeterProvider(metric_readers=[metric_reader])
        register_gpu_meters(provider, GpuReader(fake_nvml))
        got = _collect(metric_reader)
        assert _points(got["stagelens.gpu.collector.up"]) == [({}, 0)]
        assert all(not _points(m) for n, m in got.items() if n != "stagelens.gpu.collector.up")
        provider.shutdown()

    def test_names_match_the_semantic_conventions_package(self) -> None:
        """Our hw.* constants equal the installed opentelemetry-semantic-conventions ones."""
        metrics = pytest.importorskip("opentelemetry.semconv._incubating.metrics.hw_metrics")
        attrs = pytest.importorskip("opentelemetry.semconv._incubating.attributes.hw_attributes")
        assert semconv.HW_GPU_UTILIZATION == metrics.HW_GPU_UTILIZATION
        assert semconv.HW_GPU_MEMORY_USAGE == metrics.HW_GPU_MEMORY_USAGE
        assert semconv.HW_GPU_MEMORY_LIMIT == metrics.HW_GPU_MEMORY_LIMIT
        assert semconv.HW_GPU_MEMORY_UTILIZATION == metrics.HW_GPU_MEMORY_UTILIZATION
        assert semconv.HW_POWER == metrics.HW_POWER
        assert semconv.HW_ENERGY == metrics.HW_ENERGY
        assert semconv.HW_TEMPERATURE == metrics.HW_TEMPERATURE
        assert semconv.ATTR_HW_ID == attrs.HW_ID
        assert semconv.ATTR_HW_NAME == attrs.HW_NAME
        assert semconv.ATTR_HW_MODEL == attrs.HW_MODEL
        assert semconv.ATTR_HW_VENDOR == attrs.HW_VENDOR
        assert semconv.ATTR_HW_TYPE == attrs.HW_TYPE
        assert semconv.ATTR_HW_PARENT == attrs.HW_PARENT
        assert semconv.ATTR_HW_GPU_TASK == attrs.HW_GPU_TASK
        assert attrs.HwTypeValues.GPU.value == semconv.HW_TYPE_GPU
        assert attrs.HwTypeValues.TEMPERATURE.value == semconv.HW_TYPE_TEMPERATURE
        assert attrs.HwGpuTaskValues.GENERAL.value == semconv.HW_GPU_TASK_GENERAL
