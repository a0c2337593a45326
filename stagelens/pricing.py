"""Token prices and the cost of a request.

Why cached input has its own rate: providers bill prompt tokens served from the prefix cache
at a discount, and some bill the tokens written to the cache at a premium (Anthropic).
``input_tokens`` *includes* both (OpenAI usage semantics), so the cost is
``(input - cached - written) * input_rate + cached * cached_rate + written * cache_write_rate
+ output * output_rate``: each token is billed exactly once.

Price table YAML (dollars per 1M tokens; ``"*"`` is the fallback for unlisted models;
``cached_input`` and ``cache_write`` default to the ``input`` rate)::

    models:
      tiny:   {input: 0.50, output: 2.00, cached_input: 0.25}
      claude: {input: 3.00, output: 15.00, cached_input: 0.30, cache_write: 3.75}
      "*":    {input: 1.00, output: 4.00, cached_input: 0.50}
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import yaml

from stagelens.errors import ConfigurationError

PER_TOKENS: Final = 1_000_000
"""Prices are quoted per this many tokens."""
FALLBACK_MODEL: Final = "*"
"""Price-table key used for models without their own entry."""


@dataclass(frozen=True, slots=True)
class Price:
    """Dollars per 1M input, output, cached-input and cache-write tokens (``cache_write``
    None: the input rate)."""

    input: float
    output: float
    cached_input: float
    cache_write: float | None = None

    def __post_init__(self) -> None:
        for field_name in ("input", "output", "cached_input", "cache_write"):
            value = getattr(self, field_name)
            if field_name == "cache_write" and value is None:
                continue
            if not isinstance(value, int | float) or value < 0:
                raise ConfigurationError(f"price {field_name} must be a number >= 0: {value!r}")

    @property
    def cache_write_rate(self) -> float:
        """Dollars per 1M tokens written to the prompt cache."""
        return self.input if self.cache_write is None else self.cache_write


DEFAULT_PRICE: Final = Price(input=1.00, output=4.00, cached_input=0.50)
"""The documented default: output costs 4x input, cached input half of input."""


@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens of one request; ``input_tokens`` includes ``cached_input_tokens`` and
    ``cache_write_input_tokens``, ``output_tokens`` includes ``reasoning_output_tokens``."""

    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0
    reasoning_output_tokens: int = 0
    """Of the output, the tokens the model spent thinking: billed as output (the cost does
    not depend on them), counted apart so that a tenant's thinking share can be told."""
    cache_write_input_tokens: int = 0
    """Of the input, the tokens written to the prompt cache (computed, and kept for later
    requests to read): billed at the price table's ``cache_write`` rate."""

    @property
    def uncached_input_tokens(self) -> int:
        """Input tokens that were actually computed (never negative)."""
        return max(self.input_tokens - self.cached_input_tokens, 0)


class PriceTable:
    """Per-model prices with a fallback; immutable after construction."""

    __slots__ = ("_prices",)

    def __init__(self, prices: Mapping[str, Price] | None = None) -> None:
        table = dict(prices or {})
        table.setdefault(FALLBACK_MODEL, DEFAULT_PRICE)
        self._prices: dict[str, Price] = table

    @classmethod
    def default(cls) -> PriceTable:
        """The documented default table (every model at DEFAULT_PRICE)."""
        return cls()

    @classmethod
    def from_mapping(cls, data: object) -> PriceTable:
        """Build from parsed YAML; raises ConfigurationError naming the bad entry."""
        if not isinstance(data, Mapping) or not isinstance(data.get("models"), Mapping):
            raise ConfigurationError("price table must be a mapping with a 'models' mapping")
        prices: dict[str, Price] = {}
        for model, entry in data["models"].items():
            if not isinstance(entry, Mapping):
                raise ConfigurationError(f"price table entry {model!r} must be a mapping")
            unknown = set(entry) - {"input", "output", "cached_input", "cache_write"}
            if unknown or "input" not in entry or "output" not in entry:
                raise ConfigurationError(
                    f"price table entry {model!r} needs input and output "
                    f"(and optionally cached_input, cache_write); unknown keys: "
                    f"{sorted(unknown)}"
                )
            prices[str(model)] = Price(
                input=entry["input"],
                output=entry["output"],
                cached_input=entry.get("cached_input", entry["input"]),
                cache_write=entry.get("cache_write"),
            )
        return cls(prices)

    @classmethod
    def load(cls, path: str | Path) -> PriceTable:
        """Read a YAML price table file."""
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise ConfigurationError(f"cannot read price table {path}: {exc}") from exc
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigurationError(f"price table {path} is not valid YAML: {exc}") from exc
        return cls.from_mapping(data)

    def price(self, model: str) -> Price:
        """The model's price, or the fallback's."""
        return self._prices.get(model) or self._prices[FALLBACK_MODEL]

    def cost(self, model: str, usage: Usage) -> float:
        """Dollars for ``usage`` of ``model``; cached and cache-written input are billed
        once each, at their own rates (the written tokens never more than the input that
        was not read from the cache)."""
        p = self.price(model)
        computed = usage.uncached_input_tokens
        written = min(usage.cache_write_input_tokens, computed)
        return (
            (computed - written) * p.input
            + written * p.cache_write_rate
            + usage.cached_input_tokens * p.cached_input
            + usage.output_tokens * p.output
        ) / PER_TOKENS
