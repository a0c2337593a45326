"""Prometheus recording rules and alerts generated from an SloConfig, and ``stagelens slo``.

Why generated: like Sloth, the multi-window multi-burn-rate expressions are mechanical and easy
to get subtly wrong by hand (a factor applied to the wrong window, a threshold that is not a
bucket boundary). Rendering them from one validated config keeps alerts, runbook links and
dashboards in step; the committed default files are regenerated in CI and diffed.

Recording rules follow ``level:metric:operations`` (prometheus/docs ``practices/rules.md``).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Final

import yaml

from stagelens import semconv as sc
from stagelens.slo import BurnWindow, SloConfig, load_slo_config

RULES_FILE: Final = "stagelens-rules.yaml"
ALERTS_FILE: Final = "stagelens-alerts.yaml"

Rule = dict[str, Any]


def ttft_error_ratio_record(window: str) -> str:
    """Recording rule: share of requests whose TTFT exceeded the threshold over ``window``."""
    return f"stagelens:ttft_slo_errors:ratio_rate{window}"


def ttft_p95_record(window: str) -> str:
    """Recording rule: p95 TTFT per model over ``window``."""
    return f"stagelens:ttft_seconds:p95_rate{window}"


def cost_rate_record(window: str) -> str:
    """Recording rule: spend in USD per second per tenant over ``window``."""
    return f"stagelens:cost_usd:rate{window}"


def cost_burn_record(window: str) -> str:
    """Recording rule: spend pace against the daily budget (1.0 = exactly on budget)."""
    return f"stagelens:cost_budget_burn:ratio_rate{window}"


STAGE_P95_RECORD: Final = "stagelens:stage_duration_seconds:p95_rate5m"
STAGE_BUDGET_RECORD: Final = "stagelens:stage_budget_seconds:max"
DAILY_BUDGET_RECORD: Final = "stagelens:budget_usd:daily"
CONFIGURED_DAILY_BUDGET_RECORD: Final = "stagelens:budget_usd:configured"
CONFIGURED_STAGE_BUDGET_RECORD: Final = "stagelens:stage_budget_seconds:configured"
KV_HIT_RATIO_RECORD: Final = "stagelens:kv_cache_hit:ratio_rate5m"
KV_QUERIES_RECORD: Final = "stagelens:kv_cache_queries:rate5m"
ERROR_RATIO_RECORD: Final = "stagelens:requests_errors:ratio_rate5m"
REQUEST_RATE_RECORD: Final = "stagelens:requests:rate5m"
GPU_BUSY_RECORD: Final = "stagelens:gpu_busy:ratio_max"

ALERT_STAGE_OVER_BUDGET: Final = "StagelensStageOverBudget"
ALERT_KV_HIT_RATE_COLLAPSE: Final = "StagelensKVCacheHitRateCollapse"
ALERT_GPU_SATURATED: Final = "StagelensGPUSaturated"
ALERT_BACKEND_DOWN: Final = "StagelensBackendDown"
ALERT_ERROR_RATIO_HIGH: Final = "StagelensErrorRatioHigh"

ALL_ALERTS: Final[tuple[str, ...]] = (
    sc.ALERT_TTFT_BUDGET_BURN,
    sc.ALERT_TTFT_P95_HIGH,
    sc.ALERT_COST_BUDGET_BURN,
    ALERT_STAGE_OVER_BUDGET,
    ALERT_KV_HIT_RATE_COLLAPSE,
    ALERT_GPU_SATURATED,
    ALERT_BACKEND_DOWN,
    ALERT_ERROR_RATIO_HIGH,
)
"""Every alert name; each has one anchor in alerts/runbook.md."""


def _le(value: float) -> str:
    """The ``le`` label value Prometheus clients write for a bucket boundary."""
    return repr(float(value))


def _windows(windows: Iterable[BurnWindow]) -> list[str]:
    seen: dict[str, None] = {}
    for window in windows:
        seen.setdefault(window.short, None)
        seen.setdefault(window.long, None)
    return list(seen)


def _ttft_records(cfg: SloConfig) -> list[Rule]:
    bucket = f"{sc.TIME_TO_FIRST_TOKEN}_bucket"
    count = f"{sc.TIME_TO_FIRST_TOKEN}_count"
    le = _le(cfg.ttft_threshold_seconds)
    rules: list[Rule] = []
    for window in _windows(cfg.ttft_burn_windows):
        total = f"sum by ({sc.LABEL_MODEL}) (rate({count}[{window}]))"
        good = f'sum by ({sc.LABEL_MODEL}) (rate({bucket}{{le="{le}"}}[{window}]))'
        rules.append(
            {
                "record": ttft_error_ratio_record(window),
                "expr": f"({total} - {good}) / {total}",
            }
        )
    rules.append(
        {
            "record": ttft_p95_record(cfg.ttft_p95_window),
            "expr": (
                "histogram_quantile(0.95, sum by "
                f"({sc.LABEL_MODEL}, le) (rate({bucket}[{cfg.ttft_p95_window}])))"
            ),
        }
    )
    return rules


def _budget_records(cfg: SloConfig) -> list[Rule]:
    rules: list[Rule] = [
        {
            "record": CONFIGURED_DAILY_BUDGET_RECORD,
            "expr": f"vector({usd!r})",
            "labels": {sc.LABEL_TENANT: tenant, sc.LABEL_WINDOW: sc.BUDGET_WINDOW_DAY},
        }
        for tenant, usd in sorted(cfg.daily_budgets_usd.items())
    ]
    rules += [
        {
            "record": CONFIGURED_STAGE_BUDGET_RECORD,
            "expr": f"vector({seconds!r})",
            "labels": {sc.LABEL_STAGE: stage},
        }
        for stage, seconds in sorted(cfg.stage_budgets_seconds.items())
    ]
    day = f'{sc.LABEL_WINDOW}="{sc.BUDGET_WINDOW_DAY}"'
    gauge = f"max by ({sc.LABEL_TENANT}) ({sc.BUDGET_USD}{{{day}}})"
    configured = f"max by ({sc.LABEL_TENANT}) ({CONFIGURED_DAILY_BUDGET_RECORD})"
    rules.append({"record": DAILY_BUDGET_RECORD, "expr": f"{gauge} or {configured}"})
    stage_gauge = f"max by ({sc.LABEL_STAGE}) ({sc.STAGE_BUDGET})"
    stage_configured = f"max by ({sc.LABEL_STAGE}) ({CONFIGURED_STAGE_BUDGET_RECORD})"
    rules.append({"record": STAGE_BUDGET_RECORD, "expr": f"{stage_gauge} or {stage_configured}"})
    return rules


def _cost_records(cfg: SloConfig) -> list[Rule]:
    rules: list[Rule] = []
    for window in _windows(cfg.cost_burn_windows):
        rules.append(
            {
                "record": cost_rate_record(window),
                "expr": f"sum by ({sc.LABEL_TENANT}) (rate({sc.COST_USD}[{window}]))",
            }
        )
        rules.append(
            {
                "record": cost_burn_record(window),
                "expr": (
                    f"{cost_rate_record(window)} * 86400 / on ({sc.LABEL_TENANT}) "
                    f"({DAILY_BUDGET_RECORD} > 0)"
                ),
            }
        )
    return rules


def _other_records() -> list[Rule]:
    stage_bucket = f"{sc.STAGE_DURATION}_bucket"
    return [
        {
            "record": STAGE_P95_RECORD,
            "expr": (
                f"histogram_quantile(0.95, sum by ({sc.LABEL_STAGE}, le) "
                f"(rate({stage_bucket}[5m])))"
            ),
        },
        {
            "record": KV_QUERIES_RECORD,
            "expr": f"sum by ({sc.LABEL_MODEL}) (rate({sc.KV_CACHE_QUERIES}[5m]))",
        },
        {
            "record": KV_HIT_RATIO_RECORD,
            "expr": (
                f"sum by ({sc.LABEL_MODEL}) (rate({sc.KV_CACHE_HITS}[5m])) / {KV_QUERIES_RECORD}"
            ),
        },
        {
            "record": REQUEST_RATE_RECORD,
            "expr": f"sum by ({sc.LABEL_MODEL}) (rate({sc.REQUESTS}[5m]))",
        },
        {
            "record": ERROR_RATIO_RECORD,
            "expr": (
                f'sum by ({sc.LABEL_MODEL}) (rate({sc.REQUESTS}{{{sc.LABEL_CODE}=~"5.."}}[5m])) '
                f"/ {REQUEST_RATE_RECORD}"
            ),
        },
        {
            "record": GPU_BUSY_RECORD,
            # Real load first: stagelens' GPM SM activity, then DCGM's on hosts that run
            # only dcgm-exporter, and NVML utilisation (liveness) only where neither exists.
            "expr": (
                f"max by (instance, {sc.LABEL_GPU}) ({sc.GPU_SM_ACTIVE}) or "
                f"max by (instance, {sc.LABEL_GPU}) ({sc.DCGM_SM_ACTIVE}) or "
                f"max by (instance, {sc.LABEL_GPU}) ({sc.GPU_UTILIZATION})"
            ),
        },
    ]


def render_rules(cfg: SloConfig) -> dict[str, Any]:
    """The recording-rule file as a mapping (``groups:`` ...)."""
    return {
        "groups": [
            {"name": "stagelens-ttft-slo.rules", "rules": _ttft_records(cfg)},
            {"name": "stagelens-budgets.rules", "rules": _budget_records(cfg)},
            {"name": "stagelens-cost.rules", "rules": _cost_records(cfg)},
            {"name": "stagelens-serving.rules", "rules": _other_records()},
        ]
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
    rule["labels"] = {"severity": severity, **(extra_labels or {})}
    rule["annotations"] = {
        "summary": summary,
        "description": description,
        "runbook_url": f"{cfg.runbook_base_url}#{name.lower()}",
    }
    return rule


def _ttft_alerts(cfg: SloConfig) -> list[Rule]:
    objective = f"{cfg.ttft_objective * 100:g}%"
    budget = cfg.error_budget
    alerts: list[Rule] = []
    for window in cfg.ttft_burn_windows:
        limit = f"({window.factor!r} * {budget:.6g})"
        expr = (
            f"{ttft_error_ratio_record(window.long)} > {limit}\n"
            f"and\n{ttft_error_ratio_record(window.short)} > {limit}"
        )
        alerts.append(
            _alert(
                cfg,
                sc.ALERT_TTFT_BUDGET_BURN,
                expr,
                window.for_,
                window.severity,
                f"TTFT error budget of {{{{ $labels.model }}}} burning {window.factor:g}x too fast",
                (
                    f"Over the last {window.long} and {window.short}, more than "
                    f"{window.factor:g} x {budget:.6g} of requests to {{{{ $labels.model }}}} "
                    f"had TTFT above {cfg.ttft_threshold_seconds:g}s (SLO {objective} over "
                    f"{cfg.period}); current {window.long} error ratio "
                    "{{ $value | humanizePercentage }}."
                ),
                {"long_window": window.long},
            )
        )
    p95 = ttft_p95_record(cfg.ttft_p95_window)
    traffic = (
        f"sum by ({sc.LABEL_MODEL}) "
        f"(rate({sc.TIME_TO_FIRST_TOKEN}_count[{cfg.ttft_p95_window}])) > 0"
    )
    alerts.append(
        _alert(
            cfg,
            sc.ALERT_TTFT_P95_HIGH,
            f"{p95} > {cfg.ttft_threshold_seconds!r}\nand on ({sc.LABEL_MODEL})\n{traffic}",
            cfg.ttft_p95_for,
            "page",
            "p95 time to first token of {{ $labels.model }} above "
            f"{cfg.ttft_threshold_seconds:g}s",
            (
                "p95 TTFT of {{ $labels.model }} is {{ $value | humanizeDuration }} "
                f"(threshold {cfg.ttft_threshold_seconds:g}s) for {cfg.ttft_p95_for}."
            ),
        )
    )
    return alerts


def _cost_alerts(cfg: SloConfig) -> list[Rule]:
    return [
        _alert(
            cfg,
            sc.ALERT_COST_BUDGET_BURN,
            (
                f"{cost_burn_record(window.long)} > {window.factor!r}\n"
                f"and\n{cost_burn_record(window.short)} > {window.factor!r}"
            ),
            window.for_,
            window.severity,
            f"Tenant {{{{ $labels.tenant }}}} spending {window.factor:g}x its daily budget pace",
            (
                f"Over the last {window.long} and {window.short} tenant "
                '{{ $labels.tenant }} spent at {{ $value | printf "%.1f" }}x the pace of its '
                'daily budget (stagelens_budget_usd{window="1d"}).'
            ),
            {"long_window": window.long},
        )
        for window in cfg.cost_burn_windows
    ]


def _serving_alerts(cfg: SloConfig) -> list[Rule]:
    return [
        _alert(
            cfg,
            ALERT_STAGE_OVER_BUDGET,
            f"{STAGE_P95_RECORD}\n> on ({sc.LABEL_STAGE})\n{STAGE_BUDGET_RECORD}",
            cfg.stage_budget_for,
            "ticket",
            "Stage {{ $labels.stage }} p95 over its latency budget",
            (
                "p95 time in stage {{ $labels.stage }} is {{ $value | humanizeDuration }}, "
                "above its budget (stagelens_stage_budget_seconds) for "
                f"{cfg.stage_budget_for}."
            ),
        ),
        _alert(
            cfg,
            ALERT_KV_HIT_RATE_COLLAPSE,
            f"{KV_HIT_RATIO_RECORD} < {cfg.kv_hit_rate_floor!r}\nand on ({sc.LABEL_MODEL})\n"
            f"{KV_QUERIES_RECORD} > 0",
            cfg.kv_hit_rate_for,
            "ticket",
            "Prefix-cache hit rate of {{ $labels.model }} collapsed",
            (
                "Engine prefix-cache hit rate of {{ $labels.model }} is "
                "{{ $value | humanizePercentage }}, below the floor of "
                f"{cfg.kv_hit_rate_floor:g}, for {cfg.kv_hit_rate_for}."
            ),
        ),
        _alert(
            cfg,
            ALERT_GPU_SATURATED,
            f"{GPU_BUSY_RECORD} > {cfg.gpu_saturation_threshold!r}",
            cfg.gpu_saturation_for,
            "ticket",
            "GPU {{ $labels.gpu }} on {{ $labels.instance }} saturated",
            (
                "GPU {{ $labels.gpu }} SM activity (stagelens GPM or DCGM; NVML utilisation "
                "where neither exists) is {{ $value | humanizePercentage }}, above "
                f"{cfg.gpu_saturation_threshold:g}, for {cfg.gpu_saturation_for}."
            ),
        ),
        _alert(
            cfg,
            ALERT_BACKEND_DOWN,
            f'up{{job=~"{cfg.backend_job_regex}"}} == 0',
            cfg.backend_down_for,
            "page",
            "vLLM backend {{ $labels.instance }} is down",
            (
                "Prometheus could not scrape backend {{ $labels.instance }} (job "
                f"{{{{ $labels.job }}}}) for {cfg.backend_down_for}."
            ),
        ),
        _alert(
            cfg,
            ALERT_ERROR_RATIO_HIGH,
            f"{ERROR_RATIO_RECORD} > {cfg.error_ratio_threshold!r}",
            cfg.error_ratio_for,
            "page",
            "{{ $labels.model }} answering with 5xx",
            (
                "{{ $value | humanizePercentage }} of requests to {{ $labels.model }} "
                f"failed with 5xx for {cfg.error_ratio_for} (threshold "
                f"{cfg.error_ratio_threshold:g})."
            ),
        ),
    ]


def render_alerts(cfg: SloConfig) -> dict[str, Any]:
    """The alert file as a mapping (``groups:`` ...)."""
    return {
        "groups": [
            {"name": "stagelens-slo.alerts", "rules": _ttft_alerts(cfg) + _cost_alerts(cfg)},
            {"name": "stagelens-serving.alerts", "rules": _serving_alerts(cfg)},
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


def write_rule_files(cfg: SloConfig, out_dir: Path) -> list[Path]:
    """Write the recording-rule and alert files into ``out_dir``; returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, data in ((RULES_FILE, render_rules(cfg)), (ALERTS_FILE, render_alerts(cfg))):
        path = out_dir / name
        path.write_text(dump_yaml(data), encoding="utf-8")
        written.append(path)
    return written


def _render(args: argparse.Namespace) -> int:
    cfg = load_slo_config(args.config)
    for path in write_rule_files(cfg, args.out):
        print(path)
    return 0


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``stagelens slo render``."""
    slo = subparsers.add_parser("slo", help="SLO recording rules and alerts")
    slo_sub = slo.add_subparsers(dest="slo_command", metavar="SLO_COMMAND", required=True)
    render = slo_sub.add_parser("render", help="write recording rules and alerts from a config")
    render.add_argument("--config", type=Path, default=None, help="SLO config YAML")
    render.add_argument("--out", type=Path, default=Path("alerts"), help="output folder")
    render.set_defaults(func=_render)
