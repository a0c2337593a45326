"""The generated deploy/ manifests wrap exactly the committed rules and dashboards."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from stagelens.alert_rules import render_alerts, render_rules
from stagelens.deploy import write_all
from stagelens.slo import SloConfig

ROOT = Path(__file__).resolve().parents[2]


class TestDeploy:
    def test_committed_manifests_are_current(self, tmp_path: Path) -> None:
        """Rendering deploy/ again gives the committed files byte for byte."""
        for path in write_all(SloConfig(), tmp_path):
            rel = path.relative_to(tmp_path)
            assert path.read_bytes() == (ROOT / "deploy" / rel).read_bytes(), rel

    def test_prometheus_rule_holds_rules_and_alerts(self) -> None:
        """The PrometheusRule spec equals the recording-rule groups plus the alert groups."""
        doc = yaml.safe_load((ROOT / "deploy/kubernetes/prometheusrule.yaml").read_text())
        assert doc["kind"] == "PrometheusRule"
        cfg = SloConfig()
        assert doc["spec"]["groups"] == render_rules(cfg)["groups"] + render_alerts(cfg)["groups"]

    def test_dashboard_config_maps_carry_sidecar_label(self) -> None:
        """Each dashboard ConfigMap has grafana_dashboard="1" and the committed JSON."""
        text = (ROOT / "deploy/kubernetes/dashboards-configmaps.yaml").read_text()
        docs = list(yaml.safe_load_all(text))
        assert len(docs) == 4
        for doc in docs:
            assert doc["metadata"]["labels"]["grafana_dashboard"] == "1"
            for name, body in doc["data"].items():
                assert json.loads(body) == json.loads((ROOT / "dashboards" / name).read_text())
