"""``stagelens report --html FILE``: one self-contained page to attach to a ticket.

What it holds: the per-stage table (the same rows as the text report), the TTFT,
inter-token latency and whole-answer distributions, the slowest trace's waterfall, and
tokens, cost and engine time by tenant. Why self-contained: a page attached to a ticket is
opened later, elsewhere, maybe offline; so the CSS and the SVG charts are inline, and there is
no script and no URL to fetch. Why no prompt or completion text: the figures come from
``/metrics`` (no text there) and the waterfall shows names, times and token counts only
(``stagelens.views.waterfall``).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from html import escape
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from prometheus_client.parser import text_string_to_metric_families

from stagelens import semconv as sc
from stagelens.errors import TraceSourceError
from stagelens.views.report import (
    Histogram,
    ReasoningShare,
    StageRow,
    bound_label,
    parse_metrics,
    reasoning_shares,
    stage_rows,
    use_spans,
)
from stagelens.views.report_svg import STAGE_COLOURS, distribution_svg, waterfall_svg
from stagelens.views.traces import (
    DEFAULT_TRACE_SOURCE,
    SpanRecord,
    fetch_trace,
    group_by_trace,
    list_traces,
    load_trace_file,
    normalize_trace_id,
    slowest,
)
from stagelens.views.waterfall import Waterfall, build

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;
 color:#1d232a;margin:24px auto;max-width:1000px;padding:0 16px}
h1{font-size:22px;margin:0 0 4px} h2{font-size:17px;margin:28px 0 8px;
 border-bottom:1px solid #d8dde3;padding-bottom:4px}
.meta{color:#5b6670;font-size:12px}
.cards{display:flex;gap:12px;flex-wrap:wrap;margin-top:14px}
.card{border:1px solid #d8dde3;border-radius:6px;padding:8px 12px;min-width:120px}
.card b{display:block;font-size:18px}
table{border-collapse:collapse;font-variant-numeric:tabular-nums}
th,td{padding:3px 10px;text-align:right;border-bottom:1px solid #eef1f4}
th:first-child,td:first-child{text-align:left} th{background:#f5f7f9}
td.over{color:#b03a2e;font-weight:600}
.swatch{display:inline-block;width:10px;height:10px;border-radius:2px;margin-right:6px}
.charts{display:flex;gap:24px;flex-wrap:wrap}
.bar{fill:#4e79a7} .axis{stroke:#5b6670} .grid{stroke:#e3e7eb}
svg text{font-size:11px;fill:#33404d} svg .label{font-size:12px}
svg .tick{fill:#5b6670} .empty{color:#5b6670;font-style:italic}
.share{display:inline-block;height:9px;background:#59a14f;vertical-align:middle}
"""


@dataclass
class Figures:
    """What the page needs from one ``/metrics`` text, summed over the other labels."""

    stages: list[StageRow]
    e2e: Histogram | None
    ttft: Histogram | None
    itl: Histogram | None
    tokens: dict[str, dict[str, float]] = field(default_factory=dict)
    cost: dict[str, float] = field(default_factory=dict)
    requests: dict[str, float] = field(default_factory=dict)
    ttfat: Histogram | None = None
    """Time to first answer token (past a reasoning model's thinking)."""
    reasoning: list[ReasoningShare] = field(default_factory=list)
    """Per (model, tenant) that reasoned: output and reasoning tokens."""
    whole: Histogram | None = None
    """A non-streamed answer's first byte, sent once it was all generated (never in TTFT)."""
    engine: dict[str, float] = field(default_factory=dict)
    """Per tenant, the engine seconds its requests were attributed; none where vLLM sent no
    figure (no stagelens engine-time middleware)."""


def read_figures(text: str, spans: Iterable[SpanRecord] = ()) -> Figures:
    """The page's figures from Prometheus exposition text; exact wherever ``spans`` hold
    one span per request a histogram counted (``report.use_spans``)."""
    hists, budgets = parse_metrics(text)
    use_spans(hists, spans)
    tokens: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    cost: dict[str, float] = defaultdict(float)
    requests: dict[str, float] = defaultdict(float)
    engine: dict[str, float] = defaultdict(float)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels, value = sample.labels, sample.value
            if sample.name == sc.TOKENS:
                tenant = labels.get(sc.LABEL_TENANT, "")
                tokens[tenant][labels.get(sc.LABEL_TYPE, "")] += value
            elif sample.name == sc.COST_USD:
                cost[labels.get(sc.LABEL_TENANT, "")] += value
            elif sample.name == sc.REQUESTS:
                requests[labels.get(sc.LABEL_CODE, "")] += value
            elif sample.name == sc.ENGINE_SECONDS:
                engine[labels.get(sc.LABEL_TENANT, "")] += value
    itl = hists.get((sc.INTER_TOKEN_LATENCY, ""))
    return Figures(
        stages=stage_rows(hists, budgets),
        e2e=hists.get((sc.REQUEST_DURATION, "")),
        ttft=hists.get((sc.TIME_TO_FIRST_TOKEN, "")),
        itl=itl if itl is not None and itl.count else None,
        tokens={t: dict(v) for t, v in tokens.items()},
        cost=dict(cost),
        requests=dict(requests),
        ttfat=hists.get((sc.TIME_TO_FIRST_ANSWER_TOKEN, "")),
        reasoning=reasoning_shares(text),
        whole=hists.get((sc.NON_STREAMED_RESPONSE, "")),
        engine=dict(engine),
    )


def _ms(seconds: float) -> str:
    """As the text report's: three decimals below 1 ms, two above."""
    if math.isnan(seconds):
        return "&ndash;"
    ms = seconds * 1000
    return f"{ms:,.3f}" if abs(ms) < 1 else f"{ms:,.2f}"


def _quantiles(hist: Histogram | None) -> str:
    if hist is None or not hist.count:
        return "no samples"
    marks = ", ".join(f"p{int(q * 100)} {_ms(hist.quantile(q))} ms" for q in (0.5, 0.95, 0.99))
    return f"{int(hist.count):,} samples: {marks} ({bound_label(hist.bound(0.5, 0.95, 0.99))})"


def _bound(hist: Histogram) -> str:
    label = bound_label(hist.bound(0.5, 0.95))
    return "" if label == "exact" else f" <small>{label}</small>"


def _cards(figures: Figures) -> str:
    total = sum(figures.requests.values())
    failed = sum(v for code, v in figures.requests.items() if code[:1] in "45")
    ttft, itl = figures.ttft, figures.itl
    tokens = sum(
        sum(by_type.get(t, 0.0) for t in ("input", "output")) for by_type in figures.tokens.values()
    )
    cards = [
        ("requests", f"{total:,.0f}"),
        ("errors", f"{failed:,.0f}"),
        (
            "TTFT p50 / p95 ms",
            f"{_ms(ttft.quantile(0.5))} / {_ms(ttft.quantile(0.95))}{_bound(ttft)}"
            if ttft and ttft.count
            else "&ndash;",
        ),
        (
            "ITL p50 / p95 ms",
            f"{_ms(itl.quantile(0.5))} / {_ms(itl.quantile(0.95))}{_bound(itl)}"
            if itl and itl.count
            else "&ndash;",
        ),
        ("tokens", f"{tokens:,.0f}"),
        ("cost", f"${sum(figures.cost.values()):,.4f}"),
    ]
    body = "".join(f'<div class="card">{label}<b>{value}</b></div>' for label, value in cards)
    return f'<div class="cards">{body}</div>'


def _stage_table(figures: Figures) -> str:
    rows = []
    for row in figures.stages:
        colour = STAGE_COLOURS.get(row.stage, "#8c8c8c")
        over = ' class="over"' if row.count and row.p95 > row.budget else ""
        share = "" if math.isnan(row.share) else f"{row.share * 100:.1f}%"
        width = 0 if math.isnan(row.share) else min(100, row.share * 100)
        rows.append(
            f'<tr><td><span class="swatch" style="background:{colour}"></span>'
            f"{escape(row.stage)}</td><td>{_ms(row.budget)}</td><td>{_ms(row.p50)}</td>"
            f"<td{over}>{_ms(row.p95)}</td><td>{share} "
            f'<span class="share" style="width:{width:.0f}px"></span></td>'
            f"<td>{row.count:,}</td><td>{bound_label(row.error)}</td></tr>"
        )
    e2e = figures.e2e
    if e2e is not None and e2e.count:
        rows.append(
            f"<tr><th>end-to-end</th><th></th><th>{_ms(e2e.quantile(0.5))}</th>"
            f"<th>{_ms(e2e.quantile(0.95))}</th><th>100%</th><th>{int(e2e.count):,}</th>"
            f"<th>{bound_label(e2e.bound(0.5, 0.95))}</th></tr>"
        )
    head = (
        "<tr><th>stage</th><th>budget ms</th><th>p50 ms</th><th>p95 ms</th><th>share</th>"
        "<th>count</th><th>p50/p95</th></tr>"
    )
    return (
        f'<table>{head}{"".join(rows)}</table><p class="meta">share = mean stage time / '
        "mean end-to-end time (a streamed answer overlaps inference and postprocess). "
        "p50/p95 are nearest-rank percentiles (a value some request took): 'exact' from "
        "the spans of every request counted, '&plusmn;N%' read from histogram buckets and "
        "at most N % from the exact figure; a p95 above its stage budget is red.</p>"
    )


def _share(part: float, total: float) -> str:
    return (
        f"{part / total * 100:.1f}% "
        f'<span class="share" style="width:{part / total * 100:.0f}px"></span>'
    )


def _tenant_table(figures: Figures) -> str:
    """Per tenant: tokens, the price table's cost and, where the engines reported it, the
    engine time its requests were attributed (what the GPUs bore, beside what is billed)."""
    tenants = sorted(
        set(figures.tokens) | set(figures.cost) | set(figures.engine),
        key=lambda t: (-figures.engine.get(t, 0.0), -figures.cost.get(t, 0.0), t),
    )
    if not tenants:
        return '<p class="empty">no tokens billed yet</p>'
    total_cost = sum(figures.cost.values()) or 1.0
    total_engine = sum(figures.engine.values())
    rows = []
    for tenant in tenants:
        by_type = figures.tokens.get(tenant, {})
        cost = figures.cost.get(tenant, 0.0)
        seconds = figures.engine.get(tenant)
        engine = (
            "<td>-</td><td>-</td>"
            if seconds is None
            else f"<td>{seconds:,.3f}</td><td>{_share(seconds, total_engine or 1.0)}</td>"
        )
        rows.append(
            f"<tr><td>{escape(tenant)}</td>"
            + "".join(
                f"<td>{by_type.get(t, 0.0):,.0f}</td>"
                for t in (sc.TOKEN_TYPE_INPUT, sc.TOKEN_TYPE_CACHED_INPUT, sc.TOKEN_TYPE_OUTPUT)
            )
            + f"<td>${cost:,.6f}</td><td>{_share(cost, total_cost)}</td>{engine}</tr>"
        )
    head = (
        "<tr><th>tenant</th><th>input tokens</th><th>of which cached</th><th>output tokens</th>"
        "<th>cost USD</th><th>share of cost</th><th>engine s</th>"
        "<th>share of engine time</th></tr>"
    )
    note = (
        "<p class=\"meta\">engine s: the engines' time attributed to the tenant's requests "
        "(each engine step split by the tokens each request computed in it); '-' where vLLM "
        "sent no figure.</p>"
    )
    return f"<table>{head}{''.join(rows)}</table>{note}"


def _reasoning_table(figures: Figures) -> str:
    """Per model and tenant: output tokens, the reasoning part, its share."""
    if not figures.reasoning:
        return '<p class="empty">no reasoning tokens (no model here reasons)</p>'
    rows = "".join(
        f"<tr><td>{escape(r.model)}</td><td>{escape(r.tenant)}</td><td>{r.output:,.0f}</td>"
        f"<td>{r.reasoning:,.0f}</td><td>{r.share * 100:.1f}% "
        f'<span class="share" style="width:{r.share * 100:.0f}px"></span></td></tr>'
        for r in figures.reasoning
    )
    head = (
        "<tr><th>model</th><th>tenant</th><th>output tokens</th><th>of which reasoning</th>"
        "<th>reasoning share</th></tr>"
    )
    return f"<table>{head}{rows}</table>"


def render_page(
    figures: Figures,
    waterfall: Waterfall | None,
    *,
    metrics_source: str,
    trace_note: str,
    generated: float | None = None,
) -> str:
    """The whole page as one HTML string."""
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(generated or time.time()))
    trace_part = (
        f"<p><b>{escape(waterfall.header())}</b></p>{waterfall_svg(waterfall)}"
        if waterfall is not None
        else ""
    )
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>stagelens report {escape(when)}</title><style>{_CSS}</style></head><body>"
        "<h1>stagelens report</h1>"
        f'<p class="meta">{escape(when)} &middot; metrics from {escape(metrics_source)}</p>'
        f"{_cards(figures)}"
        f"<h2>Stages</h2>{_stage_table(figures)}"
        '<h2>Time to first token and inter-token latency</h2><div class="charts">'
        f'<div><b>TTFT</b> <span class="meta">{_quantiles(figures.ttft)}</span><br>'
        f"{_chart(figures.ttft, 'TTFT')}</div>"
        f'<div><b>Inter-token latency</b> <span class="meta">{_quantiles(figures.itl)}'
        f"</span><br>{_chart(figures.itl, 'inter-token latency')}</div>"
        f'<div><b>Time to first answer token</b> <span class="meta">'
        f"{_quantiles(figures.ttfat)}</span><br>"
        f"{_chart(figures.ttfat, 'time to first answer token')}</div>"
        f'<div><b>Whole answer</b> <span class="meta">{_quantiles(figures.whole)}</span><br>'
        f"{_chart(figures.whole, 'whole answer')}</div></div>"
        '<p class="meta">TTFT and the first answer token read streamed answers only; a '
        "non-streamed answer's first byte is sent once it was all generated, and is read "
        "as the whole answer.</p>"
        f'<h2>The slowest trace</h2><p class="meta">{escape(trace_note)}</p>{trace_part}'
        f"<h2>Tokens, cost and engine time by tenant</h2>{_tenant_table(figures)}"
        f"<h2>Reasoning share by model and tenant</h2>{_reasoning_table(figures)}"
        "</body></html>\n"
    )


def _chart(hist: Histogram | None, title: str) -> str:
    if hist is None or not hist.count:
        return f'<p class="empty">{escape(title)}: no samples</p>'
    return distribution_svg(hist.buckets, title=title, width=460)


def redact_url(url: str) -> str:
    """``url`` without credentials, query or fragment: what the page may show."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def trace_for_page(
    source: str | None, trace_file: Path | None, trace_id: str | None
) -> tuple[list[SpanRecord], str]:
    """The spans to draw and a sentence saying where they came from. A source given on
    the command line that fails raises ``TraceSourceError``; the demo's default receiver
    that is not running leaves the section with a note."""
    if trace_file is not None:
        traces = group_by_trace(load_trace_file(trace_file))
        if trace_id is not None:
            spans = traces.get(normalize_trace_id(trace_id), [])
        else:
            spans = slowest(s for t in traces.values() for s in t)
        if not spans:
            raise TraceSourceError(f"no such trace in {trace_file}")
        return spans, f"from {trace_file.name}, the slowest there unless --trace-id"
    url = source or DEFAULT_TRACE_SOURCE
    try:
        if trace_id is None:
            listing = list_traces(url, limit=1)
            if not listing:
                return [], f"the trace source at {redact_url(url)} holds no trace yet"
            trace_id = listing[0].trace_id
        spans = fetch_trace(url, trace_id)
    except TraceSourceError as exc:
        if source is not None:
            raise
        return [], f"no trace: the demo's receiver is not running ({exc})"
    return spans, f"from {redact_url(url)}, the slowest there unless --trace-id"


def write_report(
    args: argparse.Namespace, metrics_text: str, figure_spans: Iterable[SpanRecord] = ()
) -> int:
    """Write the page named by ``--html``; 1 when an explicit trace source failed."""
    try:
        spans, note = trace_for_page(args.traces, args.trace_file, args.trace_id)
    except TraceSourceError as exc:
        print(f"stagelens report: {exc}", file=sys.stderr)
        return 1
    waterfall = build(spans) if spans else None
    if waterfall is not None:
        note = f"{note}; each bar is its span's own start and end, in ms from the first span"
    page = render_page(
        read_figures(metrics_text, figure_spans),
        waterfall,
        metrics_source=redact_url(args.metrics_url),
        trace_note=note,
    )
    Path(args.html).write_text(page, encoding="utf-8")
    print(f"wrote {args.html} ({len(page.encode()):,} bytes)")
    return 0
