"""Run promtool over the generated rule files and the unit-test suites beside this file, and
check that the alert suites cover every rule the way their header says."""

from __future__ import annotations

import atexit
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from stagelens.slo.alert_rules import ALERTS_FILE, ALL_ALERTS, RULES_FILE

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
ALERT_SUITES = (
    "stagelens-alerts_test.yaml",
    "stagelens-alerts-slow_test.yaml",
    "findings_test.yaml",
    "oncall_test.yaml",
    "oncall2_test.yaml",
)
FINDINGS = HERE / "findings_test.yaml"
BASELINE = HERE / "baseline"
"""The generated rule files as they were before the first on-call review: every finding
case must fail on them."""
BASELINE_ORDER = (
    "stagelens-ttft-slo.rules",
    "stagelens-budgets.rules",
    "stagelens-cost.rules",
    "stagelens-serving.rules",
    "stagelens-slo.alerts",
    "stagelens-serving.alerts",
)
ROUND_TWO = HERE / "oncall2_test.yaml"
BASELINE_ROUND_TWO = HERE / "baseline_round2"
"""The generated rule files as they were before the second on-call review: every
"case N" group of oncall2_test.yaml must fail on them."""
ROUND_TWO_CASES = frozenset(range(1, 9))
"""The review's numbered cases (1-8); each has at least one group."""
GATEWAY_CASES = frozenset({6})
"""Cases fixed in the gateway, not in the rules: their groups feed the series the gateway
now records, which the rules before the fix read rightly too (the gateway's side has tests
of its own, tests/instrumentation/test_streamed_apart.py)."""

needs_promtool = pytest.mark.skipif(not Path(PROMTOOL).exists(), reason="promtool not installed")

_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
_DURATION_PART = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")
_MATCHER = re.compile(r'(\w+)="([^"]*)"')

Labels = dict[str, str]


def seconds(duration: str) -> float:
    """Seconds in a Prometheus duration such as ``3d12h52m`` (promtool accepts compounds)."""
    parts = _DURATION_PART.findall(duration)
    assert parts, duration
    assert "".join(n + u for n, u in parts) == duration, duration
    return sum(int(n) * _UNIT_SECONDS[u] for n, u in parts)


def labels_of(selector: str) -> Labels:
    """Label matchers/labels of ``ALERTS{a="b", ...}`` (equality only)."""
    return dict(_MATCHER.findall(selector))


@dataclass(frozen=True)
class Rule:
    """One alerting rule: its name, static labels and ``for`` in seconds."""

    name: str
    labels: Labels
    for_s: float


@dataclass
class Group:
    """One promtool test group, indexed for the coverage checks."""

    suite: str
    name: str
    interval_s: float
    firing: dict[tuple[str, float], list[Labels]]
    """(alertname, eval time) -> exp_labels of the expected firing alerts."""
    alerts: list[tuple[float, Labels, list[Labels]]]
    """ALERTS queries: (eval time, matchers, labels of every expected sample)."""

    def alerts_at(self, t: float, name: str) -> list[tuple[Labels, list[Labels]]]:
        return [
            (m, samples)
            for at, m, samples in self.alerts
            if at == t and m.get("alertname", name) == name
        ]


def alert_rules() -> list[Rule]:
    data = yaml.safe_load((ROOT / "alerts" / ALERTS_FILE).read_text(encoding="utf-8"))
    return [
        Rule(r["alert"], dict(r["labels"]), seconds(r["for"]) if "for" in r else 0.0)
        for g in data["groups"]
        for r in g["rules"]
    ]


def suite_groups() -> list[Group]:
    groups = []
    for suite in ALERT_SUITES:
        data: dict[str, Any] = yaml.safe_load((HERE / suite).read_text(encoding="utf-8"))
        interval = seconds(data["evaluation_interval"])
        for number, raw in enumerate(data["tests"]):
            firing = {
                (case["alertname"], seconds(case["eval_time"])): [
                    {k: str(v) for k, v in a["exp_labels"].items()}
                    for a in case.get("exp_alerts") or []
                ]
                for case in raw.get("alert_rule_test", [])
            }
            alerts = [
                (
                    seconds(case["eval_time"]),
                    labels_of(case["expr"]),
                    [labels_of(s["labels"]) for s in case.get("exp_samples") or []],
                )
                for case in raw.get("promql_expr_test", [])
                if case["expr"].strip().startswith("ALERTS")
            ]
            groups.append(Group(suite, raw.get("name", str(number)), interval, firing, alerts))
    return groups


def _covers(labels: Labels, wanted: Labels) -> bool:
    return all(labels.get(k) == v for k, v in wanted.items())


def boundary_cases(rule: Rule, groups: list[Group]) -> list[str]:
    """Groups where ``rule`` fires at t, is pending but not firing at t - interval, and had no
    ALERTS series at all at t - for - interval (so it fired exactly ``for`` after its onset)."""
    found = []
    for g in groups:
        for (name, t), firing in g.firing.items():
            if name != rule.name:
                continue
            for exp in (e for e in firing if _covers(e, rule.labels)):
                before = t - g.interval_s
                onset_before = t - rule.for_s - g.interval_s
                if any(_covers(e, exp) for e in g.firing.get((name, before), [exp])):
                    continue
                pending = {**exp, "alertname": name, "alertstate": "pending"}
                if not any(
                    m.get("alertstate", "pending") == "pending"
                    and any(_covers(s, pending) for s in samples)
                    for m, samples in g.alerts_at(before, name)
                ):
                    continue
                quiet = [
                    not any(_covers(s, exp) for s in samples)
                    for m, samples in g.alerts_at(onset_before, name)
                    if "alertstate" not in m
                ]
                if onset_before >= 0 and quiet and all(quiet):
                    found.append(f"{g.suite}: {g.name} at {t:g}s")
    return found


def quiet_cases(rule: Rule, groups: list[Group]) -> list[str]:
    """Cases at or after ``for`` where ``rule`` is expected not to fire and ALERTS (any state)
    has nothing for it: the condition is false, not merely held back by ``for``."""
    found = []
    for g in groups:
        for (name, t), firing in g.firing.items():
            if name != rule.name or t < rule.for_s or firing_has(firing, rule.labels):
                continue
            checks = [m for m, _ in g.alerts_at(t, name) if "alertstate" not in m]
            if checks and all(
                not any(_covers(s, rule.labels) for s in samples)
                for m, samples in g.alerts_at(t, name)
                if "alertstate" not in m
            ):
                found.append(f"{g.suite}: {g.name} at {t:g}s")
    return found


def firing_has(firing: list[Labels], wanted: Labels) -> bool:
    return any(_covers(e, wanted) for e in firing)


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PROMTOOL, *args], cwd=HERE, capture_output=True, text=True, timeout=900, check=False
    )


SUITES = sorted(p.name for p in HERE.glob("*_test.yaml"))
Run = subprocess.CompletedProcess[str]
_POOL = ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1))
"""Runs promtool as many at once as there are cores (one promtool uses about one core):
the suites take minutes each, one after the other."""
_runs: dict[tuple[str, str], Future[Run]] = {}


def _started(kind: str, name: str, jobs: Callable[[], dict[str, Callable[[], Run]]]) -> Run:
    """The run of job ``name`` of ``kind``. The first call of a kind starts all its jobs
    in the pool, in the order ``jobs`` lists them; each test then waits for its own."""
    if not any(started == kind for started, _ in _runs):
        for job, run in jobs().items():
            _runs[(kind, job)] = _POOL.submit(run)
    return _runs[(kind, name)].result()


def _suite_run(suite: str) -> Run:
    """``promtool test rules SUITE`` (the suites beside this file)."""

    def jobs() -> dict[str, Callable[[], Run]]:
        largest_first = sorted(SUITES, key=lambda name: -(HERE / name).stat().st_size)
        return {name: lambda name=name: _promtool("test", "rules", name) for name in largest_first}

    return _started("suite", suite, jobs)


_SCRATCH = Path(tempfile.mkdtemp(prefix="stagelens-promtool-"))
atexit.register(shutil.rmtree, _SCRATCH, ignore_errors=True)


def _test_run(kind: str, name: str, suites: Callable[[], dict[str, dict[str, Any]]]) -> Run:
    """``promtool test rules`` on the suite ``suites()[name]``, written to a file of its
    own; every suite of ``kind`` started at its first call."""

    def run(index: int, suite: dict[str, Any]) -> Run:
        path = _SCRATCH / f"{kind}-{index}_test.yaml"
        path.write_text(yaml.safe_dump(suite, sort_keys=False), encoding="utf-8")
        return _promtool("test", "rules", str(path))

    def jobs() -> dict[str, Callable[[], Run]]:
        return {
            job: lambda i=i, suite=suite: run(i, suite)
            for i, (job, suite) in enumerate(suites().items())
        }

    return _started(kind, name, jobs)


class TestPromtool:
    @needs_promtool
    def test_check_rules_is_clean(self) -> None:
        """`promtool check rules` accepts both committed rule files without lint findings."""
        result = _promtool(
            "check", "rules", str(ROOT / "alerts" / RULES_FILE), str(ROOT / "alerts" / ALERTS_FILE)
        )
        assert result.returncode == 0, result.stdout + result.stderr
        assert "SUCCESS" in result.stdout

    @needs_promtool
    @pytest.mark.parametrize("suite", SUITES)
    def test_unit_suite_passes(self, suite: str) -> None:
        """Every promtool unit-test suite passes against the committed rules."""
        result = _suite_run(suite)
        assert result.returncode == 0, result.stdout + result.stderr


class TestCoverage:
    """Pure YAML checks of the alert suites (no promtool needed)."""

    def test_rule_names_match_the_catalogue(self) -> None:
        """The rules file has exactly the alerts ALL_ALERTS lists (so none escapes coverage)."""
        assert sorted({r.name for r in alert_rules()}) == sorted(ALL_ALERTS)

    @pytest.mark.parametrize("rule", alert_rules(), ids=lambda r: f"{r.name}-{r.labels}")
    def test_every_rule_fires_and_is_quiet(self, rule: Rule) -> None:
        """Each rule (each burn-rate pair) has a firing case and a not-firing case."""
        groups = suite_groups()
        assert any(
            firing_has(firing, rule.labels)
            for g in groups
            for (name, _), firing in g.firing.items()
            if name == rule.name
        ), f"{rule} never fires"
        assert quiet_cases(rule, groups), f"{rule} has no not-firing case with ALERTS empty"

    @pytest.mark.parametrize("rule", alert_rules(), ids=lambda r: f"{r.name}-{r.labels}")
    def test_every_rule_has_both_sides_of_its_for_boundary(self, rule: Rule) -> None:
        """Each rule has a case firing at t = onset + for, pending (not firing) one evaluation
        earlier, and absent from ALERTS one evaluation before the onset."""
        assert rule.for_s > 0, f"{rule} has no `for:`; the boundary check needs one"
        assert boundary_cases(rule, suite_groups()), f"{rule} lacks a for: boundary case"


def finding_groups() -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = yaml.safe_load(FINDINGS.read_text(encoding="utf-8"))["tests"]
    return groups


def _finding_suites() -> dict[str, dict[str, Any]]:
    """Each finding group alone, against the rules before the first review."""
    return {
        group["name"]: {
            "rule_files": [str(BASELINE / RULES_FILE), str(BASELINE / ALERTS_FILE)],
            "evaluation_interval": "1m",
            "group_eval_order": list(BASELINE_ORDER),
            "tests": [group],
        }
        for group in finding_groups()
    }


class TestFindings:
    def test_every_numbered_finding_has_a_case(self) -> None:
        """Findings 1-10 (the rules' findings of the first on-call review) each have a
        group."""
        numbers = {int(g["name"].split(":")[0].split()[1]) for g in finding_groups()}
        assert numbers == set(range(1, 11))

    @needs_promtool
    @pytest.mark.parametrize("group", finding_groups(), ids=lambda g: g["name"])
    def test_finding_fails_on_the_rules_before_the_fix(self, group: dict[str, Any]) -> None:
        """Each finding case fails on the rules as they were: it shows the finding, and the
        committed rules (test_unit_suite_passes) fix it."""
        result = _test_run("findings", group["name"], _finding_suites)
        output = result.stdout + result.stderr
        assert result.returncode == 1, output
        assert "FAILED:" in output
        assert "parse error" not in output


def _case(group: dict[str, Any]) -> int:
    return int(group["name"].split(":")[0].split()[1])


def round_two_cases() -> list[dict[str, Any]]:
    """The "case N: ..." groups of the second review's suite (not its "still: ..." ones)."""
    groups: list[dict[str, Any]] = yaml.safe_load(ROUND_TWO.read_text(encoding="utf-8"))["tests"]
    return [g for g in groups if g["name"].startswith("case ")]


def rule_cases() -> list[dict[str, Any]]:
    """The case groups whose fix is in the rules (all but ``GATEWAY_CASES``)."""
    return [g for g in round_two_cases() if _case(g) not in GATEWAY_CASES]


def _baseline_suite(rules: Path, group: dict[str, Any]) -> dict[str, Any]:
    """A suite of ``group`` alone against the rule files in ``rules``, in the group order
    of the second review's suite (groups a baseline lacks are left out of it)."""
    suite: dict[str, Any] = yaml.safe_load(ROUND_TWO.read_text(encoding="utf-8"))
    files = [rules / RULES_FILE, rules / ALERTS_FILE]
    present = {
        g["name"] for f in files for g in yaml.safe_load(f.read_text(encoding="utf-8"))["groups"]
    }
    return {
        "rule_files": [str(f) for f in files],
        "evaluation_interval": suite["evaluation_interval"],
        "group_eval_order": [g for g in suite["group_eval_order"] if g in present],
        "tests": [group],
    }


def _fails_on(rules: Path, group: dict[str, Any]) -> str:
    """promtool's output for ``group`` run against the rule files in ``rules`` (every rule
    case against the same rules started at once)."""

    def suites() -> dict[str, dict[str, Any]]:
        return {g["name"]: _baseline_suite(rules, g) for g in rule_cases()}

    result = _test_run(f"round two on {rules.name}", group["name"], suites)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    return output


class TestRoundTwo:
    def test_every_numbered_case_has_a_group(self) -> None:
        """Cases 1-8 of the second on-call review each have at least one group."""
        numbers = {_case(g) for g in round_two_cases()}
        assert numbers == ROUND_TWO_CASES

    @needs_promtool
    @pytest.mark.parametrize("group", rule_cases(), ids=lambda g: g["name"][:60])
    def test_case_fails_on_the_rules_before_the_fix(self, group: dict[str, Any]) -> None:
        """Each case fails on the rules as they were (baseline_round2/): it shows what misled
        the on-call, and the committed rules (test_unit_suite_passes) fix it."""
        output = _fails_on(BASELINE_ROUND_TWO, group)
        assert "FAILED:" in output
        assert "parse error" not in output
