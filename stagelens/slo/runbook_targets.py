"""Runbook sections of the target, silence and self-monitoring alerts."""

from __future__ import annotations

from stagelens import semconv as sc
from stagelens.slo import alert_rules as ar
from stagelens.slo.config import SloConfig
from stagelens.slo.record_names import TARGETS_RECORD
from stagelens.slo.runbook_entry import (
    ENGINE_GPU,
    REQUEST_PATH,
    SERVICE,
    SLOS,
    Entry,
)


def target_entries(cfg: SloConfig) -> list[Entry]:
    return [
        Entry(
            alert=ar.ALERT_BACKEND_DOWN,
            meaning=(
                "Prometheus could not scrape one vLLM backend (`up == 0`, job=~"
                f"`{cfg.backend_job_regex}`) for {cfg.backend_down_for}. A ticket: the gateway's "
                "balancer health-checks backends and routes around a dead one."
            ),
            impact="Less capacity; requests still succeed on the other backends.",
            promql=(f'up{{job=~"{cfg.backend_job_regex}", namespace="NAMESPACE"}} == 0',),
            traceql=(
                '{ span.stagelens.stage = "inference" && span.server.address = "HOST" '
                "&& status = error }"
            ),
            panels=((ENGINE_GPU, "Running and waiting requests"),),
            actions=(
                "Check the pod or process and its logs (OOM kill, GPU XID errors); restart it.",
            ),
        ),
        Entry(
            alert=ar.ALERT_NO_BACKEND_UP,
            meaning=(
                f"In one cluster and namespace, no target of a backend job (job=~"
                f"`{cfg.backend_job_regex}`, the name `deploy/` gives vLLM) answered a scrape for "
                f"{cfg.no_backend_for}: all are down, or none is scraped there any more though "
                f"one was within {cfg.absence_lookback} (a vanished target leaves no `up` series, "
                "so `up == 0` never says so). Judged per (cluster, namespace, job), with those "
                "labels on the alert: staging's backends still scraped do not hide production's. "
                "Also fires, without them, when no backend target is scraped anywhere (a new "
                "install whose PodMonitor does not reach vLLM). While it fires, Alertmanager "
                "(deploy/alertmanager) holds back the SLO burn pages and the backend tickets of "
                "the same namespace: one cause, one page."
            ),
            impact="Every request that needs inference fails (503 from the load balancer).",
            promql=(
                f'up{{job=~"{cfg.backend_job_regex}", namespace="NAMESPACE"}}',
                f'max_over_time(up{{job=~"{cfg.backend_job_regex}", namespace="NAMESPACE"}}'
                f"[{cfg.absence_lookback}])",
                f'sum by (code) (rate({sc.REJECTIONS}{{stage="load_balancer", '
                'namespace="NAMESPACE"}[5m]))',
            ),
            traceql=f'{{ {SERVICE} && span.stagelens.rejected_by = "load_balancer" }}',
            panels=((REQUEST_PATH, "Rejections by stage"),),
            actions=(
                "Check the vLLM pods and their GPUs; if they run, check the monitor's selector "
                "and namespace (deploy/kubernetes/monitors.yaml).",
            ),
        ),
        Entry(
            alert=ar.ALERT_GATEWAY_ABSENT,
            meaning=(
                f"In one cluster and namespace, no target of a gateway job (job=~"
                f"`{cfg.gateway_job_regex}`, the name `deploy/` gives it; a pushgateway is no "
                f"gateway) answered a scrape for {cfg.gateway_absent_for}: all down, or none "
                f"scraped there any more though one was within {cfg.absence_lookback}. Judged "
                "per (cluster, namespace, job), with those labels on the alert; without them, "
                "no gateway target is scraped anywhere. StagelensTrafficStopped waits while it "
                "fires, and Alertmanager holds back the SLO burn pages of the namespace."
            ),
            impact="Either the gateway is down (users get connection errors) or every SLO "
            "alert is blind.",
            promql=(
                f'up{{job=~"{cfg.gateway_job_regex}", namespace="NAMESPACE"}}',
                f'max_over_time(up{{job=~"{cfg.gateway_job_regex}", namespace="NAMESPACE"}}'
                f"[{cfg.absence_lookback}])",
            ),
            traceql=f"{{ {SERVICE} }}",
            panels=((REQUEST_PATH, "Request rate by code"),),
            actions=(
                "Check the gateway pods and their readiness; if they serve traffic, check the "
                "gateway's ServiceMonitor (deploy/kubernetes/monitors.yaml).",
            ),
        ),
    ]


def silence_entries(cfg: SloConfig) -> list[Entry]:
    jobs = ar.monitored_jobs(cfg)
    others = "|".join((cfg.gateway_job_regex, cfg.gpu_exporter_job_regex, cfg.dcgm_job_regex))
    return [
        Entry(
            alert=ar.ALERT_TARGET_DOWN,
            meaning=(
                "Prometheus could not scrape one gateway, GPU-exporter or DCGM target (`up == 0`"
                f") for {cfg.target_down_for}; per instance, so one of two gateway replicas down "
                "is seen while the other serves. vLLM backends have StagelensBackendDown."
            ),
            impact="A gateway replica: less capacity, and its requests are missing from every "
            "SLI. An exporter: its GPUs are blind (panels, StagelensGPUSaturated).",
            promql=(f'up{{job=~"{others}"}} == 0',),
            traceql=f"{{ {SERVICE} }} | by(resource.host.name) | count() > 0",
            panels=((REQUEST_PATH, "Request rate by code"),),
            actions=(
                "Check the pod and its logs (OOM kill, crash loop, readiness); restart it.",
                "If it serves but cannot be scraped: its /metrics port, NetworkPolicy, or the "
                "monitor (deploy/kubernetes/monitors.yaml).",
            ),
        ),
        Entry(
            alert=ar.ALERT_TARGET_VANISHED,
            meaning=(
                f"A job (job=~`{jobs}`) has had fewer targets scraped than its median over the "
                f"last {cfg.target_vanished_window}, for {cfg.target_vanished_for}: service "
                "discovery dropped some (a pod gone and not replaced, a monitor or its selector "
                "changed). `up == 0` never fires for a target nobody scrapes any more. Counted "
                "per (cluster, namespace, job), never by address: a rolling update replaces "
                "pods (new addresses, the same count) and opens nothing. Expected after a "
                "deliberate scale-down: it resolves once the lower count has lasted half the "
                "window."
            ),
            impact="Every alert that reads its series is silent for it: blind, not green.",
            promql=(
                f'{TARGETS_RECORD}{{job="JOB", namespace="NAMESPACE"}}',
                f'quantile_over_time(0.5, {TARGETS_RECORD}{{job="JOB", namespace="NAMESPACE"}}'
                f"[{cfg.target_vanished_window}])",
                'up{job="JOB", namespace="NAMESPACE"}',
            ),
            traceql=f"{{ {SERVICE} }}",
            panels=((ENGINE_GPU, "GPU SM activity vs kernel time"),),
            actions=(
                "Was it scaled down or moved on purpose? Then ack. Otherwise check the pod, its "
                "labels and the monitor's selector and namespace.",
            ),
        ),
        Entry(
            alert=ar.ALERT_TRAFFIC_STOPPED,
            meaning=(
                f"A model served no request over {cfg.traffic_window} for "
                f"{cfg.traffic_stopped_for}, where it served at least {cfg.min_requests} in the "
                f"same {cfg.traffic_baseline_window} one day earlier (so a model idle every "
                "night does not alert every night; a model younger than a day is not judged). "
                "With no requests every SLI is 0/0 and no burn-rate alert can fire: this is "
                "the page for an outage in front of the gateway (ingress, DNS, auth, a client "
                "fleet down) while every target is up. It waits while no gateway answers its "
                "scrapes: StagelensGatewayAbsent pages for that silence, once."
            ),
            impact="Users cannot reach the model at all, or stopped sending to it.",
            promql=(
                f"sum by (model) (rate({sc.REQUESTS}[{cfg.traffic_window}]))",
                f"sum by (model) (increase({sc.REQUESTS}[{cfg.traffic_baseline_window}] "
                "offset 1d))",
            ),
            traceql=f"{{ {SERVICE} }}",
            panels=((REQUEST_PATH, "Request rate by code"),),
            actions=(
                "Send one request through the public endpoint as a client would (ingress, DNS, "
                "TLS, auth); compare with one sent straight to a gateway pod.",
                "A model retired on purpose: ack; it stops alerting a day later.",
            ),
        ),
        Entry(
            alert=ar.ALERT_SLI_COUNTERS_ABSENT,
            meaning=(
                "A gateway instance answered requests (4xx excepted) for "
                f"{cfg.sli_counters_absent_for} without exporting {sc.SLI_REQUESTS}: a "
                "relabelling or metric-drop rule, or a gateway older than the SLI counters. "
                "Every burn-rate alert reads those counters."
            ),
            impact="The SLO alerts are blind to that instance's traffic: an outage there "
            "would page nobody.",
            promql=(
                f'sum by (job, instance) (rate({sc.REQUESTS}{{code!~"4.."}}[5m]))',
                f"count by (job, instance) ({sc.SLI_REQUESTS})",
            ),
            traceql=f"{{ {SERVICE} }}",
            panels=((SLOS, "Requests the SLIs counted (time range)"),),
            actions=(
                "Check metric_relabel_configs / ServiceMonitor metricRelabelings for a rule "
                f"dropping `{sc.SLI_REQUESTS}`; check the gateway's stagelens version.",
            ),
        ),
    ]


def self_entries(cfg: SloConfig) -> list[Entry]:
    return [
        Entry(
            alert=ar.ALERT_SPANS_DROPPED,
            meaning=(
                "A process dropped spans (queue full or export failed) in every 5-minute window "
                f"for {cfg.self_monitoring_for}."
            ),
            impact="Traces are missing; metrics are unaffected.",
            promql=(f"sum by (instance, reason) (rate({sc.SPANS_DROPPED}[5m]))",),
            traceql=f"{{ {SERVICE} }}",
            panels=((REQUEST_PATH, "Request rate by code"),),
            actions=(
                "reason=export_failed: the collector is down or refuses; reason=queue_full: "
                "raise STAGELENS_SPAN_QUEUE_SIZE or sample (OTEL_TRACES_SAMPLER).",
            ),
        ),
        Entry(
            alert=ar.ALERT_TELEMETRY_ERRORS,
            meaning=(
                "stagelens swallowed telemetry failures in one component in every 5-minute "
                f"window for {cfg.self_monitoring_for} (serving goes on)."
            ),
            impact="Some figures are missing or incomplete; requests are served.",
            promql=(f"sum by (instance, component) (rate({sc.TELEMETRY_ERRORS}[5m]))",),
            traceql=f"{{ {SERVICE} && status = error }}",
            panels=((REQUEST_PATH, "Request rate by code"),),
            actions=("Read the process log: the first failure of each component is logged once.",),
        ),
        Entry(
            alert=ar.ALERT_METRICS_SPLIT,
            meaning=(
                "A gateway job runs as several workers of one server (uvicorn `--workers`, "
                "gunicorn `-w`) without `PROMETHEUS_MULTIPROC_DIR`, seen for "
                f"{cfg.self_monitoring_for}: every worker reports {sc.METRICS_SPLIT}, and "
                "each scrape reads only the counts of the worker that answered it."
            ),
            impact="Counters jump back and forth between scrapes and rate() sees resets: the "
            "SLIs, burn rates and costs of that job are wrong (requests are served).",
            promql=(
                f"max by (job, instance, {sc.LABEL_SERVER}, {sc.LABEL_WORKERS}) "
                f"({sc.METRICS_SPLIT})",
            ),
            traceql=f"{{ {SERVICE} }}",
            panels=((SLOS, "Gateway processes with split metrics"),),
            actions=(
                "Set `PROMETHEUS_MULTIPROC_DIR` to an empty directory before the server starts "
                "(and, with gunicorn, mark dead workers in its `child_exit` hook): "
                "docs/instrumenting.md, section Several workers. Or run one worker per pod "
                "and scale with replicas.",
            ),
        ),
        Entry(
            alert=ar.ALERT_GPU_COLLECTOR_DOWN,
            meaning=(
                f"stagelens_gpu_collector_up was 0 for {cfg.gpu_collector_down_for} on an "
                "instance where NVML answered within the last day (the GPU collector lost "
                "NVML; the alert names the instance), or no target of a job reports it any "
                "more though one did within the last day (its targets down or gone; the alert "
                "names the job, not an address: a pod that moved to a new address and reports "
                "again is no loss). A host that never had a GPU (a CPU-only gateway with "
                "nvidia-ml-py installed reports 0 from the start) never fires; nor does one "
                "whose driver never worked."
            ),
            impact="GPU panels and StagelensGPUSaturated are blind on that host.",
            promql=(
                f"{sc.GPU_COLLECTOR_UP} == 0",
                f'max by (instance) (max_over_time({sc.GPU_COLLECTOR_UP}{{job="JOB"}}[1d]))',
            ),
            traceql='{ span.stagelens.stage = "inference" }',
            panels=((ENGINE_GPU, "GPU memory used"),),
            actions=(
                "Check the driver (nvidia-smi), the device plugin and that the exporter's "
                "container sees the GPUs.",
            ),
        ),
    ]
