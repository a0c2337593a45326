"""The per-stage latency table of any instrumented service, read from its ``/metrics``
exposition text (``stagelens report``; the page for a ticket is ``report_html``).

Why from ``/metrics`` and not traces: it works against any running service with no
collector, and the quantiles are computed exactly as Prometheus's ``histogram_quantile``
does (linear interpolation inside the bucket), so the table agrees with the dashboards.
"""

from __future__ import annotations

import math
import urllib.request
from collections import defaultdict
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from stagelens import semconv as sc
from stagelens.stages import STAGE_ORDER


@dataclass
class Histogram:
    """Cumulative buckets (upper bound -> count), sum and count, summed over labels."""

    buckets: dict[float, float]
    total: float = 0.0
    count: float = 0.0

    def quantile(self, q: float) -> float:
        """``histogram_quantile(q)``: linear interpolation within the bucket."""
        if self.count <= 0:
            return math.nan
        rank = q * self.count
        previous_bound, previous_count = 0.0, 0.0
        for bound in sorted(self.buckets):
            count = self.buckets[bound]
            if count >= rank:
                if math.isinf(bound):
                    return previous_bound
                width = count - previous_count
                fraction = (rank - previous_count) / width if width > 0 else 0.0
                return previous_bound + (bound - previous_bound) * fraction
            previous_bound, previous_count = bound, count
        return previous_bound

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else math.nan


def parse_metrics(text: str) -> tuple[dict[tuple[str, str], Histogram], dict[str, float]]:
    """Histograms by (metric, stage-or-empty) and stage budgets from exposition text."""
    hists: dict[tuple[str, str], Histogram] = defaultdict(lambda: Histogram({}))
    budgets: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name, labels, value = sample.name, sample.labels, sample.value
            if family.name == sc.STAGE_BUDGET:
                budgets[labels.get(sc.LABEL_STAGE, "")] = value
                continue
            if family.name not in (sc.STAGE_DURATION, sc.REQUEST_DURATION, sc.TIME_TO_FIRST_TOKEN):
                continue
            key = (family.name, labels.get(sc.LABEL_STAGE, ""))
            hist = hists[key]
            if name.endswith("_bucket"):
                bound = float(labels["le"])
                hist.buckets[bound] = hist.buckets.get(bound, 0.0) + value
            elif name.endswith("_sum"):
                hist.total += value
            elif name.endswith("_count"):
                hist.count += value
    return dict(hists), budgets


def _ms(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{seconds * 1000:8.2f}"


@dataclass(frozen=True)
class StageRow:
    """One line of the stage table: seconds (NaN when unknown), share of end-to-end."""

    stage: str
    budget: float
    p50: float
    p95: float
    share: float
    count: int


def stage_rows(
    hists: dict[tuple[str, str], Histogram], budgets: dict[str, float]
) -> list[StageRow]:
    """The seven stages in request order, then users' own stages by name."""
    e2e = hists.get((sc.REQUEST_DURATION, ""))
    e2e_mean = e2e.mean if e2e is not None else math.nan
    stages = [s.value for s in STAGE_ORDER]
    stages += sorted(
        {stage for (metric, stage) in hists if metric == sc.STAGE_DURATION} - set(stages)
    )
    rows = []
    for stage in stages:
        hist = hists.get((sc.STAGE_DURATION, stage))
        budget = budgets.get(stage, math.nan)
        if hist is None or hist.count == 0:
            rows.append(StageRow(stage, budget, math.nan, math.nan, math.nan, 0))
            continue
        share = hist.mean / e2e_mean if e2e_mean and not math.isnan(e2e_mean) else math.nan
        rows.append(
            StageRow(stage, budget, hist.quantile(0.5), hist.quantile(0.95), share, int(hist.count))
        )
    return rows


def render_table(text: str) -> str:
    """The table: stage, budget, p50, p95, mean share of end-to-end time."""
    hists, budgets = parse_metrics(text)
    lines = [
        f"{'stage':14s} {'budget ms':>10s} {'p50 ms':>9s} {'p95 ms':>9s} {'share':>7s} "
        f"{'count':>7s}",
        "-" * 62,
    ]
    for row in stage_rows(hists, budgets):
        if row.count == 0:
            lines.append(f"{row.stage:14s} {_ms(row.budget):>10s} (no samples)")
            continue
        lines.append(
            f"{row.stage:14s} {_ms(row.budget):>10s} {_ms(row.p50):>9s} "
            f"{_ms(row.p95):>9s} {row.share * 100:6.1f}% {row.count:7d}"
        )
    lines.append("-" * 62)
    e2e = hists.get((sc.REQUEST_DURATION, ""))
    if e2e is not None and e2e.count:
        lines.append(
            f"{'end-to-end':14s} {'':>10s} {_ms(e2e.quantile(0.5)):>9s} "
            f"{_ms(e2e.quantile(0.95)):>9s} {100.0:6.1f}% {int(e2e.count):7d}"
        )
    ttft = hists.get((sc.TIME_TO_FIRST_TOKEN, ""))
    if ttft is not None and ttft.count:
        lines.append(
            f"{'TTFT':14s} {'':>10s} {_ms(ttft.quantile(0.5)):>9s} {_ms(ttft.quantile(0.95)):>9s}"
        )
    lines.append("share = mean stage time / mean end-to-end time (streamed responses overlap")
    lines.append("inference with postprocess, so shares need not add to 100 %)")
    return "\n".join(lines)


def fetch(url: str, timeout: float = 10.0) -> str:
    """GET the exposition text."""
    with urllib.request.urlopen(url, timeout=timeout) as response:
        body: bytes = response.read()
    return body.decode()
