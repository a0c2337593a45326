"""Swallowed telemetry failures: counted every time, logged once per component.

Telemetry never breaks serving, so a failing hook, exporter or stats read is caught where
it happens and handed to a ``FailureReporter``: it counts the failure in
``stagelens_telemetry_errors_total{component}`` and logs the first one of each component,
so that a collector down for an hour is one log line and a rising counter.

Why the log line names the exception's type and never its message: messages can carry
request content (pydantic's validation errors quote the input value, a ``KeyError`` names
a key read from a payload, a parser may quote the text it choked on: prompt or completion
text), and nothing private may reach the logs. The type and the component say
which part failed; the counter says how often.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from stagelens import semconv as sc

Count = Callable[[str], object]
"""``count(component)``: adds one to ``stagelens_telemetry_errors_total{component}``."""


class FailureReporter:
    """Counts swallowed failures per component and logs the first of each.

    Called from request paths, exporter threads and vLLM's output loop at once, so the
    log-once memory takes a short lock (never held across an await: nothing here awaits).
    """

    __slots__ = ("_count", "_lock", "_logged", "_logger", "_unaffected")

    def __init__(
        self, count: Count | None, logger: logging.Logger, unaffected: str = "serving"
    ) -> None:
        """``count`` is None where the counter could not be created (the log line still
        says so); ``unaffected`` names what carries on (``"serving"``, ``"vLLM"``)."""
        self._count = count
        self._logger = logger
        self._unaffected = unaffected
        self._logged: set[str] = set()
        self._lock = threading.Lock()

    def report(self, component: str, exc: BaseException | None, what: str | None = None) -> None:
        """Count one failure of ``component``; log it the first time only. Never raises.

        ``what`` says what failed in words (default ``"<component> failed"``); ``exc`` is
        None where there is no exception to name (an exporter that returned FAILURE)."""
        try:
            if self._count is not None:
                self._count(component)
            with self._lock:
                first = component not in self._logged
                self._logged.add(component)
            if first:
                self._logger.warning(
                    "stagelens: %s (%s); %s continues, further failures are only counted "
                    "in %s{component=%r}",
                    what or f"{component} failed",
                    type(exc).__name__ if exc is not None else "no exception",
                    self._unaffected,
                    sc.TELEMETRY_ERRORS,
                    component,
                )
        except Exception:  # reporting must not fail either
            pass
