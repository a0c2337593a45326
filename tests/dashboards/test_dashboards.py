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
from stagelens.dashboards.panels import DATASOURCE_VAR, HEATMAP_MIN_INTERVAL, ROW_ORDER_LEGEND

from stagelens import semconv as sc
from stagelens.slo.config import SloConfig
from stagelens.slo.record_names import ttft_p95_record
from stagelens.slo.recording_rules import render_rules

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
            # grafana-foundation-sdk 11.6.0 (pinned in pyproject) emits schema 41; a new SDK
            # that migrates the schema must be reviewed, not slip in through regeneration.
            assert boards[f"{stem}.json"]["schemaVersion"] == 41

    def test_gnet_flavour_has_inputs_and_requires(self) -> None:
        """The grafana.com flavour declares its datasource input and the panel plugins it needs."""
        for name, board in _dashboards().items():
            if not name.endswith(".gnet.json"):
                continue
            assert board["__inputs"][0]["pluginId"] == "prometheus"
            required = {r["id"] for r in board["__requires"] if r["type"] == "panel"}
            assert required == {p["type"] for p in board["panels"]} - {"row"}


def _panel(board: str, title: str) -> dict[str, Any]:
    panels = [p for p in _dashboards()[board]["panels"] if p["title"] == title]
    assert len(panels) == 1, title
    return panels[0]


VARIABLES = ("model", "tenant", "cluster", "namespace", "instance", "gpu")


def _concrete(expr: str) -> str:
    expr = (
        expr.replace("$__rate_interval", "5m")
        .replace("$__range", "1h")
        .replace("$__interval", "1m")
    )
    for name in VARIABLES:
        expr = expr.replace(f"${name}", ".*")
    return expr


def _promtool_eval(tmp_path: Path, series: list[dict[str, str]], tests: list[Any]) -> str:
    """Run ``promtool test rules`` with ``promql_expr_test`` cases; returns its output."""
    (tmp_path / "none.yaml").write_text("groups: []\n")
    suite = {
        "rule_files": ["none.yaml"],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": series, "promql_expr_test": tests}],
    }
    (tmp_path / "suite.yaml").write_text(yaml.safe_dump(suite, sort_keys=False))
    result = subprocess.run(
        [PROMTOOL, "test", "rules", "suite.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


# Labels that carry the served model: ours say ``model``, vLLM's own say ``model_name``.
_MODEL_LABELLED = {
    sc.STAGE_DURATION,
    sc.REQUEST_DURATION,
    sc.TIME_TO_FIRST_TOKEN,
    sc.INTER_TOKEN_LATENCY,
    sc.ENGINE_PHASE_DURATION,
    sc.REQUESTS,
    sc.TOKENS,
    sc.COST_USD,
    sc.KV_CACHE_QUERIES,
    sc.KV_CACHE_HITS,
    sc.KV_CACHE_USAGE,
    sc.ENGINE_REQUESTS_RUNNING,
    sc.ENGINE_REQUESTS_WAITING,
    sc.ENGINE_PREEMPTIONS,
    sc.REJECTIONS,
    sc.SLI_REQUESTS,
    sc.SLI_ERRORS,
    sc.UPSTREAM_TTFT,
}
FLEET_PANELS = {"GPU-time cost per output token (fleet)"}
"""Panels that divide fleet-wide figures on purpose (GPUs belong to no model or tenant)."""
_MODEL_RECORDS = {
    r["record"]
    for g in render_rules(SloConfig())["groups"]
    for r in g["rules"]
    if "model" in r["expr"] or r["record"].startswith("stagelens:sli")
}
_SELECTOR_RE = re.compile(r"(?<![\w:\"])((?:stagelens|vllm)[A-Za-z0-9_:]*)(\{[^}]*\})?")


class TestQueries:
    def test_no_query_fakes_a_series(self) -> None:
        """No panel pads its result with a constant (``or vector(0)``): an empty panel must
        show as empty, and the e2e "every panel returns series" check must be able to fail."""
        for board in _dashboards().values():
            for title, expr in panel_queries(board):
                assert "vector(0)" not in expr.replace(" ", ""), title

    def test_every_model_labelled_metric_honours_the_model_variable(self) -> None:
        """Every selector of a metric with a model label filters on ``$model`` (``model`` for
        stagelens metrics and their recording rules, ``model_name`` for vLLM's)."""
        checked = 0
        for board in _dashboards().values():
            for title, expr in panel_queries(board):
                for metric, selector in _SELECTOR_RE.findall(expr):
                    base = re.sub(r"_(bucket|sum|count)$", "", metric)
                    if metric.startswith("vllm:"):
                        assert 'model_name=~"$model"' in selector, f"{title}: {metric}"
                    elif title in FLEET_PANELS:
                        assert "$model" not in selector, f"{title}: {metric}"
                    elif base in _MODEL_LABELLED or metric in _MODEL_RECORDS:
                        assert 'model=~"$model"' in selector, f"{title}: {metric}"
                    else:
                        continue
                    checked += 1
        assert checked > 40

    def test_stage_budget_table_rows_follow_request_order(self, tmp_path: Path) -> None:
        """The budget table sorts on its hidden row-order query, which ranks the stages in the
        contract's request order (Grafana's merge alone keeps Prometheus' arbitrary order)."""
        panel = _panel("stagelens-request-path.json", "Stage latency budget")
        order = [t for t in panel["targets"] if t["legendFormat"] == ROW_ORDER_LEGEND]
        assert len(order) == 1
        field = f"Value #{order[0]['refId']}"
        ids = [t["id"] for t in panel["transformations"]]
        assert ids == ["merge", "sortBy", "organize"]
        assert panel["transformations"][1]["options"]["sort"] == [{"field": field}]
        assert panel["transformations"][2]["options"]["excludeByName"][field] is True
        if not Path(PROMTOOL).exists():
            pytest.skip("promtool not installed")
        contract = ["gateway", "load_balancer", "tokenizer", "router", "inference"]
        contract += ["postprocess", "billing"]
        samples = [
            {"labels": f'{{stage="{stage}"}}', "value": position}
            for position, stage in enumerate(contract, start=1)
        ]
        _promtool_eval(
            tmp_path,
            [{"series": "up", "values": "1x5"}],
            [{"expr": order[0]["expr"], "eval_time": "1m", "exp_samples": samples}],
        )

    @pytest.mark.skipif(not Path(PROMTOOL).exists(), reason="promtool not installed")
    def test_gpu_cost_per_token_uses_the_exported_price(self, tmp_path: Path) -> None:
        """GPU-time cost per output token = sum of stagelens_gpu_cost_usd_per_hour / 3600 per
        output token; the SLO-config price x GPUs only where no GPU exports a price."""
        panel = _panel("stagelens-tokens-cost.json", "GPU-time cost per output token (fleet)")
        expr = _concrete(panel["targets"][0]["expr"].replace("$model", "tiny"))
        price = SloConfig().gpu_hourly_cost_usd
        # 2 output tokens per second in all, from two models: the GPUs serve both, so the
        # cost per token divides by both whatever model the variable picks (finding 14).
        tokens = [
            {
                "series": f'stagelens_tokens_total{{model="{model}", tenant="a", type="output"}}',
                "values": "0+60x20",
            }
            for model in ("tiny", "big")
        ]
        gpus = [
            {
                "series": f'{sc.GPU_MEMORY_TOTAL}{{gpu="{i}", uuid="U{i}", name="H100"}}',
                "values": "8e10x20",
            }
            for i in (0, 1)
        ]
        priced = [
            {
                "series": f'{sc.GPU_COST_PER_HOUR}{{gpu="{i}", uuid="U{i}", name="H100"}}',
                "values": f"{usd}x20",
            }
            for i, usd in ((0, 2.5), (1, 3.5))
        ]
        exported = (2.5 + 3.5) / 3600 / 2
        fallback = 2 * price / 3600 / 2
        assert exported != fallback
        for series, value in ((gpus + priced, exported), (gpus, fallback)):
            _promtool_eval(
                tmp_path,
                [*tokens, *series],
                [
                    {
                        "expr": expr,
                        "eval_time": "10m",
                        "exp_samples": [{"labels": "{}", "value": value}],
                    }
                ],
            )


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
        """rate()/increase() on time series panels use $__rate_interval (tables may use
        $__range); heatmaps use increase over $__interval with a minimum interval, so that
        neighbouring cells never count one observation twice. A panel that draws an alert's
        own figure (it names the alert's recording rule) uses that rule's window instead."""
        cfg = SloConfig()
        alert_figure = (ttft_p95_record(cfg.ttft_p95_window), cfg.ttft_p95_window)
        for board in _dashboards().values():
            for panel in board["panels"]:
                if panel["type"] not in {"timeseries", "heatmap"}:
                    continue
                heatmap = panel["type"] == "heatmap"
                if heatmap:
                    assert panel["interval"] == HEATMAP_MIN_INTERVAL, panel["title"]
                for target in panel["targets"]:
                    for window in re.findall(
                        r"(?:rate|increase)\([^\[]*\[([^\]]+)\]", target["expr"]
                    ):
                        wanted = "$__interval" if heatmap else "$__rate_interval"
                        if alert_figure[0] in panel.get("description", ""):
                            wanted = alert_figure[1]
                        assert window == wanted, panel["title"]

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
                concrete = _concrete(expr)
                rules.append({"record": f"lint:query:n{len(rules)}", "expr": concrete})
        path = tmp_path / "queries.yaml"
        path.write_text(yaml.safe_dump({"groups": [{"name": "lint", "rules": rules}]}))
        result = subprocess.run(
            [PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, check=False
        )
        assert result.returncode == 0, result.stdout + result.stderr
        assert len(rules) > 30


def test_previews_hide_the_same_row_order_query() -> None:
    """previews.py (no grafana SDK import) names the hidden row-order legend as panels.py does."""
    from stagelens.views import previews

    assert previews.ROW_ORDER_LEGEND == ROW_ORDER_LEGEND
