"""The few exceptions stagelens raises, all at setup time, never on the request path."""

from __future__ import annotations


class StageLensError(Exception):
    """Base class of every exception stagelens raises itself."""


class ConfigurationError(StageLensError, ValueError):
    """Raised at construction when settings, a price table or an SLO config are invalid."""


class DependencyMissingError(StageLensError, ImportError):
    """Raised when a feature is asked for whose optional extra is not installed."""


class TraceSourceError(StageLensError):
    """Raised when a trace source (the demo's receiver, an OTLP/JSON file) cannot be read,
    is malformed, or lacks the trace asked for."""
