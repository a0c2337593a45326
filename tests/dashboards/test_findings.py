"""Dashboard findings of the first on-call review (findings 4 and 11-14), each checked on
the generated JSON or by evaluating the panel's own query in promtool on synthetic series."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from stagelens import semconv as sc
from stagelens.slo.config import SloConfig
from tests.dashboards.test_dashboards import (
    PROMTOOL,
    _concrete,
    _dashboards,
    _panel,
    _promtool_eval,
    panel_queries,
)

needs_promtool = pytest.mark.skipif(not Path(PROMTOOL).exists(), reason="promtool not installed")

REQUEST_PATH = "stagelens-request-path.json"
TOKENS_COST = "stagelens-tokens-cost.json"
ENGINE_GPU = "stagelens-engine-gpu.json"
SLOS = "stagelens-slos.json"


def _exprs(board: str, title: str) -> list[str]:
    return [_concrete(t["expr"]) for t in _panel(board, title)["targets"]]


def _counter(name: str, labels: str, per_minute: float, n: int = 20) -> dict[str, str]:
    return {"series": f"{name}{{{labels}}}", "values": f"0+{per_minute}x{n}"}


def _gauge(name: str, labels: str, value: float, n: int = 20) -> dict[str, str]:
    return {"series": f"{name}{{{labels}}}", "values": f"{value}x{n}"}


def _histogram(name: str, labels: str, per_minute: int, seconds: float) -> list[dict[str, str]]:
    """A histogram whose every observation is ``seconds`` (count, sum, two buckets)."""
    sep = ", " if labels else ""
    return [
        _counter(f"{name}_count", labels, per_minute),
        _counter(f"{name}_sum", labels, per_minute * seconds),
        _counter(f"{name}_bucket", f'{labels}{sep}le="{seconds}"', per_minute),
        _counter(f"{name}_bucket", f'{labels}{sep}le="+Inf"', per_minute),
    ]


class TestFinding4StageBudgets:
    @needs_promtool
    def test_share_per_stage_uses_the_first_upstream_token(self, tmp_path: Path) -> None:
        """With a 10 ms gateway, a 40 ms first upstream token and a 2 s whole inference call,
        inference's share is 40/50, not ~100 %: decode is not in the share."""
        series = [
            *_histogram(sc.STAGE_DURATION, 'stage="gateway", model="tiny"', 60, 0.01),
            *_histogram(sc.STAGE_DURATION, 'stage="inference", model="tiny"', 60, 2.0),
            *_histogram(sc.UPSTREAM_TTFT, 'model="tiny"', 60, 0.04),
        ]
        expr = _exprs(REQUEST_PATH, "Share of time per stage")[0]
        _promtool_eval(
            tmp_path,
            series,
            [
                {
                    "expr": expr,
                    "eval_time": "10m",
                    "exp_samples": [
                        {"labels": '{stage="gateway"}', "value": 0.2},
                        {"labels": '{stage="inference"}', "value": 0.8},
                    ],
                }
            ],
        )


class TestFinding11EnginePhases:
    def test_engine_phases_and_queue_time_have_panels(self) -> None:
        """The request-path dashboard reads stagelens_engine_phase_duration_seconds, queue
        time included."""
        titles = {p["title"] for p in _dashboards()[REQUEST_PATH]["panels"]}
        assert {"Engine phase p50", "Engine phase p95", "Engine queue time p95 by model"} <= titles
        queue = _exprs(REQUEST_PATH, "Engine queue time p95 by model")[0]
        assert sc.ENGINE_PHASE_DURATION in queue
        assert 'phase="queue"' in queue

    @needs_promtool
    def test_where_the_time_to_first_token_went(self, tmp_path: Path) -> None:
        """The breakdown shows each part before the first token (gateway, load balancer,
        tokenizer, router, engine queue and prefill, rest of the upstream wait) with the
        client's TTFT beside it; engine phases counted once though the gateway and the
        plugin both report them."""
        model = 'model="tiny"'
        series = [
            # Powers of two: promtool compares floats exactly.
            *_histogram(sc.STAGE_DURATION, f'stage="gateway", {model}', 64, 2**-7),
            *_histogram(sc.STAGE_DURATION, f'stage="load_balancer", {model}', 64, 2**-9),
            *_histogram(sc.STAGE_DURATION, f'stage="tokenizer", {model}', 64, 2**-8),
            *_histogram(sc.STAGE_DURATION, f'stage="router", {model}', 64, 2**-10),
            *_histogram(sc.STAGE_DURATION, f'stage="inference", {model}', 64, 4.0),
            *_histogram(sc.UPSTREAM_TTFT, model, 64, 0.5),
            *_histogram(sc.TIME_TO_FIRST_TOKEN, model, 64, 0.5 + 2**-6),
        ]
        for job in ("gateway", "vllm"):  # the same requests, seen twice
            for phase, seconds in (("queue", 0.125), ("prefill", 0.25), ("decode", 2.5)):
                labels = f'job="{job}", phase="{phase}", {model}'
                series += _histogram(sc.ENGINE_PHASE_DURATION, labels, 64, seconds)
        stages, phases, rest, ttft = _exprs(REQUEST_PATH, "Where did the time to first token go")
        cases = [
            (
                stages,
                [
                    {"labels": '{stage="gateway"}', "value": 2**-7},
                    {"labels": '{stage="load_balancer"}', "value": 2**-9},
                    {"labels": '{stage="router"}', "value": 2**-10},
                    {"labels": '{stage="tokenizer"}', "value": 2**-8},
                ],
            ),
            (
                phases,
                [
                    {"labels": '{phase="prefill"}', "value": 0.25},
                    {"labels": '{phase="queue"}', "value": 0.125},
                ],
            ),
            (rest, [{"labels": "{}", "value": 0.125}]),
            (ttft, [{"labels": "{}", "value": 0.5 + 2**-6}]),
        ]
        _promtool_eval(
            tmp_path,
            series,
            [{"expr": e, "eval_time": "10m", "exp_samples": s} for e, s in cases],
        )


class TestFinding12StatPanels:
    @pytest.mark.parametrize("name", [REQUEST_PATH, TOKENS_COST, ENGINE_GPU, SLOS])
    def test_stat_and_gauge_panels_have_thresholds_and_are_instant(self, name: str) -> None:
        """Every stat and bar gauge sets its own threshold steps (no Grafana default of
        green/red-at-80) and reads instant queries; gauges have a max."""
        for panel in _dashboards()[name]["panels"]:
            if panel["type"] not in {"stat", "bargauge"}:
                continue
            steps = panel["fieldConfig"]["defaults"]["thresholds"]["steps"]
            assert steps != [{"color": "green", "value": None}, {"color": "red", "value": 80}]
            assert steps[0]["value"] is None, panel["title"]
            assert all(t.get("instant") for t in panel["targets"]), panel["title"]
            if panel["type"] == "bargauge":
                assert panel["fieldConfig"]["defaults"]["max"] == 1.0, panel["title"]

    def test_sli_stats_turn_red_below_the_objective(self) -> None:
        """An SLI stat is red below its objective and green at or above it; the request count
        is neutral (neither red nor green)."""
        cfg = SloConfig()
        sli = _panel(SLOS, "TTFT SLI (30d)")
        steps = sli["fieldConfig"]["defaults"]["thresholds"]["steps"]
        assert steps == [
            {"color": "red", "value": None},
            {"color": "green", "value": cfg.objectives["ttft"]},
        ]
        count = _panel(SLOS, "Requests the SLIs counted (time range)")
        assert count["fieldConfig"]["defaults"]["thresholds"]["steps"] == [
            {"color": "text", "value": None}
        ]

    def test_no_panel_recomputes_the_period(self) -> None:
        """No query reads 30 days of raw samples: the 30d stats read recorded ratios."""
        for board in _dashboards().values():
            for title, expr in panel_queries(board):
                assert not re.search(r"\[(30d|\d+w)\]", expr), title

    @needs_promtool
    def test_slo_panels_are_per_model(self, tmp_path: Path) -> None:
        """SLO panels keep one series per model, as the alerts judge them: a healthy and a
        failing model are not averaged (or maxed) into one figure. TTFT is judged per
        prompt-size class: the 32k class of "bad" all slow reads 0 % good, not the model's
        96 % (its 1024 class is fine and twenty-four times larger)."""
        good = 'model="good", sli="ttft", prompt_size="1024"'
        small = 'model="bad", sli="ttft", prompt_size="1024"'
        large = 'model="bad", sli="ttft", prompt_size="32768"'
        series = [
            _gauge("stagelens:sli_errors:ratio_rate30d", 'model="good", sli="ttft"', 0.025),
            _gauge("stagelens:sli_errors:ratio_rate30d", 'model="bad", sli="ttft"', 0.04),
            _gauge("stagelens:ttft_sli_errors:ratio_rate30d", good, 0.025),
            _gauge("stagelens:ttft_sli_errors:ratio_rate30d", small, 0.0),
            _gauge("stagelens:ttft_sli_errors:ratio_rate30d", large, 1.0),
            # The TTFT burn panel reads the per prompt-size class ratio.
            _gauge("stagelens:ttft_sli_errors:ratio_rate1h", good, 0.025),
            _gauge("stagelens:ttft_sli_errors:ratio_rate1h", large, 0.2),
        ]
        sli = _exprs(SLOS, "TTFT SLI (30d)")[0]
        burn = _exprs(SLOS, "TTFT burn rate")[0]
        _promtool_eval(
            tmp_path,
            series,
            [
                {
                    "expr": sli,
                    "eval_time": "5m",
                    "exp_samples": [
                        {"labels": "{" + good + "}", "value": 0.975},
                        {"labels": "{" + small + "}", "value": 1},
                        {"labels": "{" + large + "}", "value": 0},
                    ],
                },
                {
                    "expr": burn,
                    "eval_time": "5m",
                    "exp_samples": [
                        {"labels": "{" + good + "}", "value": 0.5},
                        {"labels": "{" + large + "}", "value": 4},
                    ],
                },
            ],
        )


def _engine_series() -> list[dict[str, str]]:
    """One engine seen through the plugin and vLLM's own metrics (same target), and one GPU
    seen through stagelens' exporter and DCGM."""
    engine = 'instance="10.0.0.5:8000", job="vllm"'
    ours = f'{engine}, backend="host/engine0", model="tiny"'
    vllm = f'{engine}, engine="0", model_name="tiny"'
    return [
        _counter(sc.KV_CACHE_QUERIES, ours, 1000),
        _counter(sc.KV_CACHE_HITS, ours, 500),
        _counter(sc.VLLM_PREFIX_CACHE_QUERIES, vllm, 1000),
        _counter(sc.VLLM_PREFIX_CACHE_HITS, vllm, 500),
        _gauge(sc.KV_CACHE_USAGE, ours, 0.4),
        _gauge(sc.VLLM_KV_CACHE_USAGE, vllm, 0.4),
        _gauge(sc.ENGINE_REQUESTS_RUNNING, ours, 3),
        _gauge(sc.VLLM_REQUESTS_RUNNING, vllm, 3),
        _gauge(sc.ENGINE_REQUESTS_WAITING, ours, 1),
        _gauge(sc.VLLM_REQUESTS_WAITING, vllm, 1),
        _gauge(sc.GPU_SM_ACTIVE, 'instance="n1:9400", gpu="0", uuid="GPU-1", name="H100"', 0.5),
        _gauge(sc.DCGM_SM_ACTIVE, 'instance="n1:9401", gpu="0", UUID="GPU-1"', 0.5),
        _gauge(sc.GPU_UTILIZATION, 'instance="n1:9400", gpu="0", uuid="GPU-1", name="H100"', 1),
        _gauge(sc.DCGM_GPU_UTIL, 'instance="n1:9401", gpu="0", UUID="GPU-1"', 100),
        _gauge(sc.GPU_POWER, 'instance="n1:9400", gpu="0", uuid="GPU-1", name="H100"', 300),
        _gauge(sc.DCGM_POWER, 'instance="n1:9401", gpu="0", UUID="GPU-1"', 300),
    ]


class TestFinding13Fallbacks:
    @needs_promtool
    @pytest.mark.parametrize(
        ("title", "per_query"),
        [
            ("Prefix-cache hit rate", [0.5]),
            ("KV-cache usage", [0.4]),
            ("Running and waiting requests", [3, 1]),
            ("GPU SM activity vs kernel time", [0.5, 1]),
            ("GPU power", [300]),
        ],
    )
    def test_one_engine_one_gpu_one_series(
        self, tmp_path: Path, title: str, per_query: list[float]
    ) -> None:
        """An engine both the plugin and vLLM report, and a GPU both stagelens and DCGM
        report, come out as one series per query, not two."""
        exprs = _exprs(ENGINE_GPU, title)
        labels: dict[str, str] = {
            "Prefix-cache hit rate": '{model="tiny"}',
            "KV-cache usage": '{instance="10.0.0.5:8000", model="tiny"}',
            "Running and waiting requests": '{instance="10.0.0.5:8000", model="tiny"}',
        }
        sample = labels.get(title, '{gpu="0", uuid="GPU-1"}')
        tests: list[dict[str, Any]] = [
            {"expr": e, "eval_time": "10m", "exp_samples": [{"labels": sample, "value": v}]}
            for e, v in zip(exprs, per_query, strict=False)
        ]
        _promtool_eval(tmp_path, _engine_series(), tests)


class TestFinding14Cost:
    def test_units_say_what_they_measure(self) -> None:
        """Spend rate is USD per hour (not dollars); the blended unit cost says it includes
        input cost; tokens per second are labelled as such."""
        rate = _panel(TOKENS_COST, "Spend rate")
        assert rate["fieldConfig"]["defaults"]["unit"] == "suffix: USD/h"
        blended = _panel(TOKENS_COST, "Spend per 1k output tokens (input cost included)")
        assert blended["fieldConfig"]["defaults"]["unit"] == "currencyUSD"
        tokens = _panel(TOKENS_COST, "Tokens by type")
        assert tokens["fieldConfig"]["defaults"]["unit"] == "suffix: tokens/s"

    @pytest.mark.parametrize("name", [REQUEST_PATH, TOKENS_COST, ENGINE_GPU, SLOS])
    def test_variables_and_links(self, name: str) -> None:
        """Every dashboard has cluster and namespace variables and links to the other three
        (by the stagelens tag, keeping time and variables); Engine and GPU has instance and
        GPU variables."""
        board = _dashboards()[name]
        variables = {v["name"] for v in board["templating"]["list"]}
        assert {"cluster", "namespace", "model"} <= variables
        if name == ENGINE_GPU:
            assert {"instance", "gpu"} <= variables
        assert board["links"] == [
            {
                "asDropdown": False,
                "icon": "",
                "includeVars": True,
                "keepTime": True,
                "tags": ["stagelens"],
                "targetBlank": False,
                "title": "stagelens",
                "tooltip": "",
                "type": "dashboards",
            }
        ]

    def test_every_query_filters_the_environment(self) -> None:
        """Every metric read by every panel is selected with $cluster, so staging and
        production are never drawn as one."""
        metric = re.compile(r'(?<![\w:"])((?:stagelens|vllm|DCGM_)[A-Za-z0-9_:]*)(\{[^}]*\})?')
        checked = 0
        for board in _dashboards().values():
            for title, expr in panel_queries(board):
                for name, matchers in metric.findall(expr):
                    assert 'cluster=~"$cluster"' in matchers, f"{title}: {name}"
                    checked += 1
        assert checked > 80
