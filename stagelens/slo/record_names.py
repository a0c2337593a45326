"""The names of the recording rules ``recording_rules`` generates: their groups, the records
(``level:metric:operations``, prometheus/docs ``practices/rules.md``) and the functions that
name a windowed record. Alerts, dashboards and the runbook read them from here, through
``recording_rules``, which re-exports every name.
"""

from __future__ import annotations

from typing import Final

from stagelens import semconv as sc

GROUP_SLI: Final = "stagelens-sli.rules"
GROUP_SLI_PERIOD: Final = "stagelens-sli-period.rules"
GROUP_LATENCY: Final = "stagelens-latency.rules"
GROUP_COST: Final = "stagelens-cost.rules"
GROUP_ENGINE: Final = "stagelens-engine.rules"
GROUP_TARGETS: Final = "stagelens-targets.rules"
RULE_GROUPS: Final[tuple[str, ...]] = (
    GROUP_SLI,
    GROUP_SLI_PERIOD,
    GROUP_LATENCY,
    GROUP_COST,
    GROUP_ENGINE,
    GROUP_TARGETS,
)
"""Recording-rule groups, in the order they depend on each other."""

PERIOD_INTERVAL: Final = "5m"
"""Evaluation interval of the period (30d) group: a 30-day ratio moves slowly, and reading
30 days of samples every 30 s would be the most expensive rule of the file."""


def sli_requests_record(window: str) -> str:
    """Requests per second an SLI counted, per (cluster, namespace, model, sli)."""
    return f"stagelens:sli_requests:rate{window}"


def sli_error_ratio_record(window: str) -> str:
    """Share of an SLI's requests that were bad over ``window``."""
    return f"stagelens:sli_errors:ratio_rate{window}"


def ttft_p95_record(window: str) -> str:
    """p95 TTFT per (model, prompt_size) over ``window``."""
    return f"stagelens:ttft_seconds:p95_rate{window}"


CLASSED_SLIS: Final[tuple[str, ...]] = (sc.SLI_TTFT, sc.SLI_ANSWER)
"""The SLIs judged per prompt-size class: their thresholds grow with the prompt (prefill),
and each class burns a budget of its own."""


def class_requests_record(sli: str, window: str) -> str:
    """Requests per second a classed SLI counted, per (model, prompt_size)."""
    return f"stagelens:{sli}_sli_requests:rate{window}"


def class_error_ratio_record(sli: str, window: str) -> str:
    """Share of a classed SLI's requests that were bad, per (model, prompt_size): each prompt
    size class burns a budget of its own, so a tenant sending 100k-token prompts cannot spend
    the budget of everyone's short prompts."""
    return f"stagelens:{sli}_sli_errors:ratio_rate{window}"


def class_period_requests_record(sli: str, period: str) -> str:
    """Requests a classed SLI counted over the SLO period, per (model, prompt_size)."""
    return f"stagelens:{sli}_sli_requests:increase{period}"


def class_budget_remaining_record(sli: str) -> str:
    """Error budget left over the period, per (model, prompt_size), of a classed SLI."""
    return f"stagelens:{sli}_error_budget_remaining:ratio"


def ttft_class_requests_record(window: str) -> str:
    """Requests per second the TTFT SLI counted, per (model, prompt_size)."""
    return class_requests_record(sc.SLI_TTFT, window)


def ttft_class_error_ratio_record(window: str) -> str:
    """Share of the TTFT SLI's requests that were bad, per (model, prompt_size)."""
    return class_error_ratio_record(sc.SLI_TTFT, window)


TTFT_THRESHOLD_RECORD: Final = "stagelens:ttft_slo_threshold_seconds:configured"
"""The TTFT threshold per ``prompt_size`` class (and, without the label, the default one
that series from a gateway without classes are judged by)."""


def cost_rate_record(window: str) -> str:
    """Spend in USD per second per tenant over ``window``."""
    return f"stagelens:cost_usd:rate{window}"


def gpu_cost_rate_record(window: str) -> str:
    """GPU cost in USD per second per tenant over ``window``: its engine seconds times the
    price of its model's engine GPUs."""
    return f"stagelens:gpu_cost_usd:rate{window}"


def gpu_seconds_rate_record(window: str) -> str:
    """GPU-seconds per second per tenant over ``window``: its engine seconds times the GPUs
    of its model's engines."""
    return f"stagelens:gpu_seconds:rate{window}"


def cost_projected_record(window: str) -> str:
    """Last-24h spend plus ``cost_page_horizon`` more at the pace of ``window``, as a share
    of the daily cap."""
    return f"stagelens:cost_budget_projected:ratio_rate{window}"


def cost_pace_record(window: str) -> str:
    """Spend per second over ``window`` as a share of the daily cap's per-second pace: 1.0
    spends exactly the cap in a day (the contract's burn rate of the cost budget)."""
    return f"stagelens:cost_budget_pace:ratio_rate{window}"


CONTRACT_TTFT_RECORD: Final = "stagelens:ttft_slo_errors:ratio_rate5m"
"""The contract's example record name, kept: the TTFT SLI's 5m error ratio."""
OBJECTIVE_RECORD: Final = "stagelens:slo_objective:ratio"
SLI_PERIOD_REQUESTS_RECORD: Final = "stagelens:sli_requests:increase{period}"
BUDGET_REMAINING_RECORD: Final = "stagelens:error_budget_remaining:ratio"


def stage_latency_record(window: str) -> str:
    """p95 of the figure each stage's budget applies to: the stage's duration, and for
    ``inference`` its time to the first upstream token (decode is not the stage's to meet)."""
    return f"stagelens:stage_latency_seconds:p95_rate{window}"


def inference_latency_record(window: str) -> str:
    """p95 of the inference stage's time to the first upstream token per (model,
    prompt_size): what its budget applies to, per class, since prefill grows with the
    prompt."""
    return f"stagelens:inference_first_token_seconds:p95_rate{window}"


INFERENCE_BUDGET_RECORD: Final = "stagelens:inference_budget_seconds:max"
"""The inference stage's budget per (model, prompt_size): the larger of its stage budget
and the class's TTFT threshold (a class the TTFT SLO gives 2.5 s is not held to 0.8 s)."""
STAGE_BUDGET_RECORD: Final = "stagelens:stage_budget_seconds:max"
CONFIGURED_STAGE_BUDGET_RECORD: Final = "stagelens:stage_budget_seconds:configured"
DAILY_BUDGET_RECORD: Final = "stagelens:budget_usd:daily"
CONFIGURED_DAILY_BUDGET_RECORD: Final = "stagelens:budget_usd:configured"
COST_DAY_RECORD: Final = "stagelens:cost_usd:increase1d"
GPU_COST_DAY_RECORD: Final = "stagelens:gpu_cost_usd:increase1d"
COST_SPENT_RECORD: Final = "stagelens:cost_budget_spent:ratio_increase1d"
KV_WINDOWS: Final[tuple[str, ...]] = ("30m", "6h")
GPU_SM_ACTIVE_RECORD: Final = "stagelens:gpu_sm_active:ratio_max"
GPU_HOST_RECORD: Final = "stagelens:gpu_host:info"
"""1 per (GPU, ``host``): where each GPU's SM activity is read, stagelens' exporter's
``instance`` or DCGM's ``Hostname``, so that an alert on a GPU names its machine."""
HOST: Final = "host"
DCGM_HOSTNAME: Final = "Hostname"
"""DCGM exporter's label naming the node a GPU is in."""
ENGINE_WAITING_RECORD: Final = "stagelens:engine_requests_waiting:max"
ENGINE_KV_USAGE_RECORD: Final = "stagelens:kv_cache_usage:ratio_max"
ENGINE_PREEMPTIONS_RECORD: Final = "stagelens:engine_preemptions:rate5m"
BILLING_WINDOW: Final = "1h"
BILLED_TOKENS_RECORD: Final = f"stagelens:billed_output_tokens:rate{BILLING_WINDOW}"
GENERATED_TOKENS_RECORD: Final = f"stagelens:generated_output_tokens:rate{BILLING_WINDOW}"
BILLING_DRIFT_RECORD: Final = f"stagelens:billing_drift:ratio_rate{BILLING_WINDOW}"
"""(generated - billed) / generated output tokens per (cluster, namespace): > 0 means tokens
the engines generated that nobody was billed for (calls that bypassed the gateway, tokens
generated after a client left and before the abort took effect: vLLM's counter includes
aborted requests); < 0 billed tokens the engines never counted (estimated cut streams)."""


TARGETS_RECORD: Final = "stagelens:up_targets:count"
"""Targets scraped per (cluster, namespace, job) of the jobs stagelens watches: the count a
rollout keeps (new pods, new addresses, as many of them), where ``instance`` does not."""


def kv_queries_record(window: str) -> str:
    """Prompt tokens looked up in the prefix cache per second, per model."""
    return f"stagelens:kv_cache_queries:rate{window}"


def kv_hits_record(window: str) -> str:
    """Prompt tokens found in the prefix cache per second, per model."""
    return f"stagelens:kv_cache_hits:rate{window}"


def kv_hit_ratio_record(window: str) -> str:
    """Engine prefix-cache hit rate per model."""
    return f"stagelens:kv_cache_hit:ratio_rate{window}"


OPERAND: Final = "stagelens_operand"
"""A label a rule gives each operand of an element-wise maximum for the length of its
expression, so that ``or`` keeps them apart; never in a result."""
