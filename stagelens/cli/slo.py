"""``stagelens slo render``: write the recording rules, the alerts and the runbook from one
SLO config.

Why here: writing the three files needs both the alert generator and the runbook, and the
runbook reads the alerts; the command that joins them sits above both, so neither imports
the other's caller.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from stagelens.slo.alert_rules import (
    ALERTS_FILE,
    RULES_FILE,
    RUNBOOK_FILE,
    dump_yaml,
    render_alerts,
)
from stagelens.slo.config import SloConfig, load_slo_config
from stagelens.slo.recording_rules import render_rules
from stagelens.slo.runbook import render_runbook


def write_rule_files(cfg: SloConfig, out_dir: Path) -> list[Path]:
    """Write the recording-rule and alert files and the runbook into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    files = (
        (RULES_FILE, dump_yaml(render_rules(cfg))),
        (ALERTS_FILE, dump_yaml(render_alerts(cfg))),
        (RUNBOOK_FILE, render_runbook(cfg)),
    )
    for name, text in files:
        path = out_dir / name
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


def _render(args: argparse.Namespace) -> int:
    cfg = load_slo_config(args.config)
    for path in write_rule_files(cfg, args.out):
        print(path)
    return 0


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``stagelens slo render``."""
    slo = subparsers.add_parser("slo", help="SLO recording rules and alerts")
    slo_sub = slo.add_subparsers(dest="slo_command", metavar="SLO_COMMAND", required=True)
    render = slo_sub.add_parser(
        "render", help="write recording rules, alerts and the runbook from a config"
    )
    render.add_argument("--config", type=Path, default=None, help="SLO config YAML")
    render.add_argument("--out", type=Path, default=Path("alerts"), help="output folder")
    render.set_defaults(func=_render)
