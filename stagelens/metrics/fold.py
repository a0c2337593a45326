"""The fold: finished requests (and lone observations made outside any request) queued on
the request path, handed in batches to the sinks.

Why batches: a streamed request ends with ~15 observations and ~6 increments. Queued (O(1)
on the request path) and handed over together, a sink writes each touched series once per
batch instead of once per request. Why sinks of equal rank: the Prometheus series and the
GenAI OpenTelemetry metrics both read the same records (``stagelens.metrics.record``); neither is
the other's consumer, and a failing sink costs only itself.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Final

from stagelens import semconv as sc
from stagelens.metrics.record import Record, RequestSink

__all__ = ["FOLD_EVERY", "Fold"]

FOLD_EVERY: Final = 128
"""Queued records are handed to the sinks once this many are waiting (and whenever
``Fold.fold`` is called, as every Prometheus collection does first).

Why batches this large: a sink's cost per batch is mostly per touched series and bucket (a
sort, two bisects and one locked increment per bucket), shared by every record of the batch,
so a record costs less the larger its batch. The price is paid on the event loop by the one
request whose end fills the batch, after its own last byte was sent: bounded by this many
records, never more (a scrape folds whatever waits, however few). docs/overhead.md gives
today's cost of a fold and the command that measures it. Between scrapes a busy gateway
fills a batch every few hundred milliseconds; a quiet one is folded by the scrape."""

FailureCounter = Callable[[int], None]
"""Counts ``n`` swallowed failures (``stagelens_telemetry_errors_total{component="metrics"}``)."""

logger = logging.getLogger("stagelens")


class Fold:
    """One queue of finished requests and the sinks every batch goes to, in order added."""

    def __init__(self, *, every: int = FOLD_EVERY, count_failures: FailureCounter) -> None:
        """``every``: hand over once this many records wait (1: at once, as multiprocess
        mode needs, whose scrape cannot fold first). ``count_failures`` counts what a sink
        swallowed or raised; the first failure ever is also logged, by its type."""
        self._pending: deque[Record] = deque()
        self._lock = threading.Lock()
        self._every = every
        self._count_failures = count_failures
        self._logged = False
        self.sinks: tuple[RequestSink, ...] = ()
        self.needs_genai = False
        """Whether any sink needs each record's ``genai`` (read on the request path)."""

    def add_sink(self, sink: RequestSink) -> None:
        """Hand every batch to ``sink`` too, after the sinks already added."""
        with self._lock:
            self.sinks = (*self.sinks, sink)
            self.needs_genai = any(s.needs_genai for s in self.sinks)

    def submit(self, record: Record) -> None:
        """Queue one finished request or lone observation (O(1)); hand over the batch
        once ``every`` wait."""
        pending = self._pending
        pending.append(record)
        if len(pending) >= self._every:
            self.fold()

    def fold(self) -> None:
        """Hand every queued record to each sink; never raises. A sink's failures (returned
        or raised) are counted and the first ever logged; the other sinks still get the
        batch."""
        pending = self._pending
        if not pending:
            return
        with self._lock:
            batch = [pending.popleft() for _ in range(len(pending))]
            failed: list[Exception] = []
            for sink in self.sinks:
                try:
                    failed += sink.write(batch)
                except Exception as exc:
                    failed.append(exc)
            if failed:
                self._failed(len(failed), failed[0])

    def _failed(self, failures: int, exc: Exception) -> None:
        """Count ``failures`` and log the first ever, by its type only: a message may quote a
        record's values (a model or tenant name a client sent), and logs carry no client
        input (``stagelens._failures`` holds the same rule)."""
        try:
            self._count_failures(failures)
        except Exception:  # the counter itself broken: still never raise
            logger.debug("stagelens: counting a metrics failure failed", exc_info=False)
        if not self._logged:
            self._logged = True
            logger.warning(
                "stagelens: recording request metrics failed (%s); further failures "
                "are only counted in %s{component=%r}",
                type(exc).__name__,
                sc.TELEMETRY_ERRORS,
                sc.COMPONENT_METRICS,
            )
