"""The modes of an upstream call (``_upstream``'s state machine) and how it ends: the span
of a call not made yet (``LATER``), the client's departure, what counts as a failure.
"""

from __future__ import annotations

import enum
from typing import Final

from opentelemetry import trace
from opentelemetry.trace import INVALID_SPAN_CONTEXT, NonRecordingSpan


class _Later(NonRecordingSpan):
    """The span of a call of an undecided trace that nothing asked for yet (``LATER``):
    recorded (the call holds what the span needs), but not made."""

    def is_recording(self) -> bool:
        return True


LATER: Final[trace.Span] = _Later(INVALID_SPAN_CONTEXT)
"""``_UpstreamCall.span`` of a call of an undecided trace whose span nothing asked for yet:
the call holds what its span needs, and makes it only when asked (``_recorded``: never
through ``span`` itself) or when the trace is kept (``as_deferred``)."""


class Mode(enum.Enum):
    """What an upstream call does with the next chunk of the body (``_upstream``'s docstring)."""

    BODY = "body"
    EVENTS = "events"
    PASS = "pass"
    FINISHED = "finished"


_BODY: Final = Mode.BODY
_EVENTS: Final = Mode.EVENTS
_PASS: Final = Mode.PASS
_FINISHED: Final = Mode.FINISHED


class ClientDisconnected(Exception):
    """Recorded on the inference span when the client's departure closed the stream."""

    def __init__(self) -> None:
        super().__init__("the client disconnected; the generation was aborted")


def _passed(chunk: bytes) -> bytes:
    """``on_chunk`` of a finished call: the chunk, as it came."""
    return chunk


def _is_failure(error: BaseException) -> bool:
    """An exception while reading an answered body that means the backend failed (the
    connection dropped, a protocol error), not that the reader was cancelled."""
    return isinstance(error, Exception) and not isinstance(error, ClientDisconnected)
