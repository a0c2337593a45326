"""The Prometheus server that reads stagelens: the flag exemplars need and its scrape config.

Why in one place: a latency bucket's trace id (its exemplar) reaches Prometheus only when
the server runs with exemplar storage on; without the flag it scrapes the same series and
silently drops every exemplar. The demo writes this configuration for its own ports and
prints the command, and the end-to-end tests start Prometheus with the same flag.

A Prometheus with exemplar storage asks for the OpenMetrics format when it scrapes
(``Accept: application/openmetrics-text``), the only format exemplars travel in; a scrape
in Prometheus' classic text format gets the same series without them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

import yaml

EXEMPLAR_STORAGE: Final = "exemplar-storage"
"""The feature (``--enable-feature``, or ``enableFeatures`` of the operator's Prometheus)
that keeps scraped exemplars: ``/api/v1/query_exemplars`` and Grafana's exemplar dots."""
FLAGS: Final[tuple[str, ...]] = (f"--enable-feature={EXEMPLAR_STORAGE}",)
"""Command-line flags the server needs beyond its config file."""
GATEWAY_JOB: Final = "stagelens-gateway"
"""Scrape job of the gateway's ``/metrics`` (the alerts select gateways by this job)."""
VLLM_JOB: Final = "vllm"
"""Scrape job of the vLLM servers' ``/metrics`` (the alerts select backends by this job)."""


def scrape_config(jobs: Mapping[str, Sequence[str]], interval: str = "15s") -> dict[str, Any]:
    """A ``prometheus.yml`` scraping each job's ``host:port`` targets every ``interval``."""
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "scrape_configs": [
            {"job_name": job, "static_configs": [{"targets": list(targets)}]}
            for job, targets in jobs.items()
        ],
    }


def command(config_file: str) -> str:
    """The command line that runs Prometheus on ``config_file`` with exemplar storage."""
    return " ".join(("prometheus", *FLAGS, f"--config.file={config_file}"))


def render(jobs: Mapping[str, Sequence[str]], interval: str = "15s") -> str:
    """``scrape_config`` as YAML, under a comment naming the flag it must run with."""
    body = yaml.safe_dump(scrape_config(jobs, interval), sort_keys=False)
    return f"# Run with exemplar storage: {command('prometheus.yml')}\n{body}"
