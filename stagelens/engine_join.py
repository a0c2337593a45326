"""How a request's engine time finds its way back: the request id the gateway sends to the
vLLM server, and the value the server's stagelens middleware sends back.

Why in the core: the gateway (``instrumentation``) writes the id and reads the value, the
vLLM plugin and middleware (``exporters``) read the id and write the value; the two never
import each other, so the one format both sides keep lives here. Pure functions, no I/O;
every reader takes untrusted text and answers None rather than raise (property-tested in
tests/test_engine_join.py).

The request id: ``<trace-id>-<span-id>`` (32 and 16 hex digits; ``0...0-<random>`` when no
trace is recorded for the call), then ``~<tenant>`` when the request has a tenant. vLLM keeps
the whole header inside its own request id (``chatcmpl-<id>-<suffix>``), so the plugin finds
it there. The tenant is the bounded label value (a configured name or a key fingerprint,
never a key), percent-encoded outside ``A-Z a-z 0-9 _ .`` so that it ends where vLLM's
suffix (``-``) begins.
"""

from __future__ import annotations

import math
import re
from typing import Final
from urllib.parse import unquote

NO_TRACE: Final = "0" * 32
"""The trace part of an id minted for a call whose trace is not recorded."""
TENANT_MARK: Final = "~"
"""Between the id and its tenant."""
_SAFE: Final = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.")
_ID: Final = re.compile(r"([0-9a-f]{32})-([0-9a-f]{16})(?:~([A-Za-z0-9_.%]+))?")
TENANT_MAX: Final = 256
"""The longest encoded tenant an id carries (a longer one is left out, never cut)."""
_VALUE: Final = re.compile(r"\s*seconds=([0-9]+(?:\.[0-9]+)?)\s*;\s*gpus=([0-9]{1,4})\s*")
COMMENT_PREFIX: Final = b": x-stagelens-engine "
"""An SSE comment line carrying the value at the end of a stream (SSE parsers skip it)."""


def encode_tenant(tenant: str) -> str:
    """``tenant`` with every character outside ``A-Z a-z 0-9 _ .`` percent-encoded (UTF-8)."""
    if all(c in _SAFE for c in tenant):
        return tenant
    return "".join(
        c if c in _SAFE else "".join(f"%{b:02X}" for b in c.encode("utf-8")) for c in tenant
    )


def minted_id(trace_id: int, span_id: int, tenant: str | None) -> str:
    """The request id for a call whose span is ``span_id`` of ``trace_id`` (0 and a random
    span id when no trace is recorded), with ``tenant`` when there is one."""
    base = "%032x-%016x" % (trace_id, span_id)  # noqa: UP031 (fixed-width hex, fastest)
    if not tenant:
        return base
    encoded = encode_tenant(tenant)
    return base if len(encoded) > TENANT_MAX else f"{base}{TENANT_MARK}{encoded}"


def read_id(text: str | None) -> tuple[str, str | None] | None:
    """``(key, tenant)`` of the first stagelens id found anywhere in ``text`` (vLLM adds a
    prefix and a suffix), the key being ``<trace>-<span>``; None when there is none. A
    tenant that does not decode to UTF-8 reads as None."""
    if not text:
        return None
    match = _ID.search(text)
    if match is None:
        return None
    key = f"{match.group(1)}-{match.group(2)}"
    encoded = match.group(3)
    if encoded is None or len(encoded) > TENANT_MAX:
        return key, None
    try:
        tenant = unquote(encoded, errors="strict")
    except UnicodeDecodeError:
        return key, None
    return key, tenant or None


def trace_of(key: str) -> tuple[int, int] | None:
    """(trace id, span id) of an id's key when it names a recorded trace, else None."""
    trace, _, span = key.partition("-")
    if trace == NO_TRACE or len(trace) != 32 or len(span) != 16:
        return None
    try:
        return int(trace, 16), int(span, 16)
    except ValueError:
        return None


def engine_value(seconds: float, gpus: int) -> str:
    """The header value (and comment text) for a request's engine ``seconds`` on an engine
    holding ``gpus`` GPUs."""
    return f"seconds={max(seconds, 0.0):.9f}; gpus={max(gpus, 0)}"


def read_engine_value(text: str | bytes | None) -> tuple[float, int] | None:
    """``(seconds, gpus)`` from a header value or comment text; None for anything else."""
    if text is None:
        return None
    if isinstance(text, bytes):
        try:
            text = text.decode("ascii")
        except UnicodeDecodeError:
            return None
    match = _VALUE.fullmatch(text)
    if match is None:
        return None
    seconds = float(match.group(1))
    if not math.isfinite(seconds):
        return None
    return seconds, int(match.group(2))


def engine_comment(seconds: float, gpus: int) -> bytes:
    """The SSE comment event (line and blank line) carrying the value."""
    return COMMENT_PREFIX + engine_value(seconds, gpus).encode("ascii") + b"\n\n"


def read_engine_comment(event: bytes) -> tuple[float, int] | None:
    """The value in one SSE event's bytes when it is the engine comment, else None."""
    if not event.startswith(COMMENT_PREFIX):
        return None
    return read_engine_value(event[len(COMMENT_PREFIX) :].rstrip(b"\r\n"))
