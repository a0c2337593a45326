"""Workers never split the metrics in silence: a warning once, and the state on ``/metrics``.

Why: a service run as ``uvicorn svc:app --workers 2`` (or under gunicorn) with
``PROMETHEUS_MULTIPROC_DIR`` unset answers each scrape from whichever worker accepted it;
each worker counts only its own requests, so a counter reads 18, 22, 18 on successive
scrapes and every rate and SLO ratio is wrong, with nothing to say so. ``configure()``
therefore asks, at start-up, whether this process is one of several workers of one server
(``stagelens.prefork``; what it can and cannot see is said there) and, while it is:

- logs one warning per process naming the fix (``PROMETHEUS_MULTIPROC_DIR``);
- exposes ``stagelens_metrics_split_info{server, workers} 1`` on the registry ``/metrics``
  serves, so that a dashboard or an alert can show it, whichever worker answers.

When: at ``configure()``; again a few seconds later while this process is its server's only
worker so far (the others may not have started yet: gunicorn starts them one by one); and
at a scrape when the last look found a worker alone, is older than ``RECHECK_SECONDS`` or
was taken by another process (gunicorn's ``--preload`` configures the app in the master,
then forks: each worker finds out at its first scrape). Never raises: a failed look is no
finding.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Final

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from stagelens import semconv
from stagelens.prefork import Workers, find_workers

logger = logging.getLogger("stagelens.exporters.worker_split")

RECHECK_SECONDS: Final = 30.0
"""A scrape looks again when the last look is older than this (workers come and go)."""
START_RECHECKS: Final = (2.0, 10.0)
"""Seconds after ``configure()`` at which a worker alone so far looks again for siblings."""

FIX: Final = (
    "set PROMETHEUS_MULTIPROC_DIR to an empty directory before the server starts "
    "(docs/instrumenting.md, 'Several workers')"
)


class WorkerSplit(Collector):
    """Scrape-time collector of ``stagelens_metrics_split_info``, and the warning."""

    def __init__(
        self,
        find: Callable[[], Workers | None] = find_workers,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._find = find
        self._clock = clock
        self._lock = threading.Lock()
        self._found: Workers | None = None
        self._looked: tuple[int, float] | None = None
        """(pid, clock) of the last look."""
        self._warned_pid: int | None = None

    def look(self) -> Workers | None:
        """Look now; warn (once per process) when the metrics are split."""
        try:
            found = self._find()
        except Exception:  # a look that fails finds nothing: serving goes on
            found = None
        pid = os.getpid()
        with self._lock:
            self._found, self._looked = found, (pid, self._clock())
            warn = split(found) and self._warned_pid != pid
            if warn:
                self._warned_pid = pid
        if warn and found is not None:
            logger.warning(
                "this process (pid %d) is one of %d workers of %s and "
                "PROMETHEUS_MULTIPROC_DIR is not set: each scrape of /metrics reads only "
                "the worker that answers it, so counters jump and every rate and SLO ratio "
                "is wrong; %s. Shown as %s.",
                pid,
                found.count,
                found.server,
                FIX,
                semconv.METRICS_SPLIT,
            )
        return found

    def current(self) -> Workers | None:
        """The last look, taken again when stale, taken by another process, or when it
        found a worker alone (its siblings may have started since: a look is a few reads
        of ``/proc``, cheap beside a scrape)."""
        with self._lock:
            looked, found = self._looked, self._found
        stale = looked is None or looked[0] != os.getpid()
        stale = stale or (found is not None and not split(found))
        if not stale and looked is not None:
            stale = self._clock() - looked[1] > RECHECK_SECONDS
        return self.look() if stale else found

    def collect(self) -> Iterator[Metric]:
        """``stagelens_metrics_split_info{server, workers} 1`` while split, else nothing."""
        found = self.current()
        if found is None or not split(found):
            return
        family = GaugeMetricFamily(
            semconv.METRICS_SPLIT,
            "1 while this process is one of several workers of one server and "
            "PROMETHEUS_MULTIPROC_DIR is unset: each scrape reads one worker",
            labels=[semconv.LABEL_SERVER, semconv.LABEL_WORKERS],
        )
        family.add_metric([found.server, str(found.count)], 1)
        yield family

    def describe(self) -> Iterator[Metric]:
        """Nothing: registering must not look (``collect`` would, at once)."""
        return iter(())

    def look_again_soon(self, delays: tuple[float, ...] = START_RECHECKS) -> None:
        """While this process is its server's only worker so far, look again after each
        of ``delays`` (seconds from now), on a daemon thread, until split is seen."""

        def later() -> None:
            waited = 0.0
            for delay in delays:
                time.sleep(delay - waited)
                waited = delay
                if split(self.look()):
                    return

        threading.Thread(target=later, name="stagelens-worker-split", daemon=True).start()


def split(found: Workers | None) -> bool:
    """Several workers accept on one socket (and nothing adds their metrics up)."""
    return found is not None and found.count > 1


_BY_REGISTRY: weakref.WeakKeyDictionary[CollectorRegistry, WorkerSplit] = (
    weakref.WeakKeyDictionary()
)
_REGISTERING = threading.Lock()


def watch_workers(
    registry: CollectorRegistry, find: Callable[[], Workers | None] = find_workers
) -> WorkerSplit:
    """Look now, register the collector on ``registry`` (the one ``/metrics`` serves; once
    per registry) and, when this process is a worker alone so far, look again soon. The
    caller skips it in multiprocess mode, where the scrape adds every worker up."""
    with _REGISTERING:
        watcher = _BY_REGISTRY.get(registry)
        if watcher is None:
            watcher = _BY_REGISTRY[registry] = WorkerSplit(find)
            registry.register(watcher)
    found = watcher.look()
    if found is not None and not split(found):
        watcher.look_again_soon()
    return watcher
