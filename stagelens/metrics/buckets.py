"""Histogram bucket boundaries, one tuple per family: the single source of truth.

Why here: alert rules compare ``le`` buckets against SLO thresholds (the TTFT threshold must
be a bucket boundary), dashboards compute quantiles from them, and both the Prometheus and
the OTel histograms must agree. ``ttft_buckets(threshold)`` guarantees the configured
threshold is a boundary.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable
from typing import Final

MAX_BUCKET_RATIO: Final = 1.2
"""The largest ratio of two neighbouring bounds inside each family's working range.

Why 1.2: a value known only to lie in a bucket ``[a, b]`` can be named within a relative
error of ``(b - a) / (b + a)`` of any value there (``stagelens.views.percentiles``), 9.1 % at
1.2, so every percentile ``stagelens report`` reads from buckets is within 10 %. Prometheus's
``histogram_quantile`` interpolates linearly instead: at most ``b / a - 1`` (20 %) off when
the requests bunch at one edge of a bucket, a few percent on spread-out latencies
(``benchmarks/percentile_accuracy.py``; ``docs/percentiles.md``)."""


ERROR_TARGET: Final = 0.10
"""The relative error every percentile stagelens prints or draws keeps inside a family's
working range: a value read from buckets is placed where every value of its bucket is
within this of it (``stagelens.views.percentiles.in_bucket``, and the dashboards' panels,
``stagelens.dashboards.common.quantile``), which a bucket at most 1.22x wide allows."""


def ladder(
    edges: Iterable[float], low: float, high: float, ratio: float = MAX_BUCKET_RATIO
) -> tuple[float, ...]:
    """``edges`` with bounds added between ``low`` and ``high`` until no two neighbours
    there are more than ``ratio`` apart.

    Why keep every edge given: they are the bounds users' queries and the SLO rules name
    (``le="0.5"``, the stage budgets, the vLLM-shared bounds), so each stays a bound and
    each such query reads what it read before. The added bounds are geometric between two
    given ones, rounded to three significant digits (readable ``le`` labels) with enough
    one more bound where the rounding would break ``ratio``."""
    if not ratio > 1 or not 0 < low < high:
        raise ValueError(f"ladder needs ratio > 1 and 0 < low < high, got {ratio}, {low}, {high}")
    bounds = {float(e) for e in edges} | {float(low), float(high)}
    given = sorted(bounds)
    for a, b in itertools.pairwise(given):
        if b <= low or a >= high:
            continue
        parts = math.ceil(math.log(b / a) / math.log(ratio))
        while True:
            added = [float(f"{a * (b / a) ** (i / parts):.3g}") for i in range(1, parts)]
            steps = [a, *added, b]
            if all(y / x <= ratio for x, y in itertools.pairwise(steps)):
                break
            parts += 1
        bounds.update(added)
    return tuple(sorted(bounds))


def worst_ratio(bounds: Iterable[float], low: float, high: float) -> float:
    """The largest ratio of two neighbouring ``bounds`` between ``low`` and ``high``."""
    ordered = sorted(bounds)
    return max(b / a for a, b in itertools.pairwise(ordered) if low <= a < high)


STAGE_RANGE: Final = (0.0001, 10.0)
"""Seconds: the gateway's own stages take 0.1 to 10 ms, inference up to seconds."""
REQUEST_RANGE: Final = (0.01, 60.0)
"""Seconds: end to end, an error or a short answer (10 ms) to a long streamed one."""
TTFT_RANGE: Final = (0.02, 2.5)
"""Seconds: first tokens from 20 ms (cached prefix, small model) to 2 s, up to the 2.5 s
SLO bound."""
INTER_TOKEN_LATENCY_RANGE: Final = (0.0025, 0.5)
"""Seconds: decode steps of a few ms on a GPU to hundreds of ms on a loaded CPU."""

STAGE_DURATION_BUCKETS: Final[tuple[float, ...]] = ladder(
    (
        0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.025, 0.05,
        0.1, 0.25, 0.5, 0.8, 1.0, 2.5, 5.0, 10.0, 30.0,
    ),
    *STAGE_RANGE,
)  # fmt: skip
"""Per-stage time: every stage budget (gateway 5 ms ... inference 0.8 s) is a bound."""

REQUEST_DURATION_BUCKETS: Final[tuple[float, ...]] = ladder(
    (
        0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0,
        20.0, 30.0, 60.0, 120.0,
    ),
    *REQUEST_RANGE,
)  # fmt: skip
"""End-to-end request time."""

TTFT_BUCKETS: Final[tuple[float, ...]] = ladder(
    (
        0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
        7.5, 10.0, 20.0, 40.0, 80.0,
    ),
    *TTFT_RANGE,
)  # fmt: skip
"""Time to first token (and to the first answer token): the SLO thresholds 0.5, 1, 2.5
and 5 s are bounds, and so is every bound vLLM's own TTFT histogram has up to 80 s."""

INTER_TOKEN_LATENCY_BUCKETS: Final[tuple[float, ...]] = ladder(
    (
        0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4,
        0.5, 0.75, 1.0, 2.5,
    ),
    *INTER_TOKEN_LATENCY_RANGE,
)  # fmt: skip
"""Gap between streamed tokens; the ITL SLO threshold 0.1 s is a bound."""

ENGINE_PHASE_BUCKETS: Final[tuple[float, ...]] = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)
"""Engine queue, prefill and decode times."""


def with_boundary(buckets: Iterable[float], boundary: float) -> tuple[float, ...]:
    """Return ``buckets`` sorted, with ``boundary`` inserted when it is not already one."""
    if boundary <= 0:
        raise ValueError(f"bucket boundary must be > 0, got {boundary!r}")
    return tuple(sorted(set(buckets) | {float(boundary)}))


def ttft_buckets(threshold_seconds: float) -> tuple[float, ...]:
    """TTFT buckets that contain the SLO threshold as a boundary (alerts rely on it)."""
    return with_boundary(TTFT_BUCKETS, threshold_seconds)


def answer_buckets(ttft_threshold: float, *answer_thresholds: float) -> tuple[float, ...]:
    """Time-to-first-answer-token buckets: the TTFT buckets (so the two histograms read
    side by side, and are equal for a model that does not reason) with each answer SLO
    threshold (one per prompt-size class) a boundary too."""
    bounds = ttft_buckets(ttft_threshold)
    for threshold in answer_thresholds:
        bounds = with_boundary(bounds, threshold)
    return bounds


# The GenAI semantic conventions' explicit bucket advice (v1.41.0,
# open-telemetry/semantic-conventions docs/gen-ai/gen-ai-metrics.md, "This metric SHOULD be
# specified with [ExplicitBucketBoundaries] of ..."), passed to ``create_histogram`` as
# ``explicit_bucket_boundaries_advisory`` by ``exporters/genai_metrics.py``. Unchanged since
# v1.36.0, so the same under either ``OTEL_SEMCONV_STABILITY_OPT_IN`` mode.
GEN_AI_SERVER_REQUEST_DURATION_BUCKETS: Final[tuple[float, ...]] = (
    0.01,
    0.02,
    0.04,
    0.08,
    0.16,
    0.32,
    0.64,
    1.28,
    2.56,
    5.12,
    10.24,
    20.48,
    40.96,
    81.92,
)
"""``gen_ai.server.request.duration`` (seconds): the semconv's advice, doubling from 10 ms."""

GEN_AI_SERVER_TIME_PER_OUTPUT_TOKEN_BUCKETS: Final[tuple[float, ...]] = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
)
"""``gen_ai.server.time_per_output_token`` (seconds): the semconv's advice."""

GEN_AI_SERVER_TIME_TO_FIRST_TOKEN_BUCKETS: Final[tuple[float, ...]] = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
)
"""``gen_ai.server.time_to_first_token`` (seconds): the semconv's advice."""

GEN_AI_CLIENT_TOKEN_USAGE_BUCKETS: Final[tuple[int, ...]] = (
    1,
    4,
    16,
    64,
    256,
    1024,
    4096,
    16384,
    65536,
    262144,
    1048576,
    4194304,
    16777216,
    67108864,
)
"""``gen_ai.client.token.usage`` (tokens): the semconv's advice, powers of 4 from 1."""
