"""Telemetry.force_flush() and shutdown() cover every pipeline registered with them, and a
failing one neither stops the others nor raises (telemetry never breaks shutdown)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from stagelens import semconv
from stagelens.telemetry import Telemetry


class _Pipeline:
    def __init__(self, fails: bool = False) -> None:
        self.fails = fails
        self.flushes: list[int] = []
        self.shutdowns = 0

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        self.flushes.append(timeout_millis)
        if self.fails:
            raise RuntimeError("collector down")
        return True

    def shutdown(self) -> None:
        self.shutdowns += 1
        if self.fails:
            raise RuntimeError("collector down")


def _telemetry() -> Telemetry:
    return Telemetry(registry=CollectorRegistry())


def _errors(telemetry: Telemetry) -> float | None:
    return telemetry.registry.get_sample_value(
        "stagelens_telemetry_errors_total", {"component": semconv.COMPONENT_SHUTDOWN_FLUSH}
    )


def test_every_pipeline_is_flushed_and_shut_down_once_registered_once() -> None:
    """Registered twice = once; flush passes the timeout; a derived Telemetry shares them."""
    telemetry = _telemetry()
    pipeline = _Pipeline()
    telemetry.add_pipeline(pipeline)
    telemetry.add_pipeline(pipeline)
    assert telemetry.derive().force_flush(1234)
    assert pipeline.flushes == [1234]
    telemetry.shutdown()
    assert pipeline.shutdowns == 1


def test_a_failing_pipeline_is_counted_and_the_others_still_run() -> None:
    """force_flush() says False and shutdown() goes on; each failure is counted."""
    telemetry = _telemetry()
    bad, good = _Pipeline(fails=True), _Pipeline()
    telemetry.add_pipeline(bad)
    telemetry.add_pipeline(good)
    assert telemetry.force_flush(10) is False
    assert good.flushes == [10]
    telemetry.shutdown()
    assert good.shutdowns == 1
    assert _errors(telemetry) == 2


def test_a_provider_not_owned_is_flushed_on_shutdown_and_left_running() -> None:
    """add_flushed(): shutdown() flushes the user's provider instead of stopping it; one
    without force_flush is harmless."""
    telemetry = _telemetry()
    provider = _Pipeline()
    telemetry.add_flushed(provider)
    telemetry.add_flushed(provider)
    telemetry.add_flushed(object())
    assert telemetry.force_flush(7)
    telemetry.shutdown()
    assert len(provider.flushes) == 2
    assert provider.shutdowns == 0
