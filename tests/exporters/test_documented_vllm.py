"""The vLLM plugin's Prometheus families are what docs/telemetry.md documents.

The plugin records stats shaped like vLLM's (scheduler stats and one finished request, the
same as tests/exporters/test_vllm_plugin.py uses) into a fresh registry; every exposed
family is held against ``semconv_spec``: documented name, type and label names, and every
metric documented as the plugin's is exposed.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry

from stagelens import semconv
from stagelens import semconv_spec as spec
from tests.exporters.test_vllm_plugin import _config, _finished, _scheduler


class TestPluginEmitsWhatIsDocumented:
    """The stat logger's families against the spec."""

    def test_prometheus_families(self) -> None:
        """Each family: documented name, type and labels; all plugin metrics exposed."""
        pytest.importorskip("vllm", reason="vLLM is not installed")
        from stagelens.exporters.vllm_stat_logger import StageLensStatLogger

        registry = CollectorRegistry()
        logger = StageLensStatLogger(_config(), 0, registry=registry)
        iteration = SimpleNamespace(num_preempted_reqs=1, finished_requests=[_finished()])
        logger.record(_scheduler(), iteration)
        documented = {m.name: m for m in spec.METRICS if spec.VLLM_PLUGIN in m.emitted_by}
        exposed = set()
        for family in registry.collect():
            if not family.samples:
                continue
            name = family.name + ("_total" if family.type == "counter" else "")
            m = documented[name]
            labels = {k for s in family.samples for k in s.labels if k != "le"}
            assert (family.type, labels) == (m.kind, set(m.labels)), name
            exposed.add(name)
        assert exposed == set(documented) - {semconv.TELEMETRY_ERRORS}  # no failure here
