"""Every percentile the report prints is within 10 % of the exact one over the same
requests, never above the slowest and never below the fastest (issue 27).

The exact figures are computed here, by sorting, from an independent reading of the same
requests: the values the test itself drew and submitted (the client's side of the fold), or
the spans of requests served through the middleware. The printed figures are read back from
the text the report prints and from the HTML page, as a reader would read them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import re
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from prometheus_client import CollectorRegistry, generate_latest
from stagelens.instrumentation.asgi import StageLensMiddleware
from stagelens.reference.trace_receiver import decode_request

from stagelens import semconv, stage
from stagelens.cli import report as cli_report
from stagelens.cli.report import figure_spans
from stagelens.config import Settings
from stagelens.errors import TraceSourceError
from stagelens.metrics import buckets
from stagelens.metrics.record import RequestRecord, StageTimes
from stagelens.stages import DEFAULT_STAGE_BUDGETS_SECONDS
from stagelens.telemetry import recording_for
from stagelens.testing import capture_telemetry
from stagelens.views.percentiles import (
    ERROR_TARGET,
    from_buckets,
    in_bucket,
    nearest_rank,
    span_samples,
)
from stagelens.views.report import render_table, requests_counted
from stagelens.views.report_html import read_figures, render_page
from stagelens.views.traces import SpanRecord, to_otlp_json

Draw = Callable[[random.Random, float, float], float]


def _uniform(rng: random.Random, low: float, high: float) -> float:
    return rng.uniform(low, high)


def _lognormal(rng: random.Random, low: float, high: float) -> float:
    """Median at the range's geometric middle, a long right tail, clipped to the range."""
    value = rng.lognormvariate(math.log(math.sqrt(low * high)), 0.9)
    return min(high, max(low, value))


def _bimodal(rng: random.Random, low: float, high: float) -> float:
    """70 % fast near 2x the low end, 30 % slow near half the high end."""
    centre = low * 2 if rng.random() < 0.7 else high / 2
    return min(high, max(low, rng.gauss(centre, centre / 10)))


DISTRIBUTIONS: dict[str, Draw] = {"uniform": _uniform, "lognormal": _lognormal, "bimodal": _bimodal}
"""The latency shapes the issue names."""

TTFT = buckets.TTFT_RANGE
STAGE = (0.0001, 0.01)
"""The gateway stages' range the issue names."""
E2E = buckets.REQUEST_RANGE
ITL = buckets.INTER_TOKEN_LATENCY_RANGE
GAPS = 5
"""Inter-token gaps per request."""


def _table(text: str) -> dict[str, tuple[float, float, str]]:
    """Name -> (p50 s, p95 s, bound label) of each printed row with figures."""
    rows: dict[str, tuple[float, float, str]] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 5 or fields[0] in ("stage", "share"):
            continue
        name = fields[0]
        try:
            if name in ("TTFT", "end-to-end"):  # no budget column
                p50, p95, label = float(fields[1]), float(fields[2]), fields[-1]
            else:
                p50, p95, label = float(fields[2]), float(fields[3]), fields[-1]
        except ValueError:
            continue
        rows[name] = (p50 / 1000, p95 / 1000, label)
    return rows


def _page(html: str) -> dict[str, dict[float, float]]:
    """What the HTML page prints: the stage table's p50/p95 and the TTFT/ITL p50/p95/p99."""
    found: dict[str, dict[float, float]] = {}
    for name, p50, p95 in re.findall(
        r"</span>([\w-]+)</td><td>[^<]*</td><td>([\d,.]+)</td><td[^>]*>([\d,.]+)</td>", html
    ):
        found[name] = {0.5: float(p50.replace(",", "")) / 1000, 0.95: float(p95) / 1000}
    for title, marks in re.findall(r"<b>(TTFT|Inter-token latency)</b> <span[^>]*>([^<]*)", html):
        found[title] = {
            int(q) / 100: float(v.replace(",", "")) / 1000
            for q, v in re.findall(r"p(\d+) ([\d,.]+) ms", marks)
        }
    for p50, p95 in re.findall(
        r"<tr><th>end-to-end</th><th></th><th>([\d,.]+)</th><th>([\d,.]+)</th>", html
    ):
        found["end-to-end"] = {
            0.5: float(p50.replace(",", "")) / 1000,
            0.95: float(p95.replace(",", "")) / 1000,
        }
    return found


def _printed_resolution(value: float) -> float:
    """Half a unit in the last printed place (three decimals of ms below 1 ms, else two)."""
    return 0.0000005 if value < 0.001 else 0.000005


def _assert_close(
    printed: float, values: list[float], q: float, what: str, skew: float = 0.0
) -> None:
    """Within 10 % of the exact percentile, never above the slowest or below the fastest,
    up to the printed resolution and ``skew`` (two clocks reading one interval)."""
    exact = nearest_rank(values, q)
    slack = _printed_resolution(printed) + skew
    assert printed <= max(values) + slack, f"{what} p{q * 100:g} {printed} above the slowest"
    assert printed >= min(values) - slack, f"{what} p{q * 100:g} {printed} below the fastest"
    assert abs(printed - exact) <= ERROR_TARGET * exact + slack, (
        f"{what} p{q * 100:g}: printed {printed}, exact {exact}"
    )


def _requests(draw: Draw, n: int, seed: int) -> Iterator[RequestRecord]:
    rng = random.Random(seed)
    for _ in range(n):
        yield RequestRecord(
            model="m",
            code="200",
            duration=draw(rng, *E2E),
            ttft=draw(rng, *TTFT),
            gaps=[draw(rng, *ITL) for _ in range(GAPS)],
            stages=StageTimes([("tokenizer", draw(rng, *STAGE)), ("router", draw(rng, *STAGE))]),
            phases=None,
            rejected_by=None,
            billing=None,
        )


class TestPrintedAgainstTheRequests:
    """Bucket figures (no spans at hand) against the values the requests took."""

    @pytest.mark.parametrize("n", [80, 1000])
    @pytest.mark.parametrize("shape", sorted(DISTRIBUTIONS))
    def test_text_and_html_are_within_ten_percent_and_inside_min_max(self, shape, n) -> None:
        """Each printed p50/p95 (text table) and p50/p95/p99 (HTML page) is within 10 % of
        the exact nearest-rank percentile of the same requests, never above the slowest and
        never below the fastest, and says it was read from buckets."""
        records = list(_requests(DISTRIBUTIONS[shape], n, seed=n))
        registry = CollectorRegistry()
        fold = recording_for(registry, Settings()).fold
        for record in records:
            fold.submit(record)
        text = generate_latest(registry).decode()
        truth = {
            "end-to-end": [r.duration for r in records],
            "TTFT": [r.ttft for r in records if r.ttft is not None],
            "tokenizer": [r.stages[0][1] for r in records],
            "router": [r.stages[1][1] for r in records],
            "Inter-token latency": [g for r in records for g in r.gaps],
        }
        table = _table(render_table(text))
        assert set(table) == {"end-to-end", "TTFT", "tokenizer", "router"}
        for name, (p50, p95, label) in table.items():
            assert re.fullmatch(r"±\d+%", label), (name, label)
            assert int(label[1:-1]) <= 10, (name, label)
            _assert_close(p50, truth[name], 0.5, f"{shape} {name}")
            _assert_close(p95, truth[name], 0.95, f"{shape} {name}")
        page = _page(render_page(read_figures(text), None, metrics_source="t", trace_note=""))
        assert {"end-to-end", "TTFT", "tokenizer", "router", "Inter-token latency"} <= set(page)
        for name, figures in page.items():
            if name in truth:
                for q, printed in figures.items():
                    _assert_close(printed, truth[name], q, f"{shape} html {name}")

    def test_the_issue_case_no_longer_prints_a_p95_above_the_slowest(self) -> None:
        """80 first tokens after 100-190 ms and one at 198.4 ms: histogram_quantile on the
        former buckets said 242.5 ms; the report now prints a p95 under 198.4 ms."""
        rng = random.Random(27)
        values = [rng.uniform(0.1, 0.19) for _ in range(79)] + [0.1984]
        registry = CollectorRegistry()
        fold = recording_for(registry, Settings()).fold
        for value in values:
            fold.submit(next(_requests(_uniform, 1, 0))._replace(ttft=value))
        p50, p95, _ = _table(render_table(generate_latest(registry).decode()))["TTFT"]
        assert p95 <= 0.1984
        _assert_close(p95, values, 0.95, "TTFT")
        _assert_close(p50, values, 0.5, "TTFT")


class TestBucketEstimate:
    """The estimator's guarantee on any values, on every family's bounds."""

    @settings(max_examples=300, deadline=None)
    @given(
        family=st.sampled_from(
            [
                (buckets.TTFT_BUCKETS, TTFT),
                (buckets.STAGE_DURATION_BUCKETS, buckets.STAGE_RANGE),
                (buckets.REQUEST_DURATION_BUCKETS, E2E),
                (buckets.INTER_TOKEN_LATENCY_BUCKETS, ITL),
            ]
        ),
        fractions=st.lists(st.floats(0, 1), min_size=1, max_size=200),
        q=st.sampled_from([0.5, 0.9, 0.95, 0.99, 0.999, 1.0, 0.01]),
    )
    def test_any_values_in_range_are_named_within_their_bound(self, family, fractions, q):
        """Whatever the values in a family's range, the estimate lies between the fastest
        and the slowest, within its stated bound of the exact percentile, and that bound is
        at most 10 %."""
        bounds, (low, high) = family
        values = [low * (high / low) ** f for f in fractions]
        cumulative = [(b, float(sum(v <= b for v in values))) for b in bounds]
        cumulative.append((math.inf, float(len(values))))
        estimate = from_buckets(cumulative, q, min(values), max(values))
        exact = nearest_rank(values, q)
        assert min(values) <= estimate.value <= max(values)
        assert estimate.error <= ERROR_TARGET + 1e-12
        assert abs(estimate.value - exact) <= estimate.error * exact * (1 + 1e-9) + 1e-15

    @given(st.floats(1e-6, 1e3), st.floats(1.0, 5.0), st.floats(0, 1), st.floats(0, 1))
    def test_the_stated_bound_holds_for_any_value_of_the_bucket(self, lower, ratio, f, g):
        """For a bucket of any width, every value in it is within the stated bound of the
        value printed for it; the bound is at most 10 % where the bucket is 1.22x or less."""
        upper = lower * ratio
        estimate = in_bucket(lower, upper, lower + (upper - lower) * f)
        x = lower + (upper - lower) * g
        assert abs(estimate.value - x) <= estimate.error * x * (1 + 1e-9) + 1e-15
        if ratio <= (1 + ERROR_TARGET) / (1 - ERROR_TARGET):
            assert estimate.error <= ERROR_TARGET + 1e-12

    def test_an_empty_histogram_names_nothing(self) -> None:
        """No requests: NaN, not a number made up."""
        assert math.isnan(from_buckets([(0.1, 0.0), (math.inf, 0.0)], 0.95).value)


class TestBucketLayout:
    """The bounds keep the guarantee and everything that named a bound before."""

    FORMER_TTFT = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0)
    FORMER_TTFT += (2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)

    @pytest.mark.parametrize(
        ("bounds", "working"),
        [
            (buckets.TTFT_BUCKETS, buckets.TTFT_RANGE),
            (buckets.STAGE_DURATION_BUCKETS, buckets.STAGE_RANGE),
            (buckets.REQUEST_DURATION_BUCKETS, buckets.REQUEST_RANGE),
            (buckets.INTER_TOKEN_LATENCY_BUCKETS, buckets.INTER_TOKEN_LATENCY_RANGE),
        ],
    )
    def test_neighbours_are_at_most_1_2x_apart_over_the_working_range(self, bounds, working):
        """Within each range the issue names, no bucket is wider than 1.2x (the estimate's
        10 % needs 1.22x at most), and the bounds are sorted and distinct."""
        assert list(bounds) == sorted(set(bounds))
        assert buckets.worst_ratio(bounds, *working) <= buckets.MAX_BUCKET_RATIO
        assert bounds[0] <= working[0]
        assert bounds[-1] >= working[1]

    def test_thresholds_budgets_and_former_bounds_stay_bounds(self) -> None:
        """The SLO thresholds (TTFT 0.5/1/2.5/5 s, ITL 0.1 s), every default stage budget
        and every former TTFT bound (vLLM's up to 80 s, so le="..." queries still read the
        same) are bounds."""
        assert {0.5, 1.0, 2.5, 5.0} <= set(buckets.TTFT_BUCKETS)
        assert set(self.FORMER_TTFT) <= set(buckets.TTFT_BUCKETS)
        assert 0.1 in buckets.INTER_TOKEN_LATENCY_BUCKETS
        assert set(DEFAULT_STAGE_BUDGETS_SECONDS.values()) <= set(buckets.STAGE_DURATION_BUCKETS)

    def test_a_ladder_refuses_a_range_it_cannot_fill(self) -> None:
        """A ratio of 1 or less would never end; an empty range is a mistake."""
        with pytest.raises(ValueError, match="ratio > 1"):
            buckets.ladder((0.1, 1.0), 0.1, 1.0, ratio=1.0)
        with pytest.raises(ValueError, match="low < high"):
            buckets.ladder((0.1, 1.0), 1.0, 0.1)


def _scope() -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/work",
        "raw_path": b"/v1/work",
        "query_string": b"",
        "headers": [],
        "client": ("127.0.0.1", 5000),
        "server": ("127.0.0.1", 8080),
    }


def _records(spans: list[Any]) -> list[SpanRecord]:
    """The spans as the demo's receiver reads them: encoded as OTLP, decoded again."""
    return decode_request(encode_spans(spans).SerializeToString())


def _serve(shape: str, n: int = 60) -> tuple[str, list[SpanRecord]]:
    """``n`` requests through the middleware, each spending a drawn 10-50 ms in the
    tokenizer stage: the exposition text and the spans (through OTLP and back)."""
    rng = random.Random(shape)
    waits = [DISTRIBUTIONS[shape](rng, 0.01, 0.05) for _ in range(n)]

    async def app(scope: Any, receive: Any, send: Any) -> None:
        with stage("tokenizer"):
            time.sleep(waits.pop())
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Any) -> None:
        pass

    with capture_telemetry() as cap:
        middleware = StageLensMiddleware(app, telemetry=cap.telemetry)
        for _ in range(n):
            asyncio.run(middleware(_scope(), receive, send))
        return generate_latest(cap.registry).decode(), _records(cap.spans())


def _by_span(spans: list[SpanRecord]) -> dict[str, list[float]]:
    """Seconds per request, read from the spans: the tokenizer stage and end to end."""
    named = [s for s in spans if s.attributes.get(semconv.ATTR_STAGE) == "tokenizer"]
    return {
        "tokenizer": [s.duration_ns / 1e9 for s in named],
        "end-to-end": [s.duration_ns / 1e9 for s in spans if not s.parent_span_id],
    }


class TestServedRequests:
    """Requests served through the middleware, exact figures taken from their spans."""

    @pytest.mark.parametrize("shape", sorted(DISTRIBUTIONS))
    def test_with_every_span_the_table_prints_the_exact_percentiles(self, shape) -> None:
        """With the spans of every request at hand the table prints the spans' own
        nearest-rank p50 and p95, labelled exact."""
        text, spans = _serve(shape)
        truth = _by_span(spans)
        assert len(truth["tokenizer"]) == len(truth["end-to-end"]) == 60
        table = _table(render_table(text, spans))
        for name, values in truth.items():
            p50, p95, label = table[name]
            assert label == "exact"
            for printed, q in ((p50, 0.5), (p95, 0.95)):
                exact = nearest_rank(values, q)
                assert printed == pytest.approx(exact, abs=_printed_resolution(exact))

    @pytest.mark.parametrize("shape", sorted(DISTRIBUTIONS))
    def test_without_spans_the_bucket_figures_agree_with_the_spans(self, shape) -> None:
        """Without the spans the bucket figures are within 10 % of the spans' exact
        percentiles and inside their fastest and slowest. A stage's span opens just before
        its timer starts and ends just after it stops (20 us allowed); a run where the
        machine stalled inside that window (a span some ms longer) is run again, twice
        at most."""
        failure = ""
        for _ in range(3):
            text, spans = _serve(shape)
            table = _table(render_table(text))
            try:
                for name, values in _by_span(spans).items():
                    p50, p95, label = table[name]
                    assert label != "exact"
                    for printed, q in ((p50, 0.5), (p95, 0.95)):
                        _assert_close(printed, values, q, f"{shape} {name}", skew=2e-5)
            except AssertionError as exc:
                failure = str(exc)
                continue
            return
        pytest.fail(failure)


class TestTraceSourceChoice:
    """Where ``stagelens report`` takes the spans for exact figures from."""

    @staticmethod
    def _args(**given: Any) -> argparse.Namespace:
        return argparse.Namespace(**{"traces": None, "trace_file": None, **given})

    def test_a_trace_file_gives_exact_figures(self, tmp_path: Path) -> None:
        """Spans saved as OTLP/JSON make the printed table exact, as the live source does."""
        text, spans = _serve("uniform", n=12)
        path = tmp_path / "spans.json"
        path.write_text(json.dumps(to_otlp_json(spans)))
        loaded = figure_spans(self._args(trace_file=path), requests_counted(text))
        assert requests_counted(text) == 12
        assert _table(render_table(text, loaded))["end-to-end"][2] == "exact"

    def test_no_demo_running_falls_back_to_buckets(self, monkeypatch) -> None:
        """The demo's receiver not answering is no error: the figures come from buckets."""
        monkeypatch.setattr(cli_report, "DEFAULT_TRACE_SOURCE", f"http://127.0.0.1:{_port()}")
        assert figure_spans(self._args(), 5) == []

    def test_a_named_source_that_fails_is_an_error(self) -> None:
        """A source the user named that does not answer is reported, not ignored."""
        with pytest.raises(TraceSourceError):
            figure_spans(self._args(traces=f"http://127.0.0.1:{_port()}"), 5)


def _port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class TestSpanSamples:
    """Which spans give a request's exact figure."""

    def test_engine_phases_are_not_inferences_and_the_answer_token_is_read(self) -> None:
        """An inference span with engine-phase children (which carry its stage for colour)
        is one inference; the root's time to first answer token is a sample like TTFT."""

        def span(sid: str, parent: str, start: int, end: int, **attrs: Any) -> SpanRecord:
            return SpanRecord("t" * 32, sid, parent, sid, start, end, attributes=attrs)

        stage = semconv.ATTR_STAGE
        spans = [
            span("root", "", 0, 900, **{semconv.ATTR_TTFT: 0.2, semconv.ATTR_TTFAT: 0.5}),
            span("inf", "root", 100, 800, **{stage: "inference"}),
            span("queue", "inf", 100, 150, **{stage: "inference"}),
            span("decode", "inf", 150, 800, **{stage: "inference"}),
            span("tok", "root", 10, 90, **{stage: "tokenizer"}),
        ]
        samples = span_samples(spans)
        assert samples[(semconv.STAGE_DURATION, "inference")] == [700e-9]
        assert samples[(semconv.STAGE_DURATION, "tokenizer")] == [80e-9]
        assert samples[(semconv.REQUEST_DURATION, "")] == [900e-9]
        assert samples[(semconv.TIME_TO_FIRST_TOKEN, "")] == [0.2]
        assert samples[(semconv.TIME_TO_FIRST_ANSWER_TOKEN, "")] == [0.5]
