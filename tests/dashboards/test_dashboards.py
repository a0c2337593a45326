"""The generated dashboards: reproducible, linted, and every query valid PromQL on known metrics."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from stagelens.dashboards import build
from stagelens.dashboards.panels import DATASOURCE_VAR

from stagelens import semconv as sc
from stagelens.alert_rules import render_rules
from stagelens.slo import SloConfig

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD_DIR = ROOT / "dashboards"
MODERN_PANELS = {"timeseries", "stat", "table", "heatmap", "bargauge", "row"}
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"


def _dashboards() -> dict[str, dict[str, Any]]:
    return {
        p.name: json.loads(p.read_text(encoding="utf-8"))
        for p in sorted(DASHBOARD_DIR.glob("*.json"))
    }


def panel_queries(board: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, expr) for every query of every non-row panel."""
    return [
        (panel["title"], target["expr"])
        for panel in board["panels"]
        if panel["type"] != "row"
        for target in panel["targets"]
    ]


def _known_metrics() -> set[str]:
    names = {v for k, v in vars(sc).items() if k.isupper() and isinstance(v, str)}
    suffixed = {f"{n}{s}" for n in names for s in ("_bucket", "_sum", "_count")}
    records = {r["record"] for g in render_rules(SloConfig())["groups"] for r in g["rules"]}
    return names | suffixed | records


_METRIC_RE = re.compile(r"(?<![\w:\"])((?:stagelens|vllm|DCGM_)[A-Za-z0-9_:]*)")


class TestGenerated:
    def test_regenerating_is_byte_identical(self, tmp_path: Path) -> None:
        """Building from the default config reproduces the committed JSON byte for byte."""
        build.write_all(SloConfig(), tmp_path)
        fresh = sorted(p.name for p in tmp_path.glob("*.json"))
        assert fresh == sorted(p.name for p in DASHBOARD_DIR.glob("*.json"))
        for name in fresh:
            assert (tmp_path / name).read_bytes() == (DASHBOARD_DIR / name).read_bytes(), name

    def test_four_dashboards_with_stable_uids(self) -> None:
        """The four dashboards exist with uid equal to their file stem and the stagelens tag."""
        boards = _dashboards()
        stems = {"stagelens-request-path", "stagelens-tokens-cost", "stagelens-engine-gpu"}
        stems.add("stagelens-slos")
        for stem in stems:
            assert boards[f"{stem}.json"]["uid"] == stem
            assert "stagelens" in boards[f"{stem}.json"]["tags"]
            assert isinstance(boards[f"{stem}.json"]["schemaVersion"], int)

    def test_gnet_flavour_has_inputs_and_requires(self) -> None:
        """The grafana.com flavour declares its datasource input and the panel plugins it needs."""
        for name, board in _dashboards().items():
            if not name.endswith(".gnet.json"):
                continue
            assert board["__inputs"][0]["pluginId"] == "prometheus"
            required = {r["id"] for r in board["__requires"] if r["type"] == "panel"}
            assert required == {p["type"] for p in board["panels"]} - {"row"}


class TestLint:
    @pytest.mark.parametrize("name", sorted(p.name for p in DASHBOARD_DIR.glob("*.json")))
    def test_panels_follow_house_rules(self, name: str) -> None:
        """Every panel: modern type, unique id, a unit, $datasource on panel and query."""
        board = _dashboards()[name]
        variables = {v["name"]: v for v in board["templating"]["list"]}
        assert variables[DATASOURCE_VAR]["type"] == "datasource"
        ids = [p["id"] for p in board["panels"]]
        assert len(ids) == len(set(ids))
        for panel in board["panels"]:
            assert panel["type"] in MODERN_PANELS, panel["title"]
            if panel["type"] == "row":
                continue
            assert panel["fieldConfig"]["defaults"]["unit"], panel["title"]
            assert panel["datasource"]["uid"] == f"${{{DATASOURCE_VAR}}}"
            for target in panel["targets"]:
                assert target["datasource"]["uid"] == f"${{{DATASOURCE_VAR}}}"

    def test_range_queries_use_rate_interval(self) -> None:
        """rate()/increase() on graph panels use $__rate_interval (tables may use $__range)."""
        for board in _dashboards().values():
            for panel in board["panels"]:
                if panel["type"] not in {"timeseries", "heatmap"}:
                    continue
                for target in panel["targets"]:
                    for window in re.findall(
                        r"(?:rate|increase)\([^\[]*\[([^\]]+)\]", target["expr"]
                    ):
                        assert window == "$__rate_interval", panel["title"]

    def test_every_metric_is_catalogued(self) -> None:
        """Every metric a query reads is in semconv (ours, vLLM's, DCGM's) or a recording rule."""
        known = _known_metrics()
        for board in _dashboards().values():
            for title, expr in panel_queries(board):
                for metric in _METRIC_RE.findall(expr):
                    assert metric in known, f"{title}: {metric}"

    @pytest.mark.skipif(not Path(PROMTOOL).exists(), reason="promtool not installed")
    def test_every_query_parses(self, tmp_path: Path) -> None:
        """promtool accepts every panel query (Grafana variables substituted) as valid PromQL."""
        rules = []
        for board in _dashboards().values():
            for _, expr in panel_queries(board):
                concrete = (
                    expr.replace("$__rate_interval", "5m")
                    .replace("$__range", "1h")
                    .replace("$model", ".*")
                    .replace("$tenant", ".*")
                )
                rules.append({"record": f"lint:query:n{len(rules)}", "expr": concrete})
        path = tmp_path / "queries.yaml"
        path.write_text(yaml.safe_dump({"groups": [{"name": "lint", "rules": rules}]}))
        result = subprocess.run(
            [PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, check=False
        )
        assert result.returncode == 0, result.stdout + result.stderr
        assert len(rules) > 30
