"""Prometheus alerts generated from an SloConfig, and ``stagelens slo render``.

Why generated: like Sloth, the multi-window multi-burn-rate expressions are mechanical and easy
to get subtly wrong by hand (a factor applied to the wrong window, two pairs paging twice for
one burn). Rendering them from one validated config keeps alerts, runbook and dashboards in
step; the committed default files are regenerated in CI and diffed.

What makes them fit to page on: the burn-rate pairs of one severity are one alert (a burn
that trips two pairs is one page); a pair needs ``min_requests`` requests and
``min_bad_events`` bad ones in its long window (three failures in thirty requests an hour page
nobody); a page does not resolve because traffic stopped (a pair whose short window holds no
request is judged by its long window, which keeps the bad requests until they age out, and
StagelensTrafficStopped pages before they do); silence is an alert of its own (traffic gone,
SLI counters missing, a target down or vanished); causes (engine saturation, one backend
down, GPU busy, telemetry trouble) are tickets, symptoms a user feels (SLO burn, no backend,
no gateway, runaway spend, no traffic) are pages; every aggregation keeps ``cluster`` and
``namespace``.
"""

from __future__ import annotations

from typing import Any, Final

import yaml

from stagelens.slo.alert_names import (
    ALERT_ANSWER_BUDGET_BURN,
    ALERT_AVAILABILITY_BUDGET_BURN,
    ALERT_BACKEND_DOWN,
    ALERT_BILLING_DRIFT,
    ALERT_ENGINE_SATURATED,
    ALERT_GATEWAY_ABSENT,
    ALERT_GOODPUT_BUDGET_BURN,
    ALERT_GPU_COLLECTOR_DOWN,
    ALERT_GPU_SATURATED,
    ALERT_ITL_BUDGET_BURN,
    ALERT_KV_HIT_RATE_COLLAPSE,
    ALERT_METRICS_SPLIT,
    ALERT_NO_BACKEND_UP,
    ALERT_SLI_COUNTERS_ABSENT,
    ALERT_SPANS_DROPPED,
    ALERT_STAGE_OVER_BUDGET,
    ALERT_TARGET_DOWN,
    ALERT_TARGET_VANISHED,
    ALERT_TELEMETRY_ERRORS,
    ALERT_TRAFFIC_STOPPED,
    ALL_ALERTS,
    BURN_ALERTS,
    DASHBOARD_ENGINE_GPU,
    DASHBOARD_REQUEST_PATH,
    DASHBOARD_SLOS,
    DASHBOARD_TOKENS_COST,
    LABEL_SIGNAL,
    SIGNAL_KV_CACHE,
    SIGNAL_PREEMPTIONS,
    SIGNAL_QUEUE,
)
from stagelens.slo.alerting import Rule
from stagelens.slo.config import SloConfig
from stagelens.slo.cost_alerts import billing_alert, cost_alerts
from stagelens.slo.serving_alerts import serving_alerts
from stagelens.slo.slo_alerts import burn_alerts, burn_expr, class_thresholds_text, p95_alert
from stagelens.slo.target_alerts import (
    monitored_jobs,
    none_up,
    self_alerts,
    silence_alerts,
    target_alerts,
)

__all__ = [
    "ALERTS_FILE",
    "ALERT_ANSWER_BUDGET_BURN",
    "ALERT_AVAILABILITY_BUDGET_BURN",
    "ALERT_BACKEND_DOWN",
    "ALERT_BILLING_DRIFT",
    "ALERT_ENGINE_SATURATED",
    "ALERT_GATEWAY_ABSENT",
    "ALERT_GOODPUT_BUDGET_BURN",
    "ALERT_GPU_COLLECTOR_DOWN",
    "ALERT_GPU_SATURATED",
    "ALERT_GROUPS",
    "ALERT_ITL_BUDGET_BURN",
    "ALERT_KV_HIT_RATE_COLLAPSE",
    "ALERT_METRICS_SPLIT",
    "ALERT_NO_BACKEND_UP",
    "ALERT_SLI_COUNTERS_ABSENT",
    "ALERT_SPANS_DROPPED",
    "ALERT_STAGE_OVER_BUDGET",
    "ALERT_TARGET_DOWN",
    "ALERT_TARGET_VANISHED",
    "ALERT_TELEMETRY_ERRORS",
    "ALERT_TRAFFIC_STOPPED",
    "ALL_ALERTS",
    "BURN_ALERTS",
    "DASHBOARD_ENGINE_GPU",
    "DASHBOARD_REQUEST_PATH",
    "DASHBOARD_SLOS",
    "DASHBOARD_TOKENS_COST",
    "LABEL_SIGNAL",
    "RULES_FILE",
    "RUNBOOK_FILE",
    "SIGNAL_KV_CACHE",
    "SIGNAL_PREEMPTIONS",
    "SIGNAL_QUEUE",
    "BlockDumper",
    "Rule",
    "burn_expr",
    "class_thresholds_text",
    "dump_yaml",
    "monitored_jobs",
    "none_up",
    "render_alerts",
]

RULES_FILE: Final = "stagelens-rules.yaml"
ALERTS_FILE: Final = "stagelens-alerts.yaml"
RUNBOOK_FILE: Final = "runbook.md"

ALERT_GROUPS: Final[tuple[str, ...]] = (
    "stagelens-slo.alerts",
    "stagelens-cost.alerts",
    "stagelens-serving.alerts",
    "stagelens-targets.alerts",
    "stagelens-self.alerts",
)


def render_alerts(cfg: SloConfig) -> dict[str, Any]:
    """The alert file as a mapping (``groups:`` ...)."""
    rules = (
        [*burn_alerts(cfg), p95_alert(cfg)],
        [*cost_alerts(cfg), billing_alert(cfg)],
        serving_alerts(cfg),
        [*target_alerts(cfg), *silence_alerts(cfg)],
        self_alerts(cfg),
    )
    return {
        "groups": [
            {"name": name, "rules": group} for name, group in zip(ALERT_GROUPS, rules, strict=True)
        ]
    }


class BlockDumper(yaml.SafeDumper):
    """Block scalars for multi-line expressions, so the files read like hand-written rules."""


def _str_presenter(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


BlockDumper.add_representer(str, _str_presenter)


def dump_yaml(data: dict[str, Any]) -> str:
    """Deterministic YAML with a generated-file header."""
    body = yaml.dump(data, Dumper=BlockDumper, sort_keys=False, width=100, allow_unicode=False)
    return "# Generated by `stagelens slo render`; do not edit by hand.\n" + body
