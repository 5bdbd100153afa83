"""gateway.vsphere.perf: counter names, series decoded from QueryPerf results, and their summaries."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest
from pyVmomi import vim

from gateway.vsphere.perf import METRICS, REALTIME_INTERVAL, Metric, _series, counter_name, summarize

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
CPU = Metric("cpu.usage.average", "percent", 0.01)
MHZ = Metric("cpu.usagemhz.average", "MHz")


def at(seconds: int) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_counter_name_is_group_name_rollup() -> None:
    info = vim.PerformanceManager.CounterInfo(
        key=2, groupInfo=vim.ElementDescription(key="cpu", label="", summary=""),
        nameInfo=vim.ElementDescription(key="usage", label="", summary=""), rollupType="average",
        unitInfo=vim.ElementDescription(key="percent", label="", summary=""), statsType="rate")
    assert counter_name(info) == "cpu.usage.average"


def test_summary_of_a_series_in_any_order() -> None:
    out = summarize(CPU, [(at(40), 3000.0), (at(0), 1000.0), (at(20), 2000.0)])
    assert out == {"name": "cpu.usage.average", "unit": "percent", "samples": 3, "latest": 30.0,
                   "average": 20.0, "max": 30.0, "latest_at": "2026-01-01T12:00:40+00:00"}


def test_missing_samples_are_skipped() -> None:
    out = summarize(MHZ, [(at(0), 100.0), (at(20), -1.0), (at(40), 50.0)])
    assert (out["samples"], out["latest"], out["average"], out["max"]) == (2, 50.0, 75.0, 100.0)


@pytest.mark.parametrize("samples", [[], [(at(0), -1.0)]])
def test_no_samples(samples: list[tuple[datetime, float]]) -> None:
    assert summarize(MHZ, samples) == {"name": "cpu.usagemhz.average", "unit": "MHz", "samples": 0,
                                       "latest": None, "average": None, "max": None}


def test_values_are_rounded_to_two_places() -> None:
    out = summarize(Metric("x", "u", 1 / 3), [(at(0), 1.0), (at(20), 2.0)])
    assert (out["latest"], out["average"], out["max"]) == (0.67, 0.5, 0.67)


def test_the_wanted_metrics() -> None:
    assert REALTIME_INTERVAL == 20
    names = [m.counter for m in METRICS]
    assert len(names) == len(set(names)) == 12
    assert {m.counter.split(".")[0] for m in METRICS} == {"cpu", "mem", "disk", "net"}
    assert {m.counter: m.scale for m in METRICS if m.scale != 1.0} == {"cpu.usage.average": 0.01,
                                                                       "mem.usage.average": 0.01}


def series(counter: int, instance: str, values: list[int]) -> SimpleNamespace:
    return SimpleNamespace(id=SimpleNamespace(counterId=counter, instance=instance), value=values)


def test_series_keep_the_aggregate_instance_of_wanted_counters() -> None:
    result = SimpleNamespace(sampleInfo=[SimpleNamespace(timestamp=at(0)), SimpleNamespace(timestamp=at(20))],
                             value=[series(6, "", [10, 20]), series(6, "0", [1, 2]), series(99, "", [5, 5]),
                                    series(2, "", [300])])
    out = _series([result], {6: MHZ, 2: CPU})
    assert out == {"cpu.usagemhz.average": [(at(0), 10.0), (at(20), 20.0)],
                   "cpu.usage.average": [(at(0), 300.0)]}


def test_no_results_no_series() -> None:
    assert _series([], {6: MHZ}) == {}
    assert _series([SimpleNamespace(sampleInfo=None, value=None)], {6: MHZ}) == {}
