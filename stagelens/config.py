"""Settings, parsed once from ``STAGELENS_*`` environment variables and keyword arguments.

Why validated at construction: a bad threshold or budget must fail when the service starts,
never on a request. Settings are frozen; pass a new object to change them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, overload

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from stagelens import semconv
from stagelens.buckets import INTER_TOKEN_LATENCY_BUCKETS
from stagelens.errors import ConfigurationError
from stagelens.stages import DEFAULT_STAGE_BUDGETS_SECONDS

_ON = frozenset({"1", "true", "yes", "on"})
_OFF = frozenset({"0", "false", "no", "off"})


@overload
def env_flag(name: str, default: bool) -> bool: ...
@overload
def env_flag(name: str, default: None = None) -> bool | None: ...
def env_flag(name: str, default: bool | None = None) -> bool | None:
    """An on/off environment switch: ``1``/``true``/``yes``/``on`` (any case) is True,
    ``0``/``false``/``no``/``off`` is False, anything else (unset included) is ``default``.

    Why one parser: every ``STAGELENS_*`` and ``OTEL_*`` switch reads the same words the
    same way, so a value that turns one on never leaves another off."""
    value = os.environ.get(name, "").strip().lower()
    if value in _ON:
        return True
    if value in _OFF:
        return False
    return default


def _capture_content_default() -> bool:
    return env_flag(semconv.CAPTURE_MESSAGE_CONTENT_ENV, False)


class Settings(BaseSettings):
    """Everything stagelens can be told. Environment: ``STAGELENS_<FIELD>`` (JSON for maps)."""

    model_config = SettingsConfigDict(env_prefix="STAGELENS_", frozen=True, extra="forbid")

    tenants: tuple[str, ...] = ()
    """Tenants that get their own ``tenant`` label value; with none configured, the first
    ``max_tenants`` distinct tenants seen do. Everything else is ``other``."""
    max_tenants: int = Field(default=20, ge=0, le=1000)
    """Cap on distinct ``tenant`` label values (cardinality bound)."""
    models: tuple[str, ...] = ()
    """Models that get their own ``model`` label value; with none configured, the first
    ``max_models`` distinct models answered successfully do. Everything else (a name the
    engine refused, say) is ``other``; ``default_model`` always keeps its name."""
    max_models: int = Field(default=20, ge=0, le=1000)
    """Cap on distinct ``model`` label values (cardinality bound)."""
    price_table: Path | None = None
    """YAML price table; None uses the documented default (see stagelens.pricing)."""
    ttft_slo_threshold_seconds: float = Field(default=0.5, gt=0)
    """TTFT SLO threshold; always made a TTFT histogram bucket boundary."""
    itl_slo_threshold_seconds: float = Field(default=0.1, gt=0)
    """ITL SLO threshold: a streamed request whose mean inter-token latency is above it is
    bad for the ``itl`` SLI. Must be a bucket boundary of
    ``stagelens_inter_token_latency_seconds`` (``buckets.INTER_TOKEN_LATENCY_BUCKETS``), so
    that the histogram can be read against it too."""
    stage_budgets_seconds: dict[str, float] = Field(
        default_factory=lambda: dict(DEFAULT_STAGE_BUDGETS_SECONDS)
    )
    """Latency budget per stage, exported as ``stagelens_stage_budget_seconds``."""
    daily_budgets_usd: dict[str, float] = Field(default_factory=dict)
    """Daily spend budget per tenant, exported as ``stagelens_budget_usd{window="1d"}``."""
    excluded_paths: tuple[str, ...] = ("/metrics", "/health", "/healthz", "/ready")
    """Request paths the middleware passes through untouched (no span, no metric)."""
    capture_message_content: bool = Field(default_factory=_capture_content_default)
    """Record prompt/completion text on spans; off unless
    ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true``."""
    default_model: str = "unknown"
    """``model`` label for requests whose model was never set (e.g. rejected early)."""
    span_queue_size: int = Field(default=2048, ge=1)
    """Bound on spans waiting for export: a dead collector costs at most this much memory."""
    tail_stall_seconds: float = Field(default=1.0, gt=0)
    """With the tail sampler (``OTEL_TRACES_SAMPLER=stagelens_tail``): a streamed request
    with one inter-token gap above this keeps its trace, even when its mean inter-token
    latency met the ITL SLO (a stall the client saw)."""
    tail_slow_seconds: float = Field(default=10.0, gt=0)
    """With the tail sampler: a request that took longer than this from receipt to last
    byte keeps its trace (the end-to-end threshold; TTFT and ITL are judged by their SLO
    thresholds)."""
    genai_metrics: bool = False
    """Also record the GenAI semantic conventions' OpenTelemetry histograms
    (``gen_ai.server.*``, ``gen_ai.client.token.usage``) and export them over OTLP
    (``configure()``; ``exporters/genai_metrics.py``). Off: nothing is created or recorded."""
    genai_metrics_exponential: bool = False
    """With ``genai_metrics``: aggregate those histograms as base-2 exponential histograms
    (a View on the MeterProvider ``configure()`` builds) instead of the semconv's explicit
    buckets."""

    @field_validator("itl_slo_threshold_seconds")
    @classmethod
    def _itl_threshold_is_a_bucket(cls, value: float) -> float:
        if value not in INTER_TOKEN_LATENCY_BUCKETS:
            raise ValueError(
                f"itl_slo_threshold_seconds must be a boundary of the ITL histogram, one of "
                f"{list(INTER_TOKEN_LATENCY_BUCKETS)}; got {value}"
            )
        return value

    @field_validator("stage_budgets_seconds", "daily_budgets_usd")
    @classmethod
    def _positive_values(cls, value: dict[str, float]) -> dict[str, float]:
        bad = {k: v for k, v in value.items() if v < 0}
        if bad:
            raise ValueError(f"budgets must be >= 0, got {bad}")
        return value

    @model_validator(mode="after")
    def _tenant_list_fits_cap(self) -> Settings:
        if len(self.tenants) > self.max_tenants:
            raise ValueError(
                f"{len(self.tenants)} tenants configured but max_tenants={self.max_tenants}"
            )
        if len(self.models) > self.max_models:
            raise ValueError(
                f"{len(self.models)} models configured but max_models={self.max_models}"
            )
        return self


def load_settings(settings: Settings | None = None, **overrides: Any) -> Settings:
    """Return ``settings`` (or one built from the environment) with ``overrides`` applied.

    Raises ConfigurationError (never pydantic's ValidationError) on invalid values.
    """
    try:
        if settings is None:
            return Settings(**overrides)
        if not overrides:
            return settings
        return Settings(**{**settings.model_dump(), **overrides})
    except ValidationError as exc:
        raise ConfigurationError(f"invalid stagelens settings: {exc}") from exc
