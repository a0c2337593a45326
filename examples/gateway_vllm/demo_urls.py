"""What ``stagelens demo`` prints for the user to open once its stack serves: the URLs of
each part, and a ``prometheus.yml`` for this stack with the command that runs Prometheus on
it."""

from __future__ import annotations

import sys
from pathlib import Path


def print_urls(
    gateway: str, metrics: str, backends: list[str], embedders: list[str], api_key: str
) -> None:
    print(f"  gateway     {gateway}/v1   (OpenAI API; Authorization: Bearer {api_key})")
    print(f"              {gateway}/v1/responses, /v1/messages   (the agent APIs; x-api-key too)")
    print(f"  health      {gateway}/health   (anonymous: up or down)")
    print(f"  metrics     {metrics}   (internal port, not on the API's)")
    for url in backends:
        print(f"  vLLM        {url}/metrics  (engine + stagelens plugin metrics)")
    for url in embedders:
        print(f"  embeddings  {url}/metrics  (vLLM pooling server)")
    print("  Grafana     import dashboards/*.json (or deploy/grafana/provisioning/)")
    print(f"  report      {sys.argv[0]} report --metrics-url {metrics}")


def print_prometheus(path: Path, metrics: str, backends: list[str], workers: int) -> None:
    """Write a ``prometheus.yml`` scraping this stack and print the command that runs
    Prometheus on it, with exemplar storage (the latency buckets' trace ids)."""
    from urllib.parse import urlsplit

    from stagelens.slo import prometheus_server

    jobs = {
        prometheus_server.GATEWAY_JOB: [urlsplit(metrics).netloc],
        prometheus_server.VLLM_JOB: [urlsplit(url).netloc for url in backends],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(prometheus_server.render(jobs), encoding="utf-8")
    print(f"  Prometheus  {prometheus_server.command(str(path))}")
    print(f"              (scrapes the /metrics above as jobs {', '.join(map(repr, jobs))})")
    if workers > 1:
        print("              no exemplars: several workers share metrics in files, which keep none")
    else:
        print("              exemplars: each latency bucket's latest sampled trace id")
    print("              rules: alerts/stagelens-rules.yaml and alerts/stagelens-alerts.yaml")
