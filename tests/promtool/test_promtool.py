"""Run promtool over the generated rule files and the unit-test suites beside this file."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from stagelens.alert_rules import ALERTS_FILE, ALL_ALERTS, RULES_FILE

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"

pytestmark = pytest.mark.skipif(not Path(PROMTOOL).exists(), reason="promtool not installed")


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PROMTOOL, *args], cwd=HERE, capture_output=True, text=True, timeout=120, check=False
    )


class TestPromtool:
    def test_check_rules_is_clean(self) -> None:
        """`promtool check rules` accepts both committed rule files without lint findings."""
        result = _promtool(
            "check", "rules", str(ROOT / "alerts" / RULES_FILE), str(ROOT / "alerts" / ALERTS_FILE)
        )
        assert result.returncode == 0, result.stdout + result.stderr
        assert "SUCCESS" in result.stdout

    @pytest.mark.parametrize("suite", sorted(p.name for p in HERE.glob("*_test.yaml")))
    def test_unit_suite_passes(self, suite: str) -> None:
        """Every promtool unit-test suite passes against the committed rules."""
        result = _promtool("test", "rules", suite)
        assert result.returncode == 0, result.stdout + result.stderr

    def test_every_alert_is_covered_on_both_sides_of_for(self) -> None:
        """Each alert appears in the suite with at least one empty and one non-empty expectation."""
        text = (HERE / "stagelens-alerts_test.yaml").read_text(encoding="utf-8")
        for alert in ALL_ALERTS:
            blocks = text.split(f"alertname: {alert}\n")[1:]
            assert blocks, f"{alert} has no promtool test"
            empty = [b for b in blocks if b.lstrip().startswith("exp_alerts: []")]
            assert empty, f"{alert} lacks a not-firing case"
            assert len(empty) < len(blocks), f"{alert} lacks a firing case"
