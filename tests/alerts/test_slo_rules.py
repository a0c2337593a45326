"""The SLO config and the rule generator: validation, determinism, committed files current."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from stagelens import semconv as sc
from stagelens.alert_rules import (
    ALERTS_FILE,
    ALL_ALERTS,
    RULES_FILE,
    dump_yaml,
    render_alerts,
    render_rules,
    write_rule_files,
)
from stagelens.cli import main
from stagelens.errors import ConfigurationError
from stagelens.slo import SloConfig, duration_seconds, load_slo_config, slo_config_from_mapping

ROOT = Path(__file__).resolve().parents[2]


class TestSloConfig:
    def test_defaults_match_the_contract(self) -> None:
        """Default threshold 0.5 s, objective 95 %, period 30d and the four burn pairs."""
        cfg = SloConfig()
        assert cfg.ttft_threshold_seconds == 0.5
        assert cfg.ttft_objective == 0.95
        assert cfg.period == "30d"
        pairs = [(w.long, w.short, w.factor, w.severity) for w in cfg.ttft_burn_windows]
        assert pairs == [
            ("1h", "5m", 14.4, "page"),
            ("6h", "30m", 6, "page"),
            ("1d", "2h", 3, "ticket"),
            ("3d", "6h", 1, "ticket"),
        ]
        cost = [(w.long, w.short, w.factor, w.severity) for w in cfg.cost_burn_windows]
        assert cost == [("1h", "5m", 6, "page"), ("6h", "30m", 2, "ticket")]

    def test_threshold_off_bucket_boundary_is_rejected(self) -> None:
        """A TTFT threshold that is not a bucket boundary raises ConfigurationError."""
        with pytest.raises(ConfigurationError, match="bucket boundary"):
            slo_config_from_mapping({"ttft_threshold_seconds": 0.6})

    def test_bad_duration_and_unknown_key_are_rejected(self) -> None:
        """Malformed durations and unknown keys raise ConfigurationError, not pydantic errors."""
        with pytest.raises(ConfigurationError):
            slo_config_from_mapping({"period": "thirty days"})
        with pytest.raises(ConfigurationError):
            slo_config_from_mapping({"ttft_treshold_seconds": 0.5})

    def test_duration_seconds(self) -> None:
        """Prometheus durations convert to float seconds."""
        assert duration_seconds("30d") == 2592000
        assert duration_seconds("5m") == 300
        assert isinstance(duration_seconds("5m"), (int, float))

    def test_load_from_yaml(self, tmp_path: Path) -> None:
        """A YAML file overrides the defaults it names and keeps the rest."""
        path = tmp_path / "slo.yaml"
        path.write_text("ttft_threshold_seconds: 0.25\ndaily_budgets_usd: {acme: 5}\n")
        cfg = load_slo_config(path)
        assert cfg.ttft_threshold_seconds == 0.25
        assert cfg.daily_budgets_usd == {"acme": 5.0}
        assert cfg.ttft_objective == 0.95


class TestRuleGenerator:
    def test_committed_files_are_current(self) -> None:
        """alerts/*.yaml equal what the default config renders (the drift check in a test)."""
        cfg = SloConfig()
        assert (ROOT / "alerts" / RULES_FILE).read_text() == dump_yaml(render_rules(cfg))
        assert (ROOT / "alerts" / ALERTS_FILE).read_text() == dump_yaml(render_alerts(cfg))

    def test_every_alert_has_the_required_fields_and_runbook_anchor(self) -> None:
        """Every alert carries severity, summary, description and a runbook anchor that exists."""
        runbook = (ROOT / "alerts" / "runbook.md").read_text()
        rules = [r for g in render_alerts(SloConfig())["groups"] for r in g["rules"]]
        assert {r["alert"] for r in rules} == set(ALL_ALERTS)
        for rule in rules:
            assert rule["labels"]["severity"] in {"page", "ticket"}
            assert set(rule["annotations"]) == {"summary", "description", "runbook_url"}
            anchor = rule["annotations"]["runbook_url"].split("#")[1]
            assert f"## {rule['alert']}\n" in runbook
            assert anchor == rule["alert"].lower()

    def test_recording_rules_follow_level_metric_operations(self) -> None:
        """Every recording rule name has exactly three colon-separated parts."""
        records = [r["record"] for g in render_rules(SloConfig())["groups"] for r in g["rules"]]
        assert "stagelens:ttft_slo_errors:ratio_rate5m" in records
        for name in records:
            assert len(name.split(":")) == 3, name

    def test_threshold_is_the_le_bucket(self) -> None:
        """The SLI counts the bucket whose `le` equals the configured threshold."""
        cfg = slo_config_from_mapping({"ttft_threshold_seconds": 0.25})
        exprs = [r["expr"] for g in render_rules(cfg)["groups"] for r in g["rules"]]
        assert any(f'{sc.TIME_TO_FIRST_TOKEN}_bucket{{le="0.25"}}' in e for e in exprs)

    def test_configured_budgets_become_fallback_series(self) -> None:
        """daily_budgets_usd renders one labelled recording rule per tenant."""
        cfg = slo_config_from_mapping({"daily_budgets_usd": {"acme": 12.5}})
        rules = [r for g in render_rules(cfg)["groups"] for r in g["rules"]]
        budget = [r for r in rules if r.get("labels", {}).get("tenant") == "acme"]
        assert budget == [
            {
                "record": "stagelens:budget_usd:configured",
                "expr": "vector(12.5)",
                "labels": {"tenant": "acme", "window": "1d"},
            }
        ]

    def test_cli_render_writes_both_files(self, tmp_path: Path) -> None:
        """`stagelens slo render --config --out` writes parseable rules for the user's config."""
        cfg = tmp_path / "slo.yaml"
        cfg.write_text("ttft_threshold_seconds: 1.0\nttft_objective: 0.99\n")
        assert main(["slo", "render", "--config", str(cfg), "--out", str(tmp_path / "out")]) == 0
        alerts = yaml.safe_load((tmp_path / "out" / ALERTS_FILE).read_text())
        p95 = [
            r for g in alerts["groups"] for r in g["rules"] if r["alert"] == sc.ALERT_TTFT_P95_HIGH
        ]
        assert p95[0]["expr"].startswith("stagelens:ttft_seconds:p95_rate5m > 1.0")

    def test_cli_reports_invalid_config(self, tmp_path: Path) -> None:
        """An invalid config makes the CLI exit 2 instead of writing files."""
        cfg = tmp_path / "slo.yaml"
        cfg.write_text("ttft_threshold_seconds: 0.3\n")
        assert main(["slo", "render", "--config", str(cfg), "--out", str(tmp_path / "o")]) == 2
        assert not (tmp_path / "o").exists()

    def test_write_is_deterministic(self, tmp_path: Path) -> None:
        """Rendering twice gives byte-identical files."""
        first = [p.read_bytes() for p in write_rule_files(SloConfig(), tmp_path / "a")]
        second = [p.read_bytes() for p in write_rule_files(SloConfig(), tmp_path / "b")]
        assert first == second
