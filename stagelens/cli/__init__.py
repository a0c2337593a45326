"""The ``stagelens`` console script: one entry point, one module per subcommand.

Why a table of modules: each subcommand (report, trace, gpu-exporter, slo, ...) is a module
of this package (the demo's stays with the reference stack it starts) and is imported only
when chosen, so ``stagelens --help`` stays fast and a missing optional extra breaks only the
subcommand that needs it, with a clear message.

A subcommand module exposes ``add_parser(subparsers)``, which adds its parser and sets
``func`` (``Callable[[argparse.Namespace], int]``) as a default.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import Final

from stagelens._version import __version__
from stagelens.errors import StageLensError

SUBCOMMAND_MODULES: Final[tuple[str, ...]] = (
    "stagelens.reference.demo",
    "stagelens.cli.report",
    "stagelens.cli.trace",
    "stagelens.cli.gpu_exporter",
    "stagelens.cli.slo",
    "stagelens.cli.previews",
    "stagelens.cli.config",
)
"""Modules that contribute a subcommand, in help order."""


def build_parser() -> argparse.ArgumentParser:
    """Build the top-level parser with every subcommand."""
    parser = argparse.ArgumentParser(
        prog="stagelens",
        description="Seven-stage observability for LLM serving behind a gateway.",
    )
    parser.add_argument("--version", action="version", version=f"stagelens {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in SUBCOMMAND_MODULES:
        importlib.import_module(module_name).add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the process exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    try:
        return int(func(args))
    except StageLensError as exc:
        print(f"stagelens: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
