"""The audit trail's one "row was written" hook (server.base.audit_trail.AuditTrail.written): every row
the sink took, as stamped, reaches the listeners; a row the sink refused does not; a failing listener
never fails the row."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from gateway.audit.file_sink import AuditSink
from gateway.errors import AuditUnavailable
from gateway.server.base.audit_trail import AuditTrail, reading


def test_every_written_row_reaches_the_listeners_as_stamped(tmp_path: Path) -> None:
    sink = AuditSink(tmp_path / "audit.jsonl", durable=False)
    trail = AuditTrail(sink, sink.path)
    seen: list[dict[str, Any]] = []
    trail.written.append(lambda row: seen.append(dict(row)))
    trail.written.insert(0, lambda _row: 1 / 0)  # a broken listener: logged, the row stands
    trail.write_row({"phase": "call", "tool": "list_vms"})
    trail.write_or_wait({"phase": "executed", "tool": "power_on"})
    trail.write_quietly({"phase": "config_reload", "path": "targets.yaml"})
    assert [(r["seq"], r["phase"]) for r in seen] == [(1, "call"), (2, "executed"), (3, "config_reload")]
    assert all(isinstance(r["hash"], str) and "prev" in r for r in seen)
    sink.close()
    with pytest.raises(AuditUnavailable):
        trail.write_row({"phase": "call"})
    assert len(seen) == 3, "a row the sink refused is not reported as written"


def _spied(sink: AuditSink) -> list[tuple[str, str]]:
    """(method, phase) of every row ``sink`` is handed, through its real methods."""
    used: list[tuple[str, str]] = []
    write, grouped = sink.write, sink.write_grouped

    def spy_write(event: Any, **options: Any) -> dict[str, Any]:
        used.append(("write", event["phase"]))
        return write(event, **options)

    def spy_grouped(event: Any, **options: Any) -> dict[str, Any]:
        used.append(("write_grouped", event["phase"]))
        return grouped(event, **options)

    sink.write, sink.write_grouped = spy_write, spy_grouped  # type: ignore[method-assign]
    return used


def test_only_a_reads_own_call_row_is_committed_in_a_group(tmp_path: Path) -> None:
    sink = AuditSink(tmp_path / "audit.jsonl", durable=True)
    used = _spied(sink)
    trail = AuditTrail(sink, sink.path)
    trail.write_row({"phase": "call", "tool": "power_off_vm"})  # not in a read: flushed alone
    was = reading.set(True)
    try:
        trail.write_row({"phase": "call", "tool": "list_vms"})
        trail.write_row({"phase": "denied", "tool": "list_vms"})  # a refusal of a read: flushed alone
        trail.write_row({"phase": "expired", "tool": "delete_vm"})  # a proposal's move during a read
    finally:
        reading.reset(was)
    assert used == [("write", "call"), ("write_grouped", "call"), ("write", "denied"), ("write", "expired")]
    deadline = time.monotonic() + 10
    while sink.unsynced():
        assert time.monotonic() < deadline, "the group was never flushed"
        time.sleep(0.001)
    sink.close()


@pytest.mark.anyio
async def test_record_in_a_worker_thread_sees_that_the_call_is_a_read(tmp_path: Path) -> None:
    sink = AuditSink(tmp_path / "audit.jsonl", durable=False)
    used = _spied(sink)
    trail = AuditTrail(sink, sink.path)
    was = reading.set(True)
    try:
        await trail.record({"phase": "call", "tool": "list_pending_actions"})
    finally:
        reading.reset(was)
    await trail.record({"phase": "call", "tool": "cancel_action"})
    assert used == [("write_grouped", "call"), ("write", "call")]
    sink.close()


def test_a_sink_without_group_commit_gets_every_row_by_write(tmp_path: Path) -> None:
    class PlainSink:  # the AuditWriter protocol alone (a sink of a test or another engine)
        def __init__(self) -> None:
            self.rows: list[dict[str, Any]] = []

        def write(self, event: Any, *, timeout: float | None = None) -> dict[str, Any]:
            self.rows.append(dict(event))
            return dict(event)

        def writable(self) -> bool:
            return True

        def close(self) -> None:
            pass

    plain = PlainSink()
    trail = AuditTrail(plain, "plain")
    was = reading.set(True)
    try:
        trail.write_row({"phase": "call", "tool": "list_vms"})
    finally:
        reading.reset(was)
    assert [r["phase"] for r in plain.rows] == ["call"]
