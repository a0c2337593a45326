"""The Prometheus sink: folded batches of finished requests written into the gateway series.

Why a sink: the fold (``stagelens.metrics.fold``) hands every sink the same batches; this one turns
them into the ``stagelens_*`` series of one registry (``stagelens.metrics.instruments``), through
bound children (``stagelens.metrics.series``). Why per batch: observations of the same series
become one bucket count in C and one locked increment per touched bucket, for all the
requests of the batch. A scrape folds first (``FoldOnCollect``), so it never misses a
finished request.
"""

from __future__ import annotations

import weakref
from collections import Counter as Tally
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from itertools import chain
from operator import attrgetter
from typing import Any, Final, TypeVar, cast

from prometheus_client.metrics_core import Metric

from stagelens import _compat
from stagelens import semconv as sc
from stagelens.metrics.fold import Fold
from stagelens.metrics.instruments import Instruments
from stagelens.metrics.record import LoneRecord, Record, RequestRecord
from stagelens.metrics.series import Candidates, FastCounter, FastHistogram

__all__ = ["FoldOnCollect", "PrometheusSink"]

_Observed = defaultdict[FastHistogram, list[float]]
"""Values to observe, per bound histogram."""
_Added = defaultdict[FastCounter, float]
"""Amounts to add, per bound counter."""
_Exemplars = defaultdict[FastHistogram, Candidates]
"""Exemplar candidates, per bound histogram."""


_Item = TypeVar("_Item")
_MODEL: Final = attrgetter("model")
_CODE: Final = attrgetter("code")
_TENANT: Final = attrgetter("tenant")
_PROMPT_SIZE: Final = attrgetter("prompt_size")


def _grouped(items: Sequence[_Item], key: Callable[[_Item], str]) -> list[tuple[str, list[_Item]]]:
    """``items`` by their ``key``: each value (in sorted order) with its items, in their
    order. A batch is nearly always one model, one status code, one prompt class and one
    tenant, so each series is then looked up once per batch, not once per record."""
    groups: dict[str, list[_Item]] = {}
    for item in items:
        groups.setdefault(key(item), []).append(item)
    return sorted(groups.items())


def _check(observed: _Observed) -> None:
    """Raise TypeError when a value to observe is not a number (a counter's amount already
    failed to add up while collected), before anything is written: found later, by a
    histogram's bisect, it would leave the batch half written. ``sum`` runs in C, a few ns
    per value (``math.fsum``, which also refuses complex numbers, costs ten times more; a
    complex timing is left to the writes, which lose that one series' share)."""
    for values in observed.values():
        sum(values, 0.0)


class PrometheusSink:
    """Writes folded batches into one registry's gateway series (a ``RequestSink``)."""

    needs_genai = False

    def __init__(self, instruments: Instruments) -> None:
        self._instruments = instruments
        # prometheus-client's multiprocess files hold no exemplars: none are gathered there.
        self._keep_exemplars = _compat.in_process_values()
        self._decisions: dict[tuple[str, str], FastCounter] = {}

    def write(self, batch: Sequence[Record]) -> list[Exception]:
        """Write ``batch``; return the failures swallowed.

        A bad record costs only itself. The batch is first collected whole (the common
        case, and the fast one); when that fails, or a value in it is not a number, it is
        collected again record by record, each into series of its own that join the batch
        only when complete: a record is applied whole or not at all. The writes then touch
        only checked numbers; should prometheus-client itself fail writing one series (a
        full disk in multiprocess mode), that series' share of the batch is lost and
        counted, and every other series is still written.
        """
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
        return failed

    def _collect(self, batch: Sequence[Record]) -> tuple[_Observed, _Added, _Exemplars]:
        """The observations and increments of ``batch``, per bound series, and the exemplar
        candidates of its sampled requests (their TTFT, worst inter-token gap, request
        duration and stage times, in the order the requests ended; none in multiprocess
        mode, whose files keep none).

        Gathered per model, field by field: a batch is nearly always one model (and one
        status code, one tenant), so each field's values are one comprehension over the
        records and each series is looked up once per batch, not once per request (a
        lookup is a method call, a value a few bytecodes)."""
        observed: _Observed = defaultdict(list)
        added: _Added = defaultdict(float)
        kept: _Exemplars = defaultdict(list)
        # Anything that is not a lone observation is read as a request's record (and fails
        # as one, counted, if it is not one).
        requests = cast("list[RequestRecord]", [r for r in batch if not isinstance(r, LoneRecord)])
        if len(requests) < len(batch):
            self._collect_lone([r for r in batch if isinstance(r, LoneRecord)], observed, added)
        for model, records in _grouped(requests, _MODEL):
            self._collect_model(model, records, observed, added, kept)
        decisions = [r.trace_decision for r in requests if r.trace_decision is not None]
        for key, counted in Tally(decisions).items():
            added[self._decision(key)] += counted
        return observed, added, kept

    def _decision(self, key: tuple[str, str]) -> FastCounter:
        """``stagelens_trace_decisions_total{decision, reason}``, bound once per pair."""
        found = self._decisions.get(key)
        if found is None:
            counter = self._instruments.trace_decisions.get(*key)
            found = self._decisions[key] = FastCounter(counter)
        return found

    def _collect_model(
        self,
        model: str,
        records: Sequence[RequestRecord],
        observed: _Observed,
        added: _Added,
        kept: _Exemplars,
    ) -> None:
        """``_collect`` for the records of one ``model``."""
        series = self._instruments.for_model(model)
        keep = self._keep_exemplars
        # Exemplar candidates field by field, as the values: in each series' own order of
        # the requests' ends, only from sampled requests (``exemplar`` set).
        for code, mine in _grouped(records, _CODE):
            request_duration, requests = series.outcome(code)
            observed[request_duration] += [r.duration for r in mine]
            added[requests] += len(mine)
            if keep:
                kept[request_duration] += [
                    (r.duration, r.exemplar) for r in mine if r.exemplar is not None
                ]
        # A first token is a streamed answer's; a non-streamed one's "first" body is its
        # whole answer, kept apart so that no TTFT figure reads a generation.
        answered = [r for r in records if r.ttft is not None]
        for size, mine in _grouped(answered, _PROMPT_SIZE):
            whole = [r for r in mine if not r.streamed]
            if whole:
                mine = [r for r in mine if r.streamed]
                self._observe(series.non_streamed(size), whole, observed, kept)
            if mine:
                self._observe(series.ttft(size), mine, observed, kept)
        ttfats = [r.ttfat for r in records if r.ttfat is not None and r.streamed]
        if ttfats:
            observed[series.ttfat()] += ttfats
        gaps = list(chain.from_iterable([r.gaps for r in records]))
        if gaps:
            itl = series.itl()
            observed[itl] += gaps
            if keep:  # each sampled request's worst gap: a stall leads to its trace
                kept[itl] += [
                    (max(r.gaps), r.exemplar) for r in records if r.exemplar is not None and r.gaps
                ]
        upstream = [r for r in records if r.upstream_ttft is not None]
        for size, mine in _grouped(upstream, _PROMPT_SIZE):
            observed[series.upstream_ttft(size)] += [
                r.upstream_ttft for r in mine if r.upstream_ttft is not None
            ]
        # What a record holds several of, or rarely: one pass, gathered by label value.
        stages: defaultdict[str, list[float]] = defaultdict(list)
        phases: defaultdict[str, list[float]] = defaultdict(list)
        stage_candidates: defaultdict[str, Candidates] = defaultdict(list)
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
            if ref is not None and keep:  # sampled: its stage times may be kept
                for name, seconds in record.stages:
                    stage_candidates[name].append((seconds, ref))
        for name, values in stages.items():
            observed[series.stage(name)] += values
        for name, candidates in stage_candidates.items():
            kept[series.stage(name)] += candidates
        for name, values in phases.items():
            observed[series.phase(name)] += values
        # Counted per distinct (class, verdicts): most requests of a model share one.
        classed = Tally([(r.prompt_size, r.verdicts) for r in records])
        for (size, verdicts), counted in classed.items():
            for sli, bad in verdicts:
                requests_counted, errors = series.sli(sli, size)
                added[requests_counted] += counted
                # Bound as soon as the SLI counts the model: a ratio reads 0, not NaN.
                added[errors] += counted if bad else 0
        bills = [r.billing for r in records if r.billing is not None]
        for tenant, theirs in _grouped(bills, _TENANT):
            billing = self._instruments.billing(model, tenant)
            added[billing.input] += sum([b.input_tokens for b in theirs])
            added[billing.output] += sum([b.output_tokens for b in theirs])
            added[billing.cached_input] += sum([b.cached_input_tokens for b in theirs])
            added[billing.reasoning] += sum([b.reasoning_tokens for b in theirs])
            added[billing.cache_write] += sum([b.cache_write_tokens for b in theirs])
            added[billing.cost] += sum([b.cost_usd for b in theirs])
            engine = [b.engine_seconds for b in theirs if b.engine_seconds is not None]
            if engine:
                added[billing.engine] += sum(engine)

    def _observe(
        self,
        histogram: FastHistogram,
        records: Sequence[RequestRecord],
        observed: _Observed,
        kept: _Exemplars,
    ) -> None:
        """Each record's ``ttft`` into ``histogram``, and its sampled ones as exemplar
        candidates."""
        observed[histogram] += [r.ttft for r in records if r.ttft is not None]
        if self._keep_exemplars:
            kept[histogram] += [
                (r.ttft, r.exemplar)
                for r in records
                if r.exemplar is not None and r.ttft is not None
            ]

    def _collect_lone(
        self, records: Sequence[LoneRecord], observed: _Observed, added: _Added
    ) -> None:
        """``_collect`` for observations made outside any request: their stage, engine
        phase and upstream first-token times, and an unmetered call's count."""
        for record in records:
            series = self._instruments.for_model(record.model)
            for name, seconds in record.stages:
                observed[series.stage(name)].append(seconds)
            for name, seconds in record.phases or ():
                observed[series.phase(name)].append(seconds)
            if record.upstream_ttft is not None:  # no request, so no prompt-size class
                unknown = series.upstream_ttft(sc.PROMPT_SIZE_UNKNOWN)
                observed[unknown].append(record.upstream_ttft)
            if record.unmetered is not None:
                added[series.unmetered(record.unmetered)] += 1

    def _collect_each(
        self, batch: Sequence[Record], failed: list[Exception]
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


class FoldOnCollect:
    """A collector with no metrics of its own: collecting it folds the queued records.
    Registered before the series the fold feeds, so that a scrape folds, then reads them."""

    def __init__(self, fold: Fold) -> None:
        self._fold = weakref.ref(fold)

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        fold = self._fold()
        if fold is not None:
            fold.fold()
        return iter(())
