"""The burn-rate pairs of the SLO alerts, and the Prometheus durations the config is written in."""

from __future__ import annotations

import re
from typing import Final

from pydantic import BaseModel, ConfigDict, Field, field_validator

from stagelens.errors import ConfigurationError

_DURATION_RE: Final = re.compile(r"^[1-9][0-9]*(ms|s|m|h|d|w)$")
_UNIT_SECONDS: Final[dict[str, float]] = {
    "ms": 0.001,
    "s": 1,
    "m": 60,
    "h": 3600,
    "d": 86400,
    "w": 604800,
}

SEVERITIES: Final[tuple[str, ...]] = ("page", "ticket")
"""``severity`` label values: page wakes a person, ticket waits for working hours."""


def duration_seconds(duration: str) -> float:
    """Seconds in a Prometheus duration with a single unit (``5m``, ``30d``)."""
    match = _DURATION_RE.match(duration)
    if match is None:
        raise ConfigurationError(f"not a Prometheus duration: {duration!r}")
    unit = match.group(1)
    return int(duration[: -len(unit)]) * _UNIT_SECONDS[unit]


def check_duration(value: str) -> str:
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
        return check_duration(value)

    @field_validator("for_")
    @classmethod
    def _valid_for(cls, value: str) -> str:
        return value if value == "0s" else check_duration(value)

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

GOODPUT_BURN_WINDOWS: Final[tuple[BurnWindow, ...]] = (
    BurnWindow(long="1h", short="5m", factor=7.2, severity="page", **{"for": "2m"}),
    BurnWindow(long="6h", short="30m", factor=3, severity="page", **{"for": "15m"}),
    BurnWindow(long="1d", short="2h", factor=1.5, severity="ticket", **{"for": "1h"}),
    BurnWindow(long="3d", short="6h", factor=1, severity="ticket", **{"for": "3h"}),
)
"""Goodput's pairs: the contract's windows at factors that page on the same shares of bad
requests as TTFT and ITL (72 % over 1h, 30 % over 6h; tickets 15 % and 10 %). Goodput's
budget is 10 % (a request is bad when it misses either objective, so its objective sits
below theirs), and 14.4 x 10 % = 144 % bad can never happen: the contract's factors would
leave goodput without a fast page."""
