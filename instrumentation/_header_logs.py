"""Keep client-made trace headers out of the logs.

OpenTelemetry's W3C propagators log every header they drop: an oversized ``traceparent`` or
``tracestate``, and a malformed ``baggage`` entry *quoted in full*. At a gateway those
headers are whatever any client sends, so each request can add a log line, and a client's
text (a key pasted into ``baggage``) reaches the logs. The middleware extracts through those
propagators, so it installs this filter on their loggers: the first record of each passes,
reworded without its arguments; the rest are dropped. Extraction itself is unchanged (the
propagator ignores the bad header either way).
"""

from __future__ import annotations

import logging
import threading
from typing import Final

PROPAGATOR_LOGGERS: Final = (
    "opentelemetry.trace.propagation.tracecontext",
    "opentelemetry.baggage.propagation",
)
"""The loggers of the W3C trace-context and baggage propagators."""


class _FirstOnlyWithoutArguments(logging.Filter):
    """Pass a logger's first warning, its client-made arguments removed; drop the rest."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self._logger_name = name
        self._passed = False
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        with self._lock:
            if self._passed:
                return False
            self._passed = True
        record.msg = (
            "stagelens: %s dropped a malformed or oversized header sent by a client (the "
            "header is not logged); further ones are dropped silently"
        )
        record.args = (self._logger_name,)
        return True


_installed: set[str] = set()
_install_lock = threading.Lock()


def quiet_propagator_logs() -> None:
    """Install the filter on each propagator logger, once per process."""
    with _install_lock:
        for name in PROPAGATOR_LOGGERS:
            if name not in _installed:
                logging.getLogger(name).addFilter(_FirstOnlyWithoutArguments(name))
                _installed.add(name)
