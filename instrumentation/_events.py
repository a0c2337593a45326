"""Reading a stream's events as they pass: the hot path of every streamed upstream call.

Each complete event is classified once (``_sse`` finds the events and answers the common
content event from its bytes; anything else is parsed by ``_openai``):

- an output-bearing event is counted for its choice and marked with the number of bodies
  the app has sent so far (see ``stagelens.request.InferenceFacts``): the request's first
  token and its inter-token gaps are read from those marks when it ends, per SSE event,
  however the network coalesced them;
- the first answer-bearing event (anything but reasoning, ``_openai``) is marked for the
  time to first answer token, and reasoning-only events are counted (the reasoning tokens
  of a stream whose usage does not say them);
- the usage, finish reasons, response id and engine timings are taken, an error event is
  a failure after the headers, ``[DONE]`` and the usage event end the stream;
- the usage event stagelens asked for (the app did not) is removed, and so is the vLLM
  server's comment with the request's engine time (``stagelens.engine_join``), which
  stagelens asked for with its request id: the app reads every other byte as it came. An
  incomplete event is held back for the next chunk only while removing the usage event.

Bytes never depend on the reading: whatever an event contains, the app gets the same
bytes (property-tested with arbitrary bytes and chunkings).
"""

from __future__ import annotations

import time
from typing import Final

from stagelens.instrumentation import _openai
from stagelens.instrumentation._sse import Event, content_keys, is_done, output_fast, split_events

from stagelens import semconv as sc
from stagelens._plain import plain
from stagelens.engine_join import COMMENT_PREFIX, read_engine_comment
from stagelens.pricing import Usage
from stagelens.request import InferenceFacts

_TAIL_MAX: Final = 48 * 1024
"""An incomplete event longer than this is not waited for: the stream is passed on
unread from there (memory stays bounded whatever the upstream sends)."""
_NONE: Final[list[int]] = []
_NONE_SENT: Final[list[float]] = []
"""Placeholders, never appended to: a prefix is learned with the real lists."""
_PREFIX: Final = not plain("reader_prefix")
_BYTES: Final = not plain("reader_bytes")
_OUTPUT_BYTES: Final = not plain("output_bytes")
_perf_counter: Final = time.perf_counter


class EventReader:
    """The per-event state of one streamed call (the base of ``_UpstreamCall``)."""

    __slots__ = (
        "_answered",
        "_asked_usage",
        "_ended",
        "_engine_share",
        "_failure",
        "_fast",
        "_finish_reasons",
        "_first_output_at",
        "_inference",
        "_into",
        "_key",
        "_keys",
        "_last_fast",
        "_learned",
        "_marks",
        "_marks0",
        "_partial",
        "_passing",
        "_prefix",
        "_reasoning",
        "_reasoning_reported",
        "_recording",
        "_response_id",
        "_sends",
        "_sent",
        "_span_later",
        "_span_left",
        "_strip",
        "_unmarked",
        "_usage",
        "_usage_after",
    )

    def __init__(
        self,
        *,
        recording: bool,
        chat: bool,
        single_choice: bool,
        sends: list[float] | None,
        inference: InferenceFacts | None,
        span_later: bool = False,
    ) -> None:
        self._recording = recording
        self._span_later = span_later
        """The span is built later, only if its trace is kept (the tail sampler): what only
        the span shows of the last event is read then (``read_last_for_span``)."""
        self._span_left = False
        """``settle`` left the span's part of the last event to ``read_last_for_span``."""
        self._keys = content_keys(chat)
        self._key = self._keys[0]
        """The output key as this stream writes it (compact or spaced), tried first."""
        self._sends = sends
        """The app's sends so far (``RequestState.token_times``), or None outside a request."""
        self._inference = inference
        self._marks: dict[int, list[int]] = {}
        """Per choice, the marks of its output-bearing events (see the module docstring)."""
        self._marks0: list[int] | None = None
        """Choice 0's marks when there is a request to mark for (single-choice hot path)."""
        if sends is not None and single_choice:
            self._marks0 = self._marks[0] = []
            if inference is not None:
                inference.choices.append(self._marks0)
        self._unmarked = 0
        """Output-bearing events read outside a request (inside one each is a mark)."""
        self._first_output_at: float | None = None
        self._answered = False
        """An answer-bearing event arrived (a content event read from its bytes is one)."""
        self._reasoning = 0
        """Reasoning-only output events read (each one token: vLLM streams one a delta)."""
        self._reasoning_reported = False
        """``_usage`` says the reasoning tokens itself."""
        self._partial = b""
        """The incomplete event at the end of what was read (held back when stripping)."""
        self._asked_usage = False
        """stagelens added ``stream_options.include_usage`` to the request."""
        self._strip = False
        """The usage event is removed from what the app reads (asked for, and answered)."""
        self._passing = False
        """Reading stopped (PASS): chunks go to the app untouched."""
        self._last_fast: bytes | None = None
        """The latest event chunk read from its bytes alone: its finish reason and running
        usage are read when the stream ends, if no later event said them."""
        self._fast = single_choice
        """A whole content event may be read from its bytes (one choice)."""
        self._ended = False
        """The stream's last event arrived ([DONE], a finish reason or the usage event)."""
        self._engine_share: tuple[float, int] | None = None
        """(seconds, GPUs): the request's share of the engine's time, as the server said."""
        self._failure: str | None = None
        """``error.type`` of a failure after the response headers."""
        self._usage: Usage | None = None
        self._usage_after: bytes | None = None
        """``_last_fast`` when ``_usage`` was read: a later content event's running usage
        (continuous usage stats) is newer than it."""
        self._finish_reasons: list[str] = []
        self._response_id: str | None = None
        self._prefix: bytes | None = None
        """While the next chunk may be read from its prefix: ``_learned`` (see ``read``)."""
        self._learned: bytes | None = None
        """A content event's bytes up to its output value (``data:``, the JSON before the
        value, the key and the value's opening quote), learned from the latest chunk that
        was one whole content event of choice 0, in a request."""
        self._into: list[int] = _NONE
        """Choice 0's marks, once a prefix is learned (then in a request)."""
        self._sent: list[float] = _NONE_SENT
        """The app's sends, once a prefix is learned."""

    def read(self, chunk: bytes) -> bytes:
        """Read one chunk; return the bytes the app reads now. The hot path of a stream.

        Shortcut (the learned prefix): nearly every chunk is one whole content event, and
        the events of a stream differ only from their output value on (vLLM writes the id,
        creation time and model before it, the same in every event). A chunk that begins
        with ``_learned`` (an earlier content event's bytes up to its value, see ``_read``)
        is such an event, its key a key because the JSON before it is byte for byte one
        that was found to hold it; it is counted and marked unparsed. Anything else goes to
        ``_read``. Its plain twin is ``read_plainly`` (every event parsed); the property
        tests in tests/instrumentation/test_stream_bytes.py hold them equal.

        Invariant: a chunk is taken here only when it is exactly one event: it is of exact
        type ``bytes`` (``removeprefix`` hands back the chunk itself only then, which
        ``is not`` tells), it starts at an event's start (nothing held back, see the end of
        this method), its output value is not empty (not a quote), and its only line break
        is the blank line ending it, with no CR anywhere (a CR ends an SSE line too: a chunk
        of two events must never be read as one, nor one event as two).
        """
        prefix = self._prefix
        if prefix is not None and type(chunk) is bytes:
            rest = chunk.removeprefix(prefix)  # from the output value on
            if rest is not chunk:
                line = rest.removesuffix(b"\n\n")  # the event's line after the prefix
                if (
                    line is not rest
                    and rest[0] != 34  # a quote: the value is empty
                    and 10 not in line  # no other LF
                    and 13 not in line  # no CR: it ends an SSE line too
                ):
                    self._into.append(len(self._sent))  # marked, so counted (``outputs``)
                    self._last_fast = chunk
                    return chunk
        out = self._read(chunk)
        # Read from the prefix again only at an event's start, and while reading.
        self._prefix = None if self._partial or not self._fast else self._learned
        return out

    def _read(self, chunk: bytes) -> bytes:
        """Read a chunk that is not a content event of the learned prefix (``read``).

        Shortcut (one whole content event from its bytes): a chunk whose one data line
        holds the output key with a non-empty string value (sound for JSON as encoders
        write it, see ``_sse.output_fast``) is counted and marked without parsing, and its
        bytes up to the value become the prefix ``read`` matches. Invariant, as in ``read``:
        only a chunk that is exactly one event (``data:`` at its start, then one line and
        the blank line, no CR), read from an event's start, and only while the stream is of
        one choice (``_fast``). Anything else is split into events and each is parsed.
        """
        if _BYTES and self._fast and not self._partial:
            key = self._key
            at = chunk.find(key, 5)
            if at < 0 and self._learned is None:  # maybe it spaces its JSON the other way
                key = self._keys[1] if key is self._keys[0] else self._keys[0]
                at = chunk.find(key, 5)
                if at > 5:
                    self._key = key
            if (
                at > 5
                and chunk.find(b"\n") == len(chunk) - 2
                and chunk[-1] == 10  # one line, then the blank line: one whole event
                and 13 not in chunk  # (a CR would end a line too)
                and chunk[at - 1] != 92  # no backslash: the key is no string's end
                and chunk[at + len(key)] != 34  # the value's first byte: not empty
                and chunk.startswith(b"data:")
            ):
                if not self._answered:  # (a content event answers)
                    self._first_answer(0)
                marks, sends = self._marks0, self._sends
                if marks is not None and sends is not None:
                    marks.append(len(sends))
                    if _PREFIX:
                        self._learned = chunk[: at + len(key)]  # read by ``read`` from the next
                    self._into, self._sent = marks, sends
                else:
                    self._unmarked += 1
                self._last_fast = chunk
                return chunk
        if self._passing:
            return chunk
        held = self._partial if self._strip else b""
        try:
            data = self._partial + chunk if self._partial else chunk
            events, end = split_events(data)
            self._partial = data[end:]
            if len(self._partial) > _TAIL_MAX:
                raise ValueError("an event longer than the bound")
            return self._read_events(events, data, chunk, end)
        except Exception as exc:  # never the app's problem: every byte passes on
            self._report(sc.COMPONENT_UPSTREAM, exc)
            self.stop_reading()
            return held + chunk

    def _read_events(self, events: list[Event], data: bytes, chunk: bytes, end: int) -> bytes:
        """Read complete events; return what the app reads now."""
        dropped: list[tuple[int, int]] = []
        sent = 0 if self._strip else len(data) - len(chunk)  # handed over with earlier chunks
        for start, stop, payload in events:
            if payload is None:
                if data.startswith(COMMENT_PREFIX, start):
                    found = read_engine_comment(data[start:stop])
                    if found is not None:
                        self.take_engine(found)
                        if start >= sent:
                            dropped.append((start, stop))
                continue
            if (
                _OUTPUT_BYTES
                and self._fast
                and output_fast(payload, self._key)
                and payload.find(b"\n") < 0
            ):
                # (One data line: lines joined are no JSON an encoder writes.)
                if not self._answered:
                    self._first_answer(0)
                self._output(0)
                self._last_fast = b"data:" + payload
                continue
            if is_done(payload):
                self._ended = True
                continue
            facts = self._parse(payload)
            if facts is None:
                continue
            if facts.outputs:
                self._outputs(facts)
            self.take(facts)
            if self._strip and facts.usage_only:
                dropped.append((start, stop))
        if not self._strip:
            if not dropped:
                return chunk
            kept, at = [], sent
            for start, stop in dropped:
                kept.append(data[at:start])
                at = stop
            kept.append(data[at:])  # not stripping: an incomplete rest is not held back
            return b"".join(kept)
        if not dropped:
            return chunk if data is chunk and end == len(data) else data[:end]
        kept, at = [], 0
        for start, stop in dropped:
            kept.append(data[at:start])
            at = stop
        kept.append(data[at:end])
        return b"".join(kept)

    def _parse(self, payload: bytes) -> _openai.EventFacts | None:
        """The facts of an event; None (counted, logged once) when it is not JSON."""
        try:
            facts = _openai.read_event(payload)
        except ValueError as exc:
            self._report(sc.COMPONENT_UPSTREAM_EVENT, exc)
            return None
        return facts

    def _report(self, component: str, exc: BaseException) -> None:
        """Count a failure to read (``_UpstreamCall`` reports it)."""

    def _outputs(self, facts: _openai.EventFacts) -> None:
        """A parsed event's output: each choice's, its reasoning counted, its answer marked."""
        if facts.answers and not self._answered:
            self._first_answer(facts.outputs[0])
        self._reasoning += len(facts.reasoning)
        for choice in facts.outputs:
            self._output(choice)

    def _output(self, choice: int) -> None:
        """One output-bearing event of ``choice`` arrived."""
        if self._first_output_at is None:
            self._first_output(choice)
        sends = self._sends
        if sends is not None:
            marks = self._marks.get(choice)
            if marks is None:
                marks = self._marks[choice] = []
                if self._inference is not None:
                    self._inference.choices.append(marks)
            marks.append(len(sends))
        else:
            self._unmarked += 1

    @property
    def outputs(self) -> int:
        """Output-bearing events read so far: in a request each is a mark of its choice
        (so the stream's hot path counts by marking), outside one each was counted."""
        return self._unmarked + sum(map(len, self._marks.values()))

    def _first_output(self, choice: int) -> None:
        """The call's first output-bearing event arrived now."""
        self._first_output_at = _perf_counter()
        self.mark_first()

    def mark_first(self) -> None:
        """The request's first output arrived now (the first of any of its calls counts)."""
        inference, sends = self._inference, self._sends
        if inference is not None and sends is not None and inference.first_output is None:
            inference.first_output = len(sends)

    def _first_answer(self, choice: int) -> None:
        """The call's first answer-bearing event arrived now (its first output too, when
        no reasoning came before it)."""
        self._answered = True
        if self._first_output_at is None:
            self._first_output(choice)
        self.mark_first_answer()

    def mark_first_answer(self) -> None:
        """The request's first answer output arrived now (the first of any of its calls)."""
        inference, sends = self._inference, self._sends
        if inference is not None and sends is not None and inference.first_answer is None:
            inference.first_answer = len(sends)

    def take(self, facts: _openai.EventFacts) -> None:
        """Apply an event's facts beyond its output: usage, end of stream, failure, and
        what only the span shows."""
        if facts.usage is not None:
            self._usage = facts.usage
            self._reasoning_reported = facts.reasoning_reported
            self._usage_after = self._last_fast
            if facts.usage_only:
                self._ended = True
        if facts.finish_reasons:
            self._ended = True
            if self._recording:
                self._finish_reasons += facts.finish_reasons
        if facts.error:
            self._failure = sc.ERROR_TYPE_UPSTREAM_ERROR_EVENT
            self._ended = True
        if self._recording and self._response_id is None:
            self._response_id = facts.id

    def take_engine(self, share: tuple[float, int]) -> None:
        """Take the server's (seconds, GPUs) for the call, and add it to the request's at
        once: the app may bill before the call ends (at the usage event)."""
        if self._engine_share is not None:
            return  # said once a call; a repeat is no second share
        self._engine_share = share
        inference = self._inference
        if inference is not None:
            inference.engine_seconds = (inference.engine_seconds or 0.0) + share[0]

    def read_plainly(self) -> None:
        """Make this reader its plain twin: from now on every chunk is split into events
        and every event parsed, none read from its bytes (what a stream of several choices
        always does). The twin the shortcuts are property-tested against."""
        self._fast = False
        self._prefix = self._learned = None

    def stop_reading(self) -> bytes:
        """Stop reading (PASS); return the bytes held back, handed over once."""
        self._fast = False
        self._passing = True
        self._prefix = self._learned = None
        return self.release()

    def release(self) -> bytes:
        """The bytes held back (an incomplete event, when stripping); handed over once."""
        held = self._partial if self._strip else b""
        self._partial = b""
        self._strip = False
        return held

    def settle(self) -> None:
        """The stream ended: read what only its end tells (lenient about a last event
        without its blank line; the latest content event's finish reason and usage)."""
        partial, self._partial = self._partial, b""
        if partial.strip():
            events, _ = split_events(partial + b"\n\n")
            for start, stop, payload in events:
                if payload is None:
                    found = read_engine_comment(partial[start:stop])
                    if found is not None:
                        self.take_engine(found)
                    continue
                if is_done(payload):
                    self._ended = True
                elif (facts := _quiet(payload)) is not None:
                    self.take(facts)  # not output: the app's SSE reader drops it too
        last = self._last_fast
        newer = last is not self._usage_after  # came after the event that gave ``_usage``
        if self._span_later and last is not None and not newer and self._ended:
            # Only the span's part would be read below: left until the span is built.
            # (Not newer means ``_usage`` is set: ``take`` sets it with ``_usage_after``,
            # and nothing unsets it; ended, a finish reason changes nothing else.)
            self._span_left = True
        elif last is not None and (newer or not self._ended or self._recording):
            facts = _quiet(last[5:].strip())  # read once: it was never parsed
            if facts is not None:
                if self._recording and self._response_id is None:
                    self._response_id = facts.id  # no event was parsed before it
                if facts.usage is not None and (newer or self._usage is None):
                    self._usage = facts.usage  # a running total (continuous usage stats)
                    self._reasoning_reported = facts.reasoning_reported
                if facts.finish_reasons:
                    self._ended = True
                    if self._recording:
                        self._finish_reasons += facts.finish_reasons

    def read_last_for_span(self) -> None:
        """What only the span shows of the last event read from its bytes (its id and
        finish reason), where ``settle`` left it (``span_later``): read as ``settle``
        reads it for a span built at once, from an event that said nothing else new."""
        last = self._last_fast
        if not self._span_left or last is None:
            return
        self._span_left = False
        facts = _quiet(last[5:].strip())
        if facts is not None:
            if self._response_id is None:
                self._response_id = facts.id
            if facts.finish_reasons:
                self._finish_reasons += facts.finish_reasons


def _quiet(payload: bytes) -> _openai.EventFacts | None:
    """An event's facts but its outputs (at the end no event is output: see ``settle``),
    or None when it is not JSON (a final partial read leniently)."""
    try:
        return _openai.read_event(payload, outputs=False)
    except ValueError:
        return None
