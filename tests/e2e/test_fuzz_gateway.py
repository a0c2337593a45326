"""Fuzzed request bodies through the reference gateway over real vLLM never answer 5xx:
bodies drawn from the gateway's own schemas are forwarded (vLLM answers them), one field
broken answers 400 naming that field, random bytes and random JSON answer 400."""

from __future__ import annotations

import collections
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from stagelens.reference import demo_config
from stagelens.reference.schema import ChatRequest, CompletionRequest, EmbeddingRequest

from tests.e2e.conftest import start_gateway

pytestmark = pytest.mark.vllm

STATUSES: collections.Counter[str] = collections.Counter()
"""Status codes seen per kind of case, printed at the end of the module (for the record)."""

ROUTES = {
    "/v1/chat/completions": (ChatRequest, "tiny"),
    "/v1/completions": (CompletionRequest, "tiny"),
    "/v1/embeddings": (EmbeddingRequest, "tiny-embed"),
}

_TEXT = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 50) | st.floats(-2, 3) | _TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
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
            return st.dictionaries(_TEXT, _JSON, max_size=2)
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
    return _JSON


def _bodies(kind: type[Any]) -> st.SearchStrategy[dict[str, Any]]:
    schema = kind.model_json_schema()
    return from_schema(schema, schema.get("$defs", {}))


def _bounded(body: dict[str, Any], model: str) -> dict[str, Any]:
    """A drawn body made cheap to serve: a served model, at most 4 tokens, 2 choices."""
    body = {**body, "model": model}
    body["max_tokens"] = min(body.get("max_tokens") or 4, 4)
    if body.get("max_completion_tokens") is not None:
        body["max_completion_tokens"] = min(body["max_completion_tokens"], 4)
    if body.get("n") is not None:
        body["n"] = min(body["n"], 2)
    if isinstance(body.get("prompt"), list) and body["prompt"]:
        body["prompt"] = body["prompt"][:2]
    return body


@pytest.fixture(scope="module")
def client(
    vllm_server: Any, vllm_embed_server: Any, tiny_model: Path, port_factory: Any
) -> Iterator[httpx.Client]:
    """The demo configuration (rate limit out of the way) over the session's servers."""
    config = demo_config(
        [vllm_server.base_url],
        str(tiny_model),
        embed_backends=[vllm_embed_server.base_url],
        rate_limit_per_second=10_000,
        rate_limit_burst=10_000,
    )
    for stack in start_gateway(config, port_factory()):
        headers = {"authorization": f"Bearer {stack.api_key}"}
        with httpx.Client(base_url=stack.url, headers=headers, timeout=120) as c:
            yield c
    print(f"\nfuzz status distribution: {dict(sorted(STATUSES.items()))}")


def _post(client: httpx.Client, path: str, content: bytes, case: str) -> httpx.Response:
    r = client.post(path, content=content, headers={"content-type": "application/json"})
    STATUSES[f"{case} {r.status_code}"] += 1
    assert r.status_code < 500, r.text
    if r.status_code >= 400:
        error = r.json()["error"]
        assert set(error) >= {"message", "type", "code", "param"}, error
    return r


FUZZ = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


class TestFuzzedBodies:
    """Hypothesis against the running gateway (sync httpx client)."""

    @FUZZ
    @given(data=st.data())
    def test_bodies_from_the_schemas_are_forwarded(self, client, data) -> None:
        """A body valid for the gateway's schema never answers 5xx: the gateway forwards it
        and passes on what vLLM answers (200, or vLLM's own 4xx with its message)."""
        path = data.draw(st.sampled_from(sorted(ROUTES)))
        kind, model = ROUTES[path]
        body = _bounded(data.draw(_bodies(kind)), model)
        r = _post(client, path, json.dumps(body).encode(), "valid")
        if r.status_code >= 400:
            assert r.json()["error"]["code"] in (
                "upstream_rejected",
                "context_length_exceeded",
                "unsupported_content",
                "invalid_request",  # the chat template refused it (vLLM's would too)
            ), r.text

    @settings(FUZZ, max_examples=150)
    @given(data=st.data())
    def test_one_broken_field_answers_400_naming_it(self, client, data) -> None:
        """A valid body with one validated field of the wrong type answers 400 whose
        ``param`` names that field (or the bad element inside it)."""
        path = data.draw(st.sampled_from(sorted(ROUTES)))
        kind, model = ROUTES[path]
        body = _bounded(data.draw(_bodies(kind)), model)
        field = data.draw(st.sampled_from(sorted(_BREAKABLE[path])))
        wrong = data.draw(_WRONG[field])
        target, name, param = body, field, field
        if path == "/v1/chat/completions" and field in ("role", "content", "name"):
            i = data.draw(st.integers(0, len(body["messages"]) - 1))
            target, param = body["messages"][i], f"messages.{i}.{field}"
        target[name] = wrong
        r = _post(client, path, json.dumps(body).encode(), "broken")
        assert r.status_code == 400, r.text
        named = r.json()["error"]["param"]
        assert named == param or named.startswith(param + "."), (param, r.text)

    @settings(FUZZ, max_examples=150)
    @given(
        path=st.sampled_from(sorted(ROUTES)),
        raw=st.binary(max_size=64) | _JSON.map(lambda v: json.dumps(v).encode()),
    )
    def test_random_bytes_and_json_answer_400(self, client, path, raw) -> None:
        """Random bytes, or random JSON, answer 400 in OpenAI's error format."""
        r = _post(client, path, raw, "random")
        assert r.status_code == 400, r.text


_BREAKABLE = {
    "/v1/chat/completions": {"model", "messages", "role", "content", "name", "max_tokens", "n"},
    "/v1/completions": {"model", "prompt", "max_tokens", "stream", "echo"},
    "/v1/embeddings": {"model", "input", "encoding_format"},
}
_WRONG: dict[str, st.SearchStrategy[Any]] = {
    "model": st.integers() | st.just("") | st.none(),
    "messages": st.just([]) | st.text() | st.integers(),
    "role": st.sampled_from(["robot", "", "USER"]) | st.integers(),
    "content": st.integers() | st.booleans() | st.just({"text": "x"}),
    "name": st.integers() | st.lists(st.text(), max_size=2),
    "max_tokens": st.just(0) | st.integers(max_value=-1) | st.text(min_size=1),
    "n": st.just(0) | st.text(min_size=1),
    "prompt": st.just([]) | st.integers() | st.just([1, "a"]) | st.none(),
    "stream": st.sampled_from(["yes", 1, [True]]),
    "echo": st.sampled_from(["yes", 2]),
    "input": st.just([]) | st.integers() | st.just({"a": 1}),
    "encoding_format": st.sampled_from(["hex", "", 3]),
}
