"""Every emitted name obeys the contract and the Prometheus naming rules."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from stagelens import semconv
from stagelens.metrics.buckets import TTFT_BUCKETS, ttft_buckets
from stagelens.stages import DEFAULT_STAGE_BUDGETS_SECONDS, Stage

PROM_NAME = re.compile(r"^stagelens_[a-z0-9_]+$")
CONTRACT_METRICS = {
    "stagelens_stage_duration_seconds",
    "stagelens_request_duration_seconds",
    "stagelens_time_to_first_token_seconds",
    "stagelens_inter_token_latency_seconds",
    "stagelens_engine_phase_duration_seconds",
    "stagelens_requests_total",
    "stagelens_tokens_total",
    "stagelens_cost_usd_total",
    "stagelens_budget_usd",
    "stagelens_stage_budget_seconds",
    "stagelens_kv_cache_queries_total",
    "stagelens_kv_cache_hits_total",
    "stagelens_kv_cache_usage_ratio",
    "stagelens_gpu_utilization_ratio",
    "stagelens_gpu_sm_active_ratio",
    "stagelens_gpu_memory_used_bytes",
    "stagelens_gpu_memory_total_bytes",
    "stagelens_gpu_power_watts",
    "stagelens_gpu_energy_joules_total",
    "stagelens_gpu_temperature_celsius",
    "stagelens_gpu_collector_up",
}


def _metric_constants() -> dict[str, str]:
    return {
        k: v
        for k, v in vars(semconv).items()
        if k.isupper()
        and isinstance(v, str)
        and v.startswith("stagelens_")
        and k != "METRIC_PREFIX"
    }


def test_every_contract_metric_is_defined_once() -> None:
    """semconv defines every metric of CONTRACT.md, each under exactly one constant."""
    values = list(_metric_constants().values())
    assert set(values) >= CONTRACT_METRICS
    assert len(values) == len(set(values))


def test_metric_names_follow_prometheus_rules() -> None:
    """Prefix, no colons, counters end in _total, ratios in _ratio, base-unit suffixes."""
    for name in _metric_constants().values():
        assert PROM_NAME.match(name), name
        assert ":" not in name
        assert not name.endswith(("_percent", "_perc", "_ms", "_milliseconds", "_kb"))


def test_stage_enum_matches_contract_order() -> None:
    """The seven stages, in request order, with a default budget each."""
    assert [s.value for s in Stage] == [
        "gateway",
        "load_balancer",
        "tokenizer",
        "router",
        "inference",
        "postprocess",
        "billing",
    ]
    assert set(DEFAULT_STAGE_BUDGETS_SECONDS) == {s.value for s in Stage}
    assert DEFAULT_STAGE_BUDGETS_SECONDS["inference"] == 0.8


def test_ttft_buckets_always_contain_the_threshold() -> None:
    """Any configured SLO threshold becomes a TTFT bucket boundary."""
    assert 0.5 in TTFT_BUCKETS
    for threshold in (0.5, 0.3, 0.123, 12.0):
        buckets = ttft_buckets(threshold)
        assert threshold in buckets
        assert list(buckets) == sorted(set(buckets))


def test_no_module_spells_a_name_semconv_defines() -> None:
    """No product module writes an emitted dotted name (an attribute key such as
    ``http.route``) as a literal: it imports the ``semconv`` constant, so a rename is one
    edit. Docstrings may quote names."""

    root = Path(__file__).resolve().parents[1]
    names = {
        value
        for key, value in vars(semconv).items()
        if key.isupper()
        and isinstance(value, str)
        and "." in value
        and " " not in value
        and not value.startswith(("http://", "https://"))
    }
    found = []
    for folder in ("stagelens", "instrumentation", "exporters", "dashboards"):
        for path in (root / folder).rglob("*.py"):
            if path.name in ("semconv.py", "semconv_spec.py", "semconv_otel.py"):
                continue
            tree = ast.parse(path.read_text())
            docstrings = {
                id(node.body[0].value)
                for node in ast.walk(tree)
                if isinstance(
                    node, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef
                )
                and node.body
                and isinstance(node.body[0], ast.Expr)
                and isinstance(node.body[0].value, ast.Constant)
            }
            found += [
                f"{path.relative_to(root)}:{node.lineno} {node.value}"
                for node in ast.walk(tree)
                if isinstance(node, ast.Constant)
                and node.value in names
                and id(node) not in docstrings
            ]
    assert found == []
