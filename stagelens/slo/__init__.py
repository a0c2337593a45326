"""SLO generation: the one SLO config and what it renders for Prometheus.

Why a package of its own: none of this runs on a request. It turns ``SloConfig``
(``config``) into recording rules (``recording_rules``), alerts (``alert_rules``, which
gathers the SLO, cost, serving and target alerts of the ``*_alerts`` modules, named in
``alert_names`` and built by ``alerting``), the runbook (``runbook``) and the Prometheus
flags and scrape config the rules need (``prometheus_server``). It imports only the runtime
core; the dashboards read it.
"""
