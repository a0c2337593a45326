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
    TTFT_THRESHOLD_RECORD,
    by,
    cost_projected_record,
    kv_hit_ratio_record,
    sli_error_ratio_record,
    sli_requests_record,
    stage_latency_record,
    ttft_class_error_ratio_record,
    ttft_class_requests_record,
    ttft_p95_record,
)

RULES_FILE: Final = "stagelens-rules.yaml"
ALERTS_FILE: Final = "stagelens-alerts.yaml"
RUNBOOK_FILE: Final = "runbook.md"

Rule = dict[str, Any]

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
    sc.SLI_ANSWER: "Time to first answer token",
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
    *,
    dashboard: str,
) -> Rule:
    rule: Rule = {"alert": name, "expr": expr}
    if for_ != "0s":
        rule["for"] = for_
    rule["labels"] = {"severity": severity, **cfg.alert_labels, **(extra_labels or {})}
    rule["annotations"] = {
        "summary": summary,
        "description": description,
        "runbook_url": f"{cfg.runbook_base_url}#{name.lower()}",
        "dashboard_url": f"{cfg.grafana_url.rstrip('/')}/d/{dashboard}",
    }
    return rule


def _shortest_for(windows: tuple[BurnWindow, ...]) -> str:
    fors = [w.for_ for w in windows if w.for_ != "0s"]
    return min(fors, key=duration_seconds) if fors else "0s"


def class_thresholds_text(cfg: SloConfig) -> str:
    """The TTFT threshold of each prompt-size class, for descriptions."""
    return ", ".join(f"{size}: {seconds:g}s" for size, seconds in cfg.ttft_classes())


def _sli_text(cfg: SloConfig, sli: str) -> str:
    """What makes a request bad for ``sli``, for descriptions."""
    ttft = "its prompt-size class's threshold"
    return {
        sc.SLI_AVAILABILITY: "failed (5xx, 504, a stream that broke after its headers, or a "
        "client that gave up on a slow answer)",
        sc.SLI_TTFT: "{{ with $labels.prompt_size }}with prompts of class {{ . }} {{ end }}"
        f"had no first token within {ttft} ({class_thresholds_text(cfg)}; errors count as "
        "slow)",
        sc.SLI_ITL: "streamed with a stall (a gap between two tokens over the gateway's stall "
        "threshold) or broke mid-stream",
        sc.SLI_GOODPUT: f"missed the TTFT ({ttft}) or the inter-token (stall) objective, or "
        "were cut after one token",
        sc.SLI_ANSWER: f"had no answer token (past the reasoning) within "
        f"{cfg.answer_threshold_seconds:g}s (errors and streams cut while thinking count)",
    }[sli]


def _burn_records(sli: str) -> tuple[Any, Any, str]:
    """(requests record, error-ratio record, selector) a burn of ``sli`` reads: TTFT per
    prompt-size class, the others per model."""
    selector = f'{{{sc.LABEL_SLI}="{sli}"}}'
    if sli == sc.SLI_TTFT:
        return ttft_class_requests_record, ttft_class_error_ratio_record, selector
    return sli_requests_record, sli_error_ratio_record, selector


def burn_expr(cfg: SloConfig, sli: str, severity: str) -> str:
    """One severity's burn-rate pairs for ``sli``, OR-ed. Each pair: the long window over its
    limit; the short window over its limit (the burn is still going on) or, where the short
    window holds no request at all, the long window alone (a page does not resolve because
    traffic stopped: it holds until the bad requests age out of the long window); at least
    ``min_requests`` requests and ``min_bad_events`` bad ones in the long window."""
    budget = cfg.error_budget(sli)
    requests_of, ratio_of, selector = _burn_records(sli)
    pairs = []
    for window in cfg.windows_of(severity, sli):
        limit = f"({window.factor!r} * {budget:.6g})"
        seconds = f"{duration_seconds(window.long):g}"
        long_ratio = f"{ratio_of(window.long)}{selector}"
        long_requests = f"{requests_of(window.long)}{selector}"
        pairs.append(
            f"(\n  {long_ratio} > {limit}\n"
            f"  and\n  (\n    {ratio_of(window.short)}{selector} > {limit}\n"
            f"    or\n    {long_ratio}\n"
            f"    unless\n    {requests_of(window.short)}{selector} > 0\n  )\n"
            f"  and\n  {long_requests} * {seconds} >= {cfg.min_requests}\n"
            f"  and\n  {long_ratio} * {long_requests} * {seconds} >= {cfg.min_bad_events}\n)"
        )
    return "\nor\n".join(pairs)


def _burn_alerts(cfg: SloConfig) -> list[Rule]:
    alerts: list[Rule] = []
    for sli, name in BURN_ALERTS.items():
        objective = f"{cfg.objectives[sli] * 100:g}%"
        words = _SLI_WORDS[sli]
        for severity in ("page", "ticket"):
            windows = cfg.windows_of(severity, sli)
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
                    dashboard=DASHBOARD_SLOS,
                )
            )
    return alerts


def _p95_alert(cfg: SloConfig) -> Rule:
    window = cfg.ttft_p95_window
    grouping = by(cfg, sc.LABEL_MODEL, sc.LABEL_PROMPT_SIZE)
    traffic = (
        f"sum by ({grouping}) (rate({sc.TIME_TO_FIRST_TOKEN}_count[{window}]))"
        f" * {duration_seconds(window):g} >= {cfg.min_requests}"
    )
    return _alert(
        cfg,
        sc.ALERT_TTFT_P95_HIGH,
        (
            f"{ttft_p95_record(window)}\n> on ({sc.LABEL_PROMPT_SIZE}) group_left ()\n"
            f"{TTFT_THRESHOLD_RECORD}\nand on ({grouping})\n{traffic}"
        ),
        cfg.ttft_p95_for,
        "ticket",
        "p95 time to first token of {{ $labels.model }}{{ with $labels.prompt_size }} "
        "(prompt size {{ . }}){{ end }} above its threshold",
        (
            "p95 TTFT of {{ $labels.model }}{{ with $labels.prompt_size }} for prompts of "
            "class {{ . }}{{ end }} is {{ $value | humanizeDuration }}, above its class's "
            "threshold ("
            f"{class_thresholds_text(cfg)}; without a class {cfg.ttft_threshold_seconds:g}s) "
            f"for {cfg.ttft_p95_for}. A symptom ticket: the burn-rate alerts page when the "
            "error budget is at risk."
        ),
        dashboard=DASHBOARD_SLOS,
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
            dashboard=DASHBOARD_TOKENS_COST,
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
            dashboard=DASHBOARD_TOKENS_COST,
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
        dashboard=DASHBOARD_TOKENS_COST,
    )


def _serving_alerts(cfg: SloConfig) -> list[Rule]:
    stage_on = by(cfg, sc.LABEL_STAGE)
    model_on = by(cfg, sc.LABEL_MODEL)
    drop = 1 - cfg.kv_hit_rate_drop
    baseline = f"({kv_hit_ratio_record('6h')} offset 1h)"
    threshold = cfg.gpu_saturation_threshold
    gpu_on = ", ".join(
        (
            *(label for label in cfg.aggregation_labels if label != "namespace"),
            sc.LABEL_UUID,
            sc.LABEL_GPU,
        )
    )
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
            dashboard=DASHBOARD_REQUEST_PATH,
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
            dashboard=DASHBOARD_ENGINE_GPU,
        ),
        _alert(
            cfg,
            ALERT_GPU_SATURATED,
            (
                f"{GPU_SM_ACTIVE_RECORD} > {threshold!r}\nor\n"
                f"last_over_time({GPU_SM_ACTIVE_RECORD}[{cfg.gpu_vanished_hold}]) > {threshold!r}"
                f"\nunless on ({gpu_on})\n{GPU_SM_ACTIVE_RECORD}"
            ),
            cfg.gpu_saturation_for,
            "ticket",
            "GPU {{ $labels.gpu }} ({{ $labels.uuid }}) saturated",
            (
                "SM activity of GPU {{ $labels.gpu }} ({{ $labels.uuid }}; stagelens GPM, else "
                "DCGM_FI_PROF_SM_ACTIVE) is {{ $value | humanizePercentage }}, above "
                f"{threshold:g}, for {cfg.gpu_saturation_for}; or that was its last reading "
                f"within {cfg.gpu_vanished_hold} and its gauge has vanished since (exporter or "
                "DCGM target gone: see StagelensTargetVanished, StagelensGPUCollectorDown)."
            ),
            dashboard=DASHBOARD_ENGINE_GPU,
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
            dashboard=DASHBOARD_ENGINE_GPU,
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
            dashboard=DASHBOARD_ENGINE_GPU,
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
            dashboard=DASHBOARD_ENGINE_GPU,
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
            dashboard=DASHBOARD_REQUEST_PATH,
        ),
    ]


def monitored_jobs(cfg: SloConfig) -> str:
    """One regex for every job stagelens watches: gateway, vLLM, GPU exporter, DCGM."""
    return "|".join(
        (
            cfg.gateway_job_regex,
            cfg.backend_job_regex,
            cfg.gpu_exporter_job_regex,
            cfg.dcgm_job_regex,
        )
    )


def _silence_alerts(cfg: SloConfig) -> list[Rule]:
    """What a stack that went quiet looks like: targets down or gone, no traffic, no SLI."""
    target = by(cfg, "job", "instance")
    model = by(cfg, sc.LABEL_MODEL)
    others = "|".join((cfg.gateway_job_regex, cfg.gpu_exporter_job_regex, cfg.dcgm_job_regex))
    every = monitored_jobs(cfg)
    served = f'{sc.REQUESTS}{{{sc.LABEL_CODE}!~"4.."}}'
    return [
        _alert(
            cfg,
            ALERT_TARGET_DOWN,
            f'up{{job=~"{others}"}} == 0',
            cfg.target_down_for,
            "ticket",
            "Target {{ $labels.instance }} of {{ $labels.job }} is down",
            (
                "Prometheus could not scrape {{ $labels.instance }} (job {{ $labels.job }}) for "
                f"{cfg.target_down_for}: a gateway replica (capacity and its telemetry lost), "
                "the GPU exporter or DCGM (GPU panels and StagelensGPUSaturated blind there). "
                "vLLM backends: StagelensBackendDown."
            ),
            dashboard=DASHBOARD_ENGINE_GPU,
        ),
        _alert(
            cfg,
            ALERT_TARGET_VANISHED,
            (
                f"count by ({target}) "
                f'(max_over_time(up{{job=~"{every}"}}[{cfg.target_vanished_window}]))\n'
                f'unless on ({target})\nup{{job=~"{every}"}}'
            ),
            cfg.target_vanished_for,
            "ticket",
            "Target {{ $labels.instance }} of {{ $labels.job }} is no longer scraped",
            (
                "{{ $labels.instance }} (job {{ $labels.job }}) was scraped within the last "
                f"{cfg.target_vanished_window} and has no up series now (for "
                f"{cfg.target_vanished_for}): removed from service discovery, its pod or "
                "ServiceMonitor gone. Alerts that read its series are blind there, not green."
            ),
            dashboard=DASHBOARD_ENGINE_GPU,
        ),
        _alert(
            cfg,
            ALERT_TRAFFIC_STOPPED,
            (
                f"sum by ({model}) "
                f"(increase({sc.REQUESTS}[{cfg.traffic_baseline_window}] offset 1d))"
                f" >= {cfg.min_requests}\nunless on ({model})\n"
                f"sum by ({model}) (rate({sc.REQUESTS}[{cfg.traffic_window}])) > 0\n"
                # Only while a gateway answers its scrapes: with none up or none scraped,
                # StagelensGatewayAbsent pages for the same silence (one cause, one page).
                f"and on ({by(cfg)})\n"
                f'count by ({by(cfg)}) (up{{job=~"{cfg.gateway_job_regex}"}} == 1)'
            ),
            cfg.traffic_stopped_for,
            "page",
            "{{ $labels.model }} has served no request for "
            f"{cfg.traffic_window} (+{cfg.traffic_stopped_for})",
            (
                "{{ $labels.model }} served {{ $value | humanize }} requests in this "
                f"{cfg.traffic_baseline_window} yesterday and none in the last "
                f"{cfg.traffic_window}, for {cfg.traffic_stopped_for}. Every SLI is 0/0: "
                "the burn-rate alerts cannot see an outage in front of the gateway (ingress, "
                "DNS, auth) while its targets are up."
            ),
            dashboard=DASHBOARD_REQUEST_PATH,
        ),
        _alert(
            cfg,
            ALERT_SLI_COUNTERS_ABSENT,
            (
                f"sum by ({target}) (rate({served}[5m])) > 0\nunless on ({target})\n"
                f"count by ({target}) ({sc.SLI_REQUESTS})"
            ),
            cfg.sli_counters_absent_for,
            "page",
            "{{ $labels.instance }} serves requests without SLI counters",
            (
                "{{ $labels.instance }} (job {{ $labels.job }}) answered "
                '{{ $value | printf "%.2f" }} requests per second (4xx excepted) with no '
                f"{sc.SLI_REQUESTS} series, for {cfg.sli_counters_absent_for}: every SLO "
                "alert is blind to its traffic (a relabelling rule dropping the series, an "
                "older gateway)."
            ),
            dashboard=DASHBOARD_SLOS,
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
            dashboard=DASHBOARD_REQUEST_PATH,
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
            dashboard=DASHBOARD_REQUEST_PATH,
        ),
        _alert(
            cfg,
            ALERT_GPU_COLLECTOR_DOWN,
            (
                f"(\n  max by ({where}) ({sc.GPU_COLLECTOR_UP}) == 0\n  or\n"
                f"  max by ({where}) (max_over_time({sc.GPU_COLLECTOR_UP}[1d]))\n"
                f"  unless on ({where})\n  max by ({where}) ({sc.GPU_COLLECTOR_UP})\n)\n"
                f"and on ({where})\n"
                f"max by ({where}) (max_over_time({sc.GPU_COLLECTOR_UP}[1d])) == 1"
            ),
            cfg.gpu_collector_down_for,
            "ticket",
            "GPU collector on {{ $labels.instance }} cannot read NVML",
            (
                "stagelens_gpu_collector_up has been 0 on {{ $labels.instance }}, or absent "
                f"(the exporter's target down or gone), for {cfg.gpu_collector_down_for}, after "
                "NVML answered there within the last day: GPU panels and "
                "StagelensGPUSaturated are blind there."
            ),
            dashboard=DASHBOARD_ENGINE_GPU,
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
        [*_target_alerts(cfg), *_silence_alerts(cfg)],
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
