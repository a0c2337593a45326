"""Prometheus recording rules generated from an SloConfig (``alerts/stagelens-rules.yaml``).

Why these shapes:
- Every aggregation keeps ``SloConfig.aggregation_labels`` (``cluster``, ``namespace``), so
  two environments scraped by one Prometheus never merge into one SLI.
- A "fallback" between two sources of one figure (the vLLM plugin's counters and vLLM's own,
  stagelens' GPM gauge and DCGM's) first brings both to the same label set, then uses
  ``or``: PromQL's ``or`` keeps a right-hand series only where no left-hand series has the
  same labels, so one engine or one GPU is never counted twice.
- The SLI ratios read the gateway's per-request verdicts (``stagelens_sli_*_total``), not
  histogram buckets: the gateway alone knows whether a request was streamed, failed after its
  headers, or left early.

Names follow ``level:metric:operations`` (prometheus/docs ``practices/rules.md``).
"""

from __future__ import annotations

from typing import Any

from stagelens import semconv as sc
from stagelens.slo.config import SloConfig, duration_seconds
from stagelens.slo.record_names import (
    BILLED_TOKENS_RECORD,
    BILLING_DRIFT_RECORD,
    BILLING_WINDOW,
    BUDGET_REMAINING_RECORD,
    CLASSED_SLIS,
    CONFIGURED_DAILY_BUDGET_RECORD,
    CONFIGURED_STAGE_BUDGET_RECORD,
    CONTRACT_TTFT_RECORD,
    COST_DAY_RECORD,
    COST_SPENT_RECORD,
    DAILY_BUDGET_RECORD,
    DCGM_HOSTNAME,
    ENGINE_KV_USAGE_RECORD,
    ENGINE_PREEMPTIONS_RECORD,
    ENGINE_WAITING_RECORD,
    GENERATED_TOKENS_RECORD,
    GPU_COST_DAY_RECORD,
    GPU_HOST_RECORD,
    GPU_SM_ACTIVE_RECORD,
    GROUP_COST,
    GROUP_ENGINE,
    GROUP_LATENCY,
    GROUP_SLI,
    GROUP_SLI_PERIOD,
    GROUP_TARGETS,
    HOST,
    INFERENCE_BUDGET_RECORD,
    KV_WINDOWS,
    OBJECTIVE_RECORD,
    OPERAND,
    PERIOD_INTERVAL,
    SLI_PERIOD_REQUESTS_RECORD,
    STAGE_BUDGET_RECORD,
    TARGETS_RECORD,
    TTFT_THRESHOLD_RECORD,
    class_budget_remaining_record,
    class_error_ratio_record,
    class_period_requests_record,
    class_requests_record,
    cost_pace_record,
    cost_projected_record,
    cost_rate_record,
    gpu_cost_rate_record,
    gpu_seconds_rate_record,
    inference_latency_record,
    kv_hit_ratio_record,
    kv_hits_record,
    kv_queries_record,
    sli_error_ratio_record,
    sli_requests_record,
    stage_latency_record,
    ttft_p95_record,
)

Rule = dict[str, Any]


def by(cfg: SloConfig, *labels: str) -> str:
    """``cluster, namespace, <labels>``: the grouping every rule keeps."""
    return ", ".join((*cfg.aggregation_labels, *labels))


def as_model(expr: str) -> str:
    """vLLM's ``model_name`` copied to ``model``, so vLLM's series match stagelens'."""
    return f'label_replace({expr}, "{sc.LABEL_MODEL}", "$1", "{sc.VLLM_MODEL_NAME}", "(.*)")'


def _sli_rate_pair(
    grouping: str, selector: str, window: str, requests: str, ratio: str
) -> list[Rule]:
    """The SLI's request rate over ``window`` (recorded as ``requests``) and its error
    ratio (as ``ratio``), both summed by ``grouping`` over the series ``selector`` picks.
    No error series yet (a model that never failed) reads as 0, not as no data."""
    errors = f"sum by ({grouping}) (rate({sc.SLI_ERRORS}{selector}[{window}]))"
    return [
        {
            "record": requests,
            "expr": f"sum by ({grouping}) (rate({sc.SLI_REQUESTS}{selector}[{window}]))",
        },
        {"record": ratio, "expr": f"({errors} or 0 * {requests}) / {requests}"},
    ]


def _sli_records(cfg: SloConfig) -> list[Rule]:
    grouping = by(cfg, sc.LABEL_MODEL, sc.LABEL_SLI)
    rules: list[Rule] = []
    for window in cfg.burn_windows_used():
        rules += _sli_rate_pair(
            grouping, "", window, sli_requests_record(window), sli_error_ratio_record(window)
        )
    # The classed SLIs per prompt-size class: the same pair, kept apart by the class label.
    class_grouping = by(cfg, sc.LABEL_MODEL, sc.LABEL_SLI, sc.LABEL_PROMPT_SIZE)
    for sli in CLASSED_SLIS:
        selector = f'{{{sc.LABEL_SLI}="{sli}"}}'
        for window in cfg.burn_windows_used():
            rules += _sli_rate_pair(
                class_grouping,
                selector,
                window,
                class_requests_record(sli, window),
                class_error_ratio_record(sli, window),
            )
    if "5m" in cfg.burn_windows_used():
        rules.append(
            {
                "record": CONTRACT_TTFT_RECORD,
                "expr": f'{sli_error_ratio_record("5m")}{{{sc.LABEL_SLI}="{sc.SLI_TTFT}"}}',
            }
        )
    return rules


def _period_records(cfg: SloConfig) -> list[Rule]:
    grouping = by(cfg, sc.LABEL_MODEL, sc.LABEL_SLI)
    period = cfg.period
    requests = SLI_PERIOD_REQUESTS_RECORD.format(period=period)
    errors = f"sum by ({grouping}) (increase({sc.SLI_ERRORS}[{period}]))"
    rules: list[Rule] = [
        {
            "record": OBJECTIVE_RECORD,
            "expr": f"vector({objective!r})",
            "labels": {sc.LABEL_SLI: sli},
        }
        for sli, objective in cfg.objectives.items()
    ]
    rules += [
        {
            "record": requests,
            "expr": f"sum by ({grouping}) (increase({sc.SLI_REQUESTS}[{period}]))",
        },
        {
            "record": sli_error_ratio_record(period),
            "expr": f"({errors} or 0 * {requests}) / ({requests} > 0)",
        },
        {
            "record": BUDGET_REMAINING_RECORD,
            "expr": (
                f"1 - {sli_error_ratio_record(period)}\n"
                f"/ on ({sc.LABEL_SLI}) group_left ()\n(1 - {OBJECTIVE_RECORD})"
            ),
        },
    ]
    # The classed SLIs per prompt-size class, as their burns and the SLO dashboard read them.
    class_grouping = by(cfg, sc.LABEL_MODEL, sc.LABEL_SLI, sc.LABEL_PROMPT_SIZE)
    for sli in CLASSED_SLIS:
        selector = f'{{{sc.LABEL_SLI}="{sli}"}}'
        counted = class_period_requests_record(sli, period)
        bad = f"sum by ({class_grouping}) (increase({sc.SLI_ERRORS}{selector}[{period}]))"
        ratio = class_error_ratio_record(sli, period)
        rules += [
            {
                "record": counted,
                "expr": (
                    f"sum by ({class_grouping}) (increase({sc.SLI_REQUESTS}{selector}[{period}]))"
                ),
            },
            {"record": ratio, "expr": f"({bad} or 0 * {counted}) / ({counted} > 0)"},
            {
                "record": class_budget_remaining_record(sli),
                "expr": (
                    f"1 - {ratio}\n/ on ({sc.LABEL_SLI}) group_left ()\n(1 - {OBJECTIVE_RECORD})"
                ),
            },
        ]
    return rules


def _latency_records(cfg: SloConfig) -> list[Rule]:
    window = cfg.ttft_p95_window
    stage_window = cfg.stage_latency_window
    latency = stage_latency_record(stage_window)
    inference = "inference"
    stage_bucket = f'{sc.STAGE_DURATION}_bucket{{{sc.LABEL_STAGE}!="{inference}"}}'
    upstream = (
        f"histogram_quantile(0.95, sum by ({by(cfg, 'le')}) "
        f"(rate({sc.UPSTREAM_TTFT}_bucket[{stage_window}])))"
    )
    rules: list[Rule] = [
        {
            "record": TTFT_THRESHOLD_RECORD,
            "expr": f"vector({cfg.ttft_threshold_seconds!r})",
        },
        *(
            {
                "record": TTFT_THRESHOLD_RECORD,
                "expr": f"vector({seconds!r})",
                "labels": {sc.LABEL_PROMPT_SIZE: size},
            }
            for size, seconds in cfg.ttft_classes()
        ),
        {
            "record": ttft_p95_record(window),
            "expr": (
                "histogram_quantile(0.95, sum by "
                f"({by(cfg, sc.LABEL_MODEL, sc.LABEL_PROMPT_SIZE, 'le')}) "
                f"(rate({sc.TIME_TO_FIRST_TOKEN}_bucket[{window}])))"
            ),
        },
        {
            "record": latency,
            "expr": (
                f"histogram_quantile(0.95, sum by ({by(cfg, sc.LABEL_STAGE, 'le')}) "
                f"(rate({stage_bucket}[{stage_window}])))\nor\n"
                f'label_replace({upstream}, "{sc.LABEL_STAGE}", "{inference}", "", "")'
            ),
        },
    ]
    rules += [
        {
            "record": CONFIGURED_STAGE_BUDGET_RECORD,
            "expr": f"vector({seconds!r})",
            "labels": {sc.LABEL_STAGE: stage},
        }
        for stage, seconds in sorted(cfg.stage_budgets_seconds.items())
    ]
    rules.append(
        {
            "record": STAGE_BUDGET_RECORD,
            # The gauge the gateway exports; where none is scraped, the configured budget,
            # laid onto the same (cluster, namespace, stage) as the latency it is compared to.
            "expr": (
                f"max by ({by(cfg, sc.LABEL_STAGE)}) ({sc.STAGE_BUDGET})\nor\n"
                f"0 * {latency}\n+ on ({sc.LABEL_STAGE}) group_left\n"
                f"max by ({sc.LABEL_STAGE}) ({CONFIGURED_STAGE_BUDGET_RECORD})"
            ),
        }
    )
    return rules + _inference_records(cfg)


def _inference_records(cfg: SloConfig) -> list[Rule]:
    """The inference stage per model and prompt-size class, and its budget there."""
    window = cfg.stage_latency_window
    latency = inference_latency_record(window)
    classed = by(cfg, sc.LABEL_MODEL, sc.LABEL_PROMPT_SIZE)
    stage = f'{STAGE_BUDGET_RECORD}{{{sc.LABEL_STAGE}="inference"}}'
    threshold = f'{TTFT_THRESHOLD_RECORD}{{{sc.LABEL_PROMPT_SIZE}!=""}}'

    def operand(on: str, budget: str, name: str) -> str:
        laid = f"0 * {latency} + on ({on}) group_left () {budget}"
        return f'label_replace({laid}, "{OPERAND}", "{name}", "", "")'

    return [
        {
            "record": latency,
            "expr": (
                f"histogram_quantile(0.95, sum by ({classed}, le) "
                f"(rate({sc.UPSTREAM_TTFT}_bucket[{window}])))"
            ),
        },
        {
            "record": INFERENCE_BUDGET_RECORD,
            # Both operands laid onto the latency's series, told apart for the length of
            # the query (``or`` keeps series of distinct labels), then the larger per series.
            # A series without a class (an older gateway) gets the stage budget alone.
            "expr": (
                f"max by ({classed}) (\n  {operand(by(cfg), stage, 'stage')}\n  or\n"
                f"  {operand(sc.LABEL_PROMPT_SIZE, threshold, 'class')}\n)"
            ),
        },
    ]


def per_model(
    cfg: SloConfig, series: str, factor: str, *, engines: bool = False, where: str = ""
) -> str:
    """``series`` (a range function of engine seconds, ``{selector}`` where its selector
    goes) times each model's ``GpuPrice`` figure ``factor`` (``usd_per_engine_second`` or
    ``gpus_float``): one term per priced model, the rest at the default price; ``where``
    adds to every selector. The gateway's series (``engines``: the vLLM plugin's, which
    serve ``stagelens_engine_seconds_total`` too, as its fleet view: never both at once,
    which would count every request twice)."""
    op = "!~" if engines else "=~"
    job = f"job{op}{_quoted(cfg.gateway_job_regex)}" + (f", {where}" if where else "")
    terms = []
    for model, price in sorted(cfg.gpu_prices.items()):
        value = getattr(price, factor)()
        selector = f"{job}, {sc.LABEL_MODEL}={_quoted(model)}"
        terms.append(f"{series.format(selector=selector)} * {value!r}")
    rest = "|".join(_regex(m) for m in sorted(cfg.gpu_prices))
    selector = f"{job}, {sc.LABEL_MODEL}!~{_quoted(rest)}" if rest else job
    terms.append(f"{series.format(selector=selector)} * {getattr(cfg.gpu_price(), factor)()!r}")
    return "\nor\n".join(terms)


def per_backend(cfg: SloConfig, series: str, factor: str, where: str = "") -> str:
    """``series`` of the vLLM plugin's engine series times the ``GpuPrice`` figure of each
    engine: its ``node_gpu_prices`` entry by ``backend``, else its model's."""
    extra = f", {where}" if where else ""
    terms = [
        f"{series.format(selector=f'{sc.LABEL_BACKEND}={_quoted(b)}{extra}')} * "
        f"{getattr(price, factor)()!r}"
        for b, price in sorted(cfg.node_gpu_prices.items())
    ]
    named = "|".join(_regex(b) for b in sorted(cfg.node_gpu_prices))
    rest = f"{sc.LABEL_BACKEND}!~{_quoted(named)}{extra}" if named else where
    terms.append(per_model(cfg, series, factor, engines=True, where=rest))
    return "\nor\n".join(terms)


def _quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _regex(text: str) -> str:
    return "".join("\\" + c if c in ".^$*+?()[]{}|\\" else c for c in text)


def _cost_records(cfg: SloConfig) -> list[Rule]:
    grouping = by(cfg, sc.LABEL_TENANT)
    day = f'{sc.LABEL_WINDOW}="{sc.BUDGET_WINDOW_DAY}"'
    rules: list[Rule] = [
        {
            "record": cost_rate_record(window),
            "expr": f"sum by ({grouping}) (rate({sc.COST_USD}[{window}]))",
        }
        for window in ("5m", "1h")
    ]
    rules.append(
        {
            "record": COST_DAY_RECORD,
            "expr": f"sum by ({grouping}) (increase({sc.COST_USD}[1d]))",
        }
    )
    # The GPU cost of the tenants' engine time (docs/engine-seconds.md).
    engine = sc.ENGINE_SECONDS + "{{{selector}}}"
    for window in ("5m", "1h"):
        seconds = f"rate({engine}[{window}])"
        rules.append(
            {
                "record": gpu_seconds_rate_record(window),
                "expr": f"sum by ({grouping}) (\n{per_model(cfg, seconds, 'gpus_float')}\n)",
            }
        )
        rules.append(
            {
                "record": gpu_cost_rate_record(window),
                "expr": (
                    f"sum by ({grouping}) (\n{per_model(cfg, seconds, 'usd_per_engine_second')}\n)"
                ),
            }
        )
    rules.append(
        {
            "record": GPU_COST_DAY_RECORD,
            "expr": (
                f"sum by ({grouping}) (\n"
                f"{per_model(cfg, f'increase({engine}[1d])', 'usd_per_engine_second')}\n)"
            ),
        }
    )
    spent_day, spent_rate = COST_DAY_RECORD, cost_rate_record
    if cfg.cost_budget_source == "gpu":
        spent_day, spent_rate = GPU_COST_DAY_RECORD, gpu_cost_rate_record
    rules += [
        {
            "record": CONFIGURED_DAILY_BUDGET_RECORD,
            "expr": f"vector({usd!r})",
            "labels": {sc.LABEL_TENANT: tenant, sc.LABEL_WINDOW: sc.BUDGET_WINDOW_DAY},
        }
        for tenant, usd in sorted(cfg.daily_budgets_usd.items())
    ]
    rules.append(
        {
            "record": DAILY_BUDGET_RECORD,
            "expr": (
                f"max by ({grouping}) ({sc.BUDGET_USD}{{{day}}})\nor\n"
                f"0 * {COST_DAY_RECORD}\n+ on ({sc.LABEL_TENANT}) group_left\n"
                f"max by ({sc.LABEL_TENANT}) ({CONFIGURED_DAILY_BUDGET_RECORD})"
            ),
        }
    )
    budget = f"({DAILY_BUDGET_RECORD} > 0)"
    rules.append({"record": COST_SPENT_RECORD, "expr": f"{spent_day} / {budget}"})
    horizon = duration_seconds(cfg.cost_page_horizon)
    rules += [
        {
            "record": cost_projected_record(window),
            "expr": f"({spent_day} + {spent_rate(window)} * {horizon:g}) / {budget}",
        }
        for window in ("5m", "1h")
    ]
    rules += [
        {
            "record": cost_pace_record(window),
            "expr": f"{cost_rate_record(window)} * 86400 / {budget}",
        }
        for window in ("5m", "1h")
    ]
    return rules


def _fallback(cfg: SloConfig, op: str, ours: str, vllm: str, window: str | None = None) -> str:
    """``op by (cluster, namespace, model)`` of the plugin's series, else of vLLM's."""
    grouping = by(cfg, sc.LABEL_MODEL)
    if window is None:
        return f"{op} by ({grouping}) ({ours})\nor\n{op} by ({grouping}) ({as_model(vllm)})"
    return (
        f"{op} by ({grouping}) (rate({ours}[{window}]))\nor\n"
        f"{op} by ({grouping}) ({as_model(f'rate({vllm}[{window}])')})"
    )


def _engine_records(cfg: SloConfig) -> list[Rule]:
    rules: list[Rule] = []
    for window in KV_WINDOWS:
        # Hits and queries from the same source: the plugin's where it runs, else vLLM's
        # (``unless`` binds tighter than ``or``: vLLM's hits only for models the plugin
        # counts no queries of).
        queries = _fallback(cfg, "sum", sc.KV_CACHE_QUERIES, sc.VLLM_PREFIX_CACHE_QUERIES, window)
        hits = (
            f"sum by ({by(cfg, sc.LABEL_MODEL)}) (rate({sc.KV_CACHE_HITS}[{window}]))\nor\n"
            f"sum by ({by(cfg, sc.LABEL_MODEL)}) "
            f"({as_model(f'rate({sc.VLLM_PREFIX_CACHE_HITS}[{window}])')})\n"
            f"unless on ({by(cfg, sc.LABEL_MODEL)}) "
            f"sum by ({by(cfg, sc.LABEL_MODEL)}) ({sc.KV_CACHE_QUERIES})"
        )
        rules += [
            {"record": kv_queries_record(window), "expr": queries},
            {"record": kv_hits_record(window), "expr": hits},
            {
                "record": kv_hit_ratio_record(window),
                "expr": f"{kv_hits_record(window)} / ({kv_queries_record(window)} > 0)",
            },
        ]
    gpu_by = ", ".join(
        (
            *(label for label in cfg.aggregation_labels if label != "namespace"),
            sc.LABEL_UUID,
            sc.LABEL_GPU,
        )
    )
    dcgm = f'label_replace({sc.DCGM_SM_ACTIVE}, "{sc.LABEL_UUID}", "$1", "{sc.DCGM_UUID}", "(.*)")'

    def host(expr: str, label: str) -> str:
        named = f'label_replace({expr}, "{HOST}", "$1", "{label}", "(.*)")'
        return f"group by ({gpu_by}, {HOST}) ({named})"

    rules += [
        {
            "record": GPU_SM_ACTIVE_RECORD,
            # SM activity only: NVML utilisation says a kernel ran, not how busy the GPU is.
            # The GPU exporter and DCGM run in different namespaces: keyed by UUID, not by it.
            "expr": (f"max by ({gpu_by}) ({sc.GPU_SM_ACTIVE})\nor\nmax by ({gpu_by}) ({dcgm})"),
        },
        {
            "record": GPU_HOST_RECORD,
            # DCGM's only for GPUs the stagelens exporter does not read (one host a GPU).
            "expr": (
                f"{host(sc.GPU_SM_ACTIVE, 'instance')}\nor\n(\n  {host(dcgm, DCGM_HOSTNAME)}\n"
                f"  unless on ({gpu_by})\n  {sc.GPU_SM_ACTIVE}\n)"
            ),
        },
        {
            "record": ENGINE_WAITING_RECORD,
            "expr": _fallback(cfg, "max", sc.ENGINE_REQUESTS_WAITING, sc.VLLM_REQUESTS_WAITING),
        },
        {
            "record": ENGINE_KV_USAGE_RECORD,
            "expr": _fallback(cfg, "max", sc.KV_CACHE_USAGE, sc.VLLM_KV_CACHE_USAGE),
        },
        {
            "record": ENGINE_PREEMPTIONS_RECORD,
            "expr": _fallback(cfg, "sum", sc.ENGINE_PREEMPTIONS, sc.VLLM_PREEMPTIONS, "5m"),
        },
    ]
    return rules + _billing_records(cfg)


def _billing_records(cfg: SloConfig) -> list[Rule]:
    """Billed against generated output tokens per ``billing_drift_by`` (the cluster), all
    models together: one vLLM model often serves several public names (``model_name`` is
    its first), so a per-model comparison would read an alias's tokens as unbilled; and
    vLLM often runs in a namespace of its own, so a per-namespace one would never meet."""
    env = ", ".join(cfg.billing_drift_by)
    output = f'{sc.TOKENS}{{{sc.LABEL_TYPE}="{sc.TOKEN_TYPE_OUTPUT}"}}'
    return [
        {
            "record": BILLED_TOKENS_RECORD,
            "expr": f"sum by ({env}) (rate({output}[{BILLING_WINDOW}]))",
        },
        {
            "record": GENERATED_TOKENS_RECORD,
            "expr": f"sum by ({env}) (rate({sc.VLLM_GENERATION_TOKENS}[{BILLING_WINDOW}]))",
        },
        {
            "record": BILLING_DRIFT_RECORD,
            "expr": (
                f"({GENERATED_TOKENS_RECORD} - on ({env}) {BILLED_TOKENS_RECORD})\n"
                f"/ ({GENERATED_TOKENS_RECORD} > 0)"
            ),
        },
    ]


def monitored_jobs(cfg: SloConfig) -> str:
    """One regex for every job stagelens watches: gateway, vLLM, GPU exporter, DCGM."""
    return "|".join(
        (
            cfg.gateway_job_regex,
            cfg.backend_job_regex,
            cfg.gpu_exporter_job_regex,
            cfg.dcgm_job_regex,
        )
    )


def _target_records(cfg: SloConfig) -> list[Rule]:
    return [
        {
            "record": TARGETS_RECORD,
            "expr": f'count by ({by(cfg, "job")}) (up{{job=~"{monitored_jobs(cfg)}"}})',
        }
    ]


def render_rules(cfg: SloConfig) -> dict[str, Any]:
    """The recording-rule file as a mapping (``groups:`` ...)."""
    return {
        "groups": [
            {"name": GROUP_SLI, "rules": _sli_records(cfg)},
            {"name": GROUP_SLI_PERIOD, "interval": PERIOD_INTERVAL, "rules": _period_records(cfg)},
            {"name": GROUP_LATENCY, "rules": _latency_records(cfg)},
            {"name": GROUP_COST, "rules": _cost_records(cfg)},
            {"name": GROUP_ENGINE, "rules": _engine_records(cfg)},
            {"name": GROUP_TARGETS, "rules": _target_records(cfg)},
        ]
    }


def record_names(cfg: SloConfig) -> set[str]:
    """Every recording-rule name the config renders."""
    return {r["record"] for g in render_rules(cfg)["groups"] for r in g["rules"]}
