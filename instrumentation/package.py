"""Library versions the instrumentors support (mirrored in pyproject extras)."""

from __future__ import annotations

_instruments = ("fastapi >= 0.110",)
"""Checked by BaseInstrumentor before instrumenting."""
