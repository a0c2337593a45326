"""The states and ends of an upstream call that code around the call reads too.

``Mode`` is what the call does with its next chunk (see ``_upstream``);
``ClientDisconnected`` is recorded on the span of a call the client's departure closed.
The transports (``httpx.py``) read them as the call (``_upstream.py``) does.
"""

from __future__ import annotations

import enum


class Mode(enum.Enum):
    """What an upstream call does with the next chunk of the body (see ``_upstream``)."""

    BODY = "body"
    EVENTS = "events"
    PASS = "pass"
    FINISHED = "finished"


class ClientDisconnected(Exception):
    """Recorded on the inference span when the client's departure closed the stream."""

    def __init__(self) -> None:
        super().__init__("the client disconnected; the generation was aborted")


def passed(chunk: bytes) -> bytes:
    """``on_chunk`` of a finished call: the chunk, as it came."""
    return chunk


def is_failure(error: BaseException) -> bool:
    """An exception while reading an answered body that means the backend failed (the
    connection dropped, a protocol error), not that the reader was cancelled."""
    return isinstance(error, Exception) and not isinstance(error, ClientDisconnected)
