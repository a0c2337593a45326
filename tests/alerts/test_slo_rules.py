"""The SLO config and the rule generator: validation, one threshold with the gateway,
determinism, committed files current, runbook complete."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from stagelens import semconv as sc
from stagelens.cli import main
from stagelens.cli.slo import write_rule_files
from stagelens.errors import ConfigurationError
from stagelens.slo.alert_rules import (
    ALERTS_FILE,
    ALL_ALERTS,
    RULES_FILE,
    RUNBOOK_FILE,
    dump_yaml,
    render_alerts,
)
from stagelens.slo.config import (
    SLIS,
    SloConfig,
    duration_seconds,
    gateway_thresholds,
    load_slo_config,
    slo_config_from_mapping,
)
from stagelens.slo.recording_rules import render_rules
from stagelens.slo.runbook import DASHBOARD_UIDS, render_runbook, runbook_entries

ROOT = Path(__file__).resolve().parents[2]


def _alerts(cfg: SloConfig) -> list[dict[str, object]]:
    return [r for g in render_alerts(cfg)["groups"] for r in g["rules"]]


class TestFireable:
    """Issue 26: every SLO the generator accepts can fire."""

    def test_an_unreachable_burn_pair_is_refused_naming_slo_and_pair(self) -> None:
        """Goodput at 90 % with the contract's 14.4x pair needs 144 % bad: refused, and the
        error names the SLO and the window pair."""
        with pytest.raises(ConfigurationError, match=r"goodput SLO .* page pair 1h/5m"):
            slo_config_from_mapping({"burn_windows_by_sli": {}})

    def test_factor_times_budget_of_one_is_refused(self) -> None:
        """A pair needing exactly 100 % bad is refused too (>= 1, not > 1)."""
        pair = {"long": "1h", "short": "5m", "factor": 10, "severity": "page"}
        with pytest.raises(ConfigurationError, match=r"ttft SLO .* 1h/5m"):
            slo_config_from_mapping(
                {
                    "burn_windows_by_sli": {sc.SLI_TTFT: [pair]},
                    "objectives": {
                        sc.SLI_AVAILABILITY: 0.995,
                        sc.SLI_TTFT: 0.9,
                        sc.SLI_ITL: 0.95,
                        sc.SLI_GOODPUT: 0.95,
                    },
                }
            )

    def test_every_default_pair_is_reachable(self) -> None:
        """The defaults: every pair of every SLO needs less than all requests bad; goodput's
        fast page needs 72 %, as TTFT's and ITL's do."""
        cfg = SloConfig()
        for sli in SLIS:
            for w in cfg.windows_for(sli):
                assert w.factor * cfg.error_budget(sli) < 1, (sli, w)
        page = cfg.windows_of("page", sc.SLI_GOODPUT)[0]
        assert page.factor * cfg.error_budget(sc.SLI_GOODPUT) == pytest.approx(0.72)

    def test_the_page_guard_counts_bad_requests(self) -> None:
        """Each pair of the rendered burn alerts requires min_bad_events bad requests in its
        long window, and the runbook states the request floor that implies."""
        cfg = slo_config_from_mapping({"min_bad_events": 7})
        for rule in _alerts(cfg):
            if rule["alert"] in {"StagelensAvailabilityBudgetBurn", "StagelensTTFTBudgetBurn"}:
                pairs = str(rule["expr"]).split("\nor\n")
                assert all(p.endswith(" >= 7\n)") for p in pairs), pairs
        assert cfg.request_floor(sc.SLI_AVAILABILITY, cfg.burn_windows[0]) == 98  # 7 / 0.072

    def test_ttft_classes_come_from_the_gateway(self) -> None:
        """Per-class TTFT thresholds default to the gateway's classes; a threshold record per
        class (and one without the label) is rendered."""
        cfg = SloConfig()
        assert cfg.ttft_classes() == (
            ("1024", 0.5),
            ("8192", 1.0),
            ("32768", 2.5),
            ("+Inf", 5.0),
            ("unknown", 0.5),
        )
        rules = [r for g in render_rules(cfg)["groups"] for r in g["rules"]]
        thresholds = [
            (r.get("labels", {}).get(sc.LABEL_PROMPT_SIZE), r["expr"])
            for r in rules
            if r["record"] == "stagelens:ttft_slo_threshold_seconds:configured"
        ]
        assert thresholds[0] == (None, "vector(0.5)")
        assert ("32768", "vector(2.5)") in thresholds

    def test_a_class_threshold_other_than_the_gateways_is_refused(self) -> None:
        """The SLO config cannot judge a class by another threshold than the gateway does."""
        with pytest.raises(ConfigurationError, match="prompt-size classes"):
            slo_config_from_mapping({"ttft_thresholds_by_prompt_size": {"1024": 0.5}})


class TestSloConfig:
    def test_defaults_match_the_contract(self) -> None:
        """Default TTFT threshold 0.5 s, objective 95 %, period 30d and the four burn pairs."""
        cfg = SloConfig()
        assert cfg.ttft_threshold_seconds == 0.5
        assert cfg.objectives[sc.SLI_TTFT] == 0.95
        assert cfg.period == "30d"
        pairs = [(w.long, w.short, w.factor, w.severity) for w in cfg.burn_windows]
        assert pairs == [
            ("1h", "5m", 14.4, "page"),
            ("6h", "30m", 6, "page"),
            ("1d", "2h", 3, "ticket"),
            ("3d", "6h", 1, "ticket"),
        ]
        assert list(cfg.objectives) == list(SLIS)

    def test_threshold_off_bucket_boundary_is_rejected(self, monkeypatch) -> None:
        """A TTFT threshold that is not a bucket boundary raises ConfigurationError, even when
        the gateway is set to it."""
        monkeypatch.setenv("STAGELENS_TTFT_SLO_THRESHOLD_SECONDS", "0.6")
        with pytest.raises(ConfigurationError, match="bucket boundary"):
            slo_config_from_mapping({})

    def test_thresholds_come_from_the_gateway_settings(self, monkeypatch) -> None:
        """Without a value of its own, the SLO config uses the gateway's STAGELENS_* threshold."""
        monkeypatch.setenv("STAGELENS_TTFT_SLO_THRESHOLD_SECONDS", "0.25")
        cfg = load_slo_config()
        assert cfg.ttft_threshold_seconds == 0.25
        assert gateway_thresholds()[0] == 0.25

    def test_a_threshold_that_disagrees_with_the_gateway_is_rejected(self, tmp_path) -> None:
        """An SLO config threshold other than the gateway's raises, naming the setting: the two
        cannot silently describe different SLOs."""
        path = tmp_path / "slo.yaml"
        path.write_text("ttft_threshold_seconds: 0.25\n")
        with pytest.raises(ConfigurationError, match="STAGELENS_TTFT_SLO_THRESHOLD_SECONDS"):
            load_slo_config(path)
        path.write_text("itl_threshold_seconds: 0.05\n")
        with pytest.raises(ConfigurationError, match="STAGELENS_ITL_SLO_THRESHOLD_SECONDS"):
            load_slo_config(path)

    def test_an_agreeing_threshold_is_accepted(self, tmp_path, monkeypatch) -> None:
        """The same value in the config and in the gateway's environment is fine."""
        monkeypatch.setenv("STAGELENS_TTFT_SLO_THRESHOLD_SECONDS", "0.25")
        path = tmp_path / "slo.yaml"
        path.write_text("ttft_threshold_seconds: 0.25\ndaily_budgets_usd: {acme: 5}\n")
        cfg = load_slo_config(path)
        assert cfg.ttft_threshold_seconds == 0.25
        assert cfg.daily_budgets_usd == {"acme": 5.0}

    def test_bad_duration_unknown_key_and_objectives_are_rejected(self) -> None:
        """Malformed durations, unknown keys, a missing SLI objective raise ConfigurationError."""
        with pytest.raises(ConfigurationError):
            slo_config_from_mapping({"period": "thirty days"})
        with pytest.raises(ConfigurationError):
            slo_config_from_mapping({"ttft_treshold_seconds": 0.5})
        with pytest.raises(ConfigurationError, match="objectives"):
            slo_config_from_mapping({"objectives": {"ttft": 0.95}})
        with pytest.raises(ConfigurationError):
            slo_config_from_mapping(
                {"burn_windows": [{"long": "1h", "short": "5m", "factor": 1, "severity": "urgent"}]}
            )

    def test_the_answer_sli_has_a_generous_default_and_old_configs_still_load(
        self, tmp_path
    ) -> None:
        """The answer threshold is the gateway's (10 s by default), its objective 0.95; a
        config naming only the four older SLIs gets the answer's default objective; an
        answer threshold other than the gateway's, or off the TTFT buckets, is refused."""
        cfg = SloConfig()
        assert cfg.answer_threshold_seconds == 10.0
        assert cfg.objectives[sc.SLI_ANSWER] == 0.95
        old = {"availability": 0.999, "ttft": 0.99, "itl": 0.95, "goodput": 0.9}
        assert slo_config_from_mapping({"objectives": old}).objectives[sc.SLI_ANSWER] == 0.95
        with pytest.raises(ConfigurationError, match="STAGELENS_ANSWER_SLO_THRESHOLD_SECONDS"):
            slo_config_from_mapping({"answer_threshold_seconds": 20.0})
        with pytest.raises(ConfigurationError, match="bucket boundary"):
            slo_config_from_mapping({"answer_threshold_seconds": 12.0})

    def test_the_answer_threshold_comes_from_the_gateway(self, monkeypatch) -> None:
        """STAGELENS_ANSWER_SLO_THRESHOLD_SECONDS sets the answer alert's threshold."""
        monkeypatch.setenv("STAGELENS_ANSWER_SLO_THRESHOLD_SECONDS", "20")
        cfg = load_slo_config()
        assert cfg.answer_threshold_seconds == 20.0
        burn = [r for r in _alerts(cfg) if r["alert"] == "StagelensAnswerBudgetBurn"]
        assert {r["labels"]["severity"] for r in burn} == {"page", "ticket"}
        # Each prompt-size class: the base, plus what its TTFT threshold allows beyond 0.5 s.
        assert (
            "1024: 20s, 8192: 20.5s, 32768: 22s, +Inf: 24.5s, unknown: 20s"
            in (burn[0]["annotations"]["description"])
        )

    def test_runbook_url_is_the_runbook_the_project_declares(self) -> None:
        """Every alert's runbook_url starts with the Runbook URL pyproject.toml declares (or
        the configured base): never a repository the project does not name."""
        tomllib = pytest.importorskip("tomllib")
        project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
        declared = project["urls"]["Runbook"]
        assert SloConfig().runbook_base_url == declared
        urls = {
            r["annotations"]["runbook_url"]
            for g in render_alerts(SloConfig())["groups"]
            for r in g["rules"]
        }
        assert urls
        assert all(u.startswith(declared + "#") for u in urls)
        mine = SloConfig(runbook_base_url="https://wiki.example/runbook")
        (first, *_) = (r for g in render_alerts(mine)["groups"] for r in g["rules"])
        assert first["annotations"]["runbook_url"].startswith("https://wiki.example/runbook#")

    def test_duration_seconds(self) -> None:
        """Prometheus durations convert to float seconds."""
        assert duration_seconds("30d") == 2592000
        assert duration_seconds("5m") == 300


class TestRuleGenerator:
    def test_committed_files_are_current(self) -> None:
        """alerts/* equal what the default config renders (the drift check in a test)."""
        cfg = SloConfig()
        assert (ROOT / "alerts" / RULES_FILE).read_text() == dump_yaml(render_rules(cfg))
        assert (ROOT / "alerts" / ALERTS_FILE).read_text() == dump_yaml(render_alerts(cfg))
        assert (ROOT / "alerts" / RUNBOOK_FILE).read_text() == render_runbook(cfg)

    def test_every_alert_has_the_required_fields_and_runbook_anchor(self) -> None:
        """Every alert carries severity, summary, description and a runbook anchor that exists."""
        runbook = (ROOT / "alerts" / RUNBOOK_FILE).read_text()
        rules = _alerts(SloConfig())
        assert {r["alert"] for r in rules} == set(ALL_ALERTS)
        for rule in rules:
            assert rule["labels"]["severity"] in {"page", "ticket"}
            assert set(rule["annotations"]) == {
                "summary",
                "description",
                "runbook_url",
                "dashboard_url",
            }
            uid = str(rule["annotations"]["dashboard_url"]).rsplit("/d/", 1)[1].split("?")[0]
            assert uid in DASHBOARD_UIDS.values(), rule["alert"]
            anchor = rule["annotations"]["runbook_url"].split("#")[1]
            assert f"## {rule['alert']}\n" in runbook
            assert anchor == rule["alert"].lower()

    def test_one_alert_per_sli_and_severity(self) -> None:
        """The burn-rate pairs of one severity are one rule (a burn that trips both page pairs
        is one page), and each of them needs a minimum of requests."""
        rules = _alerts(SloConfig())
        burn = [
            r
            for r in rules
            if str(r["alert"]).endswith("BudgetBurn") and r["alert"] != sc.ALERT_COST_BUDGET_BURN
        ]
        keys = [(r["alert"], r["labels"]["severity"]) for r in burn]
        assert len(keys) == len(set(keys)) == 2 * len(SLIS)
        for rule in burn:
            assert str(rule["expr"]).count(">= 30") == 2

    def test_runbook_has_every_part_for_every_alert(self) -> None:
        """Each alert has one runbook entry with meaning, impact, PromQL, a trace query, at
        least one dashboard panel and an action; the panels exist in the dashboards."""
        entries = runbook_entries(SloConfig())
        assert [e.alert for e in entries] == list(ALL_ALERTS)
        titles = {}
        for stem in DASHBOARD_UIDS.values():
            board = json.loads((ROOT / "dashboards" / f"{stem}.json").read_text())
            titles[board["title"]] = {p["title"] for p in board["panels"]}
        for entry in entries:
            assert entry.meaning
            assert entry.impact
            assert entry.promql
            assert entry.actions
            assert entry.traceql.startswith("{")
            assert entry.panels
            for board, panel in entry.panels:
                assert panel in titles[board], (entry.alert, board, panel)

    def test_rules_keep_cluster_and_namespace(self) -> None:
        """Every aggregation in the recording rules keeps cluster (and namespace except for
        GPUs, which two exporters in two namespaces report, and the billing comparison,
        whose vLLM often runs in a namespace of its own: it keeps ``billing_drift_by``)."""
        billing = ("stagelens:billed_", "stagelens:generated_")
        for group in render_rules(SloConfig())["groups"]:
            for rule in group["rules"]:
                for part in str(rule["expr"]).split("by (")[1:]:
                    labels = part.split(")")[0]
                    if ":configured" in part.split(")")[1]:
                        continue  # the config's own value: it has no environment
                    assert labels.startswith("cluster"), (rule["record"], labels)
                    if "uuid" not in labels and not rule["record"].startswith(billing):
                        assert labels.startswith("cluster, namespace"), (rule["record"], labels)

    def test_alert_labels_and_aggregation_labels_are_configurable(self) -> None:
        """alert_labels land on every alert; aggregation_labels replace cluster/namespace."""
        cfg = slo_config_from_mapping(
            {"alert_labels": {"team": "llm"}, "aggregation_labels": ["region"]}
        )
        assert all(r["labels"]["team"] == "llm" for r in _alerts(cfg))
        exprs = " ".join(str(r["expr"]) for g in render_rules(cfg)["groups"] for r in g["rules"])
        assert "by (region, model, sli)" in exprs
        assert "namespace" not in exprs

    def test_recording_rules_follow_level_metric_operations(self) -> None:
        """Every recording rule name has exactly three colon-separated parts."""
        records = [r["record"] for g in render_rules(SloConfig())["groups"] for r in g["rules"]]
        assert "stagelens:sli_errors:ratio_rate5m" in records
        for name in records:
            assert len(name.split(":")) == 3, name

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

    def test_cli_render_writes_the_files(self, tmp_path: Path) -> None:
        """`stagelens slo render --config --out` writes rules, alerts and runbook for the
        user's config."""
        cfg = tmp_path / "slo.yaml"
        cfg.write_text("objectives: {availability: 0.999, ttft: 0.99, itl: 0.95, goodput: 0.9}\n")
        assert main(["slo", "render", "--config", str(cfg), "--out", str(tmp_path / "out")]) == 0
        alerts = yaml.safe_load((tmp_path / "out" / ALERTS_FILE).read_text())
        ttft = [
            r
            for g in alerts["groups"]
            for r in g["rules"]
            if r["alert"] == sc.ALERT_TTFT_BUDGET_BURN and r["labels"]["severity"] == "page"
        ]
        assert "(14.4 * 0.01)" in ttft[0]["expr"]
        assert "objective 0.99" in (tmp_path / "out" / RUNBOOK_FILE).read_text()

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
