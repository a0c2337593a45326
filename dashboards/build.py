"""Build every stagelens dashboard from the SLO config: ``python -m stagelens.dashboards.build``.

Why code: the queries use the metric names from ``stagelens.semconv`` and the thresholds from
``stagelens.slo`` (the same config the alerts are rendered from), so a renamed metric or a new
threshold changes dashboards and alerts together. Output is sorted-key JSON with stable uids;
CI regenerates it and fails on any diff. Each dashboard is written twice: the plain file
(file provisioning, kube-prometheus-stack sidecar, UI import with a ``datasource`` variable)
and a ``*.gnet.json`` flavour with ``__inputs``/``__requires`` for grafana.com-style import.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from grafana_foundation_sdk.builders import dashboard
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import Dashboard as DashboardModel
from grafana_foundation_sdk.models.dashboard import DashboardCursorSync, VariableRefresh
from stagelens.dashboards.panels import (
    DATASOURCE,
    DATASOURCE_VAR,
    RATE,
    Query,
    bargauge_panel,
    heatmap_panel,
    stat_panel,
    table_panel,
    timeseries_panel,
)

from stagelens import semconv as sc
from stagelens.alert_rules import cost_burn_record, ttft_error_ratio_record
from stagelens.slo import SloConfig, load_slo_config
from stagelens.stages import STAGE_ORDER

OUT_DIR: Final = Path(__file__).resolve().parent
TAGS: Final = ["stagelens", "llm"]
MODEL: Final = f'{sc.LABEL_MODEL}=~"$model"'
TENANT: Final = f'{sc.LABEL_TENANT}=~"$tenant"'
VLLM_MODEL_LABEL: Final = "model_name"
"""vLLM's own metrics name the served model ``model_name``, not ``model``."""
VLLM_MODEL: Final = f'{VLLM_MODEL_LABEL}=~"$model"'

Builder = Callable[[SloConfig], DashboardModel]


def _base(uid: str, title: str, description: str, *, tenant: bool = False) -> dashboard.Dashboard:
    board = (
        dashboard.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(TAGS)
        .editable()
        .tooltip(DashboardCursorSync.CROSSHAIR)
        .refresh("30s")
        .time("now-1h", "now")
        .timezone("browser")
        .with_variable(
            dashboard.DatasourceVariable(DATASOURCE_VAR).label("Data source").type("prometheus")
        )
        .with_variable(
            dashboard.QueryVariable("model")
            .label("Model")
            .datasource(DATASOURCE)
            .query(f"label_values({sc.REQUESTS}, {sc.LABEL_MODEL})")
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
            .multi(True)
            .include_all(True)
            .all_value(".*")
        )
    )
    if tenant:
        board = board.with_variable(
            dashboard.QueryVariable("tenant")
            .label("Tenant")
            .datasource(DATASOURCE)
            .query(f"label_values({sc.TOKENS}, {sc.LABEL_TENANT})")
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
            .multi(True)
            .include_all(True)
            .all_value(".*")
        )
    return board


def _quantile(q: float, metric: str, by: str, selector: str = MODEL, window: str = RATE) -> str:
    by_le = f"{by}, le" if by else "le"
    return (
        f"histogram_quantile({q}, sum by ({by_le}) (rate({metric}_bucket{{{selector}}}[{window}])))"
    )


def _quantiles(metric: str, by: str, label: str) -> list[Query]:
    return [(_quantile(q, metric, by), f"p{int(q * 100)} {label}") for q in (0.5, 0.95, 0.99)]


def stage_positions() -> str:
    """Each canonical stage's position in request order, as one PromQL vector per stage.

    The budget table sorts its rows by this so they read gateway ... billing, whatever order
    Prometheus returns the series in (custom stages have no position).
    """
    return " or ".join(
        f'label_replace(vector({position}), "{sc.LABEL_STAGE}", "{stage.value}", "", "")'
        for position, stage in enumerate(STAGE_ORDER, start=1)
    )


def request_path(cfg: SloConfig) -> DashboardModel:
    """Dashboard 1: end-to-end and per-stage latency, the budget table, TTFT/ITL, errors."""
    stage_sum = f"{sc.STAGE_DURATION}_sum{{{MODEL}}}"
    share = (
        f"sum by ({sc.LABEL_STAGE}) (rate({stage_sum}[{RATE}])) / ignoring ({sc.LABEL_STAGE}) "
        f"group_left sum(rate({stage_sum}[{RATE}]))"
    )
    share_range = share.replace(RATE, "$__range")
    stage_order = ", ".join(s.value for s in STAGE_ORDER)
    requests = f"{sc.REQUESTS}{{{MODEL}}}"
    failed = f'{sc.REQUESTS}{{{MODEL}, {sc.LABEL_CODE}!~"2.."}}'
    return (
        _base(
            "stagelens-request-path",
            "stagelens / Request path",
            "Where a request's time goes: the seven stages, TTFT, ITL and errors.",
        )
        .with_row(dashboard.Row("Latency"))
        .with_panel(
            timeseries_panel(
                "End-to-end latency",
                "s",
                [
                    (_quantile(q, sc.REQUEST_DURATION, ""), f"p{int(q * 100)}")
                    for q in (0.5, 0.95, 0.99)
                ],
                description="Gateway receipt to last byte sent.",
            )
        )
        .with_panel(
            timeseries_panel(
                "Share of time per stage",
                "percentunit",
                [(share, "{{stage}}")],
                stacked=True,
                description="Fraction of all stage time spent in each stage.",
            )
        )
        .with_panel(
            table_panel(
                "Stage latency budget",
                "s",
                [
                    (f"max by ({sc.LABEL_STAGE}) ({sc.STAGE_BUDGET})", "budget"),
                    (
                        _quantile(0.5, sc.STAGE_DURATION, sc.LABEL_STAGE, window="$__range"),
                        "p50",
                    ),
                    (
                        _quantile(0.95, sc.STAGE_DURATION, sc.LABEL_STAGE, window="$__range"),
                        "p95",
                    ),
                    (share_range, "share"),
                ],
                join_field=sc.LABEL_STAGE,
                unit_overrides={"share": "percentunit"},
                row_order=stage_positions(),
                description=f"Stages in request order: {stage_order}. Share: of all stage time.",
            )
        )
        .with_panel(
            timeseries_panel(
                "Stage latency p50",
                "s",
                [(_quantile(0.5, sc.STAGE_DURATION, sc.LABEL_STAGE), "{{stage}}")],
                width=8,
            )
        )
        .with_panel(
            timeseries_panel(
                "Stage latency p95",
                "s",
                [(_quantile(0.95, sc.STAGE_DURATION, sc.LABEL_STAGE), "{{stage}}")],
                width=8,
            )
        )
        .with_panel(
            timeseries_panel(
                "Stage latency p99",
                "s",
                [(_quantile(0.99, sc.STAGE_DURATION, sc.LABEL_STAGE), "{{stage}}")],
                width=8,
            )
        )
        .with_row(dashboard.Row("Tokens in time"))
        .with_panel(
            timeseries_panel(
                "Time to first token",
                "s",
                _quantiles(sc.TIME_TO_FIRST_TOKEN, "", ""),
                description=f"SLO threshold {cfg.ttft_threshold_seconds:g}s.",
            )
        )
        .with_panel(
            timeseries_panel("Inter-token latency", "s", _quantiles(sc.INTER_TOKEN_LATENCY, "", ""))
        )
        .with_panel(
            heatmap_panel(
                "TTFT distribution",
                "s",
                f"sum by (le) (increase({sc.TIME_TO_FIRST_TOKEN}_bucket{{{MODEL}}}[{RATE}]))",
            )
        )
        .with_panel(
            heatmap_panel(
                "ITL distribution",
                "s",
                f"sum by (le) (increase({sc.INTER_TOKEN_LATENCY}_bucket{{{MODEL}}}[{RATE}]))",
            )
        )
        .with_row(dashboard.Row("Traffic and errors"))
        .with_panel(
            timeseries_panel(
                "Request rate by code",
                "reqps",
                [(f"sum by ({sc.LABEL_CODE}) (rate({requests}[{RATE}]))", "{{code}}")],
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
                description="Share of requests per non-2xx status code.",
            )
        )
        .with_panel(
            timeseries_panel(
                "Rejections by stage",
                "percentunit",
                [
                    (
                        f"sum by ({sc.LABEL_STAGE}) (rate({sc.REJECTIONS}{{{MODEL}}}[{RATE}]))"
                        f" / ignoring ({sc.LABEL_STAGE}) group_left "
                        f"sum(rate({requests}[{RATE}]))",
                        "{{stage}}",
                    )
                ],
                description="Share of requests answered with an error, by the stage that "
                "rejected them (401/429 gateway, 503 load balancer, 400 tokenizer, 404 router, "
                "504/5xx inference). No series while nothing is rejected.",
            )
        )
        .build()
    )


def tokens_cost(cfg: SloConfig) -> DashboardModel:
    """Dashboard 2: tokens by model/tenant, spend, budget use and unit costs."""
    tokens = f"{sc.TOKENS}{{{MODEL}, {TENANT}}}"
    output = f'{sc.TOKENS}{{{MODEL}, {TENANT}, {sc.LABEL_TYPE}="{sc.TOKEN_TYPE_OUTPUT}"}}'
    cost = f"{sc.COST_USD}{{{MODEL}, {TENANT}}}"
    day = f'{sc.LABEL_WINDOW}="{sc.BUDGET_WINDOW_DAY}"'
    gpus = f"(count({sc.GPU_MEMORY_TOTAL}) or count({sc.DCGM_FB_USED}))"
    usd_per_hour = f"(sum({sc.GPU_COST_PER_HOUR}) or {gpus} * {cfg.gpu_hourly_cost_usd!r})"
    return (
        _base(
            "stagelens-tokens-cost",
            "stagelens / Tokens and cost",
            "Tokens, spend against daily budgets, and unit costs per model and tenant.",
            tenant=True,
        )
        .with_panel(
            timeseries_panel(
                "Tokens by type",
                "short",
                [
                    (
                        f"sum by ({sc.LABEL_TYPE}) (rate({tokens}[{RATE}]))",
                        "{{type}}",
                    )
                ],
                description="Tokens per second; cached_input is part of input.",
            )
        )
        .with_panel(
            timeseries_panel(
                "Tokens by model and tenant",
                "short",
                [
                    (
                        f"sum by ({sc.LABEL_MODEL}, {sc.LABEL_TENANT}, {sc.LABEL_TYPE}) "
                        f"(rate({tokens}[{RATE}]))",
                        "{{model}} {{tenant}} {{type}}",
                    )
                ],
            )
        )
        .with_panel(
            timeseries_panel(
                "Spend rate",
                "currencyUSD",
                [(f"sum by ({sc.LABEL_TENANT}) (rate({cost}[{RATE}])) * 3600", "{{tenant}}")],
                description="USD per hour by tenant.",
            )
        )
        .with_panel(
            bargauge_panel(
                "Spend in the last 24h vs daily budget",
                "percentunit",
                [
                    (
                        f"sum by ({sc.LABEL_TENANT}) (increase({cost}[1d]))"
                        f" / on ({sc.LABEL_TENANT}) "
                        f"max by ({sc.LABEL_TENANT}) ({sc.BUDGET_USD}{{{day}}})",
                        "{{tenant}}",
                    )
                ],
                description="1.0 = the tenant's whole daily budget (stagelens_budget_usd).",
            )
        )
        .with_panel(
            timeseries_panel(
                "Cost per 1k output tokens",
                "currencyUSD",
                [
                    (
                        f"sum by ({sc.LABEL_MODEL}) (rate({cost}[{RATE}])) / "
                        f"sum by ({sc.LABEL_MODEL}) (rate({output}[{RATE}])) * 1000",
                        "{{model}}",
                    )
                ],
            )
        )
        .with_panel(
            timeseries_panel(
                "GPU-time cost per output token",
                "currencyUSD",
                [
                    (
                        f"{usd_per_hour} / 3600 / sum(rate({output}[{RATE}]))",
                        "per token",
                    )
                ],
                description=(
                    f"USD per second of GPU time (sum over GPUs of {sc.GPU_COST_PER_HOUR}, "
                    "the price the GPU exporter publishes, / 3600) divided by output tokens "
                    "per second. Where no GPU publishes a price: GPUs seen x "
                    f"{cfg.gpu_hourly_cost_usd:g} USD/GPU-hour (SLO config gpu_hourly_cost_usd)."
                ),
            )
        )
        .build()
    )


def _or(*exprs: str) -> str:
    return " or ".join(f"({e})" for e in exprs)


def engine_gpu(cfg: SloConfig) -> DashboardModel:
    """Dashboard 3: prefix cache, KV usage, scheduler queues, GPU (stagelens or DCGM)."""
    hit_engine = _or(
        f"sum by ({sc.LABEL_MODEL}) (rate({sc.KV_CACHE_HITS}{{{MODEL}}}[{RATE}])) / "
        f"sum by ({sc.LABEL_MODEL}) (rate({sc.KV_CACHE_QUERIES}{{{MODEL}}}[{RATE}]))",
        f"sum by ({VLLM_MODEL_LABEL}) (rate({sc.VLLM_PREFIX_CACHE_HITS}{{{VLLM_MODEL}}}[{RATE}]))"
        f" / sum by ({VLLM_MODEL_LABEL}) "
        f"(rate({sc.VLLM_PREFIX_CACHE_QUERIES}{{{VLLM_MODEL}}}[{RATE}]))",
    )
    cached = f'{sc.TOKENS}{{{MODEL}, {sc.LABEL_TYPE}="{sc.TOKEN_TYPE_CACHED_INPUT}"}}'
    prompt = f'{sc.TOKENS}{{{MODEL}, {sc.LABEL_TYPE}="{sc.TOKEN_TYPE_INPUT}"}}'
    hit_request = (
        f"sum by ({sc.LABEL_MODEL}) (rate({cached}[{RATE}])) / "
        f"sum by ({sc.LABEL_MODEL}) (rate({prompt}[{RATE}]))"
    )
    gpu_by = f"{sc.LABEL_GPU}, instance"
    return (
        _base(
            "stagelens-engine-gpu",
            "stagelens / Engine and GPU",
            "vLLM prefix cache, KV usage and queues; GPU from stagelens NVML or DCGM.",
        )
        .with_row(dashboard.Row("Engine"))
        .with_panel(
            timeseries_panel(
                "Prefix-cache hit rate",
                "percentunit",
                [
                    (hit_engine, "engine {{model}}{{model_name}}"),
                    (hit_request, "requests {{model}}"),
                ],
                description=(
                    f"Engine: hits/queries (floor {cfg.kv_hit_rate_floor:g}). "
                    "Requests: cached_input/input tokens billed."
                ),
            )
        )
        .with_panel(
            timeseries_panel(
                "KV-cache usage",
                "percentunit",
                [
                    (
                        _or(
                            f"max by ({sc.LABEL_BACKEND}) ({sc.KV_CACHE_USAGE}{{{MODEL}}})",
                            f"max by (instance) ({sc.VLLM_KV_CACHE_USAGE}{{{VLLM_MODEL}}})",
                        ),
                        "{{backend}}{{instance}}",
                    )
                ],
            )
        )
        .with_panel(
            timeseries_panel(
                "Running and waiting requests",
                "short",
                [
                    (
                        _or(
                            f"sum({sc.ENGINE_REQUESTS_RUNNING}{{{MODEL}}})",
                            f"sum({sc.VLLM_REQUESTS_RUNNING}{{{VLLM_MODEL}}})",
                        ),
                        "running",
                    ),
                    (
                        _or(
                            f"sum({sc.ENGINE_REQUESTS_WAITING}{{{MODEL}}})",
                            f"sum({sc.VLLM_REQUESTS_WAITING}{{{VLLM_MODEL}}})",
                        ),
                        "waiting",
                    ),
                ],
            )
        )
        .with_panel(
            timeseries_panel(
                "Preemptions",
                "short",
                [
                    (
                        _or(
                            f"sum(rate({sc.ENGINE_PREEMPTIONS}{{{MODEL}}}[{RATE}]))",
                            f"sum(rate({sc.VLLM_PREEMPTIONS}{{{VLLM_MODEL}}}[{RATE}]))",
                        ),
                        "preemptions/s",
                    )
                ],
            )
        )
        .with_row(dashboard.Row("GPU"))
        .with_panel(
            timeseries_panel(
                "GPU utilisation vs SM activity",
                "percentunit",
                [
                    (
                        _or(
                            f"max by ({gpu_by}) ({sc.GPU_UTILIZATION})",
                            f"max by ({gpu_by}) ({sc.DCGM_GPU_UTIL}) / 100",
                        ),
                        "util {{instance}} gpu {{gpu}}",
                    ),
                    (
                        _or(
                            f"max by ({gpu_by}) ({sc.GPU_SM_ACTIVE})",
                            f"max by ({gpu_by}) ({sc.DCGM_SM_ACTIVE})",
                        ),
                        "SM active {{instance}} gpu {{gpu}}",
                    ),
                ],
                description="Utilisation = a kernel ran (liveness); SM activity = real load.",
            )
        )
        .with_panel(
            timeseries_panel(
                "GPU memory used",
                "bytes",
                [
                    (
                        _or(
                            f"max by ({gpu_by}) ({sc.GPU_MEMORY_USED})",
                            f"max by ({gpu_by}) ({sc.DCGM_FB_USED}) * 1048576",
                        ),
                        "{{instance}} gpu {{gpu}}",
                    )
                ],
            )
        )
        .with_panel(
            timeseries_panel(
                "GPU power",
                "watt",
                [
                    (
                        _or(
                            f"max by ({gpu_by}) ({sc.GPU_POWER})",
                            f"max by ({gpu_by}) ({sc.DCGM_POWER})",
                        ),
                        "{{instance}} gpu {{gpu}}",
                    )
                ],
            )
        )
        .build()
    )


def slos(cfg: SloConfig) -> DashboardModel:
    """Dashboard 4: TTFT SLI, error budget left, burn rates per window, cost burn."""
    le = repr(float(cfg.ttft_threshold_seconds))
    count = f"{sc.TIME_TO_FIRST_TOKEN}_count{{{MODEL}}}"
    good = f'{sc.TIME_TO_FIRST_TOKEN}_bucket{{{MODEL}, le="{le}"}}'
    sli = f"sum(increase({good}[$__range])) / sum(increase({count}[$__range]))"
    period = cfg.period
    bad_period = (
        f"(sum(increase({count}[{period}])) - sum(increase({good}[{period}]))) / "
        f"sum(increase({count}[{period}]))"
    )
    budget = f"{cfg.error_budget:.6g}"
    windows: list[str] = []
    for window in cfg.ttft_burn_windows:
        for w in (window.short, window.long):
            if w not in windows:
                windows.append(w)
    return (
        _base(
            "stagelens-slos",
            "stagelens / SLOs",
            f"TTFT <= {cfg.ttft_threshold_seconds:g}s for {cfg.ttft_objective:.2%} of requests "
            f"over {period}; spend against daily budgets.",
        )
        .with_panel(
            stat_panel(
                "TTFT SLI (time range)",
                "percentunit",
                [(sli, "SLI")],
                description=f"Objective {cfg.ttft_objective:g}.",
            )
        )
        .with_panel(
            stat_panel(
                f"Error budget remaining ({period})",
                "percentunit",
                [(f"1 - ({bad_period}) / {budget}", "remaining")],
            )
        )
        .with_panel(
            stat_panel(
                "p95 TTFT now",
                "s",
                [(_quantile(0.95, sc.TIME_TO_FIRST_TOKEN, "", window="5m"), "p95")],
                description=f"StagelensTTFTP95High above {cfg.ttft_threshold_seconds:g}s.",
            )
        )
        .with_panel(
            stat_panel(
                "Requests in range",
                "short",
                [(f"sum(increase({count}[$__range]))", "requests")],
            )
        )
        .with_panel(
            timeseries_panel(
                "TTFT error-budget burn rate",
                "short",
                [(f"max({ttft_error_ratio_record(w)}{{{MODEL}}}) / {budget}", w) for w in windows],
                description="1.0 spends the budget exactly over the period "
                "(page at 14.4 on 1h+5m and 6 on 6h+30m).",
                width=24,
            )
        )
        .with_panel(
            timeseries_panel(
                "Cost budget burn rate",
                "short",
                [
                    (
                        f"max by ({sc.LABEL_TENANT}) ({cost_burn_record(w.long)})",
                        "{{tenant}} " + w.long,
                    )
                    for w in cfg.cost_burn_windows
                ]
                + [
                    (
                        f"max by ({sc.LABEL_TENANT}) ({cost_burn_record(w.short)})",
                        "{{tenant}} " + w.short,
                    )
                    for w in cfg.cost_burn_windows
                ],
                description="1.0 = on pace to spend exactly the daily budget.",
                width=24,
            )
        )
        .build()
    )


DASHBOARDS: Final[dict[str, Builder]] = {
    "stagelens-request-path": request_path,
    "stagelens-tokens-cost": tokens_cost,
    "stagelens-engine-gpu": engine_gpu,
    "stagelens-slos": slos,
}
"""File stem -> builder; the stem is also the dashboard uid."""


def to_dict(board: DashboardModel) -> dict[str, Any]:
    """The dashboard model as plain JSON data (SDK encoder, then sorted)."""
    data: dict[str, Any] = json.loads(JSONEncoder(sort_keys=True).encode(board))
    for panel_id, panel in enumerate(data["panels"], start=1):
        panel["id"] = panel_id  # stable: position in the builder
    return data


def gnet_flavour(data: dict[str, Any]) -> dict[str, Any]:
    """Add ``__inputs``/``__requires`` so grafana.com-style import asks for a datasource."""
    flavour: dict[str, Any] = json.loads(json.dumps(data))
    types = sorted({p["type"] for p in flavour["panels"] if p["type"] != "row"})
    flavour["__inputs"] = [
        {
            "name": "DS_PROMETHEUS",
            "label": "Prometheus",
            "description": "",
            "type": "datasource",
            "pluginId": "prometheus",
            "pluginName": "Prometheus",
        }
    ]
    flavour["__requires"] = [
        {"type": "grafana", "id": "grafana", "name": "Grafana", "version": "11.0.0"},
        {"type": "datasource", "id": "prometheus", "name": "Prometheus", "version": "1.0.0"},
    ] + [{"type": "panel", "id": t, "name": t, "version": ""} for t in types]
    for variable in flavour["templating"]["list"]:
        if variable["name"] == DATASOURCE_VAR:
            variable["current"] = {
                "selected": True,
                "text": "Prometheus",
                "value": "${DS_PROMETHEUS}",
            }
    flavour["id"] = None
    return flavour


def dump_json(data: dict[str, Any]) -> str:
    """Deterministic JSON: sorted keys, two-space indent, trailing newline."""
    return json.dumps(data, sort_keys=True, indent=2) + "\n"


def render_all(cfg: SloConfig) -> dict[str, str]:
    """File name -> JSON text for every dashboard and its grafana.com flavour."""
    files: dict[str, str] = {}
    for stem, builder in DASHBOARDS.items():
        data = to_dict(builder(cfg))
        files[f"{stem}.json"] = dump_json(data)
        files[f"{stem}.gnet.json"] = dump_json(gnet_flavour(data))
    return files


def write_all(cfg: SloConfig, out_dir: Path = OUT_DIR) -> list[Path]:
    """Write every dashboard file into ``out_dir``; returns the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in render_all(cfg).items():
        path = out_dir / name
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m stagelens.dashboards.build``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--config", type=Path, default=None, help="SLO config YAML")
    parser.add_argument("--out", type=Path, default=OUT_DIR, help="output folder")
    args = parser.parse_args(argv)
    for path in write_all(load_slo_config(args.config), args.out):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
