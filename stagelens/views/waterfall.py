"""A trace as a waterfall: one row per span, its bar on the trace's time axis, in ms.

Why its own module: the demo prints it after its traffic run, ``stagelens trace`` prints it
for any trace the demo received, and ``stagelens report --html`` draws it; all three must
show the same rows. The rows are the spans' own start and end times, offset from the
trace's first span, computed in integer nanoseconds: nothing is rounded before printing,
and a bar's cells follow from those nanoseconds alone (``bar_cells``).

Only names, times, status and a few counts are shown (``ROW_NOTES``), never other
attributes, so a waterfall carries no prompt or completion text even when content capture
is on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from opentelemetry.semconv.attributes.http_attributes import HTTP_RESPONSE_STATUS_CODE

from stagelens import semconv as sc
from stagelens.views.traces import STATUS_ERROR, SpanRecord

DEFAULT_BAR_WIDTH: Final = 48
"""Character cells of the text bar (the whole trace)."""

LABEL_WIDTH: Final = 34
"""Most characters of a row's label (indent included); longer names are cut with ``~``."""

ROW_NOTES: Final = (
    (sc.GEN_AI_USAGE_INPUT_TOKENS, "in"),
    (sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS, "cached"),
    (sc.GEN_AI_USAGE_OUTPUT_TOKENS, "out"),
    (sc.GEN_AI_USAGE_REASONING_OUTPUT_TOKENS, "reasoning"),
)
"""Token counts shown beside a row (the inference span's usage), with their short names."""

NS_PER_MS: Final = 1_000_000
THINKING_ROW: Final = "thinking"
"""Name of the row from the first token sent to the first answer token sent (a model that
reasons streams its thinking first), drawn under the root from its attributes."""
ANSWER_ROW: Final = "answer"
"""Name of the row from the first answer token sent to the root's end."""


@dataclass(frozen=True)
class Row:
    """One span on the axis: ``start_ns`` / ``end_ns`` from the trace's first span."""

    span: SpanRecord
    depth: int
    start_ns: int
    end_ns: int
    parent_stage: object = None
    """The parent span's ``stagelens.stage`` (None for a root)."""

    @property
    def label(self) -> str:
        """The span's name, indented by depth. A stage's top span named otherwise (the
        inference span ``chat tiny``) shows its stage first; its children in the same stage
        (``queue``, ``prefill``, ``decode``) show their own names."""
        stage = self.span.attributes.get(sc.ATTR_STAGE)
        name = self.span.name
        if isinstance(stage, str) and stage and stage != name and stage != self.parent_stage:
            name = f"{stage} ({name})"
        return "  " * self.depth + name

    @property
    def note(self) -> str:
        """Token counts and ERROR for a failed span; empty for most rows."""
        attributes = self.span.attributes
        parts = [
            f"{attributes[key]} {short}"
            for key, short in ROW_NOTES
            if isinstance(attributes.get(key), int)
        ]
        if self.span.status_code == STATUS_ERROR:
            parts.append("ERROR")
        return ", ".join(parts)


@dataclass(frozen=True)
class Waterfall:
    """The rows of one trace, depth first (children by start time), and its extent."""

    trace_id: str
    origin_ns: int
    total_ns: int
    rows: tuple[Row, ...]

    @property
    def root(self) -> SpanRecord:
        return self.rows[0].span

    def header(self) -> str:
        """``trace <id>  <root name>  <status>  <total> ms``."""
        status = self.root.attributes.get(HTTP_RESPONSE_STATUS_CODE)
        parts = [f"trace {self.trace_id}", self.root.name]
        if isinstance(status, int):
            parts.append(str(status))
        parts.append(f"{format_ms(self.total_ns)} ms")
        return "  ".join(parts)


def build(spans: Sequence[SpanRecord]) -> Waterfall:
    """The waterfall of one trace's spans (``ValueError`` when there are none). A span
    whose parent is not among them (a remote parent, a span not yet received) is a root."""
    if not spans:
        raise ValueError("a waterfall needs at least one span")
    origin = min(s.start_ns for s in spans)
    total = max(s.end_ns for s in spans) - origin
    ids = {s.span_id for s in spans}
    children: dict[str, list[SpanRecord]] = {}
    roots: list[SpanRecord] = []
    for span in spans:
        if span.parent_span_id in ids and span.parent_span_id != span.span_id:
            children.setdefault(span.parent_span_id, []).append(span)
        else:
            roots.append(span)
    rows: list[Row] = []
    seen: set[str] = set()

    def visit(span: SpanRecord, depth: int, parent_stage: object) -> None:
        if span.span_id in seen:  # a cycle of parent ids in untrusted data
            return
        seen.add(span.span_id)
        rows.append(Row(span, depth, span.start_ns - origin, span.end_ns - origin, parent_stage))
        stage = span.attributes.get(sc.ATTR_STAGE)
        for child in sorted(children.get(span.span_id, []), key=_order):
            visit(child, depth + 1, stage)

    for root in sorted(roots, key=_order):
        visit(root, 0, None)
        rows += _thinking_rows(root, origin)
    for span in sorted(spans, key=_order):  # spans whose parents form a cycle
        if span.span_id not in seen:
            visit(span, 0, None)
    return Waterfall(spans[0].trace_id, origin, total, tuple(rows))


def _thinking_rows(root: SpanRecord, origin: int) -> list[Row]:
    """``thinking`` (first token to first answer token) and ``answer`` (first answer token
    to the end) under a root whose model reasoned (its time to first answer token is
    later than its time to first token): the two phases the client saw, apart. None for
    any other root (the attributes are the root's own; no span is made up in the trace)."""
    ttft = root.attributes.get(sc.ATTR_TTFT)
    ttfat = root.attributes.get(sc.ATTR_TTFAT)
    if not isinstance(ttft, float) or not isinstance(ttfat, float) or not 0 <= ttft < ttfat:
        return []
    first = root.start_ns + round(ttft * 1e9)
    answer = min(root.start_ns + round(ttfat * 1e9), root.end_ns)
    rows = []
    for name, start, end in ((THINKING_ROW, first, answer), (ANSWER_ROW, answer, root.end_ns)):
        phase = SpanRecord(root.trace_id, "", root.span_id, name, start, end)
        rows.append(Row(phase, 1, start - origin, end - origin, root.attributes.get(sc.ATTR_STAGE)))
    return rows


def _order(span: SpanRecord) -> tuple[int, int, str]:
    return (span.start_ns, -span.end_ns, span.name)


def bar_cells(start_ns: int, end_ns: int, total_ns: int, width: int) -> tuple[int, int]:
    """The cells ``[first, last)`` a bar covers on an axis of ``width`` cells: from the
    cell its start falls in to the cell its end falls in, at least one cell."""
    if total_ns <= 0:
        return 0, 1
    first = min(width - 1, start_ns * width // total_ns)
    last = min(width, -(-end_ns * width // total_ns))
    return first, max(last, first + 1)


def format_ms(ns: int) -> str:
    """Nanoseconds as milliseconds with three decimals (microseconds), rounded half up."""
    micros = (ns + 500) // 1000 if ns >= 0 else -((-ns + 500) // 1000)
    sign = "-" if micros < 0 else ""
    whole, frac = divmod(abs(micros), 1000)
    return f"{sign}{whole}.{frac:03d}"


def render_text(waterfall: Waterfall, width: int = DEFAULT_BAR_WIDTH, ascii: bool = False) -> str:
    """The waterfall as lines: label, start, end and duration in ms, the bar, a note."""
    full, empty = ("#", ".") if ascii else ("\u2588", "\u00b7")
    labels = [_cut(row.label) for row in waterfall.rows]
    label_width = max(len("span"), *(len(label) for label in labels))
    total = format_ms(waterfall.total_ns)
    axis = f"0 ms{total + ' ms':>{width - 4}}"
    lines = [
        waterfall.header(),
        f"{'span':<{label_width}}  {'start ms':>10} {'end ms':>10} {'dur ms':>10}  {axis}",
    ]
    for label, row in zip(labels, waterfall.rows, strict=True):
        first, last = bar_cells(row.start_ns, row.end_ns, waterfall.total_ns, width)
        bar = empty * first + full * (last - first) + empty * (width - last)
        note = f"  {row.note}" if row.note else ""
        lines.append(
            f"{label:<{label_width}}  {format_ms(row.start_ns):>10} {format_ms(row.end_ns):>10} "
            f"{format_ms(row.end_ns - row.start_ns):>10}  {bar}{note}"
        )
    return "\n".join(lines)


def _cut(label: str) -> str:
    return label if len(label) <= LABEL_WIDTH else label[: LABEL_WIDTH - 1] + "~"
