"""The vLLM plugin's Prometheus families are what docs/telemetry.md documents.

The plugin records real-shaped stats (scheduler and one finished request) into a fresh
registry; every exposed family is held against ``semconv_spec``: documented name, type and
label names, and every metric documented as the plugin's is exposed.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry

from stagelens import semconv
from stagelens import semconv_spec as spec


class TestPluginEmitsWhatIsDocumented:
    """The stat logger's families against the spec."""

    def test_prometheus_families(self) -> None:
        """Each family: documented name, type and labels; all plugin metrics exposed."""
        pytest.importorskip("vllm", reason="vLLM is not installed")
        from stagelens.exporters.vllm import StageLensStatLogger

        registry = CollectorRegistry()
        config = SimpleNamespace(model_config=SimpleNamespace(served_model_name="tiny"))
        logger = StageLensStatLogger(config, 0, registry=registry)
        scheduler = SimpleNamespace(
            num_running_reqs=2,
            num_waiting_reqs=1,
            kv_cache_usage=0.25,
            prefix_cache_stats=SimpleNamespace(queries=512, hits=384),
        )
        finished = SimpleNamespace(
            request_id="chatcmpl-1",
            queued_time=0.01,
            prefill_time=0.02,
            decode_time=0.3,
            e2e_latency=0.33,
            num_prompt_tokens=600,
            num_generation_tokens=16,
            num_cached_tokens=512,
        )
        logger.record(
            scheduler, SimpleNamespace(num_preempted_reqs=1, finished_requests=[finished])
        )
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
