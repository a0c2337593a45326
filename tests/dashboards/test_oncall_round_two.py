"""What the on-call opens from a page (the second on-call review): the TTFT panels draw
each prompt-size class against its own threshold, and every alert's dashboard link sets
variables the dashboard has."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from stagelens import semconv as sc
from stagelens.slo.alert_rules import render_alerts
from stagelens.slo.config import SloConfig
from tests.dashboards.test_dashboards import PROMTOOL, _dashboards, _promtool_eval
from tests.dashboards.test_findings import REQUEST_PATH, SLOS, _counter, _exprs

needs_promtool = pytest.mark.skipif(not Path(PROMTOOL).exists(), reason="promtool not installed")


@needs_promtool
@pytest.mark.parametrize(
    ("board", "title"),
    [
        (SLOS, "p95 time to first token by model and prompt size"),
        (REQUEST_PATH, "Time to first token"),
    ],
)
def test_each_class_with_traffic_draws_its_own_threshold(
    board: str, title: str, tmp_path: Path
) -> None:
    """With traffic in the 1024 and 32768 classes, the panel's threshold query draws 0.5 s
    and 2.5 s (the classes' own thresholds), and nothing for the classes without traffic;
    before, one 0.5 s line stood for every class."""
    thresholds = _exprs(board, title)[-1]
    series = [
        _counter(f"{sc.TIME_TO_FIRST_TOKEN}_count", 'model="tiny", prompt_size="1024"', 60),
        _counter(f"{sc.TIME_TO_FIRST_TOKEN}_count", 'model="tiny", prompt_size="32768"', 6),
        _counter(f"{sc.TIME_TO_FIRST_TOKEN}_count", 'model="big", prompt_size="32768"', 6),
    ]
    _promtool_eval(
        tmp_path,
        series,
        [
            {
                "expr": thresholds,
                "eval_time": "10m",
                "exp_samples": [
                    {"labels": '{prompt_size="1024"}', "value": 0.5},
                    {"labels": '{prompt_size="32768"}', "value": 2.5},
                ],
            }
        ],
    )


def test_every_alert_link_sets_variables_its_dashboard_has() -> None:
    """Each alert's dashboard_url opens a dashboard that exists with its model, namespace
    and cluster variables (and tenant, gpu) set from the alert's labels."""
    boards = {b["uid"]: b for b in _dashboards().values() if "__inputs" not in b}
    checked = 0
    for group in render_alerts(SloConfig(grafana_url="https://grafana.example/"))["groups"]:
        for rule in group["rules"]:
            url = rule["annotations"]["dashboard_url"]
            assert url.startswith("https://grafana.example/d/"), url
            uid = url.removeprefix("https://grafana.example/d/").split("?")[0]
            variables = {v["name"] for v in boards[uid]["templating"]["list"]}
            named = re.findall(r"\{\{ with \$labels\.(\w+) \}\}&var-(\w+)=", url)
            assert named, url
            assert all(label == var for label, var in named), url
            assert {"cluster", "namespace", "model"} <= {var for _, var in named}
            assert {var for _, var in named} <= variables, (rule["alert"], variables)
            checked += 1
    assert checked > 25
