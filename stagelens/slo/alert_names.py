"""Every alert's name and the dashboards their ``dashboard_url`` opens.

Why a module of its own: the alert rules, the runbook, the dashboards' runbook links and the
Alertmanager configuration all name the same alerts; each reads the names from here.
"""

from __future__ import annotations

from typing import Final

from stagelens import semconv as sc

ALERT_AVAILABILITY_BUDGET_BURN: Final = "StagelensAvailabilityBudgetBurn"
ALERT_ITL_BUDGET_BURN: Final = "StagelensITLBudgetBurn"
ALERT_GOODPUT_BUDGET_BURN: Final = "StagelensGoodputBudgetBurn"
ALERT_ANSWER_BUDGET_BURN: Final = "StagelensAnswerBudgetBurn"
ALERT_STAGE_OVER_BUDGET: Final = "StagelensStageOverBudget"
ALERT_KV_HIT_RATE_COLLAPSE: Final = "StagelensKVCacheHitRateCollapse"
ALERT_GPU_SATURATED: Final = "StagelensGPUSaturated"
ALERT_ENGINE_SATURATED: Final = "StagelensEngineSaturated"
ALERT_BACKEND_DOWN: Final = "StagelensBackendDown"
ALERT_NO_BACKEND_UP: Final = "StagelensNoBackendUp"
ALERT_GATEWAY_ABSENT: Final = "StagelensGatewayAbsent"
ALERT_SPANS_DROPPED: Final = "StagelensSpansDropped"
ALERT_TELEMETRY_ERRORS: Final = "StagelensTelemetryErrors"
ALERT_GPU_COLLECTOR_DOWN: Final = "StagelensGPUCollectorDown"
ALERT_BILLING_DRIFT: Final = "StagelensBillingDrift"
ALERT_TRAFFIC_STOPPED: Final = "StagelensTrafficStopped"
ALERT_SLI_COUNTERS_ABSENT: Final = "StagelensSLICountersAbsent"
ALERT_TARGET_DOWN: Final = "StagelensTargetDown"
ALERT_TARGET_VANISHED: Final = "StagelensTargetVanished"
ALERT_METRICS_SPLIT: Final = "StagelensMetricsSplit"

DASHBOARD_REQUEST_PATH: Final = "stagelens-request-path"
DASHBOARD_TOKENS_COST: Final = "stagelens-tokens-cost"
DASHBOARD_ENGINE_GPU: Final = "stagelens-engine-gpu"
DASHBOARD_SLOS: Final = "stagelens-slos"
"""Dashboard uids (Grafana opens ``/d/<uid>``): each alert's ``dashboard_url`` names one."""

BURN_ALERTS: Final[dict[str, str]] = {
    sc.SLI_AVAILABILITY: ALERT_AVAILABILITY_BUDGET_BURN,
    sc.SLI_TTFT: sc.ALERT_TTFT_BUDGET_BURN,
    sc.SLI_ITL: ALERT_ITL_BUDGET_BURN,
    sc.SLI_GOODPUT: ALERT_GOODPUT_BUDGET_BURN,
    sc.SLI_ANSWER: ALERT_ANSWER_BUDGET_BURN,
}
"""SLI -> its burn-rate alert."""

ALL_ALERTS: Final[tuple[str, ...]] = (
    *BURN_ALERTS.values(),
    sc.ALERT_TTFT_P95_HIGH,
    sc.ALERT_COST_BUDGET_BURN,
    ALERT_BILLING_DRIFT,
    ALERT_STAGE_OVER_BUDGET,
    ALERT_KV_HIT_RATE_COLLAPSE,
    ALERT_GPU_SATURATED,
    ALERT_ENGINE_SATURATED,
    ALERT_BACKEND_DOWN,
    ALERT_NO_BACKEND_UP,
    ALERT_GATEWAY_ABSENT,
    ALERT_TRAFFIC_STOPPED,
    ALERT_SLI_COUNTERS_ABSENT,
    ALERT_TARGET_DOWN,
    ALERT_TARGET_VANISHED,
    ALERT_SPANS_DROPPED,
    ALERT_TELEMETRY_ERRORS,
    ALERT_METRICS_SPLIT,
    ALERT_GPU_COLLECTOR_DOWN,
)
"""Every alert name; each has one section in alerts/runbook.md."""

LABEL_SIGNAL: Final = "signal"
"""Static label of StagelensEngineSaturated: which saturation signal tripped."""
SIGNAL_QUEUE: Final = "queue"
SIGNAL_KV_CACHE: Final = "kv_cache"
SIGNAL_PREEMPTIONS: Final = "preemptions"
