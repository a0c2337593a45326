"""Dashboard 4, "SLOs": each SLI per model, as the alerts judge it.

Why per model and instant: the burn-rate alerts fire per model, so a panel that sums or
maxes over models shows a figure no alert reads. The 30-day stat panels read the recorded
30-day ratios with instant queries (a range query would recompute 30 days at every step).
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard
from grafana_foundation_sdk.models.dashboard import Dashboard as DashboardModel
from stagelens.dashboards.common import (
    LATENCY_EXEMPLARS,
    MODEL,
    WHERE,
    base,
    class_threshold_lines,
    quantile,
    quantile_bound,
)
from stagelens.dashboards.panels import (
    NEUTRAL,
    good_above,
    stat_panel,
    timeseries_panel,
)

from stagelens import semconv as sc
from stagelens.metrics.buckets import TTFT_BUCKETS, TTFT_RANGE
from stagelens.slo.alert_rules import ALERT_METRICS_SPLIT, BURN_ALERTS
from stagelens.slo.config import SLIS, SloConfig
from stagelens.slo.record_names import (
    BUDGET_REMAINING_RECORD,
    CLASSED_SLIS,
    class_budget_remaining_record,
    class_error_ratio_record,
    sli_error_ratio_record,
    ttft_p95_record,
)

SLI_TITLES = {
    sc.SLI_AVAILABILITY: "Availability",
    sc.SLI_TTFT: "TTFT",
    sc.SLI_ITL: "Inter-token latency",
    sc.SLI_GOODPUT: "Goodput",
    sc.SLI_ANSWER: "Time to first answer token",
}


def runbook_url(cfg: SloConfig, alert: str) -> str:
    """The runbook section of ``alert`` (the same anchor as its ``runbook_url``)."""
    return f"{cfg.runbook_base_url}#{alert.lower()}"


def classes_text(cfg: SloConfig) -> str:
    """TTFT threshold per prompt-size class, for descriptions."""
    return ", ".join(f"{size}: {seconds:g}s" for size, seconds in cfg.ttft_classes())


def _sli_row(cfg: SloConfig, board: dashboard.Dashboard, sli: str) -> dashboard.Dashboard:
    title = SLI_TITLES[sli]
    selector = f'{MODEL}, {sc.LABEL_SLI}="{sli}"'
    objective = cfg.objectives[sli]
    budget = cfg.error_budget(sli)
    period = cfg.period
    longs = [w.long for w in cfg.windows_for(sli)]
    factors = sorted({w.factor for w in cfg.windows_for(sli)})
    alert = BURN_ALERTS[sli]
    links = [(f"Runbook: {alert}", runbook_url(cfg, alert))]
    classed = sli in CLASSED_SLIS
    # A classed SLI pages per prompt-size class: its stats and burns are drawn per class, as
    # the alert reads them (one class at 100 % bad is not hidden in the model's 4 %).
    series = "{{model}} {{prompt_size}}" if classed else "{{model}}"
    if classed:
        burn = [
            (f"{class_error_ratio_record(sli, w)}{{{selector}}} / {budget:.6g}", f"{series} {w}")
            for w in longs
        ]
        period_ratio = class_error_ratio_record(sli, period)
        remaining = class_budget_remaining_record(sli)
    else:
        burn = [
            (f"{sli_error_ratio_record(w)}{{{selector}}} / {budget:.6g}", f"{series} {w}")
            for w in longs
        ]
        period_ratio = sli_error_ratio_record(period)
        remaining = BUDGET_REMAINING_RECORD
    burn_lines = [(None, "green"), *((f, "red" if f > 3 else "yellow") for f in factors)]
    return (
        board.with_row(dashboard.Row(f"{title}: {objective:.4g} over {period}"))
        .with_panel(
            stat_panel(
                f"{title} SLI ({period})",
                "percentunit",
                [(f"1 - {period_ratio}{{{selector}}}", series)],
                steps=good_above(objective),
                decimals=2,
                links=links,
                description=f"Share of good requests over {period}, per model"
                + (" and prompt-size class" if classed else "")
                + f"; red below the objective {objective:g}.",
            )
        )
        .with_panel(
            stat_panel(
                f"{title} error budget left ({period})",
                "percentunit",
                [(f"{remaining}{{{selector}}}", series)],
                steps=((None, "red"), (0, "yellow"), (0.25, "green")),
                decimals=1,
                links=links,
                description="1 - bad share / allowed bad share; below 0 the SLO is breached.",
            )
        )
        .with_panel(
            timeseries_panel(
                f"{title} burn rate",
                "short",
                burn,
                threshold_lines=burn_lines,
                links=links,
                description=f"1.0 spends the budget exactly over {period}. {alert} "
                "pages when a page pair's long and short windows are both above its factor "
                f"(dashed), with at least {cfg.min_requests} requests and {cfg.min_bad_events} "
                "bad ones."
                + (
                    " One line per prompt-size class: each burns its own budget." if classed else ""
                ),
            )
        )
    )


def slos(cfg: SloConfig) -> DashboardModel:
    """Dashboard 4: the four SLIs per model, error budget left, burn rates, p95 TTFT."""
    board = (
        base(
            "stagelens-slos",
            "stagelens / SLOs",
            f"Availability, TTFT per prompt-size class ({classes_text(cfg)}), ITL without "
            f"stalls and goodput, per model, over {cfg.period}.",
            cfg,
        )
        .with_panel(
            stat_panel(
                "Requests the SLIs counted (time range)",
                "short",
                [
                    (
                        f"sum by ({sc.LABEL_SLI}) "
                        f"(increase({sc.SLI_REQUESTS}{{{MODEL}}}[$__range]))",
                        "{{sli}}",
                    )
                ],
                steps=NEUTRAL,
                decimals=0,
                width=8,
                description="Availability counts every request a client waited for; TTFT and "
                "goodput the streamed ones; ITL streams with two or more tokens.",
            )
        )
        .with_panel(
            stat_panel(
                "Gateway processes with split metrics",
                "short",
                [
                    (
                        # 0 for a gateway job whose requests are counted and none is split.
                        f"count by (job) ({sc.METRICS_SPLIT}{{{WHERE}}})\nor\n"
                        f"0 * count by (job) ({sc.REQUESTS}{{{MODEL}}})",
                        "{{job}}",
                    )
                ],
                steps=((None, "green"), (1, "red")),
                decimals=0,
                width=4,
                links=[
                    (
                        f"Runbook: {ALERT_METRICS_SPLIT}",
                        runbook_url(cfg, ALERT_METRICS_SPLIT),
                    )
                ],
                description="Per gateway job, the scrape targets whose process is one of "
                "several workers of one server (uvicorn --workers, gunicorn -w) without "
                "PROMETHEUS_MULTIPROC_DIR: each scrape there reads one worker's counts, so "
                "every figure on this board is wrong for that job while this is above 0 "
                f"({sc.METRICS_SPLIT}; {ALERT_METRICS_SPLIT} opens a ticket).",
            )
        )
        .with_panel(
            timeseries_panel(
                "p95 time to first token by model and prompt size",
                "s",
                [
                    (
                        quantile(
                            0.95,
                            sc.TIME_TO_FIRST_TOKEN,
                            f"{sc.LABEL_MODEL}, {sc.LABEL_PROMPT_SIZE}",
                            MODEL,
                            cfg.ttft_p95_window,
                        ),
                        "{{model}} {{prompt_size}}",
                    ),
                    (class_threshold_lines(cfg, cfg.ttft_p95_window), "threshold {{prompt_size}}"),
                ],
                unstacked_refs=("B",),
                exemplar_refs=("A",) if LATENCY_EXEMPLARS else (),
                links=[
                    (
                        f"Runbook: {sc.ALERT_TTFT_P95_HIGH}",
                        runbook_url(cfg, sc.ALERT_TTFT_P95_HIGH),
                    )
                ],
                description="StagelensTTFTP95High opens a ticket when a class's p95 stays "
                f"above its threshold ({classes_text(cfg)}) for {cfg.ttft_p95_for}; each class "
                "with traffic has its threshold drawn dashed. The alert compares "
                f"{ttft_p95_record(cfg.ttft_p95_window)} (histogram_quantile, same window): "
                "each threshold is a bucket bound, so that figure and the one drawn here lie "
                "on the same side of it. "
                f"{quantile_bound(TTFT_BUCKETS, *TTFT_RANGE)}",
            )
        )
    )
    for sli in SLIS:
        board = _sli_row(cfg, board, sli)
    return board.build()
