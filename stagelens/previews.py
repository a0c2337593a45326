"""``stagelens dashboards preview``: draw each dashboard's panels from live Prometheus to PNG.

Why: the README should show what the dashboards look like on real data without a Grafana
server; matplotlib draws every panel from the same queries Grafana would run (variables
replaced by "all"), one picture per dashboard.
"""

from __future__ import annotations

import argparse
import json
import math
import time
import urllib.parse
import urllib.request
from importlib import resources
from pathlib import Path
from typing import Any, Final

ROW_ORDER_LEGEND: Final = "row order"
"""Legend of a table's hidden row-order query (``stagelens.dashboards.panels``)."""

DASHBOARD_FILES: Final = (
    "stagelens-request-path.json",
    "stagelens-tokens-cost.json",
    "stagelens-engine-gpu.json",
    "stagelens-slos.json",
)


def _substitute(expr: str, window: str, span: str) -> str:
    return (
        expr.replace("$__rate_interval", window)
        .replace("$__range", span)
        .replace("$model", ".*")
        .replace("$tenant", ".*")
    )


def _get(url: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(url, timeout=30) as response:
        body = json.loads(response.read())
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def _legend(fmt: str, labels: dict[str, str]) -> str:
    text = fmt
    for key, value in labels.items():
        text = text.replace("{{" + key + "}}", value)
    while "{{" in text and "}}" in text:
        start, end = text.index("{{"), text.index("}}")
        text = text[:start] + text[end + 2 :]
    return text.strip() or json.dumps(labels)


def _fmt(value: float) -> str:
    return f"{value:.4g}"


def _draw_table(ax: Any, instant: list[tuple[str, list[dict[str, Any]]]]) -> None:
    """Rows joined on their one label, sorted by the hidden row-order query as Grafana does."""
    rows: dict[str, dict[str, float]] = {}
    for legend, result in instant:
        for series in result:
            key = " ".join(series["metric"].values())
            rows.setdefault(key, {})[legend] = float(series["value"][1])
    columns = [legend for legend, _ in instant if legend != ROW_ORDER_LEGEND]
    ordered = sorted(rows, key=lambda k: (rows[k].get(ROW_ORDER_LEGEND, math.inf), k))
    cells = [[k, *(_fmt(rows[k][c]) if c in rows[k] else "" for c in columns)] for k in ordered]
    ax.axis("off")
    if cells:
        table = ax.table(cellText=cells, colLabels=["", *columns], loc="center")
        table.set_fontsize(7)


def _draw_stat(ax: Any, instant: list[tuple[str, list[dict[str, Any]]]]) -> None:
    """The last value in large type, as Grafana's stat panel shows it."""
    values = [float(s["value"][1]) for _, result in instant for s in result]
    ax.axis("off")
    text = "  ".join(_fmt(v) for v in values) or "no data"
    ax.text(0.5, 0.45, text, ha="center", va="center", fontsize=22)


def _draw_bars(ax: Any, instant: list[tuple[str, list[dict[str, Any]]]]) -> None:
    labels = [_legend(legend, s["metric"])[:36] for legend, result in instant for s in result]
    values = [float(s["value"][1]) for _, result in instant for s in result]
    ax.barh(labels, values, height=0.6)


def render_previews(
    prometheus_url: str, out_dir: Path, *, minutes: float = 5.0, window: str = "20s"
) -> list[Path]:
    """Write one PNG per dashboard into ``out_dir``; returns the paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    end = time.time()
    start = end - minutes * 60
    span = f"{int(minutes * 60)}s"
    written = []
    for name in DASHBOARD_FILES:
        board = json.loads(resources.files("stagelens.dashboards").joinpath(name).read_text())
        panels = [p for p in board["panels"] if p["type"] != "row"]
        cols = 3
        rows = math.ceil(len(panels) / cols)
        fig, axes = plt.subplots(rows, cols, figsize=(cols * 5.2, rows * 3.2), squeeze=False)
        for ax, panel in zip(axes.flat, panels, strict=False):
            unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "")
            ax.set_title(f"{panel['title']} [{unit}]", fontsize=9)
            ax.tick_params(labelsize=7)
            instant: list[tuple[str, list[dict[str, Any]]]] = []
            for target in panel["targets"]:
                expr = _substitute(target["expr"], window, span)
                if panel["type"] in {"timeseries", "heatmap"}:
                    step = max(1.0, minutes * 60 / 120)
                    params = {"query": expr, "start": start, "end": end, "step": step}
                    url = f"{prometheus_url}/api/v1/query_range?" + urllib.parse.urlencode(params)
                    for series in _get(url)[:12]:
                        xs = [float(t) - end for t, _ in series["values"]]
                        ys = [float(v) for _, v in series["values"]]
                        label = _legend(target.get("legendFormat", ""), series["metric"])
                        ax.plot(xs, ys, linewidth=1, label=label[:40])
                else:
                    url = f"{prometheus_url}/api/v1/query?" + urllib.parse.urlencode(
                        {"query": expr}
                    )
                    instant.append((target.get("legendFormat", ""), _get(url)))
            if panel["type"] == "table":
                _draw_table(ax, instant)
            elif panel["type"] == "stat":
                _draw_stat(ax, instant)
            elif instant:
                _draw_bars(ax, instant)
            if ax.lines:
                ax.legend(fontsize=6, loc="upper left")
                ax.set_xlabel("seconds before now", fontsize=7)
        for ax in list(axes.flat)[len(panels) :]:
            ax.axis("off")
        fig.suptitle(board["title"], fontsize=12)
        fig.tight_layout()
        path = out_dir / name.replace(".json", ".png")
        fig.savefig(path, dpi=70)
        plt.close(fig)
        written.append(path)
    return written


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
    preview.add_argument("--minutes", type=float, default=5.0, help="time range to draw")
    preview.set_defaults(func=_preview)
