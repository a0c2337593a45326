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

from tests._fuzz import HOSTILE_HEADERS, JSON, ROUTES, bodies, bounded, error_code, error_shaped
from tests.e2e.conftest import start_gateway

pytestmark = pytest.mark.vllm

STATUSES: collections.Counter[str] = collections.Counter()
"""Status codes seen per kind of case, printed at the end of the module (for the record)."""


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


def _post(
    client: httpx.Client, path: str, content: bytes, case: str, headers: Any = None
) -> httpx.Response:
    r = client.post(path, content=content, headers=headers or {"content-type": "application/json"})
    STATUSES[f"{case} {r.status_code}"] += 1
    assert r.status_code < 500, r.text
    if r.status_code >= 400:
        assert error_shaped(path, r.json()), r.text
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
    @given(data=st.data(), headers=HOSTILE_HEADERS)
    def test_bodies_from_the_schemas_are_forwarded(self, client, data, headers) -> None:
        """A body valid for the gateway's schema, sent with hostile headers, never answers
        5xx: the gateway forwards it and passes on what vLLM answers (200, or vLLM's own
        4xx with its message)."""
        path = data.draw(st.sampled_from(sorted(ROUTES)))
        kind, model = ROUTES[path]
        body = bounded(data.draw(bodies(kind)), model, path)
        r = _post(client, path, json.dumps(body).encode(), "valid", headers)
        if r.status_code >= 400:
            assert error_code(path, r.json()) in (
                "upstream_rejected",
                "context_length_exceeded",
                "unsupported_content",
                "invalid_request",  # the chat template refused it (vLLM's would too)
                "invalid_request_error",  # the Messages API's: vLLM refused it
            ), r.text

    @settings(FUZZ, max_examples=150)
    @given(data=st.data())
    def test_one_broken_field_answers_400_naming_it(self, client, data) -> None:
        """A valid body with one validated field of the wrong type answers 400 whose
        ``param`` names that field (or the bad element inside it)."""
        path = data.draw(st.sampled_from(sorted(ROUTES)))
        kind, model = ROUTES[path]
        body = bounded(data.draw(bodies(kind)), model, path)
        field = data.draw(st.sampled_from(sorted(_BREAKABLE[path])))
        wrong = data.draw(_WRONG[field])
        target, name, param = body, field, field
        if path == "/v1/chat/completions" and field in ("role", "content", "name"):
            i = data.draw(st.integers(0, len(body["messages"]) - 1))
            target, param = body["messages"][i], f"messages.{i}.{field}"
        target[name] = wrong
        r = _post(client, path, json.dumps(body).encode(), "broken")
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        if path.startswith("/v1/messages"):  # Anthropic's shape has no param: the message
            assert error["message"].startswith(f"Invalid request: {param}"), (param, r.text)
            return
        named = error["param"]
        assert named == param or named.startswith(param + "."), (param, r.text)

    @settings(FUZZ, max_examples=150)
    @given(
        path=st.sampled_from(sorted(ROUTES)),
        raw=st.binary(max_size=64) | JSON.map(lambda v: json.dumps(v).encode()),
    )
    def test_random_bytes_and_json_answer_400(self, client, path, raw) -> None:
        """Random bytes, or random JSON, answer 400 in OpenAI's error format."""
        r = _post(client, path, raw, "random")
        assert r.status_code == 400, r.text


_BREAKABLE = {
    "/v1/chat/completions": {"model", "messages", "role", "content", "name", "max_tokens", "n"},
    "/v1/completions": {"model", "prompt", "max_tokens", "stream", "echo"},
    "/v1/embeddings": {"model", "input", "encoding_format"},
    "/v1/responses": {"model", "input", "max_output_tokens", "stream", "instructions"},
    "/v1/messages": {"model", "messages", "max_tokens", "stream", "system"},
    "/v1/messages/count_tokens": {"model", "messages", "system"},
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
    "max_output_tokens": st.just(0) | st.integers(max_value=-1) | st.text(min_size=1),
    "instructions": st.integers() | st.just({"text": "x"}),
    "system": st.integers() | st.just([{"type": "image"}]),
}
