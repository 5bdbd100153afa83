"""Process metrics through ``prometheus-client``, one registry per ``Metrics``.

Label values never come from a caller: a tool is a registered name, a target a configured one
(``-``, ``all``, ``several``), anything else ``unknown``, so no request can add a series. A collector
added with ``add_collector`` that raises is logged and skipped."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, choose_encoder, generate_latest
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

from gateway.identity.service import IDP_REFUSALS
from gateway.vsphere.lane import ADMISSION_REFUSALS, WAIT_BUCKETS

log = logging.getLogger(__name__)

#: histogram bucket upper bounds in seconds: vSphere calls range from milliseconds to many minutes
LATENCY_BUCKETS: Final = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)

UNKNOWN: Final = "unknown"
OUTCOMES: Final = frozenset({"ok", "error", "denied"})
AUTH_REASONS: Final = frozenset({"missing", "malformed", "unknown_token", "invalid", "revoked", "expired",
                                 "throttled", "busy",
                                 "unavailable"}) | IDP_REFUSALS
REFUSAL_REASONS: Final = frozenset({"host", "origin", "headers_too_large", "body_too_large",
                                    "receive_timeout",
                                    "overloaded", "token_in_query", "draining", "header_timeout", "sessions"})
#: target labels that are no target name: none given, every target, a list of targets
TARGET_WORDS: Final = frozenset({"-", "all", "several"})

#: scheduler.stats() keys -> (family name without _total, kind, help text)
_TARGET_FAMILIES: Final = {
    "queued": ("gateway_target_queue_depth", "gauge", "Calls waiting for a slot on the target."),
    "running": ("gateway_target_running", "gauge", "Calls running on the target now."),
    "slots": ("gateway_target_slots", "gauge", "Calls the target may run at once."),
    "sessions": ("gateway_target_sessions", "gauge", "vSphere sessions open to the target."),
    "in_use": ("gateway_target_sessions_in_use", "gauge", "vSphere sessions lent to a call now."),
    "logins": ("gateway_target_logins", "counter", "Logins to the target."),
    "relogins": ("gateway_target_relogins", "counter", "Logins repeated after a session expired."),
    "circuit_open": ("gateway_target_circuit_open", "gauge",
                     "1 while the target's circuit breaker is open (calls fail fast), else 0."),
    "consecutive_failures": ("gateway_target_consecutive_failures", "gauge",
                             "Connection failures in a row on the target."),
}

CONTENT_TYPE: Final = CONTENT_TYPE_LATEST
#: (tool, target, outcome) triples whose metric children are kept (the labels are bounded anyway)
_MAX_CALL_CHILDREN: Final = 4096

Collect = Callable[[], Iterable[Metric]]


def gauge_family(name: str, help_text: str, label: str, values: Mapping[str, float]) -> GaugeMetricFamily:
    """A gauge with one label, one sample per ``values`` entry (for ``add_collector`` callbacks)."""
    family = GaugeMetricFamily(name, help_text, labels=[label])
    for key, value in sorted(values.items()):
        family.add_metric([key], float(value))
    return family


def sample_families(samples: Iterable[tuple[str, str, str, Mapping[str, str], float]]) -> list[Metric]:
    """Families from ``(name, "gauge" | "counter", help, labels, value)`` samples (``Mirrors.samples()``);
    samples of one family share their label names."""
    families: dict[str, CounterMetricFamily | GaugeMetricFamily] = {}
    for name, kind, help_text, labels, value in samples:
        family = families.get(name)
        if family is None:
            maker = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
            family = families[name] = maker(name, help_text, labels=sorted(labels))
        family.add_metric([labels[k] for k in sorted(labels)], float(value))
    return list(families.values())


def target_families(stats: Mapping[str, Mapping[str, float]]) -> list[Metric]:
    """The per-target families from ``scheduler.stats()`` (every family, even with no target)."""
    families: list[Metric] = []
    for key, (name, kind, help_text) in _TARGET_FAMILIES.items():
        family: Metric
        if kind == "counter":
            family = CounterMetricFamily(name, help_text, labels=["target"])
        else:
            family = GaugeMetricFamily(name, help_text, labels=["target"])
        for target, row in sorted(stats.items()):
            family.add_metric([target], float(row.get(key, 0)))
        families.append(family)
    return families


def queue_families(stats: Mapping[str, Mapping[str, Any]]) -> list[Metric]:
    """The queue wait histogram and the refused admissions per target, from ``scheduler.queue_stats()``
    (each row: ``wait_buckets`` cumulative per ``WAIT_BUCKETS`` bound then +Inf, ``wait_sum``,
    ``refused`` by reason, ``staggered`` starts)."""
    waits = HistogramMetricFamily("gateway_target_queue_wait_seconds",
                                  "Time calls waited for one of the target's slots.", labels=["target"])
    refused = CounterMetricFamily("gateway_target_admissions_refused",
                                  "Calls the target's lane refused, by reason.", labels=["target", "reason"])
    staggered = CounterMetricFamily("gateway_target_starts_staggered",
                                    "Calls the target's lane started a little later to break a lock step "
                                    "of its slots (vsphere/stagger).", labels=["target"])
    bounds = [*(f"{b:g}" for b in WAIT_BUCKETS), "+Inf"]
    for target, row in sorted(stats.items()):
        buckets = list(zip(bounds, (float(c) for c in row["wait_buckets"]), strict=True))
        waits.add_metric([target], buckets, float(row["wait_sum"]))
        for reason in ADMISSION_REFUSALS:
            refused.add_metric([target, reason], float(row["refused"].get(reason, 0)))
        staggered.add_metric([target], float(row.get("staggered", 0)))
    return [waits, refused, staggered]


class _Callbacks:
    """The one collector that runs every ``add_collector`` callback at scrape time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sources: dict[str, Collect] = {}

    def set(self, name: str, collect: Collect) -> None:
        with self._lock:
            self._sources[name] = collect

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            sources = list(self._sources.items())
        for name, collect in sources:
            try:
                families = list(collect())
            except Exception:
                log.exception("metrics collector %r failed; its families are left out of this scrape", name)
                continue
            yield from families


class Metrics:
    """The gateway's metrics in a registry of their own; thread-safe (the library's counters are)."""

    def __init__(self, *, targets: Iterable[str] = (), tools: Iterable[str] = ()) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._targets = frozenset(targets)
        self._tools = frozenset(tools)
        self._calls = Counter("gateway_tool_calls", "Tool calls by tool, target and outcome.",
                              ("tool", "target", "outcome"), registry=self.registry)
        self._latency = Histogram("gateway_tool_call_duration_seconds", "Tool call duration.", ("tool",),
                                  buckets=LATENCY_BUCKETS, registry=self.registry)
        self._auth_failures = Counter("gateway_auth_failures", "Refused authentications by reason.",
                                      ("reason",), registry=self.registry)
        self._refusals = Counter("gateway_http_refusals", "Requests refused at the edge by reason.",
                                 ("reason",), registry=self.registry)
        #: the call families' children by (tool, target, outcome) as given: one dict lookup per call
        #: instead of two ``labels`` resolutions (bounded; emptied when the known names change)
        self._call_children: dict[tuple[str, str, str], tuple[Any, Any]] = {}
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        self._callbacks = _Callbacks()
        self.registry.register(self._callbacks)

    # -- names allowed as label values

    def known(self, *, targets: Iterable[str] | None = None, tools: Iterable[str] | None = None) -> None:
        """Replace the configured target or tool names (e.g. after a reload)."""
        if targets is not None:
            self._targets = frozenset(targets)
        if tools is not None:
            self._tools = frozenset(tools)
        self._call_children = {}

    def target_label(self, target: str) -> str:
        if target in self._targets or target in TARGET_WORDS:
            return target
        parts = target.split(",")
        if len(parts) > 1 and all(p in self._targets for p in parts):
            return "several"
        return UNKNOWN

    def tool_label(self, tool: str) -> str:
        return tool if tool in self._tools else UNKNOWN

    # -- recording

    def observe_call(self, tool: str, target: str, outcome: str, seconds: float) -> None:
        """Count one finished tool call (``outcome``: ok, error, denied) and its duration."""
        key = (tool, target, outcome)
        children = self._call_children.get(key)
        if children is None:
            label = self.tool_label(tool)
            children = (self._calls.labels(label, self.target_label(target),
                                           outcome if outcome in OUTCOMES else UNKNOWN),
                        self._latency.labels(label))
            if len(self._call_children) < _MAX_CALL_CHILDREN:
                self._call_children[key] = children
        children[0].inc()
        children[1].observe(max(seconds, 0.0))

    def auth_failure(self, reason: str) -> None:
        """Count one refused authentication (``reason`` from ``AUTH_REASONS``)."""
        self._auth_failures.labels(reason if reason in AUTH_REASONS else UNKNOWN).inc()

    def refusal(self, reason: str) -> None:
        """Count one request the edge refused (``reason`` from ``REFUSAL_REASONS``)."""
        self._refusals.labels(reason if reason in REFUSAL_REASONS else UNKNOWN).inc()

    def add_collector(self, name: str, collect: Collect) -> None:
        """Run ``collect()`` at every scrape and expose what it returns; a second call with the same
        ``name`` replaces the first (so building an app twice never doubles a family)."""
        self._callbacks.set(name, collect)

    # -- exposition

    def exposition(self, accept: str | None = None) -> tuple[bytes, str]:
        """The scrape body and its content type, negotiated from the ``Accept`` header (Prometheus
        text by default, OpenMetrics when asked for)."""
        encoder, content_type = choose_encoder(accept or "")
        return encoder(self.registry), content_type

    def render(self) -> str:
        """The Prometheus text exposition (what a scrape without an ``Accept`` preference gets)."""
        return generate_latest(self.registry).decode("utf-8")
