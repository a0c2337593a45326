"""Every Prometheus instrument stagelens records from the gateway, created once per
registry, and the batched fold that records finished requests into them.

Why one object: instruments are created at instrument time (never on a request), label
children are pre-bound and cached (``stagelens._series``), so the hot path is a dict lookup
plus ``observe``/``inc``. One ``Instruments`` per registry also avoids duplicate-registration
errors when several apps (or tests) share a process.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import weakref
from collections import Counter as Tally
from collections import defaultdict, deque
from collections.abc import Callable, Iterator
from itertools import chain
from operator import attrgetter
from typing import Any, Final, NamedTuple, NewType, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics_core import Metric

from stagelens import _compat
from stagelens import semconv as sc
from stagelens._series import (
    BillingSeries,
    Candidates,
    ChildCache,
    ExemplarRef,
    FastCounter,
    FastHistogram,
    ModelSeries,
)
from stagelens.buckets import (
    ENGINE_PHASE_BUCKETS,
    INTER_TOKEN_LATENCY_BUCKETS,
    REQUEST_DURATION_BUCKETS,
    STAGE_DURATION_BUCKETS,
    ttft_buckets,
)
from stagelens.config import Settings
from stagelens.errors import ConfigurationError
from stagelens.genai_call import GenAICall

__all__ = [
    "FOLD_EVERY",
    "BillingRecord",
    "BillingSeries",
    "ExemplarRef",
    "FastCounter",
    "FastHistogram",
    "Instruments",
    "ModelSeries",
    "PhaseTimes",
    "RequestRecord",
    "RequestSink",
    "StageTimes",
    "Verdicts",
    "instruments_for",
]

StageTimes = NewType("StageTimes", list[tuple[str, float]])
"""(stage, seconds) of one request's stages, in the order they ended.

A type of its own (not a plain list) so that stage and engine-phase timings, which have the
same shape, cannot be passed for one another: mypy rejects a swap."""

PhaseTimes = NewType("PhaseTimes", list[tuple[str, float]])
"""(engine phase, seconds) the engine reported for one request (queue, prefill, decode)."""


class BillingRecord(NamedTuple):
    """What ``bill()`` counted for one request, recorded with its other figures."""

    tenant: str
    """The tenant label value (bounded, never a key)."""
    input_tokens: int
    output_tokens: int
    cached_input_tokens: int
    """Part of ``input_tokens``."""
    cost_usd: float


Verdicts = tuple[tuple[str, bool], ...]
"""(sli, bad) for each SLI that counted one request."""


class RequestRecord(NamedTuple):
    """Everything the gateway series learn from one finished request, queued as one record.

    A NamedTuple: built by keyword at the one place that submits (the middleware), unpacked
    at C speed by the fold."""

    model: str
    """The bounded ``model`` label value."""
    code: str
    """The ``code`` label value."""
    duration: float
    """Gateway receipt to last byte sent, seconds."""
    ttft: float | None
    """Time to first token, seconds; answers only."""
    gaps: list[float]
    """Inter-token gaps, seconds."""
    stages: StageTimes
    phases: PhaseTimes | None
    rejected_by: str | None
    """The stage that answered the request with an error."""
    billing: BillingRecord | None
    upstream_ttft: float | None = None
    """Upstream request sent to its first output-bearing event received, seconds."""
    verdicts: Verdicts = ()
    """(sli, bad) for each SLI that counted the request (issue 15)."""
    unmetered: str | None = None
    """The ``billing`` label value when the server's usage was missing, else None."""
    genai: GenAICall | None = None
    """The upstream GenAI call, recorded only while a sink wants it (``add_sink``)."""
    exemplar: ExemplarRef | None = None
    """The request's trace when it was sampled: its TTFT, duration and stage times may
    become exemplars. None for a sampled-out request, which never names a trace."""


RequestSink = Callable[[list[RequestRecord]], None]
"""Called with each folded batch of finished requests (``Instruments.add_sink``)."""

_Observed = defaultdict[FastHistogram, list[float]]
"""Values to observe, per bound histogram."""
_Added = defaultdict[FastCounter, float]
"""Amounts to add, per bound counter."""
_Exemplars = defaultdict[FastHistogram, Candidates]
"""Exemplar candidates, per bound histogram."""


_Item = TypeVar("_Item")
_Key = TypeVar("_Key")
_MODEL: Final = attrgetter("model")
_CODE: Final = attrgetter("code")
_TENANT: Final = attrgetter("tenant")


def _grouped(
    items: list[_Item], key: Callable[[_Item], _Key]
) -> Iterator[tuple[_Key, list[_Item]]]:
    """``items`` by their ``key``: each value with its items, in their order. A batch is
    nearly always one model, one status code and one tenant: then the list itself, with
    no copy and one pass to find the values."""
    values = set(map(key, items))
    if len(values) == 1:
        yield values.pop(), items
        return
    for value in values:
        yield value, [item for item in items if key(item) == value]


def _check(observed: _Observed) -> None:
    """Raise TypeError when a value to observe is not a number (a counter's amount already
    failed to add up while collected), before anything is written: found later, by a
    histogram's bisect, it would leave the batch half written. ``sum`` runs in C, a few ns
    per value (``math.fsum``, which also refuses complex numbers, costs ten times more; a
    complex timing is left to the writes, which lose that one series' share)."""
    for values in observed.values():
        sum(values, 0.0)


FOLD_EVERY: Final = 32
"""Queued request records are applied to the series once this many are waiting (and
before every collection): see ``Instruments.submit``."""

logger = logging.getLogger("stagelens")


class Instruments:
    """The gateway-side metrics (``stagelens_*`` in ``semconv``), bound to one registry."""

    def __init__(self, registry: CollectorRegistry, settings: Settings) -> None:
        self.registry = registry
        self.ttft_threshold = settings.ttft_slo_threshold_seconds
        self._pending: deque[RequestRecord] = deque()
        self._fold_lock = threading.Lock()
        # In multiprocess mode the scrape reads every worker's files, which a fold in this
        # process cannot precede: each record is applied at once there.
        self._fold_every = FOLD_EVERY if _compat.in_process_values() else 1
        self._fold_failed = False
        # prometheus-client's multiprocess files hold no exemplars: none are gathered there.
        self._keep_exemplars = _compat.in_process_values()
        r = registry
        # Registered before the series, so that a collection folds, then reads them.
        r.register(_FoldBeforeCollect(self))
        self.stage_duration = ChildCache(
            Histogram(
                sc.STAGE_DURATION,
                "Time spent in each request stage.",
                [sc.LABEL_STAGE, sc.LABEL_MODEL],
                buckets=STAGE_DURATION_BUCKETS,
                registry=r,
            )
        )
        self.request_duration = ChildCache(
            Histogram(
                sc.REQUEST_DURATION,
                "Gateway receipt to last byte sent.",
                [sc.LABEL_MODEL, sc.LABEL_CODE],
                buckets=REQUEST_DURATION_BUCKETS,
                registry=r,
            )
        )
        self.ttft = ChildCache(
            Histogram(
                sc.TIME_TO_FIRST_TOKEN,
                "Gateway receipt to the first body carrying generated output sent to the client.",
                [sc.LABEL_MODEL],
                buckets=ttft_buckets(settings.ttft_slo_threshold_seconds),
                registry=r,
            )
        )
        self.itl = ChildCache(
            Histogram(
                sc.INTER_TOKEN_LATENCY,
                "Gap between consecutive output-bearing streamed events of one choice.",
                [sc.LABEL_MODEL],
                buckets=INTER_TOKEN_LATENCY_BUCKETS,
                registry=r,
            )
        )
        self.engine_phase = ChildCache(
            Histogram(
                sc.ENGINE_PHASE_DURATION,
                "The engine's own per-request timings (queue, prefill, decode).",
                [sc.LABEL_PHASE, sc.LABEL_MODEL],
                buckets=ENGINE_PHASE_BUCKETS,
                registry=r,
            )
        )
        self.requests = ChildCache(
            Counter(
                sc.REQUESTS,
                "Finished requests, any outcome.",
                [sc.LABEL_MODEL, sc.LABEL_CODE],
                registry=r,
            )
        )
        self.tokens = ChildCache(
            Counter(
                sc.TOKENS,
                "Tokens billed; cached_input is part of input.",
                [sc.LABEL_MODEL, sc.LABEL_TENANT, sc.LABEL_TYPE],
                registry=r,
            )
        )
        self.cost = ChildCache(
            Counter(
                sc.COST_USD,
                "Cost from the price table.",
                [sc.LABEL_MODEL, sc.LABEL_TENANT],
                registry=r,
            )
        )
        self.rejections = ChildCache(
            Counter(
                sc.REJECTIONS,
                "Requests answered with an error by the stage that rejected them.",
                [sc.LABEL_STAGE, sc.LABEL_MODEL, sc.LABEL_CODE],
                registry=r,
            )
        )
        self.telemetry_errors = ChildCache(
            Counter(
                sc.TELEMETRY_ERRORS,
                "Telemetry failures swallowed so that serving goes on.",
                [sc.LABEL_COMPONENT],
                registry=r,
            )
        )
        self.sli_requests = ChildCache(
            Counter(
                sc.SLI_REQUESTS,
                "Requests an SLI counts.",
                [sc.LABEL_MODEL, sc.LABEL_SLI],
                registry=r,
            )
        )
        self.sli_errors = ChildCache(
            Counter(
                sc.SLI_ERRORS,
                "Requests that were bad for an SLI.",
                [sc.LABEL_MODEL, sc.LABEL_SLI],
                registry=r,
            )
        )
        self.upstream_ttft = ChildCache(
            Histogram(
                sc.UPSTREAM_TTFT,
                "Upstream request sent to its first output-bearing event received.",
                [sc.LABEL_MODEL],
                buckets=ttft_buckets(settings.ttft_slo_threshold_seconds),
                registry=r,
            )
        )
        self.unmetered = ChildCache(
            Counter(
                sc.UNMETERED_REQUESTS,
                "Requests whose tokens the server's usage did not give.",
                [sc.LABEL_MODEL, sc.LABEL_BILLING],
                registry=r,
            )
        )
        self.spans_dropped = ChildCache(
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
        if _compat.in_process_values():  # multiprocess scrapes read files, not this process
            r.register(_Extremes(self))
        self._billing: dict[tuple[str, str], BillingSeries] = {}
        self._bind_lock = threading.Lock()
        self.sinks: list[RequestSink] = []
        """Consumers of every folded batch beyond the Prometheus series (the GenAI OTel
        metrics); empty unless one is installed, and the request path builds a record's
        ``genai`` only when it is not."""

    def add_sink(self, sink: RequestSink) -> None:
        """Hand every folded batch to ``sink`` too, after the series are written (off the
        request path, as they are). A sink that raises is counted and logged like a bad
        record; the batch is written to the series all the same."""
        self.sinks.append(sink)

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
        """Apply every queued record to the series; never raises.

        A bad record costs only itself. The batch is first collected whole (the common
        case, and the fast one); when that fails, or a value in it is not a number, it is
        collected again record by record, each into series of its own that join the batch
        only when complete: a record is applied whole or not at all. Each bad record is
        counted in ``stagelens_telemetry_errors_total{component="metrics"}`` and logged
        once. The writes then touch only checked numbers; should prometheus-client itself
        fail writing one series (a full disk in multiprocess mode), that series' share of
        the batch is lost and counted, and every other series is still written.
        """
        pending = self._pending
        if not pending:
            return
        with self._fold_lock:
            batch = [pending.popleft() for _ in range(len(pending))]
            failed: list[Exception] = []
            try:
                observed, added, kept = self._collect(batch)
                _check(observed)
            except Exception:
                observed, added, kept = self._collect_each(batch, failed)
            # Each series written on its own: one failing write loses only its series.
            writes: list[tuple[Callable[..., None], tuple[Any, ...]]] = [
                (histogram.observe_many, (values, kept.get(histogram)))
                for histogram, values in observed.items()
            ]
            writes += [(counter.inc, (amount,)) for counter, amount in added.items()]
            for write, arguments in writes:
                try:
                    write(*arguments)
                except Exception as exc:
                    failed.append(exc)
            for sink in self.sinks:
                try:
                    sink(batch)
                except Exception as exc:
                    failed.append(exc)
            if failed:
                self._failed(len(failed), failed[0])

    def _collect(self, batch: list[RequestRecord]) -> tuple[_Observed, _Added, _Exemplars]:
        """The observations and increments of ``batch``, per bound series, and the exemplar
        candidates of its sampled requests (their TTFT, request duration and stage times,
        in the order the requests ended; none in multiprocess mode, whose files keep none).

        Gathered per model, field by field: a batch is nearly always one model (and one
        status code, one tenant), so each field's values are one comprehension over the
        records and each series is looked up once per batch, not once per request (a
        lookup is a method call, a value a few bytecodes)."""
        observed: _Observed = defaultdict(list)
        added: _Added = defaultdict(float)
        kept: _Exemplars = defaultdict(list)
        for model, records in _grouped(batch, _MODEL):
            self._collect_model(model, records, observed, added, kept)
        return observed, added, kept

    def _collect_model(
        self,
        model: str,
        records: list[RequestRecord],
        observed: _Observed,
        added: _Added,
        kept: _Exemplars,
    ) -> None:
        """``_collect`` for the records of one ``model``."""
        series = self.for_model(model)
        for code, mine in _grouped(records, _CODE):
            request_duration, requests = series.outcome(code)
            observed[request_duration] += [r.duration for r in mine]
            added[requests] += len(mine)
        ttfts = [r.ttft for r in records if r.ttft is not None]
        if ttfts:
            observed[series.ttft()] += ttfts
        gaps = list(chain.from_iterable([r.gaps for r in records]))
        if gaps:
            observed[series.itl()] += gaps
        upstream_ttfts = [r.upstream_ttft for r in records if r.upstream_ttft is not None]
        if upstream_ttfts:
            observed[series.upstream_ttft()] += upstream_ttfts
        # What a record holds several of, or rarely: one pass, gathered by label value.
        stages: defaultdict[str, list[float]] = defaultdict(list)
        phases: defaultdict[str, list[float]] = defaultdict(list)
        stage_candidates: defaultdict[str, Candidates] = defaultdict(list)
        keep = self._keep_exemplars
        for record in records:
            for name, seconds in record.stages:
                stages[name].append(seconds)
            if record.phases:
                for name, seconds in record.phases:
                    phases[name].append(seconds)
            if record.rejected_by is not None:
                added[series.rejection(record.rejected_by, record.code)] += 1
            if record.unmetered is not None:
                added[series.unmetered(record.unmetered)] += 1
            ref = record.exemplar
            if ref is not None and keep:  # sampled: its TTFT, duration, stages may be kept
                kept[series.outcome(record.code)[0]].append((record.duration, ref))
                if record.ttft is not None:
                    kept[series.ttft()].append((record.ttft, ref))
                for name, seconds in record.stages:
                    stage_candidates[name].append((seconds, ref))
        for name, values in stages.items():
            observed[series.stage(name)] += values
        for name, candidates in stage_candidates.items():
            kept[series.stage(name)] += candidates
        for name, values in phases.items():
            observed[series.phase(name)] += values
        # Counted per distinct set of verdicts: most requests of a model share one.
        for verdicts, counted in Tally([r.verdicts for r in records]).items():
            for sli, bad in verdicts:
                requests_counted, errors = series.sli(sli)
                added[requests_counted] += counted
                # Bound as soon as the SLI counts the model: a ratio reads 0, not NaN.
                added[errors] += counted if bad else 0
        bills = [r.billing for r in records if r.billing is not None]
        for tenant, theirs in _grouped(bills, _TENANT):
            billing = self.billing(model, tenant)
            added[billing.input] += sum([b.input_tokens for b in theirs])
            added[billing.output] += sum([b.output_tokens for b in theirs])
            added[billing.cached_input] += sum([b.cached_input_tokens for b in theirs])
            added[billing.cost] += sum([b.cost_usd for b in theirs])

    def _collect_each(
        self, batch: list[RequestRecord], failed: list[Exception]
    ) -> tuple[_Observed, _Added, _Exemplars]:
        """``_collect`` record by record, leaving out (and listing in ``failed``) each
        record whose collection fails or holds a value that is not a number: a record left
        out names no trace either."""
        observed: _Observed = defaultdict(list)
        added: _Added = defaultdict(float)
        kept: _Exemplars = defaultdict(list)
        for record in batch:
            try:
                mine, counts, candidates = self._collect([record])
                _check(mine)
            except Exception as exc:
                failed.append(exc)
                continue
            for histogram, values in mine.items():
                observed[histogram] += values
            for counter, amount in counts.items():
                added[counter] += amount
            for histogram, pairs in candidates.items():
                kept[histogram] += pairs
        return observed, added, kept

    def _failed(self, failures: int, exc: Exception) -> None:
        """Count ``failures`` and log the first ever, by its type only: a message may quote a
        record's values (a model or tenant name a client sent), and logs carry no client
        input (``stagelens._failures`` holds the same rule)."""
        with contextlib.suppress(Exception):  # the counter itself broken: still never raise
            self.telemetry_errors.get(sc.COMPONENT_METRICS).inc(failures)
        if not self._fold_failed:
            self._fold_failed = True
            logger.warning(
                "stagelens: recording request metrics failed (%s); further failures "
                "are only counted in %s{component=%r}",
                type(exc).__name__,
                sc.TELEMETRY_ERRORS,
                sc.COMPONENT_METRICS,
            )


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


class _Extremes:
    """Scrape-time gauges: each gateway histogram series' smallest and largest value
    (``stagelens_histogram_min_seconds`` / ``_max_seconds``), read from the bound series;
    registered after ``_FoldBeforeCollect``, so a scrape sees the records it folded."""

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
