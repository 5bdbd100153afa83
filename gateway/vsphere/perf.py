"""Realtime performance of one VM through the PerformanceManager.

Counters the target does not collect are listed as ``unavailable`` instead of failing the call.
``perfCounter`` is read through the PropertyCollector because ``QueryPerfCounter`` crashes the simulator.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pyVmomi import vim

from gateway.vsphere.collector import Session, iso, object_spec, retrieve_objects
from gateway.vsphere.resolve import resolve_vm

REALTIME_INTERVAL = 20
"""Seconds between realtime samples (vCenter and ESXi)."""

_PerfQuerySpec: Any = vim.PerformanceManager.QuerySpec
_PerfMetricId: Any = vim.PerformanceManager.MetricId


@dataclass(frozen=True)
class Metric:
    """A wanted counter (``group.name.rollup``), the unit we report and the factor from raw values."""

    counter: str
    unit: str
    scale: float = 1.0


METRICS: tuple[Metric, ...] = (
    Metric("cpu.usage.average", "percent", 0.01),
    Metric("cpu.usagemhz.average", "MHz"),
    Metric("cpu.ready.summation", "ms"),
    Metric("mem.usage.average", "percent", 0.01),
    Metric("mem.active.average", "KB"),
    Metric("mem.consumed.average", "KB"),
    Metric("disk.usage.average", "KBps"),
    Metric("disk.read.average", "KBps"),
    Metric("disk.write.average", "KBps"),
    Metric("net.usage.average", "KBps"),
    Metric("net.received.average", "KBps"),
    Metric("net.transmitted.average", "KBps"),
)


def counter_name(info: Any) -> str:
    """``group.name.rollup`` of a ``PerfCounterInfo``."""
    return f"{info.groupInfo.key}.{info.nameInfo.key}.{info.rollupType}"


def summarize(metric: Metric, samples: Sequence[tuple[datetime, float]]) -> dict[str, Any]:
    """Latest, average and maximum of a series (samples in any order; -1 marks a missing sample)."""
    values = [(when, value * metric.scale) for when, value in sorted(samples) if value >= 0]
    if not values:
        return {"name": metric.counter, "unit": metric.unit, "samples": 0, "latest": None, "average": None,
                "max": None}
    numbers = [v for _w, v in values]
    return {
        "name": metric.counter, "unit": metric.unit, "samples": len(values), "latest": round(numbers[-1], 2),
        "average": round(sum(numbers) / len(numbers), 2), "max": round(max(numbers), 2),
        "latest_at": iso(values[-1][0]),
    }


def _counter_ids(session: Session, manager: Any, vm: Any) -> dict[str, int]:
    """Wanted counter names -> ids among the counters the VM has at the realtime interval."""
    metrics = manager.QueryAvailablePerfMetric(entity=vm, intervalId=REALTIME_INTERVAL) or []
    available = {m.counterId for m in metrics}
    if not available:
        return {}
    objects = retrieve_objects(session, object_spec(
        manager, {vim.PerformanceManager: ("perfCounter",)}))
    infos = objects[0].props.get("perfCounter", []) if objects else []
    wanted = {m.counter for m in METRICS}
    return {counter_name(i): i.key for i in infos if i.key in available and counter_name(i) in wanted}


def get_vm_performance(session: Session, ref: str, samples: int = 15) -> dict[str, Any]:
    """The VM's latest ``samples`` realtime samples (20 s apart) of CPU, memory, disk and network."""
    vm_ref = resolve_vm(session, ref)
    vm = vm_ref.managed_object(session)
    manager = session.content.perfManager
    out: dict[str, Any] = {"vm": vm_ref.name, "vm_moid": vm_ref.moid, "interval_seconds": REALTIME_INTERVAL,
                           "power_state": vm_ref.power_state}
    ids = _counter_ids(session, manager, vm)
    out["unavailable"] = [m.counter for m in METRICS if m.counter not in ids]
    if not ids:
        out.update(metrics=[], note="the target reports no realtime statistics for this VM (it may be "
                                    "powered off, or statistics collection is disabled)")
        return out
    wanted = [m for m in METRICS if m.counter in ids]
    spec = _PerfQuerySpec(entity=vm, intervalId=REALTIME_INTERVAL, maxSample=samples,
                          metricId=[_PerfMetricId(counterId=ids[m.counter], instance="") for m in wanted])
    results = manager.QueryPerf(querySpec=[spec]) or []
    series = _series(results, {ids[m.counter]: m for m in wanted})
    out["metrics"] = [summarize(m, series.get(m.counter, [])) for m in wanted]
    return out


def _series(results: Sequence[Any], by_id: dict[int, Metric]) -> dict[str, list[tuple[datetime, float]]]:
    out: dict[str, list[tuple[datetime, float]]] = {}
    for entity in results:
        times = [s.timestamp for s in entity.sampleInfo or []]
        for series in entity.value or []:
            metric = by_id.get(series.id.counterId)
            if metric is None or series.id.instance:
                continue
            out[metric.counter] = list(zip(times, [float(v) for v in series.value or []], strict=False))
    return out
