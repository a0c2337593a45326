"""Runbook sections of the SLO alerts: the burn rates and the p95 and stage-budget tickets."""

from __future__ import annotations

from typing import Final

from stagelens import semconv as sc
from stagelens.metrics.buckets import INTER_TOKEN_LATENCY_BUCKETS
from stagelens.slo import alert_rules as ar
from stagelens.slo.config import SloConfig
from stagelens.slo.gateway_slis import gateway_stall_threshold
from stagelens.slo.record_names import (
    CLASSED_SLIS,
    INFERENCE_BUDGET_RECORD,
    STAGE_BUDGET_RECORD,
    TTFT_THRESHOLD_RECORD,
    class_error_ratio_record,
    inference_latency_record,
    sli_error_ratio_record,
    stage_latency_record,
    ttft_p95_record,
)
from stagelens.slo.runbook_entry import (
    REQUEST_PATH,
    SERVICE,
    SLOS,
    Entry,
)

CLASS: Final = 'model="MODEL", prompt_size="PROMPT_SIZE"'
"""Selector of the alert's model and prompt-size class."""

_SLI_PANEL: Final[dict[str, str]] = {
    sc.SLI_AVAILABILITY: "Availability",
    sc.SLI_TTFT: "TTFT",
    sc.SLI_ITL: "Inter-token latency",
    sc.SLI_GOODPUT: "Goodput",
    sc.SLI_ANSWER: "Time to first answer token",
}


def _stalls(sli: str) -> tuple[str, ...]:
    """For the ITL burn: inter-token gaps per second longer than the gateway's stall
    threshold (a bucket bound of the ITL histogram, else the next one up); with exemplars
    shown, each dot is a sampled request's worst gap and opens its trace."""
    if sli != sc.SLI_ITL:
        return ()
    stall = gateway_stall_threshold()
    bound = next((b for b in INTER_TOKEN_LATENCY_BUCKETS if b >= stall), None)
    if bound is None:
        return ()
    itl = f'{sc.INTER_TOKEN_LATENCY}_bucket{{model="MODEL"'
    return (f'sum(rate({itl}, le="+Inf"}}[5m])) - sum(rate({itl}, le="{bound:g}"}}[5m]))',)


def burn_entry(cfg: SloConfig, sli: str) -> Entry:
    objective = cfg.objectives[sli]
    budget = cfg.error_budget(sli)
    windows = cfg.windows_for(sli)
    pairs = "; ".join(
        f"`{w.severity}`: {w.factor:g}x over {w.long} and {w.short} ({w.factor * budget:.3g} "
        f"of requests bad; at least {cfg.request_floor(sli, w)} requests in the {w.long})"
        for w in windows
    )
    classed = sli in CLASSED_SLIS
    where = CLASS if classed else 'model="MODEL"'
    selector = f'{{{sc.LABEL_SLI}="{sli}", {where}}}'
    keep = "model, sli, prompt_size" if classed else "model, sli"
    ratio = class_error_ratio_record(sli, "1h") if classed else sli_error_ratio_record("1h")
    ttft = cfg.ttft_threshold_seconds
    classes = ", ".join(f"`{size}`: {secs:g}s" for size, secs in cfg.ttft_classes())
    answers = ", ".join(f"`{size}`: {secs:g}s" for size, secs in cfg.answer_classes())
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
        sc.SLI_ANSWER: "asked for a stream and got no answer token (past the model's "
        f"reasoning) within the threshold of its prompt-size class (`prompt_size` {answers}), "
        "failures and streams cut while the model was still thinking included (each class "
        "burns its own budget, as for TTFT)",
    }[sli]
    trace = {
        sc.SLI_AVAILABILITY: f"{{ {SERVICE} && span.http.response.status_code >= 500 }}",
        sc.SLI_TTFT: f"{{ {SERVICE} && span.stagelens.time_to_first_token > THRESHOLD }}",
        # A stall has no span attribute of its own: the ITL histogram's exemplars (the
        # PromQL below, with exemplars on) lead to stalled requests; this finds the streams
        # that broke after their first token.
        sc.SLI_ITL: '{ span.stagelens.stage = "inference" && span.gen_ai.request.stream = true '
        "&& status = error }",
        sc.SLI_GOODPUT: f"{{ {SERVICE} && span.stagelens.time_to_first_token > {ttft:g} }}",
        sc.SLI_ANSWER: f"{{ {SERVICE} && span.{sc.ATTR_TTFAT} > THRESHOLD }}",
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
            f"{ratio}{selector}",
            f"sum by ({keep}) (rate({sc.SLI_ERRORS}{selector}[5m])) / "
            f"sum by ({keep}) (rate({sc.SLI_REQUESTS}{selector}[5m]))",
            *_stalls(sli),
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


def latency_entries(cfg: SloConfig) -> list[Entry]:
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
                f"{ttft_p95_record(cfg.ttft_p95_window)}{{{CLASS}}}",
                "histogram_quantile(0.95, sum by (le) "
                f"(rate({sc.TIME_TO_FIRST_TOKEN}_bucket{{{CLASS}}}[5m])))",
                f'{TTFT_THRESHOLD_RECORD}{{prompt_size="PROMPT_SIZE"}}',
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
                "the first upstream token (stagelens_upstream_time_to_first_token_seconds), per "
                "model and prompt-size class (the alert names both), against the larger of the "
                f"stage's budget and the class's TTFT threshold ({classes}): prefill grows with "
                "the prompt, and a class the TTFT SLO gives seconds is not held to the stage's "
                "budget. The decode that follows is no stage's to meet."
            ),
            impact="Time to first token grows by that stage's overrun for every request.",
            promql=(
                f'{stage_latency_record(cfg.stage_latency_window)}{{stage="STAGE"}}',
                f'{STAGE_BUDGET_RECORD}{{stage="STAGE"}}',
                f"{inference_latency_record(cfg.stage_latency_window)}{{{CLASS}}}",
                f"{INFERENCE_BUDGET_RECORD}{{{CLASS}}}",
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
