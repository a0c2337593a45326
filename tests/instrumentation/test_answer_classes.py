"""The ``answer`` SLI judged per prompt-size class, as TTFT is: a long prompt's prefill delays
its first answer token as much as its first token, so each class gets the answer threshold
plus what its TTFT threshold allows beyond the base one, unless set itself. Requests go
through an ordinary instrumented relay to a scripted upstream on a real socket whose usage
(vLLM's prompt tokens) decides the class."""

from __future__ import annotations

from typing import Any

import pytest

from stagelens import semconv as sc
from stagelens.config import answer_classes, load_settings
from stagelens.errors import ConfigurationError
from stagelens.testing import capture_telemetry
from tests._scaffold import event
from tests.instrumentation.test_readings import ROLE, _post, _proxy, content

pytestmark = pytest.mark.anyio


def _usage(prompt_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": 2,
        "total_tokens": prompt_tokens + 2,
    }


def test_each_class_gets_the_base_plus_its_prefill_allowance() -> None:
    settings = load_settings(answer_slo_threshold_seconds=10.0)
    assert answer_classes(settings) == (
        ("1024", 10.0),
        ("8192", 10.5),
        ("32768", 12.0),
        ("+Inf", 14.5),
        ("unknown", 10.0),
    )
    named = load_settings(answer_slo_thresholds_seconds={"+Inf": 30.0})
    assert dict(answer_classes(named))["+Inf"] == 30.0
    assert dict(answer_classes(named))["32768"] == 12.0


def test_a_threshold_for_no_class_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="answer_slo_thresholds_seconds"):
        load_settings(answer_slo_thresholds_seconds={"4096": 12.0})


@pytest.mark.parametrize(("prompt_tokens", "size", "bad"), [(20, "1024", 1), (20_000, "32768", 0)])
async def test_the_same_wait_is_bad_for_a_short_prompt_and_good_for_a_long_one(
    scripted_url: str, prompt_tokens: int, size: str, bad: int
) -> None:
    """An answer token after 0.3 s: over the 1024 class's 0.25 s, within the 32768 class's
    2.25 s (0.25 s plus the 2 s more its TTFT threshold allows)."""
    with capture_telemetry(answer_slo_threshold_seconds=0.25) as cap:
        script = [[0, event(ROLE)], [0.3, event(content("a"))], [0.01, event(content("b"))]]
        body: dict[str, Any] = {
            "stream": True,
            "stream_options": {"include_usage": True},
            "x_script": script,
            "x_usage": _usage(prompt_tokens),
        }
        assert (await _post(_proxy(cap, scripted_url), body)).status_code == 200
        labels = {"model": "tiny", "sli": sc.SLI_ANSWER, "prompt_size": size}
        assert cap.value(sc.SLI_REQUESTS, **labels) == 1
        assert cap.value(sc.SLI_ERRORS, **labels) == bad
        ttfat = cap.value(f"{sc.TIME_TO_FIRST_ANSWER_TOKEN}_sum", model="tiny")
        assert ttfat is not None
        assert ttfat >= 0.3
