"""Pure reading of the Anthropic Messages API (``POST /v1/messages``): its stream's events
and its whole answer, as vLLM and Anthropic write them.

An event's type is its ``event:`` field, or, in a stream that does not name them, its
JSON's ``type``. What each type says:

- output: a ``content_block_delta`` whose delta is a ``text_delta`` (non-empty ``text``) or
  an ``input_json_delta`` (a tool call's arguments, non-empty ``partial_json``) is the
  answer, a ``thinking_delta`` (non-empty ``thinking``) thinking; a ``signature_delta`` is
  not output. A ``content_block_start`` of a tool call (``tool_use``, ``server_tool_use``,
  ``mcp_tool_use``) is the answer's first token: it names the tool, as chat's first
  tool-call delta does; a start with text or thinking already in it is output too, and a
  ``redacted_thinking`` block thinking. A delta's output is read from its type and its
  delta's ``type`` and text alone.
- usage: ``message_start`` gives the usage the engine counted before generating (its
  input), ``message_delta`` the final one, cumulative; each gives the counts it knows,
  laid over the earlier ones. ``input_tokens`` counts only the tokens neither read from
  nor written to the cache, so the input is ``input_tokens + cache_read_input_tokens +
  cache_creation_input_tokens``; thinking tokens are part of ``output_tokens`` and not
  said apart (they are counted from the thinking events).
- the end: ``message_delta``'s ``stop_reason`` (the finish reason), ``message_stop``.
- failures: ``error`` (its ``error.type`` the reason).
- ``ping``, ``content_block_stop`` say nothing the reader uses, and are not parsed.

Nothing here trusts a shape: a field of the wrong type reads as absent.
"""

from __future__ import annotations

from typing import Any, Final

from stagelens.instrumentation._api_facts import ApiFacts, ApiReading, field, learned_prefix, text
from stagelens.instrumentation._openai import ANSWER, REASONING, texts_of, token_count

from stagelens.pricing import Usage

_DELTAS: Final = {
    "text_delta": ("text", ANSWER),
    "input_json_delta": ("partial_json", ANSWER),
    "thinking_delta": ("thinking", REASONING),
}
"""Delta types that carry output: the key of their text, and its kind."""
_CALLS: Final = frozenset(("tool_use", "server_tool_use", "mcp_tool_use"))
_READ: Final = frozenset(
    (
        "content_block_delta",
        "content_block_start",
        "message_start",
        "message_delta",
        "message_stop",
        "error",
    )
)
_READ_NAMES: Final = frozenset(name.encode() for name in _READ)


def reads(name: bytes) -> bool:
    """Whether an event of this ``event:`` name says anything the reader uses."""
    return name in _READ_NAMES


def read_event(name: bytes | None, value: Any) -> ApiFacts:
    """The facts of one event: its ``event:`` field (None when it has none) and its data,
    decoded (see the module docstring)."""
    facts = ApiFacts()
    kind = name.decode("utf-8", "replace") if name is not None else text(field(value, "type"))
    if kind == "content_block_delta":
        delta = field(value, "delta")
        found = _DELTAS.get(text(field(delta, "type")) or "")
        if found is not None and _said(field(delta, found[0])):
            facts.output(found[1])
    elif kind == "content_block_start":
        facts.output(_block_kind(field(value, "content_block")))
    elif kind == "message_start":
        message = field(value, "message")
        facts.id, facts.model = text(field(message, "id")), text(field(message, "model"))
        usage = field(message, "usage")
        facts.counts = usage if isinstance(usage, dict) else None
    elif kind == "message_delta":
        usage = field(value, "usage")
        if isinstance(usage, dict):
            facts.counts, facts.final = usage, True
        stop = text(field(value, "delta", "stop_reason"))
        if stop:
            facts.finish_reasons = [stop]
    elif kind == "message_stop":
        facts.ended = True
    elif kind == "error":
        facts.fail(field(value, "error", "type"))
    return facts


def _said(value: Any) -> bool:
    return isinstance(value, str) and bool(value)


def _block_kind(block: Any) -> int:
    """``ANSWER``, ``REASONING`` or 0 for what one content block carries (started, or
    whole)."""
    kind = text(field(block, "type"))
    if kind in _CALLS:
        return ANSWER
    if kind == "redacted_thinking":
        return REASONING
    if kind == "text" and _said(field(block, "text")):
        return ANSWER
    if kind == "thinking" and _said(field(block, "thinking")):
        return REASONING
    return 0


def usage_of(counts: dict[str, Any]) -> Usage:
    """The usage of (laid over) ``usage`` objects: the input is the tokens computed plus
    those read from and written to the cache."""
    read = token_count(counts.get("cache_read_input_tokens"))
    written = token_count(counts.get("cache_creation_input_tokens"))
    return Usage(
        input_tokens=token_count(counts.get("input_tokens")) + read + written,
        output_tokens=token_count(counts.get("output_tokens")),
        cached_input_tokens=read,
        cache_write_input_tokens=written,
    )


def reports_reasoning(counts: dict[str, Any]) -> bool:
    """Never: the Messages API's usage does not say its thinking tokens apart."""
    return False


def answer_facts(body: Any) -> ApiFacts:
    """A whole message's facts: id, model, usage, stop reason, and what its content
    blocks carry."""
    facts = ApiFacts()
    facts.id, facts.model = text(field(body, "id")), text(field(body, "model"))
    usage = field(body, "usage")
    if isinstance(usage, dict):
        facts.counts, facts.final = usage, True
    stop = text(field(body, "stop_reason"))
    if stop:
        facts.finish_reasons = [stop]
    if field(body, "type") == "error":
        facts.fail(field(body, "error", "type"))
    blocks = field(body, "content")
    kinds = {_block_kind(block) for block in blocks} if isinstance(blocks, list) else set()
    for kind in sorted(kinds, reverse=True):  # the answer first
        facts.output(kind)
    return facts


def prefix_of(chunk: bytes, kind: int) -> bytes | None:
    """``_api_facts.learned_prefix`` for a ``content_block_delta``: its text, thinking or
    arguments value (whichever key the chunk holds first)."""
    for key, _ in _DELTAS.values():
        keys = (b'"' + key.encode() + b'":"', b'"' + key.encode() + b'": "')
        found = learned_prefix(chunk, read_event, kind, keys, ("delta", key))
        if found is not None:
            return found
    return None


def prompt_size(payload: dict[str, Any]) -> int:
    """Input tokens estimated from a request's ``system`` and ``messages`` (UTF-8 bytes /
    4, rounded up; at least 1), as ``_openai.prompt_size`` estimates chat's."""
    texts = texts_of([payload.get("system"), payload.get("messages")])
    return max(1, -(-sum(len(t.encode()) for t in texts) // 4))


def output_messages(body: Any) -> Any:
    """A whole message's content blocks, as one assistant message."""
    return [{"role": "assistant", "content": field(body, "content")}]


READING: Final = ApiReading(
    read_event=read_event,
    reads=reads,
    answer_facts=answer_facts,
    prefix_of=prefix_of,
    usage_of=usage_of,
    reports_reasoning=reports_reasoning,
    prompt_size=prompt_size,
    output_messages=output_messages,
)
"""The Messages API, as the upstream call reads it."""
