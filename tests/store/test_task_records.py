"""The MCP tasks table (``gateway.store.task_records.TaskTable``) on a real SQLite store: rows per caller
key, kept until their time, progress and outcome only while working, cancellation requests, sweeping."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from gateway.store.sqlite import SqliteStore
from gateway.store.task_records import TERMINAL, TaskRecord, TaskTable

TASK = TaskRecord(task_id="t1", caller="alice", tool="clone_vm", target="vc1", status="working",
                  created_at=100.0, updated_at=100.0, keep_until=1000.0, owner="1-abc",
                  idempotency_key="kh", digest="dg", caller_key="token::a")


@pytest.fixture
def tasks(tmp_path: Path) -> Iterator[TaskTable]:
    store = SqliteStore(tmp_path / "state.db")
    try:
        yield TaskTable(store, placeholder="?")
    finally:
        store.close()


def test_an_added_task_reads_back_whole(tasks: TaskTable) -> None:
    tasks.add(TASK)
    assert tasks.get("t1", now=200.0) == TASK


def test_a_task_past_its_keep_time_is_gone(tasks: TaskTable) -> None:
    tasks.add(TASK)
    assert tasks.get("t1", now=1000.0) is None
    assert tasks.get("missing", now=0.0) is None


def test_by_key_finds_the_callers_task_for_the_same_call(tasks: TaskTable) -> None:
    tasks.add(TASK)
    assert tasks.by_key("token::a", "kh", "dg", now=200.0) == TASK
    assert tasks.by_key("token::b", "kh", "dg", now=200.0) is None
    assert tasks.by_key("token::a", "kh", "other", now=200.0) is None
    assert tasks.by_key("token::a", "kh", "dg", now=2000.0) is None


def test_by_key_gives_the_oldest_match(tasks: TaskTable) -> None:
    tasks.add(replace(TASK, task_id="t2", created_at=150.0))
    tasks.add(TASK)
    found = tasks.by_key("token::a", "kh", "dg", now=200.0)
    assert found is not None and found.task_id == "t1"


def test_of_caller_lists_the_callers_kept_tasks_newest_first(tasks: TaskTable) -> None:
    tasks.add(TASK)
    tasks.add(replace(TASK, task_id="t2", created_at=300.0))
    tasks.add(replace(TASK, task_id="t3", created_at=200.0, caller_key="token::b"))
    tasks.add(replace(TASK, task_id="t4", created_at=400.0, keep_until=250.0))
    assert [t.task_id for t in tasks.of_caller("token::a", now=260.0)] == ["t2", "t1"]
    assert [t.task_id for t in tasks.of_caller("token::a", now=260.0, limit=1)] == ["t2"]


def test_a_task_without_a_caller_key_is_nobodys(tasks: TaskTable) -> None:
    tasks.add(replace(TASK, caller_key=None))
    assert tasks.of_caller("token::a", now=200.0) == []


def test_progress_is_recorded_while_working(tasks: TaskTable) -> None:
    tasks.add(TASK)
    tasks.progress("t1", 0.5, "half way", now=150.0)
    found = tasks.get("t1", now=200.0)
    assert found is not None
    assert (found.progress, found.status_message, found.updated_at) == (0.5, "half way", 150.0)


@pytest.mark.parametrize(("status", "failed"), [("completed", False), ("failed", True), ("cancelled", True)])
def test_finish_settles_a_working_task(tasks: TaskTable, status: str, failed: bool) -> None:
    tasks.add(TASK)
    tasks.finish("t1", status, '{"r":1}', failed=failed, message="done", now=160.0)
    found = tasks.get("t1", now=200.0)
    assert found is not None
    assert (found.status, found.result, found.failed) == (status, '{"r":1}', failed)
    assert found.status_message == "done"
    assert found.terminal


def test_a_settled_task_stays_as_it_is(tasks: TaskTable) -> None:
    tasks.add(TASK)
    tasks.finish("t1", "completed", "first", failed=False, message=None, now=160.0)
    tasks.finish("t1", "failed", "second", failed=True, message=None, now=170.0)
    tasks.progress("t1", 0.9, "late", now=180.0)
    tasks.request_cancel("t1", now=190.0)
    found = tasks.get("t1", now=200.0)
    assert found is not None
    assert (found.status, found.result) == ("completed", "first")
    assert (found.progress, found.cancel_requested) == (None, False)


def test_finish_with_a_status_that_is_not_terminal_is_refused(tasks: TaskTable) -> None:
    with pytest.raises(AssertionError):
        tasks.finish("t1", "working", "x", failed=False, message=None, now=1.0)


def test_request_cancel_marks_a_working_task(tasks: TaskTable) -> None:
    tasks.add(TASK)
    tasks.request_cancel("t1", now=150.0)
    found = tasks.get("t1", now=200.0)
    assert found is not None and found.cancel_requested and found.updated_at == 150.0


def test_sweep_forgets_tasks_past_their_keep_time(tasks: TaskTable) -> None:
    tasks.add(TASK)
    tasks.add(replace(TASK, task_id="t2", keep_until=5000.0))
    assert tasks.sweep(now=1000.0) == 1
    assert tasks.get("t2", now=1000.0) is not None
    assert tasks.sweep(now=1000.0) == 0


@pytest.mark.parametrize(("status", "terminal"), [("working", False), ("completed", True), ("failed", True),
                                                  ("cancelled", True), ("input_required", False)])
def test_terminal_states(status: str, terminal: bool) -> None:
    assert replace(TASK, status=status).terminal is terminal
    assert (status in TERMINAL) is terminal
