"""An upstream call of an agent API (the OpenAI Responses API, the Anthropic Messages API).

The call is the chat call (``_upstream._UpstreamCall``: its span, modes, metering and end),
its answer read as its API writes it: the stream's events by their names, each read by the
API's pure module (``_responses.py``, ``_messages.py``) into the facts the chat reader
takes, so that every reading means what it means on chat (TTFT and the first answer token
from the events' marks, inter-token gaps, usage, finish reasons, failures after the
headers). The API is picked once per call, by the request's path (``_calls.start_call``):
nothing here is on the chat path.

Differences from chat, and why:

- no usage option is added to the request: both APIs always end a stream with its usage;
- an event whose name says nothing the reader uses (``response.created``, the ``.done``
  events, ``ping``) is not parsed (the API module lists those it reads);
- usage is laid over earlier usage (the Messages API's is cumulative, given in parts);
  the usage seen before the final one (``message_start``'s input) bills the input of a
  stream cut before its end, its output estimated from the events received;
- an error event's code (never its message) is the span status's reason.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any, Final

import httpx
from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode
from stagelens.instrumentation._api_facts import ApiFacts, ApiReading
from stagelens.instrumentation._events import _TAIL_MAX
from stagelens.instrumentation._openai import ANSWER, REASONING, EventFacts, loads
from stagelens.instrumentation._sse import (
    data_of,
    name_fast,
    name_of,
    split_events,
    split_named,
)
from stagelens.instrumentation._upstream import _UpstreamCall

from stagelens import semconv as sc
from stagelens._plain import plain
from stagelens.engine_join import COMMENT_PREFIX, read_engine_comment
from stagelens.pricing import Usage
from stagelens.request import RequestState
from stagelens.telemetry import Telemetry

_PREFIX: Final = not plain("agent_prefix")
_NAMES: Final = not plain("agent_names")


class ApiCall(_UpstreamCall):
    """One instrumented call of an agent API; see the module docstring."""

    __slots__ = ("_api", "_counts", "_error_reason", "_seen_usage", "_think_at", "_thinking")

    _asks_usage = False

    def __init__(
        self,
        telemetry: Telemetry,
        state: RequestState | None,
        payload: dict[str, Any],
        operation: str,
        request: httpx.Request,
        api: ApiReading,
    ) -> None:
        self._api = api
        self._counts: dict[str, Any] = {}
        """The usage counts of the stream's events, each laid over the earlier ones."""
        self._seen_usage: Usage | None = None
        """Usage before the final one (the input the engine counted)."""
        self._error_reason: str | None = None
        self._thinking = False
        """The learned prefix (``_learned``) is of thinking events."""
        self._think_at = 0
        """How many marks ``_into`` held when the thinking events read from the prefix
        were last counted into ``_reasoning`` (``_fold_thinking``)."""
        super().__init__(telemetry, state, payload, operation, request)

    def read(self, chunk: bytes) -> bytes:
        """Read one chunk of the stream; return the bytes the app reads now (always the
        chunk: nothing is removed from these streams). The hot path of an agent stream.

        Shortcut (the learned prefix), as chat's (``EventReader.read``): nearly every chunk
        is one output event of the kind of an earlier one, and differs from it only from
        its output value on. A chunk that begins with ``_learned`` (an earlier output
        event's bytes up to its value, proved to decide the event's kind by
        ``_api_facts.learned_prefix``) is marked unparsed, and that is all: the marks are
        the output count, and the thinking ones among them are counted when the prefix
        may change or the stream ends (``_fold_thinking``), not one by one. Its plain twin is
        ``read_plainly`` (every event parsed); tests/instrumentation/test_agent_streams.py
        holds them equal.

        Invariant, as chat's: only a chunk that is exactly one event is taken here (of
        exact type ``bytes``, read from an event's start, its value not empty, its only
        line breaks the ``event:`` line's, inside the prefix, and the blank line ending
        it, no CR anywhere).
        """
        prefix = self._prefix
        if prefix is not None and type(chunk) is bytes:
            rest = chunk.removeprefix(prefix)  # from the output value on
            if rest is not chunk:
                line = rest.removesuffix(b"\n\n")  # the data line after the prefix
                if (
                    line is not rest
                    and rest[0] != 34  # a quote: the value is empty
                    and 10 not in line  # no other LF
                    and 13 not in line  # no CR: it ends an SSE line too
                ):
                    self._into.append(len(self._sent))  # marked, so counted (``outputs``)
                    return chunk
        out = self._read_named(chunk)
        # Read from the prefix again only at an event's start, and while reading.
        self._prefix = None if self._partial or not self._fast else self._learned
        return out

    def _read_named(self, chunk: bytes) -> bytes:
        """Split what was read into events and read each: one of the learned prefix's
        kind from its bytes (as ``read`` reads a chunk of one event: the same invariant,
        for an event of a chunk of several, as a proxy slower than its upstream reads
        them), one whose name says nothing the reader uses not at all, any other parsed."""
        if self._passing:
            return chunk
        if not self._partial and chunk.startswith(COMMENT_PREFIX):
            chunk = self._take_comment(chunk)
        skip = _NAMES and self._fast
        if skip and not self._partial and type(chunk) is bytes and chunk.startswith(b"event:"):
            # Shortcut: a chunk of one event of two lines, its name and its data (as the
            # agent APIs' servers write every event), is read from those lines' bytes: an
            # event whose name says nothing the reader uses is passed unread, any other's
            # data parsed, with no search of the whole event for other lines (an API's
            # last events repeat the whole answer). Invariant: exactly one event (its name
            # line, one data line, the blank line; no CR), so that no other name, data
            # line or event hides in it.
            first = chunk.find(b"\n")
            if (
                chunk.startswith(b"data:", first + 1)
                and chunk.find(b"\n", first + 1) == len(chunk) - 2
                and chunk[-1] == 10
                and 13 not in chunk
            ):
                name = chunk[7:first] if chunk[6] == 32 else chunk[6:first]
                if not self._api.reads(name):
                    return chunk
                # Its data, one leading space removed, as ``data_of`` reads it.
                start = first + 7 if chunk[first + 6] == 32 else first + 6
                try:
                    self._read_data(chunk, name, chunk[start:-2])
                except Exception as exc:  # never the app's problem: every byte passes on
                    self._report(sc.COMPONENT_UPSTREAM, exc)
                    self.stop_reading()
                return chunk
        try:
            read = chunk if type(chunk) is bytes else bytes(chunk)  # a copy to read from
            data = self._partial + read if self._partial else read
            if skip and 13 not in data:
                # Shortcut: with no CR, a blank line is "\n\n" and an event's lines hold
                # none, so splitting there finds the events split_events finds (its plain
                # twin, property-tested through the reader's), each without its blank
                # line; the last piece is the incomplete rest.
                pieces = data.split(b"\n\n")
                self._partial = pieces.pop()
                events: list[tuple[bytes, bytes | None]] = [(p, None) for p in pieces if p]
            else:
                found, end = split_events(data)
                self._partial = data[end:]
                events = [(data[a:b].rstrip(b"\r\n"), p) for a, b, p in found if p is not None]
            if len(self._partial) > _TAIL_MAX:
                raise ValueError("an event longer than the bound")
            for event, payload in events:
                self._read_event(event, payload, skip)
        except Exception as exc:  # never the app's problem: every byte passes on
            self._report(sc.COMPONENT_UPSTREAM, exc)
            self.stop_reading()
        return chunk

    def _take_comment(self, chunk: bytes) -> bytes:
        """Read the engine's comment (the vLLM server's stagelens middleware sends it as a
        body of its own, between two events) that begins ``chunk`` and remove it from what
        the app reads, as the chat reader does: the app reads the bytes vLLM wrote."""
        end = chunk.find(b"\n\n")
        if end < 0:
            return chunk  # cut: read when its event is complete, and passed on
        try:
            found = read_engine_comment(bytes(chunk[:end]))
        except Exception as exc:  # never the app's problem
            self._report(sc.COMPONENT_UPSTREAM, exc)
            return chunk
        if found is None:
            return chunk
        self.take_engine(found)
        return chunk[end + 2 :]

    def _read_event(self, event: bytes, payload: bytes | None, skip: bool) -> None:
        """Read one complete event: ``event`` its lines without the blank line ending it,
        ``payload`` its data (None: found here)."""
        prefix = self._learned
        if prefix is not None:
            rest = event.removeprefix(prefix)
            if rest is not event and rest and rest[0] != 34 and 10 not in rest and 13 not in rest:
                self._into.append(len(self._sent))
                return
        name = name_fast(event) if skip else name_of(event)
        if skip and name is not None and not self._api.reads(name):
            return
        if payload is None:
            payload = data_of(event)
            if payload is None:
                # A comment: the engine's share where it is one (passed on, as any comment
                # after an event in the same chunk: a client's SSE reader skips it).
                found = read_engine_comment(event)
                if found is not None:
                    self.take_engine(found)
                return
        self._read_data(event + b"\n\n", name, payload)

    def _read_data(self, whole: bytes, name: bytes | None, payload: bytes) -> None:
        """Read one event's data: ``whole`` the event's bytes with the blank line ending it
        (a prefix is learned from it when it is output), ``name`` its ``event:`` field."""
        facts = self._parse_named(name, payload)
        if facts is None:
            return
        if facts.outputs:
            self._outputs(facts)
            self._learn(whole, facts)
        self.take(facts)

    def _parse_named(
        self, name: bytes | None, payload: bytes, *, outputs: bool = True
    ) -> ApiFacts | None:
        """The facts of an event; None (counted, logged once) when it is not JSON."""
        try:
            facts = self._api.read_event(name, loads(payload))
        except (ValueError, RecursionError) as exc:
            self._report(sc.COMPONENT_UPSTREAM_EVENT, ValueError(type(exc).__name__))
            return None
        if not outputs:
            facts.outputs, facts.reasoning = [], []
        return facts

    def _outputs(self, facts: EventFacts) -> None:
        """A parsed event's output (``EventReader._outputs``): the thinking events read
        from the prefix before it counted first, so that its own marks are not."""
        self._fold_thinking()
        super()._outputs(facts)
        self._think_at = len(self._into)

    def _fold_thinking(self) -> None:
        """Count into ``_reasoning`` the thinking events read from the learned prefix since
        the last count: each added one mark to ``_into`` (and nothing else did, since
        ``_outputs`` moves ``_think_at`` past a parsed event's marks)."""
        if self._thinking:
            marks = len(self._into)
            self._reasoning += marks - self._think_at
            self._think_at = marks

    def _learn(self, event: bytes, facts: ApiFacts) -> None:
        """Learn the prefix of one output event's bytes (in a request only: a prefix
        marks, and outside one nothing is marked)."""
        marks, sends = self._marks0, self._sends
        if not (_PREFIX and self._fast and marks is not None and sends is not None):
            return
        kind = ANSWER if facts.answers else REASONING
        prefix = self._api.prefix_of(event, kind) if 13 not in event else None
        if prefix is not None:
            self._learned, self._thinking = prefix, kind == REASONING
            self._into, self._sent = marks, sends
            self._think_at = len(marks)

    def take(self, facts: EventFacts) -> None:
        """Apply an event's facts beyond output (``_UpstreamCall.take``), and what only
        these APIs say: usage laid over earlier usage, the stream's end, the error's code."""
        super().take(facts)
        if not isinstance(facts, ApiFacts):
            return
        counts = facts.counts
        if counts is not None:
            self._counts.update(counts)
            usage = self._api.usage_of(self._counts)
            if facts.final:
                self._usage = usage
                self._reasoning_reported = self._api.reports_reasoning(self._counts)
            else:
                self._seen_usage = usage
        if facts.ended:
            self._ended = True
        if facts.error_reason is not None:
            self._error_reason = facts.error_reason

    def settle(self) -> None:
        """The stream ended: read a last event left without its blank line (leniently,
        and not as output: the app's SSE reader drops it too)."""
        partial, self._partial = self._partial, b""
        if not partial.strip():
            return
        events, _ = split_named(partial + b"\n\n")
        for _, _, name, payload in events:
            if payload is not None and (name is None or self._api.reads(name)):
                facts = self._parse_named(name, payload, outputs=False)
                if facts is not None:
                    self.take(facts)

    def _answer_facts(self, body: Any) -> EventFacts:
        return self._api.answer_facts(body)

    def _capture_output(self, body: dict[str, Any]) -> None:
        output = json.dumps(self._api.output_messages(body))
        self.span.set_attribute(sc.GEN_AI_OUTPUT_MESSAGES, output)

    def _metered(self, answered: bool) -> tuple[Usage | None, str | None, bool]:
        """The chat call's metering; a stream cut before its final usage is billed the
        input its API said before (the engine's own count), or the request's text
        estimated as its API writes it, and the output received."""
        self._fold_thinking()
        usage, billing, counted = super()._metered(answered)
        if billing != sc.BILLING_ESTIMATED or usage is None:
            return usage, billing, counted
        seen = self._seen_usage
        if seen is None:
            usage = replace(usage, input_tokens=self._api.prompt_size(self._payload))
        else:
            usage = replace(
                usage,
                input_tokens=seen.input_tokens,
                cached_input_tokens=seen.cached_input_tokens,
                cache_write_input_tokens=seen.cache_write_input_tokens,
            )
        return usage, billing, counted

    def _set_response_attributes(
        self,
        span: trace.Span,
        error: BaseException | None,
        usage: Usage | None,
        estimated: str | bool | None,
    ) -> None:
        super()._set_response_attributes(span, error, usage, estimated)
        reason = self._error_reason
        if error is None and reason is not None and self._failure and self._status < 400:
            span.set_status(Status(StatusCode.ERROR, f"the upstream's error event: {reason}"))
