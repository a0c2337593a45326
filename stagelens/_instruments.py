"""Every Prometheus instrument stagelens records from the gateway, created once per registry.

Why one object: instruments are created at instrument time (never on a request), label
children are pre-bound and cached, so the hot path is a dict lookup plus ``observe``/``inc``.
One ``Instruments`` per registry also avoids duplicate-registration errors when several apps
(or tests) share a process.
"""

from __future__ import annotations

import logging
import threading
import weakref
from bisect import bisect_left
from collections import Counter as Tally
from collections import defaultdict, deque
from collections.abc import Iterator
from functools import partial
from math import isnan
from typing import Any, Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client import values as _values
from prometheus_client.metrics_core import Metric

from stagelens import semconv as sc
from stagelens.buckets import (
    ENGINE_PHASE_BUCKETS,
    INTER_TOKEN_LATENCY_BUCKETS,
    REQUEST_DURATION_BUCKETS,
    STAGE_DURATION_BUCKETS,
    ttft_buckets,
)
from stagelens.config import Settings
from stagelens.errors import ConfigurationError

_Child = Any  # prometheus_client label children are untyped in its public API

BillingRecord = tuple[str, int, int, int, float]
"""(tenant label, input, output and cached-input tokens, cost in USD) of one request."""
OutcomeRecord = tuple[
    float | None,  # upstream time to first token, seconds
    tuple[tuple[str, bool], ...],  # (sli, bad) for each SLI that counted the request
    str | None,  # billing label value when the server's usage was missing
]
"""What issue 15 added to a request's record: its SLI verdicts, the upstream's share of its
time to first token, and how it was metered when the server's usage was missing."""

RequestRecord = tuple[
    str,  # model label
    str,  # code label
    float,  # request duration, seconds
    float | None,  # time to first token, seconds (answers only)
    list[float],  # inter-token gaps, seconds
    list[tuple[str, float]],  # (stage, seconds)
    list[tuple[str, float]] | None,  # (engine phase, seconds)
    str | None,  # the stage that rejected the request
    BillingRecord | None,
    OutcomeRecord | None,  # SLI verdicts, upstream TTFT, billing gap (issue 15)
]
"""Everything the gateway series learn from one finished request, queued as one tuple."""

FOLD_EVERY: Final = 32
"""Queued request records are applied to the series once this many are waiting (and
before every collection): see ``Instruments.submit``."""

logger = logging.getLogger("stagelens")


class _ChildCache:
    """Caches ``metric.labels(*key)`` children; the miss path takes a lock once per key."""

    __slots__ = ("_children", "_lock", "_metric")

    def __init__(self, metric: Histogram | Counter | Gauge) -> None:
        self._metric = metric
        self._children: dict[tuple[str, ...], _Child] = {}
        self._lock = threading.Lock()

    def get(self, *labels: str) -> _Child:
        child = self._children.get(labels)
        if child is None:
            with self._lock:
                child = self._children.get(labels)
                if child is None:
                    child = self._metric.labels(*labels)
                    self._children[labels] = child
        return child


class Instruments:
    """The gateway-side metrics (``stagelens_*`` in ``semconv``), bound to one registry."""

    def __init__(self, registry: CollectorRegistry, settings: Settings) -> None:
        self.registry = registry
        self.ttft_threshold = settings.ttft_slo_threshold_seconds
        self._pending: deque[RequestRecord] = deque()
        self._fold_lock = threading.Lock()
        # In multiprocess mode the scrape reads every worker's files, which a fold in this
        # process cannot precede: each record is applied at once there.
        self._fold_every = FOLD_EVERY if _values.ValueClass is _values.MutexValue else 1
        self._fold_failed = False
        r = registry
        # Registered before the series, so that a collection folds, then reads them.
        r.register(_FoldBeforeCollect(self))
        self.stage_duration = _ChildCache(
            Histogram(
                sc.STAGE_DURATION,
                "Time spent in each request stage.",
                [sc.LABEL_STAGE, sc.LABEL_MODEL],
                buckets=STAGE_DURATION_BUCKETS,
                registry=r,
            )
        )
        self.request_duration = _ChildCache(
            Histogram(
                sc.REQUEST_DURATION,
                "Gateway receipt to last byte sent.",
                [sc.LABEL_MODEL, sc.LABEL_CODE],
                buckets=REQUEST_DURATION_BUCKETS,
                registry=r,
            )
        )
        self.ttft = _ChildCache(
            Histogram(
                sc.TIME_TO_FIRST_TOKEN,
                "Gateway receipt to first content token sent to the client.",
                [sc.LABEL_MODEL],
                buckets=ttft_buckets(settings.ttft_slo_threshold_seconds),
                registry=r,
            )
        )
        self.itl = _ChildCache(
            Histogram(
                sc.INTER_TOKEN_LATENCY,
                "Gap between consecutive streamed tokens.",
                [sc.LABEL_MODEL],
                buckets=INTER_TOKEN_LATENCY_BUCKETS,
                registry=r,
            )
        )
        self.engine_phase = _ChildCache(
            Histogram(
                sc.ENGINE_PHASE_DURATION,
                "The engine's own per-request timings (queue, prefill, decode).",
                [sc.LABEL_PHASE, sc.LABEL_MODEL],
                buckets=ENGINE_PHASE_BUCKETS,
                registry=r,
            )
        )
        self.requests = _ChildCache(
            Counter(
                sc.REQUESTS,
                "Finished requests, any outcome.",
                [sc.LABEL_MODEL, sc.LABEL_CODE],
                registry=r,
            )
        )
        self.tokens = _ChildCache(
            Counter(
                sc.TOKENS,
                "Tokens billed; cached_input is part of input.",
                [sc.LABEL_MODEL, sc.LABEL_TENANT, sc.LABEL_TYPE],
                registry=r,
            )
        )
        self.cost = _ChildCache(
            Counter(
                sc.COST_USD,
                "Cost from the price table.",
                [sc.LABEL_MODEL, sc.LABEL_TENANT],
                registry=r,
            )
        )
        self.rejections = _ChildCache(
            Counter(
                sc.REJECTIONS,
                "Requests answered with an error by the stage that rejected them.",
                [sc.LABEL_STAGE, sc.LABEL_MODEL, sc.LABEL_CODE],
                registry=r,
            )
        )
        self.telemetry_errors = _ChildCache(
            Counter(
                sc.TELEMETRY_ERRORS,
                "Telemetry failures swallowed so that serving goes on.",
                [sc.LABEL_COMPONENT],
                registry=r,
            )
        )
        self.sli_requests = _ChildCache(
            Counter(
                sc.SLI_REQUESTS,
                "Requests an SLI counts.",
                [sc.LABEL_MODEL, sc.LABEL_SLI],
                registry=r,
            )
        )
        self.sli_errors = _ChildCache(
            Counter(
                sc.SLI_ERRORS,
                "Requests that were bad for an SLI.",
                [sc.LABEL_MODEL, sc.LABEL_SLI],
                registry=r,
            )
        )
        self.upstream_ttft = _ChildCache(
            Histogram(
                sc.UPSTREAM_TTFT,
                "Upstream request sent to its first output-bearing event received.",
                [sc.LABEL_MODEL],
                buckets=ttft_buckets(settings.ttft_slo_threshold_seconds),
                registry=r,
            )
        )
        self.unmetered = _ChildCache(
            Counter(
                sc.UNMETERED_REQUESTS,
                "Requests whose tokens the server's usage did not give.",
                [sc.LABEL_MODEL, sc.LABEL_BILLING],
                registry=r,
            )
        )
        self._outcome_series: dict[tuple[str, str], Any] = {}
        self.spans_dropped = _ChildCache(
            Counter(
                sc.SPANS_DROPPED,
                "Spans that could not be exported.",
                [sc.LABEL_REASON],
                registry=r,
            )
        )
        budget = Gauge(
            sc.BUDGET_USD,
            "Configured spend budget.",
            [sc.LABEL_TENANT, sc.LABEL_WINDOW],
            registry=r,
            multiprocess_mode="max",
        )
        for tenant, usd in settings.daily_budgets_usd.items():
            budget.labels(tenant, sc.BUDGET_WINDOW_DAY).set(usd)
        stage_budget = Gauge(
            sc.STAGE_BUDGET,
            "Configured latency budget per stage.",
            [sc.LABEL_STAGE],
            registry=r,
            multiprocess_mode="max",
        )
        for stage, seconds in settings.stage_budgets_seconds.items():
            stage_budget.labels(stage).set(seconds)
        self._models: dict[str, ModelSeries] = {}
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

    def submit(self, record: RequestRecord) -> None:
        """Queue one finished request's figures (O(1)); fold when ``FOLD_EVERY`` wait.

        Why not record at once: a streamed request ends with ~15 observations and ~6
        increments, each a locked update through prometheus-client. Folded together,
        observations of the same series become one bucket count in C and one locked
        increment per touched bucket, for all the requests of the batch. Every collection
        folds first (``_FoldBeforeCollect``), so a scrape never misses a finished request.
        """
        pending = self._pending
        pending.append(record)
        if len(pending) >= self._fold_every:
            self.fold()

    def fold(self) -> None:
        """Apply every queued record to the series; never raises (a failure is logged
        once and counted in ``stagelens_telemetry_errors_total{component="metrics"}``)."""
        pending = self._pending
        if not pending:
            return
        with self._fold_lock:
            try:
                self._fold(pending)
            except Exception as exc:
                self.telemetry_errors.get("metrics").inc()
                if not self._fold_failed:
                    self._fold_failed = True
                    logger.warning("stagelens: recording request metrics failed: %r", exc)

    def _fold(self, pending: deque[RequestRecord]) -> None:
        observed: defaultdict[FastHistogram, list[float]] = defaultdict(list)
        added: defaultdict[FastCounter, float] = defaultdict(float)
        for_model = self.for_model
        for _ in range(len(pending)):
            model, code, duration, ttft, gaps, stages, phases, rejected_by, billed, outcome = (
                pending.popleft()
            )
            series = for_model(model)
            # Bound series are read straight from the ModelSeries (a method call binds the
            # first one): this loop runs once per request.
            request_duration, requests = series._outcomes.get(code) or series.outcome(code)
            observed[request_duration].append(duration)
            added[requests] += 1
            if ttft is not None:
                observed[series._ttft or series.ttft()].append(ttft)
            if gaps:
                observed[series._itl or series.itl()] += gaps
            bound = series._stages
            for stage, seconds in stages:
                observed[bound.get(stage) or series.stage(stage)].append(seconds)
            if phases:
                bound = series._phases
                for phase, seconds in phases:
                    observed[bound.get(phase) or series.phase(phase)].append(seconds)
            if rejected_by is not None:
                self.rejections.get(rejected_by, model, code).inc()
            if outcome is not None:
                self._fold_outcome(model, outcome, observed, added)
            if billed is not None:
                tenant, input_tokens, output_tokens, cached_tokens, cost = billed
                billing = self.billing(model, tenant)
                added[billing.input] += input_tokens
                added[billing.output] += output_tokens
                added[billing.cached_input] += cached_tokens
                added[billing.cost] += cost
        for histogram, values in observed.items():
            histogram.observe_many(values)
        for counter, amount in added.items():
            counter.inc(amount)

    def _fold_outcome(
        self,
        model: str,
        outcome: OutcomeRecord,
        observed: defaultdict[FastHistogram, list[float]],
        added: defaultdict[FastCounter, float],
    ) -> None:
        """Add one request's SLI verdicts, upstream TTFT and billing gap to the batch."""
        upstream_ttft, verdicts, billing = outcome
        series = self._outcome_series
        if upstream_ttft is not None:
            key = (model, "")
            histogram = series.get(key)
            if histogram is None:
                histogram = series[key] = FastHistogram(self.upstream_ttft.get(model))
            observed[histogram].append(upstream_ttft)
        for sli, bad in verdicts:
            key = (model, sli)
            counters = series.get(key)
            if counters is None:
                counters = series[key] = (
                    FastCounter(self.sli_requests.get(model, sli)),
                    FastCounter(self.sli_errors.get(model, sli)),
                )
            added[counters[0]] += 1
            # Bound as soon as the SLI counts the model, so that a ratio reads 0, not NaN.
            added[counters[1]] += bad
        if billing is not None:
            key = (model, "billing:" + billing)
            counter = series.get(key)
            if counter is None:
                counter = series[key] = FastCounter(self.unmetered.get(model, billing))
            added[counter] += 1

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


class _FoldBeforeCollect:
    """A collector with no metrics of its own: collecting it folds the queued records, and
    it is registered before the series it feeds."""

    def __init__(self, instruments: Instruments) -> None:
        self._instruments = weakref.ref(instruments)

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        instruments = self._instruments()
        if instruments is not None:
            instruments.fold()
        return iter(())


_BY_REGISTRY: weakref.WeakKeyDictionary[CollectorRegistry, Instruments] = (
    weakref.WeakKeyDictionary()
)
_LOCK = threading.Lock()


def instruments_for(registry: CollectorRegistry, settings: Settings) -> Instruments:
    """The registry's Instruments, created on first use.

    Raises ConfigurationError when a second caller asks for different TTFT buckets on the
    same registry (the histogram cannot change buckets once created).
    """
    with _LOCK:
        found = _BY_REGISTRY.get(registry)
        if found is None:
            found = Instruments(registry, settings)
            _BY_REGISTRY[registry] = found
        elif found.ttft_threshold != settings.ttft_slo_threshold_seconds:
            raise ConfigurationError(
                "this registry already has TTFT buckets for threshold "
                f"{found.ttft_threshold}s; use a separate registry for "
                f"{settings.ttft_slo_threshold_seconds}s"
            )
        return found


class FastHistogram:
    """One histogram child, observed through its bucket storage: a bisect and two locked
    increments instead of ``observe()``'s per-call checks and linear bucket scan.

    Why: a streamed request ends with about ten observations; through ``observe()`` they
    were a tenth of stagelens' request-path cost. The storage used (``_upper_bounds``,
    ``_buckets``, ``_sum``, stable since prometheus-client 0.4) works the same in
    multiprocess mode; when a future version changes it, ``observe()`` is used instead.
    Equivalence with ``observe()`` is tested.
    """

    __slots__ = ("_bounds", "_buckets", "_child", "_index", "_sum")

    def __init__(self, child: _Child) -> None:
        self._child = child
        bounds = getattr(child, "_upper_bounds", None)
        buckets = getattr(child, "_buckets", None)
        total = getattr(child, "_sum", None)
        usable = (
            isinstance(bounds, list)
            and isinstance(buckets, list)
            and len(bounds) == len(buckets)
            and bounds
            and bounds[-1] == float("inf")
            and callable(getattr(total, "inc", None))
        )
        self._bounds: list[float] | None = bounds if usable else None
        self._buckets: list[Any] = buckets if usable and isinstance(buckets, list) else []
        self._sum: Any = total
        self._index = partial(bisect_left, bounds if usable else [])

    def observe(self, value: float) -> None:
        """Record one value (NaN is ignored: it lands in no bucket)."""
        bounds = self._bounds
        if bounds is None:
            self._child.observe(value)
            return
        if value != value:  # NaN: observe() would add it to the sum only; keep series sane
            return
        self._buckets[bisect_left(bounds, value)].inc(1)
        self._sum.inc(value)

    def observe_many(self, values: list[float]) -> None:
        """Record ``values`` at once: one increment per touched bucket."""
        if not values:
            return
        bounds = self._bounds
        if bounds is None:
            for value in values:
                self._child.observe(value)
            return
        if any(map(isnan, values)):
            values = [value for value in values if not isnan(value)]
        # Bucket indexes counted in C (map + collections.Counter): values of one series
        # mostly touch a few buckets.
        touched = Tally(map(self._index, values))
        self._sum.inc(sum(values))
        buckets = self._buckets
        for index, n in touched.items():
            buckets[index].inc(n)


class FastCounter:
    """One counter child, incremented through its value: skips ``inc()``'s checks.
    Non-positive amounts are dropped (a counter never goes down; zero changes nothing)."""

    __slots__ = ("_child", "_value")

    def __init__(self, child: _Child) -> None:
        self._child = child
        value = getattr(child, "_value", None)
        self._value: Any = value if callable(getattr(value, "inc", None)) else None

    def inc(self, amount: float = 1) -> None:
        if amount > 0:
            if self._value is not None:
                self._value.inc(amount)
            else:
                self._child.inc(amount)


class ModelSeries:
    """Every gateway series of one ``model`` label value, bound on first use.

    Why: a fold records ~a dozen series per request, mostly of the same few models;
    binding them once per model turns each into an attribute or a small dict lookup, with
    no label tuple built and no lock taken.
    """

    __slots__ = ("_instruments", "_itl", "_outcomes", "_phases", "_stages", "_ttft", "model")

    def __init__(self, instruments: Instruments, model: str) -> None:
        self._instruments = instruments
        self.model = model
        # Series are bound when first recorded, never before: a model that only ever got
        # errors exposes no TTFT series.
        self._ttft: FastHistogram | None = None
        self._itl: FastHistogram | None = None
        self._stages: dict[str, FastHistogram] = {}
        self._phases: dict[str, FastHistogram] = {}
        self._outcomes: dict[str, tuple[FastHistogram, FastCounter]] = {}

    def ttft(self) -> FastHistogram:
        """``stagelens_time_to_first_token_seconds{model}``."""
        if self._ttft is None:
            self._ttft = FastHistogram(self._instruments.ttft.get(self.model))
        return self._ttft

    def itl(self) -> FastHistogram:
        """``stagelens_inter_token_latency_seconds{model}``."""
        if self._itl is None:
            self._itl = FastHistogram(self._instruments.itl.get(self.model))
        return self._itl

    def stage(self, stage: str) -> FastHistogram:
        """``stagelens_stage_duration_seconds{stage, model}``."""
        found = self._stages.get(stage)
        if found is None:
            found = FastHistogram(self._instruments.stage_duration.get(stage, self.model))
            self._stages[stage] = found  # a racing duplicate binds the same child: harmless
        return found

    def phase(self, phase: str) -> FastHistogram:
        """``stagelens_engine_phase_duration_seconds{phase, model}``."""
        found = self._phases.get(phase)
        if found is None:
            found = FastHistogram(self._instruments.engine_phase.get(phase, self.model))
            self._phases[phase] = found
        return found

    def outcome(self, code: str) -> tuple[FastHistogram, FastCounter]:
        """``stagelens_request_duration_seconds`` and ``stagelens_requests_total`` for one
        status code."""
        found = self._outcomes.get(code)
        if found is None:
            instruments = self._instruments
            found = (
                FastHistogram(instruments.request_duration.get(self.model, code)),
                FastCounter(instruments.requests.get(self.model, code)),
            )
            self._outcomes[code] = found
        return found


class BillingSeries:
    """The token and cost counters of one (model, tenant), bound once."""

    __slots__ = ("cached_input", "cost", "input", "output")

    def __init__(self, instruments: Instruments, model: str, tenant: str) -> None:
        tokens = instruments.tokens
        self.input = FastCounter(tokens.get(model, tenant, sc.TOKEN_TYPE_INPUT))
        self.output = FastCounter(tokens.get(model, tenant, sc.TOKEN_TYPE_OUTPUT))
        self.cached_input = FastCounter(tokens.get(model, tenant, sc.TOKEN_TYPE_CACHED_INPUT))
        self.cost = FastCounter(instruments.cost.get(model, tenant))
