"""Pure reading of the OpenAI Responses API (``POST /v1/responses``): its stream's events
and its whole answer, as vLLM and OpenAI write them.

An event's type is its ``event:`` field, or, in a stream that does not name them, its
JSON's ``type``. What each type says:

- output: a non-empty ``delta`` of ``response.output_text.delta``, ``response.refusal.delta``,
  a tool call's arguments or input (``response.function_call_arguments.delta`` and the
  custom, code interpreter and MCP ones) or ``response.audio.transcript.delta`` is the
  answer; of ``response.reasoning_text.delta`` or ``response.reasoning_summary_text.delta``
  thinking. ``response.output_item.added`` of a tool call (an item whose type ends in
  ``_call``) is the answer's first token: it names the tool, as chat's first tool-call
  delta does. A delta event's output is read from its type and its ``delta`` alone.
- the end: ``response.completed``, ``response.incomplete`` and ``response.failed`` carry the
  final response: its usage, id, model, vLLM's engine timings (``metrics``) and why it
  ended (the finish reason: ``incomplete_details.reason`` of an incomplete response, such
  as ``max_output_tokens``, else its ``status``). An incomplete response ended as a chat
  answer at its token limit does: it is no failure.
- failures: ``response.failed`` (its ``error.code`` the reason) and ``error`` (its ``code``).
- everything else (``response.created``, ``.in_progress``, the ``.added`` and ``.done``
  events of parts and text) says nothing the reader uses, and is not parsed.

Usage: ``input_tokens`` (cached included), ``output_tokens`` (reasoning included),
``input_tokens_details.cached_tokens`` and ``.cache_write_tokens`` (vLLM), and
``output_tokens_details.reasoning_tokens``. Nothing here trusts a shape: a field of the
wrong type reads as absent.
"""

from __future__ import annotations

from typing import Any, Final

from stagelens.instrumentation._api_facts import ApiFacts, ApiReading, field, learned_prefix, text
from stagelens.instrumentation._openai import ANSWER, REASONING, texts_of, token_count

from stagelens.pricing import Usage

_DELTAS: Final = {
    "response.output_text.delta": ANSWER,
    "response.refusal.delta": ANSWER,
    "response.function_call_arguments.delta": ANSWER,
    "response.custom_tool_call_input.delta": ANSWER,
    "response.code_interpreter_call_code.delta": ANSWER,
    "response.mcp_call_arguments.delta": ANSWER,
    "response.audio.transcript.delta": ANSWER,
    "response.reasoning_text.delta": REASONING,
    "response.reasoning_summary_text.delta": REASONING,
}
"""Delta event types whose non-empty ``delta`` is output, and of which kind."""
_ADDED: Final = "response.output_item.added"
_FINAL: Final = frozenset(("response.completed", "response.incomplete", "response.failed"))
_ERROR: Final = "error"
_READ: Final = frozenset((*_DELTAS, _ADDED, *_FINAL, _ERROR))
_READ_NAMES: Final = frozenset(name.encode() for name in _READ)
_KEYS: Final = (b'"delta":"', b'"delta": "')
"""The delta's key, its colon and its value's opening quote, compact and spaced."""


def reads(name: bytes) -> bool:
    """Whether an event of this ``event:`` name says anything the reader uses."""
    return name in _READ_NAMES


def read_event(name: bytes | None, value: Any) -> ApiFacts:
    """The facts of one event: its ``event:`` field (None when it has none) and its data,
    decoded (see the module docstring)."""
    facts = ApiFacts()
    kind = name.decode("utf-8", "replace") if name is not None else text(field(value, "type"))
    if kind is None:
        return facts
    output = _DELTAS.get(kind)
    if output is not None:
        delta = field(value, "delta")
        if isinstance(delta, str) and delta:
            facts.output(output)
    elif kind == _ADDED:
        item = text(field(value, "item", "type"))
        if item is not None and item.endswith("_call"):
            facts.output(ANSWER)
    elif kind in _FINAL:
        _final(facts, field(value, "response"), failed=kind == "response.failed")
    elif kind == _ERROR:
        facts.fail(field(value, "code") or field(value, "error", "code"))
    return facts


def _final(facts: ApiFacts, response: Any, *, failed: bool) -> None:
    """What a final response says: its usage, id, model, engine timings and end."""
    facts.ended = True
    if not isinstance(response, dict):
        return
    facts.id, facts.model = text(response.get("id")), text(response.get("model"))
    metrics = response.get("metrics")
    facts.metrics = metrics if isinstance(metrics, dict) else None
    usage = response.get("usage")
    if isinstance(usage, dict):
        facts.counts, facts.final = usage, True
    status = text(response.get("status"))
    if failed or status == "failed":
        facts.fail(field(response, "error", "code"))
        return
    reason = text(field(response, "incomplete_details", "reason"))
    finish = reason if status == "incomplete" and reason else status
    if finish:
        facts.finish_reasons = [finish]


def usage_of(counts: dict[str, Any]) -> Usage:
    """The usage of a response's ``usage`` object."""
    return Usage(
        input_tokens=token_count(counts.get("input_tokens")),
        output_tokens=token_count(counts.get("output_tokens")),
        cached_input_tokens=token_count(field(counts, "input_tokens_details", "cached_tokens")),
        reasoning_output_tokens=token_count(
            field(counts, "output_tokens_details", "reasoning_tokens")
        ),
        cache_write_input_tokens=token_count(
            field(counts, "input_tokens_details", "cache_write_tokens")
        ),
    )


def reports_reasoning(counts: dict[str, Any]) -> bool:
    """The usage says its reasoning tokens (``output_tokens_details.reasoning_tokens``)."""
    return field(counts, "output_tokens_details", "reasoning_tokens") is not None


def answer_facts(body: Any) -> ApiFacts:
    """A whole response's facts: the final response's, and what its output items carry."""
    facts = ApiFacts()
    _final(facts, body, failed=False)
    items = field(body, "output")
    kinds = {_item_kind(item) for item in items} if isinstance(items, list) else set()
    for kind in sorted(kinds, reverse=True):  # the answer first, as the stream's first
        facts.output(kind)
    return facts


def _item_kind(item: Any) -> int:
    """``ANSWER``, ``REASONING`` or 0 for what one output item of a response carries."""
    kind = text(field(item, "type"))
    if kind is None:
        return 0
    if kind.endswith("_call"):
        return ANSWER
    parts = field(item, "content")
    parts = parts if isinstance(parts, list) else []
    if kind == "reasoning":
        summary = field(item, "summary")
        parts = parts + (summary if isinstance(summary, list) else [])
        return REASONING if any(text(field(p, "text")) for p in parts) else 0
    if kind == "message":
        said = (text(field(p, "text")) or text(field(p, "refusal")) for p in parts)
        return ANSWER if any(said) else 0
    return 0


def prefix_of(chunk: bytes, kind: int) -> bytes | None:
    """``_api_facts.learned_prefix`` for a delta event."""
    return learned_prefix(chunk, read_event, kind, _KEYS, ("delta",))


def prompt_size(payload: dict[str, Any]) -> int:
    """Input tokens estimated from a request's ``instructions`` and ``input`` (UTF-8 bytes
    / 4, rounded up; at least 1), as ``_openai.prompt_size`` estimates chat's."""
    texts = texts_of([payload.get("instructions"), payload.get("input")])
    return max(1, -(-sum(len(t.encode()) for t in texts) // 4))


def output_messages(body: Any) -> Any:
    """A whole response's output items."""
    return field(body, "output")


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
"""The Responses API, as the upstream call reads it."""
