"""Queries on the JSONL log: rows by filter and time window, and the counts ``gateway audit stats`` prints."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Generator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gateway.audit.chain import format_ts, parse_row, parse_ts
from gateway.audit.files import reverse_lines, snapshot

#: read_rows filters matched by equality against the row's field of the same name
_EQUALITY_FILTERS = ("target", "tool", "phase", "caller", "correlation_id")


def _as_utc(moment: datetime | None) -> datetime | None:
    if moment is None:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _in_window(row: Mapping[str, Any], since: datetime | None, until: datetime | None) -> bool:
    if since is None and until is None:
        return True
    moment = parse_ts(row.get("ts"))
    if moment is None:
        return False
    return (since is None or moment >= since) and (until is None or moment <= until)


def _rows_newest_first(path: Path) -> Generator[dict[str, Any], None, None]:
    with snapshot(Path(path)) as files:
        for _, fd, size in reversed(files):
            for _, line in reverse_lines(fd, size):
                if (row := parse_row(line)) is not None:
                    yield row


def read_rows(path: Path, *, last: int | None = None, since: datetime | None = None,
              until: datetime | None = None, target: str | None = None, tool: str | None = None,
              phase: str | None = None, caller: str | None = None,
              correlation_id: str | None = None) -> list[dict[str, Any]]:
    """Rows matching every given filter, oldest first; with ``last``, only the newest ``last`` of them.

    Naive datetimes count as UTC. Lines that are not rows (torn, garbage) are skipped: use ``verify``
    to judge the file. Reading starts from the end, so ``last`` is cheap on a large log.
    """
    wanted = {name: value for name, value in zip(
        _EQUALITY_FILTERS, (target, tool, phase, caller, correlation_id), strict=True) if value is not None}
    start, end = _as_utc(since), _as_utc(until)
    found: list[dict[str, Any]] = []
    if last is not None and last <= 0:
        return found
    with contextlib.closing(_rows_newest_first(path)) as rows:
        for row in rows:
            if all(row.get(k) == v for k, v in wanted.items()) and _in_window(row, start, end):
                found.append(row)
                if last is not None and len(found) >= last:
                    break
    found.reverse()
    return found


#: stats() counters: output key -> row field
_STATS_FIELDS = {"by_phase": "phase", "by_tool": "tool", "by_target": "target", "by_caller": "caller",
                 "by_outcome": "outcome"}


class RowCounts:
    """The summary ``stats`` reports, fed one row at a time, oldest first or (``newest_first``) from
    the end: ``rows``, the ``first_ts``/``last_ts`` seen, and counts by phase, tool, target, caller
    and outcome. Both the file's ``stats`` and the PostgreSQL reader's count with it."""

    def __init__(self, *, newest_first: bool) -> None:
        self.newest_first = newest_first
        self.counters = {name: Counter[str]() for name in _STATS_FIELDS}
        self.rows = 0
        self.first_ts: Any = None
        self.last_ts: Any = None

    def add(self, row: Mapping[str, Any]) -> None:
        self.rows += 1
        if self.newest_first:
            self.last_ts = self.last_ts or row.get("ts")
            self.first_ts = row.get("ts")
        else:
            self.first_ts = self.first_ts or row.get("ts")
            self.last_ts = row.get("ts")
        for name, field_name in _STATS_FIELDS.items():
            value = row.get(field_name)
            if isinstance(value, str | int | bool):
                self.counters[name][str(value)] += 1

    def summary(self, since: datetime | None) -> dict[str, Any]:
        """The counts most frequent first, ties by name; ``since`` as the window's start (naive: UTC)."""
        start = _as_utc(since)
        summary: dict[str, Any] = {"rows": self.rows, "since": format_ts(start) if start else None,
                                   "first_ts": self.first_ts, "last_ts": self.last_ts}
        summary.update({name: dict(sorted(counter.items(), key=lambda kv: (-kv[1], kv[0])))
                        for name, counter in self.counters.items()})
        return summary


def stats(path: Path, *, since: datetime | None = None) -> dict[str, Any]:
    """Counts of rows (since ``since``) by phase, tool, target, caller and outcome (most frequent first,
    ties by name); plus ``rows`` and the ``first_ts``/``last_ts`` seen. A row lacking a field is not
    counted under it."""
    start = _as_utc(since)
    counts = RowCounts(newest_first=True)
    for row in _rows_newest_first(Path(path)):
        if _in_window(row, start, None):
            counts.add(row)
    return counts.summary(start)
