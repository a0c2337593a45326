"""Lists and maps in environment variables, written as OpenTelemetry's own are.

OpenTelemetry's variables set the form operators already write: a list is comma-separated
(``OTEL_PROPAGATORS=tracecontext,baggage``), a map is ``key=value`` pairs, comma-separated
(``OTEL_RESOURCE_ATTRIBUTES=service.name=gw,deployment.environment=prod``). Every list or
map setting of stagelens reads that form, and JSON (an array, an object) as well:

- a value whose first character (after white space) is ``[`` (a list) or ``{`` (a map) is
  JSON; anything else is the comma form;
- items, keys and values are trimmed of white space; empty items (``a,,b``, a trailing
  comma) are skipped, so an empty value is an empty list or map;
- a key given twice is refused, in either form (which one was meant is unknowable);
- an item, key or value that contains ``,`` (or a key that contains ``=``) needs JSON.

Pure functions: they return what they read (strings, or what the JSON held) and raise
``ValueError`` with the reason; the settings check the types of the items.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any


def parse_list(text: str) -> list[Any]:
    """The items of a comma-separated list or a JSON array; ValueError when it is neither."""
    stripped = text.strip()
    if stripped.startswith("["):
        # Valid JSON that starts with "[" is an array: anything after it is "Extra data".
        return [_trimmed(item) for item in _json(stripped)]
    return [item.strip() for item in stripped.split(",") if item.strip()]


def parse_map(text: str) -> dict[str, Any]:
    """The entries of ``key=value`` pairs, comma-separated, or of a JSON object; ValueError
    naming the first item that is no pair, or a key given twice."""
    stripped = text.strip()
    if stripped.startswith("{"):
        # An object's pairs in order, duplicates kept (json.loads would keep the last).
        pairs = _json(stripped, object_pairs_hook=list)
        return _unique((key.strip(), _trimmed(value)) for key, value in pairs)
    entries: list[tuple[str, Any]] = []
    for item in stripped.split(","):
        if not item.strip():
            continue
        key, equals, value = item.partition("=")
        if not equals:
            raise ValueError(f"{item.strip()!r} is no key=value pair")
        if not key.strip():
            raise ValueError(f"{item.strip()!r} has no key before '='")
        entries.append((key.strip(), value.strip()))
    return _unique(entries)


def _json(text: str, **options: Any) -> Any:
    try:
        return json.loads(text, **options)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON ({exc.msg} at character {exc.pos + 1})") from None


def _trimmed(value: Any) -> Any:
    return value.strip() if isinstance(value, str) else value


def _unique(entries: Iterable[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in entries:
        if key in result:
            raise ValueError(f"the key {key!r} is given twice")
        result[key] = value
    return result
