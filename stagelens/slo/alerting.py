"""One alerting rule as the generated files write it: labels and annotations.

Why one builder: every alert carries ``severity``, the config's static labels, a summary, a
description, its runbook section and the dashboard to open; built in one place, no alert
can lack one of them.
"""

from __future__ import annotations

from typing import Any

from stagelens.slo.config import BurnWindow, SloConfig, duration_seconds

Rule = dict[str, Any]


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
        "dashboard_url": f"{cfg.grafana_url.rstrip('/')}/d/{dashboard}",
    }
    return rule


def shortest_for(windows: tuple[BurnWindow, ...]) -> str:
    fors = [w.for_ for w in windows if w.for_ != "0s"]
    return min(fors, key=duration_seconds) if fors else "0s"
