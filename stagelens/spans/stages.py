"""The stage of an undecided trace open in this context: how spans started inside a
stage whose span is still data (``DeferredSpan``) find it as their parent.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from typing import Any, Final, Protocol

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import SpanKind, get_current_span

from stagelens import _compat
from stagelens.spans.pending import DeferredSpan, PendingTrace

_SPAN_KEY: Final = _compat.span_key()


class OpenStage(Protocol):
    """A stage of an undecided trace, open in a context (``enter_stage``): ``stage()``
    itself, which records a ``DeferredSpan`` only when something asks for its span, or a
    ``DeferredSpan``."""

    @property
    def anchor(self) -> trace.Span:
        """The span current in the OpenTelemetry context when the stage began."""
        ...

    def deferred(self) -> DeferredSpan | None:
        """The stage's span as data, made on the first call; None once the stage has
        closed without one (its record is held already)."""
        ...


_OPEN: contextvars.ContextVar[OpenStage | None] = contextvars.ContextVar(
    "stagelens_open_stage", default=None
)
open_stage: Final[Callable[[], OpenStage | None]] = _OPEN.get
"""The innermost stage open in this context, or None (one C call)."""


def anchor_in(ctx: Context) -> trace.Span:
    """The span current in ``ctx``: one lookup where ``_compat.span_key`` knows the key,
    else as the OpenTelemetry API finds it."""
    found: Any = ctx.get(_SPAN_KEY) if _SPAN_KEY is not None else None
    return found if found is not None else get_current_span(ctx)


def parent_under(anchor: trace.Span, opened: OpenStage | None) -> trace.Span:
    """The parent of what begins with ``anchor`` current while ``opened`` is the open
    stage: that stage (its span as data) when it began under ``anchor`` too, else
    ``anchor``."""
    if opened is not None and opened.anchor is anchor:
        span = opened.deferred()
        if span is not None:
            return span
    return anchor


def deferred_span(
    tracer: trace.Tracer,
    name: str,
    ctx: Context,
    pending: PendingTrace,
    attributes: dict[str, Any],
    kind: SpanKind = SpanKind.INTERNAL,
) -> DeferredSpan:
    """A ``DeferredSpan`` beginning now in ``ctx``, under the stage open there."""
    anchor = anchor_in(ctx)
    parent = parent_under(anchor, _OPEN.get())
    return DeferredSpan(tracer, name, anchor, parent, pending, attributes, kind)


enter_stage: Final[Callable[[OpenStage], contextvars.Token[OpenStage | None]]] = _OPEN.set
"""Open a stage in this context (``open_stage``), until ``leave_stage`` with the token it
returns, in the same context (a ``with`` block's exit). The token's ``old_value`` is the
stage open around it (``contextvars.Token.MISSING`` for none yet in this context)."""
leave_stage: Final[Callable[[contextvars.Token[OpenStage | None]], None]] = _OPEN.reset
"""Close the stage ``enter_stage`` opened."""


def outer_stage(token: contextvars.Token[OpenStage | None]) -> OpenStage | None:
    """The stage that was open when ``enter_stage`` gave ``token``, or None."""
    outer = token.old_value
    return None if outer is contextvars.Token.MISSING else outer


def child_parent(parent: trace.Span) -> trace.Span:
    """The parent a span started now under ``parent`` (the context's current span) has:
    the stage open in this context when it began under ``parent`` (its span as data),
    else ``parent`` itself."""
    return parent_under(parent, _OPEN.get())
