"""Histogram bucket boundaries, one tuple per family: the single source of truth.

Why here: alert rules compare ``le`` buckets against SLO thresholds (the TTFT threshold must
be a bucket boundary), dashboards compute quantiles from them, and both the Prometheus and
the OTel histograms must agree. ``ttft_buckets(threshold)`` guarantees the configured
threshold is a boundary.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

STAGE_DURATION_BUCKETS: Final[tuple[float, ...]] = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.002,
    0.003,
    0.005,
    0.0075,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    0.8,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)
"""Per-stage time: sub-millisecond gateway work up to long inference calls."""

REQUEST_DURATION_BUCKETS: Final[tuple[float, ...]] = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    10.0,
    20.0,
    30.0,
    60.0,
    120.0,
)
"""End-to-end request time."""

TTFT_BUCKETS: Final[tuple[float, ...]] = (
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
    20.0,
    40.0,
    80.0,
)
"""Time to first token; 0.5 s (the default SLO threshold) is a boundary."""

INTER_TOKEN_LATENCY_BUCKETS: Final[tuple[float, ...]] = (
    0.0005,
    0.001,
    0.0025,
    0.005,
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
"""Gap between streamed tokens."""

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


def answer_buckets(ttft_threshold: float, answer_threshold: float) -> tuple[float, ...]:
    """Time-to-first-answer-token buckets: the TTFT buckets (so the two histograms read
    side by side, and are equal for a model that does not reason) with the answer SLO
    threshold a boundary too."""
    return with_boundary(ttft_buckets(ttft_threshold), answer_threshold)


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
