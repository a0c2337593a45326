"""``stagelens report --metrics-url URL``: the per-stage latency table of any instrumented
service, read from its ``/metrics``; with ``--html FILE`` a page to attach to a ticket.

Why apart from ``stagelens.views.report``: the table and the page are views of an exposition
text; choosing between them (and reporting an unreachable service) is the console script's job.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from stagelens.errors import TraceSourceError
from stagelens.views.report import fetch, render_table, requests_counted
from stagelens.views.traces import (
    DEFAULT_TRACE_SOURCE,
    SpanRecord,
    fetch_traces,
    load_trace_file,
)


def add_parser(subparsers: Any) -> None:
    """``stagelens report``."""
    parser = subparsers.add_parser(
        "report",
        help="print the per-stage latency table from a service's /metrics, or write a page",
    )
    parser.add_argument(
        "--metrics-url",
        required=True,
        help="e.g. http://127.0.0.1:9464/metrics (the demo gateway's internal metrics port)",
    )
    parser.add_argument(
        "--html",
        metavar="FILE",
        default=None,
        help="write one self-contained HTML page (stage table, TTFT, ITL and whole-answer "
        "distributions, the slowest trace's waterfall, tokens, cost and engine time by "
        "tenant) instead",
    )
    parser.add_argument(
        "--traces",
        metavar="URL",
        default=None,
        help="trace source (a receiver's query API; default: the running demo's, "
        "http://127.0.0.1:4318, when it answers): percentiles are exact where it holds the "
        "spans of every counted request, and --html draws its slowest trace",
    )
    parser.add_argument(
        "--trace-file", type=Path, default=None, help="or OTLP/JSON spans from this file"
    )
    parser.add_argument(
        "--trace-id", default=None, help="draw this trace instead of the slowest one"
    )
    parser.set_defaults(func=_run)


def figure_spans(args: argparse.Namespace, requests: int) -> list[SpanRecord]:
    """Spans for exact figures: ``--trace-file``, else ``--traces`` (an error there
    raises ``TraceSourceError``), else the demo's receiver if it answers (nothing if not).
    At most ``requests`` + 1 traces are read: more than one per counted request could
    never match the histograms."""
    if args.trace_file is not None:
        return load_trace_file(args.trace_file)
    if requests <= 0:
        return []
    try:
        return fetch_traces(args.traces or DEFAULT_TRACE_SOURCE, requests + 1)
    except TraceSourceError:
        if args.traces is not None:
            raise
        return []


def _run(args: argparse.Namespace) -> int:
    try:
        text = fetch(args.metrics_url)
    except OSError as exc:
        print(f"stagelens report: cannot read {args.metrics_url}: {exc}")
        return 1
    try:
        spans = figure_spans(args, requests_counted(text))
    except TraceSourceError as exc:
        print(f"stagelens report: {exc}", file=sys.stderr)
        return 1
    if args.html is not None:
        from stagelens.views.report_html import write_report

        return write_report(args, text, spans)
    print(render_table(text, spans))
    return 0
