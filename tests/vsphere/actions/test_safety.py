"""gateway.vsphere.actions.safety: when safety snapshots are taken, and what a failed one reports."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from gateway import errors
from gateway.config import Target
from gateway.vocabulary import Plan
from gateway.vsphere.actions.execution import Execution
from gateway.vsphere.actions.safety import SAFETY_PREFIX, SafetyTarget, _maybe_safety, _safety_failed

SESSION = SimpleNamespace(target=Target("vc1", "vc1.example", "VC1"))


def call(**params: Any) -> Execution:
    return Execution(SESSION, Plan("s", (), params), lambda _f, _m: None)


def test_no_safety_snapshot_unless_the_plan_asks() -> None:
    vms = [SafetyTarget("vm-1", "web")]
    assert _maybe_safety(call(), vms, "revert") == []
    assert _maybe_safety(call(auto_snapshot=False), vms, "revert") == []


def test_safety_snapshots_carry_the_prefix() -> None:
    assert SAFETY_PREFIX == "gateway-safety-"


def test_a_failed_safety_snapshot_names_every_failure_and_every_kept_snapshot() -> None:
    failed = [{"vm": "web", "moid": "vm-1", "code": "task_failed", "message": "disk full"},
              {"vm": "db", "moid": "vm-2", "code": "timeout", "message": "too slow"}]
    taken = [{"vm": "app", "vm_moid": "vm-3", "name": "gateway-safety-x", "moid": "snapshot-9",
              "target": "vc1"}]
    error = _safety_failed("vc1", "revert_snapshot", failed, taken)
    assert isinstance(error, errors.TaskFailed) and error.code == "task_failed"
    assert error.message == (
        "target 'vc1': the safety snapshot failed for 2 VM(s), so nothing was changed (revert_snapshot did "
        "not run). Failed: web (vm-1): disk full; db (vm-2): too slow. Safety snapshots already taken (kept; "
        "delete them with delete_snapshot if unwanted): gateway-safety-x (snapshot-9) of app")
    assert error.details == {"target": "vc1", "failed": failed, "safety_snapshots": taken}


def test_a_failed_safety_snapshot_with_none_taken() -> None:
    failed = [{"vm": "a", "moid": "vm-1", "code": "x", "message": "m"}]
    error = _safety_failed("vc1", "remove_disk", failed, [])
    assert error.message.endswith("(kept; delete them with delete_snapshot if unwanted): none")
