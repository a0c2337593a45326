"""Percentiles the report and the demo print: exact from spans where every request's spans
are at hand, otherwise read from histogram buckets with their error bound.

Why two sources: a histogram only says which bucket a request fell in, so any percentile
read from it can be off by up to the bucket's width, and Prometheus's
``histogram_quantile`` (linear interpolation inside the bucket) can print a p95 above the
slowest request it counted. The spans of the same requests give the exact value; where
they are not all there (sampled, evicted, another process), the bucket estimate below
comes with the bound it is guaranteed to keep.

"Exact" is the nearest-rank percentile: the smallest value at least ``q`` of the requests
took no more than. It is always a value some request took, so it never lies above the
slowest or below the fastest, and it is the value whose rank ``histogram_quantile``
searches for (``q * count``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Final, NamedTuple

from stagelens import semconv as sc
from stagelens.metrics.buckets import ERROR_TARGET as ERROR_TARGET  # the report keeps the target
from stagelens.views.traces import SpanRecord, group_by_trace

_RANK_SLACK: Final = 1e-9
"""Keeps ``0.95 * 80`` (76.00000000000001 in binary) at rank 76."""


class Estimate(NamedTuple):
    """A percentile and how far from the exact one it may be, as a fraction of it
    (0.0: exact; ``inf``: unbounded, a value in the open-ended last bucket)."""

    value: float
    error: float


def rank(q: float, count: float) -> int:
    """The 1-based rank of the nearest-rank ``q`` percentile among ``count`` values."""
    return max(1, math.ceil(q * count - _RANK_SLACK * count))


def nearest_rank(values: Sequence[float], q: float) -> float:
    """The exact (nearest-rank) ``q`` percentile of ``values``; NaN when there are none."""
    if not values:
        return math.nan
    return sorted(values)[rank(q, len(values)) - 1]


def in_bucket(lower: float, upper: float, interpolated: float) -> Estimate:
    """The value to print for a percentile known to lie in ``[lower, upper]``, and its bound.

    ``interpolated`` (``histogram_quantile``'s linear interpolation) is kept where it is
    within ``ERROR_TARGET`` of every value of the bucket; otherwise the nearest value that
    is, and where none is (a bucket wider than 1.22x) the value with the least worst-case
    error, ``2 * lower * upper / (lower + upper)`` (as DDSketch names its buckets)."""
    if upper <= lower:
        return Estimate(upper, 0.0)
    if lower <= 0:
        return Estimate(upper, math.inf) if upper > 0 else Estimate(upper, 0.0)
    low_ok = (1 - ERROR_TARGET) * upper
    high_ok = (1 + ERROR_TARGET) * lower
    if low_ok <= high_ok:
        value = min(max(interpolated, low_ok), high_ok)
    else:
        value = 2 * lower * upper / (lower + upper)
    return Estimate(value, max((value - lower) / lower, (upper - value) / upper))


def from_buckets(
    cumulative: Iterable[tuple[float, float]],
    q: float,
    lowest: float | None = None,
    highest: float | None = None,
) -> Estimate:
    """The ``q`` percentile of a histogram given as (upper bound, cumulative count) pairs
    (``+Inf`` last), narrowed to ``[lowest, highest]`` (the fastest and slowest values
    observed) where those are known; NaN when the histogram is empty."""
    pairs = sorted(cumulative)
    count = pairs[-1][1] if pairs else 0.0
    if count <= 0:
        return Estimate(math.nan, math.nan)
    wanted = rank(q, count)
    previous_bound, previous_count = 0.0, 0.0
    for bound, cumulative_count in pairs:
        if cumulative_count >= wanted:
            lower, upper = previous_bound, bound
            if lowest is not None and lowest > lower:
                lower = min(lowest, upper)
            if highest is not None and highest < upper:
                upper = max(highest, lower)
            if math.isinf(upper):
                return Estimate(lower, math.inf)
            width = cumulative_count - previous_count
            fraction = (wanted - previous_count) / width if width > 0 else 1.0
            return in_bucket(lower, upper, lower + (upper - lower) * fraction)
        previous_bound, previous_count = bound, cumulative_count
    return Estimate(previous_bound, math.inf)


def span_samples(spans: Iterable[SpanRecord]) -> dict[tuple[str, str], list[float]]:
    """Per-request figures in seconds from finished spans, keyed as ``stagelens report``
    keys its histograms: (metric name, stage or "").

    End to end is each trace's root span (the gateway's server span, which ends with the
    last byte sent); TTFT and the time to first answer token are the root's
    ``stagelens.time_to_first_token`` and ``stagelens.time_to_first_answer_token``; a
    stage is each span that names it in ``stagelens.stage`` and whose parent does not
    (the engine phases under the inference span carry its stage for colour, but are not
    inferences of their own)."""
    samples: dict[tuple[str, str], list[float]] = {}
    for trace in group_by_trace(spans).values():
        stage_of = {s.span_id: s.attributes.get(sc.ATTR_STAGE) for s in trace}
        for span in trace:
            stage = stage_of[span.span_id]
            if isinstance(stage, str) and stage_of.get(span.parent_span_id) != stage:
                samples.setdefault((sc.STAGE_DURATION, stage), []).append(span.duration_ns / 1e9)
            if span.parent_span_id in stage_of:
                continue
            samples.setdefault((sc.REQUEST_DURATION, ""), []).append(span.duration_ns / 1e9)
            for attribute, metric in (
                (sc.ATTR_TTFT, sc.TIME_TO_FIRST_TOKEN),
                (sc.ATTR_TTFAT, sc.TIME_TO_FIRST_ANSWER_TOKEN),
            ):
                value = span.attributes.get(attribute)
                if isinstance(value, int | float) and not isinstance(value, bool):
                    samples.setdefault((metric, ""), []).append(float(value))
    return samples
