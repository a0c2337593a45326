"""Spans as plain data: OTLP/JSON in and out, and the waterfall's rows and bars."""

from __future__ import annotations

import contextlib
import json
import math
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stagelens import semconv
from stagelens.errors import TraceSourceError
from stagelens.views.traces import (
    SpanRecord,
    from_otlp_json,
    load_trace_file,
    normalize_trace_id,
    slowest,
    summarize,
    to_otlp_json,
)
from stagelens.views.waterfall import bar_cells, build, format_ms, render_text

TRACE = "0af7651916cd43dd8448eb211c80319c"


def _span(span_id: int, parent: int | None, name: str, start: int, end: int, **attrs) -> SpanRecord:
    return SpanRecord(
        trace_id=TRACE,
        span_id=f"{span_id:016x}",
        parent_span_id="" if parent is None else f"{parent:016x}",
        name=name,
        start_ns=start,
        end_ns=end,
        attributes=attrs,
        service="stagelens-gateway",
    )


SPANS = [
    _span(1, None, "POST /v1/chat/completions", 1_000_000_000, 1_400_000_000),
    _span(2, 1, "gateway", 1_000_100_000, 1_000_500_000, **{semconv.ATTR_STAGE: "gateway"}),
    _span(
        3,
        1,
        "chat tiny",
        1_002_000_000,
        1_390_000_000,
        **{semconv.ATTR_STAGE: "inference", semconv.GEN_AI_USAGE_OUTPUT_TOKENS: 32},
    ),
    _span(5, 3, "prefill", 1_010_000_000, 1_050_000_000),
    _span(4, 3, "queue", 1_002_500_000, 1_010_000_000),
    _span(6, 3, "decode", 1_050_000_000, 1_389_999_999),
]


class TestOtlpJson:
    """OTLP/JSON as the receiver answers and files hold it."""

    def test_round_trip_keeps_every_field(self) -> None:
        """Spans written as OTLP/JSON read back equal, ids hex and times as strings."""
        document = json.loads(json.dumps(to_otlp_json(SPANS)))
        span = document["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
        assert span["traceId"] == TRACE
        assert span["startTimeUnixNano"] == "1000000000"
        assert from_otlp_json(document) == SPANS

    def test_numbers_may_be_json_numbers(self) -> None:
        """64-bit integers are read from JSON numbers as well as from strings."""
        document = to_otlp_json(SPANS[:1])
        raw = document["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
        raw["startTimeUnixNano"] = 5
        raw["endTimeUnixNano"] = 9
        (span,) = from_otlp_json(document)
        assert (span.start_ns, span.end_ns) == (5, 9)

    @settings(max_examples=300, deadline=None)
    @given(
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
            lambda inner: (
                st.lists(inner, max_size=4)
                | st.dictionaries(
                    st.sampled_from(
                        [
                            "resourceSpans",
                            "scopeSpans",
                            "spans",
                            "traceId",
                            "spanId",
                            "attributes",
                            "key",
                            "value",
                            "intValue",
                            "arrayValue",
                            "values",
                            "status",
                            "code",
                            "startTimeUnixNano",
                            "resource",
                            "name",
                            "stringValue",
                            "doubleValue",
                        ]
                    ),
                    inner,
                    max_size=5,
                )
            ),
            max_leaves=30,
        )
    )
    def test_malformed_json_raises_only_trace_source_error(self, document) -> None:
        """Untrusted JSON: any shape either parses or raises TraceSourceError."""
        with contextlib.suppress(TraceSourceError):
            from_otlp_json(document)

    def test_file_of_json_lines(self, tmp_path) -> None:
        """A file with one OTLP/JSON document per line is read whole."""
        path = tmp_path / "spans.jsonl"
        path.write_text(
            json.dumps(to_otlp_json(SPANS[:2])) + "\n\n" + json.dumps(to_otlp_json(SPANS[2:]))
        )
        assert load_trace_file(path) == SPANS
        path.write_text("{not json")
        with pytest.raises(TraceSourceError):
            load_trace_file(path)

    def test_trace_ids_are_normalized(self) -> None:
        """Upper case and short W3C ids are accepted; anything else is refused."""
        assert normalize_trace_id(TRACE.upper()) == TRACE
        assert normalize_trace_id("abc") == "0" * 29 + "abc"
        for bad in ("", "xyz", "1" * 33, "12 34"):
            with pytest.raises(TraceSourceError):
                normalize_trace_id(bad)


class TestWaterfall:
    """Rows of one trace: depth first, children by start, bars from nanoseconds."""

    def test_rows_are_depth_first_in_start_order(self) -> None:
        """The root, then each child and its own children before the next sibling."""
        waterfall = build(list(reversed(SPANS)))
        assert [r.label for r in waterfall.rows] == [
            "POST /v1/chat/completions",
            "  gateway",
            "  inference (chat tiny)",
            "    queue",
            "    prefill",
            "    decode",
        ]
        assert waterfall.total_ns == 400_000_000
        assert waterfall.rows[3].start_ns == 2_500_000

    def test_text_shows_exact_microseconds(self) -> None:
        """Start, end and duration are printed from the nanoseconds, rounded to the µs."""
        text = render_text(build(SPANS), width=40)
        decode = next(line for line in text.splitlines() if line.strip().startswith("decode"))
        assert decode.split()[1:4] == ["50.000", "390.000", "340.000"]
        assert format_ms(389_999_999 - 50_000_000) == "340.000"
        assert format_ms(1_499) == "0.001"
        assert format_ms(1_500) == "0.002"
        inference = next(line for line in text.splitlines() if "inference" in line)
        assert inference.endswith("32 out")

    def test_orphans_and_cycles_are_rows_not_hangs(self) -> None:
        """A span whose parent never arrived is a root; spans in a parent cycle still show."""
        spans = [_span(7, 8, "a", 0, 10), _span(8, 7, "b", 5, 20), _span(9, 99, "c", 1, 2)]
        rows = build(spans).rows
        assert [(r.span.name, r.depth) for r in rows] == [("c", 0), ("a", 0), ("b", 1)]
        spans = [*SPANS[1:]]  # the root missing: its children are roots
        assert [r.depth for r in build(spans).rows][:2] == [0, 0]

    def test_a_root_that_reasoned_shows_thinking_and_answer_apart(self) -> None:
        """First token at 100 ms, first answer token at 300 ms: a ``thinking`` row from 100
        to 300 ms and an ``answer`` row from 300 ms to the end, under the root; a root
        whose two times are equal (no thinking) gets neither."""
        times = {semconv.ATTR_TTFT: 0.1, semconv.ATTR_TTFAT: 0.3}
        root = _span(1, None, "POST /v1/chat/completions", 1_000_000_000, 1_400_000_000, **times)
        rows = build([root, *SPANS[1:]]).rows
        phases = [
            (r.label, r.start_ns, r.end_ns) for r in rows if r.span.name in ("thinking", "answer")
        ]
        assert phases == [
            ("  thinking", 100_000_000, 300_000_000),
            ("  answer", 300_000_000, 400_000_000),
        ]
        same = _span(
            1,
            None,
            "POST /v1/chat/completions",
            1_000_000_000,
            1_400_000_000,
            **{semconv.ATTR_TTFT: 0.1, semconv.ATTR_TTFAT: 0.1},
        )
        assert len(build([same, *SPANS[1:]]).rows) == len(SPANS)
        assert len(build(SPANS).rows) == len(SPANS)

    @settings(max_examples=500, deadline=None)
    @given(
        st.integers(1, 10**12),
        st.integers(0, 10**12),
        st.integers(0, 10**12),
        st.integers(1, 200),
    )
    def test_bar_cells_cover_the_span(self, total, a, b, width) -> None:
        """The bar's cells are the ones the span's start and end fall in, at least one."""
        start, end = sorted((a % (total + 1), b % (total + 1)))
        first, last = bar_cells(start, end, total, width)
        assert 0 <= first < last <= width
        assert first == min(width - 1, math.floor(Fraction(start * width, total)))
        assert last == max(first + 1, min(width, math.ceil(Fraction(end * width, total))))


class TestSummaries:
    """Which trace is the slowest."""

    def test_slowest_trace_by_extent(self) -> None:
        """The longest trace from first start to last end wins, whatever its root says."""
        other = [
            SpanRecord("1" * 32, "1" * 16, "", "short root", 0, 10),
            SpanRecord("1" * 32, "2" * 16, "1" * 16, "late child", 5, 500_000_000),
        ]
        assert slowest([*SPANS, *other])[0].trace_id == "1" * 32
        assert summarize(other).name == "short root"
        assert summarize(other).duration_ns == 500_000_000
        assert slowest([]) == []
