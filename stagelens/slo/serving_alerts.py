"""The serving alerts (causes, opened as tickets): a stage over its latency budget, the
prefix cache collapsing, a GPU or an engine saturated."""

from __future__ import annotations

from stagelens import semconv as sc
from stagelens.slo.alert_names import (
    ALERT_ENGINE_SATURATED,
    ALERT_GPU_SATURATED,
    ALERT_KV_HIT_RATE_COLLAPSE,
    ALERT_STAGE_OVER_BUDGET,
    DASHBOARD_ENGINE_GPU,
    DASHBOARD_REQUEST_PATH,
    LABEL_SIGNAL,
    SIGNAL_KV_CACHE,
    SIGNAL_PREEMPTIONS,
    SIGNAL_QUEUE,
)
from stagelens.slo.alerting import Rule, alert_rule
from stagelens.slo.config import SloConfig
from stagelens.slo.record_names import (
    ENGINE_KV_USAGE_RECORD,
    ENGINE_PREEMPTIONS_RECORD,
    ENGINE_WAITING_RECORD,
    GPU_HOST_RECORD,
    GPU_SM_ACTIVE_RECORD,
    HOST,
    INFERENCE_BUDGET_RECORD,
    STAGE_BUDGET_RECORD,
    inference_latency_record,
    kv_hit_ratio_record,
    stage_latency_record,
)
from stagelens.slo.recording_rules import by
from stagelens.slo.slo_alerts import class_thresholds_text


def serving_alerts(cfg: SloConfig) -> list[Rule]:
    stage_on = by(cfg, sc.LABEL_STAGE)
    class_on = by(cfg, sc.LABEL_MODEL, sc.LABEL_PROMPT_SIZE)
    model_on = by(cfg, sc.LABEL_MODEL)
    drop = 1 - cfg.kv_hit_rate_drop
    baseline = f"({kv_hit_ratio_record('6h')} offset 1h)"
    threshold = cfg.gpu_saturation_threshold
    hold = cfg.gpu_vanished_hold
    gpu_on = ", ".join(
        (
            *(label for label in cfg.aggregation_labels if label != "namespace"),
            sc.LABEL_UUID,
            sc.LABEL_GPU,
        )
    )
    return [
        alert_rule(
            cfg,
            ALERT_STAGE_OVER_BUDGET,
            (
                f'{stage_latency_record(cfg.stage_latency_window)}{{{sc.LABEL_STAGE}!="inference"}}'
                f"\n> on ({stage_on})\n{STAGE_BUDGET_RECORD}\nor\n"
                f"label_replace(\n  {inference_latency_record(cfg.stage_latency_window)}\n"
                f"  > on ({class_on})\n  {INFERENCE_BUDGET_RECORD},\n"
                f'  "{sc.LABEL_STAGE}", "inference", "", ""\n)'
            ),
            cfg.stage_budget_for,
            "ticket",
            "Stage {{ $labels.stage }}{{ with $labels.model }} of {{ . }}{{ end }}"
            "{{ with $labels.prompt_size }} (prompt size {{ . }}){{ end }} p95 over its "
            "latency budget",
            (
                "p95 of stage {{ $labels.stage }}{{ with $labels.model }} of {{ . }}{{ end }}"
                "{{ with $labels.prompt_size }} for prompts of class {{ . }}{{ end }} is "
                "{{ $value | humanizeDuration }}, above its budget "
                f"(stagelens_stage_budget_seconds) for {cfg.stage_budget_for}. For inference "
                "this is the time to the first upstream token "
                "(stagelens_upstream_time_to_first_token_seconds), not the decode, per model "
                "and prompt-size class, against the larger of the stage's budget and the "
                f"class's TTFT threshold ({class_thresholds_text(cfg)})."
            ),
            dashboard=DASHBOARD_REQUEST_PATH,
        ),
        alert_rule(
            cfg,
            ALERT_KV_HIT_RATE_COLLAPSE,
            (
                f"{kv_hit_ratio_record('30m')}\n< on ({model_on}) {drop!r} * {baseline}\n"
                f"and on ({model_on})\n{baseline} >= {cfg.kv_hit_rate_min_baseline!r}"
            ),
            cfg.kv_hit_rate_for,
            "ticket",
            "Prefix-cache hit rate of {{ $labels.model }} collapsed",
            (
                "Engine prefix-cache hit rate of {{ $labels.model }} over 30m is "
                "{{ $value | humanizePercentage }}, below "
                f"{drop:g}x its 6h rate of an hour before, for {cfg.kv_hit_rate_for}."
            ),
            dashboard=DASHBOARD_ENGINE_GPU,
        ),
        alert_rule(
            cfg,
            ALERT_GPU_SATURATED,
            # The machine each GPU is read on joined in (one per GPU, as last seen within
            # the hold, so a GPU whose gauge vanished still names its host).
            (
                f"(\n  {GPU_SM_ACTIVE_RECORD} > {threshold!r}\n  or\n"
                f"  last_over_time({GPU_SM_ACTIVE_RECORD}[{hold}]) > {threshold!r}"
                f"\n  unless on ({gpu_on})\n  {GPU_SM_ACTIVE_RECORD}\n)\n"
                f"* on ({gpu_on}) group_left ({HOST})\n"
                f"topk by ({gpu_on}) (1, last_over_time({GPU_HOST_RECORD}[{hold}]))"
            ),
            cfg.gpu_saturation_for,
            "ticket",
            "GPU {{ $labels.gpu }} ({{ $labels.uuid }}) on {{ $labels.host }} saturated",
            (
                "SM activity of GPU {{ $labels.gpu }} ({{ $labels.uuid }}) on "
                "{{ $labels.host }} (stagelens GPM, else DCGM_FI_PROF_SM_ACTIVE) is "
                "{{ $value | humanizePercentage }}, above "
                f"{threshold:g}, for {cfg.gpu_saturation_for}; or that was its last reading "
                f"within {hold} and its gauge has vanished since (exporter or "
                "DCGM target gone: see StagelensTargetVanished, StagelensGPUCollectorDown). "
                "Only GPUs with SM activity readings are judged: GPM (Hopper and newer, "
                "stagelens_gpu_sm_active_ratio) or DCGM's profiling fields; without either, "
                "this alert cannot fire (the Engine and GPU dashboard then draws no SM line)."
            ),
            dashboard=DASHBOARD_ENGINE_GPU,
        ),
        *_engine_alerts(cfg),
    ]


def _engine_alerts(cfg: SloConfig) -> list[Rule]:
    signals = (
        (
            SIGNAL_QUEUE,
            f"{ENGINE_WAITING_RECORD} > {cfg.engine_waiting_threshold!r}",
            "{{ $value }} requests waiting in the busiest engine's queue (threshold "
            f"{cfg.engine_waiting_threshold:g})",
        ),
        (
            SIGNAL_KV_CACHE,
            f"{ENGINE_KV_USAGE_RECORD} > {cfg.engine_kv_usage_threshold!r}",
            "KV cache {{ $value | humanizePercentage }} full in the fullest engine (threshold "
            f"{cfg.engine_kv_usage_threshold:g})",
        ),
        (
            SIGNAL_PREEMPTIONS,
            f"{ENGINE_PREEMPTIONS_RECORD} > 0",
            '{{ $value | printf "%.2f" }} preemptions per second',
        ),
    )
    return [
        alert_rule(
            cfg,
            ALERT_ENGINE_SATURATED,
            expr,
            cfg.engine_saturation_for,
            "ticket",
            f"Engines serving {{{{ $labels.model }}}} saturated ({signal})",
            f"{text} for {{{{ $labels.model }}}}, for {cfg.engine_saturation_for}.",
            {LABEL_SIGNAL: signal},
            dashboard=DASHBOARD_ENGINE_GPU,
        )
        for signal, expr, text in signals
    ]
