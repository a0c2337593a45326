"""Fuzzing strategies for the reference gateway, shared by the tests and
``benchmarks/fuzz_gateway.py``: bodies drawn from the gateway's own request schemas, those
bodies made hostile (a lone surrogate, a non-finite number, deep nesting, an oversized
body), random bytes and random JSON, and hostile headers.

Each hostile body comes with what the gateway must answer (status and error code), so a
test can check the answer names the problem, not only that it is not a 5xx.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st
from stagelens.reference.agent_schema import CountTokensRequest, MessagesRequest, ResponsesRequest
from stagelens.reference.api_errors import MESSAGES_PATH, anthropic_type
from stagelens.reference.schema import MAX_DEPTH, ChatRequest, CompletionRequest, EmbeddingRequest

ROUTES: dict[str, tuple[type[Any], str]] = {
    "/v1/chat/completions": (ChatRequest, "tiny"),
    "/v1/completions": (CompletionRequest, "tiny"),
    "/v1/embeddings": (EmbeddingRequest, "tiny-embed"),
    "/v1/responses": (ResponsesRequest, "tiny"),
    "/v1/messages": (MessagesRequest, "tiny"),
    "/v1/messages/count_tokens": (CountTokensRequest, "tiny"),
}
"""Route -> (its request schema, the demo model it serves)."""


def error_code(path: str, answer: Any) -> str | None:
    """What an error answer of ``path`` names: OpenAI's ``error.code``; on the Messages
    API's routes, Anthropic's ``error.type`` (its shape has no code)."""
    error = answer.get("error") if isinstance(answer, dict) else None
    if not isinstance(error, dict):
        return None
    return error.get("type") if path.startswith(MESSAGES_PATH) else error.get("code")


def expected_code(path: str, status: int, code: str) -> str:
    """``error_code`` of a refusal with ``status`` and OpenAI ``code`` on ``path``."""
    return anthropic_type(status) if path.startswith(MESSAGES_PATH) else code


def error_shaped(path: str, answer: Any) -> bool:
    """The error answer is in the shape of the API ``path`` belongs to."""
    error = answer.get("error") if isinstance(answer, dict) else None
    if not isinstance(error, dict):
        return False
    if path.startswith(MESSAGES_PATH):
        return answer.get("type") == "error" and set(error) == {"type", "message"}
    return set(error) >= {"message", "type", "code", "param"}


TEXT = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 50) | st.floats(-2, 3) | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=8,
)


def from_schema(schema: dict[str, Any], defs: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Values valid for a JSON schema (the subset pydantic writes), kept small."""
    if "$ref" in schema:
        return from_schema(defs[schema["$ref"].rsplit("/", 1)[-1]], defs)
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return st.one_of([from_schema(s, defs) for s in schema[key]])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    if "const" in schema:
        return st.just(schema["const"])
    kind = schema.get("type")
    if kind == "object":
        properties = schema.get("properties", {})
        required = set(schema.get("required", ()))
        fixed = {k: from_schema(v, defs) for k, v in properties.items() if k in required}
        optional = {k: from_schema(v, defs) for k, v in properties.items() if k not in required}
        if not properties and schema.get("additionalProperties", True):
            return st.dictionaries(TEXT, JSON, max_size=2)
        return st.fixed_dictionaries(fixed, optional=optional)
    if kind == "array":
        items = from_schema(schema.get("items", {}), defs)
        low = schema.get("minItems", 0)
        return st.lists(items, min_size=low, max_size=max(low, 3))
    if kind == "string":
        return st.text(min_size=schema.get("minLength", 0), max_size=16)
    if kind == "integer":
        low = schema.get("minimum", schema.get("exclusiveMinimum", -1) + 1)
        return st.integers(low, low + 40)
    if kind == "number":
        return st.floats(schema.get("minimum", -2.0), 2.0, allow_nan=False)
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    return JSON


def bodies(kind: type[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """Bodies valid for a request schema."""
    schema = kind.model_json_schema()
    return from_schema(schema, schema.get("$defs", {}))


def bounded(body: dict[str, Any], model: str, path: str = "") -> dict[str, Any]:
    """A drawn body of ``path`` made cheap to serve: a served model, at most 4 tokens, 2
    choices."""
    body = {**body, "model": model}
    if path == "/v1/responses":
        body["max_output_tokens"] = min(body.get("max_output_tokens") or 4, 4)
        return body
    if path.endswith("/count_tokens"):
        return body
    body["max_tokens"] = min(body.get("max_tokens") or 4, 4)
    if body.get("max_completion_tokens") is not None:
        body["max_completion_tokens"] = min(body["max_completion_tokens"], 4)
    if body.get("n") is not None:
        body["n"] = min(body["n"], 2)
    if isinstance(body.get("prompt"), list) and body["prompt"]:
        body["prompt"] = body["prompt"][:2]
    return body


@dataclass(frozen=True)
class Hostile:
    """A request body made hostile, and what the gateway must answer it."""

    raw: bytes
    status: int
    code: str
    how: str


def _strings(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Paths of every string value in ``value``."""
    if isinstance(value, str):
        return [path]
    if not isinstance(value, (dict, list)):
        return []
    items: Any = value.items() if isinstance(value, dict) else enumerate(value)
    return [p for key, item in items for p in _strings(item, (*path, key))]


def _set(body: Any, path: tuple[Any, ...], value: Any) -> None:
    for key in path[:-1]:
        body = body[key]
    body[path[-1]] = value


HOSTILE_KINDS = ("surrogate", "surrogate_bytes", "nonfinite", "deep", "oversize")
"""The hostile changes :func:`hostile` makes."""


@st.composite
def hostile(
    draw: st.DrawFn, body: dict[str, Any], max_body_bytes: int, how: str | None = None
) -> Hostile:
    """``body`` with one hostile change (``how``, one of :data:`HOSTILE_KINDS`, or drawn)
    the gateway must refuse with a 4xx naming it."""
    if how is None:
        how = draw(st.sampled_from(HOSTILE_KINDS))
    body = json.loads(json.dumps(body))
    if how.startswith("surrogate"):
        where = draw(st.sampled_from([*_strings(body), ("stop",), ("x-extra",)]))
        lone = draw(st.sampled_from(["\ud800", "\udfff", "\udc00x", "a\udbff"]))
        _set(body, where, lone)
        if how == "surrogate":  # escaped, as json.dumps writes it
            return Hostile(json.dumps(body).encode(), 400, "invalid_unicode", how)
        raw = json.dumps(body, ensure_ascii=False).encode("utf-8", "surrogatepass")
        return Hostile(raw, 400, "invalid_unicode", how)
    if how == "nonfinite":
        key = draw(st.sampled_from(["temperature", "top_p", "presence_penalty", "x-extra"]))
        word = draw(st.sampled_from(["NaN", "Infinity", "-Infinity", "1e400", "-2E999"]))
        body[key] = "@@"
        raw = json.dumps(body).replace('"@@"', word).encode()
        return Hostile(raw, 400, "invalid_number", how)
    if how == "deep":
        depth = draw(st.integers(MAX_DEPTH + 1, 20_000))
        opener, closer = draw(st.sampled_from([("[", "]"), ('{"a":', "}")]))
        body["x-extra"] = "@@"
        nested = opener * depth + "1" + closer * depth
        raw = json.dumps(body).replace('"@@"', nested).encode()
        return Hostile(raw, 400, "nesting_too_deep", how)
    pad = draw(st.integers(1, 3 * max_body_bytes))
    body["x-pad"] = "x" * (max_body_bytes + pad)
    return Hostile(json.dumps(body).encode(), 413, "request_too_large", how)


_FRAMING = frozenset({"content-length", "transfer-encoding", "host", "connection", "authorization"})
"""Headers the HTTP client frames the request with (or that carry the API key): kept."""
_TOKEN = st.text(alphabet="abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=20)
_VALUE = st.text(
    alphabet=st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\x7f"),
    max_size=64,
).map(lambda text: text.strip().encode("latin-1"))
HOSTILE_HEADERS = st.dictionaries(
    st.sampled_from(
        [
            "content-type",
            "traceparent",
            "tracestate",
            "baggage",
            "x-forwarded-for",
            "accept",
            "accept-encoding",
            "user-agent",
            "x-request-id",
        ]
    )
    | _TOKEN.filter(lambda name: name not in _FRAMING),
    _VALUE | st.just(b"x" * 6000) | st.just(b"00-" + b"f" * 32 + b"-" + b"0" * 16 + b"-01"),
    max_size=5,
)
"""Headers a hostile client sends: garbage trace context and baggage, odd content types,
long values, latin-1 text (as bytes: what HTTP/1.1 allows), names of its own."""
