"""Pure reading of Server-Sent Events as an OpenAI-compatible server streams them.

No I/O and no telemetry here: every function takes bytes and returns what it found, so
that each can be tested on its own with arbitrary bytes and chunkings
(tests/instrumentation/test_sse.py). What an event's JSON means is ``_openai.py``'s; the
upstream call (``_upstream.py``) decides when each runs.

Framing follows the SSE specification: lines end with CRLF, LF or CR; a blank line ends an
event; an event's data is its ``data:`` lines' values (one leading space removed) joined
with LF, its type its ``event:`` field's; comments (``:``) and other fields carry no data.
"""

from __future__ import annotations

import re
from typing import Final

DONE: Final = b"[DONE]"
"""The payload of the stream's terminating event."""

Event = tuple[int, int, bytes | None]
"""One complete event in a buffer: (start offset, end offset past its blank line, data);
the data is None for an event without ``data:`` lines (a comment, a keep-alive)."""

_LINE_END: Final = re.compile(rb"\r\n|\r|\n")


def data_of(block: bytes) -> bytes | None:
    """The data of one event's lines (no blank line among them), LF-separated."""
    values = []
    for line in block.split(b"\n"):
        if line.startswith(b"data:"):
            value = line[5:]
            values.append(value[1:] if value[:1] == b" " else value)
        elif line == b"data":
            values.append(b"")
    return b"\n".join(values) if values else None


def split_events(data: bytes) -> tuple[list[Event], int]:
    """The complete events in ``data`` and the offset where the incomplete rest begins.

    Why offsets: the call removes the usage event it asked for by its exact bytes, and
    keeps an incomplete event for the next chunk; everything else reaches the app as it
    came. An event spans its lines and the blank line that ends it; blank lines before an
    event belong to no event. A final CR is held back (a CRLF may be split across chunks).
    """
    events: list[Event] = []
    start = line_start = 0
    lines: list[bytes] = []
    for end in _LINE_END.finditer(data):
        if end.group() == b"\r" and end.end() == len(data):
            break  # maybe the first half of a CRLF: wait for the next chunk
        line = data[line_start : end.start()]
        line_start = end.end()
        if line:
            lines.append(line)
            continue
        if lines:  # a blank line ends the event
            events.append((start, line_start, data_of(b"\n".join(lines))))
            lines = []
        start = line_start  # blank lines before an event belong to no event
    return events, start


NamedEvent = tuple[int, int, bytes | None, bytes | None]
"""One complete event in a buffer, with its type: (start offset, end offset past its blank
line, its ``event:`` field's value or None, its data or None)."""


def named_of(block: bytes) -> tuple[bytes | None, bytes | None]:
    """The ``event:`` field (the last one, one leading space removed) and the data of one
    event's lines (no blank line among them), LF-separated."""
    name = None
    for line in block.split(b"\n"):
        if line.startswith(b"event:"):
            value = line[6:]
            name = value[1:] if value[:1] == b" " else value
        elif line == b"event":
            name = b""
    return name, data_of(block)


def name_of(event: bytes) -> bytes | None:
    """The ``event:`` field of one complete event's bytes (any line ends), or None."""
    name, _ = named_of(b"\n".join(_LINE_END.split(event)))
    return name


def name_fast(event: bytes) -> bytes | None:
    """``name_of``, read from the first line alone when the event begins with its one
    ``event:`` line and has no CR: how the agent APIs' servers write every event.

    Why: the agent reader needs every event's name, and splitting an event of a kilobyte
    into lines to find the name on its first costs more than reading that event's output.
    Invariant: any later line starting ``event`` (a second name, which would win) sends
    the event to ``name_of``, as does a CR (it ends lines too). Its plain twin is
    ``name_of``; tests/instrumentation/test_sse.py holds them equal on any bytes.
    """
    if event.startswith(b"event:") and 13 not in event and b"\nevent" not in event:
        first = event.find(b"\n")
        name = event[6:first] if first >= 0 else event[6:]
        return name[1:] if name[:1] == b" " else name
    return name_of(event)


def split_named(data: bytes) -> tuple[list[NamedEvent], int]:
    """``split_events`` for a stream whose events name their type (the Responses and
    Messages APIs): the same events, each with its ``event:`` field."""
    events, end = split_events(data)
    named = [(start, stop, name_of(data[start:stop]), payload) for start, stop, payload in events]
    return named, end


def is_done(payload: bytes) -> bool:
    """The event is the stream's terminator (``[DONE]``, spaces around allowed)."""
    return payload.strip() == DONE


def _keys(name: bytes) -> tuple[bytes, bytes]:
    return name + b':"', name + b': "'


_CHAT_KEYS: Final = _keys(b'"content"')
_TEXT_KEYS: Final = _keys(b'"text"')


def content_keys(chat: bool) -> tuple[bytes, bytes]:
    """The output key of a chat (``content``) or completion (``text``) event, followed by
    the opening quote of its value, as compact JSON (vLLM) and as ``json.dumps`` spaces it."""
    return _CHAT_KEYS if chat else _TEXT_KEYS


def output_fast(payload: bytes, key: bytes) -> bool:
    """True when the event's JSON has the output key of ``key`` (see ``content_keys``)
    with a non-empty string value: the event carries generated output. False means "not
    shown here" (the event is then parsed), never "no output".

    Why: nearly every event of a stream is a content event, and finding one key is far
    cheaper than parsing the event (its plain twin, which ``EventReader.read_plainly``
    uses). Invariant: ``payload`` must be JSON as encoders write it (one event's data, one
    line): there a quoted key followed by a colon cannot lie inside a JSON string (its
    quotes would be escaped), and one preceded by a backslash is refused. Data that is no
    JSON (two objects glued, a cut one) may hold the key anyway: that is why the reader
    parses every event that is not one whole line. Soundness against the parsed event is
    property-tested (tests/instrumentation/test_sse.py).
    """
    at = payload.find(key)
    if at <= 0 or payload[at - 1] == 92:  # 92: a backslash (the quote is escaped)
        return False
    return payload[at + len(key) : at + len(key) + 1] not in (b'"', b"")
