"""The per-stage latency table of any instrumented service, read from its ``/metrics``
exposition text (``stagelens report``; the page for a ticket is ``report_html``).

Why from ``/metrics`` first: it works against any running service with no collector.
Why traces too: a histogram only knows which bucket a request fell in, so a percentile
read from it is approximate (and Prometheus's ``histogram_quantile`` can print a p95 above
the slowest request); where a trace source holds the spans of every request the
histogram counted, the percentiles are the exact ones of those requests. Each figure says
which it is, and how far off it may be (``stagelens.views.percentiles``).
"""

from __future__ import annotations

import math
import urllib.request
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from prometheus_client.parser import text_string_to_metric_families

from stagelens import semconv as sc
from stagelens.stages import STAGE_ORDER
from stagelens.views.percentiles import Estimate, from_buckets, nearest_rank, span_samples
from stagelens.views.tenant_costs import render_tenant_costs
from stagelens.views.traces import SpanRecord


@dataclass
class Histogram:
    """Cumulative buckets (upper bound -> count), sum and count, summed over labels; with
    the same requests' own values where every one of them is known (``use_exact``)."""

    buckets: dict[float, float]
    total: float = 0.0
    count: float = 0.0
    exact: list[float] | None = None
    """Every request's value (from its spans): percentiles are then exact."""
    lowest: float | None = None
    """The smallest value observed (``stagelens_histogram_min_seconds``), when exposed."""
    highest: float | None = None
    """The largest value observed (``stagelens_histogram_max_seconds``), when exposed."""

    def estimate(self, q: float) -> Estimate:
        """The ``q`` percentile and its error bound: exact (0.0) from ``exact``, else from
        the buckets (``stagelens.views.percentiles.from_buckets``)."""
        if self.exact:
            return Estimate(nearest_rank(self.exact, q), 0.0)
        return from_buckets(self.buckets.items(), q, self.lowest, self.highest)

    def quantile(self, q: float) -> float:
        """The value of ``estimate(q)``."""
        return self.estimate(q).value

    def use_exact(self, values: list[float]) -> bool:
        """Take ``values`` as the exact figures when there is one per counted request (the
        same requests); False, and nothing taken, otherwise."""
        if not values or len(values) != round(self.count):
            return False
        self.exact = sorted(values)
        return True

    def bound(self, *quantiles: float) -> float:
        """The largest error bound among ``quantiles`` (0.0: exact)."""
        return max(self.estimate(q).error for q in quantiles)

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else math.nan


def bound_label(error: float) -> str:
    """How a printed percentile may differ from the exact one: ``exact``, ``±9%``."""
    if error == 0:
        return "exact"
    if math.isnan(error):
        return ""
    if math.isinf(error):
        return "unbounded"
    return f"±{math.ceil(error * 100 - 1e-6)}%"  # 0.1000000001 is 10 %, not 11


def use_spans(hists: dict[tuple[str, str], Histogram], spans: Iterable[SpanRecord]) -> int:
    """Make every histogram whose requests all have spans exact; returns how many did."""
    samples = span_samples(spans)
    return sum(1 for key, hist in hists.items() if hist.use_exact(samples.get(key, [])))


_READ: Final = (
    sc.STAGE_DURATION,
    sc.REQUEST_DURATION,
    sc.TIME_TO_FIRST_TOKEN,
    sc.INTER_TOKEN_LATENCY,
    sc.TIME_TO_FIRST_ANSWER_TOKEN,
    sc.NON_STREAMED_RESPONSE,
)
"""The histograms the report reads (summed over their other labels)."""


def _extreme(
    hists: dict[tuple[str, str], Histogram], gauge: str, labels: dict[str, str], value: float
) -> None:
    """Fold one extremes sample into its histogram: the least minimum, the largest maximum
    over the series summed into it."""
    name = labels.get(sc.LABEL_HISTOGRAM, "")
    if name not in _READ:
        return
    hist = hists[(name, labels.get(sc.LABEL_STAGE, ""))]
    if gauge == sc.HISTOGRAM_MIN:
        hist.lowest = value if hist.lowest is None else min(hist.lowest, value)
    else:
        hist.highest = value if hist.highest is None else max(hist.highest, value)


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
            if family.name in (sc.HISTOGRAM_MIN, sc.HISTOGRAM_MAX):
                _extreme(hists, family.name, labels, value)
                continue
            if family.name not in _READ:
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
    """Milliseconds to 1 % or better: three decimals below 1 ms (a 0.1 ms stage would
    otherwise print 5 % off), two above."""
    if math.isnan(seconds):
        return "-"
    ms = seconds * 1000
    return f"{ms:8.3f}" if abs(ms) < 1 else f"{ms:8.2f}"


@dataclass(frozen=True)
class ReasoningShare:
    """Of one (model, tenant)'s output tokens, those spent thinking."""

    model: str
    tenant: str
    output: float
    reasoning: float

    @property
    def share(self) -> float:
        """reasoning / output (NaN without output)."""
        return self.reasoning / self.output if self.output else math.nan


def reasoning_shares(text: str) -> list[ReasoningShare]:
    """Per (model, tenant) that had reasoning tokens, its output and reasoning tokens
    (``stagelens_tokens_total``: reasoning is a part of output), largest share first."""
    totals: dict[tuple[str, str], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name != sc.TOKENS:
                continue
            labels = sample.labels
            key = (labels.get(sc.LABEL_MODEL, ""), labels.get(sc.LABEL_TENANT, ""))
            totals[key][labels.get(sc.LABEL_TYPE, "")] += sample.value
    rows = [
        ReasoningShare(
            model, tenant, by_type.get(sc.TOKEN_TYPE_OUTPUT, 0.0), by_type[sc.TOKEN_TYPE_REASONING]
        )
        for (model, tenant), by_type in totals.items()
        if by_type.get(sc.TOKEN_TYPE_REASONING, 0.0) > 0
    ]
    return sorted(rows, key=lambda r: (-r.reasoning / (r.output or 1.0), r.model, r.tenant))


@dataclass(frozen=True)
class StageRow:
    """One line of the stage table: seconds (NaN when unknown), share of end-to-end, and
    how far p50 and p95 may be from the exact figures (0.0: exact)."""

    stage: str
    budget: float
    p50: float
    p95: float
    share: float
    count: int
    error: float = math.nan


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
            StageRow(
                stage,
                budget,
                hist.quantile(0.5),
                hist.quantile(0.95),
                share,
                int(hist.count),
                hist.bound(0.5, 0.95),
            )
        )
    return rows


FOOTNOTE: Final = (
    "p50/p95: the nearest-rank percentile (a value some request took). 'exact': from\n"
    "every counted request's spans; '±N%': read from the histogram's buckets, at most N %\n"
    "from the exact figure (docs/percentiles.md)."
)
"""What the bound column means, printed under the table."""


def render_table(text: str, spans: Iterable[SpanRecord] = ()) -> str:
    """The table: stage, budget, p50, p95, mean share of end-to-end time, count and how
    far p50/p95 may be from the exact figures; exact wherever ``spans`` hold one span per
    counted request."""
    hists, budgets = parse_metrics(text)
    use_spans(hists, spans)
    lines = [
        f"{'stage':14s} {'budget ms':>10s} {'p50 ms':>9s} {'p95 ms':>9s} {'share':>7s} "
        f"{'count':>7s} {'p50/p95':>8s}",
        "-" * 71,
    ]
    for row in stage_rows(hists, budgets):
        if row.count == 0:
            lines.append(f"{row.stage:14s} {_ms(row.budget):>10s} (no samples)")
            continue
        lines.append(
            f"{row.stage:14s} {_ms(row.budget):>10s} {_ms(row.p50):>9s} "
            f"{_ms(row.p95):>9s} {row.share * 100:6.1f}% {row.count:7d} "
            f"{bound_label(row.error):>8s}"
        )
    lines.append("-" * 71)
    e2e = hists.get((sc.REQUEST_DURATION, ""))
    if e2e is not None and e2e.count:
        lines.append(
            f"{'end-to-end':14s} {'':>10s} {_ms(e2e.quantile(0.5)):>9s} "
            f"{_ms(e2e.quantile(0.95)):>9s} {100.0:6.1f}% {int(e2e.count):7d} "
            f"{bound_label(e2e.bound(0.5, 0.95)):>8s}"
        )
    for metric, title in (
        (sc.TIME_TO_FIRST_TOKEN, "TTFT"),
        (sc.TIME_TO_FIRST_ANSWER_TOKEN, "first answer"),
        (sc.NON_STREAMED_RESPONSE, "whole answer"),
    ):
        hist = hists.get((metric, ""))
        if hist is not None and hist.count:
            lines.append(
                f"{title:14s} {'':>10s} {_ms(hist.quantile(0.5)):>9s} "
                f"{_ms(hist.quantile(0.95)):>9s} {'':>7s} {int(hist.count):7d} "
                f"{bound_label(hist.bound(0.5, 0.95)):>8s}"
            )
    lines.append("share = mean stage time / mean end-to-end time (streamed responses overlap")
    lines.append("inference with postprocess, so shares need not add to 100 %)")
    lines.append(FOOTNOTE)
    lines.append("first answer = time to the first answer token, past a reasoning model's thinking")
    lines.append("whole answer = a non-streamed answer's first byte, sent once it was all")
    lines.append("generated; TTFT and first answer read streamed answers only")
    shares = reasoning_shares(text)
    if shares:
        lines.append("")
        lines.append(
            f"{'model':20s} {'tenant':16s} {'output':>10s} {'reasoning':>10s} {'share':>7s}"
        )
        lines.append("-" * 67)
        for share in shares:
            lines.append(
                f"{share.model[:20]:20s} {share.tenant[:16]:16s} {share.output:10.0f} "
                f"{share.reasoning:10.0f} {share.share * 100:6.1f}%"
            )
        lines.append("reasoning = output tokens the model spent thinking (billed as output)")
    costs = render_tenant_costs(text)
    if costs:
        lines.append("")
        lines += costs
    return "\n".join(lines)


def fetch(url: str, timeout: float = 10.0) -> str:
    """GET the exposition text."""
    with urllib.request.urlopen(url, timeout=timeout) as response:
        body: bytes = response.read()
    return body.decode()


def requests_counted(text: str) -> int:
    """How many requests the end-to-end histogram counted."""
    e2e = parse_metrics(text)[0].get((sc.REQUEST_DURATION, ""))
    return round(e2e.count) if e2e is not None else 0
