"""stage() as context manager and decorator, sync and async; record_usage(); bill()."""

from __future__ import annotations

import pytest
from opentelemetry.trace import NoOpTracerProvider, StatusCode
from prometheus_client import CollectorRegistry
from stagelens.instrumentation import Telemetry

from stagelens import Stage, semconv, stage
from stagelens.telemetry import set_default_telemetry
from stagelens.testing import TRACERS, TracerKind

BOTH_TRACERS = pytest.mark.parametrize("cap", TRACERS, indirect=True)
"""Run a test once per tracer a capture can record through: span shapes must agree."""


@pytest.fixture
def default_is(cap):
    """Make the capture the default Telemetry (stage() outside a request uses it)."""
    set_default_telemetry(cap.telemetry)
    yield cap
    set_default_telemetry(None)


class TestSyncStage:
    """Synchronous uses of stage()."""

    @BOTH_TRACERS
    def test_context_manager_makes_a_span_and_an_observation(self, default_is) -> None:
        """Outside a request, a stage still yields its span and a histogram sample."""
        with stage(Stage.TOKENIZER) as s:
            assert s.span.is_recording()
        span = default_is.span("tokenizer")
        assert span.attributes[semconv.ATTR_STAGE] == "tokenizer"
        assert (
            default_is.value(semconv.STAGE_DURATION + "_count", stage="tokenizer", model="unknown")
            == 1.0
        )

    @BOTH_TRACERS
    def test_decorator_wraps_each_call_in_its_own_span(self, default_is) -> None:
        """@stage on a function gives one span per call and returns the result."""

        @stage("retrieval", attributes={"retrieval.k": 4})
        def retrieve(q: str) -> str:
            return q.upper()

        assert retrieve("a") == "A"
        assert retrieve("b") == "B"
        spans = [s for s in default_is.spans() if s.name == "retrieval"]
        assert len(spans) == 2
        assert spans[0].attributes["retrieval.k"] == 4
        assert retrieve.__name__ == "retrieve"

    @BOTH_TRACERS
    def test_nested_stages_are_parent_and_child(self, default_is) -> None:
        """A stage opened inside another is its child span."""
        with stage(Stage.ROUTER), stage("admission"):
            pass
        router, admission = default_is.span("router"), default_is.span("admission")
        assert admission.parent.span_id == router.context.span_id

    @BOTH_TRACERS
    def test_exception_propagates_unchanged(self, default_is) -> None:
        """The very exception object leaves the block; the span records it."""
        err = KeyError("k")
        with pytest.raises(KeyError) as info, stage(Stage.TOKENIZER):
            raise err
        assert info.value is err
        span = default_is.span("tokenizer")
        assert span.status.status_code is StatusCode.ERROR
        assert span.attributes[semconv.ERROR_TYPE] == "KeyError"

    @pytest.mark.parametrize("tracer", ["deferred", "sdk"])
    @pytest.mark.parametrize("capture", [False, True])
    def test_an_exception_message_reaches_the_span_only_with_content_capture(
        self, tracer: str, capture: bool
    ) -> None:
        """An exception's message can quote the prompt: without content capture the span
        keeps its type, escaped flag and frames, never the message (event, stack trace,
        status); with capture on it is recorded as the SDK records it."""
        from stagelens.testing import capture_telemetry

        kind: TracerKind = "sdk" if tracer == "sdk" else "deferred"
        with capture_telemetry(tracer=kind, capture_message_content=capture) as cap:
            set_default_telemetry(cap.telemetry)
            try:
                prompt = " ".join(("secret", "prompt", "text"))  # the frames show code only
                with pytest.raises(ValueError, match="cannot tokenize"), stage(Stage.TOKENIZER):
                    raise ValueError(f"cannot tokenize: {prompt}")
            finally:
                set_default_telemetry(None)
            span = cap.span("tokenizer")
        assert span.status.status_code is StatusCode.ERROR
        (event,) = [e for e in span.events if e.name == "exception"]
        assert event.attributes is not None
        assert event.attributes["exception.type"] == "ValueError"
        assert "test_hooks.py" in str(event.attributes["exception.stacktrace"])
        shown = repr((span.status.description, dict(event.attributes), dict(span.attributes or {})))
        assert ("secret prompt text" in shown) is capture

    def test_tracing_off_still_records_the_metric(self) -> None:
        """With a no-op tracer provider, stage() costs no span but keeps the histogram."""
        registry = CollectorRegistry()
        telemetry = Telemetry(tracer_provider=NoOpTracerProvider(), registry=registry)
        set_default_telemetry(telemetry)
        try:
            with stage("cheap") as s:
                assert not s.span.is_recording()
        finally:
            set_default_telemetry(None)
        assert (
            registry.get_sample_value(
                semconv.STAGE_DURATION + "_count", {"stage": "cheap", "model": "unknown"}
            )
            == 1.0
        )


@pytest.mark.anyio
class TestAsyncStage:
    """Asynchronous uses of stage()."""

    @BOTH_TRACERS
    async def test_async_context_manager(self, default_is) -> None:
        """`async with stage(...)` makes one span."""
        async with stage(Stage.POSTPROCESS):
            pass
        assert default_is.span("postprocess").attributes[semconv.ATTR_STAGE] == "postprocess"

    @BOTH_TRACERS
    async def test_async_decorator(self, default_is) -> None:
        """@stage on a coroutine function awaits it inside the span."""

        @stage(Stage.LOAD_BALANCER)
        async def pick() -> str:
            return "backend-1"

        assert await pick() == "backend-1"
        assert default_is.span("load_balancer").end_time is not None

    @BOTH_TRACERS
    async def test_async_exception_propagates(self, default_is) -> None:
        """An exception in an async stage reaches the awaiter unchanged."""

        @stage(Stage.ROUTER)
        async def route() -> None:
            raise LookupError("no pool")

        with pytest.raises(LookupError, match="no pool"):
            await route()
        assert default_is.span("router").status.status_code is StatusCode.ERROR
