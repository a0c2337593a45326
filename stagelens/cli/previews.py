"""``stagelens dashboards preview``: draw every dashboard from live Prometheus to PNG
(``stagelens.views.previews`` draws them)."""

from __future__ import annotations

import argparse
from pathlib import Path

from stagelens.views.previews import render_previews


def _preview(args: argparse.Namespace) -> int:
    for path in render_previews(args.prometheus, args.out, minutes=args.minutes):
        print(path)
    return 0


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``stagelens dashboards preview``."""
    dashboards = subparsers.add_parser("dashboards", help="dashboard tools")
    sub = dashboards.add_subparsers(dest="dashboards_command", metavar="COMMAND", required=True)
    preview = sub.add_parser("preview", help="draw every dashboard from live Prometheus to PNG")
    preview.add_argument("--prometheus", default="http://127.0.0.1:9090", help="Prometheus URL")
    preview.add_argument("--out", type=Path, default=Path("docs/previews"), help="PNG folder")
    preview.add_argument("--minutes", type=float, default=15.0, help="time range to draw")
    preview.set_defaults(func=_preview)
