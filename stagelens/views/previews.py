"""``stagelens dashboards preview``: draw each dashboard from live Prometheus to PNG.

Why: the README should show what the dashboards look like on real data without a Grafana
server. matplotlib draws every panel from the queries Grafana would run (variables "all"),
where the dashboard puts it (its ``gridPos``, rows included), with the panel's unit applied
to the axis, its threshold lines and colours, stacked series stacked, and heatmaps as
heatmaps (cumulative ``le`` buckets turned into per-bucket counts, as Grafana's heatmap
format does).
"""

from __future__ import annotations

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
GRID_ROW_INCHES: Final = 0.42
"""Height of one Grafana grid unit (30 px) in the picture."""
WIDTH_INCHES: Final = 20.0
VARIABLES: Final = ("model", "tenant", "cluster", "namespace", "instance", "gpu")

Result = list[dict[str, Any]]


def _substitute(expr: str, window: str, span: str) -> str:
    expr = (
        expr.replace("$__rate_interval", window)
        .replace("$__range", span)
        .replace("$__interval", window)
    )
    for name in VARIABLES:
        expr = expr.replace(f"${name}", ".*")
    return expr


def _get(prometheus: str, path: str, params: dict[str, Any]) -> Result:
    url = f"{prometheus}{path}?" + urllib.parse.urlencode(params)
    with urllib.request.urlopen(url, timeout=60) as response:
        body = json.loads(response.read())
    result: Result = body["data"]["result"]
    return result


def _legend(fmt: str, labels: dict[str, str]) -> str:
    text = fmt
    for key, value in labels.items():
        text = text.replace("{{" + key + "}}", value)
    while "{{" in text and "}}" in text:
        start, end = text.index("{{"), text.index("}}")
        text = text[:start] + text[end + 2 :]
    return " ".join(text.split()) or json.dumps(labels)


_SCALES: Final[dict[str, tuple[tuple[float, str], ...]]] = {
    "s": ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs")),
    "bytes": ((2.0**30, "GiB"), (2.0**20, "MiB"), (2.0**10, "KiB"), (1.0, "B")),
}


def format_value(value: float, unit: str, digits: int = 3) -> str:
    """``value`` as Grafana shows it with ``unit`` (the units the dashboards use), to
    ``digits`` significant digits."""
    if math.isnan(value):
        return "NaN"
    g = f".{digits}g"
    if unit == "percentunit":
        return f"{value * 100:{g}}%"
    if unit == "currencyUSD":
        return f"${value:{g}}"
    if unit == "watt":
        return f"{value:{g}} W"
    if unit == "reqps":
        return f"{value:{g}} req/s"
    if unit.startswith("suffix:"):
        return f"{value:{g}}{unit[len('suffix:') :]}"
    for factor, name in _SCALES.get(unit, ()):
        if abs(value) >= factor or factor == _SCALES[unit][-1][0]:
            return f"{value / factor:{g}} {name}"
    return f"{value:{g}}"


def _color(value: float, steps: list[dict[str, Any]]) -> str:
    """The colour of ``value`` by threshold steps, as Grafana picks it."""
    names = {"green": "#37872d", "red": "#c4162a", "yellow": "#e0b400", "text": "#333333"}
    color = "text"
    for step in steps:
        if step.get("value") is None or value >= step["value"]:
            color = step["color"]
    return names.get(color, color)


class _Panel:
    """One panel's queries evaluated, and the drawing of it."""

    def __init__(self, panel: dict[str, Any], prometheus: str, start: float, end: float) -> None:
        self.panel = panel
        defaults = panel.get("fieldConfig", {}).get("defaults", {})
        self.unit: str = defaults.get("unit", "")
        self.steps: list[dict[str, Any]] = defaults.get("thresholds", {}).get("steps", [])
        self.threshold_style = defaults.get("custom", {}).get("thresholdsStyle", {}).get("mode")
        self.stacked = defaults.get("custom", {}).get("stacking", {}).get("mode") == "normal"
        self.unstacked = {
            o["matcher"]["options"]
            for o in panel.get("fieldConfig", {}).get("overrides", [])
            if o["matcher"]["id"] == "byFrameRefID"
        }
        span = max(60.0, end - start)
        window = f"{max(60, int(span / 60))}s"
        self.series: list[tuple[str, str, Result]] = []
        for target in panel["targets"]:
            expr = _substitute(target["expr"], window, f"{int(span)}s")
            legend = target.get("legendFormat", "")
            if panel["type"] in {"timeseries", "heatmap"}:
                step = max(15.0, span / 150)
                params = {"query": expr, "start": start, "end": end, "step": step}
                result = _get(prometheus, "/api/v1/query_range", params)
            else:
                result = _get(prometheus, "/api/v1/query", {"query": expr, "time": end})
            self.series.append((target["refId"], legend, result))
        self.end = end

    def draw(self, ax: Any) -> None:
        kind = self.panel["type"]
        drawer = {
            "timeseries": self._timeseries,
            "heatmap": self._heatmap,
            "stat": self._stat,
            "bargauge": self._bargauge,
            "table": self._table,
        }[kind]
        ax.set_title(self.panel["title"], fontsize=10, loc="left")
        ax.tick_params(labelsize=6)
        if not any(result for _, _, result in self.series):
            ax.axis("off")
            ax.text(0.5, 0.5, "No data", ha="center", va="center", fontsize=9, color="#888")
            return
        drawer(ax)

    def _minutes(self, values: list[list[Any]]) -> list[float]:
        return [(float(t) - self.end) / 60 for t, _ in values]

    def _timeseries(self, ax: Any) -> None:
        import numpy as np
        from matplotlib.ticker import FuncFormatter

        stack: list[tuple[list[float], list[float], str]] = []
        for ref, legend, result in self.series:
            for series in result[:12]:
                xs = self._minutes(series["values"])
                ys = [float(v) for _, v in series["values"]]
                label = _legend(legend, series["metric"])[:40]
                if self.stacked and ref not in self.unstacked:
                    stack.append((xs, ys, label))
                else:
                    style = "--" if ref in self.unstacked else "-"
                    ax.plot(xs, ys, style, linewidth=1.2, label=label)
        if stack:
            grid = sorted({x for xs, _, _ in stack for x in xs})
            layers = [np.interp(grid, xs, ys, left=np.nan, right=np.nan) for xs, ys, _ in stack]
            ax.stackplot(
                grid, *np.nan_to_num(layers), labels=[lab for _, _, lab in stack], alpha=0.6
            )
        if self.threshold_style in {"dashed", "line"}:
            for step in self.steps[1:]:
                ax.axhline(
                    step["value"],
                    linestyle="--",
                    linewidth=0.8,
                    color=_color(step["value"], self.steps),
                )
        unit = self.unit
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: format_value(v, unit, 5)))
        ax.set_xlabel("minutes before now", fontsize=6)
        ax.legend(fontsize=6, loc="upper left", ncol=2, framealpha=0.6)
        ax.grid(alpha=0.3)

    def _heatmap(self, ax: Any) -> None:
        import numpy as np

        _, _, result = self.series[0]
        buckets = sorted(result, key=lambda s: float(s["metric"].get("le", "inf")))
        if not buckets:
            return
        xs = self._minutes(buckets[0]["values"])
        cumulative = np.array([[float(v) for _, v in s["values"]] for s in buckets])
        counts = np.diff(cumulative, axis=0, prepend=0)
        counts[counts < 0] = 0
        les = [s["metric"].get("le", "+Inf") for s in buckets]
        labels = [format_value(float(le), self.unit) if le != "+Inf" else "+Inf" for le in les]
        ax.pcolormesh(xs, range(len(les)), np.log1p(counts), cmap="inferno", shading="nearest")
        ax.set_yticks(range(len(les))[:: max(1, len(les) // 8)])
        ax.set_yticklabels(labels[:: max(1, len(les) // 8)], fontsize=6)
        ax.set_xlabel("minutes before now", fontsize=6)

    def _values(self) -> list[tuple[str, float]]:
        out = []
        for _, legend, result in self.series:
            for series in result:
                label = _legend(legend, series["metric"])
                out.append((label, float(series["value"][1])))
        return out

    def _stat(self, ax: Any) -> None:
        values = self._values()[:6]
        ax.axis("off")
        for i, (label, value) in enumerate(values):
            x = (i + 0.5) / len(values)
            ax.text(
                x,
                0.5,
                format_value(value, self.unit),
                ha="center",
                va="center",
                fontsize=16 if len(values) < 4 else 11,
                color=_color(value, self.steps),
                weight="bold",
            )
            ax.text(x, 0.12, label[:24], ha="center", va="center", fontsize=6)

    def _bargauge(self, ax: Any) -> None:
        from matplotlib.ticker import FuncFormatter

        values = self._values()[:10]
        maximum = self.panel["fieldConfig"]["defaults"].get("max", 1.0)
        labels = [label[:30] for label, _ in values]
        numbers = [value for _, value in values]
        ax.barh(labels, numbers, color=[_color(v, self.steps) for v in numbers], height=0.6)
        ax.set_xlim(0, max(maximum, *numbers))
        unit = self.unit
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: format_value(v, unit)))
        for y, value in enumerate(numbers):
            ax.text(value, y, " " + format_value(value, unit), va="center", fontsize=7)

    def _table(self, ax: Any) -> None:
        rows: dict[str, dict[str, float]] = {}
        for _, legend, result in self.series:
            for series in result:
                key = " ".join(series["metric"].values())
                rows.setdefault(key, {})[legend] = float(series["value"][1])
        columns = [legend for _, legend, _ in self.series if legend != ROW_ORDER_LEGEND]
        order = sorted(rows, key=lambda k: (rows[k].get(ROW_ORDER_LEGEND, math.inf), k))
        units = {
            o["matcher"]["options"]: o["properties"][0]["value"]
            for o in self.panel.get("fieldConfig", {}).get("overrides", [])
            if o["matcher"]["id"] == "byName"
        }
        cells = [
            [
                k,
                *(
                    format_value(rows[k][c], units.get(c, self.unit)) if c in rows[k] else ""
                    for c in columns
                ),
            ]
            for k in order
        ]
        ax.axis("off")
        table = ax.table(cellText=cells, colLabels=["", *columns], loc="center")
        table.set_fontsize(7)


def _draw_board(board: dict[str, Any], prometheus: str, start: float, end: float) -> Any:
    import matplotlib.pyplot as plt

    panels = board["panels"]
    bottom = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    height = bottom * GRID_ROW_INCHES + 1.0
    fig = plt.figure(figsize=(WIDTH_INCHES, height))
    fig.text(0.005, 1 - 0.35 / height, board["title"], fontsize=14, weight="bold", va="center")
    top = 1 - 0.8 / height
    unit = GRID_ROW_INCHES / height
    for panel in panels:
        pos = panel["gridPos"]
        left = pos["x"] / 24 + 0.006
        width = pos["w"] / 24 - 0.012
        y = top - (pos["y"] + pos["h"]) * unit
        h = pos["h"] * unit
        if panel["type"] == "row":
            fig.text(0.005, y + h / 2, panel["title"], fontsize=10, weight="bold", va="center")
            continue
        # Room for the title and the axis labels (wider at the page's left edge) in the cell.
        pad = 0.035 if pos["x"] == 0 else 0.025
        ax = fig.add_axes((left + pad, y + h * 0.16, width - pad - 0.005, h * 0.66))
        _Panel(panel, prometheus, start, end).draw(ax)
    return fig


def render_previews(
    prometheus_url: str, out_dir: Path, *, minutes: float = 15.0, end: float | None = None
) -> list[Path]:
    """Write one PNG per dashboard into ``out_dir``; returns the paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    end = time.time() if end is None else end
    start = end - minutes * 60
    written = []
    for name in DASHBOARD_FILES:
        board = json.loads(resources.files("stagelens.dashboards").joinpath(name).read_text())
        fig = _draw_board(board, prometheus_url, start, end)
        path = out_dir / name.replace(".json", ".png")
        fig.savefig(path, dpi=60)
        plt.close(fig)
        written.append(path)
    return written
