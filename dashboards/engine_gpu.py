"""Dashboard 3, "Engine and GPU": prefix cache, KV usage, queues per engine; GPUs.

Why one series per engine and per GPU: the vLLM plugin and vLLM report the same engine, and
stagelens' GPU exporter and DCGM the same GPU. Each panel keys both sources by the same
labels (``instance`` and ``model`` for an engine, ``uuid`` and ``gpu`` for a GPU) before
``or``, so each engine and each GPU is drawn once.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard
from grafana_foundation_sdk.models.dashboard import Dashboard as DashboardModel
from stagelens.dashboards.common import (
    ENGINE,
    MODEL,
    VLLM_MODEL,
    as_model,
    base,
    engine_counter_rate,
    engine_gauge,
    gpu_gauge,
)
from stagelens.dashboards.panels import RATE, timeseries_panel

from stagelens import semconv as sc
from stagelens.slo.config import SloConfig


def _hit_rate() -> str:
    """Engine prefix-cache hit rate per model: the plugin's counters, else vLLM's."""
    ours = (
        f"sum by ({sc.LABEL_MODEL}) (rate({sc.KV_CACHE_HITS}{{{MODEL}, {ENGINE}}}[{RATE}])) / "
        f"sum by ({sc.LABEL_MODEL}) (rate({sc.KV_CACHE_QUERIES}{{{MODEL}, {ENGINE}}}[{RATE}]))"
    )
    hits = as_model(f"rate({sc.VLLM_PREFIX_CACHE_HITS}{{{VLLM_MODEL}, {ENGINE}}}[{RATE}])")
    queries = as_model(f"rate({sc.VLLM_PREFIX_CACHE_QUERIES}{{{VLLM_MODEL}, {ENGINE}}}[{RATE}])")
    vllm = f"sum by ({sc.LABEL_MODEL}) ({hits}) / sum by ({sc.LABEL_MODEL}) ({queries})"
    return f"{ours} or {vllm}"


def engine_gpu(cfg: SloConfig) -> DashboardModel:
    """Dashboard 3: prefix cache, KV usage, scheduler queues per engine; GPU (stagelens or
    DCGM)."""
    cached = f'{sc.TOKENS}{{{MODEL}, {sc.LABEL_TYPE}="{sc.TOKEN_TYPE_CACHED_INPUT}"}}'
    prompt = f'{sc.TOKENS}{{{MODEL}, {sc.LABEL_TYPE}="{sc.TOKEN_TYPE_INPUT}"}}'
    hit_request = (
        f"sum by ({sc.LABEL_MODEL}) (rate({cached}[{RATE}])) / "
        f"sum by ({sc.LABEL_MODEL}) (rate({prompt}[{RATE}]))"
    )
    return (
        base(
            "stagelens-engine-gpu",
            "stagelens / Engine and GPU",
            "vLLM prefix cache, KV usage and queues per engine; GPUs from stagelens NVML or DCGM.",
            cfg,
            engines=True,
        )
        .with_row(dashboard.Row("Engine"))
        .with_panel(
            timeseries_panel(
                "Prefix-cache hit rate",
                "percentunit",
                [(_hit_rate(), "engine {{model}}"), (hit_request, "billed {{model}}")],
                description=(
                    "Engine: prompt tokens found in the prefix cache / looked up (the stagelens "
                    "plugin's counters, else vLLM's own). Billed: cached_input / input tokens."
                ),
            )
        )
        .with_panel(
            timeseries_panel(
                "KV-cache usage",
                "percentunit",
                [
                    (
                        engine_gauge(sc.KV_CACHE_USAGE, sc.VLLM_KV_CACHE_USAGE),
                        "{{instance}} {{model}}",
                    )
                ],
                threshold_lines=((None, "green"), (cfg.engine_kv_usage_threshold, "red")),
                description="KV-cache blocks in use per engine; StagelensEngineSaturated "
                f"(kv_cache) above {cfg.engine_kv_usage_threshold:g}.",
            )
        )
        .with_panel(
            timeseries_panel(
                "Running and waiting requests",
                "short",
                [
                    (
                        engine_gauge(sc.ENGINE_REQUESTS_RUNNING, sc.VLLM_REQUESTS_RUNNING),
                        "running {{instance}} {{model}}",
                    ),
                    (
                        engine_gauge(sc.ENGINE_REQUESTS_WAITING, sc.VLLM_REQUESTS_WAITING),
                        "waiting {{instance}} {{model}}",
                    ),
                ],
                threshold_lines=((None, "green"), (cfg.engine_waiting_threshold, "red")),
                description="Per engine. StagelensEngineSaturated (queue) when waiting stays "
                f"above {cfg.engine_waiting_threshold:g}.",
            )
        )
        .with_panel(
            timeseries_panel(
                "Preemptions",
                "suffix: /s",
                [
                    (
                        engine_counter_rate(sc.ENGINE_PREEMPTIONS, sc.VLLM_PREEMPTIONS),
                        "{{instance}} {{model}}",
                    )
                ],
                description="Requests preempted per second per engine (KV cache exhausted).",
            )
        )
        .with_row(dashboard.Row("GPU"))
        .with_panel(
            timeseries_panel(
                "GPU SM activity vs kernel time",
                "percentunit",
                [
                    (gpu_gauge(sc.GPU_SM_ACTIVE, sc.DCGM_SM_ACTIVE), "SM active gpu {{gpu}}"),
                    (
                        gpu_gauge(sc.GPU_UTILIZATION, sc.DCGM_GPU_UTIL, " / 100"),
                        "kernel running gpu {{gpu}}",
                    ),
                ],
                threshold_lines=((None, "green"), (cfg.gpu_saturation_threshold, "red")),
                description="SM activity (GPM or DCGM_FI_PROF_SM_ACTIVE) is load; NVML "
                "utilisation only says a kernel ran (a one-thread kernel reads 100 %). "
                "StagelensGPUSaturated reads SM activity.",
            )
        )
        .with_panel(
            timeseries_panel(
                "GPU memory used",
                "bytes",
                [
                    (
                        gpu_gauge(sc.GPU_MEMORY_USED, sc.DCGM_FB_USED, " * 1048576"),
                        "gpu {{gpu}} {{uuid}}",
                    )
                ],
            )
        )
        .with_panel(
            timeseries_panel(
                "GPU power",
                "watt",
                [(gpu_gauge(sc.GPU_POWER, sc.DCGM_POWER), "gpu {{gpu}} {{uuid}}")],
            )
        )
        .build()
    )
