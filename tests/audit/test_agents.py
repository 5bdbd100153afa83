"""The per-caller summary of the Agents view (``gateway.audit.agents``): what each row counts, the windows
and their charts, visibility by the Audit tab's own predicate, and its feed from both engines' readers
(only the rows after the newest seen, the other replica's rows too)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from gateway.audit.agents import (
    HORIZON,
    MAX_BUCKETS,
    WAIT_STEP,
    CallerSummary,
    counted,
    percentile,
    wait_bucket,
)
from gateway.audit.file_sink import AuditSink
from gateway.audit.pg_reader import PgAuditReader
from gateway.audit.pg_sink import PgAuditSink
from gateway.audit.readers import FileAuditReader
from gateway.guard.decision import may_read_audit_row
from gateway.role import Role
from gateway.store.postgres import PostgresStore

NOW = 1_800_000_000.0
A = {"caller": "agent-a", "caller_key": "token:aaaa", "kind": "agent"}
B = {"caller": "agent-b", "caller_key": "token:bbbb", "kind": "agent"}


def row(seq: int, who: Mapping[str, Any], at: float, **fields: Any) -> dict[str, Any]:
    base = {"seq": seq, "ts_epoch": at, "phase": "call", "tool": "list_vms", "target": "lab-vc", **who}
    base.update(fields)
    return {k: v for k, v in base.items() if v is not None}


def everyone(_row: Mapping[str, Any]) -> bool:
    return True


def fed(rows: Iterable[Mapping[str, Any]], now: float = NOW) -> CallerSummary:
    summary = CallerSummary()
    for r in rows:
        summary.add(r, now)
    return summary


def by_caller(entries: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {e["caller"]: e for e in entries}


# ---------------------------------------------------------------------------- what a row counts


@pytest.mark.parametrize(("fields", "calls", "refusal", "error", "busy"), [
    ({"phase": "call", "outcome": "ok"}, 1, None, 0, 0),
    ({"phase": "call", "outcome": "error", "error_code": "not_found"}, 1, None, 1, 0),
    ({"phase": "denied", "error_code": "policy_denied"}, 1, "policy_denied", 0, 0),
    ({"phase": "denied", "error_code": "rate_limited"}, 1, "rate_limited", 0, 0),
    ({"phase": "invalid", "error_code": "invalid_argument"}, 1, "invalid_argument", 0, 0),
    ({"phase": "refused", "error_code": "audit_unavailable"}, 1, "audit_unavailable", 0, 0),
    ({"phase": "failed", "error_code": "timeout"}, 1, None, 1, 0),
    ({"phase": "outcome_unknown", "error_code": "outcome_unknown"}, 1, None, 1, 0),
    ({"phase": "executed", "outcome": "ok"}, 1, None, 0, 0),
    ({"phase": "proposed"}, 1, None, 0, 0),
    ({"phase": "executing"}, None, None, 0, 0),              # the intent row: its outcome row counts
    ({"phase": "elicited"}, None, None, 0, 0),               # inside the proposing call
    ({"phase": "approved"}, None, None, 0, 0),               # the execution's row follows
    ({"phase": "busy", "tool": None, "count": 7}, 7, None, 0, 7),
    ({"phase": "web_sign_in", "tool": None}, None, None, 0, 0),
    ({"phase": "call", "caller": "gateway"}, None, None, 0, 0),
    ({"phase": "config_reload", "caller": "gateway", "tool": None}, None, None, 0, 0),
])
def test_what_one_row_counts(fields: dict[str, Any], calls: int | None, refusal: str | None, error: int,
                             busy: int) -> None:
    slot = counted(row(1, A, NOW, **fields))
    if calls is None:
        assert slot is None
        return
    assert slot is not None
    assert (slot.calls, dict(slot.refusals), slot.errors, slot.busy) == (
        calls, {refusal: 1} if refusal else {}, error, busy)


def test_queue_wait_percentiles_are_within_one_histogram_step() -> None:
    waits = [1.0] * 50 + [10.0] * 45 + [200.0] * 5
    summary = fed(row(i + 1, A, NOW - 10, queue_wait_ms=w) for i, w in enumerate(waits))
    entry = summary.view("1h", NOW, everyone)[0]
    assert entry["queued"] == 100
    assert 1.0 <= entry["queue_wait_p50_ms"] <= 1.0 * WAIT_STEP
    assert 10.0 <= entry["queue_wait_p95_ms"] <= 10.0 * WAIT_STEP
    assert percentile({}, 0.5) is None
    assert wait_bucket(0.0) == 0 < wait_bucket(1.0) < wait_bucket(2.0)


def test_a_view_counts_per_caller_with_its_refusals_busy_and_last_call() -> None:
    rows = [
        row(1, A, NOW - 3000),
        row(2, A, NOW - 2000, phase="denied", error_code="rate_limited"),
        row(3, A, NOW - 1000, phase="denied", error_code="policy_denied"),
        row(4, B, NOW - 500, target="prod-vc"),
        row(5, {"caller": "agent-a", "kind": "agent"}, NOW - 400, phase="busy", tool=None, count=3),
        row(6, A, NOW - 7200),  # outside the hour
    ]
    entries = fed(rows).view("1h", NOW, everyone)
    assert [e["caller"] for e in entries] == ["agent-a", "agent-b"]  # the most recently active first
    a, b = by_caller(entries)["agent-a"], by_caller(entries)["agent-b"]
    # the busy row (no caller_key) joins the one caller of its name
    assert (a["calls"], a["refused"], a["rate_limited"], a["busy"]) == (6, 2, 1, 3)
    assert a["refusals"] == {"policy_denied": 1, "rate_limited": 1}
    assert a["last_call"] == NOW - 400 and a["caller_key"] == "token:aaaa" and a["kind"] == "agent"
    assert (b["calls"], b["targets"], b["last_call"]) == (1, ["prod-vc"], NOW - 500)
    day = by_caller(fed(rows).view("24h", NOW, everyone))["agent-a"]
    assert day["calls"] == 7


@pytest.mark.parametrize(("window", "points"), [("1h", 60), ("24h", 96), ("7d", 168)])
def test_the_chart_has_one_point_per_slot_ending_now(window: str, points: int) -> None:
    rows = [row(1, A, NOW), row(2, A, NOW), row(3, A, NOW - 5 * 86400), row(4, A, NOW - 8 * 86400)]
    entry = fed(rows).view(window, NOW, everyone)[0]
    series = entry["series"]
    assert len(series) == points
    assert series[-1] == 2  # the slot of now holds the two newest calls
    assert sum(series) == entry["calls"] == (3 if window == "7d" else 2)


def test_two_callers_sharing_a_name_stay_two() -> None:
    twin = {"caller": "agent-a", "caller_key": "token:cccc", "kind": "agent"}
    entries = fed([row(1, A, NOW), row(2, twin, NOW)]).view("1h", NOW, everyone)
    assert sorted(e["caller_key"] for e in entries) == ["token:aaaa", "token:cccc"]


def test_rows_seen_once_by_seq_and_old_rows_dropped() -> None:
    summary = fed([row(1, A, NOW), row(1, A, NOW), row(2, A, NOW - HORIZON - 60)])
    assert summary.view("7d", NOW, everyone)[0]["calls"] == 1
    assert summary.seq == 2


# ---------------------------------------------------------------------------- visibility


LAB = Role("lab-approver", tools="read", targets=("lab-*",), approve="any", audit="all")
OWN = Role("reader", tools="read", targets="*", approve="none", audit="own")
ADMIN = Role("admin", tools="*", targets="*", approve="any", audit="all")
NONE = Role("nobody", tools="read", targets="*", approve="none", audit="none")


@pytest.mark.parametrize(("role", "viewer", "key", "seen"), [
    (ADMIN, "alice", "token:alice", ["agent-a", "agent-b"]),
    (LAB, "lara", "token:lara", ["agent-a"]),            # lab-vc only: agent-b called prod-vc
    (OWN, "agent-b", "token:bbbb", ["agent-b"]),        # its own calls, by key
    (OWN, "agent-b", "token:zzzz", []),                 # same name, another key: not its rows
    (NONE, "alice", "token:alice", []),
])
def test_a_viewer_sees_the_callers_of_the_rows_the_audit_tab_shows_it(
    role: Role, viewer: str, key: str, seen: list[str],
) -> None:
    rows = [row(1, A, NOW), row(2, B, NOW - 1, target="prod-vc"), row(3, A, NOW - 2, target="prod-vc"),
            row(4, A, NOW - 3, target="lab-vc,prod-vc")]
    entries = fed(rows).view("1h", NOW, lambda r: may_read_audit_row(role, viewer, r, viewer_key=key))
    assert [e["caller"] for e in entries] == seen
    shown = [r for r in rows if may_read_audit_row(role, viewer, r, viewer_key=key)]
    assert sum(e["calls"] for e in entries) == len(shown)  # the same rows as the Audit tab


class Listed:
    """A reader over a list of rows (the engines' own readers are tested below)."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows

    def rows_after(self, seq: int | None, since: float) -> Iterator[Mapping[str, Any]]:
        return iter([r for r in self.rows if seq is None or r["seq"] > seq])


def test_callers_leave_the_summary_once_their_rows_leave_every_window() -> None:
    summary = CallerSummary()
    assert summary.catch_up(Listed([row(1, A, NOW), row(2, B, NOW)]), NOW) == 2
    later = NOW + HORIZON + 3600
    assert summary.catch_up(Listed([row(1, A, NOW), row(2, B, NOW), row(3, B, later)]), later) == 1
    assert [e["caller"] for e in summary.view("7d", later, everyone)] == ["agent-b"]
    assert len(summary._buckets) == 1  # agent-a's bucket is gone, not only hidden


def test_buckets_past_the_bound_are_counted_as_untracked() -> None:
    summary = CallerSummary()
    for i in range(MAX_BUCKETS + 3):
        summary.add(row(i + 1, {"caller": f"c{i}", "caller_key": f"token:{i}"}, NOW), NOW)
    assert summary.untracked == 3
    assert len(summary.view("1h", NOW, everyone)) == MAX_BUCKETS


# ---------------------------------------------------------------------------- the feed from both engines


class Counting:
    """A reader's ``rows_after``, counting the rows it yields (how much of the log one catch-up read)."""

    def __init__(self, reader: Any) -> None:
        self.reader, self.yielded = reader, 0

    def rows_after(self, seq: int | None, since: float) -> Iterator[Mapping[str, Any]]:
        for r in self.reader.rows_after(seq, since):
            self.yielded += 1
            yield r


class Moment:
    """The sinks' clock: the instant the test sets (checkpoints read it too)."""

    def __init__(self) -> None:
        self.at = NOW

    def __call__(self) -> datetime:
        return datetime.fromtimestamp(self.at, UTC)


def event(who: Mapping[str, Any], target: str = "lab-vc") -> dict[str, Any]:
    return {"phase": "call", "tool": "list_vms", "target": target, "outcome": "ok", **who}


def test_the_file_feed_reads_only_the_window_then_only_new_rows(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    clock = Moment()
    with AuditSink(path, durable=False, key_file=tmp_path / "k.key", clock=clock) as sink:
        for i in range(50, 0, -1):  # a week and an hour ago: never read
            clock.at = NOW - HORIZON - 3600 - i
            sink.write(event(A))
        for i, who in enumerate((A, B, A)):
            clock.at = NOW - 60 + i
            sink.write(event(who))
        reader = Counting(FileAuditReader(path))
        summary = CallerSummary()
        assert summary.catch_up(reader, NOW) == 3
        assert reader.yielded <= 3 + 1  # the window's rows and the first one past it, not the 50 before
        clock.at = NOW - 5
        sink.write(event(B, "prod-vc"))
        reader.yielded = 0
        assert summary.catch_up(reader, NOW) == 1 and reader.yielded == 1
    entries = by_caller(summary.view("1h", NOW, everyone))
    assert (entries["agent-a"]["calls"], entries["agent-b"]["calls"]) == (2, 2)
    assert entries["agent-b"]["targets"] == ["lab-vc", "prod-vc"]


def test_the_pg_feed_counts_every_replicas_rows_once(pg_url: str, tmp_path: Path) -> None:
    clock = Moment()
    with PostgresStore(pg_url) as one, PostgresStore(pg_url) as two, \
            PgAuditSink(one, key_file=tmp_path / "k.key", clock=clock) as mine, \
            PgAuditSink(two, key_file=tmp_path / "k.key", clock=clock) as theirs:
        clock.at = NOW - HORIZON - 100
        mine.write(event(A))          # older than the longest window
        clock.at = NOW - 50
        mine.write(event(A))
        theirs.write(event(B))        # another replica's row, same table
        reader = Counting(PgAuditReader(one))
        summary = CallerSummary()
        assert summary.catch_up(reader, NOW) == 2 and reader.yielded == 2
        theirs.write(event(B, "prod-vc"))
        mine.write(event(A))
        reader.yielded = 0
        assert summary.catch_up(reader, NOW) == 2 and reader.yielded == 2
        assert summary.catch_up(reader, NOW) == 0
    entries = by_caller(summary.view("1h", NOW, everyone))
    assert (entries["agent-a"]["calls"], entries["agent-b"]["calls"]) == (2, 2)
