"""Prometheus alerts generated from an SloConfig, and ``stagelens slo render``.

Why generated: like Sloth, the multi-window multi-burn-rate expressions are mechanical and easy
to get subtly wrong by hand (a factor applied to the wrong window, two pairs paging twice for
one burn). Rendering them from one validated config keeps alerts, runbook and dashboards in
step; the committed default files are regenerated in CI and diffed.

What makes them fit to page on: the burn-rate pairs of one severity are one alert (a burn
that trips two pairs is one page); a pair needs ``min_requests`` in its long window (three
slow requests an hour page nobody); causes (engine saturation, one backend down, GPU busy,
telemetry trouble) are tickets, symptoms a user feels (SLO burn, no backend, no gateway,
runaway spend) are pages; every aggregation keeps ``cluster`` and ``namespace``.
"""

from __future__ import annotations

from typing import Any, Final

import yaml

from stagelens import semconv as sc
from stagelens.slo.config import BurnWindow, SloConfig, duration_seconds
from stagelens.slo.recording_rules import (
    BILLING_DRIFT_RECORD,
    COST_SPENT_RECORD,
    ENGINE_KV_USAGE_RECORD,
    ENGINE_PREEMPTIONS_RECORD,
    ENGINE_WAITING_RECORD,
    GENERATED_TOKENS_RECORD,
    GPU_SM_ACTIVE_RECORD,
    STAGE_BUDGET_RECORD,
    by,
    cost_projected_record,
    kv_hit_ratio_record,
    sli_error_ratio_record,
    sli_requests_record,
    stage_latency_record,
    ttft_p95_record,
)

RULES_FILE: Final = "stagelens-rules.yaml"
ALERTS_FILE: Final = "stagelens-alerts.yaml"
RUNBOOK_FILE: Final = "runbook.md"

Rule = dict[str, Any]

ALERT_AVAILABILITY_BUDGET_BURN: Final = "StagelensAvailabilityBudgetBurn"
ALERT_ITL_BUDGET_BURN: Final = "StagelensITLBudgetBurn"
ALERT_GOODPUT_BUDGET_BURN: Final = "StagelensGoodputBudgetBurn"
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

BURN_ALERTS: Final[dict[str, str]] = {
    sc.SLI_AVAILABILITY: ALERT_AVAILABILITY_BUDGET_BURN,
    sc.SLI_TTFT: sc.ALERT_TTFT_BUDGET_BURN,
    sc.SLI_ITL: ALERT_ITL_BUDGET_BURN,
    sc.SLI_GOODPUT: ALERT_GOODPUT_BUDGET_BURN,
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
    ALERT_SPANS_DROPPED,
    ALERT_TELEMETRY_ERRORS,
    ALERT_GPU_COLLECTOR_DOWN,
)
"""Every alert name; each has one section in alerts/runbook.md."""

LABEL_SIGNAL: Final = "signal"
"""Static label of StagelensEngineSaturated: which saturation signal tripped."""
SIGNAL_QUEUE: Final = "queue"
SIGNAL_KV_CACHE: Final = "kv_cache"
SIGNAL_PREEMPTIONS: Final = "preemptions"

_SLI_WORDS: Final[dict[str, str]] = {
    sc.SLI_AVAILABILITY: "Availability",
    sc.SLI_TTFT: "TTFT",
    sc.SLI_ITL: "Inter-token latency",
    sc.SLI_GOODPUT: "Goodput",
}


def _alert(
    cfg: SloConfig,
    name: str,
    expr: str,
    for_: str,
    severity: str,
    summary: str,
    description: str,
    extra_labels: dict[str, str] | None = None,
) -> Rule:
    rule: Rule = {"alert": name, "expr": expr}
    if for_ != "0s":
        rule["for"] = for_
    rule["labels"] = {"severity": severity, **cfg.alert_labels, **(extra_labels or {})}
    rule["annotations"] = {
        "summary": summary,
        "description": description,
        "runbook_url": f"{cfg.runbook_base_url}#{name.lower()}",
    }
    return rule


def _shortest_for(windows: tuple[BurnWindow, ...]) -> str:
    fors = [w.for_ for w in windows if w.for_ != "0s"]
    return min(fors, key=duration_seconds) if fors else "0s"


def _sli_text(cfg: SloConfig, sli: str) -> str:
    """What makes a request bad for ``sli``, for descriptions."""
    ttft = f"{cfg.ttft_threshold_seconds:g}s"
    itl = f"{cfg.itl_threshold_seconds:g}s"
    return {
        sc.SLI_AVAILABILITY: "failed (5xx, 504, or a stream that broke after its headers)",
        sc.SLI_TTFT: f"had no first token within {ttft} (errors count as slow)",
        sc.SLI_ITL: f"streamed with a mean inter-token latency above {itl} or broke mid-stream",
        sc.SLI_GOODPUT: f"missed the TTFT ({ttft}) or the inter-token latency ({itl}) objective",
    }[sli]


def burn_expr(cfg: SloConfig, sli: str, severity: str) -> str:
    """One severity's burn-rate pairs for ``sli``, OR-ed: each pair is long window over its
    limit, short window over its limit (the burn is still going on), and at least
    ``min_requests`` requests in the long window."""
    budget = cfg.error_budget(sli)
    selector = f'{{{sc.LABEL_SLI}="{sli}"}}'
    pairs = []
    for window in cfg.windows_of(severity):
        limit = f"({window.factor!r} * {budget:.6g})"
        traffic = (
            f"{sli_requests_record(window.long)}{selector} * {duration_seconds(window.long):g}"
        )
        pairs.append(
            f"(\n  {sli_error_ratio_record(window.long)}{selector} > {limit}\n"
            f"  and\n  {sli_error_ratio_record(window.short)}{selector} > {limit}\n"
            f"  and\n  {traffic} >= {cfg.min_requests}\n)"
        )
    return "\nor\n".join(pairs)


def _burn_alerts(cfg: SloConfig) -> list[Rule]:
    alerts: list[Rule] = []
    for sli, name in BURN_ALERTS.items():
        objective = f"{cfg.objectives[sli] * 100:g}%"
        words = _SLI_WORDS[sli]
        for severity in ("page", "ticket"):
            windows = cfg.windows_of(severity)
            if not windows:
                continue
            pairs = ", ".join(f"{w.factor:g}x over {w.long}+{w.short}" for w in windows)
            alerts.append(
                _alert(
                    cfg,
                    name,
                    burn_expr(cfg, sli, severity),
                    _shortest_for(windows),
                    severity,
                    f"{words} error budget of {{{{ $labels.model }}}} burning too fast",
                    (
                        f"Requests to {{{{ $labels.model }}}} that {_sli_text(cfg, sli)} are "
                        f"using the {cfg.period} error budget (SLO {objective}) too fast: "
                        f"{pairs}. Long-window error ratio "
                        "{{ $value | humanizePercentage }}."
                    ),
                )
            )
    return alerts


def _p95_alert(cfg: SloConfig) -> Rule:
    window = cfg.ttft_p95_window
    traffic = (
        f"sum by ({by(cfg, sc.LABEL_MODEL)}) (rate({sc.TIME_TO_FIRST_TOKEN}_count[{window}]))"
        f" * {duration_seconds(window):g} >= {cfg.min_requests}"
    )
    grouping = by(cfg, sc.LABEL_MODEL)
    threshold = cfg.ttft_threshold_seconds
    return _alert(
        cfg,
        sc.ALERT_TTFT_P95_HIGH,
        f"{ttft_p95_record(window)} > {threshold!r}\nand on ({grouping})\n{traffic}",
        cfg.ttft_p95_for,
        "ticket",
        f"p95 time to first token of {{{{ $labels.model }}}} above {threshold:g}s",
        (
            "p95 TTFT of {{ $labels.model }} is {{ $value | humanizeDuration }} (threshold "
            f"{threshold:g}s) for {cfg.ttft_p95_for}. A symptom ticket: the burn-rate alerts "
            "page when the error budget is at risk."
        ),
    )


def _cost_alerts(cfg: SloConfig) -> list[Rule]:
    multiple = cfg.cost_page_multiple
    return [
        _alert(
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
        ),
        _alert(
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
        ),
    ]


def _billing_alert(cfg: SloConfig) -> Rule:
    grouping = by(cfg) or "instance"
    return _alert(
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
    )


def _serving_alerts(cfg: SloConfig) -> list[Rule]:
    stage_on = by(cfg, sc.LABEL_STAGE)
    model_on = by(cfg, sc.LABEL_MODEL)
    drop = 1 - cfg.kv_hit_rate_drop
    baseline = f"({kv_hit_ratio_record('6h')} offset 1h)"
    return [
        _alert(
            cfg,
            ALERT_STAGE_OVER_BUDGET,
            (
                f"{stage_latency_record(cfg.stage_latency_window)}\n> on ({stage_on})\n"
                f"{STAGE_BUDGET_RECORD}"
            ),
            cfg.stage_budget_for,
            "ticket",
            "Stage {{ $labels.stage }} p95 over its latency budget",
            (
                "p95 of stage {{ $labels.stage }} is {{ $value | humanizeDuration }}, above its "
                "budget (stagelens_stage_budget_seconds) for "
                f"{cfg.stage_budget_for}. For inference this is the time to the first upstream "
                "token (stagelens_upstream_time_to_first_token_seconds), not the decode."
            ),
        ),
        _alert(
            cfg,
            ALERT_KV_HIT_RATE_COLLAPSE,
            (
                f"{kv_hit_ratio_record('30m')}\n< on ({model_on}) {drop!r} * {baseline}\n"
                f"and on ({model_on})\n{baseline} >= {cfg.kv_hit_rate_min_baseline!r}"
            ),
            cfg.kv_hit_rate_for,
            "ticket",
            "Prefix-cache hit rate of {{ $labels.model }} collapsed",
            (
                "Engine prefix-cache hit rate of {{ $labels.model }} over 30m is "
                "{{ $value | humanizePercentage }}, below "
                f"{drop:g}x its 6h rate of an hour before, for {cfg.kv_hit_rate_for}."
            ),
        ),
        _alert(
            cfg,
            ALERT_GPU_SATURATED,
            f"{GPU_SM_ACTIVE_RECORD} > {cfg.gpu_saturation_threshold!r}",
            cfg.gpu_saturation_for,
            "ticket",
            "GPU {{ $labels.gpu }} ({{ $labels.uuid }}) saturated",
            (
                "SM activity of GPU {{ $labels.gpu }} ({{ $labels.uuid }}; stagelens GPM, else "
                "DCGM_FI_PROF_SM_ACTIVE) is {{ $value | humanizePercentage }}, above "
                f"{cfg.gpu_saturation_threshold:g}, for {cfg.gpu_saturation_for}."
            ),
        ),
        *_engine_alerts(cfg),
    ]


def _engine_alerts(cfg: SloConfig) -> list[Rule]:
    signals = (
        (
            SIGNAL_QUEUE,
            f"{ENGINE_WAITING_RECORD} > {cfg.engine_waiting_threshold!r}",
            "{{ $value }} requests waiting in the busiest engine's queue (threshold "
            f"{cfg.engine_waiting_threshold:g})",
        ),
        (
            SIGNAL_KV_CACHE,
            f"{ENGINE_KV_USAGE_RECORD} > {cfg.engine_kv_usage_threshold!r}",
            "KV cache {{ $value | humanizePercentage }} full in the fullest engine (threshold "
            f"{cfg.engine_kv_usage_threshold:g})",
        ),
        (
            SIGNAL_PREEMPTIONS,
            f"{ENGINE_PREEMPTIONS_RECORD} > 0",
            '{{ $value | printf "%.2f" }} preemptions per second',
        ),
    )
    return [
        _alert(
            cfg,
            ALERT_ENGINE_SATURATED,
            expr,
            cfg.engine_saturation_for,
            "ticket",
            f"Engines serving {{{{ $labels.model }}}} saturated ({signal})",
            f"{text} for {{{{ $labels.model }}}}, for {cfg.engine_saturation_for}.",
            {LABEL_SIGNAL: signal},
        )
        for signal, expr, text in signals
    ]


def none_up(cfg: SloConfig, job_regex: str) -> str:
    """No target of the jobs matching ``job_regex`` is up: all are down, or none is scraped
    at all (a vanished target leaves no ``up`` series, so ``up == 0`` alone never fires)."""
    grouping = by(cfg, "job")
    up = f'up{{job=~"{job_regex}"}}'
    return (
        f"count by ({grouping}) ({up})\nunless on ({grouping})\n"
        f"count by ({grouping}) ({up} == 1)\nor\nabsent({up})"
    )


def _target_alerts(cfg: SloConfig) -> list[Rule]:
    return [
        _alert(
            cfg,
            ALERT_BACKEND_DOWN,
            f'up{{job=~"{cfg.backend_job_regex}"}} == 0',
            cfg.backend_down_for,
            "ticket",
            "vLLM backend {{ $labels.instance }} is down",
            (
                "Prometheus could not scrape backend {{ $labels.instance }} (job "
                f"{{{{ $labels.job }}}}) for {cfg.backend_down_for}. The gateway's balancer "
                "routes around it; capacity is reduced."
            ),
        ),
        _alert(
            cfg,
            ALERT_NO_BACKEND_UP,
            none_up(cfg, cfg.backend_job_regex),
            cfg.no_backend_for,
            "page",
            "No vLLM backend is up",
            (
                f"No target of the backend jobs (job=~{cfg.backend_job_regex!r}) answered a "
                f"scrape for {cfg.no_backend_for}, or none is scraped at all: every request "
                "that needs inference fails."
            ),
        ),
        _alert(
            cfg,
            ALERT_GATEWAY_ABSENT,
            none_up(cfg, cfg.gateway_job_regex),
            cfg.gateway_absent_for,
            "page",
            "The stagelens gateway is not being scraped",
            (
                f"No target of the gateway jobs (job=~{cfg.gateway_job_regex!r}) answered a "
                f"scrape for {cfg.gateway_absent_for}, or none is scraped at all: the gateway "
                "is down, or every SLO alert is blind."
            ),
        ),
    ]


def _self_alerts(cfg: SloConfig) -> list[Rule]:
    where = by(cfg, "job", "instance")
    return [
        _alert(
            cfg,
            ALERT_SPANS_DROPPED,
            (f"sum by ({where}, {sc.LABEL_REASON}) (rate({sc.SPANS_DROPPED}[5m])) > 0"),
            cfg.self_monitoring_for,
            "ticket",
            "{{ $labels.instance }} is dropping spans ({{ $labels.reason }})",
            (
                '{{ $value | printf "%.2f" }} spans per second dropped by '
                "{{ $labels.instance }} ({{ $labels.reason }}) for "
                f"{cfg.self_monitoring_for}: traces are incomplete."
            ),
        ),
        _alert(
            cfg,
            ALERT_TELEMETRY_ERRORS,
            (f"sum by ({where}, {sc.LABEL_COMPONENT}) (rate({sc.TELEMETRY_ERRORS}[5m])) > 0"),
            cfg.self_monitoring_for,
            "ticket",
            "stagelens telemetry failing in {{ $labels.component }} on {{ $labels.instance }}",
            (
                '{{ $value | printf "%.2f" }} telemetry errors per second in component '
                "{{ $labels.component }} on {{ $labels.instance }} for "
                f"{cfg.self_monitoring_for}; serving goes on, some figures are missing."
            ),
        ),
        _alert(
            cfg,
            ALERT_GPU_COLLECTOR_DOWN,
            (
                f"max by ({where}) ({sc.GPU_COLLECTOR_UP}) == 0\nand\n"
                f"max by ({where}) (max_over_time({sc.GPU_COLLECTOR_UP}[1d])) == 1"
            ),
            cfg.gpu_collector_down_for,
            "ticket",
            "GPU collector on {{ $labels.instance }} cannot read NVML",
            (
                "stagelens_gpu_collector_up has been 0 on {{ $labels.instance }} for "
                f"{cfg.gpu_collector_down_for}, after NVML answered there within the last day: "
                "GPU panels and StagelensGPUSaturated are blind there."
            ),
        ),
    ]


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
        [*_burn_alerts(cfg), _p95_alert(cfg)],
        [*_cost_alerts(cfg), _billing_alert(cfg)],
        _serving_alerts(cfg),
        _target_alerts(cfg),
        _self_alerts(cfg),
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
