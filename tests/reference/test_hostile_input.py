"""Hostile request bodies get a 4xx naming the problem from the gateway stage, before any
backend is called: too deep, invalid Unicode, non-finite numbers, too large (413, the
configured limit), random bytes, with hostile headers. The gateway here has no live
backend, so a body that got past the gateway stage would answer 503: any 5xx fails."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from stagelens.reference import demo_config

from tests._fuzz import (
    HOSTILE_HEADERS,
    JSON,
    ROUTES,
    bodies,
    bounded,
    error_code,
    error_shaped,
    expected_code,
    hostile,
)
from tests.e2e.conftest import start_gateway

LIMIT = 64 * 1024
"""The body size limit of the gateway under test (``max_body_bytes``)."""

CHAT = {"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def client(tiny_model: Path, port_factory: Any) -> Iterator[httpx.Client]:
    """The demo configuration over a backend port nobody listens on."""
    dead = f"http://127.0.0.1:{port_factory()}"
    config = demo_config(
        [dead],
        str(tiny_model),
        embed_backends=[dead],
        rate_limit_per_second=10_000,
        rate_limit_burst=10_000,
        max_body_bytes=LIMIT,
        health_interval_seconds=600,
    )
    for stack in start_gateway(config, port_factory()):
        headers = {"authorization": f"Bearer {stack.api_key}"}
        with httpx.Client(base_url=stack.url, headers=headers, timeout=60) as c:
            yield c


def _error(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, (r.status_code, r.text)
    assert error_shaped(r.request.url.path, r.json()), r.text
    error: dict[str, Any] = r.json()["error"]
    return error


def _with(**extra: str) -> bytes:
    """The chat body with extra fields written as raw JSON text (not encoded by json)."""
    text = json.dumps({**CHAT, **{k: "@" + k for k in extra}})
    for key, raw in extra.items():
        text = text.replace(f'"@{key}"', raw)
    return text.encode()


CASES = [
    ("nested 100 deep", _with(x="[" * 100 + "]" * 100), 400, "nesting_too_deep", "x"),
    ("nested 30000 deep", _with(x="[" * 30_000 + "]" * 30_000), 400, "nesting_too_deep", None),
    (
        "escaped lone surrogate in content",
        json.dumps({**CHAT, "messages": [{"role": "user", "content": "a\ud800"}]}).encode(),
        400,
        "invalid_unicode",
        "messages.0.content",
    ),
    (
        "raw lone surrogate in stop",
        json.dumps({**CHAT, "stop": ["\udfff"]}, ensure_ascii=False).encode(
            "utf-8", "surrogatepass"
        ),
        400,
        "invalid_unicode",
        "stop.0",
    ),
    ("NaN temperature", _with(temperature="NaN"), 400, "invalid_number", None),
    ("Infinity in an unchecked field", _with(top_p="Infinity"), 400, "invalid_number", None),
    ("1e400 overflows to infinity", _with(presence_penalty="1e400"), 400, "invalid_number", None),
    ("bytes that are not UTF-8", b'{"model": "tiny\xff"}', 400, "invalid_unicode", None),
    ("max_tokens of the wrong type", _with(max_tokens='"4"'), 400, "invalid_request", "max_tokens"),
    ("body over the limit", _with(x='"' + "y" * LIMIT + '"'), 413, "request_too_large", None),
]


class TestHostileBodies:
    """Named hostile bodies and fuzzed ones, over a real socket (sync httpx client)."""

    @pytest.mark.parametrize(
        ("raw", "status", "code", "param"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
    )
    def test_each_problem_answers_4xx_naming_it(self, client, raw, status, code, param) -> None:
        """Each kind of malformed body answers its 4xx with an error code naming the
        problem and, where there is one, the field."""
        r = client.post("/v1/chat/completions", content=raw)
        error = _error(r, status)
        assert error["code"] == code, error
        if param is not None:
            assert error["param"] == param, error

    def test_chunked_body_over_the_limit_answers_413(self, client) -> None:
        """A body sent without a Content-Length (chunked) is refused once it passes the
        limit: the gateway does not need the client to declare its size."""

        def chunks() -> Iterator[bytes]:
            yield b'{"model": "tiny", "x": "'
            for _ in range(LIMIT // 1024 + 2):
                yield b"y" * 1024
            yield b'"}'

        r = client.post("/v1/chat/completions", content=chunks())
        assert "content-length" not in r.request.headers
        assert _error(r, 413)["code"] == "request_too_large"

    @settings(
        max_examples=120,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(data=st.data(), headers=HOSTILE_HEADERS)
    def test_fuzzed_hostile_bodies_answer_their_4xx(self, client, data, headers) -> None:
        """A body drawn from a route's schema with one hostile change, sent with hostile
        headers, answers the 4xx and error code of that change."""
        path = data.draw(st.sampled_from(sorted(ROUTES)))
        kind, model = ROUTES[path]
        case = data.draw(hostile(bounded(data.draw(bodies(kind)), model, path), LIMIT))
        status, code = case.status, case.code
        if len(case.raw) > LIMIT:  # (a deep one can be): the size limit is checked first
            status, code = 413, "request_too_large"
        r = client.post(path, content=case.raw, headers=headers)
        _error(r, status)
        assert error_code(path, r.json()) == expected_code(path, status, code), (case.how, r.text)

    @settings(
        max_examples=120,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(
        path=st.sampled_from(sorted(ROUTES)),
        raw=st.binary(max_size=64) | JSON.map(lambda v: json.dumps(v).encode()),
        headers=HOSTILE_HEADERS,
    )
    def test_random_bytes_with_hostile_headers_answer_400(self, client, path, raw, headers) -> None:
        """Random bytes or random JSON, with hostile headers, answer 400."""
        _error(client.post(path, content=raw, headers=headers), 400)
