"""NvmlCollector against the NVML fake: names, units, partial failures, missing NVML."""

from __future__ import annotations

import logging

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from stagelens.exporters.nvml import NvmlCollector, read_gpu_samples

from stagelens import semconv
from tests.exporters import fake_nvml
from tests.exporters.fake_nvml import FakeGpu


def _scrape(collector: NvmlCollector) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = CollectorRegistry()
    registry.register(collector)
    out = {}
    for family in registry.collect():
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


LABELS0 = (("gpu", "0"), ("name", "NVIDIA H100 80GB HBM3"), ("uuid", "GPU-a"))


class TestNvmlCollector:
    """Sync collector behaviour."""

    def test_units_and_names(self) -> None:
        """Every metric is reported in SI units under the semconv name with gpu/uuid/name labels."""
        fake_nvml.configure([FakeGpu(uuid="GPU-a")])
        c = NvmlCollector(fake_nvml, gpm=False, cost_usd_per_hour=2.5)
        m = _scrape(c)
        assert m[(semconv.GPU_COLLECTOR_UP, ())] == 1.0
        assert m[(semconv.GPU_POWER, LABELS0)] == 690.0
        assert m[(semconv.GPU_ENERGY, LABELS0)] == pytest.approx(123456.789)
        assert m[(semconv.GPU_SM_CLOCK, LABELS0)] == 1980e6
        assert m[(semconv.GPU_UTILIZATION, LABELS0)] == 1.0
        assert m[(semconv.GPU_MEMORY_TOTAL, LABELS0)] == 85_520_809_984
        assert m[(semconv.GPU_CLOCK_EVENT_REASONS, LABELS0)] == 1.0
        assert m[(semconv.GPU_COST_PER_HOUR, LABELS0)] == 2.5
        assert (
            m[(semconv.GPU_PROCESS_MEMORY_USED, (*LABELS0[:2], ("pid", "4242"), LABELS0[2]))]
            == 1.5e9
        )
        types = {f.name: f.type for f in _reg(c).collect()}
        assert types[semconv.GPU_ENERGY.removesuffix("_total")] == "counter"
        assert types[semconv.GPU_POWER] == "gauge"
        assert b"stagelens_gpu_energy_joules_total{" in generate_latest(_reg(c))

    def test_not_supported_drops_only_that_metric(self) -> None:
        """A NotSupported power reading on GPU 1 (MIG-like) drops power for GPU 1 only."""
        fake_nvml.configure([FakeGpu(uuid="GPU-a"), FakeGpu(uuid="GPU-b", unsupported={"power"})])
        m = _scrape(NvmlCollector(fake_nvml, gpm=False))
        gpus_with_power = {dict(k[1])["gpu"] for k in m if k[0] == semconv.GPU_POWER}
        gpus_with_temp = {dict(k[1])["gpu"] for k in m if k[0] == semconv.GPU_TEMPERATURE}
        assert gpus_with_power == {"0"}
        assert gpus_with_temp == {"0", "1"}

    def test_gpm_present_and_absent(self) -> None:
        """SM activity appears after two GPM samples on a GPM GPU, never on a non-GPM one."""
        fake_nvml.configure([FakeGpu(uuid="GPU-a"), FakeGpu(uuid="GPU-b", gpm=False)])
        c = NvmlCollector(fake_nvml, interval_s=3600)
        assert c._sampler is not None
        c._sampler.sample_once()
        m = _scrape(c)
        c.close()
        sm = {dict(k[1])["gpu"]: v for k, v in m.items() if k[0] == semconv.GPU_SM_ACTIVE}
        assert sm == {"0": pytest.approx(0.967)}

    @pytest.mark.parametrize(
        "error",
        [fake_nvml.NVMLError_DriverNotLoaded, fake_nvml.NVMLError_LibraryNotFound],
    )
    def test_no_nvml_up_zero_one_warning(
        self, error: type[fake_nvml.NVMLError], caplog: pytest.LogCaptureFixture
    ) -> None:
        """Without a driver the collector reports up 0 on every scrape and warns exactly once."""
        fake_nvml.configure([FakeGpu()], init_error=error)
        with caplog.at_level(logging.WARNING, logger="stagelens.exporters.nvml"):
            c = NvmlCollector(fake_nvml)
            for _ in range(5):
                assert _scrape(c) == {(semconv.GPU_COLLECTOR_UP, ()): 0.0}
        assert len(caplog.records) == 1

    def test_uninitialised_read_raises(self) -> None:
        """read_gpu_samples without nvmlInit raises the fake's Uninitialized like pynvml."""
        fake_nvml.configure([FakeGpu()])
        with pytest.raises(fake_nvml.NVMLError_Uninitialized):
            read_gpu_samples(fake_nvml)


def _reg(c: NvmlCollector) -> CollectorRegistry:
    r = CollectorRegistry()
    r.register(c)
    return r
