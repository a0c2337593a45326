"""Dashboard 2, "Tokens and cost": tokens, spend against daily caps, unit costs, billing.

Why these units: a spend rate is USD per hour, not dollars, and a "cost per 1k output
tokens" that divides all spend (input included) by output tokens is a blended figure; each
panel says what it divides. The GPU-time cost per token is fleet-wide on both sides of the
division: GPUs are not attributed to models or tenants, so dividing the fleet's cost by one
tenant's tokens would be meaningless.
"""

from __future__ import annotations

from typing import Final

from grafana_foundation_sdk.builders import dashboard
from grafana_foundation_sdk.models.dashboard import Dashboard as DashboardModel
from stagelens.dashboards.common import MODEL, TENANT, VLLM_MODEL, WHERE, as_model, base
from stagelens.dashboards.panels import (
    RATE,
    bad_above,
    bargauge_panel,
    timeseries_panel,
)

from stagelens import semconv as sc
from stagelens.slo.config import SloConfig
from stagelens.slo.record_names import (
    BILLING_DRIFT_RECORD,
    COST_SPENT_RECORD,
    cost_projected_record,
    gpu_cost_rate_record,
)
from stagelens.slo.recording_rules import per_backend, per_model

USD_PER_HOUR: Final = "suffix: USD/h"
TOKENS_PER_SECOND: Final = "suffix: tokens/s"
USD: Final = "currencyUSD"


def _billing_row(cfg: SloConfig, board: dashboard.Dashboard) -> dashboard.Dashboard:
    output = f'{sc.TOKENS}{{{MODEL}, {sc.LABEL_TYPE}="{sc.TOKEN_TYPE_OUTPUT}"}}'
    generated = as_model(f"rate({sc.VLLM_GENERATION_TOKENS}{{{VLLM_MODEL}}}[{RATE}])")
    drift = cfg.billing_drift_threshold
    # The drift is recorded per cfg.billing_drift_by (the cluster): filtered by those alone.
    drift_where = ", ".join(
        f'{label}=~"${label}"'
        for label in cfg.billing_drift_by
        if label in ("cluster", "namespace")
    )
    return (
        board.with_row(dashboard.Row("Billing reconciliation"))
        .with_panel(
            timeseries_panel(
                "Output tokens: billed vs generated",
                TOKENS_PER_SECOND,
                [
                    (f"sum by ({sc.LABEL_MODEL}) (rate({output}[{RATE}]))", "billed {{model}}"),
                    (f"sum by ({sc.LABEL_MODEL}) ({generated})", "generated {{model}}"),
                ],
                description='Billed: the gateway\'s stagelens_tokens_total{type="output"} per '
                "public model name (all tenants). Generated: the engines' "
                "vllm:generation_tokens_total per vLLM model (its first served name: aliases "
                "show under it), aborted requests' tokens included.",
            )
        )
        .with_panel(
            timeseries_panel(
                "Billing drift",
                "percentunit",
                [(f"{BILLING_DRIFT_RECORD}{{{drift_where}}}", "all models")],
                threshold_lines=((None, "red"), (-drift, "green"), (drift, "red")),
                description="(generated - billed) / generated output tokens over 1h, all models "
                "together (one vLLM model may serve several public names). Above "
                f"{drift:g}: tokens generated that nobody paid for (calls past the gateway, or "
                "tokens generated after their client left); "
                f"below -{drift:g}: billed tokens the engines never counted (estimated cut "
                "streams). "
                "StagelensBillingDrift opens a ticket beyond either line.",
            )
        )
    )


def _engine_row(cfg: SloConfig, board: dashboard.Dashboard) -> dashboard.Dashboard:
    """The tenants' GPU cost beside the price table's, and where the engines' time went."""
    cost = f"{sc.COST_USD}{{{MODEL}, {TENANT}}}"
    gpu_cost = f"{gpu_cost_rate_record('5m')}{{{WHERE}, {TENANT}}}"

    def rate(name: str) -> str:  # ``{selector}`` left for per_model/per_backend
        return f"rate({name}{{{{{{selector}}}}}}[{RATE}])"

    engines = f'{WHERE}, {sc.LABEL_MODEL}=~"$model"'
    tenants = per_model(
        cfg,
        rate(sc.ENGINE_SECONDS),
        "gpus_float",
        engines=True,
        where=f"{engines}, {TENANT}",
    )
    busy = per_backend(cfg, rate(sc.ENGINE_BUSY_SECONDS), "gpus_float", engines)
    idle = per_backend(cfg, rate(sc.ENGINE_IDLE_SECONDS), "gpus_float", engines)
    preempted = per_backend(cfg, rate(sc.ENGINE_PREEMPTED_SECONDS), "gpus_float", engines)
    all_tenants = per_model(cfg, rate(sc.ENGINE_SECONDS), "gpus_float", engines=True, where=engines)
    idle_cost = per_backend(cfg, rate(sc.ENGINE_IDLE_SECONDS), "usd_per_engine_second", engines)
    return (
        board.with_row(dashboard.Row("Engine time and GPU cost"))
        .with_panel(
            timeseries_panel(
                "GPU cost by tenant, beside the price table",
                USD_PER_HOUR,
                [
                    (f"sum by ({sc.LABEL_TENANT}) ({gpu_cost}) * 3600", "{{tenant}} GPU"),
                    (
                        f"sum by ({sc.LABEL_TENANT}) (rate({cost}[{RATE}])) * 3600",
                        "{{tenant}} price table",
                    ),
                ],
                width=8,
                description="GPU: each tenant's share of the engines' time (every engine step "
                "split by the tokens each request computed in it, as the gateway received it "
                "from vLLM) times its model's GPUs and GPU-hour price (SLO config "
                f"gpu_prices, else {cfg.gpu_hourly_cost_usd:g} USD for one GPU). Price "
                "table: what the tenant is billed. The cost alerts compare the "
                f"{cfg.cost_budget_source.replace('_', ' ')} with the caps.",
            )
        )
        .with_panel(
            timeseries_panel(
                "Engine GPU-seconds by tenant, idle and preempted apart",
                "suffix: GPUs",
                [
                    (f"sum by ({sc.LABEL_TENANT}) (\n{tenants}\n)", "{{tenant}}"),
                    (f"sum(\n{preempted}\n)", "preempted"),
                    (
                        f"clamp_min(sum(\n{busy}\n) - sum(\n{all_tenants}\n) - "
                        f"sum(\n{preempted}\n), 0)",
                        "running or unclaimed",
                    ),
                    (f"sum(\n{idle}\n)", "idle"),
                ],
                stacked=True,
                width=8,
                description="The engines' GPUs, busy or idle, by who kept them busy (the vLLM "
                "plugin's series): the tenants' finished requests; preempted work (tokens "
                "computed again after a preemption, charged to nobody); requests still "
                "running or never finished (aborted); idle time. The stack is every GPU of "
                "every engine, whatever the tenant variable says of the lines.",
            )
        )
        .with_panel(
            timeseries_panel(
                "Idle GPU cost by engine",
                USD_PER_HOUR,
                [(f"sum by ({sc.LABEL_BACKEND}) (\n{idle_cost}\n) * 3600", "{{backend}}")],
                width=8,
                description="What the engines' GPUs cost while no step ran (SLO config "
                "node_gpu_prices by backend, else the model's price).",
            )
        )
    )


def tokens_cost(cfg: SloConfig) -> DashboardModel:
    """Dashboard 2: tokens by model/tenant, spend against daily caps, unit costs, billing."""
    tokens = f"{sc.TOKENS}{{{MODEL}, {TENANT}}}"
    output = f'{sc.TOKENS}{{{MODEL}, {TENANT}, {sc.LABEL_TYPE}="{sc.TOKEN_TYPE_OUTPUT}"}}'
    reasoning = f'{sc.TOKENS}{{{MODEL}, {TENANT}, {sc.LABEL_TYPE}="{sc.TOKEN_TYPE_REASONING}"}}'
    cost = f"{sc.COST_USD}{{{MODEL}, {TENANT}}}"
    fleet_output = f'{sc.TOKENS}{{{WHERE}, {sc.LABEL_TYPE}="{sc.TOKEN_TYPE_OUTPUT}"}}'
    gpu_where = 'cluster=~"$cluster"'
    # Every GPU once, whichever exporter sees it: keyed by UUID, stagelens' where it runs,
    # DCGM's for the rest (`count(a) or count(b)` counted only one exporter's GPUs).
    dcgm_gpus = (
        f'label_replace({sc.DCGM_FB_USED}{{{gpu_where}}}, "{sc.LABEL_UUID}", "$1", '
        f'"{sc.DCGM_UUID}", "(.*)")'
    )
    gpus = (
        f"max by ({sc.LABEL_UUID}) ({sc.GPU_MEMORY_TOTAL}{{{gpu_where}}}) or "
        f"max by ({sc.LABEL_UUID}) ({dcgm_gpus})"
    )
    # Each GPU at its published price, else at the configured one.
    usd_per_hour = (
        f"sum(max by ({sc.LABEL_UUID}) ({sc.GPU_COST_PER_HOUR}{{{gpu_where}}}) or "
        f"0 * ({gpus}) + {cfg.gpu_hourly_cost_usd!r})"
    )
    spent = f"{COST_SPENT_RECORD}{{{WHERE}, {TENANT}}}"
    multiple = cfg.cost_page_multiple
    board = (
        base(
            "stagelens-tokens-cost",
            "stagelens / Tokens and cost",
            "Tokens, spend against daily caps, unit costs and billing reconciliation.",
            cfg,
            tenant=True,
        )
        .with_row(dashboard.Row("Tokens"))
        .with_panel(
            timeseries_panel(
                "Tokens by type",
                TOKENS_PER_SECOND,
                [(f"sum by ({sc.LABEL_TYPE}) (rate({tokens}[{RATE}]))", "{{type}}")],
                description="cached_input is part of input.",
            )
        )
        .with_panel(
            timeseries_panel(
                "Tokens by model and tenant",
                TOKENS_PER_SECOND,
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
                "Reasoning share of output by model and tenant",
                "percentunit",
                [
                    (
                        f"sum by ({sc.LABEL_MODEL}, {sc.LABEL_TENANT}) (rate({reasoning}[{RATE}]))"
                        f" / sum by ({sc.LABEL_MODEL}, {sc.LABEL_TENANT}) "
                        f"(rate({output}[{RATE}])) > 0",
                        "{{model}} {{tenant}}",
                    )
                ],
                description="Of the output tokens (billed at the output rate), the share the "
                "model spent thinking (reasoning models only; a model that does not reason "
                "draws no line).",
            )
        )
        .with_row(dashboard.Row("Spend"))
        .with_panel(
            bargauge_panel(
                "Spent in the last 24h, share of the daily cap",
                "percentunit",
                [(spent, "{{tenant}}")],
                steps=bad_above(1.0, warn=0.8),
                maximum=1.0,
                width=8,
                description='Spend over the last 24h / stagelens_budget_usd{window="1d"} (or '
                "the SLO config's daily_budgets_usd). The ticket fires above 100 %.",
            )
        )
        .with_panel(
            timeseries_panel(
                "Projected: last 24h plus the next hour at the current pace",
                "percentunit",
                [
                    (
                        f"{cost_projected_record('1h')}{{{WHERE}, {TENANT}}}",
                        "{{tenant}} (pace of 1h)",
                    ),
                ],
                threshold_lines=((None, "green"), (1.0, "yellow"), (multiple, "red")),
                width=8,
                description=f"Share of the daily cap. The page fires above {multiple:g} (dashed "
                "red) when the 5-minute pace agrees: runaway spend, not a busy hour.",
            )
        )
        .with_panel(
            timeseries_panel(
                "Spend rate",
                USD_PER_HOUR,
                [(f"sum by ({sc.LABEL_TENANT}) (rate({cost}[{RATE}])) * 3600", "{{tenant}}")],
                width=8,
                description="USD per hour by tenant.",
            )
        )
        .with_row(dashboard.Row("Unit costs"))
        .with_panel(
            timeseries_panel(
                "Spend per 1k output tokens (input cost included)",
                USD,
                [
                    (
                        f"sum by ({sc.LABEL_MODEL}) (rate({cost}[{RATE}])) / "
                        f"sum by ({sc.LABEL_MODEL}) (rate({output}[{RATE}])) * 1000",
                        "{{model}}",
                    )
                ],
                description="All spend (input and output tokens) per 1k output tokens: what an "
                "answer of 1k tokens costs with its prompt.",
            )
        )
        .with_panel(
            timeseries_panel(
                "GPU-time cost per output token (fleet)",
                USD,
                [(f"{usd_per_hour} / 3600 / sum(rate({fleet_output}[{RATE}]))", "fleet")],
                description=(
                    f"Fleet-wide: USD per second of GPU time (sum over GPUs of "
                    f"{sc.GPU_COST_PER_HOUR}, the price the GPU exporter publishes, / 3600) "
                    "divided by every output token per second, whatever the model or tenant "
                    "variables say (GPUs are not attributed to them). A GPU that publishes no "
                    f"price (DCGM only) counts {cfg.gpu_hourly_cost_usd:g} USD/GPU-hour; each GPU "
                    "once by UUID, whichever exporters see it."
                ),
            )
        )
    )
    return _billing_row(cfg, _engine_row(cfg, board)).build()
