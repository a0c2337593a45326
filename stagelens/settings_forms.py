"""How each setting is written and where its value came from, read from its declaration.

Why a module apart from ``config``: the refusal of a bad value, ``stagelens config`` and
the generated settings reference all say the same things about a setting (its variable,
the form its value takes, an example, where the value came from), and all read them from
the one declaration (``config.Settings``: the annotation, ``Field(examples=[...])``, the
docstring). This module knows nothing of which settings exist: it is handed the fields.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Final, Literal

import annotated_types
from pydantic import ValidationError
from pydantic.fields import FieldInfo

ENV_PREFIX: Final = "STAGELENS_"
"""Every stagelens environment variable starts with this."""

Source = Literal["default", "environment", "keyword"]
"""Where a setting's value came from: its default, an environment variable, or a keyword
(``configure(tenants=...)``, ``Settings(...)``, ``Telemetry.derive(...)``)."""

Kind = Literal["list", "map", "switch", "integer", "number", "path", "text"]
"""The form a setting's value is written in."""

_FORMS: Final[dict[Kind, str]] = {
    "list": "a list: comma-separated, or a JSON array",
    "map": "key=value pairs, comma-separated, or a JSON object",
    "switch": "1/true/yes/on or 0/false/no/off",
    "integer": "an integer",
    "number": "a number",
    "path": "a file path",
    "text": "a string",
}


class CrossFieldError(ValueError):
    """A value refused because of another setting's (``tenants`` longer than
    ``max_tenants``): the refusal names every variable involved."""

    def __init__(self, message: str, *fields: str) -> None:
        super().__init__(message)
        self.fields = fields


def variable(name: str) -> str:
    """The environment variable of setting ``name`` (``tenants`` -> ``STAGELENS_TENANTS``)."""
    return ENV_PREFIX + name.upper()


def env_value(environ: Mapping[str, str], name: str) -> str | None:
    """The raw text of ``name``'s variable in ``environ`` (any case, as pydantic-settings
    reads it; the upper-case spelling first), or None when it is not set."""
    wanted = variable(name)
    if wanted in environ:
        return environ[wanted]
    return next((v for k, v in environ.items() if k.upper() == wanted), None)


def kind(field: FieldInfo) -> Kind:
    """The form of ``field``'s value, from its annotation."""
    annotation = field.annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
    origin = typing.get_origin(annotation) or annotation
    if origin in (tuple, list, frozenset, set):
        return "list"
    if origin is dict:
        return "map"
    if origin is bool:
        return "switch"
    if origin is int:
        return "integer"
    if origin is float:
        return "number"
    if isinstance(origin, type) and issubclass(origin, Path):
        return "path"
    return "text"


def form(field: FieldInfo) -> str:
    """What ``field``'s value must look like, bounds included (``an integer, >= 0, <= 1000``)."""
    items = typing.get_args(field.annotation)
    text = _FORMS[kind(field)]
    if kind(field) == "list" and items and items[0] is int:
        text = "a list of integers: comma-separated, or a JSON array"
    if kind(field) == "map" and len(items) == 2 and items[1] in (float, int):
        text = "key=value pairs with numbers as values, comma-separated, or a JSON object"
    bounds = [_bound(m) for m in field.metadata]
    return ", ".join([text, *(b for b in bounds if b)])


def _bound(constraint: object) -> str:
    for cls, attribute, sign in (
        (annotated_types.Gt, "gt", ">"),
        (annotated_types.Ge, "ge", ">="),
        (annotated_types.Lt, "lt", "<"),
        (annotated_types.Le, "le", "<="),
    ):
        if isinstance(constraint, cls):
            return f"{sign} {getattr(constraint, attribute)}"
    return ""


def example(field: FieldInfo) -> str:
    """The field's example value, as written in its environment variable."""
    return str((field.examples or [""])[0])


def as_text(value: Any) -> str:
    """``value`` written as its environment variable takes it (``acme,globex``,
    ``acme=100.0,globex=50.0``, ``true``; ``""`` for None or an empty list)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Mapping):
        return ",".join(f"{k}={as_text(v)}" for k, v in value.items())
    if isinstance(value, tuple | list | set | frozenset):
        return ",".join(as_text(v) for v in value)
    return str(value)


def nearest(name: str, known: Iterable[str]) -> str | None:
    """The known name closest to ``name`` (a typo's intended spelling), or None when none
    is close. Compared without the common ``STAGELENS_`` prefix, which would make every
    pair look alike."""

    def bare(text: str) -> str:
        upper = text.upper()
        return upper[len(ENV_PREFIX) :] if upper.startswith(ENV_PREFIX) else upper

    by_bare = {bare(k): k for k in known}
    found = difflib.get_close_matches(bare(name), list(by_bare), n=1, cutoff=0.6)
    return by_bare[found[0]] if found else None


def explain(
    exc: ValidationError,
    fields: Mapping[str, FieldInfo],
    keywords: Mapping[str, Any],
    environ: Mapping[str, str],
) -> str:
    """One line per refused value: the variable (or keyword) and what it got, the reason,
    and the expected form with an example."""
    lines = [_one(error, fields, keywords, environ) for error in exc.errors(include_url=False)]
    if len(lines) == 1:
        return f"invalid stagelens setting: {lines[0]}"
    return "invalid stagelens settings:\n" + "\n".join(f"- {line}" for line in lines)


def _given(
    name: str, fields: Mapping[str, FieldInfo], keywords: Mapping[str, Any], environ: Any
) -> str:
    if name in keywords:
        return f"{name}={keywords[name]!r}"
    raw = env_value(environ, name)
    if raw is not None:
        return f"{variable(name)}={raw!r}"
    field = fields.get(name)
    default = field.get_default(call_default_factory=True) if field is not None else None
    return f"{variable(name)} (unset; default {as_text(default)!r})"


def _one(
    error: Any, fields: Mapping[str, FieldInfo], keywords: Mapping[str, Any], environ: Any
) -> str:
    message = str(error["msg"]).removeprefix("Value error, ")
    loc = error["loc"]
    if not loc:  # a model validator: name every setting involved
        cause = error.get("ctx", {}).get("error")
        involved = getattr(cause, "fields", ())
        given = "; ".join(_given(f, fields, keywords, environ) for f in involved)
        return f"{message} ({given})" if given else message
    name = str(loc[0])
    if error["type"] == "extra_forbidden":
        close = nearest(name, fields)
        hint = f"; did you mean {close.lower()}?" if close else ""
        return f"{name}={error['input']!r}: no such setting{hint}"
    where = ""
    if len(loc) > 1:
        part, got = loc[1], error.get("input")
        where = f"item {part + 1} {got!r}: " if isinstance(part, int) else f"{part}={got!r}: "
    field = fields[name]
    expected = f"expected {form(field)}, e.g. {variable(name)}={example(field)}"
    return f"{_given(name, fields, keywords, environ)}: {where}{message}; {expected}"
