"""The audit sink's counters as Prometheus families (``gateway.audit.metrics.audit_families``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from gateway.audit.file_sink import AuditSink
from gateway.audit.metrics import audit_families

COUNTERS = ["rows_written", "rotations", "files_dropped", "rows_dropped", "files_kept_over_budget",
            "checkpoints", "checkpoint_failures", "lock_timeouts"]


class _Stats:
    def __init__(self, counters: dict[str, int]) -> None:
        self.counters = counters

    def stats(self) -> dict[str, int]:
        return self.counters


def _values(families: list[Any]) -> dict[str, float]:
    return {f.name: f.samples[0].value for f in families}


def test_a_sink_without_stats_adds_no_family() -> None:
    assert audit_families(object()) == []


def test_a_sink_whose_stats_is_not_callable_adds_no_family() -> None:
    class Odd:
        stats = {"rows_written": 1}

    assert audit_families(Odd()) == []


def test_every_counter_is_a_family_named_after_it() -> None:
    families = audit_families(_Stats({name: i for i, name in enumerate(COUNTERS, start=1)}))
    assert all(isinstance(f, CounterMetricFamily) for f in families)
    expected = {f"gateway_audit_{name}": float(i) for i, name in enumerate(COUNTERS, start=1)}
    assert _values(families) == expected


def test_missing_counters_read_zero() -> None:
    assert set(_values(audit_families(_Stats({}))).values()) == {0.0}
    assert len(audit_families(_Stats({}))) == len(COUNTERS)


def test_bytes_is_a_gauge_when_the_sink_reports_it() -> None:
    families = audit_families(_Stats({"bytes": 4096}))
    gauge = families[-1]
    assert isinstance(gauge, GaugeMetricFamily)
    assert gauge.name == "gateway_audit_bytes"
    assert gauge.samples[0].value == 4096.0


def test_no_bytes_gauge_without_bytes() -> None:
    assert "gateway_audit_bytes" not in _values(audit_families(_Stats({"rows_written": 1})))


def test_counter_samples_carry_the_total_suffix() -> None:
    (first, *_) = audit_families(_Stats({"rows_written": 3}))
    assert first.samples[0].name == "gateway_audit_rows_written_total"


def test_the_file_sinks_own_stats_become_families(tmp_path: Path) -> None:
    with AuditSink(tmp_path / "audit.jsonl", durable=False) as sink:
        sink.write({"phase": "call"})
        sink.write({"phase": "call"})
        values = _values(audit_families(sink))
    assert values["gateway_audit_rows_written"] == 2.0
    assert values["gateway_audit_bytes"] > 0
