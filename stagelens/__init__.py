"""stagelens: one OpenTelemetry trace per LLM request, a span per stage, and the metrics,
dashboards and SLO alerts that go with them.

Users import only the names in ``__all__``; everything else is machinery.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from stagelens.stages import Stage

try:
    __version__ = version("stagelens")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0"

__all__ = ["Stage", "__version__"]
