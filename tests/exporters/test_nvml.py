"""NvmlCollector against the NVML fake: names, units, per-call/per-GPU/fatal errors, recovery."""

from __future__ import annotations

import dataclasses
import itertools
import logging
from typing import Any, cast

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from stagelens.exporters import nvml as nvml_mod
from stagelens.exporters.nvml import (
    NvmlCollector,
    gpu_collector_enabled,
    register_gpu_collector,
    unregister_gpu_collector,
)
from stagelens.exporters.nvml_read import (
    LOGGER_NAME,
    NVML_MODULE_ENV,
    GpuSnapshot,
    NvmlFatalError,
    read_gpu_samples,
)
from stagelens.exporters.nvml_sampler import GpuReader

from stagelens import semconv
from tests.exporters import fake_nvml
from tests.exporters.fake_nvml import FakeGpu

Scrape = dict[tuple[str, tuple[tuple[str, str], ...]], float]
LABELS0 = (("gpu", "0"), ("name", "NVIDIA H100 80GB HBM3"), ("uuid", "GPU-a"))
LOGGER = LOGGER_NAME


class Clock:
    """A manual monotonic clock for the retry backoff."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _scrape(collector: NvmlCollector) -> Scrape:
    registry = CollectorRegistry()
    registry.register(collector)
    out: Scrape = {}
    for family in registry.collect():
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _gpus(m: Scrape, metric: str) -> set[str]:
    return {dict(k[1])["gpu"] for k in m if k[0] == metric}


def _collector(clock: Clock | None = None, **kwargs: Any) -> NvmlCollector:
    """A collector over the fake without the background thread unless asked."""
    kwargs.setdefault("gpm", False)
    kwargs.setdefault("processes", False)
    reader = GpuReader(fake_nvml, clock=clock or Clock(), **kwargs)
    return NvmlCollector(reader=reader)


class TestReadings:
    """What one scrape reports."""

    def test_units_names_and_types(self) -> None:
        """Every metric is in SI units under its semconv name with gpu/uuid/name labels."""
        fake_nvml.configure([FakeGpu(uuid="GPU-a")])
        reader = GpuReader(fake_nvml, gpm=False, interval_s=3600)
        c = NvmlCollector(reader=reader, cost_usd_per_hour=2.5)
        m = _scrape(c)
        assert m[(semconv.GPU_COLLECTOR_UP, ())] == 1.0
        assert m[(semconv.GPU_POWER, LABELS0)] == 690.0
        assert m[(semconv.GPU_ENERGY, LABELS0)] == pytest.approx(123456.789)
        assert m[(semconv.GPU_SM_CLOCK, LABELS0)] == 1980e6
        assert m[(semconv.GPU_UTILIZATION, LABELS0)] == 1.0
        assert m[(semconv.GPU_MEMORY_USED, LABELS0)] == 2_000_000_000
        assert m[(semconv.GPU_MEMORY_TOTAL, LABELS0)] == 85_520_809_984
        assert m[(semconv.GPU_TEMPERATURE, LABELS0)] == 45.0
        assert m[(semconv.GPU_CLOCK_EVENT_REASONS, LABELS0)] == 1.0
        assert m[(semconv.GPU_COST_PER_HOUR, LABELS0)] == 2.5
        proc_labels = (*LABELS0[:2], ("pid", "4242"), ("process", "python3"), LABELS0[2])
        assert m[(semconv.GPU_PROCESS_MEMORY_USED, proc_labels)] == 1.5e9
        registry = CollectorRegistry()
        registry.register(c)
        types = {f.name: f.type for f in registry.collect()}
        assert types[semconv.GPU_ENERGY.removesuffix("_total")] == "counter"
        assert types[semconv.GPU_POWER] == "gauge"
        assert b"stagelens_gpu_energy_joules_total{" in generate_latest(registry)

    def test_identity_read_once_per_session(self) -> None:
        """UUID and name are read once per GPU, not on every scrape."""
        fake_nvml.configure([FakeGpu(uuid="GPU-a"), FakeGpu(uuid="GPU-b")])
        c = _collector()
        for _ in range(5):
            assert _scrape(c)[(semconv.GPU_COLLECTOR_UP, ())] == 1.0
        assert fake_nvml.calls["nvmlDeviceGetUUID"] == 2
        assert fake_nvml.calls["nvmlDeviceGetName"] == 2
        assert fake_nvml.calls["nvmlDeviceGetPowerUsage"] == 10

    def test_process_list_is_not_read_on_the_scrape_path(self) -> None:
        """Scrapes reuse the background sampler's process list; only the sampler reads it."""
        fake_nvml.configure([FakeGpu(uuid="GPU-a")])
        c = _collector(processes=True, interval_s=3600)
        after_start = fake_nvml.calls["nvmlDeviceGetComputeRunningProcesses"]
        for _ in range(5):
            m = _scrape(c)
        assert fake_nvml.calls["nvmlDeviceGetComputeRunningProcesses"] == after_start == 1
        assert any(k[0] == semconv.GPU_PROCESS_MEMORY_USED for k in m)

    def test_process_name_unknown_and_unavailable_memory(self) -> None:
        """A pid NVML cannot name gets process=""; a process without a memory value is skipped."""
        fake_nvml.configure(
            [FakeGpu(uuid="GPU-a", processes=[(7, 10), (8, None)])], process_names={}
        )
        m = _scrape(_collector(processes=True, interval_s=3600))
        rows = {
            (dict(k[1])["pid"], dict(k[1])["process"]): v
            for k, v in m.items()
            if k[0] == semconv.GPU_PROCESS_MEMORY_USED
        }
        assert rows == {("7", ""): 10.0}


class TestPerCallAndPerGpuErrors:
    """A failing call or GPU drops only itself."""

    @pytest.mark.parametrize(
        "error", [fake_nvml.NVMLError_NotSupported, fake_nvml.NVMLError_NoPermission]
    )
    def test_one_call_failing_drops_only_that_metric(self, error: type[Exception]) -> None:
        """NotSupported (MIG) or NoPermission on GPU 1's power drops power for GPU 1 only."""
        fake_nvml.configure(
            [
                FakeGpu(uuid="GPU-a"),
                FakeGpu(uuid="GPU-b", errors={"nvmlDeviceGetPowerUsage": error}),
            ]
        )
        c = _collector()
        for _ in range(2):  # not fatal: the next scrape is the same
            m = _scrape(c)
            assert m[(semconv.GPU_COLLECTOR_UP, ())] == 1.0
            assert _gpus(m, semconv.GPU_POWER) == {"0"}
            assert _gpus(m, semconv.GPU_TEMPERATURE) == {"0", "1"}

    @pytest.mark.parametrize(
        "call", ["nvmlDeviceGetHandleByIndex", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetUUID"]
    )
    def test_gpu_is_lost_on_one_of_two(self, call: str) -> None:
        """GpuIsLost on GPU 1 (from its handle or any reading) leaves GPU 0 fully reported."""
        fake_nvml.configure(
            [
                FakeGpu(uuid="GPU-a"),
                FakeGpu(uuid="GPU-b", errors={call: fake_nvml.NVMLError_GpuIsLost}),
            ]
        )
        m = _scrape(_collector())
        assert m[(semconv.GPU_COLLECTOR_UP, ())] == 1.0
        assert m[(semconv.GPU_POWER, LABELS0)] == 690.0
        assert {dict(k[1])["gpu"] for k in m if k[1]} == {"0"}

    def test_lost_gpu_comes_back(self) -> None:
        """A GPU lost on one scrape is read again (identity re-read) once it answers."""
        lost = FakeGpu(uuid="GPU-b", lost=True)
        fake_nvml.configure([FakeGpu(uuid="GPU-a"), lost])
        c = _collector()
        assert _gpus(_scrape(c), semconv.GPU_POWER) == {"0"}
        lost.lost = False
        assert _gpus(_scrape(c), semconv.GPU_POWER) == {"0", "1"}


class TestScrapeTolerance:
    """A family that fails to build drops only itself, never the scrape."""

    def test_one_broken_family_leaves_the_others(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """A power value that is no number drops the power family; the rest is served."""
        fake_nvml.configure([FakeGpu(uuid="GPU-a")])
        seen: list[BaseException] = []
        reader = GpuReader(fake_nvml, gpm=False, processes=False, on_error=seen.append)
        good = reader.read().samples[0]
        bad = dataclasses.replace(good, power_watts=cast("float", "broken"))
        monkeypatch.setattr(reader, "read", lambda: GpuSnapshot(True, [bad]))
        m = _scrape(NvmlCollector(reader=reader, cost_usd_per_hour=2.5))
        assert m[(semconv.GPU_COLLECTOR_UP, ())] == 1.0
        assert _gpus(m, semconv.GPU_POWER) == set()
        assert m[(semconv.GPU_TEMPERATURE, LABELS0)] == 45.0
        assert m[(semconv.GPU_ENERGY, LABELS0)] == pytest.approx(123456.789)
        assert m[(semconv.GPU_COST_PER_HOUR, LABELS0)] == 2.5
        assert [type(e) for e in seen] == [ValueError]


class TestFatalErrorsAndRecovery:
    """NVML itself failing: up 0, one warning, re-initialisation with backoff."""

    @pytest.mark.parametrize(
        "error", [fake_nvml.NVMLError_Uninitialized, fake_nvml.NVMLError_DriverNotLoaded]
    )
    def test_fatal_error_during_scrape_then_recovery(
        self, error: type[fake_nvml.NVMLError], caplog: pytest.LogCaptureFixture
    ) -> None:
        """A fatal error mid-run gives up 0 (no GPU series), then up 1 after a retry."""
        fake_nvml.configure([FakeGpu(uuid="GPU-a")])
        clock = Clock()
        c = _collector(clock)
        assert _scrape(c)[(semconv.GPU_COLLECTOR_UP, ())] == 1.0
        fake_nvml.break_driver(error)
        fake_nvml.set_init_error(error)
        with caplog.at_level(logging.INFO, logger=LOGGER):
            for _ in range(3):
                assert _scrape(c) == {(semconv.GPU_COLLECTOR_UP, ()): 0.0}
                clock.now += 10
            fake_nvml.break_driver(None)
            fake_nvml.set_init_error(None)
            clock.now += 120
            m = _scrape(c)
        assert m[(semconv.GPU_COLLECTOR_UP, ())] == 1.0
        assert m[(semconv.GPU_POWER, LABELS0)] == 690.0
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1
        assert any("available again" in r.getMessage() for r in caplog.records)

    def test_retries_back_off(self) -> None:
        """While init keeps failing, nvmlInit is retried with doubling gaps, not every scrape."""
        fake_nvml.configure([FakeGpu()], init_error=fake_nvml.NVMLError_DriverNotLoaded)
        clock = Clock()
        c = _collector(clock)  # first try at construction, next allowed 1 s later
        inits = []
        for _ in range(40):  # one scrape per simulated second
            _scrape(c)
            inits.append(fake_nvml.calls["nvmlInit"])
            clock.now += 1
        tried_at = [i for i in range(1, len(inits)) if inits[i] > inits[i - 1]]
        gaps = [b - a for a, b in itertools.pairwise(tried_at)]
        assert gaps[:4] == [2, 4, 8, 16]
        assert inits[-1] < 10

    @pytest.mark.parametrize(
        "error", [fake_nvml.NVMLError_DriverNotLoaded, fake_nvml.NVMLError_LibraryNotFound]
    )
    def test_no_driver_up_zero_one_warning(
        self, error: type[fake_nvml.NVMLError], caplog: pytest.LogCaptureFixture
    ) -> None:
        """Without a driver every scrape reports up 0 only, warning exactly once."""
        fake_nvml.configure([FakeGpu()], init_error=error)
        clock = Clock()
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            c = _collector(clock)
            for _ in range(5):
                assert _scrape(c) == {(semconv.GPU_COLLECTOR_UP, ()): 0.0}
                clock.now += 100
        assert len(caplog.records) == 1

    def test_library_not_installed(
        self, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
    ) -> None:
        """When the NVML module cannot be imported: up 0, one warning, no exception."""
        monkeypatch.setenv(NVML_MODULE_ENV, "stagelens_no_such_nvml_module")
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            c = NvmlCollector()
            for _ in range(3):
                assert _scrape(c) == {(semconv.GPU_COLLECTOR_UP, ()): 0.0}
        assert len(caplog.records) == 1
        assert "not installed" in caplog.records[0].getMessage()

    def test_real_pynvml_without_a_driver(self, caplog: pytest.LogCaptureFixture) -> None:
        """The real nvidia-ml-py on a machine without libnvidia-ml: up 0, one warning."""
        pynvml = pytest.importorskip("pynvml")
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError:
            pass
        else:
            pynvml.nvmlShutdown()
            pytest.skip("this machine has a working NVML")
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            c = NvmlCollector(pynvml)
            assert _scrape(c) == {(semconv.GPU_COLLECTOR_UP, ()): 0.0}
            assert _scrape(c) == {(semconv.GPU_COLLECTOR_UP, ()): 0.0}
        assert len(caplog.records) == 1
        assert "NVMLError_LibraryNotFound" in caplog.records[0].getMessage()

    def test_read_without_init_raises_fatal(self) -> None:
        """read_gpu_samples before nvmlInit raises NvmlFatalError wrapping Uninitialized."""
        fake_nvml.configure([FakeGpu()])
        with pytest.raises(NvmlFatalError) as info:
            read_gpu_samples(fake_nvml)
        assert isinstance(info.value.__cause__, fake_nvml.NVMLError_Uninitialized)

    def test_unexpected_exception_is_reported_not_raised(self) -> None:
        """A non-NVML exception in a read yields up 0 and goes to on_error."""
        fake_nvml.configure([FakeGpu(util_gpu=cast("int", "broken"))])
        seen: list[BaseException] = []
        reader = GpuReader(fake_nvml, gpm=False, processes=False, on_error=seen.append)
        assert _scrape(NvmlCollector(reader=reader)) == {(semconv.GPU_COLLECTOR_UP, ()): 0.0}
        assert len(seen) == 1


class TestGpm:
    """The background sampler's GPM diff."""

    def test_gpm_present_and_absent(self) -> None:
        """SM activity appears after two GPM samples on a GPM GPU, never on a non-GPM one."""
        fake_nvml.configure([FakeGpu(uuid="GPU-a"), FakeGpu(uuid="GPU-b", gpm=False)])
        c = _collector(gpm=True, interval_s=3600)
        assert c.reader.sampler is not None
        c.reader.sampler.sample_once()
        m = _scrape(c)
        sm = {dict(k[1])["gpu"]: v for k, v in m.items() if k[0] == semconv.GPU_SM_ACTIVE}
        assert sm == {"0": pytest.approx(0.967)}

    def test_per_metric_status_is_checked(self) -> None:
        """A metric whose nvmlReturn is not SUCCESS is skipped though the call succeeded."""
        fake_nvml.configure(
            [FakeGpu(uuid="GPU-a", gpm_metric_return=fake_nvml.NVML_ERROR_NOT_SUPPORTED)]
        )
        c = _collector(gpm=True, interval_s=3600)
        assert c.reader.sampler is not None
        c.reader.sampler.sample_once()
        assert fake_nvml.calls["nvmlGpmMetricsGet"] == 1
        assert _gpus(_scrape(c), semconv.GPU_SM_ACTIVE) == set()

    def test_kept_samples_freed_on_stop(self) -> None:
        """While running one sample per GPM GPU is kept; close() frees it: nothing leaks."""
        fake_nvml.configure([FakeGpu(uuid="GPU-a"), FakeGpu(uuid="GPU-b")])
        c = _collector(gpm=True, interval_s=3600)
        assert c.reader.sampler is not None
        for _ in range(3):
            c.reader.sampler.sample_once()
        assert fake_nvml.live_gpm_samples() == 2
        c.close()
        assert fake_nvml.live_gpm_samples() == 0

    def test_lost_gpu_sample_freed(self) -> None:
        """A GPU lost between intervals has its kept sample freed."""
        gpu = FakeGpu(uuid="GPU-a")
        fake_nvml.configure([gpu])
        c = _collector(gpm=True, interval_s=3600)
        assert c.reader.sampler is not None
        assert fake_nvml.live_gpm_samples() == 1
        gpu.lost = True
        c.reader.sampler.sample_once()
        assert fake_nvml.live_gpm_samples() == 0


class TestRegistration:
    """register_gpu_collector and the automatic opt-in."""

    def test_idempotent_per_registry(self) -> None:
        """Registering twice on one registry returns the first collector (no duplicate error)."""
        fake_nvml.configure([FakeGpu()])
        registry = CollectorRegistry()
        first = register_gpu_collector(registry, fake_nvml, interval_s=3600)
        assert first is not None
        assert register_gpu_collector(registry, fake_nvml) is first
        assert registry.get_sample_value(semconv.GPU_COLLECTOR_UP) == 1.0
        unregister_gpu_collector(registry)
        assert registry.get_sample_value(semconv.GPU_COLLECTOR_UP) is None

    def test_gpu_false_registers_nothing(self) -> None:
        """gpu=False returns None and leaves the registry empty."""
        registry = CollectorRegistry()
        assert register_gpu_collector(registry, fake_nvml, gpu=False) is None
        assert list(registry.collect()) == []

    @pytest.mark.parametrize(
        ("env", "module", "expected"),
        [
            ("0", "tests.exporters.fake_nvml", False),
            ("false", "tests.exporters.fake_nvml", False),
            ("1", "stagelens_no_such_nvml_module", True),
            ("", "tests.exporters.fake_nvml", True),
            ("", "stagelens_no_such_nvml_module", False),
        ],
    )
    def test_automatic_opt_in(
        self, monkeypatch: pytest.MonkeyPatch, env: str, module: str, expected: bool
    ) -> None:
        """gpu=None: STAGELENS_GPU_COLLECTOR decides, else whether the binding imports."""
        monkeypatch.setenv(nvml_mod.ENABLE_ENV, env)
        monkeypatch.setenv(NVML_MODULE_ENV, module)
        assert gpu_collector_enabled(None) is expected
        assert gpu_collector_enabled(True) is True
        assert gpu_collector_enabled(False) is False
