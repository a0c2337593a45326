"""Sampling NVML over time: the session (init, backoff, shutdown), the background sampler
(GPM two-sample diffing, process list) and ``GpuReader``, the one object exporters hold.

What runs where. A scrape makes only the cheap per-GPU calls of ``nvml_read``. The slow
readings run on a background thread every ``interval_s``: GPM SM activity, which needs two
samples some time apart (the previous one is kept and diffed against the next, so nothing
waits), and the compute-process list (part of an NVML snapshot, many times slower than a
per-GPU call). A scrape uses the sampler's last readings and never waits on them.

Fatal NVML errors: ``GpuReader.read()`` reports ``up`` False, gives its ``nvmlInit`` back
and re-initialises on a later read with exponential backoff; one warning per outage, one
info line on recovery.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from stagelens.exporters.nvml_read import (
    LOGGER_NAME,
    Device,
    DeviceCache,
    GpuSnapshot,
    NvmlFatalError,
    ProcessSample,
    SlowReadings,
    error_kind,
    gpm_sm_active,
    gpm_supported,
    load_nvml,
    nvml_call,
    process_name,
    read_gpu_samples,
)

_log = logging.getLogger(LOGGER_NAME)


class NvmlSession:
    """NVML init state: ``ensure()`` (re)initialises, with exponential backoff after failures."""

    def __init__(
        self,
        nvml: Any | None,
        *,
        backoff_s: float,
        backoff_max_s: float,
        clock: Callable[[], float],
    ) -> None:
        """Hold ``nvml`` (``None``: not installed, warn once); nothing is initialised yet."""
        self.nvml = nvml
        self.devices = DeviceCache()
        self.generation = 0
        self._ok = False
        self._lock = threading.Lock()
        self._clock = clock
        self._backoff_initial = backoff_s
        self._backoff_max = backoff_max_s
        self._backoff = backoff_s
        self._next_try = 0.0
        self._warned = False
        if nvml is None:
            self._warn("NVML library (nvidia-ml-py) is not installed")

    @property
    def ok(self) -> bool:
        """True while NVML is initialised and answering."""
        return self._ok

    def _warn(self, message: str) -> None:
        if not self._warned:
            self._warned = True
            _log.warning("GPU metrics unavailable (stagelens_gpu_collector_up 0): %s", message)

    def ensure(self) -> bool:
        """True when NVML is initialised now; tries ``nvmlInit`` when the backoff allows."""
        if self._ok:
            return True
        nvml = self.nvml
        if nvml is None:
            return False
        with self._lock:
            if self._ok:
                return True
            now = self._clock()
            if now < self._next_try:
                return False
            try:
                nvml.nvmlInit()
            except Exception as exc:
                self._next_try = now + self._backoff
                self._backoff = min(self._backoff * 2, self._backoff_max)
                self._warn(f"nvmlInit failed ({type(exc).__name__}: {exc}); retrying with backoff")
                return False
            self.devices.forget()
            self.generation += 1
            self._ok = True
            self._backoff = self._backoff_initial
            if self._warned:
                _log.info("GPU metrics available again: NVML initialised")
            self._warned = False
            return True

    def fail(self, exc: BaseException) -> None:
        """NVML stopped answering: give our init back, report up 0 until a retry succeeds."""
        with self._lock:
            if not self._ok:
                return
            self._ok = False
            self._next_try = self._clock() + self._backoff
            self._warn(f"NVML stopped answering ({type(exc).__name__}: {exc}); will re-initialise")
            nvml = self.nvml
            if nvml is not None:
                with contextlib.suppress(Exception):
                    nvml.nvmlShutdown()

    def close(self) -> None:
        """Give our ``nvmlInit`` reference back (NVML is reference counted per process)."""
        with self._lock:
            if self._ok:
                self._ok = False
                self._next_try = float("inf")
                nvml: Any = self.nvml
                with contextlib.suppress(Exception):
                    nvml.nvmlShutdown()


class BackgroundSampler:
    """Daemon thread: GPM SM activity and the compute-process list, once per interval.

    Why: GPM needs two samples some time apart (the previous one is kept and diffed against
    the next), and the process list is the slow part of an NVML snapshot; neither may run on
    the scrape path. ``sample_once()`` is public so tests drive it without a thread.
    """

    def __init__(
        self,
        session: NvmlSession,
        interval_s: float = 1.0,
        *,
        gpm: bool = True,
        processes: bool = True,
    ) -> None:
        """Share the session's NVML module and device cache; call ``start()`` to run."""
        self._session = session
        self._interval_s = interval_s
        self._gpm = gpm
        self._processes = processes
        self._previous: dict[int, Any] = {}
        self._gpm_supported: dict[int, bool] = {}
        self._generation = -1
        self._names: dict[int, str] = {}
        self._latest = SlowReadings()
        self._lock = threading.Lock()
        self._sample_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def latest(self) -> SlowReadings:
        """The readings of the last completed interval."""
        with self._lock:
            return self._latest

    def _free(self, sample: Any) -> None:
        nvml: Any = self._session.nvml
        with contextlib.suppress(Exception):
            nvml.nvmlGpmSampleFree(sample)

    def _drop_previous(self) -> None:
        for sample in self._previous.values():
            self._free(sample)
        self._previous.clear()

    def _process_name(self, pid: int) -> str:
        """NVML's name for ``pid``, cached for the pid's lifetime (one label value per pid)."""
        name = self._names.get(pid)
        if name is None:
            name = process_name(self._session.nvml, pid)
            self._names[pid] = name
        return name

    def _gpm_once(self, nvml: Any, index: int, device: Device) -> float | None:
        """Take one GPM sample and diff it against the kept one (freed afterwards)."""
        supported = self._gpm_supported.get(index)
        if supported is None:
            supported = gpm_supported(nvml, device)
            self._gpm_supported[index] = supported
        if not supported:
            return None
        current = nvml.nvmlGpmSampleAlloc()
        try:
            nvml.nvmlGpmSampleGet(device.handle, current)
        except BaseException:
            self._free(current)
            raise
        previous = self._previous.pop(index, None)
        self._previous[index] = current
        if previous is None:
            return None
        try:
            return gpm_sm_active(nvml, previous, current)
        finally:
            self._free(previous)

    def _processes_once(self, nvml: Any, device: Device, seen: set[int]) -> list[ProcessSample]:
        listed = nvml_call(nvml, "nvmlDeviceGetComputeRunningProcesses", device.handle)
        rows: list[ProcessSample] = []
        for proc in listed or []:
            pid = int(proc.pid)
            seen.add(pid)
            if proc.usedGpuMemory is not None:  # None: not available (e.g. MIG, no permission)
                rows.append(ProcessSample(pid, self._process_name(pid), int(proc.usedGpuMemory)))
        return rows

    def _sm_active_once(self, nvml: Any, index: int, device: Device) -> float | None:
        """GPM SM activity of one GPU; a per-call error (e.g. NoPermission) gives ``None``."""
        try:
            return self._gpm_once(nvml, index, device)
        except nvml.NVMLError as exc:
            if error_kind(exc) != "call":
                raise
            return None

    def sample_once(self) -> None:
        """One interval: GPM diff and process list per GPU. Never raises NVML errors."""
        session = self._session
        nvml = session.nvml
        if nvml is None or not session.ok:
            return
        with self._sample_lock:
            if self._generation != session.generation:
                self._drop_previous()  # samples of an old NVML session are not diffable
                self._gpm_supported.clear()
                self._generation = session.generation
            sm: dict[int, float] = {}
            procs: dict[int, list[ProcessSample]] = {}
            seen: set[int] = set()
            try:
                count = int(nvml.nvmlDeviceGetCount())
            except nvml.NVMLError:
                return  # the scrape path notices and re-initialises
            for index in range(count):
                try:
                    device = session.devices.get(nvml, index)
                    value = self._sm_active_once(nvml, index, device) if self._gpm else None
                    if value is not None:
                        sm[index] = value
                    if self._processes:
                        procs[index] = self._processes_once(nvml, device, seen)
                except nvml.NVMLError as exc:
                    if error_kind(exc) == "fatal":
                        return  # the scrape path notices and re-initialises
                    session.devices.forget(index)
                    kept = self._previous.pop(index, None)
                    if kept is not None:
                        self._free(kept)
            self._names = {pid: n for pid, n in self._names.items() if pid in seen}
            with self._lock:
                self._latest = SlowReadings(sm_active=sm, processes=procs)

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self.sample_once()
            except Exception:
                _log.debug("GPU background sampling failed", exc_info=True)

    def start(self) -> None:
        """Take the first sample now, then start the daemon thread."""
        try:
            self.sample_once()
        except Exception:
            _log.debug("GPU background sampling failed", exc_info=True)
        self._thread = threading.Thread(target=self._run, name="stagelens-gpu", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread, wait for it, and free the GPM samples kept for the next diff."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self._sample_lock:
            self._drop_previous()

    @property
    def kept_samples(self) -> int:
        """GPM samples held for the next diff (one per GPM GPU while running, 0 after stop)."""
        return len(self._previous)


class GpuReader:
    """NVML session, device cache and background sampler behind one ``read()`` that never raises.

    Shared by the Prometheus collector and the OpenTelemetry gauges, so a process that
    exports both reads NVML once per scrape and runs one sampler thread.
    """

    def __init__(
        self,
        nvml: Any | None = None,
        *,
        interval_s: float = 1.0,
        gpm: bool = True,
        processes: bool = True,
        backoff_s: float = 1.0,
        backoff_max_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        on_error: Callable[[BaseException], None] | None = None,
    ) -> None:
        """Use ``nvml`` or import it (``load_nvml()``; absent = up 0), then try ``nvmlInit``.

        ``on_error`` receives unexpected (non-NVML) failures, e.g. to count them in
        ``stagelens_telemetry_errors_total``; without it they are logged at debug level.
        """
        module = nvml if nvml is not None else load_nvml()
        self._session = NvmlSession(
            module, backoff_s=backoff_s, backoff_max_s=backoff_max_s, clock=clock
        )
        self._on_error = on_error
        self._want_sampler = gpm or processes
        self._gpm = gpm
        self._processes = processes
        self._interval_s = interval_s
        self._sampler: BackgroundSampler | None = None
        self._sampler_lock = threading.Lock()
        self._cache: tuple[float, GpuSnapshot] | None = None
        self._clock = clock
        self._closed = False
        self._ensure()

    @property
    def sampler(self) -> BackgroundSampler | None:
        """The background sampler, started on the first successful ``nvmlInit``."""
        return self._sampler

    @property
    def devices(self) -> DeviceCache:
        """The per-session identity cache (UUID, name per handle)."""
        return self._session.devices

    def _ensure(self) -> bool:
        ok = self._session.ensure()
        if ok and self._want_sampler and self._sampler is None and not self._closed:
            with self._sampler_lock:
                if self._sampler is None:
                    self._sampler = BackgroundSampler(
                        self._session, self._interval_s, gpm=self._gpm, processes=self._processes
                    )
                    self._sampler.start()
        return ok

    def report(self, exc: BaseException) -> None:
        """Hand an unexpected failure to ``on_error``, else log it at debug level."""
        if self._on_error is not None:
            self._on_error(exc)
        else:
            _log.debug("GPU read failed", exc_info=exc)

    def read(self) -> GpuSnapshot:
        """Read every GPU now; ``up`` False (and no samples) when NVML is unusable."""
        try:
            if not self._ensure():
                return GpuSnapshot(False, [])
            slow = self._sampler.latest() if self._sampler is not None else SlowReadings()
            samples = read_gpu_samples(self._session.nvml, self._session.devices, slow)
        except NvmlFatalError as exc:
            self._session.fail(exc.__cause__ or exc)
            return GpuSnapshot(False, [])
        except Exception as exc:  # a bug or an unexpected binding: never break the scrape
            self.report(exc)
            return GpuSnapshot(False, [])
        return GpuSnapshot(True, samples)

    def read_cached(self, max_age_s: float = 0.5) -> GpuSnapshot:
        """``read()``, reused for ``max_age_s`` (OTel calls one callback per instrument)."""
        now = self._clock()
        cached = self._cache
        if cached is not None and now - cached[0] <= max_age_s:
            return cached[1]
        snapshot = self.read()
        self._cache = (now, snapshot)
        return snapshot

    def close(self) -> None:
        """Stop the background sampler (frees its GPM samples) and give our NVML init back."""
        self._closed = True
        if self._sampler is not None:
            self._sampler.stop()
        self._session.close()
