"""The SLO configuration: one validated object that alerts, recording rules and dashboards share.

Why one model: kubernetes-mixin keeps every threshold in ``config.libsonnet`` so that the
alerts and the dashboards can never disagree; this is the Python equivalent. The TTFT
threshold must be a bucket boundary of ``stagelens_time_to_first_token_seconds`` because the
SLI counts ``le="<threshold>"`` buckets: a threshold between two boundaries would silently
measure a different SLO.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Final

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from stagelens.buckets import TTFT_BUCKETS
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


DEFAULT_TTFT_WINDOWS: Final[tuple[BurnWindow, ...]] = (
    BurnWindow(long="1h", short="5m", factor=14.4, severity="page", **{"for": "2m"}),
    BurnWindow(long="6h", short="30m", factor=6, severity="page", **{"for": "15m"}),
    BurnWindow(long="1d", short="2h", factor=3, severity="ticket", **{"for": "1h"}),
    BurnWindow(long="3d", short="6h", factor=1, severity="ticket", **{"for": "3h"}),
)
"""The contract's four TTFT burn-rate pairs; ``for`` values as Sloth/SRE-workbook suggest."""

DEFAULT_COST_WINDOWS: Final[tuple[BurnWindow, ...]] = (
    BurnWindow(long="1h", short="5m", factor=6, severity="page", **{"for": "2m"}),
    BurnWindow(long="6h", short="30m", factor=2, severity="ticket", **{"for": "15m"}),
)
"""The contract's cost burn pairs: 1.0 means on pace to spend exactly the daily budget."""


class SloConfig(BaseModel):
    """Every threshold the generated alerts and dashboards use. Load with ``load_slo_config``."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    ttft_threshold_seconds: float = 0.5
    """A request meets the TTFT SLO when its TTFT is <= this; must be a TTFT bucket boundary."""
    ttft_objective: float = Field(default=0.95, gt=0, lt=1)
    """Fraction of requests that must meet the threshold over ``period``."""
    period: str = "30d"
    """SLO period (error-budget window)."""
    ttft_burn_windows: tuple[BurnWindow, ...] = DEFAULT_TTFT_WINDOWS
    ttft_p95_for: str = "10m"
    """How long p95 TTFT must stay above the threshold before StagelensTTFTP95High fires."""
    ttft_p95_window: str = "5m"
    """Rate window of the p95 TTFT recording rule."""
    cost_burn_windows: tuple[BurnWindow, ...] = DEFAULT_COST_WINDOWS
    daily_budgets_usd: dict[str, float] = Field(default_factory=dict)
    """Fallback daily budgets per tenant, used where a tenant has no ``stagelens_budget_usd``."""
    stage_budgets_seconds: dict[str, float] = Field(
        default_factory=lambda: dict(DEFAULT_STAGE_BUDGETS_SECONDS)
    )
    """Fallback per-stage latency budgets (the gateway exports its own as a gauge)."""
    stage_budget_for: str = "15m"
    kv_hit_rate_floor: float = Field(default=0.05, ge=0, le=1)
    """Engine prefix-cache hit rate below which StagelensKVCacheHitRateCollapse fires."""
    kv_hit_rate_for: str = "15m"
    gpu_saturation_threshold: float = Field(default=0.95, gt=0, le=1)
    """SM activity (or NVML utilisation) above which a GPU counts as saturated."""
    gpu_saturation_for: str = "15m"
    error_ratio_threshold: float = Field(default=0.05, gt=0, lt=1)
    """Share of 5xx responses that fires StagelensErrorRatioHigh."""
    error_ratio_for: str = "10m"
    backend_job_regex: str = ".*vllm.*"
    """Prometheus ``job`` label of the vLLM backends scraped (StagelensBackendDown)."""
    backend_down_for: str = "2m"
    gpu_hourly_cost_usd: float = Field(default=2.0, ge=0)
    """Price of one GPU-hour, for the dashboards' GPU-time cost per token."""
    runbook_base_url: str = "https://github.com/stagelens/stagelens/blob/main/alerts/runbook.md"

    @field_validator(
        "period",
        "ttft_p95_for",
        "ttft_p95_window",
        "stage_budget_for",
        "kv_hit_rate_for",
        "gpu_saturation_for",
        "error_ratio_for",
        "backend_down_for",
    )
    @classmethod
    def _durations(cls, value: str) -> str:
        return _check_duration(value)

    @field_validator("ttft_threshold_seconds")
    @classmethod
    def _threshold_is_boundary(cls, value: float) -> float:
        if value not in TTFT_BUCKETS:
            raise ValueError(
                f"ttft_threshold_seconds={value} is not a TTFT bucket boundary; "
                f"choose one of {list(TTFT_BUCKETS)}"
            )
        return value

    @field_validator("daily_budgets_usd", "stage_budgets_seconds")
    @classmethod
    def _positive(cls, value: dict[str, float]) -> dict[str, float]:
        bad = {k: v for k, v in value.items() if v <= 0}
        if bad:
            raise ValueError(f"budgets must be > 0, got {bad}")
        return value

    @property
    def error_budget(self) -> float:
        """Allowed fraction of bad requests (1 - objective)."""
        return 1.0 - self.ttft_objective


def slo_config_from_mapping(data: dict[str, Any]) -> SloConfig:
    """Build an SloConfig; raises ConfigurationError (never pydantic's error) when invalid."""
    try:
        return SloConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigurationError(f"invalid SLO config: {exc}") from exc


def load_slo_config(path: Path | None = None) -> SloConfig:
    """Load the SLO config from YAML; ``None`` gives the documented defaults."""
    if path is None:
        return SloConfig()
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigurationError(f"cannot read SLO config {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigurationError(f"SLO config {path} must be a mapping")
    return slo_config_from_mapping(data)
