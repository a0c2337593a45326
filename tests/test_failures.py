"""Swallowed telemetry failures: counted every time, logged once per component, and the log
line never carries the exception's message (it can hold prompt or completion text)."""

from __future__ import annotations

import logging

import pytest
from prometheus_client import CollectorRegistry
from pydantic import TypeAdapter, ValidationError

from stagelens import semconv
from stagelens._failures import FailureReporter
from stagelens.telemetry import Telemetry

SECRET = "the patient's diagnosis is confidential"


def _validation_error() -> ValidationError:
    """What validating a malformed upstream body raises: pydantic quotes the input value."""
    try:
        TypeAdapter(int).validate_python(SECRET)
    except ValidationError as exc:
        return exc
    raise AssertionError("unreachable")


def _logged(caplog: pytest.LogCaptureFixture) -> str:
    """Everything the records would print: messages, arguments and any traceback."""
    parts = []
    for record in caplog.records:
        parts.append(record.getMessage())
        parts.append(repr(record.args))
        if record.exc_info or record.exc_text:
            parts.append(str(record.exc_info) + str(record.exc_text))
    return "\n".join(parts)


class TestTelemetryReportError:
    """``Telemetry.report_error``: the path every instrumentation failure takes."""

    def test_message_with_a_secret_never_reaches_the_log(self, caplog) -> None:
        """A validation error quoting completion text logs its type and component only."""
        registry = CollectorRegistry()
        telemetry = Telemetry(registry=registry)
        exc = _validation_error()
        assert SECRET in str(exc)  # the message does carry it
        with caplog.at_level(logging.DEBUG):
            telemetry.report_error("upstream", exc)
        text = _logged(caplog)
        assert SECRET not in text
        assert "confidential" not in text
        assert "ValidationError" in text
        assert "'upstream'" in text

    def test_counted_every_time_and_logged_once_per_component(self, caplog) -> None:
        """Three failures of one component and one of another: four counted, two lines."""
        registry = CollectorRegistry()
        telemetry = Telemetry(registry=registry)
        with caplog.at_level(logging.WARNING, logger="stagelens"):
            for _ in range(3):
                telemetry.report_error("upstream", RuntimeError(SECRET))
            telemetry.report_error("billing", KeyError(SECRET))
        count = registry.get_sample_value
        assert count(semconv.TELEMETRY_ERRORS, {"component": "upstream"}) == 3
        assert count(semconv.TELEMETRY_ERRORS, {"component": "billing"}) == 1
        assert len(caplog.records) == 2
        assert SECRET not in _logged(caplog)


class TestFailureReporter:
    """The one reporter behind ``Telemetry.report_error`` and the vLLM plugin."""

    def test_without_a_counter_or_an_exception_it_still_logs_once(self, caplog) -> None:
        """No counter (the gateway owns it on that registry) and no exception (an exporter
        answered FAILURE): one line naming the component, nothing raised."""
        reporter = FailureReporter(None, logging.getLogger("stagelens.test"), unaffected="vLLM")
        with caplog.at_level(logging.WARNING, logger="stagelens.test"):
            reporter.report("vllm_otlp_metrics", None, "OTLP metric export failed")
            reporter.report("vllm_otlp_metrics", None, "OTLP metric export failed")
        (record,) = caplog.records
        assert "OTLP metric export failed (no exception); vLLM continues" in record.getMessage()

    def test_a_failing_counter_never_raises(self) -> None:
        """Reporting must not fail either: a counter that raises is swallowed."""

        def broken(component: str) -> None:
            raise RuntimeError("counter gone")

        FailureReporter(broken, logging.getLogger("stagelens.test")).report("x", ValueError())
