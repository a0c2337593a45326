"""The silence alerts: targets down or gone, no backend or gateway, traffic stopped, SLI
counters missing; and stagelens' own telemetry failing."""

from __future__ import annotations

from typing import Final

from stagelens import semconv as sc
from stagelens.slo.alert_names import (
    ALERT_BACKEND_DOWN,
    ALERT_GATEWAY_ABSENT,
    ALERT_GPU_COLLECTOR_DOWN,
    ALERT_METRICS_SPLIT,
    ALERT_NO_BACKEND_UP,
    ALERT_SLI_COUNTERS_ABSENT,
    ALERT_SPANS_DROPPED,
    ALERT_TARGET_DOWN,
    ALERT_TARGET_VANISHED,
    ALERT_TELEMETRY_ERRORS,
    ALERT_TRAFFIC_STOPPED,
    DASHBOARD_ENGINE_GPU,
    DASHBOARD_REQUEST_PATH,
    DASHBOARD_SLOS,
)
from stagelens.slo.alerting import Rule, alert_rule
from stagelens.slo.config import SloConfig
from stagelens.slo.record_names import TARGETS_RECORD
from stagelens.slo.recording_rules import by, monitored_jobs

__all__ = ["monitored_jobs", "none_up", "self_alerts", "silence_alerts", "target_alerts"]


def none_up(cfg: SloConfig, job_regex: str) -> str:
    """Per (cluster, namespace, job): a job of ``job_regex`` scraped there within
    ``absence_lookback`` that has no target up now, all down or none scraped any more (a
    vanished target leaves no ``up`` series, so ``up == 0`` alone never fires); or no target
    of those jobs scraped anywhere within that time (a first install whose monitor reaches
    nothing), which no alert of the first kind already says.

    Why per environment: one ``absent()`` over the whole Prometheus stays quiet for a
    production job that vanished while staging's is still scraped."""
    grouping = by(cfg, "job")
    up = f'up{{job=~"{job_regex}"}}'
    return (
        f"group by ({grouping}) (max_over_time({up}[{cfg.absence_lookback}]))\n"
        f"unless on ({grouping})\n"
        f"group by ({grouping}) ({up} == 1)\nor\n"
        f"absent_over_time({up}[{cfg.absence_lookback}])"
    )


WHERE: Final = (
    "{{ with $labels.namespace }} in {{ . }}{{ end }}{{ with $labels.cluster }} ({{ . }}){{ end }}"
)
"""Template text naming the alert's namespace and cluster, where it has them."""
JOB: Final = "{{ with $labels.job }}{{ . }}{{ end }}"


def target_alerts(cfg: SloConfig) -> list[Rule]:
    return [
        alert_rule(
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
        alert_rule(
            cfg,
            ALERT_NO_BACKEND_UP,
            none_up(cfg, cfg.backend_job_regex),
            cfg.no_backend_for,
            "page",
            f"No vLLM backend is up{WHERE}",
            (
                f"No target of backend job {JOB}{WHERE} (job=~{cfg.backend_job_regex!r}) "
                f"answered a scrape for {cfg.no_backend_for}, or none is scraped there any "
                f"more (it was within {cfg.absence_lookback}), or none is scraped anywhere: "
                "every request that needs inference fails there."
            ),
            dashboard=DASHBOARD_ENGINE_GPU,
        ),
        alert_rule(
            cfg,
            ALERT_GATEWAY_ABSENT,
            none_up(cfg, cfg.gateway_job_regex),
            cfg.gateway_absent_for,
            "page",
            f"The stagelens gateway is not being scraped{WHERE}",
            (
                f"No target of gateway job {JOB}{WHERE} (job=~{cfg.gateway_job_regex!r}) "
                f"answered a scrape for {cfg.gateway_absent_for}, or none is scraped there any "
                f"more (it was within {cfg.absence_lookback}), or none is scraped anywhere: "
                "the gateway is down there, or every SLO alert is blind to it."
            ),
            dashboard=DASHBOARD_REQUEST_PATH,
        ),
    ]


def silence_alerts(cfg: SloConfig) -> list[Rule]:
    """What a stack that went quiet looks like: targets down or gone, no traffic, no SLI."""
    target = by(cfg, "job", "instance")
    job = by(cfg, "job")
    window = cfg.target_vanished_window
    model = by(cfg, sc.LABEL_MODEL)
    others = "|".join((cfg.gateway_job_regex, cfg.gpu_exporter_job_regex, cfg.dcgm_job_regex))
    served = f'{sc.REQUESTS}{{{sc.LABEL_CODE}!~"4.."}}'
    return [
        alert_rule(
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
        alert_rule(
            cfg,
            ALERT_TARGET_VANISHED,
            (
                f"(\n  {TARGETS_RECORD}\n  or\n"
                f"  0 * max_over_time({TARGETS_RECORD}[{window}])\n)\n"
                f"< on ({job})\nquantile_over_time(0.5, {TARGETS_RECORD}[{window}])"
            ),
            cfg.target_vanished_for,
            "ticket",
            "{{ $labels.job }}" + WHERE + " lost targets",
            (
                "{{ $labels.job }}" + WHERE + " has {{ $value }} targets scraped, fewer than "
                f"it had for most of the last {window} (its median), for "
                f"{cfg.target_vanished_for}: removed from service discovery, a pod or its "
                "monitor gone and not replaced. Alerts that read their series are blind there, "
                "not green. A rollout replacing pods (new addresses, the same count) opens "
                "nothing."
            ),
            dashboard=DASHBOARD_ENGINE_GPU,
        ),
        alert_rule(
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
        alert_rule(
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


def self_alerts(cfg: SloConfig) -> list[Rule]:
    where = by(cfg, "job", "instance")
    job = by(cfg, "job")
    up = sc.GPU_COLLECTOR_UP
    return [
        alert_rule(
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
        alert_rule(
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
        alert_rule(
            cfg,
            ALERT_METRICS_SPLIT,
            # The series exists only while split, on every worker: whichever one a scrape
            # reaches reports it, so it is steady. Not keyed on the worker count, which moves
            # while a server replaces or adds workers.
            f"max by ({job}, {sc.LABEL_SERVER}) ({sc.METRICS_SPLIT}) > 0",
            cfg.self_monitoring_for,
            "ticket",
            f"{{{{ $labels.job }}}}{WHERE} answers /metrics from one of several workers",
            (
                "{{ $labels.job }}" + WHERE + " runs as several {{ $labels.server }} workers "
                "without PROMETHEUS_MULTIPROC_DIR, for "
                f"{cfg.self_monitoring_for}: each scrape reads the counters of whichever worker "
                "answered it, so counters jump back and forth, rate() sees resets and every "
                "SLO ratio and burn rate there is wrong."
            ),
            dashboard=DASHBOARD_SLOS,
        ),
        alert_rule(
            cfg,
            ALERT_GPU_COLLECTOR_DOWN,
            (
                f"(\n  max by ({where}) ({up}) == 0\n  and on ({where})\n"
                f"  max by ({where}) (max_over_time({up}[1d])) == 1\n)\nor\n"
                f"(\n  max by ({job}) (max_over_time({up}[1d])) == 1\n  unless on ({job})\n"
                f"  max by ({job}) ({up})\n)"
            ),
            cfg.gpu_collector_down_for,
            "ticket",
            "GPU collector of {{ $labels.job }}{{ with $labels.instance }} on {{ . }}{{ end }} "
            "cannot read NVML",
            (
                "{{ if $labels.instance }}stagelens_gpu_collector_up has been 0 on "
                "{{ $labels.instance }} (job {{ $labels.job }}) after NVML answered there within "
                "the last day{{ else }}No target of {{ $labels.job }}"
                + WHERE
                + " has reported stagelens_gpu_collector_up since one did within the last day "
                "(the exporter's targets down or gone){{ end }}, for "
                f"{cfg.gpu_collector_down_for}: GPU panels and StagelensGPUSaturated are blind "
                "there. A vanished series is judged per job: a pod that moved to a new address "
                "and reports again opens nothing."
            ),
            dashboard=DASHBOARD_ENGINE_GPU,
        ),
    ]
