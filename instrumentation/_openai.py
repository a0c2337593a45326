"""Pure reading of OpenAI-compatible JSON: request bodies, answers and stream events.

No I/O and no telemetry: each function takes bytes or a decoded value and returns what it
found, so that each is property-tested with arbitrary JSON shapes
(tests/instrumentation/test_openai.py). Nothing here trusts a shape: a field of the wrong
type reads as absent, never as an exception, because the bytes come from a server we do
not control.

**Output-bearing.** An event carries generated output when some object in it has a
``content``, ``text``, ``reasoning_content``, ``reasoning`` or ``refusal`` key with a
non-empty string, or a non-empty ``tool_calls`` list: a content or completion-text delta, a
tool-call delta (the first one names the function), reasoning text. A role-only delta
(``"content": ""``), an empty finish delta, the usage event, an error event and ``[DONE]``
are not output. ``_sse.output_fast`` answers the common case without parsing.

**Answer-bearing.** Output that is not reasoning: an event whose only output is
``reasoning_content`` or ``reasoning`` text is thinking; any other output (content, a tool
call, a completion's text, a refusal) is the answer, even beside reasoning. The first
answer-bearing event times the first answer token (``EventFacts.reasoning``).
"""

from __future__ import annotations

import base64
import json
import json.scanner
import math
import re
from collections.abc import Callable
from typing import Any, Final

from stagelens import semconv as sc
from stagelens.pricing import Usage

_SCAN: Final[Callable[[str, int], tuple[Any, int]]] = json.scanner.make_scanner(
    json.JSONDecoder()  # type: ignore[arg-type]  # typeshed types the argument as the class
)
"""The JSON decoder's own scanner (C when available), as ``json.loads`` uses it."""


def loads(raw: bytes) -> Any:
    """``json.loads(raw)``, in one C call for the usual case (UTF-8, no whitespace around).

    Why: ``json.loads`` spends more time finding the encoding and stepping through its
    Python layers than parsing a short event; every upstream call parses its request body
    and its usage event. Anything unusual takes ``json.loads`` itself, same result, same
    errors.
    """
    try:
        text = raw.decode()
        value, end = _SCAN(text, 0)
    except (UnicodeDecodeError, StopIteration):
        return json.loads(raw)
    if end != len(text):
        return json.loads(raw)  # trailing whitespace, or data after the value (refused)
    return value


_TEXT_KEYS: Final = frozenset(("content", "text", "reasoning_content", "reasoning", "refusal"))
"""Keys whose non-empty string value is generated output."""


_REASONING_KEYS: Final = frozenset(("reasoning_content", "reasoning"))
"""Of ``_TEXT_KEYS``, those whose text is thinking, not the answer."""
NO_OUTPUT: Final = 0
REASONING: Final = 1
"""``output_kind``: the only output is reasoning text."""
ANSWER: Final = 2
"""``output_kind``: some output is not reasoning (content, a tool call, text, a refusal)."""


def output_kind(value: Any) -> int:
    """``ANSWER``, ``REASONING`` or ``NO_OUTPUT`` for what ``value`` carries (see the
    module docstring): the walk stops at the first answer output."""
    found = NO_OUTPUT
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key, inner in item.items():
                if key in _TEXT_KEYS and isinstance(inner, str) and inner:
                    if key not in _REASONING_KEYS:
                        return ANSWER
                    found = REASONING
                elif key == "tool_calls" and isinstance(inner, list) and inner:
                    return ANSWER
                elif isinstance(inner, dict | list):
                    stack.append(inner)
        elif isinstance(item, list):
            stack.extend(inner for inner in item if isinstance(inner, dict | list))
    return found


def has_output(value: Any) -> bool:
    """Some object in ``value`` carries output (see the module docstring)."""
    return output_kind(value) != NO_OUTPUT


def token_count(value: Any) -> int:
    """A token count as the server wrote it; anything but a non-negative integer is 0."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    if isinstance(value, float) and value.is_integer() and value > 0:
        return int(value)
    return 0


def usage_of(body: Any) -> Usage | None:
    """The usage an answer (or event) reports; None when it carries none."""
    usage = body.get("usage") if isinstance(body, dict) else None
    if not isinstance(usage, dict):
        return None
    details = usage.get("prompt_tokens_details")
    cached = written = None
    if isinstance(details, dict):
        cached, written = details.get("cached_tokens"), details.get("created_cache_tokens")
    output = usage.get("completion_tokens_details")
    reasoning = output.get("reasoning_tokens") if isinstance(output, dict) else None
    return Usage(
        input_tokens=token_count(usage.get("prompt_tokens")),
        output_tokens=token_count(usage.get("completion_tokens")),
        cached_input_tokens=token_count(cached),
        reasoning_output_tokens=token_count(reasoning),
        cache_write_input_tokens=token_count(written),
    )


def reports_reasoning(body: Any) -> bool:
    """The usage of ``body`` says how many of its tokens were reasoning (vLLM started with
    a reasoning parser writes ``completion_tokens_details.reasoning_tokens``, 0 included);
    without it, the reasoning events received are counted instead."""
    usage = body.get("usage") if isinstance(body, dict) else None
    details = usage.get("completion_tokens_details") if isinstance(usage, dict) else None
    return isinstance(details, dict) and details.get("reasoning_tokens") is not None


def add_usage(total: Usage | None, more: Usage) -> Usage:
    """Usage of several upstream calls of one request, summed."""
    if total is None:
        return more
    return Usage(
        input_tokens=total.input_tokens + more.input_tokens,
        output_tokens=total.output_tokens + more.output_tokens,
        cached_input_tokens=total.cached_input_tokens + more.cached_input_tokens,
        reasoning_output_tokens=total.reasoning_output_tokens + more.reasoning_output_tokens,
        cache_write_input_tokens=total.cache_write_input_tokens + more.cache_write_input_tokens,
    )


_OUTPUT_KEY: Final = re.compile(rb'"(?:content|text|reasoning|refusal|tool_calls)[_a-z]*"')
"""An output key's name in an event's bytes: the object walk is skipped without one."""


class EventFacts:
    """What one parsed event (or a whole answer) says. Given the event's bytes too, the
    walk for output is skipped when none of the output keys occurs in them (the usage
    event, an error event: most of what is parsed)."""

    __slots__ = (
        "error",
        "finish_reasons",
        "id",
        "metrics",
        "model",
        "no_choices",
        "outputs",
        "reasoning",
        "reasoning_reported",
        "usage",
    )

    def __init__(self, body: Any, raw: bytes | None = None, *, outputs: bool = True) -> None:
        self.outputs: list[int] = []
        """Choice indices that carry output in this event (index 0 outside choices)."""
        self.reasoning: list[int] = []
        """Of ``outputs``, those whose only output is reasoning (the others answer)."""
        self.finish_reasons: list[str] = []
        self.usage = usage_of(body)
        self.reasoning_reported = self.usage is not None and reports_reasoning(body)
        """The usage says how many tokens were reasoning (else they are counted)."""
        self.error = False
        """An error event (``{"error": ...}`` or ``"object": "error"``)."""
        self.id: str | None = None
        self.model: str | None = None
        self.metrics: dict[str, Any] | None = None
        self.no_choices = True
        """No choice in it (vLLM's usage event has ``"choices": []``)."""
        walk = outputs and (raw is None or _OUTPUT_KEY.search(raw) is not None)
        if not isinstance(body, dict):
            if walk:  # not an OpenAI event, but output all the same
                self._add(0, output_kind(body))
            return
        rid, model, metrics = body.get("id"), body.get("model"), body.get("metrics")
        self.id = rid if isinstance(rid, str) else None
        self.model = model if isinstance(model, str) else None
        self.metrics = metrics if isinstance(metrics, dict) else None
        self.error = body.get("error") is not None or body.get("object") == "error"
        choices = body.get("choices")
        rest = body
        if not walk:  # no output key in its bytes: only the choices' finish reasons
            if isinstance(choices, list):
                self.no_choices = not choices
                self.finish_reasons = _finish_reasons(c for c in choices if isinstance(c, dict))
            return
        if isinstance(choices, list):
            self.no_choices = not choices
            rest = {k: v for k, v in body.items() if k != "choices"}
            for position, choice in enumerate(choices):
                if not isinstance(choice, dict):
                    continue
                reason = choice.get("finish_reason")
                if isinstance(reason, str) and reason:
                    self.finish_reasons.append(reason)
                kind = output_kind(choice)
                if kind:
                    index = choice.get("index")
                    if isinstance(index, int) and not isinstance(index, bool) and index >= 0:
                        self._add(index, kind)
                    else:
                        self._add(position, kind)
        if not self.outputs and not self.error:
            self._add(0, output_kind(rest))

    def _add(self, choice: int, kind: int) -> None:
        """``choice`` carries output of ``kind`` (``output_kind``) in this event."""
        if kind:
            self.outputs.append(choice)
            if kind == REASONING:
                self.reasoning.append(choice)

    @property
    def answers(self) -> bool:
        """Some choice of this event carries answer output (not only reasoning)."""
        return len(self.reasoning) < len(self.outputs)

    @property
    def usage_only(self) -> bool:
        """The usage event that follows the last token: usage and no choice output."""
        return self.usage is not None and self.no_choices and not self.outputs and not self.error


def _finish_reasons(choices: Any) -> list[str]:
    reasons = (c.get("finish_reason") for c in choices)
    return [r for r in reasons if isinstance(r, str) and r]


def read_event(payload: bytes, *, outputs: bool = True) -> EventFacts:
    """The facts of one event's data (``outputs=False``: all but which choices carry
    output, left empty). Raises ValueError when it is not JSON."""
    try:
        return EventFacts(loads(payload), payload, outputs=outputs)
    except RecursionError as exc:  # absurdly nested: not an event we can read
        raise ValueError("event nested too deeply") from exc


def wants_usage(payload: dict[str, Any]) -> bool:
    """The request asks a stream to end with a usage event itself."""
    options = payload.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


def with_usage_asked(raw: bytes, payload: dict[str, Any]) -> bytes:
    """The request body ``raw`` (decoded as ``payload``) asking for the usage event.

    Why spliced when possible: the body the app built reaches the server as it was, with
    ``"stream_options":{"include_usage":true}`` added after its opening brace; only a body
    that already has ``stream_options`` is written anew.
    """
    if "stream_options" not in payload:
        at = raw.find(b"{")
        if at >= 0 and not raw[:at].strip():
            rest = raw[at + 1 :]
            comma = b"," if rest.strip() != b"}" else b""
            return raw[: at + 1] + b'"stream_options":{"include_usage":true}' + comma + rest
    options = payload.get("stream_options")
    merged = {**(options if isinstance(options, dict) else {}), "include_usage": True}
    return json.dumps({**payload, "stream_options": merged}, ensure_ascii=False).encode()


def prompt_size(payload: dict[str, Any]) -> int:
    """Input tokens estimated from a request: its prompt's UTF-8 bytes / 4, rounded up (a
    prompt given as token ids counts them exactly); at least 1. Used only when a stream
    ended before the server's usage event (``semconv.BILLING_ESTIMATED``)."""
    prompt = payload.get("prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return len(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(p, list) for p in prompt):
        return sum(len(p) for p in prompt)
    size = sum(len(text.encode()) for text in texts_of(payload.get("messages", prompt)))
    return max(1, -(-size // 4))


def texts_of(value: Any) -> list[str]:
    """Every string in a prompt or message list (content, parts' text, names)."""
    found: list[str] = []
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            found.append(item)
        elif isinstance(item, dict):
            stack.extend(v for k, v in item.items() if k in ("content", "text", "name"))
        elif isinstance(item, list):
            stack.extend(item)
    return found


PHASE_KEYS: Final = (
    (sc.PHASE_QUEUE, "queue_time_ms"),
    (sc.PHASE_PREFILL, "time_to_first_token_ms"),
    (sc.PHASE_DECODE, "generation_time_ms"),
)
"""The engine phases and the per-request metric of vLLM's response that times each."""
_NUMBER: Final = (int, float)
"""What a timing in vLLM's per-request metrics may be (a tuple: ``int | float`` would be
built anew on every check)."""


def phases_of(engine: dict[str, Any] | None) -> list[tuple[str, float]]:
    """(phase, seconds) from vLLM's per-request metrics (``--enable-per-request-metrics``)."""
    if not engine:
        return []
    out = []
    for phase, key in PHASE_KEYS:
        value = engine.get(key)
        if isinstance(value, bool) or not isinstance(value, _NUMBER):
            continue
        if math.isfinite(value) and value >= 0:
            out.append((phase, value / 1000.0))
    return out


def embedding_size(body: Any) -> int | None:
    """The number of dimensions of an embeddings answer's first vector: the length of its
    float list, or of its ``base64`` float32 bytes / 4; None when the answer does not say
    (never raises: the answer comes from the network)."""
    data = body.get("data") if isinstance(body, dict) else None
    first = data[0] if isinstance(data, list) and data else None
    vector = first.get("embedding") if isinstance(first, dict) else None
    if isinstance(vector, list):
        return len(vector)
    if isinstance(vector, str):
        try:
            return len(base64.b64decode(vector, validate=True)) // 4
        except ValueError:
            return None
    return None
