"""An exception recorded on a span without its message, unless content capture is on.

Why not ``Span.record_exception``: it writes the exception's message into the event's
``exception.message`` and into the last line of ``exception.stacktrace``, and the usual
status description (``"ValueError: ..."``) repeats it. A message can carry request
content: pydantic's validation errors quote the input value, a parser quotes the text it
choked on, an app may put the prompt in its own error. Nothing private reaches spans unless
``capture_message_content`` is on, so by default the event keeps the exception's type,
its escaped flag and a stack trace of frames only (the code, never the values), and the
status says the type. With capture on it is ``record_exception`` as the SDK writes it.
"""

from __future__ import annotations

import traceback

from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode

_EXCEPTION_EVENT = "exception"


def exception_type(exc: BaseException) -> str:
    """``exception.type`` as the SDK's ``record_exception`` writes it."""
    module, qualname = type(exc).__module__, type(exc).__qualname__
    return f"{module}.{qualname}" if module and module != "builtins" else qualname


def record_failure(
    span: trace.Span, exc: BaseException, *, capture: bool, status: bool = True
) -> None:
    """Record ``exc`` on ``span`` (its exception event and, with ``status``, an ERROR
    status), its message only when ``capture`` (content capture) is on."""
    if capture:
        span.record_exception(exc)
        if status:
            span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
        return
    name = exception_type(exc)
    frames = "".join(traceback.format_tb(exc.__traceback__))
    span.add_event(
        _EXCEPTION_EVENT,
        {
            "exception.type": name,
            "exception.stacktrace": f"Traceback (most recent call last):\n{frames}{name}\n",
            "exception.escaped": "False",
        },
    )
    if status:
        span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
