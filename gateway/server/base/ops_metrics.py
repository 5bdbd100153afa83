"""The families the dashboard and the alert rules read besides the call path's.

Read off the audit trail's rows (``CallerCounts``: rows by caller, role and phase, refusals by code,
call time per target), timed around the sink (``AppendTimer``), or read at scrape time (rows waiting,
writable, the signing key's file, the served certificate). Labels are bounded (docs/operations.md,
"Dashboard and alerts"): a caller is a token's name, which an operator gives it (``gateway token
create``), for the first ``MAX_CALLERS`` names seen, then ``other``; a caller from an identity provider
is ``idp`` and the gateway's own moves ``gateway``; roles, phases and error codes are configured or
fixed names."""

from __future__ import annotations

import bisect
import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Final

from cryptography import x509
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from gateway import errors
from gateway.proposals import STATES
from gateway.server.base.audit_trail import MAX_WAITING_OUTCOMES, AuditTrail
from gateway.server.base.metrics import LATENCY_BUCKETS, Collect, Metrics
from gateway.store.base import AuditWriter

#: distinct token names (and roles) that get a label of their own; later ones count as ``OTHER``
MAX_CALLERS: Final = 64
MAX_ROLES: Final = 32
OTHER: Final = "other"
#: the caller label of identity-provider callers (their names come from the provider) and the gateway's
IDP: Final = "idp"
GATEWAY: Final = "gateway"
#: the phases of rows about a tool call or a proposal's move (docs/audit.md); a row of another phase
#: naming a tool counts as ``other``, a row naming none (a configuration load, a rotation) not at all
PHASES: Final = STATES | {"call", "proposed", "dry_run", "invalid", "refused", "busy", "retry", "elicited"}
#: the phases of a call that reached its handler, whose row's ``duration_ms`` is the call's time
TIMED_PHASES: Final = frozenset({"call", "dry_run", "executed", "failed", "outcome_unknown"})
#: upper bounds (seconds) of the audit append histogram
APPEND_BUCKETS: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def error_codes() -> frozenset[str]:
    """Every wire code of ``gateway.errors`` (the refusal label's values, besides ``other``)."""
    found: set[str] = set()
    pending: list[type[errors.GatewayError]] = [errors.GatewayError]
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        code = getattr(cls, "code", None)
        if isinstance(code, str):
            found.add(code)
    return frozenset(found)


class BoundedNames:
    """Label values from a set that may grow: the first ``limit`` names keep theirs, the rest ``other``."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._names: set[str] = set()

    def label(self, name: str) -> str:  # under the caller's lock
        if name in self._names:
            return name
        if len(self._names) < self.limit:
            self._names.add(name)
            return name
        return OTHER

    def __contains__(self, name: object) -> bool:
        return name in self._names


class _Histogram:
    """Cumulative-at-scrape bucket counts per label tuple (under the owner's lock)."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts: dict[tuple[str, ...], list[int]] = {}
        self.sums: dict[tuple[str, ...], float] = {}

    def observe(self, labels: tuple[str, ...], seconds: float) -> None:
        counts = self.counts.setdefault(labels, [0] * (len(self.bounds) + 1))
        counts[bisect.bisect_left(self.bounds, seconds)] += 1
        self.sums[labels] = self.sums.get(labels, 0.0) + seconds

    def family(self, name: str, help_text: str, label_names: list[str]) -> HistogramMetricFamily:
        family = HistogramMetricFamily(name, help_text, labels=label_names)
        edges = [*(repr(float(b)) for b in self.bounds), "+Inf"]  # as the library writes them: 1.0
        for labels, counts in sorted(self.counts.items()):
            running, buckets = 0, []
            for edge, count in zip(edges, counts, strict=True):
                running += count
                buckets.append((edge, float(running)))
            family.add_metric(list(labels), buckets, self.sums[labels])
        return family


class CallerCounts:
    """Counts each audit row as the trail writes it (an ``AuditTrail.written`` listener, so every entry
    point's rows): rows by caller, role and phase, refusals by code, and call time per target."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics
        self._lock = threading.Lock()
        self._callers = BoundedNames(MAX_CALLERS)
        self._roles = BoundedNames(MAX_ROLES)
        self._codes = error_codes()
        self._rows: dict[tuple[str, str, str], float] = {}
        self._refusals: dict[tuple[str, str, str], float] = {}
        self._durations = _Histogram(LATENCY_BUCKETS)

    def observe(self, row: Mapping[str, Any]) -> None:
        """Count one written row (in the writing thread; no I/O)."""
        phase = row.get("phase")
        if not isinstance(phase, str) or not (row.get("tool") or phase == "busy"):
            return
        count = row.get("count", 1) if phase == "busy" else 1
        weight = float(count) if isinstance(count, int) and count > 0 else 1.0
        code = row.get("error_code")
        seconds = _seconds(row.get("duration_ms")) if phase in TIMED_PHASES else None
        target = self._metrics.target_label(str(row.get("target") or "-")) if seconds is not None else ""
        with self._lock:
            who = (self._caller(row), self._roles.label(str(row.get("role") or "-")))
            key = (*who, phase if phase in PHASES else OTHER)
            self._rows[key] = self._rows.get(key, 0.0) + weight
            if isinstance(code, str) and code:
                refusal = (*who, code if code in self._codes else OTHER)
                self._refusals[refusal] = self._refusals.get(refusal, 0.0) + weight
            if seconds is not None:
                self._durations.observe((target,), seconds)

    def _caller(self, row: Mapping[str, Any]) -> str:  # under the lock
        key, name = row.get("caller_key"), row.get("caller")
        space = key.split(":", 1)[0] if isinstance(key, str) else None
        if space == "token" and isinstance(name, str):
            return self._callers.label(name)
        if space in ("person", "client"):
            return IDP
        if space == "system":
            return GATEWAY
        # a busy row names no key: a token name already labelled keeps its label
        return name if isinstance(name, str) and name in self._callers else OTHER

    def families(self) -> list[Metric]:
        rows = CounterMetricFamily(
            "gateway_caller_audit_rows",
            "Audit rows of tool calls and proposal moves by caller, role and phase (a busy row counts each "
            "refusal it stands for). caller: a token's name, idp, gateway or other.",
            labels=["caller", "role", "phase"])
        refusals = CounterMetricFamily(
            "gateway_caller_refusals", "Audit rows with an error code by caller, role and code.",
            labels=["caller", "role", "code"])
        with self._lock:
            for key, value in sorted(self._rows.items()):
                rows.add_metric(list(key), value)
            for key, value in sorted(self._refusals.items()):
                refusals.add_metric(list(key), value)
            durations = self._durations.family(
                "gateway_target_call_duration_seconds",
                "Tool call time per target as its audit row records it (queue wait and vSphere round "
                "trips included): reads, dry runs and changes that ran.", ["target"])
        return [rows, refusals, durations]


def _seconds(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
        return float(value) / 1000.0
    return None


class AppendTimer:
    """An audit sink (``AuditWriter``) timing each append of the sink it wraps, appended or refused."""

    def __init__(self, sink: AuditWriter, clock: Callable[[], float] = time.perf_counter) -> None:
        self.sink, self._clock = sink, clock
        self._lock = threading.Lock()
        self._times = _Histogram(APPEND_BUCKETS)

    def write(self, event: Mapping[str, Any], *, timeout: float | None = None) -> dict[str, Any]:
        return self._timed(self.sink.write, event, timeout)

    def _timed(self, append: Callable[..., dict[str, Any]], event: Mapping[str, Any],
               timeout: float | None) -> dict[str, Any]:
        started = self._clock()
        outcome = "failed"
        try:
            stored = append(event, timeout=timeout)
            outcome = "ok"
            return stored
        finally:
            elapsed = max(self._clock() - started, 0.0)
            with self._lock:
                self._times.observe((outcome,), elapsed)

    def writable(self) -> bool:
        return self.sink.writable()

    def close(self) -> None:
        self.sink.close()

    def families(self) -> list[Metric]:
        with self._lock:
            return [self._times.family(
                "gateway_audit_append_duration_seconds",
                "Time one audit append took, by outcome (ok, or failed: the row was refused).", ["outcome"])]


class GroupedAppendTimer(AppendTimer):
    """``AppendTimer`` of a sink that also appends rows flushed in a group (``write_grouped``)."""

    def __init__(self, sink: AuditWriter, grouped: Callable[..., dict[str, Any]],
                 clock: Callable[[], float] = time.perf_counter) -> None:
        super().__init__(sink, clock)
        self._grouped = grouped

    def write_grouped(self, event: Mapping[str, Any], *, timeout: float | None = None) -> dict[str, Any]:
        return self._timed(self._grouped, event, timeout)


def timed_sink(sink: AuditWriter) -> AppendTimer:
    """``sink`` with its appends timed, offering the grouped append exactly when ``sink`` does."""
    grouped = getattr(sink, "write_grouped", None)
    return GroupedAppendTimer(sink, grouped) if callable(grouped) else AppendTimer(sink)


def trail_families(trail: AuditTrail) -> list[Metric]:
    """Rows waiting for the audit log, their limit, and whether the sink takes rows now (blocking: the
    sink's own probe, as /readyz runs it)."""
    waiting = GaugeMetricFamily("gateway_audit_rows_waiting",
                                "Audit rows of finished changes waiting in memory for the audit log.")
    waiting.add_metric([], float(len(trail.waiting)))
    limit = GaugeMetricFamily("gateway_audit_rows_waiting_limit",
                              "Rows that may wait before every new change is refused.")
    limit.add_metric([], float(MAX_WAITING_OUTCOMES))
    writable = GaugeMetricFamily("gateway_audit_writable", "1 while the audit log takes rows, else 0.")
    writable.add_metric([], float(trail.writable()))
    return [waiting, limit, writable]


def signing_key_families(key_file: Path | None) -> list[Metric]:
    """When the audit signing key's file was last written (none before the first checkpoint makes it,
    nor for a sink that signs nothing). The key never expires; its age is for a rotation policy."""
    family = GaugeMetricFamily("gateway_audit_signing_key_written_timestamp_seconds",
                               "When the audit signing key's file was last written (its mtime).")
    if key_file is not None:
        with contextlib.suppress(OSError):  # not made yet, or gone: no sample
            family.add_metric([], key_file.stat().st_mtime)
    return [family]


def certificate_collector(cert: Path) -> Collect:
    """The families of the certificate at ``cert`` as read now (what the server loaded at start; a file
    replaced later is served after a restart): its notAfter and notBefore."""
    leaf = x509.load_pem_x509_certificate(cert.read_bytes())
    after = leaf.not_valid_after_utc.timestamp()
    before = leaf.not_valid_before_utc.timestamp()

    def collect() -> Iterable[Metric]:
        expiry = GaugeMetricFamily("gateway_tls_certificate_expiry_timestamp_seconds",
                                   "When the certificate this server presents stops being valid.")
        expiry.add_metric([], after)
        start = GaugeMetricFamily("gateway_tls_certificate_not_before_timestamp_seconds",
                                  "When the certificate this server presents became valid.")
        start.add_metric([], before)
        return [expiry, start]

    return collect


def gateway_metrics(*, targets: Iterable[str], tools: Iterable[str], trail: AuditTrail,
                    key_file: Path | None) -> Metrics:
    """A process's ``Metrics`` with this module's families: ``trail``'s rows counted as written, its
    backlog, and the signing key's date (the append times come with ``AppendTimer``, the certificate
    with ``certificate_collector``, where the sink and the certificate are known)."""
    metrics = Metrics(targets=targets, tools=tools)
    counts = CallerCounts(metrics)
    trail.written.append(counts.observe)
    metrics.add_collector("callers", counts.families)
    metrics.add_collector("audit_trail", lambda: trail_families(trail))
    metrics.add_collector("signing_key", lambda: signing_key_families(key_file))
    return metrics
