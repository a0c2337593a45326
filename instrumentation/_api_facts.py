"""What one event of an agent API says, in the shape the stream reader takes.

The Responses API (``_responses.py``) and the Messages API (``_messages.py``) read their
events into ``ApiFacts``: ``_openai.EventFacts`` with the same fields, so that the reader
and the call take either, and the few that only these APIs say: the stream's end apart
from a finish reason, why an error event failed, and usage seen before the final one.

Also here: the prefix a stream reader may match later events of one kind by
(``learned_prefix``), proved for the chunk it is learned from by reading that chunk's
bytes up to its value, closed, with the API's own reading.

No I/O and no telemetry: every function takes bytes or decoded JSON and returns what it
found, and never raises on a shape it did not expect (the bytes come from the network).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, Final, NamedTuple

from stagelens.instrumentation._openai import ANSWER, NO_OUTPUT, REASONING, EventFacts, loads

from stagelens.pricing import Usage

_REASON: Final = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
"""An error code or type as an API writes them (``server_error``, ``overloaded_error``)."""
REASON_OTHER: Final = "other"
"""The reason of an error event whose code is missing or not a plain code."""


class ApiFacts(EventFacts):
    """One agent API event's facts (``_openai.EventFacts``' fields, read by the same
    code), with what only these APIs say."""

    __slots__ = ("counts", "ended", "error_reason", "final")

    def __init__(self) -> None:  # nothing to parse: the API's reader fills it in
        self.outputs: list[int] = []
        self.reasoning: list[int] = []
        self.finish_reasons: list[str] = []
        self.usage: Usage | None = None
        self.reasoning_reported = False
        self.error = False
        self.id: str | None = None
        self.model: str | None = None
        self.metrics: dict[str, Any] | None = None
        self.no_choices = False
        """Never the usage-only event of a chat stream (that the chat reader may remove)."""
        self.ended = False
        """The stream's last event (``message_stop``; the Responses API's final events
        say a finish reason, which ends it too)."""
        self.error_reason: str | None = None
        """The error's code or type as the API wrote it, when it is a plain code (never
        its message, which can quote the prompt); ``REASON_OTHER`` otherwise."""
        self.counts: dict[str, Any] | None = None
        """The usage object as the event wrote it: its fields are laid over those of the
        stream's earlier events (the Messages API's usage is cumulative, each event giving
        the counts it knows) and read by the API's ``usage_of``."""
        self.final = False
        """``counts`` are the call's final usage (else the usage seen so far: the Messages
        API's ``message_start`` gives the input the engine counted, and no output yet)."""

    def output(self, kind: int) -> None:
        """The event carries output of ``kind`` (``_openai.ANSWER`` or ``REASONING``);
        these APIs stream one answer, counted as choice 0."""
        if kind != NO_OUTPUT:
            self._add(0, kind)

    @property
    def says_only_output(self) -> bool:
        """Nothing in the event but its output (no usage, end, error, id, model or
        engine timings): an event a reader may count from its bytes alone."""
        return (
            self.usage is None
            and self.counts is None
            and not self.finish_reasons
            and not self.ended
            and not self.error
            and self.id is None
            and self.model is None
            and self.metrics is None
        )

    def fail(self, reason: Any) -> None:
        """The event is an error: the stream failed after its headers, for ``reason``."""
        self.error = True
        self.ended = True
        plain = isinstance(reason, str) and _REASON.fullmatch(reason) is not None
        self.error_reason = reason if plain else REASON_OTHER


def text(value: Any) -> str | None:
    """``value`` when it is a string, else None."""
    return value if isinstance(value, str) else None


def field(value: Any, *path: str) -> Any:
    """``value[path[0]][path[1]]...``, or None where a step is not an object."""
    for key in path:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


Reader = Callable[[bytes | None, Any], ApiFacts]
"""An API's reading of one event: (its ``event:`` field, its decoded data) to its facts."""


class ApiReading(NamedTuple):
    """How one agent API is read: what the upstream call asks of its API's module."""

    read_event: Reader
    """One event's facts; it reads an event's output from its name and the fields before
    its output value only (``learned_prefix`` relies on it)."""
    reads: Callable[[bytes], bool]
    """Whether events of this ``event:`` name are read at all: the others say nothing the
    reader uses, and are not parsed."""
    answer_facts: Callable[[Any], ApiFacts]
    """A whole answer's facts (not streamed)."""
    prefix_of: Callable[[bytes, int], bytes | None]
    """``learned_prefix`` for a chunk of output of a kind."""
    usage_of: Callable[[dict[str, Any]], Usage]
    """The usage of counts laid over each other (``ApiFacts.counts``), in stagelens'
    terms: input includes the cached and cache-written tokens, output the reasoning."""
    reports_reasoning: Callable[[dict[str, Any]], bool]
    """The counts say how many output tokens were reasoning (else the events are counted)."""
    prompt_size: Callable[[dict[str, Any]], int]
    """Input tokens estimated from the request's text, for a stream cut before any usage."""
    output_messages: Callable[[Any], Any]
    """A whole answer's output, recorded when content capture is on."""


def learned_prefix(
    chunk: bytes, read: Reader, kind: int, keys: tuple[bytes, ...], path: tuple[str, ...]
) -> bytes | None:
    """The bytes of ``chunk`` up to its output value's opening quote, when they alone
    decide that any event beginning with them, with a non-empty string value, carries
    output of ``kind``: None when they do not (or the chunk is not one event in the form
    ``event: NAME``, then ``data:`` and one line of JSON, then the blank line).

    ``keys`` are the value's key with its colon and opening quote (compact and spaced);
    ``path`` is where the value lies in the event's JSON. The proof: the JSON up to the
    value, closed after a one-character value (``"x"`` and a brace for each level of
    ``path``), must parse, hold ``"x"`` at ``path`` (so the key found is the value's
    key, at that level, not some other string's bytes) and be read as output of ``kind``
    by ``read`` with the event's name. What ``read`` decides for such an event it decides
    from the name and the fields before the value only (each API's reader says so), so
    every event of a server that writes its JSON as encoders do (no duplicate keys) and
    begins with these bytes is read alike.
    """
    first = chunk.find(b"\n")
    if not chunk.startswith(b"event:") or not chunk.startswith(b"data:", first + 1):
        return None
    if chunk.find(b"\n", first + 1) != len(chunk) - 2 or not chunk.endswith(b"\n\n"):
        return None
    name = chunk[6:first]
    name = name[1:] if name[:1] == b" " else name
    data = first + 6  # past "data:"; one space after it is no part of the data
    if chunk[data : data + 1] == b" ":
        data += 1
    for key in keys:
        at = chunk.find(key, data)
        if at < 0:
            continue
        prefix = chunk[: at + len(key)]
        closed = prefix[data:] + b'x"' + b"}" * len(path)
        try:
            value = loads(closed)
        except (ValueError, RecursionError):
            return None
        if field(value, *path) != "x":
            return None
        facts = read(name, value)
        found = ANSWER if facts.answers else REASONING if facts.reasoning else NO_OUTPUT
        return prefix if found == kind and facts.says_only_output else None
    return None
