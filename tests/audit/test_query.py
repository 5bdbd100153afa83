"""Queries on the JSONL log (``gateway.audit.query``): rows by filter and time window, ``last``, and the
counts of ``gateway audit stats`` (``RowCounts``)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from gateway.audit.file_sink import AuditSink
from gateway.audit.query import RowCounts, read_rows, stats

START = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
EVENTS = [
    {"phase": "call", "tool": "list_vms", "target": "vc1", "caller": "alice", "correlation_id": "c1"},
    {"phase": "result", "tool": "list_vms", "target": "vc1", "caller": "alice", "outcome": "ok",
     "correlation_id": "c1"},
    {"phase": "call", "tool": "power_on_vm", "target": "vc2", "caller": "bob", "correlation_id": "c2"},
    {"phase": "result", "tool": "power_on_vm", "target": "vc2", "caller": "bob", "outcome": "error",
     "correlation_id": "c2"},
    {"phase": "call", "tool": "list_vms", "target": "vc2", "caller": "alice", "correlation_id": "c3"},
]


def _clock(moments: Iterator[datetime]) -> Any:
    return lambda: next(moments)


@pytest.fixture
def log(tmp_path: Path) -> Path:
    """Five rows, one minute apart from START."""
    path = tmp_path / "audit.jsonl"
    moments = iter(START + timedelta(minutes=i) for i in range(100))
    with AuditSink(path, durable=False, clock=_clock(moments)) as sink:
        for event in EVENTS:
            sink.write(event)
    return path


def _seqs(rows: list[dict[str, Any]]) -> list[int]:
    return [r["seq"] for r in rows]


def test_every_row_oldest_first(log: Path) -> None:
    assert _seqs(read_rows(log)) == [1, 2, 3, 4, 5]


@pytest.mark.parametrize(("last", "seqs"), [(1, [5]), (2, [4, 5]), (5, [1, 2, 3, 4, 5]),
                                            (50, [1, 2, 3, 4, 5]), (0, []), (-3, [])])
def test_last_keeps_the_newest_rows_oldest_first(log: Path, last: int, seqs: list[int]) -> None:
    assert _seqs(read_rows(log, last=last)) == seqs


@pytest.mark.parametrize(("filters", "seqs"), [
    ({"tool": "list_vms"}, [1, 2, 5]),
    ({"target": "vc2"}, [3, 4, 5]),
    ({"phase": "result"}, [2, 4]),
    ({"caller": "bob"}, [3, 4]),
    ({"correlation_id": "c1"}, [1, 2]),
    ({"tool": "list_vms", "target": "vc2"}, [5]),
    ({"tool": "list_vms", "caller": "bob"}, []),
    ({"tool": "nothing"}, []),
])
def test_filters_match_by_equality_and_combine(log: Path, filters: dict[str, str], seqs: list[int]) -> None:
    assert _seqs(read_rows(log, **filters)) == seqs  # type: ignore[arg-type]


def test_last_applies_after_the_filters(log: Path) -> None:
    assert _seqs(read_rows(log, tool="list_vms", last=2)) == [2, 5]


@pytest.mark.parametrize(("since", "until", "seqs"), [
    (START + timedelta(minutes=2), None, [3, 4, 5]),
    (None, START + timedelta(minutes=1), [1, 2]),
    (START + timedelta(minutes=1), START + timedelta(minutes=3), [2, 3, 4]),
    (START + timedelta(minutes=10), None, []),
    # naive datetimes count as UTC
    (datetime(2026, 3, 1, 12, 4), None, [5]),
])
def test_time_window_is_inclusive(log: Path, since: datetime | None, until: datetime | None,
                                  seqs: list[int]) -> None:
    assert _seqs(read_rows(log, since=since, until=until)) == seqs


def test_lines_that_are_not_rows_are_skipped(log: Path) -> None:
    with log.open("ab") as handle:
        handle.write(b"garbage\n{\"seq\": 1}\n")
    assert _seqs(read_rows(log)) == [1, 2, 3, 4, 5]


def test_a_missing_log_has_no_rows(tmp_path: Path) -> None:
    assert read_rows(tmp_path / "none.jsonl") == []
    assert stats(tmp_path / "none.jsonl")["rows"] == 0


def test_rows_of_rotated_files_are_read_too(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    with AuditSink(path, durable=False, max_bytes=400) as sink:
        for i in range(12):
            sink.write({"phase": "call", "n": i})
    assert (tmp_path / "audit.jsonl.1").exists()
    rows = read_rows(path, phase="call")
    assert [r["n"] for r in rows] == list(range(12))


def test_stats_counts_by_field_most_frequent_first(log: Path) -> None:
    summary = stats(log)
    assert summary["rows"] == 5
    assert summary["since"] is None
    assert summary["first_ts"] == "2026-03-01T12:00:00.000Z"
    assert summary["last_ts"] == "2026-03-01T12:04:00.000Z"
    assert summary["by_phase"] == {"call": 3, "result": 2}
    assert list(summary["by_tool"].items()) == [("list_vms", 3), ("power_on_vm", 2)]
    assert summary["by_target"] == {"vc2": 3, "vc1": 2}
    assert summary["by_caller"] == {"alice": 3, "bob": 2}
    assert summary["by_outcome"] == {"error": 1, "ok": 1}


def test_stats_since_counts_the_window_and_names_its_start(log: Path) -> None:
    summary = stats(log, since=START + timedelta(minutes=3))
    assert summary["rows"] == 2
    assert summary["since"] == "2026-03-01T12:03:00.000Z"
    assert summary["first_ts"] == "2026-03-01T12:03:00.000Z"


def test_row_counts_oldest_first() -> None:
    counts = RowCounts(newest_first=False)
    for ts, tool in (("t1", "a"), ("t2", "b"), ("t3", "b")):
        counts.add({"ts": ts, "tool": tool})
    summary = counts.summary(None)
    assert (summary["first_ts"], summary["last_ts"], summary["rows"]) == ("t1", "t3", 3)
    assert list(summary["by_tool"]) == ["b", "a"]


def test_row_counts_newest_first() -> None:
    counts = RowCounts(newest_first=True)
    for ts in ("t3", "t2", "t1"):
        counts.add({"ts": ts})
    summary = counts.summary(None)
    assert (summary["first_ts"], summary["last_ts"]) == ("t1", "t3")


def test_row_counts_ties_sort_by_name() -> None:
    counts = RowCounts(newest_first=False)
    for caller in ("zed", "amy", "mo"):
        counts.add({"caller": caller})
    assert list(counts.summary(None)["by_caller"]) == ["amy", "mo", "zed"]


@pytest.mark.parametrize(("value", "key"), [("x", "x"), (3, "3"), (True, "True")])
def test_row_counts_count_scalar_values_as_text(value: Any, key: str) -> None:
    counts = RowCounts(newest_first=False)
    counts.add({"phase": value})
    assert counts.summary(None)["by_phase"] == {key: 1}


@pytest.mark.parametrize("value", [None, ["a"], {"a": 1}, 1.5])
def test_row_counts_skip_values_that_are_not_names(value: Any) -> None:
    counts = RowCounts(newest_first=False)
    counts.add({"phase": value})
    assert counts.summary(None)["by_phase"] == {}
    assert counts.rows == 1


def test_summary_since_naive_is_utc() -> None:
    summary = RowCounts(newest_first=True).summary(datetime(2026, 1, 2, 3, 4))
    assert summary["since"] == "2026-01-02T03:04:00.000Z"
