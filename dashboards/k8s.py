"""Kubernetes manifests for the reference stack and its monitors, from the SLO config.

Why generated beside the rules: the monitors decide which ``job`` the series get, and the
alerts select backends and gateways by ``job`` (``SloConfig.backend_job_regex`` and
``gateway_job_regex``); writing both from one config keeps "the alert can fire with the
shipped deploy" true. The manifests are plain Kubernetes (apps/v1, v1) plus the
prometheus-operator CRDs; tests validate them offline against the Kubernetes schemas.

The shape, for several machines:
- the gateway is a Deployment with ``replicas``; its config (API keys included) and the
  ledger and Redis URLs are a Secret, never a ConfigMap;
- vLLM is a StatefulSet behind a headless Service, so that each engine has a stable name
  (``vllm-0.vllm...``) the gateway's balancer can route to by prefix, with GPUs requested
  through ``nvidia.com/gpu``;
- a ServiceMonitor scrapes the gateway and a PodMonitor every vLLM pod, each in the stack's
  namespace only, with ``job`` taken from ``app.kubernetes.io/name``.
"""

from __future__ import annotations

from typing import Any, Final

import yaml

from stagelens.slo.config import SloConfig

PART_OF: Final = {"app.kubernetes.io/part-of": "stagelens"}
NAME_LABEL: Final = "app.kubernetes.io/name"
GATEWAY: Final = "stagelens-gateway"
"""Gateway Deployment, Service and ``job`` name (matches ``gateway_job_regex``)."""
VLLM: Final = "vllm"
"""vLLM StatefulSet, Service and ``job`` name (matches ``backend_job_regex``)."""
GATEWAY_PORT: Final = 8080
VLLM_PORT: Final = 8000
CONFIG_PATH: Final = "/etc/stagelens/gateway.yaml"
GATEWAY_METRICS_PORT: Final = 9464
"""The gateway's internal ``/metrics`` port (``GatewayConfig.metrics_port``): the public port
never serves metrics, so the ServiceMonitor scrapes this one."""
LEDGER_URL_ENV: Final = "STAGELENS_LEDGER_URL"
"""Environment variable carrying the usage ledger's database URL (from the Secret): every
replica bills into one PostgreSQL ledger."""
REDIS_URL_ENV: Final = "STAGELENS_REDIS_URL"
"""Environment variable carrying the rate limiter's Redis URL (from the Secret)."""
VLLM_FLAGS: Final[tuple[str, ...]] = (
    "--enable-prefix-caching",
    "--enable-prompt-tokens-details",
    "--enable-per-request-metrics",
    "--enable-request-id-headers",
)
"""The reference stack's vLLM flags (``stagelens.reference.vllm_server.DEFAULT_FLAGS``; a
test keeps them equal): cache hits, cached-token usage, engine timings, request ids."""

SERVE: Final[tuple[str, ...]] = (
    "python",
    "-m",
    "stagelens.reference.serve",
    "--config",
    CONFIG_PATH,
    "--host",
    "0.0.0.0",
    "--port",
    str(GATEWAY_PORT),
    "--metrics-host",
    "0.0.0.0",
    "--metrics-port",
    str(GATEWAY_METRICS_PORT),
)
"""The gateway container's program: the reference gateway on the mounted config, its
metrics on the internal port (reachable by Prometheus inside the cluster only through the
``metrics`` port, which the Service exposes to the ServiceMonitor, not to clients' Ingress)."""


def _meta(name: str, namespace: str, **labels: str) -> dict[str, Any]:
    return {"name": name, "namespace": namespace, "labels": {**PART_OF, NAME_LABEL: name, **labels}}


def backend_urls(cfg: SloConfig) -> list[str]:
    """One URL per vLLM pod, through the headless Service's stable pod names."""
    d = cfg.deploy
    return [
        f"http://{VLLM}-{i}.{VLLM}.{d.namespace}.svc.cluster.local:{VLLM_PORT}"
        for i in range(d.vllm_replicas)
    ]


def gateway_config(cfg: SloConfig) -> dict[str, Any]:
    """The gateway's config file (``stagelens.reference.GatewayConfig``), API key a
    placeholder to replace before applying."""
    d = cfg.deploy
    return {
        "api_keys": {"sk-CHANGE-ME": "default"},
        "models": {
            d.served_model_name: {
                "backends": backend_urls(cfg),
                "upstream_model": d.served_model_name,
                "tokenizer": d.vllm_model,
            }
        },
        "balancing": "prefix_affinity",
    }


def _secret(cfg: SloConfig) -> dict[str, Any]:
    ns = cfg.deploy.namespace
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _meta(GATEWAY, ns),
        "type": "Opaque",
        "stringData": {
            "gateway.yaml": yaml.safe_dump(gateway_config(cfg), sort_keys=False),
            "ledger-url": "postgresql://stagelens:CHANGE-ME@postgres:5432/stagelens",
            "redis-url": "redis://redis:6379/0",
        },
    }


def _gateway(cfg: SloConfig) -> list[dict[str, Any]]:
    d = cfg.deploy
    ns = d.namespace
    selector = {NAME_LABEL: GATEWAY}
    probe = {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 10}

    def secret_env(name: str, key: str) -> dict[str, Any]:
        return {"name": name, "valueFrom": {"secretKeyRef": {"name": GATEWAY, "key": key}}}

    container = {
        "name": "gateway",
        "image": d.gateway_image,
        "command": list(SERVE),
        "ports": [
            {"name": "http", "containerPort": GATEWAY_PORT},
            {"name": "metrics", "containerPort": GATEWAY_METRICS_PORT},
        ],
        "env": [
            secret_env(LEDGER_URL_ENV, "ledger-url"),
            secret_env(REDIS_URL_ENV, "redis-url"),
            {"name": "OTEL_SERVICE_NAME", "value": GATEWAY},
            {"name": "OTEL_EXPORTER_OTLP_ENDPOINT", "value": "http://otel-collector:4318"},
        ],
        "volumeMounts": [{"name": "config", "mountPath": "/etc/stagelens", "readOnly": True}],
        "readinessProbe": probe,
        "livenessProbe": {**probe, "failureThreshold": 6},
        "resources": {
            "requests": {"cpu": "1", "memory": "1Gi"},
            "limits": {"memory": "2Gi"},
        },
        "securityContext": {"allowPrivilegeEscalation": False},
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(GATEWAY, ns),
        "spec": {
            "replicas": d.gateway_replicas,
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": {**PART_OF, **selector}},
                "spec": {
                    "containers": [container],
                    "volumes": [
                        {
                            "name": "config",
                            "secret": {
                                "secretName": GATEWAY,
                                "items": [{"key": "gateway.yaml", "path": "gateway.yaml"}],
                            },
                        }
                    ],
                },
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(GATEWAY, ns),
        "spec": {
            "selector": selector,
            "ports": [
                {"name": "http", "port": GATEWAY_PORT, "targetPort": "http"},
                {"name": "metrics", "port": GATEWAY_METRICS_PORT, "targetPort": "metrics"},
            ],
        },
    }
    return [_secret(cfg), deployment, service]


def _vllm(cfg: SloConfig) -> list[dict[str, Any]]:
    d = cfg.deploy
    ns = d.namespace
    selector = {NAME_LABEL: VLLM}
    container = {
        "name": "vllm",
        "image": d.vllm_image,
        "args": [
            "--model",
            d.vllm_model,
            "--served-model-name",
            d.served_model_name,
            "--port",
            str(VLLM_PORT),
            *VLLM_FLAGS,
        ],
        "ports": [{"name": "http", "containerPort": VLLM_PORT}],
        "readinessProbe": {
            "httpGet": {"path": "/health", "port": "http"},
            "periodSeconds": 10,
            "failureThreshold": 60,
        },
        "resources": {
            "requests": {"cpu": "4", "memory": "32Gi", "nvidia.com/gpu": str(d.gpus_per_vllm)},
            "limits": {"memory": "48Gi", "nvidia.com/gpu": str(d.gpus_per_vllm)},
        },
        "volumeMounts": [
            {"name": "shm", "mountPath": "/dev/shm"},
            {"name": "cache", "mountPath": "/root/.cache"},
        ],
    }
    statefulset = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": _meta(VLLM, ns),
        "spec": {
            "serviceName": VLLM,
            "replicas": d.vllm_replicas,
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": {**PART_OF, **selector}},
                "spec": {
                    "containers": [container],
                    "volumes": [
                        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}},
                        {"name": "cache", "emptyDir": {}},
                    ],
                },
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(VLLM, ns),
        "spec": {
            "clusterIP": "None",
            "selector": selector,
            "ports": [{"name": "http", "port": VLLM_PORT, "targetPort": "http"}],
        },
    }
    return [statefulset, service]


def stack(cfg: SloConfig) -> list[dict[str, Any]]:
    """Namespace, gateway (Secret, Deployment, Service), vLLM (StatefulSet, headless
    Service)."""
    namespace = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": cfg.deploy.namespace, "labels": dict(PART_OF)},
    }
    return [namespace, *_gateway(cfg), *_vllm(cfg)]


def monitors(cfg: SloConfig) -> list[dict[str, Any]]:
    """A ServiceMonitor for the gateway and a PodMonitor for every vLLM pod, selecting the
    stack's namespace only, ``job`` from ``app.kubernetes.io/name``."""
    d = cfg.deploy
    labels = {"release": d.release_label}
    namespaces = {"matchNames": [d.namespace]}
    endpoint = {"port": "http", "path": "/metrics", "interval": "15s"}
    gateway_endpoint = {**endpoint, "port": "metrics"}
    return [
        {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "ServiceMonitor",
            "metadata": _meta(GATEWAY, d.monitoring_namespace, **labels),
            "spec": {
                "jobLabel": NAME_LABEL,
                "namespaceSelector": namespaces,
                "selector": {"matchLabels": {NAME_LABEL: GATEWAY}},
                "endpoints": [gateway_endpoint],
            },
        },
        {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "PodMonitor",
            "metadata": _meta(VLLM, d.monitoring_namespace, **labels),
            "spec": {
                "jobLabel": NAME_LABEL,
                "namespaceSelector": namespaces,
                "selector": {"matchLabels": {NAME_LABEL: VLLM}},
                "podMetricsEndpoints": [endpoint],
            },
        },
    ]
