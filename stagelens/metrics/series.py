"""Bound series: the label children a fold writes to, bound once and written cheaply.

Why apart from ``_instruments``: creating the instruments is declarative and runs once;
what is here runs on every fold. ``ModelSeries`` and ``BillingSeries`` bind the children of
one label value once (no label tuple built, no lock taken afterwards); ``FastHistogram``
and ``FastCounter`` write them through prometheus-client's value storage (see
``stagelens._compat``), falling back to its public ``observe``/``inc`` when that storage is
not what was tested. ``FastHistogram`` also keeps exemplars (the latest sampled request
per bucket) through the same storage.
"""

from __future__ import annotations

import threading
from bisect import bisect_left, bisect_right
from collections.abc import Iterator
from functools import partial
from math import inf, isnan
from operator import itemgetter
from typing import TYPE_CHECKING, Any

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.samples import Exemplar

from stagelens import _compat
from stagelens import semconv as sc
from stagelens._plain import plain
from stagelens.metrics.record import ExemplarRef

if TYPE_CHECKING:
    from stagelens.metrics.instruments import Instruments

_BUCKET_RUNS = not plain("bucket_runs")
_VALUE = itemgetter(0)
_Child = Any  # prometheus_client label children are untyped in its public API


Candidates = list[tuple[float, ExemplarRef]]
"""(value, the sampled request it came from) of one histogram, in the order the requests
ended: each value is also among the values observed."""


def exemplar_labels(ref: ExemplarRef) -> dict[str, str]:
    """The exemplar's labels: ``trace_id`` and ``span_id`` in W3C hex (63 characters in
    all, within OpenMetrics' limit of 128)."""
    return {
        sc.EXEMPLAR_TRACE_ID: f"{ref.trace_id:032x}",
        sc.EXEMPLAR_SPAN_ID: f"{ref.span_id:016x}",
    }


class ChildCache:
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


class FastHistogram:
    """One histogram child, observed through its bucket storage: a bisect and two locked
    increments instead of ``observe()``'s per-call checks and linear bucket scan.

    Why: a streamed request ends with a few dozen observations (its stages and its
    inter-token gaps). The storage (``_compat.histogram_storage``) works the same in
    multiprocess mode; when a future version changes it, or ``STAGELENS_PLAIN`` names
    ``series_storage``, ``observe()`` (the plain twin) is used instead. Invariant: the
    counts, sum and exemplars left are those ``observe()`` would leave, NaN ignored
    (tests/test_compat.py holds them equal).
    """

    __slots__ = (
        "_bounds",
        "_buckets",
        "_child",
        "_exemplars",
        "_index",
        "_sum",
        "highest",
        "lowest",
    )

    def __init__(self, child: _Child) -> None:
        self._child = child
        storage = _compat.histogram_storage(child)
        self._bounds: list[float] | None = storage.bounds if storage is not None else None
        self._buckets: list[Any] = storage.buckets if storage is not None else []
        self._sum: Any = storage.total if storage is not None else None
        self._index = partial(bisect_left, self._bounds or [])
        self._exemplars = _compat.exemplar_storage(storage)
        """The buckets' values, each holding its exemplar; None: ``observe(value,
        exemplar)`` keeps them instead."""
        self.lowest = inf
        """The smallest value observed (``inf`` before the first): with ``highest``, what
        narrows a percentile read from the buckets to the values really seen (exposed as
        ``stagelens_histogram_min_seconds`` / ``_max_seconds``, ``stagelens.views.percentiles``)."""
        self.highest = -inf
        """The largest value observed (``-inf`` before the first)."""

    def _extend(self, low: float, high: float) -> None:
        """Widen ``lowest``/``highest`` to ``low``/``high`` (a NaN changes neither)."""
        if low < self.lowest:
            self.lowest = low
        if high > self.highest:
            self.highest = high

    def observe(self, value: float) -> None:
        """Record one value (NaN is ignored: it lands in no bucket)."""
        bounds = self._bounds
        self._extend(value, value)
        if bounds is None:
            self._child.observe(value)
            return
        if value != value:  # NaN: observe() would add it to the sum only; keep series sane
            return
        self._buckets[bisect_left(bounds, value)].inc(1)
        self._sum.inc(value)

    def observe_many(self, values: list[float], exemplars: Candidates | None = None) -> None:
        """Record ``values`` at once: one increment per touched bucket. ``exemplars`` (each
        value also in ``values``): the last one of each bucket becomes its exemplar, as
        ``observe(value, exemplar)`` in that order would leave it."""
        if exemplars and self._exemplars is None:
            values = self._observe_exemplars(values, exemplars)
            exemplars = None
        if not values:
            return
        bounds = self._bounds
        if bounds is None:
            for value in values:
                self._extend(value, value)
                self._child.observe(value)
            return
        total = sum(values)
        if total != total:  # a NaN among them (or infinities of both signs): leave NaN out
            values = [value for value in values if not isnan(value)]
            if exemplars:  # (a NaN lands in no bucket, so it names none)
                exemplars = [pair for pair in exemplars if not isnan(pair[0])]
            if not values:
                return
            total = sum(values)
        if not _BUCKET_RUNS:
            for value in values:
                self.observe(value)
            if exemplars:
                self._keep_latest(exemplars)
            return
        # Sorted once, then one run of values per touched bucket: two bisects and one
        # increment per bucket. Invariant: each value counted in the bucket
        # ``bisect_left(bounds, value)`` names, as ``observe`` counts it (the plain twin
        # above; tests/test_compat.py holds them equal).
        self._sum.inc(total)
        values = sorted(values)
        self._extend(values[0], values[-1])
        buckets = self._buckets
        count = len(values)
        done = 0
        while done < count:
            at = bisect_left(bounds, values[done])
            upto = bisect_right(values, bounds[at], done)
            buckets[at].inc(upto - done)
            done = upto
        if exemplars:  # after the counts: a value that failed to count names no bucket
            self._keep_latest(exemplars)

    def _keep_latest(self, exemplars: Candidates) -> None:
        """Set each touched bucket's exemplar to its latest candidate: a bisect per
        candidate, one exemplar written per bucket."""
        # Bucket index -> its candidate; dict() keeps the last one per key, so the latest
        # wins, as it does with observe(). No NaN here: observe_many left them out.
        latest = dict(zip(map(self._index, map(_VALUE, exemplars)), exemplars, strict=True))
        buckets = self._exemplars
        assert buckets is not None
        for at, (value, ref) in latest.items():
            buckets[at].set_exemplar(Exemplar(exemplar_labels(ref), value, ref.timestamp))

    def _observe_exemplars(self, values: list[float], exemplars: Candidates) -> list[float]:
        """The public path: observe each candidate with its exemplar (prometheus-client
        keeps the last per bucket, stamped with the time of this call); return the values
        left to observe."""
        rest = list(values)
        child = self._child
        for value, ref in exemplars:
            if value != value:  # NaN: in no bucket, and never equal to itself in ``rest``
                continue
            rest.remove(value)
            self._extend(value, value)
            child.observe(value, exemplar_labels(ref))
        return rest


class FastCounter:
    """One counter child, incremented through its value (``_compat.counter_storage``;
    ``inc()`` when that is not as tested): skips ``inc()``'s checks.
    Non-positive amounts are dropped (a counter never goes down; zero changes nothing)."""

    __slots__ = ("_child", "_value")

    def __init__(self, child: _Child) -> None:
        self._child = child
        self._value: Any = _compat.counter_storage(child)

    def inc(self, amount: float = 1) -> None:
        if amount > 0:
            if self._value is not None:
                self._value.inc(amount)
            else:
                self._child.inc(amount)


class ModelSeries:
    """Every gateway series of one ``model`` label value, bound on first use.

    Why: a fold records ~a dozen series per request, mostly of the same few models;
    binding them once per model turns each into a method call returning an attribute or a
    small dict entry, with no label tuple built and no lock taken. Each accessor may raise
    only when it binds (prometheus-client refusing the label values); the fold binds every
    series of a record before writing any (see ``Instruments.fold``).
    """

    __slots__ = (
        "_instruments",
        "_itl",
        "_non_streamed",
        "_outcomes",
        "_phases",
        "_rejections",
        "_slis",
        "_stages",
        "_ttfat",
        "_ttft",
        "_unmetered",
        "_upstream_ttft",
        "model",
    )

    def __init__(self, instruments: Instruments, model: str) -> None:
        self._instruments = instruments
        self.model = model
        # Series are bound when first recorded, never before: a model that only ever got
        # errors exposes no TTFT series.
        self._ttft: dict[str, FastHistogram] = {}
        self._non_streamed: dict[str, FastHistogram] = {}
        self._ttfat: FastHistogram | None = None
        self._itl: FastHistogram | None = None
        self._stages: dict[str, FastHistogram] = {}
        self._phases: dict[str, FastHistogram] = {}
        self._outcomes: dict[str, tuple[FastHistogram, FastCounter]] = {}
        self._rejections: dict[tuple[str, str], FastCounter] = {}
        self._upstream_ttft: dict[str, FastHistogram] = {}
        self._slis: dict[tuple[str, str], tuple[FastCounter, FastCounter]] = {}
        self._unmetered: dict[str, FastCounter] = {}

    def ttft(self, prompt_size: str) -> FastHistogram:
        """``stagelens_time_to_first_token_seconds{model, prompt_size}``."""
        found = self._ttft.get(prompt_size)
        if found is None:
            found = FastHistogram(self._instruments.ttft.get(self.model, prompt_size))
            self._ttft[prompt_size] = found
        return found

    def non_streamed(self, prompt_size: str) -> FastHistogram:
        """``stagelens_non_streamed_response_seconds{model, prompt_size}``."""
        found = self._non_streamed.get(prompt_size)
        if found is None:
            child = self._instruments.non_streamed.get(self.model, prompt_size)
            found = self._non_streamed[prompt_size] = FastHistogram(child)
        return found

    def ttfat(self) -> FastHistogram:
        """``stagelens_time_to_first_answer_token_seconds{model}``."""
        found = self._ttfat
        if found is None:
            found = self._ttfat = FastHistogram(self._instruments.ttfat.get(self.model))
        return found

    def itl(self) -> FastHistogram:
        """``stagelens_inter_token_latency_seconds{model}``."""
        found = self._itl
        if found is None:
            found = self._itl = FastHistogram(self._instruments.itl.get(self.model))
        return found

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

    def rejection(self, stage: str, code: str) -> FastCounter:
        """``stagelens_rejections_total{stage, model, code}``."""
        key = (stage, code)
        found = self._rejections.get(key)
        if found is None:
            found = FastCounter(self._instruments.rejections.get(stage, self.model, code))
            self._rejections[key] = found
        return found

    def upstream_ttft(self, prompt_size: str) -> FastHistogram:
        """``stagelens_upstream_time_to_first_token_seconds{model, prompt_size}``."""
        found = self._upstream_ttft.get(prompt_size)
        if found is None:
            child = self._instruments.upstream_ttft.get(self.model, prompt_size)
            found = self._upstream_ttft[prompt_size] = FastHistogram(child)
        return found

    def histograms(self) -> Iterator[tuple[str, dict[str, str], FastHistogram]]:
        """Every histogram series bound so far: (family name, its labels, the series)."""
        model = {sc.LABEL_MODEL: self.model}
        for size, found in list(self._ttft.items()):
            yield sc.TIME_TO_FIRST_TOKEN, {**model, sc.LABEL_PROMPT_SIZE: size}, found
        for size, found in list(self._non_streamed.items()):
            yield sc.NON_STREAMED_RESPONSE, {**model, sc.LABEL_PROMPT_SIZE: size}, found
        if self._itl is not None:
            yield sc.INTER_TOKEN_LATENCY, model, self._itl
        for size, found in list(self._upstream_ttft.items()):
            yield sc.UPSTREAM_TTFT, {**model, sc.LABEL_PROMPT_SIZE: size}, found
        for stage, found in list(self._stages.items()):
            yield sc.STAGE_DURATION, {sc.LABEL_STAGE: stage, **model}, found
        for phase, found in list(self._phases.items()):
            yield sc.ENGINE_PHASE_DURATION, {sc.LABEL_PHASE: phase, **model}, found
        for code, (found, _) in list(self._outcomes.items()):
            yield sc.REQUEST_DURATION, {**model, sc.LABEL_CODE: code}, found

    def sli(self, sli: str, prompt_size: str) -> tuple[FastCounter, FastCounter]:
        """``stagelens_sli_requests_total`` and ``stagelens_sli_errors_total`` for one
        ``sli`` and ``prompt_size`` class; both children exist once bound, so an error ratio
        reads 0, not NaN."""
        key = (sli, prompt_size)
        found = self._slis.get(key)
        if found is None:
            instruments = self._instruments
            found = (
                FastCounter(instruments.sli_requests.get(self.model, sli, prompt_size)),
                FastCounter(instruments.sli_errors.get(self.model, sli, prompt_size)),
            )
            self._slis[key] = found
        return found

    def unmetered(self, billing: str) -> FastCounter:
        """``stagelens_unmetered_requests_total{model, billing}``."""
        found = self._unmetered.get(billing)
        if found is None:
            found = FastCounter(self._instruments.unmetered.get(self.model, billing))
            self._unmetered[billing] = found
        return found


class BillingSeries:
    """The token and cost counters of one (model, tenant), bound once."""

    __slots__ = (
        "_engine",
        "_instruments",
        "_key",
        "cache_write",
        "cached_input",
        "cost",
        "input",
        "output",
        "reasoning",
    )

    def __init__(self, instruments: Instruments, model: str, tenant: str) -> None:
        self._instruments, self._key = instruments, (model, tenant)
        self._engine: FastCounter | None = None
        tokens = instruments.tokens
        self.input = FastCounter(tokens.get(model, tenant, sc.TOKEN_TYPE_INPUT))
        self.output = FastCounter(tokens.get(model, tenant, sc.TOKEN_TYPE_OUTPUT))
        self.cached_input = FastCounter(tokens.get(model, tenant, sc.TOKEN_TYPE_CACHED_INPUT))
        self.reasoning = FastCounter(tokens.get(model, tenant, sc.TOKEN_TYPE_REASONING))
        self.cache_write = FastCounter(tokens.get(model, tenant, sc.TOKEN_TYPE_CACHE_WRITE))
        self.cost = FastCounter(instruments.cost.get(model, tenant))

    @property
    def engine(self) -> FastCounter:
        """The engine-seconds counter, bound on first use: a tenant whose engine never
        reported a figure shows no series rather than a zero."""
        if self._engine is None:
            self._engine = FastCounter(self._instruments.engine_seconds.get(*self._key))
        return self._engine
