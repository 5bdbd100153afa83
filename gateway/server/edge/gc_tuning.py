"""The serving process's garbage collector and glibc heap: what is walked, how often, what is returned.

``settle`` runs once, just before the process serves: what is alive then is frozen out of the
collector's generations, every pause is timed into ``gateway_gc_pause_seconds``, glibc's mmap threshold
is fixed and the ``Trimmer`` starts (off without ``mallinfo2``, as on musl). Tests never call it: a
frozen test heap would keep every test's garbage cycles."""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, Final

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from gateway.server.base.metrics import Metrics

YOUNG_THRESHOLD: Final = 50_000
"""Allocations (less deallocations) of tracked objects between two collections of the youngest generation."""
OLDER_THRESHOLDS: Final = (20, 10)
"""Collections of one generation before the next older one is collected (CPython's second and third)."""
PAUSE_BUCKETS: Final = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
GENERATIONS: Final = 3
TRIM_FREE_BYTES: Final = 8 << 20
"""Free bytes in glibc's arenas, above their lowest since the last trim, that make the trimmer trim."""
TRIM_INTERVAL_SECONDS: Final = 2.0
"""How often the trimmer reads glibc's free bytes."""
MMAP_THRESHOLD_BYTES: Final = 128 << 10
"""Blocks at least this large get their own mapping (glibc's initial threshold, kept from rising)."""
_M_MMAP_THRESHOLD: Final = -3  # glibc's malloc.h

log = logging.getLogger(__name__)


class GcPauses:
    """Per generation, a histogram of collection pauses, fed by ``gc.callbacks``.

    The callback runs inside the collector, with the GIL held and no other Python code between its
    start and stop; it takes no lock (a lock held by the thread that triggered the collection would
    deadlock) and only adds to lists of numbers, which ``families`` copies before reading.
    """

    def __init__(self, clock: Any = time.perf_counter) -> None:
        self._clock = clock
        self._started: float | None = None
        self._buckets = [[0] * (len(PAUSE_BUCKETS) + 1) for _ in range(GENERATIONS)]
        self._sums = [0.0] * GENERATIONS

    def callback(self, phase: str, info: dict[str, int]) -> None:
        """``gc.callbacks`` entry: ``start`` notes the time, ``stop`` records the pause."""
        if phase == "start":
            self._started = self._clock()
            return
        if self._started is None:
            return
        self.record(info.get("generation", 0), self._clock() - self._started)
        self._started = None

    def record(self, generation: int, seconds: float) -> None:
        generation = min(max(generation, 0), GENERATIONS - 1)
        seconds = max(seconds, 0.0)
        slot = next((i for i, bound in enumerate(PAUSE_BUCKETS) if seconds <= bound), len(PAUSE_BUCKETS))
        self._buckets[generation][slot] += 1
        self._sums[generation] += seconds

    def families(self) -> Iterable[Metric]:
        pauses = HistogramMetricFamily("gateway_gc_pause_seconds",
                                       "Pauses of the cyclic garbage collector, by generation.",
                                       labels=("generation",))
        for generation in range(GENERATIONS):
            counts, total = list(self._buckets[generation]), self._sums[generation]
            cumulative, buckets = 0, []
            for bound, count in zip((*map(str, PAUSE_BUCKETS), "+Inf"), counts, strict=True):
                cumulative += count
                buckets.append((bound, cumulative))
            pauses.add_metric((str(generation),), buckets, total)
        frozen = GaugeMetricFamily("gateway_gc_frozen_objects",
                                   "Objects alive at start, left out of the collector's walks (gc.freeze).")
        frozen.add_metric((), gc.get_freeze_count())
        thresholds = GaugeMetricFamily("gateway_gc_threshold",
                                       "The collector's thresholds (gc.get_threshold), by generation.",
                                       labels=("generation",))
        for generation, threshold in enumerate(gc.get_threshold()):
            thresholds.add_metric((str(generation),), threshold)
        return [pauses, frozen, thresholds]


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
        "keepcost")]


def glibc() -> Any | None:
    """glibc's ``mallinfo2`` and ``malloc_trim`` (ctypes), or None on another C library."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        libc.malloc_trim.restype = ctypes.c_int
        libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        libc.mallopt.restype = ctypes.c_int
    except (OSError, AttributeError):
        return None
    return libc


class Trimmer:
    """Gives freed heap memory back to the kernel after a burst (see the module docstring).

    ``check`` is the decision, on plain numbers: ``free_bytes`` (glibc's ``fordblks``) read now; it
    trims when they exceed the lowest reading since the last trim by ``threshold``. A trim leaves the
    free bytes counted as free (only their pages go back), so the reading after a trim is the new floor.
    """

    def __init__(self, read_free: Callable[[], int], trim: Callable[[], object], *,
                 threshold: int = TRIM_FREE_BYTES, interval: float = TRIM_INTERVAL_SECONDS) -> None:
        self._read_free, self._trim = read_free, trim
        self.threshold, self.interval = threshold, interval
        self.floor: int | None = None
        self.trims = 0
        self.free_bytes = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def for_glibc(cls, **options: Any) -> Trimmer | None:
        libc = glibc()
        if libc is None:
            return None
        return cls(lambda: int(libc.mallinfo2().fordblks), lambda: libc.malloc_trim(0), **options)

    def check(self) -> bool:
        """Read the free bytes; trim when they rose ``threshold`` above the floor. Whether it trimmed."""
        free = self.free_bytes = self._read_free()
        if self.floor is None or free < self.floor:
            self.floor = free
        if free - self.floor < self.threshold:
            return False
        self._trim()
        self.trims += 1
        self.floor = self.free_bytes = self._read_free()
        return True

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.check()
            except Exception:  # a failed reading must never end the process
                log.exception("heap trimmer: reading or trimming the heap failed; it stops")
                return

    def start(self) -> Trimmer:
        self._thread = threading.Thread(target=self._run, name="heap-trimmer", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def families(self) -> Iterable[Metric]:
        trims = CounterMetricFamily("gateway_heap_trims", "Times freed heap memory was given back to the "
                                    "kernel after a burst (malloc_trim).")
        trims.add_metric((), self.trims)
        free = GaugeMetricFamily("gateway_heap_free_bytes",
                                 "Free bytes in the C library's heap arenas at the trimmer's last reading.")
        free.add_metric((), self.free_bytes)
        return [trims, free]


def fix_mmap_threshold(libc: Any, size: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Keep glibc's mmap threshold at ``size`` from now on; whether glibc accepted it."""
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, size))


def settle(metrics: Metrics | None = None) -> GcPauses:
    """Collect, freeze what is alive, raise the young generation's threshold, time every pause from
    now on and start the heap trimmer (both exposed through ``metrics`` when given). Once per process,
    just before serving."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, *OLDER_THRESHOLDS)
    pauses = GcPauses()
    gc.callbacks.append(pauses.callback)
    if metrics is not None:
        metrics.add_collector("gc", pauses.families)
    libc = glibc()
    if libc is not None:
        fix_mmap_threshold(libc)
    trimmer = Trimmer.for_glibc()
    if trimmer is not None:
        trimmer.start()
        if metrics is not None:
            metrics.add_collector("heap", trimmer.families)
    return pauses
