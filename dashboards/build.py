"""Build every stagelens dashboard from the SLO config: ``python -m stagelens.dashboards.build``.

Why code: the queries use the metric names from ``stagelens.semconv`` and the thresholds from
``stagelens.slo.config`` (the same config the alerts are rendered from), so a renamed metric or a
threshold changes dashboards and alerts together. Output is sorted-key JSON with stable uids;
CI regenerates it and fails on any diff. Each dashboard is written twice: the plain file
(file provisioning, kube-prometheus-stack sidecar, UI import with a ``datasource`` variable)
and a ``*.gnet.json`` flavour with ``__inputs``/``__requires`` for grafana.com-style import.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import Dashboard as DashboardModel
from stagelens.dashboards.engine_gpu import engine_gpu
from stagelens.dashboards.panels import DATASOURCE_VAR
from stagelens.dashboards.request_path import request_path
from stagelens.dashboards.slos import slos
from stagelens.dashboards.tokens_cost import tokens_cost

from stagelens.slo.config import SloConfig, load_slo_config

OUT_DIR: Final = Path(__file__).resolve().parent

Builder = Callable[[SloConfig], DashboardModel]


DASHBOARDS: Final[dict[str, Builder]] = {
    "stagelens-request-path": request_path,
    "stagelens-tokens-cost": tokens_cost,
    "stagelens-engine-gpu": engine_gpu,
    "stagelens-slos": slos,
}
"""File stem -> builder; the stem is also the dashboard uid."""


def to_dict(board: DashboardModel) -> dict[str, Any]:
    """The dashboard model as plain JSON data (SDK encoder, then sorted)."""
    data: dict[str, Any] = json.loads(JSONEncoder(sort_keys=True).encode(board))
    for panel_id, panel in enumerate(data["panels"], start=1):
        panel["id"] = panel_id  # stable: position in the builder
    return data


def gnet_flavour(data: dict[str, Any]) -> dict[str, Any]:
    """Add ``__inputs``/``__requires`` so grafana.com-style import asks for a datasource."""
    flavour: dict[str, Any] = json.loads(json.dumps(data))
    types = sorted({p["type"] for p in flavour["panels"] if p["type"] != "row"})
    flavour["__inputs"] = [
        {
            "name": "DS_PROMETHEUS",
            "label": "Prometheus",
            "description": "",
            "type": "datasource",
            "pluginId": "prometheus",
            "pluginName": "Prometheus",
        }
    ]
    flavour["__requires"] = [
        {"type": "grafana", "id": "grafana", "name": "Grafana", "version": "11.0.0"},
        {"type": "datasource", "id": "prometheus", "name": "Prometheus", "version": "1.0.0"},
    ] + [{"type": "panel", "id": t, "name": t, "version": ""} for t in types]
    for variable in flavour["templating"]["list"]:
        if variable["name"] == DATASOURCE_VAR:
            variable["current"] = {
                "selected": True,
                "text": "Prometheus",
                "value": "${DS_PROMETHEUS}",
            }
    flavour["id"] = None
    return flavour


def dump_json(data: dict[str, Any]) -> str:
    """Deterministic JSON: sorted keys, two-space indent, trailing newline."""
    return json.dumps(data, sort_keys=True, indent=2) + "\n"


def render_all(cfg: SloConfig) -> dict[str, str]:
    """File name -> JSON text for every dashboard and its grafana.com flavour."""
    files: dict[str, str] = {}
    for stem, builder in DASHBOARDS.items():
        data = to_dict(builder(cfg))
        files[f"{stem}.json"] = dump_json(data)
        files[f"{stem}.gnet.json"] = dump_json(gnet_flavour(data))
    return files


def write_all(cfg: SloConfig, out_dir: Path = OUT_DIR) -> list[Path]:
    """Write every dashboard file into ``out_dir``; returns the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in render_all(cfg).items():
        path = out_dir / name
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m stagelens.dashboards.build``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--config", type=Path, default=None, help="SLO config YAML")
    parser.add_argument("--out", type=Path, default=OUT_DIR, help="output folder")
    args = parser.parse_args(argv)
    for path in write_all(load_slo_config(args.config), args.out):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
