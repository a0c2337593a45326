"""configure(gpu=...) registers the GPU collector where /metrics serves, and the OTel gauges."""

from __future__ import annotations

import logging
from typing import Any, cast

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.trace import NoOpTracerProvider
from prometheus_client import CollectorRegistry, generate_latest
from stagelens.exporters import configure, enable_gpu_metrics
from stagelens.exporters import nvml as nvml_mod
from stagelens.exporters.nvml_read import NVML_MODULE_ENV

from stagelens import semconv
from tests.exporters import fake_nvml
from tests.exporters.fake_nvml import FakeGpu

FAKE = "tests.exporters.fake_nvml"


@pytest.fixture(autouse=True)
def _one_fake_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """One fake GPU, and no switch from the environment (the readers a test makes are
    closed by the exporters' conftest)."""
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    monkeypatch.delenv(nvml_mod.ENABLE_ENV, raising=False)
    fake_nvml.configure([FakeGpu(uuid="GPU-a")])


def _configure(**kwargs: Any) -> Any:
    return configure(
        tracer_provider=NoOpTracerProvider(),
        set_global=False,
        registry=CollectorRegistry(),
        **kwargs,
    )


class TestConfigureGpu:
    """The gateway's opt-in."""

    def test_gpu_true_lands_on_the_served_registry(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """gpu=True: /metrics (the exposition registry) has collector_up 1 and power."""
        monkeypatch.setenv(NVML_MODULE_ENV, FAKE)
        telemetry = _configure(gpu=True)
        body = generate_latest(telemetry.exposition_registry).decode()
        assert "stagelens_gpu_collector_up 1.0" in body
        assert (
            'stagelens_gpu_power_watts{gpu="0",name="NVIDIA H100 80GB HBM3",uuid="GPU-a"}' in body
        )

    def test_multiprocess_mode_serves_the_collector(
        self, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
    ) -> None:
        """With PROMETHEUS_MULTIPROC_DIR the collector is on the registry /metrics serves."""
        monkeypatch.setenv(NVML_MODULE_ENV, FAKE)
        monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
        telemetry = configure(tracer_provider=NoOpTracerProvider(), set_global=False, gpu=True)
        assert telemetry.exposition_registry is not telemetry.registry
        served = generate_latest(telemetry.exposition_registry).decode()
        assert "stagelens_gpu_collector_up 1.0" in served

    def test_gpu_false_and_env_off(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """gpu=False, or gpu=None with STAGELENS_GPU_COLLECTOR=0: no GPU series at all."""
        monkeypatch.setenv(NVML_MODULE_ENV, FAKE)
        off = _configure(gpu=False)
        assert b"stagelens_gpu_" not in generate_latest(off.exposition_registry)
        monkeypatch.setenv(nvml_mod.ENABLE_ENV, "0")
        auto_off = _configure()
        assert b"stagelens_gpu_" not in generate_latest(auto_off.exposition_registry)

    def test_auto_on_when_binding_imports(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """gpu=None (default) with an importable binding registers the collector."""
        monkeypatch.setenv(NVML_MODULE_ENV, FAKE)
        telemetry = _configure()
        assert b"stagelens_gpu_collector_up 1.0" in generate_latest(telemetry.exposition_registry)

    def test_no_gpu_is_harmless(
        self, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
    ) -> None:
        """gpu=True without a driver: configure succeeds, up 0, one warning."""
        monkeypatch.setenv(NVML_MODULE_ENV, FAKE)
        fake_nvml.configure([FakeGpu()], init_error=fake_nvml.NVMLError_DriverNotLoaded)
        with caplog.at_level(logging.WARNING, logger="stagelens.exporters"):
            telemetry = _configure(gpu=True)
            for _ in range(3):
                body = generate_latest(telemetry.exposition_registry).decode()
                assert "stagelens_gpu_collector_up 0.0" in body
                assert "stagelens_gpu_power_watts" not in body
        assert len(caplog.records) == 1

    def test_meter_provider_gets_hw_gauges(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """With a meter provider the hw.* gauges read the same GPUs."""
        monkeypatch.setenv(NVML_MODULE_ENV, FAKE)
        metric_reader = InMemoryMetricReader()
        provider = MeterProvider(metric_readers=[metric_reader])
        _configure(gpu=True, meter_provider=provider)
        data = metric_reader.get_metrics_data()
        assert data is not None
        power = [
            p.value
            for rm in data.resource_metrics
            for sm in rm.scope_metrics
            for m in sm.metrics
            if m.name == semconv.HW_POWER
            for p in m.data.data_points
        ]
        assert power == [690.0]
        provider.shutdown()

    def test_enable_twice_is_idempotent(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """A second enable on the same registry returns the first collector."""
        monkeypatch.setenv(NVML_MODULE_ENV, FAKE)
        registry = CollectorRegistry()
        first = enable_gpu_metrics(registry, gpu=True)
        assert first is not None
        assert enable_gpu_metrics(registry, gpu=True) is first
        assert generate_latest(registry).count(b"stagelens_gpu_collector_up 1.0") == 1

    def test_unexpected_failure_is_counted(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """A non-NVML failure in a scrape is counted in telemetry_errors{component="nvml"}."""
        monkeypatch.setenv(NVML_MODULE_ENV, FAKE)
        fake_nvml.configure([FakeGpu(util_gpu=cast("int", "broken"))])
        telemetry = _configure(gpu=True)
        registry = telemetry.exposition_registry
        assert registry.get_sample_value(semconv.GPU_COLLECTOR_UP) == 0.0
        errors = registry.get_sample_value(
            semconv.TELEMETRY_ERRORS, {semconv.LABEL_COMPONENT: semconv.COMPONENT_NVML}
        )
        assert errors is not None
        assert errors >= 1.0
