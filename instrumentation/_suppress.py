"""Whether instrumentation is suppressed here (``opentelemetry.instrumentation.utils``).

Contrib instrumentors check ``is_instrumentation_enabled()`` (and, for HTTP,
``is_http_instrumentation_enabled()``) before each operation: inside
``suppress_instrumentation()`` or ``suppress_http_instrumentation()`` they make no span and
record nothing. stagelens does the same in the middleware, in ``stage()`` and in the
upstream transports. The public functions look the current context up once per key; the
same keys (``stagelens._compat``) are read here from one lookup: part of the shortcut
``context_headers`` (``stagelens._plain``), whose plain twin is the public functions
themselves (``STAGELENS_PLAIN=context_headers``). Invariant: the answer is the public
functions' for every combination of the keys set (tests/test_compat.py tries all).
"""

from __future__ import annotations

from collections.abc import Callable

from opentelemetry.context import Context
from opentelemetry.instrumentation.utils import (
    is_http_instrumentation_enabled,
    is_instrumentation_enabled,
)

from stagelens import _compat

current_context: Callable[[], Context] = _compat.current_context_getter()
"""``opentelemetry.context.get_current``, in one call (``_compat.current_context_getter``)."""


def _readers() -> tuple[Callable[[Context], bool], Callable[[], bool]]:
    keys = _compat.suppression_keys()
    if keys is None:  # pragma: no cover - depends on the installed versions
        return lambda ctx: is_instrumentation_enabled(), is_http_instrumentation_enabled
    (every, plain), (_, _, http) = keys

    def enabled_in(ctx: Context) -> bool:
        return not (ctx.get(every) or ctx.get(plain))

    def http_enabled() -> bool:
        ctx = current_context()
        return not (ctx.get(every) or ctx.get(plain) or ctx.get(http))

    return enabled_in, http_enabled


instrumentation_enabled_in, http_instrumentation_enabled = _readers()
"""``is_instrumentation_enabled()`` answered for the current context ``ctx`` (``stage()``
has it in hand anyway: its span's parent), and ``is_http_instrumentation_enabled()``, each
from one context lookup."""


def instrumentation_enabled() -> bool:
    """``is_instrumentation_enabled()``, from one context lookup."""
    return instrumentation_enabled_in(current_context())
