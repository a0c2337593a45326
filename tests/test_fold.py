"""The batched fold: queued request records reach every series they feed, and a bad record
costs only itself."""

from __future__ import annotations

import logging
from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Histogram

from stagelens import semconv
from stagelens.config import Settings, answer_classes
from stagelens.metrics import buckets
from stagelens.metrics.fold import FOLD_EVERY
from stagelens.metrics.record import (
    BillingRecord,
    ExemplarRef,
    LoneRecord,
    PhaseTimes,
    RequestRecord,
    StageTimes,
)
from stagelens.telemetry import recording_for


def _record(model: str = "m", **changes: Any) -> RequestRecord:
    """One finished, streamed, billed request as the middleware submits it."""
    record = RequestRecord(
        model=model,
        code="200",
        duration=0.25,
        ttft=0.05,
        gaps=[0.01, 0.02, 0.01],
        stages=StageTimes([("gateway", 0.001), ("inference", 0.2)]),
        phases=PhaseTimes([("queue", 0.001), ("prefill", 0.04), ("decode", 0.15)]),
        rejected_by=None,
        billing=BillingRecord("acme", 300, 16, 128, 0.0004),
    )
    return record._replace(**changes)


def _value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def test_request_records_are_folded_before_every_collection() -> None:
    """A record is visible at the next scrape, with every series it feeds, however few
    requests were queued."""
    registry = CollectorRegistry()
    fold = recording_for(registry, Settings()).fold
    fold.submit(_record())
    fold.submit(_record())
    assert len(fold._pending) == 2  # fewer than FOLD_EVERY: still queued

    def value(name: str, **labels: str) -> float | None:
        return _value(registry, name, **labels)

    assert value(semconv.REQUESTS, model="m", code="200") == 2.0
    assert value(f"{semconv.REQUEST_DURATION}_sum", model="m", code="200") == 0.5
    assert value(f"{semconv.TIME_TO_FIRST_TOKEN}_count", model="m", prompt_size="unknown") == 2.0
    assert value(f"{semconv.INTER_TOKEN_LATENCY}_count", model="m") == 6.0
    assert value(f"{semconv.STAGE_DURATION}_count", stage="inference", model="m") == 2.0
    assert value(f"{semconv.ENGINE_PHASE_DURATION}_sum", phase="prefill", model="m") == 0.08
    tokens = semconv.TOKENS
    assert value(tokens, model="m", tenant="acme", type="cached_input") == 256.0
    assert value(semconv.COST_USD, model="m", tenant="acme") == pytest.approx(0.0008)
    assert not fold._pending


def test_sli_verdicts_are_counted_per_model_sli_and_prompt_size() -> None:
    """Each verdict of each record counts one request of its SLI, model and prompt-size
    class, and one error when bad; a good verdict binds the error series at 0. Its TTFT is
    observed under its class too."""
    registry = CollectorRegistry()
    fold = recording_for(registry, Settings()).fold
    good = ((semconv.SLI_AVAILABILITY, False), (semconv.SLI_TTFT, False))
    slow = ((semconv.SLI_AVAILABILITY, False), (semconv.SLI_TTFT, True))
    given = [
        ("a", "1024", good),
        ("a", "8192", slow),
        ("b", "1024", good),
        ("a", "1024", slow),
        ("b", "1024", ()),
    ]
    for model, size, verdicts in given:
        fold.submit(_record(model, verdicts=verdicts, prompt_size=size))
    fold.fold()
    got = {
        (model, sli, size): (
            _value(registry, semconv.SLI_REQUESTS, model=model, sli=sli, prompt_size=size),
            _value(registry, semconv.SLI_ERRORS, model=model, sli=sli, prompt_size=size),
        )
        for model in "ab"
        for sli in (semconv.SLI_AVAILABILITY, semconv.SLI_TTFT, semconv.SLI_ITL)
        for size in ("1024", "8192")
    }
    assert got == {
        ("a", semconv.SLI_AVAILABILITY, "1024"): (2.0, 0.0),
        ("a", semconv.SLI_AVAILABILITY, "8192"): (1.0, 0.0),
        ("a", semconv.SLI_TTFT, "1024"): (2.0, 1.0),
        ("a", semconv.SLI_TTFT, "8192"): (1.0, 1.0),
        ("a", semconv.SLI_ITL, "1024"): (None, None),
        ("a", semconv.SLI_ITL, "8192"): (None, None),
        ("b", semconv.SLI_AVAILABILITY, "1024"): (1.0, 0.0),
        ("b", semconv.SLI_AVAILABILITY, "8192"): (None, None),
        ("b", semconv.SLI_TTFT, "1024"): (1.0, 0.0),
        ("b", semconv.SLI_TTFT, "8192"): (None, None),
        ("b", semconv.SLI_ITL, "1024"): (None, None),
        ("b", semconv.SLI_ITL, "8192"): (None, None),
    }
    ttft = f"{semconv.TIME_TO_FIRST_TOKEN}_count"
    assert _value(registry, ttft, model="a", prompt_size="1024") == 2.0
    assert _value(registry, ttft, model="a", prompt_size="8192") == 1.0


def test_a_rejection_is_counted_by_the_fold() -> None:
    """A record naming the stage that rejected it counts one rejection of that stage."""
    registry = CollectorRegistry()
    fold = recording_for(registry, Settings()).fold
    for _ in range(3):
        fold.submit(_record(code="429", ttft=None, gaps=[], rejected_by="gateway"))
    fold.fold()
    got = _value(registry, semconv.REJECTIONS, stage="gateway", model="m", code="429")
    assert got == 3.0


def test_request_records_stay_bounded_without_scrapes() -> None:
    """Nobody scrapes: the queue is folded every FOLD_EVERY records, never grows."""
    fold, instruments = recording_for(CollectorRegistry(), Settings())
    most = 0
    for _ in range(10 * FOLD_EVERY + 3):
        fold.submit(_record())
        most = max(most, len(fold._pending))
    assert most < FOLD_EVERY
    child = instruments.requests.get("m", "200")
    assert child._value.get() == 10 * FOLD_EVERY  # folded without any collection


_BAD: dict[str, dict[str, Any]] = {
    "first stage not a number": {"stages": [("gateway", "not a number"), ("inference", 0.2)]},
    "last stage not a number": {"stages": [("gateway", 0.001), ("inference", "x")]},
    "stage not a pair": {"stages": [("gateway", 0.001), ("inference",)]},
    "phase not a number": {"phases": [("queue", 0.001), ("prefill", None)]},
    "gap not a number": {"gaps": [0.01, "x"]},
    "ttft not a number": {"ttft": "x"},
    "duration not a number": {"duration": None},
    "billing too short": {"billing": ("acme", 300, 16)},
    "cost not a number": {"billing": BillingRecord("acme", 300, 16, 128, cast("float", "x"))},
    "not a record": {},
}


def test_lone_observations_reach_the_series_through_the_fold() -> None:
    """A stage and an upstream call made outside any request are folded like requests'
    records, among them: their stage, engine phase and upstream first-token times and an
    unmetered call reach the series; they count no request, token or SLI."""
    registry = CollectorRegistry()
    fold = recording_for(registry, Settings()).fold
    fold.submit(_record())
    fold.submit(LoneRecord("m", StageTimes([("retrieval", 0.003)])))
    call = LoneRecord(
        "m",
        StageTimes([("inference", 0.2)]),
        PhaseTimes([("queue", 0.001), ("prefill", 0.04)]),
        upstream_ttft=0.045,
        unmetered=semconv.BILLING_UNBILLED,
    )
    fold.submit(call)

    def value(name: str, **labels: str) -> float | None:
        return _value(registry, name, **labels)

    assert value(f"{semconv.STAGE_DURATION}_count", stage="retrieval", model="m") == 1.0
    assert value(f"{semconv.STAGE_DURATION}_sum", stage="retrieval", model="m") == 0.003
    assert value(f"{semconv.STAGE_DURATION}_count", stage="inference", model="m") == 2.0
    assert value(f"{semconv.ENGINE_PHASE_DURATION}_count", phase="prefill", model="m") == 2.0
    assert value(f"{semconv.ENGINE_PHASE_DURATION}_count", phase="decode", model="m") == 1.0
    assert value(f"{semconv.UPSTREAM_TTFT}_count", model="m", prompt_size="unknown") == 1.0
    assert value(semconv.UNMETERED_REQUESTS, model="m", billing=semconv.BILLING_UNBILLED) == 1.0
    assert value(semconv.REQUESTS, model="m", code="200") == 1.0  # the request alone
    assert value(semconv.TOKENS, model="m", tenant="acme", type="input") == 300


@pytest.mark.parametrize("bad", list(_BAD), ids=list(_BAD))
def test_one_bad_record_costs_only_itself(bad: str, caplog) -> None:
    """FOLD_EVERY records with one bad among them, folded once: every other record reaches
    every series it feeds, none of the bad one's figures do (not even those before the bad
    value), and the failure is counted once and logged once."""
    registry = CollectorRegistry()
    fold = recording_for(registry, Settings()).fold
    good = FOLD_EVERY - 1
    caplog.set_level(logging.WARNING, logger="stagelens")
    for i in range(FOLD_EVERY):
        if i == 7:
            record = _record(**_BAD[bad]) if _BAD[bad] else cast("RequestRecord", ("m", "200"))
            fold.submit(record)
        else:
            fold.submit(_record())
    assert not fold._pending  # the FOLD_EVERY-th submit folded the batch, once

    def value(name: str, **labels: str) -> float | None:
        return _value(registry, name, **labels)

    assert value(semconv.REQUESTS, model="m", code="200") == good
    assert value(f"{semconv.REQUEST_DURATION}_count", model="m", code="200") == good
    assert value(f"{semconv.TIME_TO_FIRST_TOKEN}_count", model="m", prompt_size="unknown") == good
    assert value(f"{semconv.INTER_TOKEN_LATENCY}_count", model="m") == 3 * good
    for stage in ("gateway", "inference"):
        assert value(f"{semconv.STAGE_DURATION}_count", stage=stage, model="m") == good
    for phase in ("queue", "prefill", "decode"):
        assert value(f"{semconv.ENGINE_PHASE_DURATION}_count", phase=phase, model="m") == good
    assert value(semconv.TOKENS, model="m", tenant="acme", type="input") == 300 * good
    assert value(semconv.COST_USD, model="m", tenant="acme") == pytest.approx(0.0004 * good)
    assert value(semconv.TELEMETRY_ERRORS, component=semconv.COMPONENT_METRICS) == 1.0
    logged = [r for r in caplog.records if "recording request metrics failed" in r.message]
    assert len(logged) == 1


def test_a_series_that_fails_to_write_loses_only_its_share(monkeypatch) -> None:
    """Should prometheus-client fail writing one series of a batch, the other series of
    the same records are still written, and the failure is counted."""
    from stagelens.metrics.series import FastHistogram

    registry = CollectorRegistry()
    fold, instruments = recording_for(registry, Settings())
    broken = instruments.for_model("m").ttft("unknown")
    observe_many = FastHistogram.observe_many

    def failing(self: FastHistogram, values: list[float], exemplars: Any = None) -> None:
        if self is broken:
            raise OSError("no space left on device")
        observe_many(self, values, exemplars)

    monkeypatch.setattr(FastHistogram, "observe_many", failing)
    for _ in range(FOLD_EVERY):
        fold.submit(_record())
    ttft_count = f"{semconv.TIME_TO_FIRST_TOKEN}_count"
    assert _value(registry, ttft_count, model="m", prompt_size="unknown") in (None, 0.0)
    assert _value(registry, semconv.REQUESTS, model="m", code="200") == FOLD_EVERY
    assert _value(registry, f"{semconv.INTER_TOKEN_LATENCY}_count", model="m") == 3 * FOLD_EVERY
    assert _value(registry, semconv.COST_USD, model="m", tenant="acme") == pytest.approx(
        0.0004 * FOLD_EVERY
    )
    assert _value(registry, semconv.TELEMETRY_ERRORS, component="metrics") == 1.0


def test_bad_records_are_each_counted_and_logged_once(caplog) -> None:
    """Every bad record is counted, in any batch; the log line is written once."""
    registry = CollectorRegistry()
    fold = recording_for(registry, Settings()).fold
    caplog.set_level(logging.WARNING, logger="stagelens")
    for _ in range(2):
        for _ in range(3):
            fold.submit(_record(ttft="x"))
        fold.submit(_record())
        fold.fold()
    assert _value(registry, semconv.REQUESTS, model="m", code="200") == 2.0
    assert _value(registry, semconv.TELEMETRY_ERRORS, component="metrics") == 6.0
    assert sum("recording request metrics failed" in r.message for r in caplog.records) == 1


def test_stage_and_phase_timings_cannot_be_swapped_under_mypy(monkeypatch) -> None:
    """mypy accepts a record built right and rejects one with stage and engine-phase
    timings swapped, or with an untyped list of timings (they have distinct types)."""
    from pathlib import Path

    from mypy import api

    monkeypatch.chdir(Path(__file__).resolve().parents[1])
    code = "\n".join(
        (
            "from stagelens.metrics.record import PhaseTimes, RequestRecord, StageTimes",
            's = StageTimes([("gateway", 0.1)])',
            'p = PhaseTimes([("queue", 0.1)])',
            'RequestRecord("m", "200", 1.0, None, [], stages=s, phases=p, rejected_by=None,'
            " billing=None)",
            'RequestRecord("m", "200", 1.0, None, [], stages=p, phases=s, rejected_by=None,'
            " billing=None)",
            'RequestRecord("m", "200", 1.0, None, [], [("gateway", 0.1)], None, None, None)',
        )
    )
    out, _, _ = api.run(["--strict", "--follow-imports=silent", "--no-incremental", "-c", code])
    errors = [line for line in out.splitlines() if ": error:" in line]
    assert [line.split(":")[1] for line in errors] == ["5", "5", "6"], out
    assert 'expected "StageTimes"' in errors[0]
    assert 'expected "PhaseTimes | None"' in errors[1]


def test_the_failure_log_quotes_no_record_value(caplog, monkeypatch) -> None:
    """A failure whose message quotes a record's value (a model name a client sent, looked
    up in a dict) is logged by its type alone: the name never reaches the log."""
    registry = CollectorRegistry()
    fold, instruments = recording_for(registry, Settings())
    caplog.set_level(logging.WARNING, logger="stagelens")
    secret = "sk-live-DO-NOT-LOG"
    real = instruments.for_model

    def for_model(model: str) -> Any:
        if model == secret:
            raise KeyError(model)
        return real(model)

    monkeypatch.setattr(instruments, "for_model", for_model)
    for i in range(FOLD_EVERY):
        fold.submit(_record(model=secret) if i == 3 else _record())
    logged = [r.getMessage() for r in caplog.records if "request metrics" in r.getMessage()]
    assert len(logged) == 1
    assert "KeyError" in logged[0]
    assert "DO-NOT-LOG" not in logged[0]


_MODELS = st.sampled_from(["m", "n", "other"])
_SECONDS = st.floats(min_value=0.0, max_value=100.0, allow_nan=False)
_VERDICTS = st.lists(
    st.tuples(st.sampled_from(["availability", "ttft", "itl", "goodput", "answer"]), st.booleans()),
    max_size=5,
    unique_by=lambda verdict: verdict[0],
).map(tuple)
_RECORDS = st.builds(
    RequestRecord,
    model=_MODELS,
    code=st.sampled_from(["200", "429", "503"]),
    duration=_SECONDS,
    ttft=st.none() | _SECONDS,
    gaps=st.lists(_SECONDS, max_size=5),
    stages=st.lists(
        st.tuples(st.sampled_from(["gateway", "tokenizer", "inference", "billing"]), _SECONDS),
        max_size=5,
    ).map(StageTimes),
    phases=st.none()
    | st.lists(
        st.tuples(st.sampled_from(["queue", "prefill", "decode"]), _SECONDS), max_size=3
    ).map(PhaseTimes),
    rejected_by=st.none() | st.sampled_from(["gateway", "inference"]),
    billing=st.none()
    | st.builds(
        BillingRecord,
        tenant=st.sampled_from(["acme", "other"]),
        input_tokens=st.integers(0, 10_000),
        output_tokens=st.integers(0, 10_000),
        cached_input_tokens=st.integers(0, 10_000),
        cost_usd=st.floats(min_value=0.0, max_value=10.0),
        reasoning_tokens=st.integers(0, 10_000),
        cache_write_tokens=st.integers(0, 10_000),
        engine_seconds=st.none() | st.floats(min_value=0.0, max_value=100.0),
    ),
    upstream_ttft=st.none() | _SECONDS,
    verdicts=_VERDICTS,
    unmetered=st.none() | st.sampled_from(["estimated", "unbilled"]),
    exemplar=st.none() | st.builds(ExemplarRef, st.just(1), st.just(2), st.just(3.0)),
    ttfat=st.none() | _SECONDS,
    prompt_size=st.sampled_from(["1024", "+Inf", "unknown"]),
    trace_decision=st.none()
    | st.tuples(
        st.sampled_from([semconv.DECISION_KEPT, semconv.DECISION_DROPPED]),
        st.sampled_from([semconv.REASON_ERROR, semconv.REASON_RATIO, semconv.REASON_FINE]),
    ),
)


def _reference(records: list[RequestRecord]) -> CollectorRegistry:
    """What each record means, written through prometheus-client's public API one value at
    a time (no fold, no bound series): the yardstick a batch's fold must equal."""
    registry = CollectorRegistry()
    settings = Settings()

    def histogram(name: str, labels: list[str], buckets: tuple[float, ...]) -> Histogram:
        return Histogram(name, name, labels, buckets=buckets, registry=registry)

    def counter(name: str, labels: list[str]) -> Counter:
        return Counter(name, name, labels, registry=registry)

    ttft_bounds = buckets.ttft_buckets(settings.ttft_slo_threshold_seconds)
    duration = histogram(
        semconv.REQUEST_DURATION, ["model", "code"], buckets.REQUEST_DURATION_BUCKETS
    )
    ttft = histogram(semconv.TIME_TO_FIRST_TOKEN, ["model", "prompt_size"], ttft_bounds)
    whole = histogram(
        semconv.NON_STREAMED_RESPONSE, ["model", "prompt_size"], buckets.REQUEST_DURATION_BUCKETS
    )
    answer_bounds = buckets.answer_buckets(
        settings.ttft_slo_threshold_seconds, *dict(answer_classes(settings)).values()
    )
    ttfat = histogram(semconv.TIME_TO_FIRST_ANSWER_TOKEN, ["model"], answer_bounds)
    itl = histogram(semconv.INTER_TOKEN_LATENCY, ["model"], buckets.INTER_TOKEN_LATENCY_BUCKETS)
    stage = histogram(semconv.STAGE_DURATION, ["stage", "model"], buckets.STAGE_DURATION_BUCKETS)
    phase = histogram(
        semconv.ENGINE_PHASE_DURATION, ["phase", "model"], buckets.ENGINE_PHASE_BUCKETS
    )
    upstream = histogram(semconv.UPSTREAM_TTFT, ["model", "prompt_size"], ttft_bounds)
    requests = counter(semconv.REQUESTS, ["model", "code"])
    rejections = counter(semconv.REJECTIONS, ["stage", "model", "code"])
    unmetered = counter(semconv.UNMETERED_REQUESTS, ["model", "billing"])
    sli_requests = counter(semconv.SLI_REQUESTS, ["model", "sli", "prompt_size"])
    sli_errors = counter(semconv.SLI_ERRORS, ["model", "sli", "prompt_size"])
    tokens = counter(semconv.TOKENS, ["model", "tenant", "type"])
    cost = counter(semconv.COST_USD, ["model", "tenant"])
    engine = counter(semconv.ENGINE_SECONDS, ["model", "tenant"])
    decisions = counter(semconv.TRACE_DECISIONS, ["decision", "reason"])
    for r in records:
        if r.trace_decision is not None:
            decisions.labels(*r.trace_decision).inc()
        duration.labels(r.model, r.code).observe(r.duration)
        requests.labels(r.model, r.code).inc()
        if r.ttft is not None:  # a non-streamed answer's first byte is its whole answer
            (ttft if r.streamed else whole).labels(r.model, r.prompt_size).observe(r.ttft)
        if r.ttfat is not None and r.streamed:
            ttfat.labels(r.model).observe(r.ttfat)
        for gap in r.gaps:
            itl.labels(r.model).observe(gap)
        for name, seconds in r.stages:
            stage.labels(name, r.model).observe(seconds)
        for name, seconds in r.phases or ():
            phase.labels(name, r.model).observe(seconds)
        if r.upstream_ttft is not None:
            upstream.labels(r.model, r.prompt_size).observe(r.upstream_ttft)
        if r.rejected_by is not None:
            rejections.labels(r.rejected_by, r.model, r.code).inc()
        if r.unmetered is not None:
            unmetered.labels(r.model, r.unmetered).inc()
        for sli, bad in r.verdicts:
            sli_requests.labels(r.model, sli, r.prompt_size).inc()
            sli_errors.labels(r.model, sli, r.prompt_size).inc(1 if bad else 0)
        if r.billing is not None:
            b = r.billing
            tokens.labels(r.model, b.tenant, "input").inc(b.input_tokens)
            tokens.labels(r.model, b.tenant, "output").inc(b.output_tokens)
            tokens.labels(r.model, b.tenant, "cached_input").inc(b.cached_input_tokens)
            tokens.labels(r.model, b.tenant, "reasoning").inc(b.reasoning_tokens)
            tokens.labels(r.model, b.tenant, "cache_write").inc(b.cache_write_tokens)
            cost.labels(r.model, b.tenant).inc(b.cost_usd)
            if b.engine_seconds is not None:
                engine.labels(r.model, b.tenant).inc(b.engine_seconds)
    return registry


def _samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every stagelens counter and histogram sample (no created stamps)."""
    found: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for metric in registry.collect():
        if metric.type not in ("counter", "histogram"):  # the configured budgets: no fold's
            continue
        for sample in metric.samples:
            name = sample.name
            if name.startswith("stagelens_") and not name.endswith("_created"):
                found[(name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


@settings(max_examples=150, deadline=None)
@given(st.lists(_RECORDS, min_size=1, max_size=2 * FOLD_EVERY))
def test_a_fold_equals_each_value_observed_one_by_one(records: list[RequestRecord]) -> None:
    """However a batch mixes models, codes, tenants, stages, verdicts and sampled requests,
    folding it writes what observing each of its values through prometheus-client's public
    API writes: same series, same bucket counts, sums equal up to float rounding."""
    registry = CollectorRegistry()
    fold = recording_for(registry, Settings()).fold
    for record in records:
        fold.submit(record)
    fold.fold()
    got, want = _samples(registry), _samples(_reference(records))
    for key in got.keys() | want.keys():  # a series bound at 0 in one only: no matter
        assert got.get(key, 0.0) == pytest.approx(want.get(key, 0.0), rel=1e-9, abs=1e-9), key
