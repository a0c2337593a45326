"""The seven canonical request stages and their default latency budgets.

Why an enum of strings: the value is the ``stage`` label and the ``stagelens.stage`` span
attribute verbatim, so ``Stage.TOKENIZER`` and the user-supplied ``"tokenizer"`` are the same
thing, and users' own stage names (plain strings) travel the same path.
"""

from __future__ import annotations

import enum
from typing import Final


class Stage(str, enum.Enum):
    """Canonical stage names, in request order: the ``stage`` label and the
    ``stagelens.stage`` span attribute."""

    GATEWAY = "gateway"
    LOAD_BALANCER = "load_balancer"
    TOKENIZER = "tokenizer"
    ROUTER = "router"
    INFERENCE = "inference"
    POSTPROCESS = "postprocess"
    BILLING = "billing"

    def __str__(self) -> str:
        return self.value


STAGE_ORDER: Final[tuple[Stage, ...]] = tuple(Stage)
"""The stages in the order a request passes through them."""

DEFAULT_STAGE_BUDGETS_SECONDS: Final[dict[str, float]] = {
    Stage.GATEWAY.value: 0.005,
    Stage.LOAD_BALANCER.value: 0.002,
    Stage.TOKENIZER.value: 0.003,
    Stage.ROUTER.value: 0.001,
    Stage.INFERENCE.value: 0.8,
    Stage.POSTPROCESS.value: 0.005,
    Stage.BILLING.value: 0.001,
}
"""Per-stage latency budgets (the well-known breakdown), exported as
``stagelens_stage_budget_seconds`` and used by the dashboards' budget table."""
