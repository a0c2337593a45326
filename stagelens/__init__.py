"""stagelens: one OpenTelemetry trace per LLM request, a span per stage, and the metrics,
dashboards and SLO alerts that go with them.

Users import only the names in ``__all__``; everything else is machinery.
"""

from __future__ import annotations

from stagelens._version import __version__
from stagelens.config import Settings
from stagelens.exporters import configure
from stagelens.instrumentation import (
    FastAPIInstrumentor,
    Rejected,
    StageLensMiddleware,
    bill,
    instrument_app,
    instrument_httpx_client,
    record_usage,
    stage,
    uninstrument_httpx_client,
)
from stagelens.pricing import Price, PriceTable, Usage
from stagelens.request import current_request
from stagelens.stages import Stage
from stagelens.tail_sampling import TailSampler
from stagelens.telemetry import Telemetry, default_telemetry

__all__ = [
    "FastAPIInstrumentor",
    "Price",
    "PriceTable",
    "Rejected",
    "Settings",
    "Stage",
    "StageLensMiddleware",
    "TailSampler",
    "Telemetry",
    "Usage",
    "__version__",
    "bill",
    "configure",
    "current_request",
    "default_telemetry",
    "instrument_app",
    "instrument_httpx_client",
    "record_usage",
    "stage",
    "uninstrument_httpx_client",
]
