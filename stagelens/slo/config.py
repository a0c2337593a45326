"""The SLO configuration: one validated object that alerts, recording rules and dashboards share.

Why one model: kubernetes-mixin keeps every threshold in ``config.libsonnet`` so that the
alerts and the dashboards can never disagree; this is the Python equivalent.

Why the thresholds come from the gateway's settings: the gateway decides, per request,
whether it met the TTFT and ITL objectives (``stagelens_sli_errors_total``), so the rules
and dashboards only show what the gateway decided. A second, independent knob here could
silently describe a different SLO than the one measured; ``SloConfig`` therefore takes
``ttft_threshold_seconds`` and ``itl_threshold_seconds`` from the same ``STAGELENS_*``
settings as the gateway, and refuses a value that differs from them. Each must also be a
boundary of its histogram's default buckets, so the dashboards' ``le`` views and heatmaps
draw the same line.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Final, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from stagelens import semconv as sc
from stagelens.errors import ConfigurationError
from stagelens.metrics.buckets import INTER_TOKEN_LATENCY_BUCKETS, TTFT_BUCKETS
from stagelens.slo.burn_windows import (
    DEFAULT_BURN_WINDOWS,
    GOODPUT_BURN_WINDOWS,
    SEVERITIES,
    BurnWindow,
    check_duration,
    duration_seconds,
)
from stagelens.slo.deploy_config import DeployConfig
from stagelens.slo.gateway_slis import (
    DEFAULT_ITL_THRESHOLD_SECONDS,
    DEFAULT_PROMPT_SIZE_BOUNDS,
    DEFAULT_TTFT_CLASS_THRESHOLDS,
    PROMPT_SIZE_ABOVE,
    PROMPT_SIZE_UNKNOWN,
    gateway_answer_classes,
    gateway_answer_threshold,
    gateway_prompt_size_classes,
    gateway_thresholds,
)
from stagelens.stages import DEFAULT_STAGE_BUDGETS_SECONDS

__all__ = [
    "DEFAULT_BURN_WINDOWS",
    "DEFAULT_ITL_THRESHOLD_SECONDS",
    "DEFAULT_OBJECTIVES",
    "DEFAULT_PROMPT_SIZE_BOUNDS",
    "DEFAULT_TTFT_CLASS_THRESHOLDS",
    "GOODPUT_BURN_WINDOWS",
    "PROMPT_SIZE_ABOVE",
    "PROMPT_SIZE_UNKNOWN",
    "SEVERITIES",
    "SLIS",
    "BurnWindow",
    "DeployConfig",
    "SloConfig",
    "duration_seconds",
    "gateway_answer_threshold",
    "gateway_prompt_size_classes",
    "gateway_thresholds",
    "load_slo_config",
    "slo_config_from_mapping",
]

SLIS: Final[tuple[str, ...]] = (
    sc.SLI_AVAILABILITY,
    sc.SLI_TTFT,
    sc.SLI_ITL,
    sc.SLI_GOODPUT,
    sc.SLI_ANSWER,
)
"""The SLIs the gateway records, in the order the rules and dashboards list them."""

DEFAULT_OBJECTIVES: Final[dict[str, float]] = {
    sc.SLI_AVAILABILITY: 0.995,
    sc.SLI_TTFT: 0.95,
    sc.SLI_ITL: 0.95,
    sc.SLI_GOODPUT: 0.90,
    sc.SLI_ANSWER: 0.95,
}
"""Share of requests that must be good over the period, per SLI (TTFT: the contract's 95 %)."""


class GpuPrice(BaseModel):
    """What one engine's GPUs cost: the price of a GPU-hour, and the GPUs an engine holds."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    usd_per_gpu_hour: float = Field(ge=0)
    gpus: int = Field(default=1, ge=1)
    """GPUs one engine (one vLLM server's engine) holds: tensor x pipeline parallel."""

    def usd_per_engine_second(self) -> float:
        """USD one second of the engine's time costs (all its GPUs)."""
        return self.usd_per_gpu_hour * self.gpus / 3600

    def gpus_float(self) -> float:
        """GPU-seconds in one second of the engine's time."""
        return float(self.gpus)


class SloConfig(BaseModel):
    """Every threshold the generated alerts and dashboards use. Load with ``load_slo_config``."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", populate_by_name=True, validate_default=True
    )

    ttft_threshold_seconds: float = Field(default_factory=lambda: gateway_thresholds()[0])
    """A streamed request meets the TTFT SLO when its TTFT is <= this. Always the gateway's
    ``STAGELENS_TTFT_SLO_THRESHOLD_SECONDS``; must be a TTFT bucket boundary."""
    itl_threshold_seconds: float = Field(default_factory=lambda: gateway_thresholds()[1])
    """The dashed line of the inter-token latency charts (an ITL bucket boundary); no alert
    reads it: the ``itl`` SLI judges each stream by its worst gap (the gateway's
    ``itl_stall_threshold_seconds``). Always the gateway's
    ``STAGELENS_ITL_SLO_THRESHOLD_SECONDS``."""
    answer_threshold_seconds: float = Field(default_factory=gateway_answer_threshold)
    """A streamed request meets the ``answer`` SLO when its first answer token (not
    reasoning) came within this. Always the gateway's
    ``STAGELENS_ANSWER_SLO_THRESHOLD_SECONDS`` (default 10 s, generous: a reasoning model's
    thinking is its product); must be a TTFT bucket boundary."""
    objectives: dict[str, float] = Field(default_factory=lambda: dict(DEFAULT_OBJECTIVES))
    """SLI -> objective; every SLI of ``SLIS`` gets a burn-rate alert. ``answer`` may be
    left out (configs written before it existed): it then gets its default objective."""
    period: str = "30d"
    """SLO period (error-budget window)."""
    burn_windows: tuple[BurnWindow, ...] = DEFAULT_BURN_WINDOWS
    burn_windows_by_sli: dict[str, tuple[BurnWindow, ...]] = Field(
        default_factory=lambda: {sc.SLI_GOODPUT: GOODPUT_BURN_WINDOWS}
    )
    """SLI -> burn-rate pairs of its own, in place of ``burn_windows`` (goodput's default:
    ``GOODPUT_BURN_WINDOWS``). Every pair of every SLI must be reachable: factor x (1 -
    objective) < 1, else the config is refused."""
    min_requests: int = Field(default=30, ge=1)
    """A burn-rate pair (and the p95 ticket) needs at least this many requests in its long
    window: a model with three requests an hour, all slow, does not page anyone."""
    min_bad_events: int = Field(default=5, ge=1)
    """...and at least this many bad requests in its long window. A share alone is noise at
    low traffic: 3 failures of 30 requests an hour are 10 %, 20x a 0.5 % budget, and page
    nobody. Scaled to the budget, this is a request floor: at a pair's threshold (factor x
    budget bad) it takes ``min_bad_events / (factor x budget)`` requests, 70 an hour for the
    availability page (5 / 7.2 %), 7 for TTFT (5 / 72 %, so ``min_requests`` decides)."""
    ttft_thresholds_by_prompt_size: dict[str, float] = Field(
        default_factory=lambda: dict(gateway_prompt_size_classes())
    )
    """``prompt_size`` class -> TTFT threshold. Always the gateway's classes and
    ``STAGELENS_TTFT_SLO_THRESHOLDS_SECONDS`` (``stagelens.config.prompt_size_classes``):
    the gateway judges each request by its class's threshold; each is a TTFT bucket edge."""
    aggregation_labels: tuple[str, ...] = ("cluster", "namespace")
    """Labels every rule keeps, so that staging and production never merge into one SLI."""
    alert_labels: dict[str, str] = Field(default_factory=dict)
    """Static labels on every alert (e.g. ``team``), for Alertmanager routing."""
    ttft_p95_window: str = "5m"
    """Rate window of the p95 TTFT recording rule."""
    ttft_p95_for: str = "30m"
    """How long p95 TTFT must stay above the threshold before StagelensTTFTP95High (a
    ticket) fires."""
    cost_page_multiple: float = Field(default=2.0, gt=1)
    """Page when, at the last hour's (and 5 minutes') pace, a tenant's last-24h spend would
    reach this multiple of its daily cap within ``cost_page_horizon``."""
    cost_page_horizon: str = "1h"
    cost_page_for: str = "5m"
    cost_ticket_for: str = "15m"
    """Ticket when a tenant's spend over the last 24h has been above its cap this long."""
    daily_budgets_usd: dict[str, float] = Field(default_factory=dict)
    """Fallback daily budgets per tenant, used where a tenant has no ``stagelens_budget_usd``."""
    stage_budgets_seconds: dict[str, float] = Field(
        default_factory=lambda: dict(DEFAULT_STAGE_BUDGETS_SECONDS)
    )
    """Fallback per-stage latency budgets (the gateway exports its own as a gauge)."""
    stage_latency_window: str = "5m"
    """Rate window of the budgeted stage latency (p95) the stage budgets are compared with."""
    stage_budget_for: str = "15m"
    kv_hit_rate_drop: float = Field(default=0.5, gt=0, lt=1)
    """StagelensKVCacheHitRateCollapse: the 30m hit rate lost this share of its 6h baseline."""
    kv_hit_rate_min_baseline: float = Field(default=0.1, ge=0, le=1)
    """...and the baseline was at least this (workloads without shared prefixes never fire)."""
    kv_hit_rate_for: str = "15m"
    gpu_saturation_threshold: float = Field(default=0.95, gt=0, le=1)
    """SM activity (stagelens GPM or DCGM) above which a GPU counts as saturated."""
    gpu_saturation_for: str = "15m"
    engine_waiting_threshold: float = Field(default=10, gt=0)
    """Requests waiting in one engine's queue above which it counts as saturated."""
    engine_kv_usage_threshold: float = Field(default=0.9, gt=0, le=1)
    engine_saturation_for: str = "10m"
    backend_job_regex: str = "vllm"
    """Prometheus ``job`` of the vLLM backends: the name ``deploy/`` gives them (the
    PodMonitor's ``app.kubernetes.io/name``). A regex, anchored as Prometheus anchors every
    matcher: ``vllm|vllm-large`` adds a second job; never a pattern such as ``.*vllm.*``
    that also matches jobs of other stacks."""
    gpu_exporter_job_regex: str = "stagelens-gpu-exporter"
    """Prometheus ``job`` of stagelens' GPU exporter (``stagelens gpu-exporter``); a regex."""
    dcgm_job_regex: str = "nvidia-dcgm-exporter|dcgm-exporter"
    """Prometheus ``job`` of NVIDIA's DCGM exporter (the GPU operator's Service, or the
    dcgm-exporter chart's); a regex."""
    backend_down_for: str = "5m"
    target_down_for: str = "5m"
    """StagelensTargetDown: one gateway, GPU-exporter or DCGM target failing its scrapes."""
    target_vanished_window: str = "2h"
    """StagelensTargetVanished: a job with fewer targets scraped than its median over this
    window (removed from service discovery, a pod gone and not replaced) opens a ticket. A
    count, not addresses: a rollout's new pods replace the old ones. It resolves once the
    lower count has lasted half the window, or when the targets come back."""
    target_vanished_for: str = "15m"
    traffic_window: str = "15m"
    """StagelensTrafficStopped: a model that served no request over this window..."""
    traffic_baseline_window: str = "1h"
    """...while it served at least ``min_requests`` in this window one day earlier (the same
    hour yesterday: a model idle every night does not alert every night)..."""
    traffic_stopped_for: str = "30m"
    """...for this long (with the window: paged 45 minutes after the last request)."""
    sli_counters_absent_for: str = "10m"
    """StagelensSLICountersAbsent: requests counted, no SLI counter, for this long."""
    gpu_vanished_hold: str = "1h"
    """StagelensGPUSaturated keeps firing this long for a GPU whose last reading was
    saturated and whose gauge then vanished (exporter or DCGM target gone)."""
    grafana_url: str = "http://localhost:3000"
    """Grafana's base URL: every alert's ``dashboard_url`` is ``<this>/d/<uid>``, with the
    dashboard's ``cluster``, ``namespace`` and ``model`` variables (and ``tenant``, ``gpu``
    where it has them) set to the alert's labels."""
    no_backend_for: str = "2m"
    gateway_job_regex: str = "stagelens-gateway"
    """Prometheus ``job`` of the instrumented gateway: the name ``deploy/`` gives it (the
    ServiceMonitor's ``app.kubernetes.io/name``); a regex, as ``backend_job_regex``. Never
    ``.*gateway.*``: it matches ``prometheus-pushgateway`` too."""
    absence_lookback: str = "1d"
    """StagelensGatewayAbsent and StagelensNoBackendUp judge each (cluster, namespace, job)
    scraped within this long: one that has had no target up since pages, until it has been
    gone this long (a namespace retired on purpose: silence it, or it resolves then)."""
    gateway_absent_for: str = "2m"
    self_monitoring_for: str = "15m"
    """Spans dropped, telemetry errors, metrics split across workers: how long they must go
    on before a ticket."""
    gpu_collector_down_for: str = "10m"
    billing_drift_threshold: float = Field(default=0.05, gt=0, lt=1)
    """Share of generated output tokens left unbilled (or billed but not generated) that
    opens a StagelensBillingDrift ticket."""
    billing_drift_min_tokens: int = Field(default=1000, ge=1)
    """Generated tokens an hour below which drift is not judged."""
    billing_drift_for: str = "1h"
    gpu_hourly_cost_usd: float = Field(default=2.0, ge=0)
    """Price of one GPU-hour, for the dashboards' GPU-time cost per token, and of the
    engines' GPUs (one a model) where ``gpu_prices`` names no price."""
    gpu_prices: dict[str, GpuPrice] = Field(default_factory=dict)
    """Model -> the price of its engines' GPUs: a tenant's GPU cost is its engine seconds
    (``stagelens_engine_seconds_total``) times its model's GPUs times the GPU-hour price."""
    node_gpu_prices: dict[str, GpuPrice] = Field(default_factory=dict)
    """vLLM ``backend`` -> the price of its engine's GPUs, for the engines' busy and idle
    cost (the plugin's series by backend); a backend not named costs as its model."""
    cost_budget_source: Literal["price_table", "gpu"] = "price_table"
    """What the daily spend caps (StagelensCostBudgetBurn) are compared with: the price
    table's cost (``stagelens_cost_usd_total``) or the GPU cost of the tenants' engine time."""
    runbook_base_url: str = "https://github.com/stagelens/stagelens/blob/main/alerts/runbook.md"
    """Where alerts/runbook.md is read: every alert's ``runbook_url`` is ``<this>#<alert>``.
    The default is the ``Runbook`` URL pyproject.toml declares (the project's repository);
    set it to where your copy is served (your fork, your wiki) when you change the SLO
    config, since the runbook is rendered from it."""
    billing_drift_by: tuple[str, ...] = ("cluster",)
    """Labels the billed and the generated output tokens are summed and compared by
    (StagelensBillingDrift). Not ``namespace`` by default: vLLM often runs in a namespace
    of its own, where no gateway bills, and the two sides would never meet. Add it where
    environments share a cluster and each runs its gateway and vLLM in one namespace."""
    deploy: DeployConfig = Field(default_factory=DeployConfig)

    @field_validator(
        "period",
        "ttft_p95_window",
        "ttft_p95_for",
        "cost_page_horizon",
        "cost_page_for",
        "cost_ticket_for",
        "stage_budget_for",
        "stage_latency_window",
        "kv_hit_rate_for",
        "gpu_saturation_for",
        "engine_saturation_for",
        "backend_down_for",
        "target_down_for",
        "target_vanished_window",
        "target_vanished_for",
        "traffic_window",
        "traffic_baseline_window",
        "traffic_stopped_for",
        "sli_counters_absent_for",
        "gpu_vanished_hold",
        "no_backend_for",
        "gateway_absent_for",
        "absence_lookback",
        "self_monitoring_for",
        "gpu_collector_down_for",
        "billing_drift_for",
    )
    @classmethod
    def _durations(cls, value: str) -> str:
        return check_duration(value)

    @field_validator("ttft_threshold_seconds", "answer_threshold_seconds")
    @classmethod
    def _ttft_is_boundary(cls, value: float) -> float:
        if value not in TTFT_BUCKETS:
            raise ValueError(
                f"ttft_threshold_seconds={value} is not a TTFT bucket boundary; "
                f"choose one of {list(TTFT_BUCKETS)}"
            )
        return value

    @field_validator("itl_threshold_seconds")
    @classmethod
    def _itl_is_boundary(cls, value: float) -> float:
        if value not in INTER_TOKEN_LATENCY_BUCKETS:
            raise ValueError(
                f"itl_threshold_seconds={value} is not an ITL bucket boundary; "
                f"choose one of {list(INTER_TOKEN_LATENCY_BUCKETS)}"
            )
        return value

    @field_validator("ttft_thresholds_by_prompt_size")
    @classmethod
    def _class_thresholds_are_boundaries(cls, value: dict[str, float]) -> dict[str, float]:
        bad = {k: v for k, v in value.items() if v not in TTFT_BUCKETS}
        if bad:
            raise ValueError(
                f"ttft_thresholds_by_prompt_size {bad} are not TTFT bucket boundaries; "
                f"choose from {list(TTFT_BUCKETS)}"
            )
        return value

    @field_validator("burn_windows_by_sli")
    @classmethod
    def _known_slis(
        cls, value: dict[str, tuple[BurnWindow, ...]]
    ) -> dict[str, tuple[BurnWindow, ...]]:
        unknown = sorted(set(value) - set(SLIS))
        if unknown:
            raise ValueError(f"burn_windows_by_sli names unknown SLIs {unknown}; use {list(SLIS)}")
        empty = sorted(k for k, v in value.items() if not v)
        if empty:
            raise ValueError(f"burn_windows_by_sli gives no pairs for {empty}")
        return value

    @field_validator("objectives")
    @classmethod
    def _every_sli(cls, value: dict[str, float]) -> dict[str, float]:
        if sc.SLI_ANSWER not in value:
            value = {**value, sc.SLI_ANSWER: DEFAULT_OBJECTIVES[sc.SLI_ANSWER]}
        if set(value) != set(SLIS):
            raise ValueError(f"objectives must name exactly {list(SLIS)}, got {sorted(value)}")
        bad = {k: v for k, v in value.items() if not 0 < v < 1}
        if bad:
            raise ValueError(f"objectives must be between 0 and 1, got {bad}")
        return {sli: value[sli] for sli in SLIS}

    @field_validator("daily_budgets_usd", "stage_budgets_seconds")
    @classmethod
    def _positive(cls, value: dict[str, float]) -> dict[str, float]:
        bad = {k: v for k, v in value.items() if v <= 0}
        if bad:
            raise ValueError(f"budgets must be > 0, got {bad}")
        return value

    @field_validator("burn_windows")
    @classmethod
    def _both_severities(cls, value: tuple[BurnWindow, ...]) -> tuple[BurnWindow, ...]:
        if not value:
            raise ValueError("burn_windows must not be empty")
        return value

    @model_validator(mode="after")
    def _every_burn_can_fire(self) -> SloConfig:
        """Refuse a pair whose threshold no traffic can reach: more than 100 % bad."""
        for sli in SLIS:
            budget = self.error_budget(sli)
            for w in self.windows_for(sli):
                if w.factor * budget >= 1 - 1e-9:  # 10 x (1 - 0.9) is 0.9999999999999998
                    raise ValueError(
                        f"the {sli} SLO (objective {self.objectives[sli]:g}) can never fire "
                        f"its {w.severity} pair {w.long}/{w.short}: burn factor {w.factor:g} x "
                        f"error budget {budget:.4g} = {w.factor * budget:.4g} of requests bad, "
                        "and at most all of them (1.0) can be; lower the factor below "
                        f"{1 / budget:.4g} (burn_windows_by_sli) or the objective"
                    )
        return self

    @model_validator(mode="after")
    def _same_classes_as_the_gateway(self) -> SloConfig:
        theirs = dict(gateway_prompt_size_classes())
        if self.ttft_thresholds_by_prompt_size != theirs:
            raise ValueError(
                f"ttft_thresholds_by_prompt_size={self.ttft_thresholds_by_prompt_size} "
                f"disagrees with the gateway's prompt-size classes {theirs} "
                "(STAGELENS_PROMPT_SIZE_BOUNDS, STAGELENS_TTFT_SLO_THRESHOLDS_SECONDS): the "
                "gateway judges each request by its class's threshold; set them where the "
                "gateway runs and where the rules are rendered, and leave them out of the SLO "
                "config"
            )
        return self

    @model_validator(mode="after")
    def _same_thresholds_as_the_gateway(self) -> SloConfig:
        ttft, itl = gateway_thresholds()
        for name, mine, env, theirs in (
            ("ttft_threshold_seconds", self.ttft_threshold_seconds, "TTFT", ttft),
            ("itl_threshold_seconds", self.itl_threshold_seconds, "ITL", itl),
        ):
            if mine != theirs:
                raise ValueError(
                    f"{name}={mine} disagrees with the gateway's "
                    f"STAGELENS_{env}_SLO_THRESHOLD_SECONDS={theirs}: they are one threshold "
                    f"(the gateway judges each request by it); set "
                    f"STAGELENS_{env}_SLO_THRESHOLD_SECONDS={mine} where the gateway runs "
                    "and where the rules are rendered, and leave it out of the SLO config"
                )
        answer = gateway_answer_threshold()
        if self.answer_threshold_seconds != answer:
            raise ValueError(
                f"answer_threshold_seconds={self.answer_threshold_seconds} disagrees with the "
                f"gateway's STAGELENS_ANSWER_SLO_THRESHOLD_SECONDS={answer}: they are one "
                "threshold; set the variable where the gateway runs and where the rules are "
                "rendered, and leave it out of the SLO config"
            )
        return self

    def gpu_price(self, model: str | None = None) -> GpuPrice:
        """The GPU price of ``model``'s engines (the default one for None)."""
        found = self.gpu_prices.get(model) if model is not None else None
        return found or GpuPrice(usd_per_gpu_hour=self.gpu_hourly_cost_usd)

    def error_budget(self, sli: str) -> float:
        """Allowed fraction of bad requests of ``sli`` (1 - objective)."""
        return 1.0 - self.objectives[sli]

    def windows_for(self, sli: str) -> tuple[BurnWindow, ...]:
        """The burn-rate pairs of ``sli``: its own, else ``burn_windows``."""
        return self.burn_windows_by_sli.get(sli, self.burn_windows)

    def windows_of(self, severity: str, sli: str | None = None) -> tuple[BurnWindow, ...]:
        """The burn-rate pairs of one severity (of ``sli``, else the default pairs), in
        config order."""
        windows = self.burn_windows if sli is None else self.windows_for(sli)
        return tuple(w for w in windows if w.severity == severity)

    def burn_windows_used(self) -> list[str]:
        """Every distinct window of the burn-rate pairs, short ones first per pair."""
        seen: dict[str, None] = {}
        pairs = [*self.burn_windows, *(w for ws in self.burn_windows_by_sli.values() for w in ws)]
        for window in pairs:
            seen.setdefault(window.short, None)
            seen.setdefault(window.long, None)
        return list(seen)

    def request_floor(self, sli: str, window: BurnWindow) -> int:
        """Requests a pair's long window needs before it may fire: ``min_requests``, or the
        requests in which ``min_bad_events`` are the pair's threshold share, the larger."""
        share = window.factor * self.error_budget(sli)
        return max(self.min_requests, math.ceil(self.min_bad_events / share - 1e-9))

    def ttft_classes(self) -> tuple[tuple[str, float], ...]:
        """(``prompt_size``, TTFT threshold), in the gateway's class order."""
        return tuple(self.ttft_thresholds_by_prompt_size.items())

    def answer_classes(self) -> tuple[tuple[str, float], ...]:
        """(``prompt_size``, answer SLO threshold), in the gateway's class order: the
        gateway's (``STAGELENS_ANSWER_SLO_THRESHOLDS_SECONDS``), which judges each request."""
        return gateway_answer_classes()


def slo_config_from_mapping(data: dict[str, Any]) -> SloConfig:
    """Build an SloConfig; raises ConfigurationError (never pydantic's error) when invalid."""
    try:
        return SloConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigurationError(f"invalid SLO config: {exc}") from exc


def load_slo_config(path: Path | None = None) -> SloConfig:
    """Load the SLO config from YAML; ``None`` gives the documented defaults (thresholds from
    the gateway's ``STAGELENS_*`` settings)."""
    if path is None:
        return slo_config_from_mapping({})
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigurationError(f"cannot read SLO config {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigurationError(f"SLO config {path} must be a mapping")
    return slo_config_from_mapping(data)
