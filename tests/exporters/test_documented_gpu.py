"""The GPU collector and its OTel instruments emit what docs/telemetry.md documents.

Read from the real collector and the OTel SDK over the NVML fake (every reading present,
cost configured), then held against ``semconv_spec``: every exposed family and instrument
is documented with the same kind, unit and label or attribute keys, and every documented
GPU name is exposed.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import Gauge, Histogram, InMemoryMetricReader, Sum
from prometheus_client import CollectorRegistry
from stagelens.exporters.gpu_otel import register_gpu_meters
from stagelens.exporters.nvml import NvmlCollector
from stagelens.exporters.nvml_sampler import GpuReader

from stagelens import semconv
from stagelens import semconv_spec as spec
from tests.exporters import fake_nvml
from tests.exporters.fake_nvml import FakeGpu


@pytest.fixture
def reader() -> Iterator[GpuReader]:
    """A reader over one fake H100 with two GPM samples taken (SM activity present)."""
    fake_nvml.configure([FakeGpu(uuid="GPU-a")])
    gpu_reader = GpuReader(fake_nvml, interval_s=3600)
    assert gpu_reader.sampler is not None
    gpu_reader.sampler.sample_once()
    yield gpu_reader
    gpu_reader.close()


def _otel_kind(data: Any) -> str:
    if isinstance(data, Sum):
        return "counter" if data.is_monotonic else "up-down counter"
    if isinstance(data, Histogram):
        return "histogram"
    assert isinstance(data, Gauge)
    return "gauge"


class TestGpuEmitsWhatIsDocumented:
    """Prometheus families and OTel instruments of the GPU collector against the spec."""

    def test_prometheus_families(self, reader: GpuReader) -> None:
        """Each family: documented name, type and label names; every GPU metric exposed."""
        registry = CollectorRegistry()
        registry.register(NvmlCollector(reader=reader, cost_usd_per_hour=2.5))
        documented = {m.name: m for m in spec.METRICS if spec.GPU_COLLECTOR in m.emitted_by}
        exposed = set()
        for family in registry.collect():
            name = family.name + ("_total" if family.type == "counter" else "")
            m = documented[name]
            labels = {k for s in family.samples for k in s.labels}
            assert (family.type, labels) == (m.kind, set(m.labels)), name
            exposed.add(name)
        assert exposed == set(documented)

    def test_otel_instruments(self, reader: GpuReader) -> None:
        """Each instrument: documented name, kind, unit and attribute keys; all exposed."""
        metric_reader = InMemoryMetricReader()
        provider = MeterProvider(metric_readers=[metric_reader])
        register_gpu_meters(provider, reader, cost_usd_per_hour=2.5)
        data = metric_reader.get_metrics_data()
        provider.shutdown()
        assert data is not None
        documented = {o.name: o for o in spec.OTEL_METRICS if o.emitted_by == spec.GPU_COLLECTOR}
        exposed = set()
        for rm in data.resource_metrics:
            for sm in rm.scope_metrics:
                if sm.scope.name != semconv.INSTRUMENTATION_NAME:
                    continue
                for metric in sm.metrics:
                    o = documented[metric.name]
                    keys = {k for p in metric.data.data_points for k in (p.attributes or {})}
                    got = (_otel_kind(metric.data), metric.unit, keys)
                    assert got == (o.kind, o.unit, set(o.attributes)), metric.name
                    exposed.add(metric.name)
        assert exposed == set(documented)
