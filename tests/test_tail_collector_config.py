"""The shipped Collector tail-sampling configuration keeps what stagelens' tail sampler
keeps, at the gateway's default thresholds (``deploy/otel-collector/tail-sampling.yaml``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from stagelens import semconv
from stagelens.config import Settings
from stagelens.tail_sampling import DEFAULT_RATIO

CONFIG = Path(__file__).resolve().parents[1] / "deploy" / "otel-collector" / "tail-sampling.yaml"


def _policies() -> dict[str, dict[str, Any]]:
    config = yaml.safe_load(CONFIG.read_text())
    assert config["service"]["pipelines"]["traces"]["processors"][-1] == "tail_sampling"
    policies = config["processors"]["tail_sampling"]["policies"]
    return {p["name"]: p for p in policies}


def test_the_collector_keeps_by_the_same_rules_and_thresholds() -> None:
    """Errors, a client gone, TTFT over the SLO threshold, a request over the end-to-end
    threshold and the base ratio: each a policy, at the gateway's defaults."""
    settings = Settings()
    policies = _policies()
    assert policies["error"]["status_code"]["status_codes"] == ["ERROR"]
    assert policies["client_left"]["boolean_attribute"] == {
        "key": semconv.ATTR_CLIENT_DISCONNECTED,
        "value": True,
    }
    (condition,) = policies["slow_ttft"]["ottl_condition"]["span"]
    assert condition == (
        f'attributes["{semconv.ATTR_TTFT}"] > {settings.ttft_slo_threshold_seconds}'
    )
    assert policies["slow_request"]["latency"]["threshold_ms"] == (
        settings.tail_slow_seconds * 1000
    )
    assert policies["base_ratio"]["probabilistic"]["sampling_percentage"] == DEFAULT_RATIO * 100
