"""Process metrics in the Prometheus text exposition format (no client library needed).

``Metrics`` is thread-safe: the pipeline records calls from the event loop and the edge records
refusals, while a scrape renders a consistent snapshot. Families::

    gateway_tool_calls_total{tool,target,outcome}          counter
    gateway_tool_call_duration_seconds{tool}               histogram
    gateway_auth_failures_total{reason}                    counter
    gateway_http_refusals_total{reason}                    counter (edge refusals: 413, 421, 503, ...)
    gateway_target_queue_depth{target}                     gauge    (this and below: read from the
    gateway_target_running{target}                         gauge     scheduler at scrape time)
    gateway_target_slots{target}                           gauge
    gateway_target_sessions{target}                        gauge
    gateway_target_sessions_in_use{target}                 gauge
    gateway_target_logins_total{target}                    counter
    gateway_target_relogins_total{target}                  counter

Label values come from tool and target names and fixed reason words; they are escaped, never trusted.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Mapping
from typing import Final

#: histogram bucket upper bounds in seconds: vSphere calls range from milliseconds to many minutes
LATENCY_BUCKETS: Final = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)

#: scheduler.stats() keys -> (metric name, type, help text)
_TARGET_FAMILIES: Final = {
    "queued": ("gateway_target_queue_depth", "gauge", "Calls waiting for a slot on the target."),
    "running": ("gateway_target_running", "gauge", "Calls running on the target now."),
    "slots": ("gateway_target_slots", "gauge", "Calls the target may run at once."),
    "sessions": ("gateway_target_sessions", "gauge", "vSphere sessions open to the target."),
    "in_use": ("gateway_target_sessions_in_use", "gauge", "vSphere sessions lent to a call now."),
    "logins": ("gateway_target_logins_total", "counter", "Logins to the target."),
    "relogins": ("gateway_target_relogins_total", "counter", "Logins repeated after a session expired."),
}

CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"

Labels = tuple[tuple[str, str], ...]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: Labels) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels) + "}"


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value)) if not float(value).is_integer() else str(int(value))


class _Histogram:
    __slots__ = ("count", "counts", "total")

    def __init__(self) -> None:
        self.counts = [0] * len(LATENCY_BUCKETS)
        self.count = 0
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        self.count += 1
        self.total += seconds
        for i, bound in enumerate(LATENCY_BUCKETS):
            if seconds <= bound:
                self.counts[i] += 1

    def lines(self, name: str, labels: Labels) -> Iterable[str]:
        for bound, count in zip(LATENCY_BUCKETS, self.counts, strict=True):
            yield f"{name}_bucket{_labels((*labels, ('le', _number(bound))))} {count}"
        yield f"{name}_bucket{_labels((*labels, ('le', '+Inf')))} {self.count}"
        yield f"{name}_sum{_labels(labels)} {_number(self.total)}"
        yield f"{name}_count{_labels(labels)} {self.count}"


class Metrics:
    """Counters and a latency histogram for one process; ``render`` produces the scrape body."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: dict[Labels, int] = {}
        self._latency: dict[Labels, _Histogram] = {}
        self._auth_failures: dict[Labels, int] = {}
        self._refusals: dict[Labels, int] = {}

    def observe_call(self, tool: str, target: str, outcome: str, seconds: float) -> None:
        """Count one finished tool call (``outcome``: ok, error, denied, ...) and its duration."""
        with self._lock:
            key = (("tool", tool), ("target", target), ("outcome", outcome))
            self._calls[key] = self._calls.get(key, 0) + 1
            self._latency.setdefault((("tool", tool),), _Histogram()).observe(max(seconds, 0.0))

    def auth_failure(self, reason: str) -> None:
        """Count one refused authentication (``reason``: missing, invalid, throttled)."""
        with self._lock:
            key = (("reason", reason),)
            self._auth_failures[key] = self._auth_failures.get(key, 0) + 1

    def refusal(self, reason: str) -> None:
        """Count one request the edge refused before authentication (``reason``: a short word)."""
        with self._lock:
            key = (("reason", reason),)
            self._refusals[key] = self._refusals.get(key, 0) + 1

    def render(self, target_stats: Mapping[str, Mapping[str, int]] | None = None) -> str:
        """The exposition text; ``target_stats`` is ``scheduler.stats()`` read at scrape time."""
        with self._lock:
            lines = [
                *_counter("gateway_tool_calls_total", "Tool calls by tool, target and outcome.", self._calls),
                "# HELP gateway_tool_call_duration_seconds Tool call duration.",
                "# TYPE gateway_tool_call_duration_seconds histogram",
                *(line for labels, hist in sorted(self._latency.items())
                  for line in hist.lines("gateway_tool_call_duration_seconds", labels)),
                *_counter("gateway_auth_failures_total", "Refused authentications by reason.",
                          self._auth_failures),
                *_counter("gateway_http_refusals_total", "Requests refused at the edge by reason.",
                          self._refusals),
            ]
        lines.extend(_target_families(target_stats or {}))
        return "\n".join(lines) + "\n"


def _counter(name: str, help_text: str, values: Mapping[Labels, int]) -> list[str]:
    head = [f"# HELP {name} {help_text}", f"# TYPE {name} counter"]
    return head + [f"{name}{_labels(labels)} {count}" for labels, count in sorted(values.items())]


def _target_families(stats: Mapping[str, Mapping[str, int]]) -> list[str]:
    lines: list[str] = []
    for key, (name, kind, help_text) in _TARGET_FAMILIES.items():
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        lines += [f"{name}{_labels((('target', target),))} {_number(row.get(key, 0))}"
                  for target, row in sorted(stats.items())]
    return lines
