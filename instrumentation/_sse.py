"""Pure parsing of an OpenAI-compatible server's answers: SSE events and JSON bodies.

No I/O and no telemetry here: every function takes bytes (or a decoded body) and returns
what it found, so that each can be tested on its own with arbitrary inputs (see
tests/instrumentation/test_sse.py). The upstream call (``_upstream.py``) decides when each
runs.

Why byte checks before parsing: most events of a stream only need to be recognised, not
parsed. A quoted key such as ``"usage"`` cannot occur inside a JSON string (quotes are
escaped there), so a substring check answers "is the key there" exactly; a precompiled
pattern runs only when the key is there but spaced differently, as ``json.dumps`` writes
it by default (``"usage": {``), where vLLM's compact JSON answers the plain check alone.
"""

from __future__ import annotations

import json
import json.scanner
import re
from collections.abc import Callable
from typing import Any, Final

from stagelens import semconv as sc
from stagelens.pricing import Usage

_USAGE_KEY: Final = b'"usage"'
_USAGE_COMPACT: Final = b'"usage":{'
_USAGE_RE: Final = re.compile(rb'"usage"\s*:\s*\{')
_CHOICES_KEY: Final = b'"choices"'
_NO_CHOICES_COMPACT: Final = b'"choices":[]'
_NO_CHOICES_RE: Final = re.compile(rb'"choices"\s*:\s*\[\s*\]')
_FINISH_KEY: Final = b'"finish_reason"'
_FINISH_COMPACT: Final = b'"finish_reason":"'
_FINISH_NULL_COMPACT: Final = b'"finish_reason":null'
_FINISH_NULL_SPACED: Final = b'"finish_reason": null'
_FINISH_RE: Final = re.compile(rb'"finish_reason"\s*:\s*"')
DONE: Final = b"[DONE]"
"""The payload of the stream's terminating event."""
_DONE_LINE: Final = re.compile(rb"data:[ \t]*\[DONE\]")
_DONE_WINDOW: Final = 64
"""``[DONE]`` is the stream's last event: it is looked for in the tail's last bytes only."""

PHASE_KEYS: Final = (
    (sc.PHASE_QUEUE, "queue_time_ms"),
    (sc.PHASE_PREFILL, "time_to_first_token_ms"),
    (sc.PHASE_DECODE, "generation_time_ms"),
)
"""The engine phases and the per-request metric of vLLM's response that times each."""
_NUMBER: Final = (int, float)
"""What a timing in vLLM's per-request metrics may be (a tuple: ``int | float`` would be
built anew on every check)."""


def _has(payload: bytes, key: bytes, compact: bytes, pattern: re.Pattern[bytes]) -> bool:
    """``pattern`` in ``payload``, answered by substring checks whenever possible."""
    if compact in payload:
        return True
    return key in payload and pattern.search(payload) is not None


def has_usage(payload: bytes) -> bool:
    """The event carries a usage object (``"usage": {...}``, not ``null``)."""
    return _USAGE_KEY in payload and _has(payload, _USAGE_KEY, _USAGE_COMPACT, _USAGE_RE)


def has_no_choices(payload: bytes) -> bool:
    """The event's choices are an empty list: with usage, the usage-only event that follows
    the last token. The one detector of that event (the middleware uses it too)."""
    return _has(payload, _CHOICES_KEY, _NO_CHOICES_COMPACT, _NO_CHOICES_RE)


def is_final_choice(payload: bytes) -> bool:
    """True when some choice in the event carries a finish reason (a string, not null)."""
    if _FINISH_COMPACT in payload:
        return True
    keys = payload.count(_FINISH_KEY)
    if not keys:
        return False
    nulls = payload.count(_FINISH_NULL_COMPACT) + payload.count(_FINISH_NULL_SPACED)
    return keys > nulls and _FINISH_RE.search(payload) is not None


_SCAN: Final[Callable[[str, int], tuple[Any, int]]] = json.scanner.make_scanner(
    json.JSONDecoder()  # type: ignore[arg-type]  # typeshed types the argument as the class
)
"""The JSON decoder's own scanner (C when available), as ``json.loads`` uses it."""


def loads(raw: bytes) -> Any:
    """``json.loads(raw)``, in one C call for the usual case (UTF-8, no whitespace around).

    Why: ``json.loads`` spends more time finding the encoding and stepping through its
    Python layers than parsing a short event; every upstream call parses its request body
    and its usage event. Anything unusual takes ``json.loads`` itself, same result, same
    errors.
    """
    try:
        text = raw.decode()
        value, end = _SCAN(text, 0)
    except (UnicodeDecodeError, StopIteration):
        return json.loads(raw)
    if end != len(text):
        return json.loads(raw)  # trailing whitespace, or data after the value (refused)
    return value


def data_lines(buffer: bytearray, chunk: bytes) -> tuple[list[bytes], bytearray]:
    """Append ``chunk`` to the partial line in ``buffer``; return the payloads of the
    complete ``data:`` lines (stripped) and the new partial line."""
    buffer += chunk
    if b"\n" not in chunk:
        return [], buffer
    lines = buffer.split(b"\n")
    rest = bytearray(lines.pop())
    return [bytes(line[5:]).strip() for line in lines if line.startswith(b"data:")], rest


def _line_around(data: bytearray, at: int, start: int) -> tuple[int, bytes | None]:
    """(start offset, payload) of the SSE line holding offset ``at``; the payload is the
    JSON after ``data:``, or None when the line is no data line."""
    begin = data.rfind(b"\n", start, at) + 1 or start
    end = data.find(b"\n", at)
    line = bytes(data[begin : end if end >= 0 else len(data)])
    if not line.startswith(b"data:"):
        return begin, None
    return begin, line[5:].strip()


def _ends_with_done(data: bytearray, start: int) -> bool:
    """The tail's last data line is ``data: [DONE]`` and nothing else."""
    at = data.rfind(DONE, max(start, len(data) - _DONE_WINDOW))
    if at < 0:
        return False
    line_start = data.rfind(b"\n", start, at) + 1 or start
    found = _DONE_LINE.match(data, line_start)
    if found is None or found.end() != at + len(DONE):
        return False
    line_end = data.find(b"\n", at)
    return not data[found.end() : line_end if line_end >= 0 else len(data)].strip()


def final_events(data: bytearray, start: int, recording: bool) -> tuple[bool, list[bytes]]:
    """Read a stream's final events from its kept tail ``data[start:]`` (one choice).

    Returns (the last event arrived, the payloads to parse in stream order). With one
    choice, all that matters sits at the end of the stream: the last event carrying usage
    (a running total with continuous usage stats: the last is the final one), the choice's
    finish reason, and ``[DONE]``. Each is found by searching back from the end in C
    (``rfind``), not by walking the lines (a quoted key cannot occur inside a JSON string).
    Only the usage event is returned, with the finish event when ``recording`` (the span
    shows finish reasons); sampled out, only the usage event is looked for, and whether
    the stream ended is not decided (it sets a span's status alone).
    """
    ended = recording and _ends_with_done(data, start)
    usage_line = None
    at = data.rfind(_USAGE_KEY, start)
    while at >= 0 and _USAGE_RE.match(data, at) is None:  # "usage": null, or a value
        at = data.rfind(_USAGE_KEY, start, at)
    if at >= 0:
        usage_line = _line_around(data, at, start)
        if recording and usage_line[1] is not None and has_no_choices(usage_line[1]):
            ended = True  # the usage-only chunk comes after the last token
    finish_line = None
    at = data.rfind(_FINISH_KEY, start) if recording else -1
    if at >= 0 and _FINISH_RE.match(data, at) is not None:
        ended = True
        finish_line = _line_around(data, at, start)
    lines: tuple[tuple[int, bytes | None] | None, ...]
    if finish_line is None or finish_line == usage_line:
        lines = (usage_line,)
    elif usage_line is None:
        lines = (finish_line,)
    elif finish_line < usage_line:  # in stream order: the later event's usage wins
        lines = (finish_line, usage_line)
    else:
        lines = (usage_line, finish_line)
    return ended, [line[1] for line in lines if line is not None and line[1] is not None]


def usage_of(body: dict[str, Any]) -> Usage | None:
    """The usage an answer (or event) reports; None when it carries none."""
    usage = body.get("usage")
    if not isinstance(usage, dict):
        return None
    details = usage.get("prompt_tokens_details") or {}
    return Usage(
        input_tokens=int(usage.get("prompt_tokens") or 0),
        output_tokens=int(usage.get("completion_tokens") or 0),
        cached_input_tokens=int(details.get("cached_tokens") or 0),
    )


def finish_reasons_of(body: dict[str, Any]) -> list[str]:
    """The finish reasons of the choices an answer (or event) carries."""
    choices = body.get("choices") or ()
    return [str(reason) for choice in choices if (reason := choice.get("finish_reason"))]


def phases_of(engine: dict[str, Any] | None) -> list[tuple[str, float]]:
    """(phase, seconds) from vLLM's per-request metrics (``--enable-per-request-metrics``)."""
    if not engine:
        return []
    out = []
    for phase, key in PHASE_KEYS:
        value = engine.get(key)
        if isinstance(value, _NUMBER) and value >= 0:
            out.append((phase, value / 1000.0))
    return out
