"""Settings, parsed once from ``STAGELENS_*`` environment variables and keyword arguments.

Why validated at construction: a bad threshold or budget must fail when the service starts,
never on a request. Settings are frozen; pass a new object to change them.
"""

from __future__ import annotations

import os
from bisect import bisect_left
from pathlib import Path
from typing import Annotated, Any, Final, overload

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from stagelens import semconv
from stagelens.buckets import INTER_TOKEN_LATENCY_BUCKETS, ttft_buckets
from stagelens.errors import ConfigurationError
from stagelens.stages import DEFAULT_STAGE_BUDGETS_SECONDS
from stagelens.tail_sampling import EXEMPLAR_REFRESH_SECONDS

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


DEFAULT_PROMPT_SIZE_BOUNDS: Final[tuple[int, ...]] = (1024, 8192, 32768)
"""Default ``prompt_size`` bounds (input tokens): a chat turn, a document, a long context."""
DEFAULT_TTFT_CLASS_THRESHOLDS: Final[dict[str, float]] = {"8192": 1.0, "32768": 2.5, "+Inf": 5.0}
"""Default TTFT thresholds of the larger prompt-size classes: prefill time grows with the
prompt, so a long prompt is judged by a longer wait (``<= 1024`` keeps the 0.5 s default)."""
MAX_PROMPT_SIZE_BOUNDS: Final = 10
"""Cap on configured prompt-size bounds: each adds a class to the TTFT histogram's and the
SLI counters' series of every model (cardinality bound)."""


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
    answer_slo_threshold_seconds: float = Field(default=10.0, gt=0)
    """Time-to-first-answer-token SLO threshold (the ``answer`` SLI): a streamed request
    whose first answer token (not reasoning) came later than this, or never came because
    the stream failed or was cut while the model was thinking, is bad. Generous by default
    (10 s): thinking is the product of a reasoning model; set it to what your users wait.
    Always made a bucket boundary of ``stagelens_time_to_first_answer_token_seconds``."""
    itl_slo_threshold_seconds: float = Field(default=0.1, gt=0)
    """ITL symptom threshold: the dashed line of the inter-token latency charts; no alert
    reads it. Must be a bucket boundary of that histogram
    (``buckets.INTER_TOKEN_LATENCY_BUCKETS``), so that the histogram can be read against it.
    The ``itl`` SLI judges each request by its worst gap instead
    (``itl_stall_threshold_seconds``)."""
    itl_stall_threshold_seconds: float = Field(default=1.0, gt=0)
    """A streamed request with two or more output events is bad for the ``itl`` SLI when
    its *worst* inter-token gap exceeds this (a stall). Why the worst, not the mean: a user
    watching 30 tokens arrive 10 ms apart and then a 2 s freeze saw the freeze, which a
    mean of ~75 ms hides."""
    prompt_size_bounds: Annotated[tuple[int, ...], NoDecode] = DEFAULT_PROMPT_SIZE_BOUNDS
    """Bounds (input tokens) of the ``prompt_size`` classes on the TTFT histogram and the
    SLI counters: a request's class is the smallest bound >= its input tokens, ``+Inf``
    above the last, ``unknown`` when its input tokens are not known. Environment:
    comma-separated (``STAGELENS_PROMPT_SIZE_BOUNDS=1024,8192,32768``). Strictly increasing,
    positive, at most ``MAX_PROMPT_SIZE_BOUNDS``. Why classes: prefill grows with the
    prompt, so one TTFT objective for every prompt lets a tenant of 100k-token prompts burn
    everyone's budget."""
    ttft_slo_thresholds_seconds: dict[str, float] = Field(
        default_factory=lambda: dict(DEFAULT_TTFT_CLASS_THRESHOLDS)
    )
    """TTFT SLO threshold per ``prompt_size`` class (a bound as a decimal string, ``+Inf``
    or ``unknown``); a class not named uses ``ttft_slo_threshold_seconds``. Environment:
    JSON. Each must be a boundary of the TTFT histogram (``buckets.ttft_buckets``) so that
    the alerts can read the histogram against it. Left at its default, the classes the
    bounds no longer make are dropped; set, every key must be a class."""
    client_left_bad_after_seconds: float = Field(default=10.0, gt=0)
    """A request whose client left before receiving its whole answer is recorded with
    ``code="499"``. It is bad for the ``availability`` SLI when the gateway had spent longer
    than this on it when the departure was noticed (the client likely timed out on a hang);
    sooner, it is left out (the client changed its mind). Why a threshold: a user closing a
    tab is no outage, a hang every client times out on is."""
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
    tail_exemplar_refresh_seconds: float = Field(default=EXEMPLAR_REFRESH_SECONDS, gt=0)
    """With the tail sampler: a request-duration bucket of a model that no kept trace filled
    for this long gets the next request in it kept as its exemplar, and the slowest request
    of each model in each window this long is kept. About one Prometheus scrape interval:
    set it to yours, so that each scrape finds a fresh exemplar that opens a trace. Read
    once per registry, as its instruments are made (the first ``Telemetry`` on it)."""
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

    @field_validator("prompt_size_bounds", mode="before")
    @classmethod
    def _bounds_from_text(cls, value: Any) -> Any:
        if isinstance(value, str):  # the environment's comma-separated list
            parts = [part.strip() for part in value.split(",")]
            try:
                return tuple(int(part) for part in parts if part)
            except ValueError:
                raise ValueError(
                    f"prompt_size_bounds must be comma-separated integers; got {value!r}"
                ) from None
        return value

    @field_validator("prompt_size_bounds")
    @classmethod
    def _bounds_increase(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if len(value) > MAX_PROMPT_SIZE_BOUNDS:
            raise ValueError(
                f"prompt_size_bounds allows at most {MAX_PROMPT_SIZE_BOUNDS} bounds "
                f"(each is a label value on every model); got {len(value)}"
            )
        for before, bound in zip((0, *value), value, strict=False):
            if bound <= before:
                raise ValueError(
                    f"prompt_size_bounds must be positive and strictly increasing; "
                    f"got {bound} after {before} in {list(value)}"
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
        classes = _class_names(self.prompt_size_bounds)
        thresholds = self.ttft_slo_thresholds_seconds
        if "ttft_slo_thresholds_seconds" not in self.model_fields_set:
            # The default names the default bounds' classes: keep those the bounds make.
            thresholds = {k: v for k, v in thresholds.items() if k in classes}
            object.__setattr__(self, "ttft_slo_thresholds_seconds", thresholds)
        edges = ttft_buckets(self.ttft_slo_threshold_seconds)
        for name, seconds in thresholds.items():
            if name not in classes:
                raise ValueError(
                    f"ttft_slo_thresholds_seconds names {name!r}, which is no prompt_size "
                    f"class; the classes are {list(classes)}"
                )
            if seconds not in edges:
                raise ValueError(
                    f"ttft_slo_thresholds_seconds[{name!r}] = {seconds} is no boundary of the "
                    f"TTFT histogram, one of {list(edges)}"
                )
        return self


def _class_names(bounds: tuple[int, ...]) -> tuple[str, ...]:
    return (*map(str, bounds), semconv.PROMPT_SIZE_ABOVE, semconv.PROMPT_SIZE_UNKNOWN)


def prompt_size_classes(settings: Settings) -> tuple[tuple[str, float], ...]:
    """(``prompt_size`` value, TTFT threshold) of every class, in bound order, then
    ``+Inf`` and ``unknown``: the one place the gateway and the generated rules and panels
    read the classes from, so that the labels recorded are the labels alerted on."""
    thresholds = settings.ttft_slo_thresholds_seconds
    default = settings.ttft_slo_threshold_seconds
    return tuple(
        (name, thresholds.get(name, default)) for name in _class_names(settings.prompt_size_bounds)
    )


class PromptSizeClasses:
    """Classify a request by its input tokens, with the TTFT threshold of its class.

    Why an object built once: the request path asks once per request, and a bisect through
    the bounds plus a tuple lookup is all it then costs."""

    __slots__ = ("_bounds", "_by_index", "unknown")

    def __init__(self, settings: Settings) -> None:
        classes = prompt_size_classes(settings)
        self._bounds = list(settings.prompt_size_bounds)
        self._by_index: tuple[tuple[str, float], ...] = classes[:-1]
        """Index ``bisect_left(bounds, tokens)`` -> (class, threshold); the last is ``+Inf``."""
        self.unknown: tuple[str, float] = classes[-1]
        """The class of a request whose input tokens are not known."""

    def of(self, input_tokens: int | None) -> tuple[str, float]:
        """(class, TTFT threshold) of a request with ``input_tokens`` (None: not known)."""
        if input_tokens is None:
            return self.unknown
        return self._by_index[bisect_left(self._bounds, input_tokens)]


def load_settings(settings: Settings | None = None, **overrides: Any) -> Settings:
    """Return ``settings`` (or one built from the environment) with ``overrides`` applied.

    Raises ConfigurationError (never pydantic's ValidationError) on invalid values.
    """
    try:
        if settings is None:
            return Settings(**overrides)
        if not overrides:
            return settings
        given = settings.model_dump()
        if "ttft_slo_thresholds_seconds" not in settings.model_fields_set:
            del given["ttft_slo_thresholds_seconds"]  # the default follows the bounds given
        return Settings(**{**given, **overrides})
    except ValidationError as exc:
        raise ConfigurationError(f"invalid stagelens settings: {exc}") from exc
