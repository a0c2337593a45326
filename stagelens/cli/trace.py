"""``stagelens trace TRACE_ID``: print the waterfall of a trace the running demo received.

Why a query over HTTP: the spans live in the demo's process (its OTLP receiver); this
command asks the receiver's query API (``stagelens.views.traces``) and prints what
``stagelens.views.waterfall`` makes of the answer, the same rows the demo printed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from stagelens.errors import TraceSourceError
from stagelens.views.traces import (
    DEFAULT_TRACE_SOURCE,
    fetch_trace,
    group_by_trace,
    list_traces,
    load_trace_file,
    normalize_trace_id,
    summarize,
    to_otlp_json,
)
from stagelens.views.waterfall import DEFAULT_BAR_WIDTH, build, format_ms, render_text


def add_parser(subparsers: Any) -> None:
    """``stagelens trace``."""
    parser = subparsers.add_parser(
        "trace",
        help="print the waterfall of a trace the running demo received (or list them)",
        description="Print one trace as a waterfall: every span's start, end and duration "
        "in ms and its bar on the trace's time axis.",
    )
    parser.add_argument("trace_id", nargs="?", help="32 hex digits, as the demo printed it")
    parser.add_argument(
        "--source",
        default=DEFAULT_TRACE_SOURCE,
        help=f"the demo's trace receiver (default {DEFAULT_TRACE_SOURCE})",
    )
    parser.add_argument(
        "--file", type=Path, default=None, help="read OTLP/JSON from this file instead"
    )
    parser.add_argument("--list", action="store_true", help="list traces, slowest first")
    parser.add_argument("--limit", type=int, default=20, help="traces to list (default 20)")
    parser.add_argument("--json", action="store_true", help="print the trace as OTLP/JSON")
    parser.add_argument("--width", type=int, default=DEFAULT_BAR_WIDTH, help="bar width")
    parser.add_argument("--ascii", action="store_true", help="draw bars with # and .")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print the trace, or the listing; 1 when the trace or its source is not there."""
    try:
        if args.list or args.trace_id is None:
            return _list(args)
        spans = _spans(args)
    except TraceSourceError as exc:
        hint = ""
        if args.file is None and args.source == DEFAULT_TRACE_SOURCE:
            hint = " (is `stagelens demo` running? --source names another receiver)"
        print(f"stagelens trace: {exc}{hint}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(to_otlp_json(spans), indent=1))
    else:
        print(render_text(build(spans), width=max(8, args.width), ascii=args.ascii))
    return 0


def _spans(args: argparse.Namespace) -> list[Any]:
    if args.file is None:
        return fetch_trace(args.source, args.trace_id)
    trace_id = normalize_trace_id(args.trace_id)
    spans = group_by_trace(load_trace_file(args.file)).get(trace_id)
    if not spans:
        raise TraceSourceError(f"no spans of trace {trace_id} in {args.file}")
    return spans


def _list(args: argparse.Namespace) -> int:
    if args.file is not None:
        summaries = sorted(
            (summarize(t) for t in group_by_trace(load_trace_file(args.file)).values()),
            key=lambda s: -s.duration_ns,
        )[: args.limit]
    else:
        summaries = list_traces(args.source, limit=args.limit)
    if not summaries:
        print("no traces yet")
        return 0
    print(f"{'trace id':32s}  {'ms':>10s}  {'spans':>5s}  name")
    for summary in summaries:
        print(
            f"{summary.trace_id}  {format_ms(summary.duration_ns):>10s}  {summary.span_count:5d}  "
            f"{summary.name}"
        )
    return 0
