"""The SLO alerts: one multi-window multi-burn-rate alert per SLI and severity, and the
p95 TTFT symptom ticket."""

from __future__ import annotations

from functools import partial
from typing import Any, Final

from stagelens import semconv as sc
from stagelens.slo.alert_names import BURN_ALERTS, DASHBOARD_SLOS
from stagelens.slo.alerting import Rule, alert_rule, shortest_for
from stagelens.slo.config import SloConfig, duration_seconds
from stagelens.slo.record_names import (
    CLASSED_SLIS,
    TTFT_THRESHOLD_RECORD,
    class_error_ratio_record,
    class_requests_record,
    sli_error_ratio_record,
    sli_requests_record,
    ttft_p95_record,
)
from stagelens.slo.recording_rules import by

_SLI_WORDS: Final[dict[str, str]] = {
    sc.SLI_AVAILABILITY: "Availability",
    sc.SLI_TTFT: "TTFT",
    sc.SLI_ITL: "Inter-token latency",
    sc.SLI_GOODPUT: "Goodput",
    sc.SLI_ANSWER: "Time to first answer token",
}


def class_thresholds_text(cfg: SloConfig) -> str:
    """The TTFT threshold of each prompt-size class, for descriptions."""
    return ", ".join(f"{size}: {seconds:g}s" for size, seconds in cfg.ttft_classes())


def answer_thresholds_text(cfg: SloConfig) -> str:
    """The answer SLO threshold of each prompt-size class, for descriptions."""
    return ", ".join(f"{size}: {seconds:g}s" for size, seconds in cfg.answer_classes())


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
        sc.SLI_ANSWER: "{{ with $labels.prompt_size }}with prompts of class {{ . }} {{ end }}"
        f"had no answer token (past the reasoning) within {ttft} "
        f"({answer_thresholds_text(cfg)}; errors and streams cut while thinking count)",
    }[sli]


def _burn_records(sli: str) -> tuple[Any, Any, str]:
    """(requests record, error-ratio record, selector) a burn of ``sli`` reads: TTFT per
    prompt-size class, the others per model."""
    selector = f'{{{sc.LABEL_SLI}="{sli}"}}'
    if sli in CLASSED_SLIS:
        return (
            partial(class_requests_record, sli),
            partial(class_error_ratio_record, sli),
            selector,
        )
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


def burn_alerts(cfg: SloConfig) -> list[Rule]:
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
                alert_rule(
                    cfg,
                    name,
                    burn_expr(cfg, sli, severity),
                    shortest_for(windows),
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


def p95_alert(cfg: SloConfig) -> Rule:
    window = cfg.ttft_p95_window
    grouping = by(cfg, sc.LABEL_MODEL, sc.LABEL_PROMPT_SIZE)
    traffic = (
        f"sum by ({grouping}) (rate({sc.TIME_TO_FIRST_TOKEN}_count[{window}]))"
        f" * {duration_seconds(window):g} >= {cfg.min_requests}"
    )
    return alert_rule(
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
