"""``alerts/runbook.md``, generated: one section per alert, with the config's own figures.

Why generated: every section names thresholds, windows and queries that the alerts are
rendered from; written by hand they drift the day a threshold changes. Each section says
what the alert means, what users feel, the PromQL and the trace query (TraceQL, for Tempo or
any backend that speaks it) to run, the dashboard panels to open (tests check they exist),
and what to do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from stagelens import semconv as sc
from stagelens.slo import alert_rules as ar
from stagelens.slo.config import SloConfig
from stagelens.slo.recording_rules import (
    BILLED_TOKENS_RECORD,
    BILLING_DRIFT_RECORD,
    COST_SPENT_RECORD,
    ENGINE_KV_USAGE_RECORD,
    ENGINE_PREEMPTIONS_RECORD,
    ENGINE_WAITING_RECORD,
    GENERATED_TOKENS_RECORD,
    GPU_SM_ACTIVE_RECORD,
    STAGE_BUDGET_RECORD,
    cost_projected_record,
    kv_hit_ratio_record,
    sli_error_ratio_record,
    stage_latency_record,
    ttft_p95_record,
)

REQUEST_PATH: Final = "stagelens / Request path"
TOKENS_COST: Final = "stagelens / Tokens and cost"
ENGINE_GPU: Final = "stagelens / Engine and GPU"
SLOS: Final = "stagelens / SLOs"
DASHBOARD_UIDS: Final[dict[str, str]] = {
    REQUEST_PATH: "stagelens-request-path",
    TOKENS_COST: "stagelens-tokens-cost",
    ENGINE_GPU: "stagelens-engine-gpu",
    SLOS: "stagelens-slos",
}
"""Dashboard title -> uid (Grafana opens ``/d/<uid>``)."""

SERVICE: Final = 'resource.service.name = "stagelens-gateway"'


@dataclass(frozen=True)
class Entry:
    """One runbook section."""

    alert: str
    meaning: str
    impact: str
    promql: tuple[str, ...]
    traceql: str
    panels: tuple[tuple[str, str], ...]
    """(dashboard title, panel title) to open."""
    actions: tuple[str, ...]


_SLI_PANEL: Final[dict[str, str]] = {
    sc.SLI_AVAILABILITY: "Availability",
    sc.SLI_TTFT: "TTFT",
    sc.SLI_ITL: "Inter-token latency",
    sc.SLI_GOODPUT: "Goodput",
    sc.SLI_ANSWER: "Time to first answer token",
}


def _burn_entry(cfg: SloConfig, sli: str) -> Entry:
    objective = cfg.objectives[sli]
    budget = cfg.error_budget(sli)
    windows = cfg.windows_for(sli)
    pairs = "; ".join(
        f"`{w.severity}`: {w.factor:g}x over {w.long} and {w.short} ({w.factor * budget:.3g} "
        f"of requests bad; at least {cfg.request_floor(sli, w)} requests in the {w.long})"
        for w in windows
    )
    selector = f'{{{sc.LABEL_SLI}="{sli}", model="MODEL"}}'
    ttft = cfg.ttft_threshold_seconds
    classes = ", ".join(f"`{size}`: {secs:g}s" for size, secs in cfg.ttft_classes())
    bad = {
        sc.SLI_AVAILABILITY: "answered 5xx (503 and 504 included), broke after its 200 "
        "headers (upstream died, error event), or whose client gave up (499) after the server "
        "had taken too long; 4xx answers are the client's and count as good",
        sc.SLI_TTFT: "asked for a stream and got no first token within the threshold of its "
        f"prompt-size class (`prompt_size` {classes}), failures included (a failed request has "
        "no first token). Each class burns its own budget: one tenant's long prompts cannot "
        "spend everyone's",
        sc.SLI_ITL: "streamed two or more tokens with a stall (its worst gap between two "
        "tokens above the gateway's stall threshold), or broke after its first token",
        sc.SLI_GOODPUT: "streamed and missed the TTFT or the inter-token objective, or was cut "
        "after exactly one token",
        sc.SLI_ANSWER: f"asked for a stream and got no answer token (past the model's "
        f"reasoning) within {cfg.answer_threshold_seconds:g}s, failures and streams cut "
        "while the model was still thinking included",
    }[sli]
    trace = {
        sc.SLI_AVAILABILITY: f"{{ {SERVICE} && span.http.response.status_code >= 500 }}",
        sc.SLI_TTFT: f"{{ {SERVICE} && span.stagelens.time_to_first_token > {ttft:g} }}",
        sc.SLI_ITL: '{ span.stagelens.stage = "inference" && span.gen_ai.request.stream = true '
        "&& duration > 5s }",
        sc.SLI_GOODPUT: f"{{ {SERVICE} && span.stagelens.time_to_first_token > {ttft:g} }}",
        sc.SLI_ANSWER: f"{{ {SERVICE} && span.{sc.ATTR_TTFAT} > "
        f"{cfg.answer_threshold_seconds:g} }}",
    }[sli]
    title = _SLI_PANEL[sli]
    return Entry(
        alert=ar.BURN_ALERTS[sli],
        meaning=(
            f"The share of requests that {bad} is using the {cfg.period} error budget "
            f"(objective {objective:g}, budget {budget:.4g}) too fast on a long and a short "
            f"window at once: {pairs}. One alert per severity. A pair needs at least "
            f"{cfg.min_requests} requests and {cfg.min_bad_events} bad ones in its long window "
            "(a few failures at low traffic are noise, not a burn). A pair whose short window "
            "holds no request at all is judged by its long window alone: a page does not "
            "resolve because traffic stopped; it holds until the bad requests leave the long "
            "window, and StagelensTrafficStopped says why the figures went quiet."
        ),
        impact=(
            "`page`: at this pace the month's budget is gone within days; users see it now. "
            "`ticket`: the budget will run out before the period ends if nothing changes."
        ),
        promql=(
            f"{sli_error_ratio_record('1h')}{selector}",
            f'sum by (model, sli) (rate({sc.SLI_ERRORS}{{model="MODEL"}}[5m])) / '
            f'sum by (model, sli) (rate({sc.SLI_REQUESTS}{{model="MODEL"}}[5m]))',
        ),
        traceql=trace,
        panels=(
            (SLOS, f"{title} burn rate"),
            (REQUEST_PATH, "Where did the time to first token go"),
        ),
        actions=(
            "Find when it started on the burn-rate panel and match it with deploys and traffic.",
            "Open the slowest or failed traces of the query above: the stage span that grew, or "
            "the error on the inference span, names the cause.",
            "Engine saturated (waiting requests, KV usage, preemptions on Engine and GPU): add "
            "replicas or shed batch load. One backend slow or failing: take it out of the pool.",
        ),
    )


def _entries(cfg: SloConfig) -> list[Entry]:
    entries = [_burn_entry(cfg, sli) for sli in ar.BURN_ALERTS]
    entries += _latency_entries(cfg) + _cost_entries(cfg) + _engine_entries(cfg)
    entries += _target_entries(cfg) + _silence_entries(cfg) + _self_entries(cfg)
    order = {name: i for i, name in enumerate(ar.ALL_ALERTS)}
    return sorted(entries, key=lambda e: order[e.alert])


def _latency_entries(cfg: SloConfig) -> list[Entry]:
    ttft = cfg.ttft_threshold_seconds
    classes = ", ".join(f"`{size}`: {secs:g}s" for size, secs in cfg.ttft_classes())
    return [
        Entry(
            alert=sc.ALERT_TTFT_P95_HIGH,
            meaning=(
                "p95 time to first token of a model, per prompt-size class, stayed above its "
                f"class's threshold ({classes}; series without a class {ttft:g}s) for "
                f"{cfg.ttft_p95_for} with at least {cfg.min_requests} requests per "
                f"{cfg.ttft_p95_window}. A symptom ticket: at 5-10 % slow requests it reads "
                "high while the error budget burns at about 1x."
            ),
            impact="Some users wait longer than the objective for the first token; no page.",
            promql=(
                f'{ttft_p95_record(cfg.ttft_p95_window)}{{model="MODEL"}}',
                "histogram_quantile(0.95, sum by (le) "
                f'(rate({sc.TIME_TO_FIRST_TOKEN}_bucket{{model="MODEL"}}[5m])))',
            ),
            traceql=(
                '{ span.stagelens.stage = "inference" && span.gen_ai.request.model = "MODEL" } '
                "| by(span.server.address) | avg(duration) > 1s"
            ),
            panels=(
                (SLOS, "p95 time to first token by model and prompt size"),
                (REQUEST_PATH, "TTFT distribution"),
            ),
            actions=(
                "A bimodal heatmap (two bands) points at one slow backend: the trace query "
                "groups the inference spans by backend (server.address); compare that engine's "
                "queue and KV usage on Engine and GPU and take it out of the pool.",
                "A shifted distribution is load: see the TTFT burn rate before paging anyone.",
            ),
        ),
        Entry(
            alert=ar.ALERT_STAGE_OVER_BUDGET,
            meaning=(
                "p95 of one stage stayed above its latency budget (stagelens_stage_budget_seconds"
                f") for {cfg.stage_budget_for}. For `inference` the budget applies to the time to "
                "the first upstream token (stagelens_upstream_time_to_first_token_seconds); the "
                "decode that follows is no stage's to meet."
            ),
            impact="Time to first token grows by that stage's overrun for every request.",
            promql=(
                f'{stage_latency_record(cfg.stage_latency_window)}{{stage="STAGE"}}',
                f'{STAGE_BUDGET_RECORD}{{stage="STAGE"}}',
            ),
            traceql='{ span.stagelens.stage = "STAGE" && duration > 100ms }',
            panels=(
                (REQUEST_PATH, "Stage latency budget"),
                (REQUEST_PATH, "Share of time per stage"),
            ),
            actions=(
                "tokenizer: prompts grew (check input tokens on Tokens and cost). router: "
                "admission queueing, raise max_inflight or add backends. inference: engine queue "
                "and prefill on Engine phases. gateway: auth or rate-limit store slow.",
            ),
        ),
    ]


def _cost_entries(cfg: SloConfig) -> list[Entry]:
    return [
        Entry(
            alert=sc.ALERT_COST_BUDGET_BURN,
            meaning=(
                f"`page`: a tenant's spend over the last 24h plus {cfg.cost_page_horizon} more at "
                "the pace of the last hour (and of the last 5 minutes) would reach "
                f"{cfg.cost_page_multiple:g}x its daily cap: runaway spend. `ticket`: its spend "
                "over the last 24h is above the cap. A batch that spends its whole cap in three "
                "hours triggers neither."
            ),
            impact="Money: the tenant (or a loop in its client) spends beyond what was agreed.",
            promql=(
                f'{cost_projected_record("1h")}{{tenant="TENANT"}}',
                f'{COST_SPENT_RECORD}{{tenant="TENANT"}}',
                f'sum by (model) (rate({sc.TOKENS}{{tenant="TENANT"}}[5m]))',
            ),
            traceql=f'{{ {SERVICE} && span.stagelens.tenant = "TENANT" }}',
            panels=(
                (TOKENS_COST, "Projected: last 24h plus the next hour at the current pace"),
                (TOKENS_COST, "Spent in the last 24h, share of the daily cap"),
            ),
            actions=(
                "Check whether the tokens come from a new model (pricier) or a retry loop "
                "(same prompts, many requests) in the traces.",
                "Contact the tenant; lower its rate limit in the gateway, or raise its budget "
                "deliberately (stagelens_budget_usd, STAGELENS_DAILY_BUDGETS_USD).",
            ),
        ),
        Entry(
            alert=ar.ALERT_BILLING_DRIFT,
            meaning=(
                "Over the last hour, the output tokens the gateway billed differ from those the "
                f"engines generated by more than {cfg.billing_drift_threshold:g} of the "
                f"generated (at least {cfg.billing_drift_min_tokens} generated tokens an hour), "
                "all models of the environment together (one vLLM model may serve several "
                "public names; vLLM labels them all with its first). Positive: tokens generated "
                "that nobody was billed for: calls that bypassed the gateway, or the tokens vLLM "
                "generates after a client left and before the abort takes effect (its counter "
                "counts aborted requests' tokens; measured about 3 per aborted stream). "
                "Negative: billed tokens the engines never counted (cut streams billed from an "
                "estimate, or an engine's counter lost with a restart between scrapes)."
            ),
            impact="Revenue or trust: invoices do not match the work done.",
            promql=(
                BILLING_DRIFT_RECORD,
                BILLED_TOKENS_RECORD,
                GENERATED_TOKENS_RECORD,
                f'sum by (model) (rate({sc.TOKENS}{{type="output"}}[1h]))',
                f"sum by (model_name) (rate({sc.VLLM_GENERATION_TOKENS}[1h]))",
            ),
            traceql=f"{{ {SERVICE} && span.stagelens.client_disconnected = true }}",
            panels=(
                (TOKENS_COST, "Billing drift"),
                (TOKENS_COST, "Output tokens: billed vs generated"),
            ),
            actions=(
                "Positive drift: find clients calling vLLM directly (bypassing the gateway) in "
                "vLLM's access logs; close that path.",
                "Positive drift with many disconnects: count disconnected streams (trace query "
                "above); the expected gap per abort is in the README's billing section.",
                f'Negative drift: check {sc.UNMETERED_REQUESTS}{{billing="estimated"}} '
                "(cut streams billed from an estimate) and vLLM restarts.",
            ),
        ),
    ]


def _engine_entries(cfg: SloConfig) -> list[Entry]:
    return [
        Entry(
            alert=ar.ALERT_KV_HIT_RATE_COLLAPSE,
            meaning=(
                "The engine prefix-cache hit rate of a model over 30m fell below "
                f"{1 - cfg.kv_hit_rate_drop:g}x its 6h rate of an hour earlier, which was at least "
                f"{cfg.kv_hit_rate_min_baseline:g}, for {cfg.kv_hit_rate_for}. The stagelens "
                "plugin's counters, else vLLM's own. Workloads that never share prefixes never "
                "fire."
            ),
            impact="Prefills get longer: TTFT and GPU time per request grow.",
            promql=(
                f'{kv_hit_ratio_record("30m")}{{model="MODEL"}}',
                f'{kv_hit_ratio_record("6h")}{{model="MODEL"}} offset 1h',
            ),
            traceql=(
                '{ span.stagelens.stage = "inference" '
                "&& span.gen_ai.usage.cache_read.input_tokens = 0 }"
            ),
            panels=((ENGINE_GPU, "Prefix-cache hit rate"), (ENGINE_GPU, "KV-cache usage")),
            actions=(
                "A changed system prompt or template (new prefix) explains a step change; a "
                "balancer no longer routing by prefix affinity spreads prefixes over engines.",
                "KV usage near 1 with preemptions: the cache evicts; give it more memory.",
            ),
        ),
        Entry(
            alert=ar.ALERT_GPU_SATURATED,
            meaning=(
                "SM activity of a GPU (stagelens GPM, else DCGM_FI_PROF_SM_ACTIVE; never NVML "
                f"utilisation, which only says a kernel ran) stayed above "
                f"{cfg.gpu_saturation_threshold:g} for {cfg.gpu_saturation_for}. Keyed by UUID, "
                "so a GPU both exporters see is one alert. When its gauge vanishes (the "
                "exporter or DCGM target gone) while its last reading was saturated, it keeps "
                f"firing for {cfg.gpu_vanished_hold}: losing the sight of a busy GPU is no "
                "resolution (StagelensTargetVanished and StagelensGPUCollectorDown say why)."
            ),
            impact="No headroom: more load raises latency on that GPU's engine.",
            promql=(f'{GPU_SM_ACTIVE_RECORD}{{uuid="UUID"}}',),
            traceql='{ span.stagelens.stage = "inference" && duration > 2s }',
            panels=((ENGINE_GPU, "GPU SM activity vs kernel time"),),
            actions=(
                "Compare with waiting requests: saturated and queueing means scale out; saturated "
                "without a queue is a well-used GPU (close the ticket).",
            ),
        ),
        Entry(
            alert=ar.ALERT_ENGINE_SATURATED,
            meaning=(
                "The engines of a model are saturated, as llm-d measures it: `signal=queue` more "
                f"than {cfg.engine_waiting_threshold:g} requests waiting in one engine, "
                f"`signal=kv_cache` KV cache over {cfg.engine_kv_usage_threshold:g}, "
                f"`signal=preemptions` requests preempted, each for {cfg.engine_saturation_for}."
            ),
            impact="Queueing and preemption add directly to TTFT; the TTFT SLO burns next.",
            promql=(
                f'{ENGINE_WAITING_RECORD}{{model="MODEL"}}',
                f'{ENGINE_KV_USAGE_RECORD}{{model="MODEL"}}',
                f'{ENGINE_PREEMPTIONS_RECORD}{{model="MODEL"}}',
            ),
            traceql='{ name = "queue" && duration > 1s }',
            panels=(
                (ENGINE_GPU, "Running and waiting requests"),
                (ENGINE_GPU, "Preemptions"),
                (REQUEST_PATH, "Engine queue time p95 by model"),
            ),
            actions=(
                "Add vLLM replicas; lower max_num_seqs or max_tokens for batch tenants; give the "
                "KV cache more GPU memory (gpu_memory_utilization).",
            ),
        ),
    ]


def _target_entries(cfg: SloConfig) -> list[Entry]:
    return [
        Entry(
            alert=ar.ALERT_BACKEND_DOWN,
            meaning=(
                "Prometheus could not scrape one vLLM backend (`up == 0`, job=~"
                f"`{cfg.backend_job_regex}`) for {cfg.backend_down_for}. A ticket: the gateway's "
                "balancer health-checks backends and routes around a dead one."
            ),
            impact="Less capacity; requests still succeed on the other backends.",
            promql=(f'up{{job=~"{cfg.backend_job_regex}"}} == 0',),
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
                f"No target of the backend jobs (job=~`{cfg.backend_job_regex}`) answered a "
                f"scrape for {cfg.no_backend_for}, or none is scraped at all (a vanished target "
                "leaves no `up` series; `absent()` catches it). Also fires on a new install "
                "whose PodMonitor or ServiceMonitor does not reach vLLM."
            ),
            impact="Every request that needs inference fails (503 from the load balancer).",
            promql=(
                f'up{{job=~"{cfg.backend_job_regex}"}}',
                f'sum by (code) (rate({sc.REJECTIONS}{{stage="load_balancer"}}[5m]))',
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
                f"No target of the gateway jobs (job=~`{cfg.gateway_job_regex}`) answered a "
                f"scrape for {cfg.gateway_absent_for}, or none is scraped at all."
            ),
            impact="Either the gateway is down (users get connection errors) or every SLO "
            "alert is blind.",
            promql=(f'up{{job=~"{cfg.gateway_job_regex}"}}',),
            traceql=f"{{ {SERVICE} }}",
            panels=((REQUEST_PATH, "Request rate by code"),),
            actions=(
                "Check the gateway pods and their readiness; if they serve traffic, check the "
                "gateway's ServiceMonitor (deploy/kubernetes/monitors.yaml).",
            ),
        ),
    ]


def _silence_entries(cfg: SloConfig) -> list[Entry]:
    jobs = ar.monitored_jobs(cfg)
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
            promql=(f'up{{job=~"{jobs}"}} == 0',),
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
                f"A target (job=~`{jobs}`) scraped within the last {cfg.target_vanished_window} "
                f"has had no `up` series for {cfg.target_vanished_for}: service discovery "
                "dropped it. `up == 0` never fires for a target nobody scrapes any more. "
                "Expected after a deliberate scale-down (it resolves once the target is "
                f"{cfg.target_vanished_window} gone)."
            ),
            impact="Every alert that reads its series is silent for it: blind, not green.",
            promql=(
                f'max_over_time(up{{job=~"{jobs}"}}[{cfg.target_vanished_window}]) '
                f'unless up{{job=~"{jobs}"}}',
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


def _self_entries(cfg: SloConfig) -> list[Entry]:
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
            alert=ar.ALERT_GPU_COLLECTOR_DOWN,
            meaning=(
                f"stagelens_gpu_collector_up was 0, or absent (its target down or gone), for "
                f"{cfg.gpu_collector_down_for} on a host "
                "where NVML answered within the last day: the GPU collector lost NVML. A host "
                "that never had a GPU (a CPU-only gateway with nvidia-ml-py installed reports 0 "
                "from the start) never fires; nor does one whose driver never worked."
            ),
            impact="GPU panels and StagelensGPUSaturated are blind on that host.",
            promql=(f"{sc.GPU_COLLECTOR_UP} == 0",),
            traceql='{ span.stagelens.stage = "inference" }',
            panels=((ENGINE_GPU, "GPU memory used"),),
            actions=(
                "Check the driver (nvidia-smi), the device plugin and that the exporter's "
                "container sees the GPUs.",
            ),
        ),
    ]


def _section(entry: Entry) -> str:
    lines = [f"## {entry.alert}", "", f"**Meaning.** {entry.meaning}", ""]
    lines += [f"**Impact.** {entry.impact}", "", "**PromQL.**", "", "```promql"]
    lines += [*entry.promql, "```", "", "**Traces (TraceQL).**", "", "```traceql"]
    lines += [entry.traceql, "```", "", "**Dashboards.**"]
    lines += [
        f"- *{board}* (`/d/{DASHBOARD_UIDS[board]}`): panel *{panel}*"
        for board, panel in entry.panels
    ]
    lines += ["", "**Do.**"]
    lines += [f"- {action}" for action in entry.actions]
    return "\n".join(lines) + "\n"


def runbook_entries(cfg: SloConfig) -> list[Entry]:
    """Every runbook section, in ALL_ALERTS order."""
    return _entries(cfg)


def render_runbook(cfg: SloConfig) -> str:
    """The runbook's Markdown."""
    head = (
        "# stagelens alert runbook\n\n"
        "Generated by `stagelens slo render` from the SLO config; do not edit by hand. One "
        "section per alert; every alert's `runbook_url` points at its anchor here. Upper-case "
        "words in queries (MODEL, TENANT, STAGE, UUID, HOST) are the alert's labels.\n"
    )
    return head + "".join("\n" + _section(e) for e in _entries(cfg))
