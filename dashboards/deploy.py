"""Kubernetes and Grafana provisioning manifests generated from the same config as the rules.

Why generated: kube-prometheus-stack picks rules up from a PrometheusRule and dashboards from
ConfigMaps labelled ``grafana_dashboard: "1"``; copying YAML/JSON into those wrappers by hand
drifts. The reference stack and its monitors (``stagelens.dashboards.k8s``) come from the
same config. ``python -m stagelens.dashboards.deploy`` rewrites ``deploy/``; CI diffs it like
the dashboards.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Final

import yaml
from stagelens.dashboards.build import DASHBOARDS, dump_json, to_dict
from stagelens.dashboards.k8s import monitors, stack

from stagelens import semconv as sc
from stagelens.slo.alert_rules import BlockDumper, render_alerts
from stagelens.slo.alertmanager import ALERTMANAGER_FILE, render_alertmanager
from stagelens.slo.config import SloConfig, load_slo_config
from stagelens.slo.recording_rules import render_rules

PART_OF: Final = {"app.kubernetes.io/part-of": "stagelens"}


def prometheus_rule(cfg: SloConfig) -> dict[str, Any]:
    """One PrometheusRule carrying the recording rules and the alerts."""
    groups = render_rules(cfg)["groups"] + render_alerts(cfg)["groups"]
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "stagelens",
            "namespace": cfg.deploy.monitoring_namespace,
            "labels": {**PART_OF, "release": cfg.deploy.release_label},
        },
        "spec": {"groups": groups},
    }


ALERTMANAGER_SECRET: Final = "alertmanager-stagelens"
"""The Secret an operator-run Alertmanager reads its configuration from (``configSecret``
of the Alertmanager resource; kube-prometheus-stack:
``alertmanager.alertmanagerSpec.configSecret``)."""


def alertmanager_secret(cfg: SloConfig) -> dict[str, Any]:
    """deploy/alertmanager/alertmanager.yaml as the Secret the prometheus-operator reads."""
    text = yaml.dump(render_alertmanager(cfg), Dumper=BlockDumper, sort_keys=False, width=100)
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": ALERTMANAGER_SECRET,
            "namespace": cfg.deploy.monitoring_namespace,
            "labels": dict(PART_OF),
        },
        "type": "Opaque",
        "stringData": {ALERTMANAGER_FILE: text},
    }


def dashboard_config_maps(cfg: SloConfig) -> list[dict[str, Any]]:
    """One ConfigMap per dashboard for the Grafana sidecar."""
    return [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": f"{stem}-dashboard",
                "namespace": cfg.deploy.monitoring_namespace,
                "labels": {**PART_OF, "grafana_dashboard": "1"},
            },
            "data": {f"{stem}.json": dump_json(to_dict(builder(cfg)))},
        }
        for stem, builder in DASHBOARDS.items()
    ]


TRACING_DATASOURCE_UID: Final = "tempo"
"""The tracing data source an exemplar's trace id opens in (Grafana's Tempo, which takes
OTLP; a Jaeger data source works the same way under another uid)."""


def grafana_provisioning() -> dict[str, dict[str, Any]]:
    """Grafana file-provisioning: a Prometheus data source whose exemplars' ``trace_id``
    links to the Tempo data source beside it, and the dashboards folder.

    Why the link lives on the data source: a latency panel asks Prometheus for exemplars,
    and Grafana turns an exemplar label into a link only where the Prometheus data source
    names it in ``exemplarTraceIdDestinations``; without it the dots show a bare hex id.
    """
    return {
        "datasources/stagelens.yaml": {
            "apiVersion": 1,
            "datasources": [
                {
                    "name": "Prometheus",
                    "type": "prometheus",
                    "uid": "prometheus",
                    "access": "proxy",
                    "url": "http://localhost:9090",
                    "isDefault": True,
                    "jsonData": {
                        "exemplarTraceIdDestinations": [
                            {
                                "name": sc.EXEMPLAR_TRACE_ID,
                                "datasourceUid": TRACING_DATASOURCE_UID,
                            }
                        ]
                    },
                },
                {
                    "name": "Tempo",
                    "type": "tempo",
                    "uid": TRACING_DATASOURCE_UID,
                    "access": "proxy",
                    "url": "http://localhost:3200",
                },
            ],
        },
        "dashboards/stagelens.yaml": {
            "apiVersion": 1,
            "providers": [
                {
                    "name": "stagelens",
                    "folder": "stagelens",
                    "type": "file",
                    "disableDeletion": False,
                    "allowUiUpdates": False,
                    "options": {"path": "/var/lib/grafana/dashboards/stagelens"},
                }
            ],
        },
    }


def _multi_doc(docs: list[dict[str, Any]]) -> str:
    """YAML documents under this generator's header (the rules inside the PrometheusRule
    come from ``stagelens slo``'s renderer, but this module writes the file)."""
    body = yaml.dump_all(docs, Dumper=BlockDumper, sort_keys=False, width=100)
    return "# Generated by `python -m stagelens.dashboards.deploy`; do not edit by hand.\n" + body


def write_all(cfg: SloConfig, out_dir: Path) -> list[Path]:
    """Write deploy/kubernetes/*.yaml, deploy/alertmanager/alertmanager.yaml and
    deploy/grafana/provisioning/**; returns the paths."""
    files: dict[Path, str] = {
        out_dir / "alertmanager" / ALERTMANAGER_FILE: _multi_doc([render_alertmanager(cfg)]),
        out_dir / "kubernetes" / "alertmanager-secret.yaml": _multi_doc([alertmanager_secret(cfg)]),
        out_dir / "kubernetes" / "prometheusrule.yaml": _multi_doc([prometheus_rule(cfg)]),
        out_dir / "kubernetes" / "monitors.yaml": _multi_doc(monitors(cfg)),
        out_dir / "kubernetes" / "stack.yaml": _multi_doc(stack(cfg)),
        out_dir / "kubernetes" / "dashboards-configmaps.yaml": _multi_doc(
            dashboard_config_maps(cfg)
        ),
    }
    for rel, data in grafana_provisioning().items():
        files[out_dir / "grafana" / "provisioning" / rel] = _multi_doc([data])
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return sorted(files)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m stagelens.dashboards.deploy``."""
    parser = argparse.ArgumentParser(description="Render deploy/ manifests.")
    parser.add_argument("--config", type=Path, default=None, help="SLO config YAML")
    parser.add_argument("--out", type=Path, default=Path("deploy"), help="output folder")
    args = parser.parse_args(argv)
    for path in write_all(load_slo_config(args.config), args.out):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
