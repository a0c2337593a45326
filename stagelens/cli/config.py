"""``stagelens config``: every setting, its value here, where it came from, what it means.

Run it in the service's environment before starting the service: it reads the variables
as ``configure()`` does and refuses what ``configure()`` would refuse (exit status 2 and
the ``ConfigurationError``: the variable, what it held, the expected form), names each
``STAGELENS_*`` variable that is no setting with the nearest known name (an error under
``STAGELENS_STRICT=1``), and lists the variables that other parts of stagelens read.
``--json`` prints the same for a program. The rows come from the settings' one declaration
(``stagelens.settings_table``), as the reference in ``docs/instrumenting.md`` does.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import textwrap
from typing import Any

_WIDTH = 96
_INDENT = "    "
_PASSWORD = re.compile(r"(://[^/:@]*:)[^/@]*@")
"""The password of a URL (``redis://:secret@host``, ``postgresql://user:secret@host``)."""


def _redacted(value: str | None) -> str | None:
    """``value`` with a URL's password shown as ``***``: the output may be pasted in a
    ticket, and ``STAGELENS_REDIS_URL`` or ``STAGELENS_LEDGER_URL`` can hold one."""
    return None if value is None else _PASSWORD.sub(r"\1***@", value)


def _wrapped(text: str) -> list[str]:
    return textwrap.wrap(
        text, _WIDTH, initial_indent=_INDENT, subsequent_indent=_INDENT, break_on_hyphens=False
    )


def _text(rows: list[Any], others: list[Any], unknown: list[str]) -> str:
    from stagelens.settings_env import describe_unknown

    lines = ["stagelens settings, as configure() reads them here:", ""]
    for row in rows:
        lines.append(f"{row.variable}={row.value}  [{row.source}]")
        lines.extend(_wrapped(row.meaning))
        default = row.default or "(empty)"
        if row.default_from:
            default += f" ({row.default_from} when set)"
        lines.extend(_wrapped(f"Default: {default}. Form: {row.form}; e.g. {row.example}"))
        lines.append("")
    lines += ["Read by other parts of stagelens:", ""]
    for other in others:
        value = _redacted(os.environ.get(other.name))
        shown = f"={value}" if value is not None else " (unset)"
        lines.append(f"{other.name}{shown}  [{other.read_by}]")
        lines.extend(_wrapped(other.meaning))
    if unknown:
        lines += ["", "Not read by stagelens (STAGELENS_STRICT=1 refuses them):", ""]
        lines += [f"{describe_unknown(name)}." for name in unknown]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Print the settings; ConfigurationError (exit 2) where configure() would raise it."""
    from dataclasses import asdict

    from stagelens.config import load_settings
    from stagelens.settings_env import (
        OTHER_VARIABLES,
        describe_unknown,
        report_unknown_variables,
        unknown_variables,
    )
    from stagelens.settings_table import rows

    settings = load_settings()
    unknown = unknown_variables(os.environ)
    if settings.strict:
        report_unknown_variables(os.environ, strict=True)  # raises when any is unknown
    described = rows(settings)
    if args.json:
        document = {
            "settings": [asdict(row) for row in described],
            "other_variables": [
                {**asdict(other), "value": _redacted(os.environ.get(other.name))}
                for other in OTHER_VARIABLES
            ],
            "unknown_variables": [
                {"name": name, "problem": describe_unknown(name)} for name in unknown
            ],
        }
        print(json.dumps(document, indent=2))
    else:
        print(_text(described, list(OTHER_VARIABLES), unknown))
    return 0


def add_parser(subparsers: Any) -> None:
    """Register ``stagelens config [--json]``."""
    parser = subparsers.add_parser(
        "config",
        help="print every setting, its value here, where it came from and what it means",
        description=(
            "Print every STAGELENS_* setting as configure() reads it in this environment: "
            "its value, where it came from (default, environment, keyword) and its meaning; "
            "the variables other parts of stagelens read; and any STAGELENS_* variable "
            "stagelens does not read, with the nearest known name. Exit status 2 on what "
            "configure() would refuse (a bad value; an unknown variable under "
            "STAGELENS_STRICT=1)."
        ),
    )
    parser.add_argument("--json", action="store_true", help="print JSON for a program")
    parser.set_defaults(func=run)
