"""Destructive tools (gateway/tools/destructive.py) planned and executed against a fresh simulator.

Effects are read back through a separate pyVmomi session. Covered: the orphaned-VM guard, safety
snapshots (taken first, reported, and all-or-nothing for bulk), deadlines that leave the outcome
unknown, and bulk runs that stop at the first failure.
"""

from __future__ import annotations

from typing import Any

import pytest
from pyVmomi import vim
from support.simulator import wait_until
from support.vsphere_rig import Rig

from gateway import errors
from gateway.tools.destructive import (
    BULK_VM_ACTION,
    DELETE_SNAPSHOT,
    DELETE_VM,
    DESTRUCTIVE_TOOLS,
    REMOVE_DISK,
    REVERT_SNAPSHOT,
    UNREGISTER_VM,
)
from gateway.tools.spec import by_name
from gateway.vocabulary import Category
from gateway.vsphere.actions.safety import SAFETY_PREFIX

VM = "DC0_H0_VM0"
OTHER = "DC0_H0_VM1"


def _power_off(rig: Rig, *names: str) -> None:
    for name in names:
        rig.vm(name).PowerOffVM_Task()
    wait_until(lambda: all(rig.power(n) == "poweredOff" for n in names), what="powered off")


def _disks(rig: Rig, name: str) -> list[Any]:
    devices = rig.props(rig.vm(name), "config.hardware.device")["config.hardware.device"]
    return [d for d in devices if isinstance(d, vim.vm.device.VirtualDisk)]


def _safety_rows(rig: Rig, name: str) -> list[dict[str, Any]]:
    return [r for r in rig.snapshots(name)[0] if r["name"].startswith(SAFETY_PREFIX)]


# --------------------------------------------------------------------------------------------------
# The table


def test_destructive_tools_are_declared_as_such() -> None:
    table = by_name(DESTRUCTIVE_TOOLS)
    assert set(table) == {"delete_snapshot", "revert_snapshot", "delete_vm", "unregister_vm", "remove_disk",
                          "bulk_vm_action"}
    for spec in DESTRUCTIVE_TOOLS:
        assert spec.category is Category.DESTRUCTIVE and spec.annotations()["destructiveHint"] is True
        assert spec.target_mode == "single" and spec.params[0].type == "target"
        assert spec.privileges and all(p != "System.View" for p in spec.privileges)
    # Safety snapshots only where reverting to one can undo the change.
    assert {s.name for s in DESTRUCTIVE_TOOLS if s.snapshot_before} == {"revert_snapshot", "remove_disk",
                                                                         "bulk_vm_action"}


# --------------------------------------------------------------------------------------------------
# Snapshots


def test_delete_snapshot_by_name_keeps_the_others(rig: Rig) -> None:
    rig.take_snapshot(VM, "a")
    b = rig.take_snapshot(VM, "b")

    plan = rig.plan(DELETE_SNAPSHOT, vm=VM, snapshot="b")
    assert [(a.type, a.name, a.moid) for a in plan.affected][1:] == [("snapshot", "b", b)]
    result = rig.execute(DELETE_SNAPSHOT, plan)

    assert rig.snapshot_names(VM) == ["a"]
    assert result["deleted_snapshots"] == [{"name": "b", "moid": b}]


def test_delete_snapshot_by_moid_with_children(rig: Rig) -> None:
    a = rig.take_snapshot(VM, "a")
    rig.take_snapshot(VM, "b")
    rig.take_snapshot(VM, "c")

    plan = rig.plan(DELETE_SNAPSHOT, vm=VM, snapshot=a, remove_children=True)
    assert [x.name for x in plan.affected] == [VM, "a", "b", "c"]
    rig.execute(DELETE_SNAPSHOT, plan)

    assert rig.snapshot_names(VM) == []


def test_delete_snapshot_refuses_an_ambiguous_or_unknown_name(rig: Rig) -> None:
    first = rig.take_snapshot(VM, "dup")
    rig.take_snapshot(VM, "dup")

    with pytest.raises(errors.Ambiguous) as ambiguous:
        rig.plan_checked(DELETE_SNAPSHOT, vm=VM, snapshot="dup")
    assert first in ambiguous.value.details["candidates"]
    with pytest.raises(errors.InvalidArgument) as unknown:
        rig.plan_checked(DELETE_SNAPSHOT, vm=VM, snapshot="nope")
    assert unknown.value.details["field"] == "snapshot" and "dup" in unknown.value.message


def test_revert_to_a_named_snapshot(rig: Rig) -> None:
    a = rig.take_snapshot(VM, "a")
    rig.take_snapshot(VM, "b")

    result = rig.call(REVERT_SNAPSHOT, vm=VM, snapshot="a")

    assert rig.snapshots(VM)[1] == a
    assert result["reverted_to"] == {"name": "a", "moid": a} and result["safety_snapshots"] == []


def test_revert_with_a_safety_snapshot_reverts_to_the_planned_current_snapshot(rig: Rig) -> None:
    current = rig.take_snapshot(VM, "known-good")

    plan = rig.plan(REVERT_SNAPSHOT, vm=VM)
    assert plan.params["snapshot"] == current
    result = rig.execute(REVERT_SNAPSHOT, plan, auto_snapshot=True)

    (safety,) = _safety_rows(rig, VM)
    assert result["safety_snapshots"] == [{"vm": VM, "vm_moid": rig.moid(VM), "name": safety["name"],
                                           "moid": safety["moid"], "target": "sim"}]
    # The safety snapshot became the current one when taken; the revert still went to the planned one.
    assert rig.snapshots(VM)[1] == current


def test_revert_refuses_a_vm_without_snapshots(rig: Rig) -> None:
    with pytest.raises(errors.InvalidState):
        rig.plan_checked(REVERT_SNAPSHOT, vm=VM)


def test_a_failed_safety_snapshot_means_nothing_is_reverted(rig: Rig) -> None:
    a = rig.take_snapshot(VM, "a")
    rig.take_snapshot(VM, "b")
    plan = rig.plan(REVERT_SNAPSHOT, vm=VM, snapshot="a")
    rig.sim.control("/fail-next", {"method": "CreateSnapshot_Task", "entity": VM, "message": "no space left"})

    with pytest.raises(errors.TaskFailed) as caught:
        rig.execute(REVERT_SNAPSHOT, plan, auto_snapshot=True)

    assert "no space left" in caught.value.message and VM in caught.value.message
    assert rig.snapshots(VM)[1] != a
    assert rig.snapshot_names(VM) == ["a", "b"]


# --------------------------------------------------------------------------------------------------
# delete_vm and unregister_vm


def test_delete_vm_records_a_powered_on_vm_as_unmet_then_deletes_it_with_force(rig: Rig) -> None:
    # recorded, not raised: the pipeline answers it only after the call was authorized
    (unmet,) = rig.plan(DELETE_VM, vm=VM).unmet
    assert "force_power_off" in unmet.message and unmet.details["vms"] == [VM]

    plan = rig.plan(DELETE_VM, vm=VM, force_power_off=True)
    assert "PERMANENTLY DELETE" in plan.summary and "target 'sim'" in plan.summary
    rig.take_snapshot(VM, "dies-with-the-vm")
    result = rig.execute(DELETE_VM, plan, auto_snapshot=True)

    assert VM not in rig.vm_names()
    assert result == {"target": "sim", "deleted_vm": VM, "moid": plan.params["vm"], "powered_off_first": True}


def test_delete_vm_of_a_powered_off_vm(rig: Rig) -> None:
    _power_off(rig, VM)
    rig.call(DELETE_VM, vm=VM)
    assert VM not in rig.vm_names() and OTHER in rig.vm_names()


@pytest.mark.parametrize("state", ["orphaned", "inaccessible", "invalid"])
def test_delete_vm_refuses_a_broken_vm_and_points_at_unregister_vm(rig: Rig, state: str) -> None:
    _power_off(rig, VM)
    rig.sim.control("/vm/connection-state", {"vm": VM, "state": state})
    before = rig.last_task()

    with pytest.raises(errors.InvalidState) as caught:
        rig.plan_checked(DELETE_VM, vm=VM, force_power_off=True)

    assert state in caught.value.message and "unregister_vm" in caught.value.message
    assert caught.value.details["connection_state"] == state
    assert rig.last_task() == before
    assert VM in rig.vm_names()


def test_unregister_an_orphaned_vm_keeps_its_files(rig: Rig) -> None:
    _power_off(rig, VM)
    rig.sim.control("/vm/connection-state", {"vm": VM, "state": "orphaned"})

    plan = rig.plan(UNREGISTER_VM, vm=VM)
    assert plan.affected[0].connection_state == "orphaned"
    result = rig.execute(UNREGISTER_VM, plan)

    assert VM not in rig.vm_names()
    assert result["files_kept_at"].endswith(f"{VM}.vmx")


def test_unregister_refuses_a_powered_on_vm(rig: Rig) -> None:
    with pytest.raises(errors.InvalidState):
        rig.plan_checked(UNREGISTER_VM, vm=VM)


def test_slow_delete_past_its_deadline_is_reported_unknown_not_failed(rig: Rig) -> None:
    _power_off(rig, VM)
    rig.sim.control("/slow-task", {"method": "Destroy_Task", "entity": VM, "seconds": 2, "count": 1})

    with pytest.raises(errors.OutcomeUnknown) as caught:
        rig.call(DELETE_VM, vm=VM, timeout_seconds=1)

    assert caught.value.details["task"].startswith("task-")
    assert "get_tasks" in caught.value.message
    assert any(0 < f < 1 for f, _m in rig.progress)
    wait_until(lambda: VM not in rig.vm_names(), timeout=15, what="the delete to complete after all")


# --------------------------------------------------------------------------------------------------
# remove_disk


def test_remove_disk_by_label_keeps_the_file_and_takes_a_safety_snapshot(rig: Rig) -> None:
    _power_off(rig, VM)
    (disk,) = _disks(rig, VM)

    result = rig.call(REMOVE_DISK, vm=VM, disk=disk.deviceInfo.label, auto_snapshot=True)

    assert _disks(rig, VM) == []
    assert result["files_deleted"] is False and result["removed_disk"]["key"] == disk.key
    assert [s["moid"] for s in result["safety_snapshots"]] == [r["moid"] for r in _safety_rows(rig, VM)]
    assert len(result["safety_snapshots"]) == 1


def test_remove_disk_by_key_deleting_its_file_takes_no_safety_snapshot(rig: Rig) -> None:
    _power_off(rig, VM)
    (disk,) = _disks(rig, VM)

    plan = rig.plan(REMOVE_DISK, vm=VM, disk=str(disk.key), delete_files=True)
    assert "PERMANENTLY DELETE" in plan.summary
    result = rig.execute(REMOVE_DISK, plan, auto_snapshot=True)

    assert _disks(rig, VM) == []
    assert result["files_deleted"] is True and result["safety_snapshots"] == []
    assert rig.snapshot_names(VM) == []


def test_remove_disk_refuses_an_unknown_disk_listing_the_real_ones(rig: Rig) -> None:
    (disk,) = _disks(rig, VM)
    with pytest.raises(errors.InvalidArgument) as caught:
        rig.plan_checked(REMOVE_DISK, vm=VM, disk="Hard disk 9")
    assert caught.value.details["field"] == "disk" and disk.deviceInfo.label in caught.value.message


# --------------------------------------------------------------------------------------------------
# bulk_vm_action


def test_bulk_plan_lists_every_match_and_counts_them(rig: Rig) -> None:
    _power_off(rig, VM, OTHER)
    plan = rig.plan(BULK_VM_ACTION, action="delete_vm", name_regex="DC0_H0_VM\\d")

    assert plan.count == plan.object_count == 2
    assert sorted(a.name for a in plan.affected) == [VM, OTHER]
    assert all(a.type == "vm" and a.moid.startswith("vm-") for a in plan.affected)
    assert "target 'sim'" in plan.summary


def test_bulk_delete_removes_only_the_matching_vms(rig: Rig) -> None:
    _power_off(rig, VM, OTHER)
    result = rig.call(BULK_VM_ACTION, action="delete_vm", name_regex="DC0_H0_VM\\d")

    assert rig.vm_names() == {"DC0_C0_RP0_VM0", "DC0_C0_RP0_VM1"}
    assert [r["vm"] for r in result["results"]] == [VM, OTHER]


@pytest.mark.parametrize(("args", "error", "field"), [
    ({"action": "delete_vm", "name_regex": "nothing-.*"}, errors.InvalidArgument, "name_regex"),
    ({"action": "delete_vm", "name_regex": "DC0_H0_VM("}, errors.InvalidArgument, "name_regex"),
    ({"action": "delete_vm", "name_regex": ".*", "folder": "nope"}, errors.InvalidArgument, "folder"),
    ({"action": "revert_to_current_snapshot", "name_regex": "DC0_H0_VM\\d"}, errors.InvalidState, None),
])
def test_bulk_refuses_in_plan(rig: Rig, args: dict[str, Any], error: type[errors.GatewayError],
                              field: str | None) -> None:
    with pytest.raises(error) as caught:
        rig.plan_checked(BULK_VM_ACTION, **args)
    assert caught.value.details.get("field") == field


def test_bulk_delete_records_powered_on_matches_as_unmet(rig: Rig) -> None:
    (unmet,) = rig.plan(BULK_VM_ACTION, action="delete_vm", name_regex="DC0_H0_VM\\d").unmet
    assert sorted(unmet.details["vms"]) == sorted([VM, OTHER]) and "force_power_off" in unmet.message


def test_bulk_delete_refuses_when_any_match_is_orphaned(rig: Rig) -> None:
    _power_off(rig, VM, OTHER)
    rig.sim.control("/vm/connection-state", {"vm": OTHER, "state": "invalid"})

    with pytest.raises(errors.InvalidState) as caught:
        rig.plan_checked(BULK_VM_ACTION, action="delete_vm", name_regex="DC0_H0_VM\\d")

    assert OTHER in caught.value.message and "unregister_vm" in caught.value.message


def test_bulk_delete_all_snapshots_skips_vms_without_any(rig: Rig) -> None:
    rig.take_snapshot(VM, "a")
    rig.take_snapshot(VM, "b")

    plan = rig.plan(BULK_VM_ACTION, action="delete_all_snapshots", name_regex="DC0_H0_VM\\d")
    assert [a.name for a in plan.affected] == [VM] and plan.object_count == 2
    result = rig.execute(BULK_VM_ACTION, plan, auto_snapshot=True)

    assert rig.snapshot_names(VM) == []
    assert result["skipped"] == [OTHER] and result["safety_snapshots"] == []


def test_bulk_revert_takes_every_safety_snapshot_then_reverts(rig: Rig) -> None:
    targets = {name: rig.take_snapshot(name, "baseline") for name in (VM, OTHER)}

    result = rig.call(BULK_VM_ACTION, action="revert_to_current_snapshot", name_regex="DC0_H0_VM\\d",
                      auto_snapshot=True)

    assert sorted(s["vm"] for s in result["safety_snapshots"]) == [VM, OTHER]
    for name, baseline in targets.items():
        assert len(_safety_rows(rig, name)) == 1
        assert rig.snapshots(name)[1] == baseline


def test_bulk_revert_runs_nothing_when_one_safety_snapshot_fails(rig: Rig) -> None:
    targets = {name: rig.take_snapshot(name, "baseline") for name in (VM, OTHER)}
    plan = rig.plan(BULK_VM_ACTION, action="revert_to_current_snapshot", name_regex="DC0_H0_VM\\d")
    rig.sim.control("/fail-next", {"method": "CreateSnapshot_Task", "entity": OTHER,
                                   "message": "datastore full"})

    with pytest.raises(errors.TaskFailed) as caught:
        rig.execute(BULK_VM_ACTION, plan, auto_snapshot=True)

    error = caught.value
    (taken,) = _safety_rows(rig, VM)
    assert [f["vm"] for f in error.details["failed"]] == [OTHER]
    assert [s["moid"] for s in error.details["safety_snapshots"]] == [taken["moid"]]
    assert OTHER in error.message and "datastore full" in error.message and taken["moid"] in error.message
    # Nothing was reverted: VM's current snapshot is still the safety snapshot taken last, not the baseline.
    assert rig.snapshots(VM)[1] == taken["moid"] != targets[VM]
    assert _safety_rows(rig, OTHER) == []


def test_bulk_stops_at_the_first_failure_and_reports_what_was_done(rig: Rig) -> None:
    _power_off(rig, VM, OTHER, "DC0_C0_RP0_VM0")
    rig.sim.control("/fail-next", {"method": "Destroy_Task", "entity": VM, "message": "file locked"})

    with pytest.raises(errors.TaskFailed) as caught:
        rig.call(BULK_VM_ACTION, action="delete_vm", name_regex="DC0_(C0_RP0|H0)_VM0|DC0_H0_VM1")

    details = caught.value.details
    assert [c["vm"] for c in details["completed"]] == ["DC0_C0_RP0_VM0"]
    assert details["failed_vm"] == VM and details["not_attempted"] == [OTHER]
    assert "file locked" in caught.value.message
    assert rig.vm_names() == {"DC0_C0_RP0_VM1", VM, OTHER}
