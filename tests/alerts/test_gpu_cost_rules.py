"""The SLO config's GPU prices and what the cost rules make of them (the records' values
are checked by promtool: tests/promtool/stagelens-rules_test.yaml)."""

from __future__ import annotations

import pytest

from stagelens import semconv as sc
from stagelens.errors import ConfigurationError
from stagelens.slo.config import slo_config_from_mapping
from stagelens.slo.record_names import (
    COST_DAY_RECORD,
    COST_SPENT_RECORD,
    GPU_COST_DAY_RECORD,
    gpu_cost_rate_record,
)
from stagelens.slo.recording_rules import render_rules


def _records(config: dict[str, object]) -> dict[str, str]:
    rules = render_rules(slo_config_from_mapping(config))
    return {
        r["record"]: r["expr"] for group in rules["groups"] for r in group["rules"] if "record" in r
    }


def test_each_model_is_priced_at_its_gpus_and_the_rest_at_the_default() -> None:
    """A model with a price of its own (3 USD a GPU-hour, 2 GPUs an engine) and the default
    (2 USD, one GPU) for every other; only the gateway's engine seconds are read."""
    config = {"gpu_prices": {"big.model": {"usd_per_gpu_hour": 3.0, "gpus": 2}}}
    expr = _records(config)[gpu_cost_rate_record("5m")]
    gateway = slo_config_from_mapping(config).gateway_job_regex
    assert (
        f'{sc.ENGINE_SECONDS}{{job=~"{gateway}", model="big.model"}}[5m]) * {3.0 * 2 / 3600!r}'
        in expr
    )
    assert f'model!~"big\\\\.model"}}[5m]) * {2.0 / 3600!r}' in expr


def test_the_caps_are_against_the_price_table_or_the_gpu_cost() -> None:
    """``cost_budget_source`` decides what the daily caps are compared with."""
    assert _records({})[COST_SPENT_RECORD].startswith(COST_DAY_RECORD)
    gpu = _records({"cost_budget_source": "gpu"})
    assert gpu[COST_SPENT_RECORD].startswith(GPU_COST_DAY_RECORD)


@pytest.mark.parametrize(
    "bad",
    [
        {"gpu_prices": {"m": {"usd_per_gpu_hour": -1}}},
        {"gpu_prices": {"m": {"usd_per_gpu_hour": 2, "gpus": 0}}},
        {"node_gpu_prices": {"b": {"gpus": 1}}},
        {"cost_budget_source": "tokens"},
    ],
)
def test_a_bad_price_is_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ConfigurationError):
        slo_config_from_mapping(bad)
