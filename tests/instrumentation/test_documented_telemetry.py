"""What a gateway really emits is what docs/telemetry.md (semconv_spec) says it emits.

The reference is generated from the spec table, so a test of the generator alone would
check our table against itself. Here real requests go through the instrumented proxy and
every finished span and every exposed metric family is held against the spec: names,
kinds, label names, attribute keys and attribute value types.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan

from stagelens import semconv
from stagelens import semconv_spec as spec

pytestmark = pytest.mark.anyio

_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "int": (int,),
    "double": (float, int),
    "boolean": (bool,),
    "string[]": (tuple, list),
}
ATTRIBUTES = {a.key: a for a in spec.ATTRIBUTES}


def _pattern(name: str) -> re.Pattern[str]:
    """A span-name pattern (``{key}`` placeholders) as a regular expression."""
    return re.compile(".+".join(re.escape(part) for part in re.split(r"\{[^}]+\}", name)) + r"\Z")


def _matching(span: ReadableSpan) -> list[spec.SpanSpec]:
    """The span specs that this span's name, kind and attribute keys fit."""
    keys = set(span.attributes or {})
    return [
        s
        for s in spec.SPANS
        if _pattern(s.name).match(span.name)
        and span.kind.name == s.kind
        and keys <= set(s.attributes)
    ]


def _check_types(span: ReadableSpan) -> None:
    for key, value in (span.attributes or {}).items():
        wanted = _TYPES[ATTRIBUTES[key].type]
        assert isinstance(value, wanted), (span.name, key, value)
        if ATTRIBUTES[key].type == "int":
            assert not isinstance(value, bool), (span.name, key)


def _exposed(families: Sequence[Any]) -> dict[str, tuple[str, set[str]]]:
    """Exposed metric name -> (type, label names) for every stagelens family with samples."""
    out: dict[str, tuple[str, set[str]]] = {}
    for family in families:
        if not family.samples or not family.name.startswith(semconv.METRIC_PREFIX):
            continue
        name = family.name + ("_total" if family.type == "counter" else "")
        labels = {k for s in family.samples for k in s.labels if k != "le"}
        out[name] = (family.type, labels)
    return out


class TestGatewayEmitsWhatIsDocumented:
    """Spans and metrics of real requests through the instrumented proxy."""

    async def test_spans_and_metrics_match_the_spec(
        self, cap: Any, proxy_factory: Any, client_factory: Any
    ) -> None:
        """Every span fits a SpanSpec with typed attributes; every family fits a MetricSpec."""
        app, _ = proxy_factory(cap)
        async with client_factory(app) as client:
            for body in (
                {"model": "tiny", "stream": True, "max_tokens": 4, "x_chunks": 4},
                {"model": "tiny", "max_tokens": 4, "x_chunks": 4},
                {"model": "no-such-model", "stream": True},
            ):
                await client.post("/v1/chat/completions", json=body)
        spans = cap.spans()
        used: set[str] = set()
        for span in spans:
            fits = _matching(span)
            assert fits, (span.name, span.kind, sorted(span.attributes or {}))
            used.update(s.name for s in fits)
            _check_types(span)
        gateway_specs = {s.name for s in spec.SPANS if spec.GATEWAY in s.emitted_by}
        assert used == gateway_specs
        exposed = _exposed(list(cap.registry.collect()))
        documented = {m.name: m for m in spec.METRICS}
        for name, (kind, labels) in exposed.items():
            assert name in documented, name
            assert (kind, labels) == (documented[name].kind, set(documented[name].labels)), name
        assert set(exposed) >= {
            semconv.STAGE_DURATION,
            semconv.REQUEST_DURATION,
            semconv.TIME_TO_FIRST_TOKEN,
            semconv.INTER_TOKEN_LATENCY,
            semconv.ENGINE_PHASE_DURATION,
            semconv.REQUESTS,
            semconv.TOKENS,
            semconv.COST_USD,
            semconv.STAGE_BUDGET,
        }
