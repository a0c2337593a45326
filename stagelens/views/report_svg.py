"""Inline SVG for ``stagelens report --html``: a histogram's distribution and a trace's
waterfall, as strings to paste into the page.

Why hand-written SVG: the page must open anywhere with nothing fetched (no script, no font,
no chart library), and a few rectangles and labels are all these two charts need. Every
piece of text placed in the SVG is escaped: span names and label values come from other
processes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape
from typing import Final

from stagelens import semconv as sc
from stagelens.views.traces import STATUS_ERROR
from stagelens.views.waterfall import Waterfall, format_ms

STAGE_COLOURS: Final = {
    "gateway": "#4e79a7",
    "load_balancer": "#f28e2b",
    "tokenizer": "#59a14f",
    "router": "#b07aa1",
    "inference": "#e15759",
    "postprocess": "#76b7b2",
    "billing": "#edc948",
    sc.SPAN_ENGINE_QUEUE: "#9c755f",
    sc.SPAN_ENGINE_PREFILL: "#ff9da7",
    sc.SPAN_ENGINE_DECODE: "#bab0ac",
}
"""A colour per canonical stage and engine phase; other spans are drawn grey."""

OTHER_COLOUR: Final = "#8c8c8c"
ERROR_COLOUR: Final = "#c0392b"


def _text(x: float, y: float, text: str, *, anchor: str = "start", cls: str = "") -> str:
    klass = f' class="{cls}"' if cls else ""
    return f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}"{klass}>{escape(text)}</text>'


def _bound_label(bound: float) -> str:
    if math.isinf(bound):
        return "+Inf"
    ms = bound * 1000
    return f"{ms:.3g}" if ms < 10 else f"{ms:,.0f}"


def distribution_svg(
    buckets: dict[float, float], *, title: str, width: int = 560, height: int = 200
) -> str:
    """Requests per bucket (cumulative Prometheus buckets -> counts in each), the bucket's
    upper bound in ms under its bar; buckets outside the occupied range are left out."""
    bounds = sorted(buckets)
    counts = [buckets[b] - (buckets[bounds[i - 1]] if i else 0.0) for i, b in enumerate(bounds)]
    occupied = [i for i, c in enumerate(counts) if c > 0]
    if not occupied:
        return f'<p class="empty">{escape(title)}: no samples</p>'
    lo, hi = max(0, occupied[0] - 1), min(len(bounds), occupied[-1] + 2)
    shown = list(zip(bounds[lo:hi], counts[lo:hi], strict=True))
    top, left, bottom = 14, 8, 34
    plot_h = height - top - bottom
    step = (width - 2 * left) / len(shown)
    peak = max(c for _, c in shown)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}">'
    ]
    for i, (bound, count) in enumerate(shown):
        h = plot_h * count / peak if peak else 0.0
        x = left + i * step
        parts.append(
            f'<rect x="{x + 1:.1f}" y="{top + plot_h - h:.1f}" width="{max(step - 2, 1):.1f}" '
            f'height="{h:.1f}" class="bar"><title>le {escape(_bound_label(bound))} ms: '
            f"{count:g}</title></rect>"
        )
        if count:
            parts.append(_text(x + step / 2, top + plot_h - h - 3, f"{count:g}", anchor="middle"))
        parts.append(
            _text(x + step / 2, height - bottom + 14, _bound_label(bound), anchor="middle")
        )
    parts.append(
        f'<line x1="{left}" y1="{top + plot_h}" x2="{width - left}" y2="{top + plot_h}" '
        'class="axis"/>'
    )
    parts.append(_text(width / 2, height - 4, "bucket upper bound, ms", anchor="middle"))
    parts.append("</svg>")
    return "".join(parts)


_PHASES: Final = (sc.SPAN_ENGINE_QUEUE, sc.SPAN_ENGINE_PREFILL, sc.SPAN_ENGINE_DECODE)


def _colour(stage: object, name: str, error: bool) -> str:
    """Red for a failed span; an engine phase's own colour (phases carry their inference
    stage too); else its stage's colour; grey for anything else."""
    if error:
        return ERROR_COLOUR
    if name in _PHASES:
        return STAGE_COLOURS[name]
    key = stage if isinstance(stage, str) and stage in STAGE_COLOURS else name
    return STAGE_COLOURS.get(key, OTHER_COLOUR)


def _ticks(total_ns: int) -> Sequence[int]:
    """Four or five round tick positions in ns along the axis."""
    if total_ns <= 0:
        return [0]
    raw = total_ns / 4
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    return [int(i * step) for i in range(int(total_ns // step) + 1)]


def waterfall_svg(waterfall: Waterfall, *, width: int = 960) -> str:
    """One row per span: label, bar on the trace's axis, duration in ms. Each bar carries
    its exact start and end in ms (``data-start-ms``, ``data-end-ms``, and a tooltip)."""
    label_w, number_w, row_h, top = 230, 280, 20, 26
    plot_w = width - label_w - number_w
    total = waterfall.total_ns
    height = top + row_h * len(waterfall.rows) + 8
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="trace waterfall">'
    ]
    for tick in _ticks(total):
        x = label_w + (plot_w * tick / total if total else 0.0)
        parts.append(f'<line x1="{x:.1f}" y1="{top - 6}" x2="{x:.1f}" y2="{height}" class="grid"/>')
        parts.append(_text(x, top - 10, f"{tick / 1e6:g} ms", anchor="middle", cls="tick"))
    for i, row in enumerate(waterfall.rows):
        y = top + i * row_h
        span = row.span
        stage = span.attributes.get(sc.ATTR_STAGE)
        x0 = label_w + (plot_w * row.start_ns / total if total else 0.0)
        bar_w = max(plot_w * (row.end_ns - row.start_ns) / total if total else plot_w, 1.0)
        start, end = format_ms(row.start_ns), format_ms(row.end_ns)
        colour = _colour(stage, span.name, span.status_code == STATUS_ERROR)
        parts.append(_text(4 + 12 * row.depth, y + 14, row.label.strip(), cls="label"))
        parts.append(
            f'<rect x="{x0:.2f}" y="{y + 3}" width="{bar_w:.2f}" height="{row_h - 6}" '
            f'fill="{colour}" data-start-ms="{start}" data-end-ms="{end}">'
            f"<title>{escape(span.name)}: {start} to {end} ms</title></rect>"
        )
        note = f"  {row.note}" if row.note else ""
        parts.append(
            _text(
                width - 4,
                y + 14,
                f"{format_ms(row.end_ns - row.start_ns)} ms{note}",
                anchor="end",
                cls="num",
            )
        )
    parts.append("</svg>")
    return "".join(parts)
