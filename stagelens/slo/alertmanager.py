"""The Alertmanager configuration that goes with the alerts: routing by severity, and the
inhibitions that make one cause one page (``deploy/alertmanager/alertmanager.yaml``).

Why generated from the SLO config: the inhibitions name alerts (the rules' own names, from
``alert_names``) and the labels the rules keep (``SloConfig.aggregation_labels``); written by
hand they drift the day an alert is renamed or an aggregation label added.

What it does, and why:
- ``severity="page"`` goes to the ``page`` receiver (a person is woken), ``ticket`` to the
  ``ticket`` receiver; both grouped by alert name and environment, so that one burn over
  three models is one notification.
- Every backend gone (StagelensNoBackendUp) or the gateway gone (StagelensGatewayAbsent)
  holds back the SLO burn pages and tickets of the same cluster and namespace: each request
  then fails or is never counted, and five burn alerts would page for one cause.
- Each of them also holds back the tickets its job's targets open (one backend down, a
  target lost, its telemetry failing): the page already says the whole job is gone.
- A page holds back the ticket of the same alert and series (a burn that trips both).

The receivers' URLs are placeholders (``SloConfig.deploy.page_webhook_url``,
``ticket_webhook_url``): point them at your pager and your ticket queue, or replace the
receivers with Alertmanager's own integrations (PagerDuty, Slack, email).
"""

from __future__ import annotations

from typing import Any, Final

from stagelens import semconv as sc
from stagelens.slo.alert_names import (
    ALERT_BACKEND_DOWN,
    ALERT_GATEWAY_ABSENT,
    ALERT_GPU_COLLECTOR_DOWN,
    ALERT_NO_BACKEND_UP,
    ALERT_SLI_COUNTERS_ABSENT,
    ALERT_SPANS_DROPPED,
    ALERT_STAGE_OVER_BUDGET,
    ALERT_TARGET_DOWN,
    ALERT_TARGET_VANISHED,
    ALERT_TELEMETRY_ERRORS,
    BURN_ALERTS,
)
from stagelens.slo.config import SloConfig

RECEIVER_PAGE: Final = "page"
RECEIVER_TICKET: Final = "ticket"
ALERTMANAGER_FILE: Final = "alertmanager.yaml"

CAUSES: Final[tuple[str, ...]] = (ALERT_NO_BACKEND_UP, ALERT_GATEWAY_ABSENT)
"""Alerts for a whole job gone: while one fires, the symptoms it causes are held back."""
SYMPTOMS: Final[tuple[str, ...]] = (
    *BURN_ALERTS.values(),
    sc.ALERT_TTFT_P95_HIGH,
    ALERT_STAGE_OVER_BUDGET,
)
"""What every request failing (or no request counted) in a namespace sets off."""
JOB_TICKETS: Final[tuple[str, ...]] = (
    ALERT_BACKEND_DOWN,
    ALERT_TARGET_DOWN,
    ALERT_TARGET_VANISHED,
    ALERT_GPU_COLLECTOR_DOWN,
    ALERT_SLI_COUNTERS_ABSENT,
    ALERT_SPANS_DROPPED,
    ALERT_TELEMETRY_ERRORS,
)
"""Tickets about one job's targets: a page for the whole job says more."""
SAME_SERIES: Final[tuple[str, ...]] = ("model", "sli", "prompt_size", "stage", "tenant", "job")
"""Labels beside ``alertname`` and the environment that tell two series of one alert apart
(a missing label is equal to a missing label)."""


def _one_of(names: tuple[str, ...]) -> str:
    return f'alertname=~"{"|".join(names)}"'


def render_alertmanager(cfg: SloConfig) -> dict[str, Any]:
    """The Alertmanager configuration as a mapping (``route``, ``receivers``,
    ``inhibit_rules``)."""
    env = list(cfg.aggregation_labels)
    d = cfg.deploy
    return {
        "route": {
            "receiver": RECEIVER_TICKET,
            "group_by": ["alertname", *env],
            "group_wait": "30s",
            "group_interval": "5m",
            "repeat_interval": "12h",
            "routes": [
                {
                    "receiver": RECEIVER_PAGE,
                    "matchers": ['severity="page"'],
                    "repeat_interval": "1h",
                },
                {"receiver": RECEIVER_TICKET, "matchers": ['severity="ticket"']},
            ],
        },
        "receivers": [
            {
                "name": RECEIVER_PAGE,
                "webhook_configs": [{"url": d.page_webhook_url, "send_resolved": True}],
            },
            {
                "name": RECEIVER_TICKET,
                "webhook_configs": [{"url": d.ticket_webhook_url, "send_resolved": True}],
            },
        ],
        "inhibit_rules": [
            {
                "source_matchers": [_one_of(CAUSES)],
                "target_matchers": [_one_of(SYMPTOMS)],
                "equal": env,
            },
            {
                "source_matchers": [_one_of(CAUSES)],
                "target_matchers": [_one_of(JOB_TICKETS)],
                "equal": [*env, "job"],
            },
            {
                "source_matchers": ['severity="page"'],
                "target_matchers": ['severity="ticket"'],
                "equal": ["alertname", *env, *SAME_SERIES],
            },
        ],
    }
