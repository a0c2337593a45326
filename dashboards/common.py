"""What every stagelens dashboard shares: variables, links, selectors and PromQL helpers.

Why here: the selectors decide which series a panel reads. Every query filters on the same
``cluster``, ``namespace`` and ``model`` variables as its neighbours, and every figure that
two sources can report (the vLLM plugin and vLLM itself, the gateway and the plugin,
stagelens' GPU exporter and DCGM) is read through one helper that keeps exactly one of them
per engine or GPU. PromQL's ``or`` is a fallback only between series with the same labels,
so the helpers bring both sources to one label set first.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from grafana_foundation_sdk.builders import dashboard
from grafana_foundation_sdk.models.dashboard import (
    DashboardCursorSync,
    DashboardLinkType,
    VariableRefresh,
)
from stagelens.dashboards.panels import DATASOURCE, DATASOURCE_VAR, RATE

from stagelens import semconv as sc
from stagelens.metrics.buckets import ERROR_TARGET, worst_ratio
from stagelens.slo.config import SloConfig

MAX_NARROWABLE_RATIO: Final = (1 + ERROR_TARGET) / (1 - ERROR_TARGET)
"""The widest bucket whose values all lie within ``ERROR_TARGET`` of one figure (1.22x)."""

TAGS: Final = ["stagelens", "llm"]
LATENCY_EXEMPLARS: Final = True
"""Ask for exemplars on the panels of the histograms that carry them: time to first token,
inter-token latency (a sampled request's worst gap), request duration and stage duration
(the latest sampled request per bucket, its trace id linked to the tracing data source by
``exemplarTraceIdDestinations``). The upstream-first-token histogram carries none: its
panels do not ask. Off, the generated JSON asks for none."""

WHERE: Final = 'cluster=~"$cluster", namespace=~"$namespace"'
"""Every stagelens and vLLM series: the environment chosen in the variables."""
MODEL: Final = f'{WHERE}, {sc.LABEL_MODEL}=~"$model"'
TENANT: Final = f'{sc.LABEL_TENANT}=~"$tenant"'
VLLM_MODEL: Final = f'{WHERE}, {sc.VLLM_MODEL_NAME}=~"$model"'
ENGINE: Final = 'instance=~"$instance"'
GPU_WHERE: Final = 'cluster=~"$cluster", gpu=~"$gpu"'
"""GPUs: the GPU exporter and DCGM run in namespaces of their own, so no namespace filter."""


def base(
    uid: str,
    title: str,
    description: str,
    cfg: SloConfig,
    *,
    tenant: bool = False,
    engines: bool = False,
) -> dashboard.Dashboard:
    """A dashboard with the house settings, its variables and links to the other three."""
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
        .link(
            dashboard.DashboardLink("stagelens")
            .type(DashboardLinkType.DASHBOARDS)
            .tags(["stagelens"])
            .as_dropdown(False)
            .include_vars(True)
            .keep_time(True)
        )
        .with_variable(
            dashboard.DatasourceVariable(DATASOURCE_VAR).label("Data source").type("prometheus")
        )
        .with_variable(
            _query_variable("cluster", "Cluster", f"label_values({sc.REQUESTS}, cluster)")
        )
        .with_variable(
            _query_variable(
                "namespace",
                "Namespace",
                f'label_values({sc.REQUESTS}{{cluster=~"$cluster"}}, namespace)',
            )
        )
        .with_variable(
            _query_variable(
                "model", "Model", f"label_values({sc.REQUESTS}{{{WHERE}}}, {sc.LABEL_MODEL})"
            )
        )
    )
    if tenant:
        board = board.with_variable(
            _query_variable(
                "tenant", "Tenant", f"label_values({sc.TOKENS}{{{WHERE}}}, {sc.LABEL_TENANT})"
            )
        )
    if engines:
        board = board.with_variable(
            _query_variable(
                "instance",
                "Engine",
                f'label_values(up{{job=~"{cfg.backend_job_regex}", {WHERE}}}, instance)',
            )
        ).with_variable(
            _query_variable(
                "gpu", "GPU", f'label_values({sc.GPU_MEMORY_TOTAL}{{cluster=~"$cluster"}}, gpu)'
            )
        )
    return board


def _query_variable(name: str, label: str, query: str) -> dashboard.QueryVariable:
    return (
        dashboard.QueryVariable(name)
        .label(label)
        .datasource(DATASOURCE)
        .query(query)
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .multi(True)
        .include_all(True)
        .all_value(".*")
    )


RANK_SLACK: Final = 1e-9
"""Taken off ``q`` where a panel looks for the bucket that holds the percentile's rank:
``0.95 * 80`` is 76.00000000000001 in binary, and the bucket holding the 76th request must
not give way to the next one (``stagelens.views.percentiles.rank`` does the same)."""
OPERAND: Final = "stagelens_operand"
"""A label a panel query gives each operand of an element-wise ``max`` or ``min`` for the
length of the query, so that PromQL's ``or`` keeps them apart; never stored."""


def _each(aggregate: str, by: str, exprs: Sequence[str]) -> str:
    """The element-wise ``aggregate`` (``max`` or ``min``) of ``exprs``, vectors grouped
    ``by`` the same labels; a group one of them lacks takes the others' value.

    Why an aggregation: PromQL has no element-wise maximum of two vectors, and the
    comparison-and-``or`` idiom repeats each operand; tagged apart and aggregated, each
    operand is written (and evaluated) once."""
    tagged = " or ".join(
        f'label_replace({e}, "{OPERAND}", "{i}", "", "")' for i, e in enumerate(exprs)
    )
    return f"{aggregate} by ({by}) ({tagged})"


def quantile(q: float, metric: str, by: str, selector: str = MODEL, window: str = RATE) -> str:
    """The ``q`` percentile of gateway histogram ``metric`` per ``by`` group, drawn within
    ``buckets.ERROR_TARGET`` of the exact one and never outside the fastest and slowest
    request observed.

    Why not ``histogram_quantile`` alone: it interpolates linearly inside the bucket that
    holds the percentile's rank, so it may lie up to the bucket's width (20 % on 1.2x
    bounds) from the exact figure, and above the slowest request. The query finds that
    bucket's bounds ``[lower, upper]`` (``histogram_quantile`` over a 0/1 step that turns
    to 1 at that bucket gives ``upper`` at q = 1 and ``lower`` just above q = 0), narrows
    them to the series' tracked extremes (``stagelens_histogram_min_seconds`` /
    ``_max_seconds`` over the window), and draws ``histogram_quantile``'s value pulled into
    ``[0.9 * upper, 1.1 * lower]``, where every value of the bucket is within 10 % of it:
    ``stagelens report``'s estimate (``stagelens.views.percentiles.in_bucket``). A bucket
    wider than 1.22x (outside the family's working range) has no such interval: the query
    then draws ``1.1 * lower``. A group with no request in the window draws nothing."""
    on = f"on({by})"
    by_le = f"{by}, le" if by else "le"
    buckets = f"sum by ({by_le}) (rate({metric}_bucket{{{selector}}}[{window}]))"
    count = f'sum by ({by}) (rate({metric}_bucket{{{selector}, le="+Inf"}}[{window}]))'
    step = f"({buckets} >= bool {on} group_left() ({q - RANK_SLACK!r} * {count}))"
    named = f'{sc.LABEL_HISTOGRAM}="{metric}", {selector}'
    lowest = f"min by ({by}) (min_over_time({sc.HISTOGRAM_MIN}{{{named}}}[{window}]))"
    highest = f"max by ({by}) (max_over_time({sc.HISTOGRAM_MAX}{{{named}}}[{window}]))"
    lower = _each("max", by, [f"histogram_quantile({RANK_SLACK!r}, {step})", lowest])
    upper = _each("min", by, [f"histogram_quantile(1, {step})", highest])
    interpolated = f"histogram_quantile({q}, {buckets})"
    low_ok = f"{1 - ERROR_TARGET:g} * {upper}"
    high_ok = f"{1 + ERROR_TARGET:g} * {lower}"
    pulled_up = _each("max", by, [interpolated, lower, low_ok])
    return f"{_each('min', by, [pulled_up, upper, high_ok])} and {on} ({count} > 0)"


def quantile_bound(bounds: Sequence[float], low: float, high: float) -> str:
    """The sentence a percentile panel carries about its error, read from the
    bounds themselves so it cannot go stale."""
    ratio = worst_ratio(bounds, low, high)
    within = (
        f"within {ERROR_TARGET * 100:g} % of the exact one"
        if ratio <= MAX_NARROWABLE_RATIO
        else f"within {(ratio - 1) * 100:.0f} % of the exact one"
    )
    return (
        f"Percentiles are read from histogram buckets: between {low * 1000:g} ms and "
        f"{high:g} s the buckets are at most {ratio:.3g}x apart, so each figure drawn is "
        f"{within}, and never above the slowest request or below the fastest "
        f"({sc.HISTOGRAM_MAX}, {sc.HISTOGRAM_MIN}). stagelens report prints exact figures "
        "from spans (docs/percentiles.md)."
    )


def class_thresholds(cfg: SloConfig) -> str:
    """The TTFT threshold of each prompt-size class as a PromQL vector labelled
    ``prompt_size``, written from the config (a constant has no cluster to filter by)."""
    return " or ".join(
        f'label_replace(vector({seconds!r}), "{sc.LABEL_PROMPT_SIZE}", "{size}", "", "")'
        for size, seconds in cfg.ttft_classes()
    )


def class_threshold_lines(cfg: SloConfig, window: str) -> str:
    """One line per prompt-size class with TTFT traffic in ``window``: its threshold."""
    traffic = (
        f"sum by ({sc.LABEL_PROMPT_SIZE}) (rate({sc.TIME_TO_FIRST_TOKEN}_count{{{MODEL}}}"
        f"[{window}])) > 0"
    )
    return f"0 * ({traffic}) + on ({sc.LABEL_PROMPT_SIZE}) group_left () ({class_thresholds(cfg)})"


def mean(metric: str, by: str, selector: str = MODEL, window: str = RATE) -> str:
    """Mean observation of a histogram per ``by`` group: sum rate / count rate."""
    grouping = f"sum by ({by}) " if by else "sum "
    return (
        f"{grouping}(rate({metric}_sum{{{selector}}}[{window}])) / "
        f"{grouping}(rate({metric}_count{{{selector}}}[{window}]))"
    )


GATEWAY_JOBS: Final = str(SloConfig.model_fields["gateway_job_regex"].default)
"""The gateway's ``job`` (the SLO config's default ``gateway_job_regex``): the engine phases
are read from every other job (the vLLM plugin's engines) where they report, else from it."""


def _phase_sources(metric: str, by: str, selector: str, window: str) -> str:
    """``sum by (by) (rate(metric))`` over every engine job, else over the gateway's jobs.

    Why one source, summed across jobs: the gateway (vLLM's per-request figures) and the vLLM
    plugin both record ``stagelens_engine_phase_duration_seconds`` for the same requests, so
    adding the two would count each request twice; and a fleet percentile needs every
    engine's buckets added before ``histogram_quantile`` (the larger of per-job quantiles is
    no percentile of anything). The plugin's series where it reports, else the gateway's."""
    plugin = f'{metric}{{{selector}, job!~"{GATEWAY_JOBS}"}}'
    gateway = f'{metric}{{{selector}, job=~"{GATEWAY_JOBS}"}}'
    return f"sum by ({by}) (rate({plugin}[{window}])) or sum by ({by}) (rate({gateway}[{window}]))"


def engine_phase_quantile(q: float, by: str, selector: str, window: str = RATE) -> str:
    """Fleet quantile of the engine phases: ``histogram_quantile`` over the buckets of every
    engine added together, from one source (see ``_phase_sources``)."""
    by_le = f"{by}, le" if by else "le"
    buckets = _phase_sources(f"{sc.ENGINE_PHASE_DURATION}_bucket", by_le, selector, window)
    return f"histogram_quantile({q}, {buckets})"


def engine_phase_mean(by: str, selector: str, window: str = RATE) -> str:
    """Fleet mean engine phase time, from one source (see ``_phase_sources``)."""
    m = sc.ENGINE_PHASE_DURATION
    return (
        f"({_phase_sources(f'{m}_sum', by, selector, window)}) / "
        f"({_phase_sources(f'{m}_count', by, selector, window)})"
    )


def as_model(expr: str) -> str:
    """vLLM's ``model_name`` copied to ``model``."""
    return f'label_replace({expr}, "{sc.LABEL_MODEL}", "$1", "{sc.VLLM_MODEL_NAME}", "(.*)")'


def as_uuid(expr: str) -> str:
    """DCGM's ``UUID`` copied to ``uuid``."""
    return f'label_replace({expr}, "{sc.LABEL_UUID}", "$1", "{sc.DCGM_UUID}", "(.*)")'


def engine_gauge(ours: str, vllm: str, op: str = "max") -> str:
    """A per-engine gauge from the vLLM plugin, else vLLM's own, keyed by (instance, model):
    the plugin serves on vLLM's /metrics, so both carry the engine's ``instance``."""
    by = f"instance, {sc.LABEL_MODEL}"
    return (
        f"{op} by ({by}) ({ours}{{{MODEL}, {ENGINE}}}) or "
        f"{op} by ({by}) ({as_model(f'{vllm}{{{VLLM_MODEL}, {ENGINE}}}')})"
    )


def engine_counter_rate(ours: str, vllm: str) -> str:
    """A per-engine counter rate from the plugin, else vLLM's own (see ``engine_gauge``)."""
    by = f"instance, {sc.LABEL_MODEL}"
    return (
        f"sum by ({by}) (rate({ours}{{{MODEL}, {ENGINE}}}[{RATE}])) or "
        f"sum by ({by}) ({as_model(f'rate({vllm}{{{VLLM_MODEL}, {ENGINE}}}[{RATE}])')})"
    )


def gpu_gauge(ours: str, dcgm: str, dcgm_scale: str = "") -> str:
    """A per-GPU gauge from stagelens' exporter, else DCGM's, keyed by (uuid, gpu)."""
    by = f"{sc.LABEL_UUID}, {sc.LABEL_GPU}"
    return (
        f"max by ({by}) ({ours}{{{GPU_WHERE}}}) or "
        f"max by ({by}) ({as_uuid(f'{dcgm}{{{GPU_WHERE}}}')}){dcgm_scale}"
    )
