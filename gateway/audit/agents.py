"""What each caller did over the last hour, day or week, summed from the audit rows (``CallerSummary``).

The summary is fed rows (``catch_up``: one read's rows in any order; ``add``: one at a time, in seq
order), each once by its ``seq``, and keeps per (caller key,
caller, target) counts in time slots for each window: a view costs the slots of one window, never a
read of the log. ``catch_up`` feeds it from a reader's ``rows_after``: the rows after the newest
``seq`` it holds, so rows other writers appended (another replica, the CLI) count as well. Which
buckets a viewer sees is the caller's predicate over a bucket's identity row (``caller``,
``caller_key``, ``target``: the fields ``guard.decision.may_read_audit_row`` reads), so a view shows
exactly the rows the Audit tab would show that viewer.

What counts, per row (one tool call leaves one row that ends it):

- a **call**: a row naming a tool whose phase is not an intermediate step (``NOT_CALLS``: the
  ``executing`` intent row before its outcome, an ``elicited`` answer inside a proposing call, the
  ``approved`` move before its execution); a ``busy`` row counts its ``count`` refused calls;
- a **refusal** by its ``error_code``: a call row of phase ``denied``, ``invalid`` or ``refused``;
  ``rate_limited`` among them also counts as a rate-limit;
- an **error**: a ``failed`` or ``outcome_unknown`` row, or a read's ``call`` row of outcome ``error``;
- the **queue wait**: a row's ``queue_wait_ms`` (the time its vSphere calls waited for a slot),
  as percentiles: the upper bound of the histogram bucket holding each (at most ``WAIT_STEP`` times
  the wait, or ``WAIT_FLOOR_MS`` for shorter waits).

Windows are slot-aligned: the last 24 hours are the 96 quarter-hours ending with the current one.
"""

from __future__ import annotations

import math
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from gateway.audit.chain import parse_ts

#: window name -> (seconds, slot seconds): the chart of each window has seconds / slot points
WINDOWS: Final = {"1h": (3600, 60), "24h": (86400, 900), "7d": (7 * 86400, 3600)}
#: the longest window: rows older than this are not kept
HORIZON: Final = max(seconds for seconds, _ in WINDOWS.values())
#: rows naming a tool that are a step of a call whose end is another row
NOT_CALLS: Final = frozenset({"executing", "elicited", "approved"})
REFUSAL_PHASES: Final = frozenset({"denied", "invalid", "refused"})
ERROR_PHASES: Final = frozenset({"failed", "outcome_unknown"})
#: rows of the gateway itself, or of no known caller, are nobody's calls
NOT_CALLERS: Final = frozenset({"", "-", "*", "gateway"})
#: the queue wait histogram: bucket 0 holds waits under WAIT_FLOOR_MS, bucket n up to
#: WAIT_FLOOR_MS * WAIT_STEP ** n
WAIT_FLOOR_MS: Final = 0.5
WAIT_STEP: Final = 1.15
#: how far before a window's start a reader reading newest first still reads (clocks step back)
CLOCK_SLACK_SECONDS: Final = 300.0
#: how often a catch-up drops the slots that left every window (seconds)
PRUNE_SECONDS: Final = 60.0
#: (caller key, caller, target) buckets kept at most; rows of buckets past it are counted as untracked
MAX_BUCKETS: Final = 10_000


class RowsAfter(Protocol):
    """What ``catch_up`` reads: the rows after ``seq`` (all with None) no older than ``since`` (epoch
    seconds), in any order (``FileAuditReader.rows_after``, ``PgAuditReader.rows_after``)."""

    def rows_after(self, seq: int | None, since: float) -> Iterable[Mapping[str, Any]]: ...


@dataclass
class Slot:
    """The counts of one bucket in one time slot."""

    calls: int = 0
    errors: int = 0
    busy: int = 0
    refusals: Counter[str] = field(default_factory=Counter)
    waits: Counter[int] = field(default_factory=Counter)
    last: float = 0.0

    def merge(self, other: Slot) -> None:
        self.calls += other.calls
        self.errors += other.errors
        self.busy += other.busy
        self.refusals.update(other.refusals)
        self.waits.update(other.waits)
        self.last = max(self.last, other.last)


@dataclass
class _Bucket:
    identity: dict[str, Any]
    kind: str | None
    #: per window name: slot index (epoch seconds // slot seconds) -> counts
    slots: dict[str, dict[int, Slot]]

    def add(self, slot: Slot, moment: float, kind: str | None) -> None:
        self.kind = kind or self.kind
        for name, (_, step) in WINDOWS.items():
            index = int(moment // step)
            held = self.slots[name].get(index)
            if held is None:
                self.slots[name][index] = held = Slot()
            held.merge(slot)


def wait_bucket(ms: float) -> int:
    """The histogram bucket of a wait of ``ms`` milliseconds."""
    if ms < WAIT_FLOOR_MS:
        return 0
    return 1 + int(math.log(ms / WAIT_FLOOR_MS) / math.log(WAIT_STEP))


def wait_bound(bucket: int) -> float:
    """The largest wait (ms) ``bucket`` holds."""
    return WAIT_FLOOR_MS * WAIT_STEP ** bucket


def percentile(waits: Mapping[int, int], q: float) -> float | None:
    """The ``q`` quantile (0 < q <= 1) of a wait histogram, as its bucket's bound (ms); None when empty."""
    total = sum(waits.values())
    if total == 0:
        return None
    rank, seen = math.ceil(q * total), 0
    for bucket in sorted(waits):
        seen += waits[bucket]
        if seen >= rank:
            return round(wait_bound(bucket), 1)
    return None  # pragma: no cover (rank <= total)


def row_epoch(row: Mapping[str, Any]) -> float | None:
    """A row's time in epoch seconds: ``ts_epoch``, else its ``ts`` parsed."""
    epoch = row.get("ts_epoch")
    if isinstance(epoch, int | float) and not isinstance(epoch, bool):
        return float(epoch)
    moment = parse_ts(row.get("ts"))
    return moment.timestamp() if moment is not None else None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def counted(row: Mapping[str, Any], moment: float = 0.0) -> Slot | None:
    """What one row at ``moment`` adds, or None for a row that is nobody's call."""
    caller, phase = _text(row.get("caller")), _text(row.get("phase"))
    if caller is None or caller in NOT_CALLERS or phase is None:
        return None
    if phase == "busy":
        count = row.get("count")
        busy = count if type(count) is int and count > 0 else 1
        return Slot(calls=busy, busy=busy, last=moment)
    if _text(row.get("tool")) is None or phase in NOT_CALLS:
        return None
    code = _text(row.get("error_code"))
    refused = phase in REFUSAL_PHASES and code is not None
    failed = not refused and (phase in ERROR_PHASES or (phase == "call" and row.get("outcome") == "error"))
    wait = row.get("queue_wait_ms")
    waits: Counter[int] = Counter()
    if isinstance(wait, int | float) and not isinstance(wait, bool) and wait >= 0:
        waits[wait_bucket(float(wait))] += 1
    return Slot(calls=1, errors=int(failed), refusals=Counter({code: 1} if refused and code else {}),
                waits=waits, last=moment)


class CallerSummary:
    """Per-caller counts over the windows of ``WINDOWS`` (see the module doc). Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._buckets: dict[tuple[str, str, str], _Bucket] = {}
        #: the newest ``seq`` fed (rows at or below it are skipped), None before the first
        self.seq: int | None = None
        self.untracked = 0
        self._pruned_at = 0.0

    def catch_up(self, reader: RowsAfter, now: float) -> int:
        """Feed the rows ``reader`` holds after the newest seq seen (within the longest window);
        the number fed. One catch-up at a time: a second caller waits and reads what is left."""
        with self._lock:
            fed, after = 0, self.seq
            rows = reader.rows_after(after, now - HORIZON)
            try:
                for row in rows:
                    fed += self._add(row, now, after)
            finally:
                close = getattr(rows, "close", None)
                if close is not None:
                    close()
            if now - self._pruned_at >= PRUNE_SECONDS:
                self._prune(now)
                self._pruned_at = now
            return fed

    def add(self, row: Mapping[str, Any], now: float) -> bool:
        """Feed one row (skipped when its seq was fed already); whether it counted."""
        with self._lock:
            return bool(self._add(row, now, self.seq))

    def _add(self, row: Mapping[str, Any], now: float, after: int | None) -> int:
        """Count ``row`` unless its seq is at or below ``after`` (fed before)."""
        seq = row.get("seq")
        if type(seq) is int:
            if after is not None and seq <= after:
                return 0
            self.seq = seq if self.seq is None else max(self.seq, seq)
        moment = row_epoch(row)
        slot = None if moment is None or moment < now - HORIZON else counted(row, moment)
        if slot is None or moment is None:
            return 0
        identity = {"caller": row["caller"], "caller_key": _text(row.get("caller_key")),
                    "target": _text(row.get("target"))}
        key = (identity["caller_key"] or "", identity["caller"], identity["target"] or "")
        bucket = self._buckets.get(key)
        if bucket is None:
            if len(self._buckets) >= MAX_BUCKETS:
                self.untracked += 1
                return 0
            bucket = self._buckets[key] = _Bucket(identity, None, {name: {} for name in WINDOWS})
        bucket.add(slot, moment, _text(row.get("kind")))
        return 1

    def _prune(self, now: float) -> None:
        for key, bucket in list(self._buckets.items()):
            for name, (seconds, step) in WINDOWS.items():
                oldest = int((now - seconds) // step)
                slots = bucket.slots[name]
                for index in [i for i in slots if i <= oldest]:
                    del slots[index]
            if not any(bucket.slots.values()):
                del self._buckets[key]

    def view(self, window: str, now: float,
             visible: Callable[[Mapping[str, Any]], bool]) -> list[dict[str, Any]]:
        """One entry per caller with a row ``visible`` in ``window`` (a key of ``WINDOWS``), the most
        recently active first: its counts, queue-wait percentiles and ``series`` (calls per slot,
        oldest first, ending with the slot of ``now``). A caller is its ``caller_key``; rows without
        one (older ``busy`` rows) join the one caller of the same name, when there is exactly one."""
        seconds, step = WINDOWS[window]
        points = seconds // step
        first = int(now // step) - points + 1
        entries: dict[tuple[str, str], dict[str, Any]] = {}
        with self._lock:  # the slots change while rows are fed: summed under the lock (bounded work)
            for bucket in self._buckets.values():
                self._sum(bucket, window, first, points, visible, entries)
        _fold_keyless(entries)
        shown = [_entry(e) for e in entries.values()]
        shown.sort(key=lambda e: (-e["last_call"], e["caller"]))
        return shown

    @staticmethod
    def _sum(bucket: _Bucket, window: str, first: int, points: int,
             visible: Callable[[Mapping[str, Any]], bool], entries: dict[tuple[str, str], dict[str, Any]]
             ) -> None:
        identity, kind = bucket.identity, bucket.kind
        slots = [(i, s) for i, s in bucket.slots[window].items() if i >= first]
        if slots and visible(identity):
            who = (identity["caller_key"] or "", identity["caller"])
            entry = entries.get(who)
            if entry is None:
                entry = entries[who] = {"caller": identity["caller"], "caller_key": identity["caller_key"],
                                        "kind": kind, "targets": set(), "total": Slot(),
                                        "series": [0] * points}
            entry["kind"] = entry["kind"] or kind
            if identity["target"]:
                entry["targets"].add(identity["target"])
            for index, slot in slots:
                entry["total"].merge(slot)
                if 0 <= index - first < points:
                    entry["series"][index - first] += slot.calls


def _fold_keyless(entries: dict[tuple[str, str], dict[str, Any]]) -> None:
    for who in [w for w in entries if not w[0]]:
        named = [w for w in entries if w[0] and w[1] == who[1]]
        if len(named) != 1:
            continue
        into, keyless = entries[named[0]], entries.pop(who)
        into["total"].merge(keyless["total"])
        into["targets"] |= keyless["targets"]
        into["series"] = [a + b for a, b in zip(into["series"], keyless["series"], strict=True)]


def _entry(entry: Mapping[str, Any]) -> dict[str, Any]:
    total: Slot = entry["total"]
    return {
        "caller": entry["caller"], "caller_key": entry["caller_key"], "kind": entry["kind"],
        "targets": sorted(entry["targets"]), "calls": total.calls, "errors": total.errors,
        "refusals": dict(sorted(total.refusals.items(), key=lambda kv: (-kv[1], kv[0]))),
        "refused": sum(total.refusals.values()), "rate_limited": total.refusals.get("rate_limited", 0),
        "busy": total.busy, "queued": sum(total.waits.values()),
        "queue_wait_p50_ms": percentile(total.waits, 0.5), "queue_wait_p95_ms": percentile(total.waits, 0.95),
        "last_call": total.last, "series": list(entry["series"]),
    }
