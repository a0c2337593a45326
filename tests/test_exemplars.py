"""Exemplars through the batched fold: the latest sampled request per bucket, as
prometheus-client's own ``observe(value, exemplar)`` in request order would leave it, and
none from a sampled-out request."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram, values
from prometheus_client import multiprocess as mp
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics
from prometheus_client.samples import Exemplar

from stagelens import _compat, semconv
from stagelens.config import Settings
from stagelens.metrics.buckets import (
    INTER_TOKEN_LATENCY_BUCKETS,
    REQUEST_DURATION_BUCKETS,
    STAGE_DURATION_BUCKETS,
    ttft_buckets,
)
from stagelens.metrics.fold import FOLD_EVERY
from stagelens.metrics.prometheus import PrometheusSink
from stagelens.metrics.record import ExemplarRef, RequestRecord, StageTimes
from stagelens.metrics.series import exemplar_labels
from stagelens.telemetry import recording_for

_HISTOGRAMS = (
    (semconv.TIME_TO_FIRST_TOKEN, {"model": "m", "prompt_size": "1024"}),
    (semconv.INTER_TOKEN_LATENCY, {"model": "m"}),
    (semconv.REQUEST_DURATION, {"model": "m", "code": "200"}),
    (semconv.STAGE_DURATION, {"stage": "tokenizer", "model": "m"}),
)


def _record(
    ttft: float,
    duration: float,
    tokenizer: float,
    ref: ExemplarRef | None,
    gaps: tuple[float, ...] = (),
) -> Any:
    return RequestRecord(
        model="m",
        code="200",
        duration=duration,
        ttft=ttft,
        gaps=list(gaps),
        prompt_size="1024",
        stages=StageTimes([("tokenizer", tokenizer)]),
        phases=None,
        rejected_by=None,
        billing=None,
        exemplar=ref,
    )


def _exemplars(registry: CollectorRegistry, name: str, **labels: str) -> dict[str, Exemplar]:
    """Bucket upper bound (``le``) -> exemplar, of one histogram series."""
    found: dict[str, Exemplar] = {}
    for metric in registry.collect():
        for sample in metric.samples:
            if sample.name != f"{name}_bucket" or sample.exemplar is None:
                continue
            if all(sample.labels.get(k) == v for k, v in labels.items()):
                found[sample.labels["le"]] = sample.exemplar
    return found


def _replayed(records: list[Any]) -> CollectorRegistry:
    """prometheus-client alone, fed the same requests in order with its public
    ``observe(value, exemplar)``: the reading the fold must equal."""
    registry = CollectorRegistry()
    ttft = Histogram(
        semconv.TIME_TO_FIRST_TOKEN,
        "",
        ["model", "prompt_size"],
        buckets=ttft_buckets(0.5),
        registry=registry,
    ).labels("m", "1024")
    itl = Histogram(  # its child made by the first gap, as the fold binds it
        semconv.INTER_TOKEN_LATENCY,
        "",
        ["model"],
        buckets=INTER_TOKEN_LATENCY_BUCKETS,
        registry=registry,
    )
    duration = Histogram(
        semconv.REQUEST_DURATION,
        "",
        ["model", "code"],
        buckets=REQUEST_DURATION_BUCKETS,
        registry=registry,
    ).labels("m", "200")
    stage = Histogram(
        semconv.STAGE_DURATION,
        "",
        ["stage", "model"],
        buckets=STAGE_DURATION_BUCKETS,
        registry=registry,
    ).labels("tokenizer", "m")
    for r in records:
        labels = exemplar_labels(r.exemplar) if r.exemplar is not None else None
        ttft.observe(r.ttft, labels)
        duration.observe(r.duration, labels)
        stage.observe(r.stages[0][1], labels)
        worst = max(r.gaps) if r.gaps else None
        for gap in r.gaps:  # only the worst gap names the trace (the stall to look at)
            itl.labels("m").observe(gap, labels if gap == worst else None)
            if gap == worst:
                worst = None  # the first of equal worst gaps: one exemplar per request
    return registry


def _ref(i: int) -> ExemplarRef:
    return ExemplarRef(0x0AF7651916CD43DD8448EB211C80319C + i, 0xB7AD6B7169203331 + i, 1e9 + i)


_SECONDS = st.floats(min_value=0.0, max_value=200.0, allow_nan=False)


class TestLatestPerBucket:
    """What the fold leaves equals prometheus-client's own exemplar keeping."""

    @settings(max_examples=60, deadline=None)
    @given(
        st.lists(
            st.tuples(
                _SECONDS,
                _SECONDS,
                _SECONDS,
                st.booleans(),
                st.lists(st.floats(min_value=0.0, max_value=3.0), max_size=6).map(tuple),
            ),
            min_size=1,
            max_size=80,
        ),
        st.integers(min_value=1, max_value=FOLD_EVERY),
    )
    def test_fold_equals_observe_with_exemplars_in_order(
        self,
        requests: list[tuple[float, float, float, bool, tuple[float, ...]]],
        scrape_every: int,
    ) -> None:
        """For any requests, sampled or not, folded in batches of any size (scrapes between
        them), every bucket's exemplar is the one prometheus-client keeps when each request
        is observed in turn with its trace as exemplar, and counts and sums agree."""
        records = [
            _record(a, b, c, _ref(i) if sampled else None, gaps)
            for i, (a, b, c, sampled, gaps) in enumerate(requests)
        ]
        registry = CollectorRegistry()
        fold = recording_for(registry, Settings()).fold
        for i, record in enumerate(records, start=1):
            fold.submit(record)
            if i % scrape_every == 0:
                fold.fold()
        want = _replayed(records)
        for name, labels in _HISTOGRAMS:
            got = _exemplars(registry, name, **labels)
            expected = _exemplars(want, name, **labels)
            assert {le: (e.labels, e.value) for le, e in got.items()} == {
                le: (e.labels, e.value) for le, e in expected.items()
            }, name
            for exemplar in got.values():  # stamped when the request ended, not when folded
                trace_id = int(exemplar.labels[semconv.EXEMPLAR_TRACE_ID], 16)
                assert exemplar.timestamp == _ref(trace_id - _ref(0).trace_id).timestamp
            for suffix in ("_count", "_sum"):
                assert registry.get_sample_value(name + suffix, labels) == pytest.approx(
                    want.get_sample_value(name + suffix, labels)
                )

    def test_a_sampled_out_request_never_names_a_trace(self) -> None:
        """Requests without a sampled trace leave their buckets without exemplar, and one
        landing in a bucket after a sampled request leaves that request's exemplar."""
        registry = CollectorRegistry()
        fold = recording_for(registry, Settings()).fold
        fold.submit(_record(0.45, 1.0, 0.002, _ref(1)))
        fold.submit(_record(0.45, 1.0, 0.002, None))  # same buckets, sampled out
        fold.submit(_record(4.0, 30.0, 1.5, None))  # buckets of its own
        fold.fold()
        ttft = _exemplars(registry, semconv.TIME_TO_FIRST_TOKEN, model="m", prompt_size="1024")
        assert list(ttft) == ["0.5"]
        assert ttft["0.5"].labels == exemplar_labels(_ref(1))
        assert ttft["0.5"].value == 0.45
        assert registry.get_sample_value(
            f"{semconv.TIME_TO_FIRST_TOKEN}_count", {"model": "m", "prompt_size": "1024"}
        ) == pytest.approx(3.0)

    def test_an_exemplar_outlives_batches_without_sampled_requests(self) -> None:
        """A fold of sampled-out requests only keeps the exemplars of earlier folds."""
        registry = CollectorRegistry()
        fold = recording_for(registry, Settings()).fold
        fold.submit(_record(0.45, 1.0, 0.002, _ref(7)))
        fold.fold()
        for _ in range(FOLD_EVERY):
            fold.submit(_record(0.45, 1.0, 0.002, None))
        fold.fold()
        ttft = _exemplars(registry, semconv.TIME_TO_FIRST_TOKEN, model="m", prompt_size="1024")
        assert ttft["0.5"].labels[semconv.EXEMPLAR_TRACE_ID] == f"{_ref(7).trace_id:032x}"

    def test_a_bad_record_names_no_trace(self) -> None:
        """A record left out of the fold (a value that is not a number) gives no exemplar,
        though its other values would have been valid."""
        registry = CollectorRegistry()
        fold = recording_for(registry, Settings()).fold
        fold.submit(_record(0.45, 1.0, 0.002, _ref(1)))
        fold.submit(_record(0.45, "x", 0.002, _ref(2)))  # type: ignore[arg-type]
        fold.fold()
        ttft = _exemplars(registry, semconv.TIME_TO_FIRST_TOKEN, model="m", prompt_size="1024")
        assert ttft["0.5"].labels == exemplar_labels(_ref(1))

    def test_openmetrics_exposition_carries_trace_and_span_ids(self) -> None:
        """The OpenMetrics text shows the exemplar on the bucket the value fell in, with
        the W3C hex ids, the value and the request's end time."""
        registry = CollectorRegistry()
        fold = recording_for(registry, Settings()).fold
        fold.submit(_record(0.45, 1.0, 0.002, _ref(0)))
        text = openmetrics(registry).decode()
        line = next(
            row
            for row in text.splitlines()
            if row.startswith(
                f'{semconv.TIME_TO_FIRST_TOKEN}_bucket{{le="0.5",model="m",prompt_size="1024"}}'
            )
        )
        assert line.endswith(
            ' # {span_id="b7ad6b7169203331",trace_id="0af7651916cd43dd8448eb211c80319c"}'
            " 0.45 1000000000.0"
        )


class TestMultiprocess:
    """prometheus-client's multiprocess files hold no exemplars: nothing is gathered and
    nothing breaks."""

    def test_multiprocess_mode_counts_everything_and_exposes_no_exemplar(
        self, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """With PROMETHEUS_MULTIPROC_DIR, sampled requests are counted as any other and the
        aggregated exposition has no exemplar."""
        monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
        monkeypatch.setattr(values, "ValueClass", values.get_value_class())
        fold = recording_for(CollectorRegistry(), Settings()).fold
        sink = fold.sinks[0]
        assert isinstance(sink, PrometheusSink)
        assert not sink._keep_exemplars
        for i in range(3):
            fold.submit(_record(0.3, 1.0, 0.002, _ref(i)))
        served = CollectorRegistry()
        mp.MultiProcessCollector(served)
        labels = {"model": "m", "prompt_size": "1024"}
        count = served.get_sample_value(f"{semconv.TIME_TO_FIRST_TOKEN}_count", labels)
        assert count == 3.0
        assert all(
            sample.exemplar is None for metric in served.collect() for sample in metric.samples
        )
        assert "trace_id" not in openmetrics(served).decode()

    def test_the_value_storage_keeps_no_exemplar_there(
        self, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The multiprocess values take an exemplar and keep nothing (prometheus-client's
        own limit), so even an exemplar written there cannot break a write."""
        monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
        monkeypatch.setattr(values, "ValueClass", values.get_value_class())
        child = Histogram("h", "h", ["m"], buckets=(1.0,), registry=CollectorRegistry())
        buckets = _compat.exemplar_storage(_compat.histogram_storage(child.labels("x")))
        assert buckets is not None
        buckets[0].set_exemplar(Exemplar(exemplar_labels(_ref(0)), 0.5, 1.0))
        assert buckets[0].get_exemplar() is None
