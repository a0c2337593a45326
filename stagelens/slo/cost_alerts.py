"""The spend alerts: a tenant's cost against its daily cap, and billed against generated
tokens."""

from __future__ import annotations

from stagelens import semconv as sc
from stagelens.slo.alert_names import ALERT_BILLING_DRIFT, DASHBOARD_TOKENS_COST
from stagelens.slo.alerting import Rule, alert_rule
from stagelens.slo.config import SloConfig
from stagelens.slo.recording_rules import (
    BILLING_DRIFT_RECORD,
    COST_SPENT_RECORD,
    GENERATED_TOKENS_RECORD,
    by,
    cost_projected_record,
)


def cost_alerts(cfg: SloConfig) -> list[Rule]:
    multiple = cfg.cost_page_multiple
    return [
        alert_rule(
            cfg,
            sc.ALERT_COST_BUDGET_BURN,
            (
                f"{cost_projected_record('1h')} > {multiple!r}\n"
                f"and\n{cost_projected_record('5m')} > {multiple!r}"
            ),
            cfg.cost_page_for,
            "page",
            "Tenant {{ $labels.tenant }} on course to spend "
            f"{multiple:g}x its daily cap within {cfg.cost_page_horizon}",
            (
                "Spend of tenant {{ $labels.tenant }} over the last 24h plus "
                f"{cfg.cost_page_horizon} more at the pace of the last hour (and of the last "
                "5 minutes) reaches {{ $value | humanizePercentage }} of its daily cap "
                '(stagelens_budget_usd{window="1d"}).'
            ),
            dashboard=DASHBOARD_TOKENS_COST,
        ),
        alert_rule(
            cfg,
            sc.ALERT_COST_BUDGET_BURN,
            f"{COST_SPENT_RECORD} > 1",
            cfg.cost_ticket_for,
            "ticket",
            "Tenant {{ $labels.tenant }} spent more than its daily cap in the last 24h",
            (
                "Tenant {{ $labels.tenant }} spent {{ $value | humanizePercentage }} of its "
                'daily cap (stagelens_budget_usd{window="1d"}) over the last 24h.'
            ),
            dashboard=DASHBOARD_TOKENS_COST,
        ),
    ]


def billing_alert(cfg: SloConfig) -> Rule:
    grouping = by(cfg) or "instance"
    return alert_rule(
        cfg,
        ALERT_BILLING_DRIFT,
        (
            f"abs({BILLING_DRIFT_RECORD}) > {cfg.billing_drift_threshold!r}\n"
            f"and on ({grouping})\n"
            f"{GENERATED_TOKENS_RECORD} * 3600 >= {cfg.billing_drift_min_tokens}"
        ),
        cfg.billing_drift_for,
        "ticket",
        "Billed output tokens drift from what the engines generated",
        (
            "Over the last hour, (generated - billed) / generated output tokens, all models "
            "of the environment, is {{ $value | humanizePercentage }} (threshold "
            f"{cfg.billing_drift_threshold:g}); vllm:generation_tokens_total against "
            'stagelens_tokens_total{type="output"}.'
        ),
        dashboard=DASHBOARD_TOKENS_COST,
    )
