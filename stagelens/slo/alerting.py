"""One alerting rule as the generated files write it: labels and annotations.

Why one builder: every alert carries ``severity``, the config's static labels, a summary, a
description, its runbook section and the dashboard to open; built in one place, no alert
can lack one of them.
"""

from __future__ import annotations

from typing import Any, Final

from stagelens.slo.alert_names import DASHBOARD_ENGINE_GPU, DASHBOARD_TOKENS_COST
from stagelens.slo.config import BurnWindow, SloConfig, duration_seconds

Rule = dict[str, Any]

DASHBOARD_VARIABLES: Final[tuple[str, ...]] = ("cluster", "namespace", "model")
"""Variables every dashboard has: an alert carrying the label opens the dashboard on it."""
MORE_VARIABLES: Final[dict[str, tuple[str, ...]]] = {
    DASHBOARD_TOKENS_COST: ("tenant",),
    DASHBOARD_ENGINE_GPU: ("gpu",),
}
"""Variables of one dashboard alone (tests/dashboards checks each exists)."""


def dashboard_url(cfg: SloConfig, dashboard: str) -> str:
    """``<grafana_url>/d/<uid>``, its variables set to the alert's labels where it has them
    (an alert template: Alertmanager and Grafana's alert list fill it in), over the
    dashboard's own time range."""
    names = (*DASHBOARD_VARIABLES, *MORE_VARIABLES.get(dashboard, ()))
    variables = "".join(
        f"{{{{ with $labels.{name} }}}}&var-{name}={{{{ . | urlquery }}}}{{{{ end }}}}"
        for name in names
    )
    return f"{cfg.grafana_url.rstrip('/')}/d/{dashboard}?from=now-1h&to=now{variables}"


def alert_rule(
    cfg: SloConfig,
    name: str,
    expr: str,
    for_: str,
    severity: str,
    summary: str,
    description: str,
    extra_labels: dict[str, str] | None = None,
    *,
    dashboard: str,
) -> Rule:
    rule: Rule = {"alert": name, "expr": expr}
    if for_ != "0s":
        rule["for"] = for_
    rule["labels"] = {"severity": severity, **cfg.alert_labels, **(extra_labels or {})}
    rule["annotations"] = {
        "summary": summary,
        "description": description,
        "runbook_url": f"{cfg.runbook_base_url}#{name.lower()}",
        "dashboard_url": dashboard_url(cfg, dashboard),
    }
    return rule


def shortest_for(windows: tuple[BurnWindow, ...]) -> str:
    fors = [w.for_ for w in windows if w.for_ != "0s"]
    return min(fors, key=duration_seconds) if fors else "0s"
