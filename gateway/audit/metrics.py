"""The audit sink's counters (``AuditSink.stats()``) as Prometheus families, read at scrape time.

A sink without ``stats()`` adds no family.
"""

from __future__ import annotations

from typing import Any, Final

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

#: stats() key -> (family name without _total, help text); all counters except ``bytes``
_FAMILIES: Final = {
    "rows_written": ("gateway_audit_rows_written", "Audit rows this process appended."),
    "rotations": ("gateway_audit_rotations", "Audit log files rotated."),
    "files_dropped": ("gateway_audit_files_dropped",
                      "Rotated audit files removed by retention (each logged before it went)."),
    "rows_dropped": ("gateway_audit_rows_dropped", "Audit rows in the files retention removed."),
    "files_kept_over_budget": ("gateway_audit_files_kept_over_budget",
                               "Rotated audit files kept beyond the budget: their rows are too young."),
    "checkpoints": ("gateway_audit_checkpoints", "Signed audit checkpoints written."),
    "checkpoint_failures": ("gateway_audit_checkpoint_failures",
                            "Audit checkpoints that could not be written."),
    "lock_timeouts": ("gateway_audit_lock_timeouts",
                      "Audit appends refused because the log's lock was held past the deadline."),
}


def audit_families(sink: Any) -> list[Metric]:
    """The families for ``sink.stats()``; none when the sink has no such method."""
    stats = getattr(sink, "stats", None)
    if not callable(stats):
        return []
    counters = stats()
    families: list[Metric] = []
    for key, (name, help_text) in _FAMILIES.items():
        family = CounterMetricFamily(name, help_text)
        family.add_metric([], float(counters.get(key, 0)))
        families.append(family)
    if "bytes" in counters:  # files have a size; the PostgreSQL table reports none
        size = GaugeMetricFamily("gateway_audit_bytes",
                                 "Size of the audit log and its rotated files (bytes).")
        size.add_metric([], float(counters["bytes"]))
        families.append(size)
    return families
