"""The serving process's cyclic garbage collector: what it walks, how often, and its pauses in /metrics.

A served gateway holds about 120,000 objects the collector tracks before its first call (modules,
pyVmomi's type tables, the stores), and they live as long as the process. Python's full collection
walks every one of them, and a large read makes the collector run often: decoding 3,000 VMs
allocates tens of thousands of containers. Timed with ``gc.callbacks`` in ``gateway serve``
answering list_vms on 3,000 VMs (mirror off), full collections of 17-83 ms fell inside calls, seven
in thirteen calls; on 30,000 VMs, collections took about 100 ms of each call. Since: a few ms.

``settle`` runs once, just before the process serves:

- everything alive then is moved out of the collector's generations (``gc.freeze``): reference
  counting still frees it, the collector no longer walks it (CPython's own advice for long-running
  servers); a collection first, so no garbage is frozen with it;
- the youngest generation is collected after ``YOUNG_THRESHOLD`` allocations instead of 700, so a
  large answer's transient containers cost a few collections, not hundreds whose survivors promote
  a full collection. Garbage in reference cycles waits at most that many allocations longer;
- every collection's pause is timed and exposed: ``gateway_gc_pause_seconds{generation}`` (a
  histogram), ``gateway_gc_frozen_objects`` and ``gateway_gc_threshold`` (gauges), beside the library's
  ``python_gc_collections_total``. A latency spike that is the collector shows here.

Tests never call ``settle``: freezing a test process's heap would keep every test's garbage cycles.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterable
from typing import Any, Final

from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric

from gateway.server.metrics import Metrics

YOUNG_THRESHOLD: Final = 50_000
"""Allocations (less deallocations) of tracked objects between two collections of the youngest generation."""
OLDER_THRESHOLDS: Final = (20, 10)
"""Collections of one generation before the next older one is collected (CPython's second and third)."""
PAUSE_BUCKETS: Final = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
GENERATIONS: Final = 3


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


def settle(metrics: Metrics | None = None) -> GcPauses:
    """Collect, freeze what is alive, raise the young generation's threshold and time every pause
    from now on (exposed through ``metrics`` when given). Once per process, just before serving."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, *OLDER_THRESHOLDS)
    pauses = GcPauses()
    gc.callbacks.append(pauses.callback)
    if metrics is not None:
        metrics.add_collector("gc", pauses.families)
    return pauses
