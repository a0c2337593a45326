"""What the generated Kubernetes manifests need to know about the cluster."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class DeployConfig(BaseModel):
    """What the generated Kubernetes manifests need to know about the cluster."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    monitoring_namespace: str = "monitoring"
    """Namespace of the PrometheusRule and the dashboard ConfigMaps."""
    namespace: str = "stagelens"
    """Namespace the gateway and vLLM run in; the monitors select only it."""
    release_label: str = "kube-prometheus-stack"
    """``release`` label kube-prometheus-stack selects rules and monitors by."""
    gateway_image: str = "ghcr.io/stagelens/stagelens:0.1.0"
    gateway_replicas: int = Field(default=2, ge=1)
    vllm_image: str = "vllm/vllm-openai:v0.11.0"
    vllm_model: str = "meta-llama/Llama-3.1-8B-Instruct"
    served_model_name: str = "llama-3.1-8b"
    vllm_replicas: int = Field(default=2, ge=1)
    gpus_per_vllm: int = Field(default=1, ge=1)
    page_webhook_url: str = "http://pager.example.invalid/stagelens/page"
    """Alertmanager's ``page`` receiver (deploy/alertmanager): a placeholder to replace with
    your pager's webhook, or the receiver with one of Alertmanager's integrations."""
    ticket_webhook_url: str = "http://tickets.example.invalid/stagelens/ticket"
    """Alertmanager's ``ticket`` receiver: a placeholder, as ``page_webhook_url``."""
