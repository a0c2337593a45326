"""Dashboard 1, "Request path": where a request's time goes, stage by stage.

Why the budgeted figures: the ``inference`` stage times the whole upstream call, decode
included, so its duration dwarfs every other stage (the share chart read ~100 % inference)
and can never meet a first-token budget. The budget table, the share chart and "where did
the time to first token go" use, for ``inference``, its time to the first upstream token
(``stagelens_upstream_time_to_first_token_seconds``); decode is drawn beside it.
"""

from __future__ import annotations

from typing import Final

from grafana_foundation_sdk.builders import dashboard
from grafana_foundation_sdk.models.dashboard import Dashboard as DashboardModel
from stagelens.dashboards.common import (
    LATENCY_EXEMPLARS,
    MODEL,
    WHERE,
    base,
    class_threshold_lines,
    engine_phase_mean,
    engine_phase_quantile,
    mean,
    quantile,
    quantile_bound,
)
from stagelens.dashboards.panels import (
    RATE,
    heatmap_panel,
    table_panel,
    timeseries_panel,
)

from stagelens import semconv as sc
from stagelens.metrics import buckets
from stagelens.metrics.buckets import worst_ratio
from stagelens.slo.alert_rules import class_thresholds_text
from stagelens.slo.config import SloConfig
from stagelens.stages import STAGE_ORDER, Stage

INFERENCE: Final = Stage.INFERENCE.value
BEFORE_INFERENCE: Final = "|".join(
    s.value for s in (Stage.GATEWAY, Stage.LOAD_BALANCER, Stage.TOKENIZER, Stage.ROUTER)
)
"""The stages a request passes before the upstream call (a regex alternation)."""
TTFT_PHASES: Final = f"{sc.PHASE_QUEUE}|{sc.PHASE_PREFILL}"
CELL: Final = "$__interval"
"""A heatmap cell's window: the step itself, so neighbouring cells never overlap (see
``panels.HEATMAP_MIN_INTERVAL``)."""


def stage_positions() -> str:
    """Each canonical stage's position in request order, as one PromQL vector per stage.

    The budget table sorts its rows by this so they read gateway ... billing, whatever order
    Prometheus returns the series in (custom stages have no position).
    """
    return " or ".join(
        f'label_replace(vector({position}), "{sc.LABEL_STAGE}", "{stage.value}", "", "")'
        for position, stage in enumerate(STAGE_ORDER, start=1)
    )


def _as_inference(expr: str) -> str:
    return f'label_replace({expr}, "{sc.LABEL_STAGE}", "{INFERENCE}", "", "")'


TTFT_BOUND: Final = quantile_bound(buckets.TTFT_BUCKETS, *buckets.TTFT_RANGE)
ITL_BOUND: Final = quantile_bound(
    buckets.INTER_TOKEN_LATENCY_BUCKETS, *buckets.INTER_TOKEN_LATENCY_RANGE
)
E2E_BOUND: Final = quantile_bound(buckets.REQUEST_DURATION_BUCKETS, *buckets.REQUEST_RANGE)
STAGE_BOUND: Final = quantile_bound(buckets.STAGE_DURATION_BUCKETS, *buckets.STAGE_RANGE)
ENGINE_BOUND: Final = (
    "Engine phases keep vLLM's own bucket bounds, up to "
    f"{worst_ratio(buckets.ENGINE_PHASE_BUCKETS, 0.001, 10.0):g}x apart between 1 ms and "
    "10 s: a percentile there may be off by that factor."
)
"""What each family's percentile panels say about their error."""


def budgeted_quantile(q: float, window: str) -> str:
    """Per stage, the quantile of the figure its budget applies to."""
    stages = f'{MODEL}, {sc.LABEL_STAGE}!="{INFERENCE}"'
    return (
        f"{quantile(q, sc.STAGE_DURATION, sc.LABEL_STAGE, stages, window)} or "
        f"{_as_inference(quantile(q, sc.UPSTREAM_TTFT, '', MODEL, window))}"
    )


def budgeted_mean(window: str) -> str:
    """Per stage, the mean of the figure its budget applies to."""
    stages = f'{MODEL}, {sc.LABEL_STAGE}!="{INFERENCE}"'
    return (
        f"{mean(sc.STAGE_DURATION, sc.LABEL_STAGE, stages, window)} or "
        f"{_as_inference('(' + mean(sc.UPSTREAM_TTFT, '', MODEL, window) + ')')}"
    )


def _share(window: str) -> str:
    means = budgeted_mean(window)
    return f"({means}) / ignoring ({sc.LABEL_STAGE}) group_left sum({means})"


def _ttft_breakdown() -> list[tuple[str, str]]:
    """Mean seconds per request before the first token, part by part, and TTFT itself."""
    before = f'{MODEL}, {sc.LABEL_STAGE}=~"{BEFORE_INFERENCE}"'
    phases = f'{MODEL}, {sc.LABEL_PHASE}=~"{TTFT_PHASES}"'
    upstream = mean(sc.UPSTREAM_TTFT, "", MODEL)
    phase_means = engine_phase_mean(sc.LABEL_PHASE, phases)
    return [
        (mean(sc.STAGE_DURATION, sc.LABEL_STAGE, before), "{{stage}}"),
        (phase_means, "engine {{phase}}"),
        # Without the engine phases (vLLM without the plugin, or a gateway that does not
        # read them) the whole upstream wait is this band: scalar() of nothing is NaN,
        # which erased it, so the phases count as 0 there (0 x the upstream figure, which
        # exists exactly when this band has anything to show).
        (
            f"clamp_min(({upstream}) - (sum({phase_means}) or 0 * ({upstream})), 0)",
            "inference: network and vLLM frontend",
        ),
        (mean(sc.TIME_TO_FIRST_TOKEN, "", MODEL), "time to first token"),
    ]


def _latency_rows(cfg: SloConfig, board: dashboard.Dashboard) -> dashboard.Dashboard:
    stage_order = ", ".join(s.value for s in STAGE_ORDER)
    inference_budget = cfg.stage_budgets_seconds.get(INFERENCE, 0.8)
    return (
        board.with_row(dashboard.Row("Where the time to first token goes"))
        .with_panel(
            timeseries_panel(
                "Where did the time to first token go",
                "s",
                _ttft_breakdown(),
                stacked=True,
                unstacked_refs=("D",),
                width=24,
                description=(
                    "Mean seconds per request: the stages before the upstream call, the "
                    "engine's queue and prefill, and the rest of the time to the first upstream "
                    "token (network, vLLM's frontend), stacked; the dashed line is the mean time "
                    "to first token the client saw. A gap between stack and line is time the "
                    "gateway spent that no stage names."
                ),
            )
        )
        .with_panel(
            table_panel(
                "Stage latency budget",
                "s",
                [
                    (f"max by ({sc.LABEL_STAGE}) ({sc.STAGE_BUDGET}{{{WHERE}}})", "budget"),
                    (budgeted_quantile(0.5, "$__range"), "p50"),
                    (budgeted_quantile(0.95, "$__range"), "p95"),
                    (_share("$__range"), "share"),
                ],
                join_field=sc.LABEL_STAGE,
                unit_overrides={"share": "percentunit"},
                row_order=stage_positions(),
                description=(
                    f"Stages in request order: {stage_order}. inference: its time to the first "
                    "upstream token, which its budget applies to (decode is shown beside, not "
                    "in the share). Share: of the mean request's budgeted time. "
                    f"{STAGE_BOUND}"
                ),
            )
        )
        .with_panel(
            timeseries_panel(
                "Share of time per stage",
                "percentunit",
                [(_share(RATE), "{{stage}}")],
                stacked=True,
                description="Each stage's share of the mean request's budgeted time "
                "(inference: to its first upstream token).",
            )
        )
        .with_panel(
            timeseries_panel(
                "Inference: first upstream token vs decode",
                "s",
                [
                    (quantile(0.5, sc.UPSTREAM_TTFT, "", MODEL), "p50 first upstream token"),
                    (quantile(0.95, sc.UPSTREAM_TTFT, "", MODEL), "p95 first upstream token"),
                    (
                        engine_phase_quantile(
                            0.5, sc.LABEL_PHASE, f'{MODEL}, {sc.LABEL_PHASE}="{sc.PHASE_DECODE}"'
                        ),
                        "p50 engine {{phase}}",
                    ),
                ],
                threshold_lines=((None, "green"), (inference_budget, "red")),
                description="The inference stage's budget (dashed) applies to its first upstream "
                "token; decode grows with the answer's length and is no stage's to meet. "
                f"First upstream token: {TTFT_BOUND} {ENGINE_BOUND}",
            )
        )
        .with_panel(
            timeseries_panel(
                "Thinking: first token vs first answer token",
                "s",
                [
                    (quantile(0.95, sc.TIME_TO_FIRST_TOKEN, "", MODEL), "p95 first token"),
                    (
                        quantile(0.95, sc.TIME_TO_FIRST_ANSWER_TOKEN, "", MODEL),
                        "p95 first answer token",
                    ),
                    (
                        f"{mean(sc.TIME_TO_FIRST_ANSWER_TOKEN, '', MODEL)} - "
                        f"{mean(sc.TIME_TO_FIRST_TOKEN, '', MODEL)}",
                        "mean thinking time",
                    ),
                ],
                threshold_lines=((None, "green"), (cfg.answer_threshold_seconds, "red")),
                # The TTFT histogram carries exemplars, the answer token's does not.
                exemplar_refs=("A",) if LATENCY_EXEMPLARS else (),
                description="A reasoning model streams its thinking first: its first token "
                "comes early, the answer later. Thinking time: the mean time to first answer "
                "token minus the mean time to first token (0 for a model that does not "
                "reason). Dashed: the answer SLO threshold.",
            )
        )
        .with_row(dashboard.Row("Stages"))
        .with_panel(
            timeseries_panel(
                "End-to-end latency",
                "s",
                [
                    (quantile(q, sc.REQUEST_DURATION, ""), f"p{int(q * 100)}")
                    for q in (0.5, 0.95, 0.99)
                ],
                exemplars=LATENCY_EXEMPLARS,
                description=f"Gateway receipt to last byte sent. {E2E_BOUND}",
            )
        )
        .with_panel(
            timeseries_panel(
                "Stage duration p95",
                "s",
                [(quantile(0.95, sc.STAGE_DURATION, sc.LABEL_STAGE), "{{stage}}")],
                exemplars=LATENCY_EXEMPLARS,
                description=f"Whole time in each stage (inference includes decode). {STAGE_BOUND}",
            )
        )
        .with_row(dashboard.Row("Engine phases"))
        .with_panel(
            timeseries_panel(
                "Engine phase p50",
                "s",
                [(engine_phase_quantile(0.5, sc.LABEL_PHASE, MODEL), "{{phase}}")],
                width=8,
                description="The engine's own timings: queue, prefill, decode (and the vLLM "
                "frontend where the plugin runs), fleet percentiles: every engine's buckets "
                "added, then the quantile. One source per request: the vLLM plugin's where it "
                f"reports, else the gateway's. {ENGINE_BOUND}",
            )
        )
        .with_panel(
            timeseries_panel(
                "Engine phase p95",
                "s",
                [(engine_phase_quantile(0.95, sc.LABEL_PHASE, MODEL), "{{phase}}")],
                width=8,
                description=ENGINE_BOUND,
            )
        )
        .with_panel(
            timeseries_panel(
                "Engine queue time p95 by model",
                "s",
                [
                    (
                        engine_phase_quantile(
                            0.95, sc.LABEL_MODEL, f'{MODEL}, {sc.LABEL_PHASE}="{sc.PHASE_QUEUE}"'
                        ),
                        "{{model}}",
                    )
                ],
                width=8,
                description=f"Time requests waited for the engine's scheduler. {ENGINE_BOUND}",
            )
        )
    )


def request_path(cfg: SloConfig) -> DashboardModel:
    """Dashboard 1: the time-to-first-token breakdown, budgets, stages, engine phases,
    TTFT/ITL and errors."""
    board = base(
        "stagelens-request-path",
        "stagelens / Request path",
        "Where a request's time goes: the seven stages, the engine phases, TTFT, ITL, errors.",
        cfg,
    )
    requests = f"{sc.REQUESTS}{{{MODEL}}}"
    failed = f'{sc.REQUESTS}{{{MODEL}, {sc.LABEL_CODE}!~"2.."}}'
    itl_line = ((None, "green"), (cfg.itl_threshold_seconds, "red"))
    return (
        _latency_rows(cfg, board)
        .with_row(dashboard.Row("Tokens in time"))
        .with_panel(
            timeseries_panel(
                "Time to first token",
                "s",
                [
                    *(
                        (
                            quantile(q, sc.TIME_TO_FIRST_TOKEN, sc.LABEL_PROMPT_SIZE),
                            f"p{int(q * 100)} {{{{prompt_size}}}}",
                        )
                        for q in (0.5, 0.95)
                    ),
                    (class_threshold_lines(cfg, RATE), "threshold {{prompt_size}}"),
                ],
                unstacked_refs=("C",),
                exemplar_refs=("A", "B") if LATENCY_EXEMPLARS else (),
                description="Per prompt-size class, each against its own SLO threshold "
                f"(dashed: {class_thresholds_text(cfg)}), since prefill grows with the prompt. "
                f"{TTFT_BOUND}",
            )
        )
        .with_panel(
            timeseries_panel(
                "Inter-token latency",
                "s",
                [
                    (quantile(q, sc.INTER_TOKEN_LATENCY, ""), f"p{int(q * 100)}")
                    for q in (0.5, 0.95, 0.99)
                ],
                threshold_lines=itl_line,
                exemplars=LATENCY_EXEMPLARS,
                description=f"Gap between streamed tokens; the dashed line is "
                f"{cfg.itl_threshold_seconds:g}s (itl_slo_threshold_seconds), a reading guide "
                "that no alert reads: the ITL SLI judges each request by its worst gap (a "
                f"stall); the dots are sampled requests' worst gaps. {ITL_BOUND}",
            )
        )
        .with_panel(
            heatmap_panel(
                "TTFT distribution",
                "s",
                f"sum by (le) (increase({sc.TIME_TO_FIRST_TOKEN}_bucket{{{MODEL}}}[{CELL}]))",
                exemplars=LATENCY_EXEMPLARS,
            )
        )
        .with_panel(
            heatmap_panel(
                "ITL distribution",
                "s",
                f"sum by (le) (increase({sc.INTER_TOKEN_LATENCY}_bucket{{{MODEL}}}[{CELL}]))",
                exemplars=LATENCY_EXEMPLARS,
            )
        )
        .with_panel(
            timeseries_panel(
                "Non-streamed answers: time to the whole answer",
                "s",
                [
                    (
                        quantile(q, sc.NON_STREAMED_RESPONSE, sc.LABEL_MODEL),
                        f"p{int(q * 100)} {{{{model}}}}",
                    )
                    for q in (0.5, 0.95)
                ],
                exemplars=LATENCY_EXEMPLARS,
                description="Gateway receipt to the first byte of a non-streamed answer, sent "
                "once its whole generation was done (stagelens_non_streamed_response_seconds). "
                "Kept out of every time-to-first-token panel, alert and SLI, which read streamed "
                f"answers only. {E2E_BOUND}",
            )
        )
        .with_row(dashboard.Row("Traffic and errors"))
        .with_panel(
            timeseries_panel(
                "Request rate by code",
                "reqps",
                [(f"sum by ({sc.LABEL_CODE}) (rate({requests}[{RATE}]))", "{{code}}")],
                width=8,
            )
        )
        .with_panel(
            timeseries_panel(
                "Non-2xx ratio by code",
                "percentunit",
                [
                    (
                        f"sum by ({sc.LABEL_CODE}) (rate({failed}[{RATE}]))"
                        f" / ignoring ({sc.LABEL_CODE}) group_left "
                        f"sum(rate({requests}[{RATE}]))",
                        "{{code}}",
                    )
                ],
                width=8,
                description="Share of requests per non-2xx status code. A stream that failed "
                "after its 200 keeps code 200: see Rejections by stage.",
            )
        )
        .with_panel(
            timeseries_panel(
                "Rejections by stage",
                "percentunit",
                [
                    (
                        f"sum by ({sc.LABEL_STAGE}, {sc.LABEL_CODE}) "
                        f"(rate({sc.REJECTIONS}{{{MODEL}}}[{RATE}]))"
                        f" / ignoring ({sc.LABEL_STAGE}, {sc.LABEL_CODE}) group_left "
                        f"sum(rate({requests}[{RATE}]))",
                        "{{stage}} {{code}}",
                    )
                ],
                width=8,
                description="Share of requests answered with an error, by the stage that "
                "rejected them (401/429 gateway, 503 load balancer, 400 tokenizer, 404 router, "
                "504/5xx inference; inference 200: the stream failed after its headers). No "
                "series while nothing is rejected.",
            )
        )
        .with_panel(
            timeseries_panel(
                "Traces kept by the tail sampler, by reason",
                "percentunit",
                [
                    (
                        f"sum by ({sc.LABEL_DECISION}, {sc.LABEL_REASON}) "
                        f"(rate({sc.TRACE_DECISIONS}{{{WHERE}}}[{RATE}]))"
                        f" / ignoring ({sc.LABEL_DECISION}, {sc.LABEL_REASON}) group_left "
                        f"sum(rate({sc.TRACE_DECISIONS}{{{WHERE}}}[{RATE}]))",
                        "{{decision}} {{reason}}",
                    )
                ],
                stacked=True,
                width=24,
                description="Share of requests whose trace the tail sampler "
                f"(OTEL_TRACES_SAMPLER={sc.TRACES_SAMPLER_TAIL}) kept, and why: error, "
                "client_left, slow (against the SLO thresholds), parent (the caller sampled "
                "it), ratio (the base ratio), exemplar; dropped fine is the rest, whose spans "
                "were never built. All models (the decision has no model label); no series "
                "under another sampler.",
            )
        )
        .build()
    )
