"""The spend alerts: a tenant's cost against its daily cap, and billed against generated
tokens."""

from __future__ import annotations

from stagelens import semconv as sc
from stagelens.slo.alert_names import ALERT_BILLING_DRIFT, DASHBOARD_TOKENS_COST
from stagelens.slo.alerting import Rule, alert_rule
from stagelens.slo.config import SloConfig
from stagelens.slo.record_names import (
    BILLING_DRIFT_RECORD,
    COST_SPENT_RECORD,
    GENERATED_TOKENS_RECORD,
    cost_pace_record,
    cost_projected_record,
)


def cost_alerts(cfg: SloConfig) -> list[Rule]:
    multiple = cfg.cost_page_multiple
    return [
        alert_rule(
            cfg,
            sc.ALERT_COST_BUDGET_BURN,
            # The page is for money being spent now: the pace itself above the cap's, on
            # both windows. Spend already made (a tenant that stopped) is the ticket's.
            (
                f"{cost_projected_record('1h')} > {multiple!r}\n"
                f"and\n{cost_projected_record('5m')} > {multiple!r}\n"
                f"and\n{cost_pace_record('1h')} > 1\n"
                f"and\n{cost_pace_record('5m')} > 1"
            ),
            cfg.cost_page_for,
            "page",
            "Tenant {{ $labels.tenant }} spending past its daily cap's pace, on course to "
            f"{multiple:g}x its cap within {cfg.cost_page_horizon}",
            (
                "Tenant {{ $labels.tenant }} spends faster than its daily cap allows "
                '(stagelens_budget_usd{window="1d"}) over the last hour and the last 5 '
                "minutes, and its spend over the last 24h plus "
                f"{cfg.cost_page_horizon} more at that pace reaches "
                "{{ $value | humanizePercentage }} of the cap. Once it stops spending, the page "
                "resolves; what it spent stays a ticket."
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
    grouping = ", ".join(cfg.billing_drift_by)
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
            f"of the {' and '.join(cfg.billing_drift_by) or 'Prometheus'}, is "
            "{{ $value | humanizePercentage }} (threshold "
            f"{cfg.billing_drift_threshold:g}); vllm:generation_tokens_total against "
            'stagelens_tokens_total{type="output"}.'
        ),
        dashboard=DASHBOARD_TOKENS_COST,
    )
