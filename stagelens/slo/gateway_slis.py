"""The thresholds and prompt-size classes the gateway judges each request by, read from its
settings: the SLO config takes them from here and refuses to differ."""

from __future__ import annotations

from typing import Final

from stagelens.config import Settings, load_settings

DEFAULT_ITL_THRESHOLD_SECONDS: Final = 0.1
"""The gateway's default ``itl_slo_threshold_seconds`` (used while the setting is absent)."""
DEFAULT_STALL_SECONDS: Final = 1.0
"""The gateway's default ``itl_stall_threshold_seconds`` (used while the setting is absent)."""


def gateway_thresholds(settings: Settings | None = None) -> tuple[float, float]:
    """(TTFT, ITL) thresholds in seconds the gateway judges requests by: ``settings``, or
    the ``STAGELENS_*`` environment the gateway reads."""
    settings = settings if settings is not None else load_settings()
    itl = getattr(settings, "itl_slo_threshold_seconds", DEFAULT_ITL_THRESHOLD_SECONDS)
    return float(settings.ttft_slo_threshold_seconds), float(itl)


def gateway_stall_threshold(settings: Settings | None = None) -> float:
    """The worst inter-token gap (seconds) above which the gateway counts a stream bad for
    the ``itl`` SLI: ``settings``, or the ``STAGELENS_*`` environment."""
    settings = settings if settings is not None else load_settings()
    return float(getattr(settings, "itl_stall_threshold_seconds", DEFAULT_STALL_SECONDS))


def gateway_answer_threshold(settings: Settings | None = None) -> float:
    """The time-to-first-answer-token threshold (seconds) the gateway judges the
    ``answer`` SLI by: ``settings``, or the ``STAGELENS_*`` environment."""
    settings = settings if settings is not None else load_settings()
    return float(settings.answer_slo_threshold_seconds)


DEFAULT_PROMPT_SIZE_BOUNDS: Final[tuple[int, ...]] = (1024, 8192, 32768)
"""The gateway's default ``prompt_size_bounds`` (input tokens), used while the setting is absent."""
DEFAULT_TTFT_CLASS_THRESHOLDS: Final[dict[str, float]] = {"8192": 1.0, "32768": 2.5, "+Inf": 5.0}
"""The gateway's default ``ttft_slo_thresholds_seconds``, used while the setting is absent."""
PROMPT_SIZE_ABOVE: Final = "+Inf"
"""``prompt_size`` of a prompt longer than the last bound."""
PROMPT_SIZE_UNKNOWN: Final = "unknown"
"""``prompt_size`` of a request whose input tokens are not known."""


def gateway_prompt_size_classes(settings: Settings | None = None) -> tuple[tuple[str, float], ...]:
    """(``prompt_size`` value, TTFT threshold) the gateway judges each class by, in bound
    order, ``+Inf`` and ``unknown`` last.

    Why here too: ``stagelens.config.prompt_size_classes`` is the one place both the gateway
    and the rules read the classes from; while a gateway release without it is installed,
    the same rule is applied to the settings' defaults (a class without a threshold of its
    own uses ``ttft_slo_threshold_seconds``)."""
    from stagelens import config

    settings = settings if settings is not None else load_settings()
    helper = getattr(config, "prompt_size_classes", None)
    if helper is not None:
        return tuple((str(c), float(t)) for c, t in helper(settings))
    default = float(settings.ttft_slo_threshold_seconds)
    bounds = getattr(settings, "prompt_size_bounds", DEFAULT_PROMPT_SIZE_BOUNDS)
    by_class = getattr(settings, "ttft_slo_thresholds_seconds", DEFAULT_TTFT_CLASS_THRESHOLDS)
    names = (*(str(b) for b in bounds), PROMPT_SIZE_ABOVE, PROMPT_SIZE_UNKNOWN)
    return tuple((name, float(by_class.get(name, default))) for name in names)


def gateway_answer_classes(settings: Settings | None = None) -> tuple[tuple[str, float], ...]:
    """(``prompt_size`` value, answer SLO threshold) the gateway judges each class's
    ``answer`` SLI by, in the order of ``gateway_prompt_size_classes``
    (``stagelens.config.answer_classes``); with a gateway release that judges every class by
    one threshold, that one for each."""
    from stagelens import config

    settings = settings if settings is not None else load_settings()
    helper = getattr(config, "answer_classes", None)
    if helper is not None:
        return tuple((str(c), float(t)) for c, t in helper(settings))
    flat = gateway_answer_threshold(settings)
    return tuple((name, flat) for name, _ in gateway_prompt_size_classes(settings))
