"""Every Prometheus instrument stagelens records from the gateway, created once per
registry, with the label names of each metric's one declaration (``semconv_spec.METRICS``).

Why one object: instruments are created at instrument time (never on a request) and their
label children are bound and cached (``stagelens.metrics.series``), so writing is a dict lookup
plus an update. One ``Instruments`` per registry also avoids duplicate-registration errors
when several apps (or tests) share a process. What writes into them is the Prometheus sink
(``stagelens.metrics.prometheus``); the hooks write stage timings of their own.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics_core import Metric

from stagelens import _compat, semconv_spec
from stagelens import semconv as sc
from stagelens.config import Settings, answer_classes
from stagelens.metrics.buckets import (
    ENGINE_PHASE_BUCKETS,
    INTER_TOKEN_LATENCY_BUCKETS,
    REQUEST_DURATION_BUCKETS,
    STAGE_DURATION_BUCKETS,
    answer_buckets,
    ttft_buckets,
)
from stagelens.metrics.series import BillingSeries, ChildCache, ModelSeries
from stagelens.tail_sampling import ExemplarSlots

__all__ = ["Instruments"]

_LABELS: Final = {spec.name: spec.labels for spec in semconv_spec.METRICS}


def _labels(name: str) -> list[str]:
    """The label names of metric ``name``, as ``semconv_spec`` declares them (once)."""
    return list(_LABELS[name])


class Instruments:
    """The gateway-side metrics (``stagelens_*`` in ``semconv``), bound to one registry."""

    def __init__(self, registry: CollectorRegistry, settings: Settings) -> None:
        self.registry = registry
        self.ttft_threshold = settings.ttft_slo_threshold_seconds
        self.answer_thresholds = tuple(seconds for _, seconds in answer_classes(settings))
        """Each prompt-size class's answer SLO threshold: a bucket boundary each."""
        r = registry
        self.stage_duration = ChildCache(
            Histogram(
                sc.STAGE_DURATION,
                "Time spent in each request stage.",
                _labels(sc.STAGE_DURATION),
                buckets=STAGE_DURATION_BUCKETS,
                registry=r,
            )
        )
        self.request_duration = ChildCache(
            Histogram(
                sc.REQUEST_DURATION,
                "Gateway receipt to last byte sent.",
                _labels(sc.REQUEST_DURATION),
                buckets=REQUEST_DURATION_BUCKETS,
                registry=r,
            )
        )
        self.ttft = ChildCache(
            Histogram(
                sc.TIME_TO_FIRST_TOKEN,
                "Gateway receipt to the first body carrying generated output sent to the client.",
                _labels(sc.TIME_TO_FIRST_TOKEN),
                buckets=ttft_buckets(settings.ttft_slo_threshold_seconds),
                registry=r,
            )
        )
        self.non_streamed = ChildCache(
            Histogram(
                sc.NON_STREAMED_RESPONSE,
                "Gateway receipt to the first body byte of a non-streamed answer, sent once "
                "the whole answer arrived.",
                _labels(sc.NON_STREAMED_RESPONSE),
                buckets=REQUEST_DURATION_BUCKETS,
                registry=r,
            )
        )
        self.ttfat = ChildCache(
            Histogram(
                sc.TIME_TO_FIRST_ANSWER_TOKEN,
                "Gateway receipt to the first body sent after the first answer (not "
                "reasoning) output arrived.",
                _labels(sc.TIME_TO_FIRST_ANSWER_TOKEN),
                buckets=answer_buckets(
                    settings.ttft_slo_threshold_seconds, *self.answer_thresholds
                ),
                registry=r,
            )
        )
        self.itl = ChildCache(
            Histogram(
                sc.INTER_TOKEN_LATENCY,
                "Gap between consecutive output-bearing streamed events of one choice.",
                _labels(sc.INTER_TOKEN_LATENCY),
                buckets=INTER_TOKEN_LATENCY_BUCKETS,
                registry=r,
            )
        )
        self.engine_phase = ChildCache(
            Histogram(
                sc.ENGINE_PHASE_DURATION,
                "The engine's own per-request timings (queue, prefill, decode).",
                _labels(sc.ENGINE_PHASE_DURATION),
                buckets=ENGINE_PHASE_BUCKETS,
                registry=r,
            )
        )
        self.requests = ChildCache(
            Counter(
                sc.REQUESTS,
                "Finished requests, any outcome.",
                _labels(sc.REQUESTS),
                registry=r,
            )
        )
        self.tokens = ChildCache(
            Counter(
                sc.TOKENS,
                "Tokens billed; cached_input and cache_write are parts of input, reasoning "
                "of output.",
                _labels(sc.TOKENS),
                registry=r,
            )
        )
        self.cost = ChildCache(
            Counter(
                sc.COST_USD,
                "Cost from the price table.",
                _labels(sc.COST_USD),
                registry=r,
            )
        )
        self.engine_seconds = ChildCache(
            Counter(
                sc.ENGINE_SECONDS,
                "Engine seconds attributed to finished requests, as the engine reported them.",
                _labels(sc.ENGINE_SECONDS),
                registry=r,
            )
        )
        self.rejections = ChildCache(
            Counter(
                sc.REJECTIONS,
                "Requests answered with an error by the stage that rejected them.",
                _labels(sc.REJECTIONS),
                registry=r,
            )
        )
        self.telemetry_errors = ChildCache(
            Counter(
                sc.TELEMETRY_ERRORS,
                "Telemetry failures swallowed so that serving goes on.",
                _labels(sc.TELEMETRY_ERRORS),
                registry=r,
            )
        )
        self.sli_requests = ChildCache(
            Counter(
                sc.SLI_REQUESTS,
                "Requests an SLI counts.",
                _labels(sc.SLI_REQUESTS),
                registry=r,
            )
        )
        self.sli_errors = ChildCache(
            Counter(
                sc.SLI_ERRORS,
                "Requests that were bad for an SLI.",
                _labels(sc.SLI_ERRORS),
                registry=r,
            )
        )
        self.upstream_ttft = ChildCache(
            Histogram(
                sc.UPSTREAM_TTFT,
                "Upstream request sent to its first output-bearing event received.",
                _labels(sc.UPSTREAM_TTFT),
                buckets=ttft_buckets(settings.ttft_slo_threshold_seconds),
                registry=r,
            )
        )
        self.unmetered = ChildCache(
            Counter(
                sc.UNMETERED_REQUESTS,
                "Requests whose tokens the server's usage did not give.",
                _labels(sc.UNMETERED_REQUESTS),
                registry=r,
            )
        )
        self.trace_decisions = ChildCache(
            Counter(
                sc.TRACE_DECISIONS,
                "Requests whose trace the tail sampler kept or dropped, by reason.",
                _labels(sc.TRACE_DECISIONS),
                registry=r,
            )
        )
        self.exemplar_slots = (
            ExemplarSlots(REQUEST_DURATION_BUCKETS, settings.tail_exemplar_refresh_seconds)
            if _compat.in_process_values()
            else None
        )
        """The tail sampler's record of which duration buckets have a fresh kept trace
        (None in multiprocess mode, whose files keep no exemplars: none is chosen)."""
        self.spans_dropped = ChildCache(
            Counter(
                sc.SPANS_DROPPED,
                "Spans that could not be exported.",
                _labels(sc.SPANS_DROPPED),
                registry=r,
            )
        )
        budget = Gauge(
            sc.BUDGET_USD,
            "Configured spend budget.",
            _labels(sc.BUDGET_USD),
            registry=r,
            multiprocess_mode="max",
        )
        for tenant, usd in settings.daily_budgets_usd.items():
            budget.labels(tenant, sc.BUDGET_WINDOW_DAY).set(usd)
        stage_budget = Gauge(
            sc.STAGE_BUDGET,
            "Configured latency budget per stage.",
            _labels(sc.STAGE_BUDGET),
            registry=r,
            multiprocess_mode="max",
        )
        for stage, seconds in settings.stage_budgets_seconds.items():
            stage_budget.labels(stage).set(seconds)
        self._models: dict[str, ModelSeries] = {}
        if _compat.in_process_values():  # multiprocess scrapes read files, not this process
            r.register(_Extremes(self))
        self._billing: dict[tuple[str, str], BillingSeries] = {}
        self._bind_lock = threading.Lock()

    def for_model(self, model: str) -> ModelSeries:
        """The bound series of ``model`` (created once per label value)."""
        found = self._models.get(model)
        if found is None:
            with self._bind_lock:
                found = self._models.get(model)
                if found is None:
                    found = ModelSeries(self, model)
                    self._models[model] = found
        return found

    def billing(self, model: str, tenant: str) -> BillingSeries:
        """The bound token and cost counters of (``model``, ``tenant``)."""
        key = (model, tenant)
        found = self._billing.get(key)
        if found is None:
            with self._bind_lock:
                found = self._billing.get(key)
                if found is None:
                    found = BillingSeries(self, model, tenant)
                    self._billing[key] = found
        return found


class _Extremes:
    """Scrape-time gauges: each gateway histogram series' smallest and largest value
    (``stagelens_histogram_min_seconds`` / ``_max_seconds``), read from the bound series;
    registered after ``prometheus.FoldOnCollect``, so a scrape sees the records it
    folded."""

    def __init__(self, instruments: Instruments) -> None:
        self._instruments = weakref.ref(instruments)

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        instruments = self._instruments()
        if instruments is None:
            return
        low = Metric(sc.HISTOGRAM_MIN, "Smallest value a histogram series observed.", "gauge")
        high = Metric(sc.HISTOGRAM_MAX, "Largest value a histogram series observed.", "gauge")
        for series in list(instruments._models.values()):
            for name, labels, histogram in series.histograms():
                if histogram.lowest <= histogram.highest:  # observed at least one value
                    named = {sc.LABEL_HISTOGRAM: name, **labels}
                    low.add_sample(sc.HISTOGRAM_MIN, named, histogram.lowest)
                    high.add_sample(sc.HISTOGRAM_MAX, named, histogram.highest)
        if low.samples:
            yield low
            yield high
