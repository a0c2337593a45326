"""One runbook section (``Entry``) and the dashboards its panels are opened on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

REQUEST_PATH: Final = "stagelens / Request path"
TOKENS_COST: Final = "stagelens / Tokens and cost"
ENGINE_GPU: Final = "stagelens / Engine and GPU"
SLOS: Final = "stagelens / SLOs"
DASHBOARD_UIDS: Final[dict[str, str]] = {
    REQUEST_PATH: "stagelens-request-path",
    TOKENS_COST: "stagelens-tokens-cost",
    ENGINE_GPU: "stagelens-engine-gpu",
    SLOS: "stagelens-slos",
}
"""Dashboard title -> uid (Grafana opens ``/d/<uid>``)."""

SERVICE: Final = 'resource.service.name = "stagelens-gateway"'


@dataclass(frozen=True)
class Entry:
    """One runbook section."""

    alert: str
    meaning: str
    impact: str
    promql: tuple[str, ...]
    traceql: str
    panels: tuple[tuple[str, str], ...]
    """(dashboard title, panel title) to open."""
    actions: tuple[str, ...]
