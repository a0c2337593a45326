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

import re
from pathlib import Path
from typing import Any, Final

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from stagelens import semconv as sc
from stagelens.buckets import INTER_TOKEN_LATENCY_BUCKETS, TTFT_BUCKETS
from stagelens.config import Settings, load_settings
from stagelens.errors import ConfigurationError
from stagelens.stages import DEFAULT_STAGE_BUDGETS_SECONDS

_DURATION_RE: Final = re.compile(r"^[1-9][0-9]*(ms|s|m|h|d|w)$")
_UNIT_SECONDS: Final[dict[str, float]] = {
    "ms": 0.001,
    "s": 1,
    "m": 60,
    "h": 3600,
    "d": 86400,
    "w": 604800,
}

SLIS: Final[tuple[str, ...]] = (sc.SLI_AVAILABILITY, sc.SLI_TTFT, sc.SLI_ITL, sc.SLI_GOODPUT)
"""The SLIs the gateway records, in the order the rules and dashboards list them."""

DEFAULT_ITL_THRESHOLD_SECONDS: Final = 0.1
"""The gateway's default ``itl_slo_threshold_seconds`` (used while the setting is absent)."""

SEVERITIES: Final[tuple[str, ...]] = ("page", "ticket")
"""``severity`` label values: page wakes a person, ticket waits for working hours."""


def duration_seconds(duration: str) -> float:
    """Seconds in a Prometheus duration with a single unit (``5m``, ``30d``)."""
    match = _DURATION_RE.match(duration)
    if match is None:
        raise ConfigurationError(f"not a Prometheus duration: {duration!r}")
    unit = match.group(1)
    return int(duration[: -len(unit)]) * _UNIT_SECONDS[unit]


def _check_duration(value: str) -> str:
    duration_seconds(value)
    return value


def gateway_thresholds(settings: Settings | None = None) -> tuple[float, float]:
    """(TTFT, ITL) thresholds in seconds the gateway judges requests by: ``settings``, or
    the ``STAGELENS_*`` environment the gateway reads."""
    settings = settings if settings is not None else load_settings()
    itl = getattr(settings, "itl_slo_threshold_seconds", DEFAULT_ITL_THRESHOLD_SECONDS)
    return float(settings.ttft_slo_threshold_seconds), float(itl)


class BurnWindow(BaseModel):
    """One multi-window multi-burn-rate pair (Google SRE workbook, chapter 5, as in Sloth)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    long: str
    short: str
    factor: float = Field(gt=0)
    severity: str
    for_: str = Field(default="0s", alias="for")

    @field_validator("long", "short")
    @classmethod
    def _valid_window(cls, value: str) -> str:
        return _check_duration(value)

    @field_validator("for_")
    @classmethod
    def _valid_for(cls, value: str) -> str:
        return value if value == "0s" else _check_duration(value)

    @field_validator("severity")
    @classmethod
    def _valid_severity(cls, value: str) -> str:
        if value not in SEVERITIES:
            raise ValueError(f"severity must be one of {SEVERITIES}, got {value!r}")
        return value


DEFAULT_BURN_WINDOWS: Final[tuple[BurnWindow, ...]] = (
    BurnWindow(long="1h", short="5m", factor=14.4, severity="page", **{"for": "2m"}),
    BurnWindow(long="6h", short="30m", factor=6, severity="page", **{"for": "15m"}),
    BurnWindow(long="1d", short="2h", factor=3, severity="ticket", **{"for": "1h"}),
    BurnWindow(long="3d", short="6h", factor=1, severity="ticket", **{"for": "3h"}),
)
"""The contract's four burn-rate pairs. The pairs of one severity make one alert (as Sloth
does); its ``for`` is the shortest of theirs."""

DEFAULT_OBJECTIVES: Final[dict[str, float]] = {
    sc.SLI_AVAILABILITY: 0.995,
    sc.SLI_TTFT: 0.95,
    sc.SLI_ITL: 0.95,
    sc.SLI_GOODPUT: 0.90,
}
"""Share of requests that must be good over the period, per SLI (TTFT: the contract's 95 %)."""


class DeployConfig(BaseModel):
    """What the generated Kubernetes manifests need to know about the cluster."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    monitoring_namespace: str = "monitoring"
    """Namespace of the PrometheusRule and the dashboard ConfigMaps."""
    namespace: str = "stagelens"
    """Namespace the gateway and vLLM run in; the monitors select only it."""
    release_label: str = "kube-prometheus-stack"
    """``release`` label kube-prometheus-stack selects rules and monitors by."""
    gateway_image: str = "ghcr.io/stagelens/stagelens:0.1.0"
    gateway_replicas: int = Field(default=2, ge=1)
    vllm_image: str = "vllm/vllm-openai:v0.11.0"
    vllm_model: str = "meta-llama/Llama-3.1-8B-Instruct"
    served_model_name: str = "llama-3.1-8b"
    vllm_replicas: int = Field(default=2, ge=1)
    gpus_per_vllm: int = Field(default=1, ge=1)


class SloConfig(BaseModel):
    """Every threshold the generated alerts and dashboards use. Load with ``load_slo_config``."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", populate_by_name=True, validate_default=True
    )

    ttft_threshold_seconds: float = Field(default_factory=lambda: gateway_thresholds()[0])
    """A streamed request meets the TTFT SLO when its TTFT is <= this. Always the gateway's
    ``STAGELENS_TTFT_SLO_THRESHOLD_SECONDS``; must be a TTFT bucket boundary."""
    itl_threshold_seconds: float = Field(default_factory=lambda: gateway_thresholds()[1])
    """A streamed request meets the ITL SLO when its mean inter-token latency is <= this.
    Always the gateway's ``STAGELENS_ITL_SLO_THRESHOLD_SECONDS``; an ITL bucket boundary."""
    objectives: dict[str, float] = Field(default_factory=lambda: dict(DEFAULT_OBJECTIVES))
    """SLI -> objective; every SLI of ``SLIS`` gets a burn-rate alert."""
    period: str = "30d"
    """SLO period (error-budget window)."""
    burn_windows: tuple[BurnWindow, ...] = DEFAULT_BURN_WINDOWS
    min_requests: int = Field(default=30, ge=1)
    """A burn-rate pair (and the p95 ticket) needs at least this many requests in its long
    window: a model with three requests an hour, all slow, does not page anyone."""
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
    backend_job_regex: str = ".*vllm.*"
    """Prometheus ``job`` of the vLLM backends (ServiceMonitor: the Service's name)."""
    backend_down_for: str = "5m"
    no_backend_for: str = "2m"
    gateway_job_regex: str = ".*gateway.*"
    """Prometheus ``job`` of the instrumented gateway."""
    gateway_absent_for: str = "2m"
    self_monitoring_for: str = "15m"
    """Spans dropped, telemetry errors: how long they must go on before a ticket."""
    gpu_collector_down_for: str = "10m"
    billing_drift_threshold: float = Field(default=0.05, gt=0, lt=1)
    """Share of generated output tokens left unbilled (or billed but not generated) that
    opens a StagelensBillingDrift ticket."""
    billing_drift_min_tokens: int = Field(default=1000, ge=1)
    """Generated tokens an hour below which drift is not judged."""
    billing_drift_for: str = "1h"
    gpu_hourly_cost_usd: float = Field(default=2.0, ge=0)
    """Price of one GPU-hour, for the dashboards' GPU-time cost per token."""
    runbook_base_url: str = "https://github.com/stagelens/stagelens/blob/main/alerts/runbook.md"
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
        "no_backend_for",
        "gateway_absent_for",
        "self_monitoring_for",
        "gpu_collector_down_for",
        "billing_drift_for",
    )
    @classmethod
    def _durations(cls, value: str) -> str:
        return _check_duration(value)

    @field_validator("ttft_threshold_seconds")
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

    @field_validator("objectives")
    @classmethod
    def _every_sli(cls, value: dict[str, float]) -> dict[str, float]:
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
        return self

    def error_budget(self, sli: str) -> float:
        """Allowed fraction of bad requests of ``sli`` (1 - objective)."""
        return 1.0 - self.objectives[sli]

    def windows_of(self, severity: str) -> tuple[BurnWindow, ...]:
        """The burn-rate pairs of one severity, in config order."""
        return tuple(w for w in self.burn_windows if w.severity == severity)

    def burn_windows_used(self) -> list[str]:
        """Every distinct window of the burn-rate pairs, short ones first per pair."""
        seen: dict[str, None] = {}
        for window in self.burn_windows:
            seen.setdefault(window.short, None)
            seen.setdefault(window.long, None)
        return list(seen)


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
