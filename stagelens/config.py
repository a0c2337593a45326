"""Settings, parsed once from ``STAGELENS_*`` environment variables and keyword arguments.

Why validated at construction: a bad threshold or budget must fail when the service starts,
never on a request. Settings are frozen; pass a new object to change them.

Each field is the one declaration of a setting: its annotation gives the form its variable
takes (lists comma-separated, maps ``key=value,key=value``, or JSON: ``env_values``), its
``examples`` an example, its docstring the meaning. The refusal of a bad value,
``stagelens config`` and the generated settings reference (``docs/instrumenting.md``) are
all read from it (``settings_forms``, ``settings_table``).
"""

from __future__ import annotations

import os
from bisect import bisect_left
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Final, overload

from pydantic import (
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from stagelens import semconv
from stagelens.env_values import parse_list, parse_map
from stagelens.errors import ConfigurationError
from stagelens.metrics.buckets import INTER_TOKEN_LATENCY_BUCKETS, ttft_buckets
from stagelens.settings_forms import (
    ENV_PREFIX,
    CrossFieldError,
    Source,
    env_value,
    explain,
    kind,
)
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
DEFAULTS_FROM: Final[dict[str, str]] = {
    "capture_message_content": semconv.CAPTURE_MESSAGE_CONTENT_ENV,
}
"""Settings whose default is read from another environment variable, and that variable."""


class Settings(BaseSettings):
    """Everything stagelens can be told. Environment: ``STAGELENS_<FIELD>``; a list is
    comma-separated or a JSON array, a map ``key=value,key=value`` or a JSON object."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, frozen=True, extra="forbid", use_attribute_docstrings=True
    )

    tenants: Annotated[tuple[str, ...], NoDecode] = Field(default=(), examples=["acme,globex"])
    """Tenants that get their own ``tenant`` label value; with none configured, the first
    ``max_tenants`` distinct tenants seen do. Everything else is ``other``."""
    max_tenants: int = Field(default=20, ge=0, le=1000, examples=["50"])
    """Cap on distinct ``tenant`` label values (cardinality bound)."""
    models: Annotated[tuple[str, ...], NoDecode] = Field(default=(), examples=["tiny,tiny-chat"])
    """Models that get their own ``model`` label value; with none configured, the first
    ``max_models`` distinct models answered successfully do. Everything else (a name the
    engine refused, say) is ``other``; ``default_model`` always keeps its name."""
    max_models: int = Field(default=20, ge=0, le=1000, examples=["50"])
    """Cap on distinct ``model`` label values (cardinality bound)."""
    price_table: Path | None = Field(default=None, examples=["/etc/stagelens/prices.yaml"])
    """YAML price table; unset, the documented default prices (see ``stagelens.pricing``)."""
    ttft_slo_threshold_seconds: float = Field(default=0.5, gt=0, examples=["0.8"])
    """TTFT SLO threshold; always made a TTFT histogram bucket boundary."""
    answer_slo_threshold_seconds: float = Field(default=10.0, gt=0, examples=["20"])
    """Time-to-first-answer-token SLO threshold (the ``answer`` SLI): a streamed request
    whose first answer token (not reasoning) came later than this, or never came because
    the stream failed or was cut while the model was thinking, is bad. Generous by default
    (10 s): thinking is the product of a reasoning model; set it to what your users wait.
    Always made a bucket boundary of ``stagelens_time_to_first_answer_token_seconds``."""
    itl_slo_threshold_seconds: float = Field(default=0.1, gt=0, examples=["0.05"])
    """ITL symptom threshold: the dashed line of the inter-token latency charts; no alert
    reads it. Must be a bucket boundary of that histogram
    (``buckets.INTER_TOKEN_LATENCY_BUCKETS``), so that the histogram can be read against it.
    The ``itl`` SLI judges each request by its worst gap instead
    (``itl_stall_threshold_seconds``)."""
    itl_stall_threshold_seconds: float = Field(default=1.0, gt=0, examples=["2"])
    """A streamed request with two or more output events is bad for the ``itl`` SLI when
    its *worst* inter-token gap exceeds this (a stall). Why the worst, not the mean: a user
    watching 30 tokens arrive 10 ms apart and then a 2 s freeze saw the freeze, which a
    mean of ~75 ms hides."""
    prompt_size_bounds: Annotated[tuple[int, ...], NoDecode] = Field(
        default=DEFAULT_PROMPT_SIZE_BOUNDS, examples=["2048,16384,65536"]
    )
    """Bounds (input tokens) of the ``prompt_size`` classes on the TTFT histogram and the
    SLI counters: a request's class is the smallest bound >= its input tokens, ``+Inf``
    above the last, ``unknown`` when its input tokens are not known. Strictly increasing,
    positive, at most ``MAX_PROMPT_SIZE_BOUNDS`` (10). Why classes: prefill grows with the
    prompt, so one TTFT objective for every prompt lets a tenant of 100k-token prompts burn
    everyone's budget."""
    ttft_slo_thresholds_seconds: Annotated[dict[str, float], NoDecode] = Field(
        default_factory=lambda: dict(DEFAULT_TTFT_CLASS_THRESHOLDS),
        examples=["8192=1.0,+Inf=5.0"],
    )
    """TTFT SLO threshold per ``prompt_size`` class (a bound as a decimal string, ``+Inf``
    or ``unknown``); a class not named uses ``ttft_slo_threshold_seconds``. Each must be a
    boundary of the TTFT histogram (``buckets.ttft_buckets``) so that the alerts can read
    the histogram against it. Left at its default, the classes the bounds no longer make
    are dropped; set, every key must be a class."""
    answer_slo_thresholds_seconds: Annotated[dict[str, float], NoDecode] = Field(
        default_factory=dict, examples=["32768=15,+Inf=20"]
    )
    """Answer SLO threshold per ``prompt_size`` class (named as in
    ``ttft_slo_thresholds_seconds``). A class not named gets ``answer_slo_threshold_seconds``
    plus what its TTFT threshold allows beyond ``ttft_slo_threshold_seconds`` (never less):
    a long prompt's prefill delays its first answer token as much as its first token, and
    the thinking that follows does not grow with the prompt. Each is made a bucket boundary
    of ``stagelens_time_to_first_answer_token_seconds``."""
    client_left_bad_after_seconds: float = Field(default=10.0, gt=0, examples=["30"])
    """A request whose client left before receiving its whole answer is recorded with
    ``code="499"``. It is bad for the ``availability`` SLI when the gateway had spent longer
    than this on it when the departure was noticed (the client likely timed out on a hang);
    sooner, it is left out (the client changed its mind). Why a threshold: a user closing a
    tab is no outage, a hang every client times out on is."""
    stage_budgets_seconds: Annotated[dict[str, float], NoDecode] = Field(
        default_factory=lambda: dict(DEFAULT_STAGE_BUDGETS_SECONDS),
        examples=["tokenizer=0.005,inference=1.5"],
    )
    """Latency budget per stage, exported as ``stagelens_stage_budget_seconds``."""
    daily_budgets_usd: Annotated[dict[str, float], NoDecode] = Field(
        default_factory=dict, examples=["acme=100,globex=50"]
    )
    """Daily spend budget per tenant, exported as ``stagelens_budget_usd{window="1d"}``."""
    excluded_paths: Annotated[tuple[str, ...], NoDecode] = Field(
        default=("/metrics", "/health", "/healthz", "/ready"), examples=["/metrics,/health"]
    )
    """Request paths the middleware passes through untouched (no span, no metric, and no
    hook: never name a path your auth, rate-limit or body hook guards)."""
    capture_message_content: bool = Field(
        default_factory=_capture_content_default, examples=["true"]
    )
    """Record prompt/completion text on spans; off unless
    ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true``."""
    default_model: str = Field(default="unknown", examples=["unnamed"])
    """``model`` label for requests whose model was never set (e.g. rejected early)."""
    span_queue_size: int = Field(default=2048, ge=1, examples=["8192"])
    """Bound on spans waiting for export: a dead collector costs at most this much memory."""
    tail_stall_seconds: float = Field(default=1.0, gt=0, examples=["0.5"])
    """With the tail sampler (``OTEL_TRACES_SAMPLER=stagelens_tail``): a streamed request
    with one inter-token gap above this keeps its trace, even when its mean inter-token
    latency met the ITL SLO (a stall the client saw)."""
    tail_slow_seconds: float = Field(default=10.0, gt=0, examples=["5"])
    """With the tail sampler: a request that took longer than this from receipt to last
    byte keeps its trace (the end-to-end threshold; TTFT and ITL are judged by their SLO
    thresholds)."""
    tail_exemplar_refresh_seconds: float = Field(
        default=EXEMPLAR_REFRESH_SECONDS, gt=0, examples=["30"]
    )
    """With the tail sampler: a request-duration bucket of a model that no kept trace filled
    for this long gets the next request in it kept as its exemplar, and the slowest request
    of each model in each window this long is kept. About one Prometheus scrape interval:
    set it to yours, so that each scrape finds a fresh exemplar that opens a trace. Read
    once per registry, as its instruments are made (the first ``Telemetry`` on it)."""
    genai_metrics: bool = Field(default=False, examples=["1"])
    """Also record the GenAI semantic conventions' OpenTelemetry histograms
    (``gen_ai.server.*``, ``gen_ai.client.token.usage``) and export them over OTLP
    (``configure()``; ``exporters/genai_metrics.py``). Off: nothing is created or recorded."""
    genai_metrics_exponential: bool = Field(default=False, examples=["1"])
    """With ``genai_metrics``: aggregate those histograms as base-2 exponential histograms
    (a View on the MeterProvider ``configure()`` builds) instead of the semconv's explicit
    buckets."""
    strict: bool = Field(default=False, examples=["1"])
    """Refuse to start (``ConfigurationError``) when the environment holds a ``STAGELENS_*``
    variable that is no setting, instead of warning about it: a misspelt setting never
    applies in silence."""

    _sources: dict[str, Source] = PrivateAttr(default_factory=dict)

    def __init__(self, **values: Any) -> None:
        super().__init__(**values)
        given = {k for k in values if not k.startswith("_")}  # "_env_prefix" etc. aside
        self._sources = {name: _source(name, given, os.environ) for name in type(self).model_fields}

    @property
    def sources(self) -> Mapping[str, Source]:
        """Where each setting's value came from: ``keyword``, ``environment`` (its
        ``STAGELENS_*`` variable, or the variable ``DEFAULTS_FROM`` names) or ``default``."""
        return self._sources

    @field_validator("*", mode="before")
    @classmethod
    def _from_text(cls, value: Any, info: ValidationInfo) -> Any:
        """A list or map field given as text (its variable, or a keyword): the comma or
        ``key=value`` form, or JSON (``env_values``). Every other value passes as it is."""
        if isinstance(value, str) and info.field_name is not None:
            form = kind(cls.model_fields[info.field_name])
            if form == "list":
                return tuple(parse_list(value))
            if form == "map":
                return parse_map(value)
        return value

    @field_validator("itl_slo_threshold_seconds")
    @classmethod
    def _itl_threshold_is_a_bucket(cls, value: float) -> float:
        if value not in INTER_TOKEN_LATENCY_BUCKETS:
            raise ValueError(
                f"itl_slo_threshold_seconds must be a boundary of the ITL histogram, one of "
                f"{list(INTER_TOKEN_LATENCY_BUCKETS)}; got {value}"
            )
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

    @field_validator("answer_slo_thresholds_seconds")
    @classmethod
    def _thresholds_positive(cls, value: dict[str, float]) -> dict[str, float]:
        bad = {k: v for k, v in value.items() if not v > 0}
        if bad:
            raise ValueError(f"thresholds must be > 0 seconds, got {bad}")
        return value

    @model_validator(mode="after")
    def _tenant_list_fits_cap(self) -> Settings:
        if len(self.tenants) > self.max_tenants:
            raise CrossFieldError(
                f"{len(self.tenants)} tenants configured but max_tenants={self.max_tenants}",
                "tenants",
                "max_tenants",
            )
        if len(self.models) > self.max_models:
            raise CrossFieldError(
                f"{len(self.models)} models configured but max_models={self.max_models}",
                "models",
                "max_models",
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
                raise CrossFieldError(
                    f"ttft_slo_thresholds_seconds names {name!r}, which is no prompt_size "
                    f"class; the classes are {list(classes)}",
                    "ttft_slo_thresholds_seconds",
                    "prompt_size_bounds",
                )
            if seconds not in edges:
                raise CrossFieldError(
                    f"ttft_slo_thresholds_seconds[{name!r}] = {seconds} is no boundary of the "
                    f"TTFT histogram, one of {list(edges)}",
                    "ttft_slo_thresholds_seconds",
                    "ttft_slo_threshold_seconds",
                )
        for name in self.answer_slo_thresholds_seconds:
            if name not in classes:
                raise CrossFieldError(
                    f"answer_slo_thresholds_seconds names {name!r}, which is no prompt_size "
                    f"class; the classes are {list(classes)}",
                    "answer_slo_thresholds_seconds",
                    "prompt_size_bounds",
                )
        return self


def _source(name: str, given: set[str], environ: Mapping[str, str]) -> Source:
    if name in given:
        return "keyword"
    if env_value(environ, name) is not None:
        return "environment"
    if name in DEFAULTS_FROM and env_flag(DEFAULTS_FROM[name]) is not None:
        return "environment"
    return "default"


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


def answer_classes(settings: Settings) -> tuple[tuple[str, float], ...]:
    """(``prompt_size`` value, answer SLO threshold) of every class, in the order of
    ``prompt_size_classes``: the one place the gateway, the answer histogram's buckets and the
    generated rules and panels read them from."""
    named = settings.answer_slo_thresholds_seconds
    base = settings.answer_slo_threshold_seconds
    ttft = settings.ttft_slo_threshold_seconds
    return tuple(
        (name, named.get(name, round(base + max(0.0, seconds - ttft), 9)))
        for name, seconds in prompt_size_classes(settings)
    )


class PromptSizeClasses:
    """Classify a request by its input tokens, with the TTFT threshold of its class.

    Why an object built once: the request path asks once per request, and a bisect through
    the bounds plus a tuple lookup is all it then costs."""

    __slots__ = ("_bounds", "_by_index", "answers", "unknown")

    def __init__(self, settings: Settings) -> None:
        classes = prompt_size_classes(settings)
        self._bounds = list(settings.prompt_size_bounds)
        self._by_index: tuple[tuple[str, float], ...] = classes[:-1]
        """Index ``bisect_left(bounds, tokens)`` -> (class, threshold); the last is ``+Inf``."""
        self.unknown: tuple[str, float] = classes[-1]
        """The class of a request whose input tokens are not known."""
        self.answers: dict[str, float] = dict(answer_classes(settings))
        """Class -> its answer SLO threshold (``answer_classes``)."""

    def of(self, input_tokens: int | None) -> tuple[str, float]:
        """(class, TTFT threshold) of a request with ``input_tokens`` (None: not known)."""
        if input_tokens is None:
            return self.unknown
        return self._by_index[bisect_left(self._bounds, input_tokens)]


def load_settings(settings: Settings | None = None, **overrides: Any) -> Settings:
    """Return ``settings`` (or one built from the environment) with ``overrides`` applied.

    Raises ConfigurationError (never pydantic's errors) on invalid values, naming each
    variable or keyword, what it held, the reason and the expected form with an example.
    """
    if settings is not None and not overrides:
        return settings
    keywords = dict(overrides)
    try:
        if settings is None:
            return Settings(**overrides)
        given = settings.model_dump()
        if "ttft_slo_thresholds_seconds" not in settings.model_fields_set:
            del given["ttft_slo_thresholds_seconds"]  # the default follows the bounds given
        keywords = {k: v for k, v in given.items() if settings.sources.get(k) == "keyword"}
        keywords.update(overrides)
        rebuilt = Settings(**{**given, **overrides})
        keyword: Source = "keyword"
        rebuilt._sources = {**settings.sources, **dict.fromkeys(overrides, keyword)}
        return rebuilt
    except ValidationError as exc:
        # from None: the message says all, and pydantic's own text would only repeat it
        # with less (no variable, no expected form).
        raise ConfigurationError(
            explain(exc, Settings.model_fields, keywords, os.environ)
        ) from None
