"""OpenAI-compatible JSON (``stagelens.instrumentation._openai``), property-tested: any
JSON value reads without raising (a field of the wrong type reads as absent), output is
found wherever the module says it is, the request body asking for usage keeps everything
else the app sent."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from stagelens.instrumentation import _openai

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=5)
)
JSON = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(["choices", "usage", "delta", "content", "index", "error", "x"])
            | st.text(max_size=4),
            inner,
            max_size=4,
        )
    ),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(JSON)
def test_any_json_value_reads_without_raising(body: Any) -> None:
    """Arrays, ``choices: [null]``, usage fields of the wrong type: facts, never errors."""
    facts = _openai.EventFacts(body)
    assert all(isinstance(i, int) and i >= 0 for i in facts.outputs)
    if facts.usage is not None:
        usage = facts.usage
        assert min(usage.input_tokens, usage.output_tokens, usage.cached_input_tokens) >= 0
    _openai.phases_of(body if isinstance(body, dict) else None)


@pytest.mark.parametrize(
    ("body", "outputs", "usage_only", "error"),
    [
        ({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}, [], 0, 0),
        ({"choices": [{"index": 1, "delta": {"content": "hi"}}]}, [1], 0, 0),
        ({"choices": [{"index": 0, "delta": {"content": None, "tool_calls": [{}]}}]}, [0], 0, 0),
        ({"choices": [{"index": 0, "delta": {"reasoning": "hmm"}}]}, [0], 0, 0),
        ({"choices": [{"index": 0, "text": " x"}]}, [0], 0, 0),
        ({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}, [], 0, 0),
        ({"choices": [], "usage": {"prompt_tokens": 3}}, [], 1, 0),
        ({"usage": {"prompt_tokens": 3}}, [], 1, 0),
        ({"error": {"message": "boom", "type": "InternalServerError"}}, [], 0, 1),
        ({"object": "error", "message": "boom"}, [], 0, 1),
        ({"choices": [None, 3, "x"]}, [], 0, 0),
        ([{"content": "x"}], [0], 0, 0),
    ],
    ids=[
        "role-only",
        "content",
        "tool-call",
        "reasoning",
        "completion-text",
        "empty-finish",
        "usage-event",
        "usage-without-choices",
        "error-event",
        "error-object",
        "choices-of-junk",
        "array",
    ],
)
def test_what_an_event_says(body: Any, outputs: list[int], usage_only: int, error: int) -> None:
    """The shapes vLLM and OpenAI send (and junk) read as the module docstring defines."""
    facts = _openai.EventFacts(body)
    assert facts.outputs == outputs
    assert facts.usage_only is bool(usage_only)
    assert facts.error is bool(error)


@settings(deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["prompt_tokens", "completion_tokens", "prompt_tokens_details"]),
        SCALARS | st.dictionaries(st.just("cached_tokens"), SCALARS),
    )
)
def test_usage_counts_are_non_negative_integers(usage: dict[str, Any]) -> None:
    """Counts of the wrong type (strings, floats, booleans, negatives) read as 0."""
    found = _openai.usage_of({"usage": usage})
    assert found is not None
    for count in (found.input_tokens, found.output_tokens, found.cached_input_tokens):
        assert isinstance(count, int)
        assert count >= 0
    if isinstance(usage.get("prompt_tokens"), int) and not isinstance(usage["prompt_tokens"], bool):
        assert found.input_tokens == max(usage["prompt_tokens"], 0)


BODIES = st.fixed_dictionaries(
    {"model": st.text(max_size=4), "stream": st.just(True)},
    optional={
        "messages": st.lists(st.fixed_dictionaries({"content": st.text(max_size=5)})),
        "stream_options": st.none()
        | st.fixed_dictionaries({}, optional={"include_usage": st.booleans(), "x": st.integers()}),
        "n": st.integers(1, 3),
    },
)


@settings(max_examples=200, deadline=None)
@given(BODIES, st.sampled_from([(",", ":"), (", ", ": ")]), st.sampled_from(["", " ", "\n"]))
def test_asking_for_usage_keeps_the_rest_of_the_body(
    payload: dict[str, Any], separators: tuple[str, str], pad: str
) -> None:
    """The rewritten body asks for the usage event and keeps every other field (and any
    other stream option) as the app sent them."""
    raw = (pad + json.dumps(payload, separators=separators, ensure_ascii=False) + pad).encode()
    asked = json.loads(_openai.with_usage_asked(raw, payload))
    assert asked["stream_options"]["include_usage"] is True
    assert _openai.wants_usage(asked)
    options = payload.get("stream_options")
    for key, value in (options if isinstance(options, dict) else {}).items():
        if key != "include_usage":
            assert asked["stream_options"][key] == value
    assert {k: v for k, v in asked.items() if k != "stream_options"} == {
        k: v for k, v in payload.items() if k != "stream_options"
    }


def test_the_usage_option_is_spliced_into_the_apps_bytes() -> None:
    """Without stream options, the app's bytes reach the server with one field added."""
    raw = b'{"model": "tiny", "stream": true}'
    assert _openai.with_usage_asked(raw, json.loads(raw)) == (
        b'{"stream_options":{"include_usage":true},"model": "tiny", "stream": true}'
    )


@pytest.mark.parametrize(
    ("payload", "tokens"),
    [
        ({"messages": [{"role": "user", "content": "12345678"}]}, 2),
        ({"messages": [{"content": [{"type": "text", "text": "1234"}]}]}, 1),
        ({"prompt": "123456789"}, 3),
        ({"prompt": [1, 2, 3, 4, 5]}, 5),
        ({"prompt": [[1, 2], [3]]}, 3),
        ({}, 1),
    ],
    ids=["chat", "parts", "text", "token-ids", "token-id-lists", "empty"],
)
def test_prompt_size_estimate(payload: dict[str, Any], tokens: int) -> None:
    """Prompt text is counted as UTF-8 bytes / 4 rounded up; token ids exactly."""
    assert _openai.prompt_size(payload) == tokens


@settings(deadline=None)
@given(JSON)
def test_prompt_size_never_raises(payload: Any) -> None:
    """Any request body gives an estimate of at least one token."""
    if isinstance(payload, dict):
        assert _openai.prompt_size(payload) >= 1


@settings(max_examples=200, deadline=None)
@given(JSON, st.booleans())
def test_loads_is_json_loads_for_any_value(value: Any, spaced: bool) -> None:
    """The one-call path parses any JSON value as json.loads does."""
    separators = (", ", ": ") if spaced else (",", ":")
    raw = json.dumps(value, separators=separators).encode()
    assert repr(_openai.loads(raw)) == repr(json.loads(raw))


@settings(deadline=None)
@given(st.binary(max_size=40))
def test_loads_fails_as_json_loads_does(raw: bytes) -> None:
    """Arbitrary bytes give json.loads' value, or the same kind of error."""
    outcomes = []
    for parse in (json.loads, _openai.loads):
        try:
            outcomes.append(repr(parse(raw)))
        except ValueError as exc:
            outcomes.append(type(exc).__name__)
    assert outcomes[0] == outcomes[1]


@settings(max_examples=300, deadline=None)
@given(JSON)
def test_reading_the_bytes_says_what_reading_the_value_says(body: Any) -> None:
    """Given the event's bytes (which let the walk for output be skipped when no output
    key occurs in them), the facts are those of the value alone."""
    raw = json.dumps(body).encode()
    fast, plain = _openai.read_event(raw), _openai.EventFacts(json.loads(raw))
    for name in ("outputs", "finish_reasons", "usage", "error", "no_choices", "id", "model"):
        assert getattr(fast, name) == getattr(plain, name), name


def _plain_kind(value: Any) -> int:
    """``output_kind`` as a newcomer would write it: every answer and reasoning output in
    the value, found recursively; then which kind there was."""
    answers, thoughts = [], []

    def walk(item: Any) -> None:
        if isinstance(item, dict):
            for key, inner in item.items():
                text = isinstance(inner, str) and inner != ""
                if key in ("content", "text", "refusal") and text:
                    answers.append(key)
                elif key in ("reasoning", "reasoning_content") and text:
                    thoughts.append(key)
                elif key == "tool_calls" and isinstance(inner, list) and inner:
                    answers.append(key)
                else:
                    walk(inner)
        elif isinstance(item, list):
            for inner in item:
                walk(inner)

    walk(value)
    if answers:
        return _openai.ANSWER
    return _openai.REASONING if thoughts else _openai.NO_OUTPUT


KEYED_JSON = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                ["content", "reasoning", "reasoning_content", "text", "tool_calls", "delta", "x"]
            ),
            inner,
            max_size=4,
        )
    ),
    max_leaves=12,
)


@settings(max_examples=400, deadline=None)
@given(KEYED_JSON)
def test_output_kind_is_the_plain_walk(value: Any) -> None:
    """Answer wherever any answer output is, reasoning where thinking is the only output:
    the same as the plain recursive twin on any JSON value."""
    assert _openai.output_kind(value) == _plain_kind(value)


@pytest.mark.parametrize(
    ("delta", "reasoning", "answers"),
    [
        ({"reasoning": "hmm"}, [0], False),
        ({"reasoning_content": "hmm", "content": None}, [0], False),
        ({"reasoning": "", "content": "x"}, [], True),
        ({"reasoning": "hmm", "content": "x"}, [], True),
        ({"content": None, "tool_calls": [{"index": 0}]}, [], True),
        ({"reasoning": None, "content": ""}, [], False),
    ],
    ids=["reasoning", "reasoning-content", "content", "both", "tool-call", "neither"],
)
def test_reasoning_only_events_are_told_from_answers(
    delta: dict[str, Any], reasoning: list[int], answers: bool
) -> None:
    """An event whose only output is thinking is reasoning; anything else with output, even
    beside thinking (vLLM coalesces deltas under load), answers."""
    facts = _openai.EventFacts({"choices": [{"index": 0, "delta": delta}]})
    assert facts.reasoning == reasoning
    assert facts.answers is answers


def test_cache_writes_of_the_usage() -> None:
    """vLLM's ``prompt_tokens_details.created_cache_tokens`` (the prompt tokens its prefix
    cache stored) is the usage's cache writes; absent or of the wrong type, 0."""
    details = {"cached_tokens": 128, "created_cache_tokens": 1408}
    usage = _openai.usage_of({"usage": {"prompt_tokens": 1445, "prompt_tokens_details": details}})
    assert usage is not None
    assert (usage.cached_input_tokens, usage.cache_write_input_tokens) == (128, 1408)
    for written in (None, "9", -3, True):
        details = {"created_cache_tokens": written}
        found = _openai.usage_of({"usage": {"prompt_tokens_details": details}})
        assert found is not None
        assert found.cache_write_input_tokens == 0


@pytest.mark.parametrize(
    ("usage", "reasoning", "reported"),
    [
        ({"completion_tokens": 9, "completion_tokens_details": {"reasoning_tokens": 4}}, 4, True),
        ({"completion_tokens": 9, "completion_tokens_details": {"reasoning_tokens": 0}}, 0, True),
        ({"completion_tokens": 9, "completion_tokens_details": None}, 0, False),
        ({"completion_tokens": 9}, 0, False),
        ({"completion_tokens": 9, "completion_tokens_details": {"reasoning_tokens": "4"}}, 0, True),
    ],
    ids=["reported", "reported-zero", "details-null", "no-details", "wrong-type"],
)
def test_reasoning_tokens_of_the_usage(
    usage: dict[str, Any], reasoning: int, reported: bool
) -> None:
    """vLLM's ``completion_tokens_details.reasoning_tokens``, read like every usage field;
    whether the usage says them at all decides if the events are counted instead."""
    facts = _openai.EventFacts({"choices": [], "usage": usage})
    assert facts.usage is not None
    assert facts.usage.reasoning_output_tokens == reasoning
    assert facts.reasoning_reported is reported
