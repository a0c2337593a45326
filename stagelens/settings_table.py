"""Every setting as a row: variable, value now, where it came from, default, form, meaning.

Read from the one declaration (``config.Settings``) for ``stagelens config`` (the values
of a running environment) and for the generated reference in ``docs/instrumenting.md``
(``stagelens.views.settings_docs``: defaults, forms, examples), so that neither can say
something the code does not do.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Mapping
from dataclasses import dataclass

from pydantic.fields import FieldInfo

from stagelens.config import DEFAULTS_FROM, Settings
from stagelens.settings_forms import as_text, env_value, example, form, variable


@dataclass(frozen=True)
class SettingRow:
    """One setting, described for a reader."""

    name: str
    """The keyword (``configure(tenants=...)``)."""
    variable: str
    """The environment variable (``STAGELENS_TENANTS``)."""
    value: str
    """Its value now, written as the variable takes it."""
    source: str
    """``default``, ``keyword``, ``environment`` or ``environment (OTEL_...)`` (a default
    read from another variable)."""
    default: str
    """Its default, written as the variable takes it (never read from the environment)."""
    default_from: str
    """The variable the default is read from when set (``DEFAULTS_FROM``), else ``""``."""
    form: str
    """What a value must look like."""
    example: str
    """An example value."""
    meaning: str
    """The setting's docstring, as one paragraph (``code`` in single backquotes)."""


def meaning(field: FieldInfo) -> str:
    """``field``'s docstring as one paragraph, its ````code```` in single backquotes."""
    text = " ".join(inspect.cleandoc(field.description or "").split())
    return text.replace("``", "`")


def default_text(name: str, field: FieldInfo) -> str:
    """``field``'s default as its variable would be written; for a default read from
    another variable (``DEFAULTS_FROM``), what it is when that variable is unset."""
    if name in DEFAULTS_FROM:
        return "false"  # every such default is a switch read by env_flag(..., False)
    return as_text(field.get_default(call_default_factory=True))


def rows(settings: Settings, environ: Mapping[str, str] | None = None) -> list[SettingRow]:
    """Every setting of ``settings``, in declaration order."""
    env = os.environ if environ is None else environ
    found: list[SettingRow] = []
    for name, field in Settings.model_fields.items():
        source = str(settings.sources.get(name, "default"))
        if source == "environment" and env_value(env, name) is None and name in DEFAULTS_FROM:
            source = f"environment ({DEFAULTS_FROM[name]})"
        found.append(
            SettingRow(
                name=name,
                variable=variable(name),
                value=as_text(getattr(settings, name)),
                source=source,
                default=default_text(name, field),
                default_from=DEFAULTS_FROM.get(name, ""),
                form=form(field),
                example=example(field),
                meaning=meaning(field),
            )
        )
    return found
