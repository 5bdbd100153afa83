"""Write tools (gateway/tools/write.py) planned and executed against a fresh simulator, with every effect
read back through a separate pyVmomi session, and every bad argument refused in plan, before any task."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from pyVmomi import vim
from support.simulator import Simulator
from support.vsphere_rig import Rig, start_rig

from gateway import errors
from gateway.tools.spec import ToolSpec, by_name
from gateway.tools.write import (
    CLONE,
    CREATE_SNAPSHOT,
    MIGRATE,
    MOUNT_ISO,
    POWER_OFF,
    POWER_ON,
    RECONFIGURE,
    RESET,
    SUSPEND,
    UNMOUNT_ISO,
    WRITE_TOOLS,
)
from gateway.vocabulary import Category

VM = "DC0_H0_VM0"
CLUSTER_VM = "DC0_C0_RP0_VM0"


def _refused_before_any_task(rig: Rig, spec: ToolSpec, error: type[errors.GatewayError],
                             **args: Any) -> errors.GatewayError:
    before = rig.last_task()
    with pytest.raises(error) as caught:
        rig.plan_checked(spec, **args)
    assert rig.last_task() == before
    return caught.value


def _power_off(rig: Rig, name: str) -> None:
    rig.call(POWER_OFF, vm=name, guest_timeout_seconds=0)
    assert rig.power(name) == "poweredOff"


def _devices(rig: Rig, name: str) -> list[Any]:
    return list(rig.props(rig.vm(name), "config.hardware.device")["config.hardware.device"])


# --------------------------------------------------------------------------------------------------
# The table


def test_write_tools_are_writes_on_exactly_one_target_with_real_privileges() -> None:
    table = by_name(WRITE_TOOLS)
    assert set(table) == {"power_on_vm", "power_off_vm", "suspend_vm", "reset_vm", "create_snapshot",
                          "reconfigure_vm", "mount_iso", "unmount_iso", "migrate_vm", "clone_vm"}
    for spec in WRITE_TOOLS:
        assert spec.category is Category.WRITE
        assert spec.target_mode == "single" and spec.params[0].type == "target"
        assert spec.plan is not None and spec.execute is not None
        assert spec.privileges and all("." in p and p != "System.View" for p in spec.privileges)
        assert not spec.snapshot_before


def test_reconfigure_takes_no_raw_spec() -> None:
    with pytest.raises(errors.InvalidArgument) as caught:
        RECONFIGURE.validate({"target": "sim", "vm": VM, "spec": {"numCPUs": 64}})
    assert caught.value.details["field"] == "spec"


# --------------------------------------------------------------------------------------------------
# Power


def test_power_cycle_through_every_power_tool(rig: Rig) -> None:
    result = rig.call(POWER_OFF, vm=VM)
    assert rig.power(VM) == "poweredOff"
    assert result["method"] == "hard_power_off"
    assert "Tools is not running" in result["note"]  # the simulator never runs Tools
    assert result["target"] == "sim" and result["vm"] == VM

    assert rig.call(POWER_ON, vm=VM)["power_state"] == "poweredOn"
    assert rig.power(VM) == "poweredOn"

    boot = rig.props(rig.vm(VM), "summary.runtime.bootTime")["summary.runtime.bootTime"]
    rig.call(RESET, vm=VM)
    assert rig.power(VM) == "poweredOn"
    assert rig.props(rig.vm(VM), "summary.runtime.bootTime")["summary.runtime.bootTime"] > boot

    rig.call(SUSPEND, vm=VM)
    assert rig.power(VM) == "suspended"

    result = rig.call(POWER_OFF, vm=VM)
    assert rig.power(VM) == "poweredOff"
    assert "suspended" in result["note"]


@pytest.mark.parametrize(("spec", "state_first"), [
    (POWER_ON, None), (SUSPEND, "off"), (RESET, "off"), (POWER_OFF, "off"),
])
def test_power_tools_refuse_a_vm_already_in_the_wrong_state(rig: Rig, spec: ToolSpec,
                                                            state_first: str | None) -> None:
    if state_first == "off":
        _power_off(rig, VM)
    before = rig.last_task()
    (unmet,) = rig.plan(spec, vm=VM).unmet  # answered by the pipeline once the call is authorized
    assert rig.last_task() == before
    assert "sim" in unmet.message and VM in unmet.message


def test_plan_names_the_target_and_the_affected_vm_with_its_facts(rig: Rig) -> None:
    plan = rig.plan(POWER_OFF, vm=CLUSTER_VM)

    assert "target 'sim'" in plan.summary and CLUSTER_VM in plan.summary
    (vm,) = plan.affected
    assert (vm.type, vm.name, vm.moid) == ("vm", CLUSTER_VM, rig.moid(CLUSTER_VM))
    assert vm.folder == "/DC0/vm" and vm.resource_pool == "Resources" and vm.connection_state == "connected"
    assert plan.params["vm"] == rig.moid(CLUSTER_VM)


def test_unknown_vm_is_not_found(rig: Rig) -> None:
    error = _refused_before_any_task(rig, POWER_ON, errors.NotFound, vm="no-such-vm")
    assert "list_vms" in error.message


def test_every_write_refuses_an_orphaned_vm_pointing_at_unregister_vm(rig: Rig) -> None:
    rig.sim.control("/vm/connection-state", {"vm": VM, "state": "orphaned"})
    error = _refused_before_any_task(rig, CREATE_SNAPSHOT, errors.InvalidState, vm=VM, name="s")
    assert "orphaned" in error.message and "unregister_vm" in error.message


# --------------------------------------------------------------------------------------------------
# Snapshots


def test_create_snapshot_adds_it_to_the_tree(rig: Rig) -> None:
    result = rig.call(CREATE_SNAPSHOT, vm=VM, name="before-upgrade", description="pre 2.0", quiesce=True)

    rows, current = rig.snapshots(VM)
    assert [(r["name"], r["description"], r["quiesced"]) for r in rows] == [
        ("before-upgrade", "pre 2.0", True)]
    assert result["snapshot"] == {"name": "before-upgrade", "moid": current}


def test_create_snapshot_refuses_a_name_the_vm_already_uses(rig: Rig) -> None:
    rig.call(CREATE_SNAPSHOT, vm=VM, name="s1")
    error = _refused_before_any_task(rig, CREATE_SNAPSHOT, errors.InvalidArgument, vm=VM, name="s1")
    assert error.details["field"] == "name"
    assert rig.snapshot_names(VM) == ["s1"]


# --------------------------------------------------------------------------------------------------
# Reconfigure


def test_reconfigure_changes_cpu_memory_and_adds_a_disk_and_a_nic(rig: Rig) -> None:
    _power_off(rig, VM)
    disks_before = [d for d in _devices(rig, VM) if isinstance(d, vim.vm.device.VirtualDisk)]

    result = rig.call(RECONFIGURE, vm=VM, cpu_count=2, memory_mb=2048, add_disk_gb=3, datastore="LocalDS_1",
                      add_nic_network="VM Network")

    hardware = rig.props(rig.vm(VM), "config.hardware.numCPU", "config.hardware.memoryMB")
    assert hardware == {"config.hardware.numCPU": 2, "config.hardware.memoryMB": 2048}
    devices: list[Any] = _devices(rig, VM)
    disks: list[Any] = [d for d in devices if isinstance(d, vim.vm.device.VirtualDisk)]
    assert len(disks) == len(disks_before) + 1
    new_disk = next(d for d in disks if d.key not in {b.key for b in disks_before})
    assert new_disk.capacityInKB == 3 * 1024 * 1024
    assert new_disk.backing.fileName.startswith("[LocalDS_1]")
    nics: list[Any] = [d for d in devices if isinstance(d, vim.vm.device.VirtualEthernetCard)
            and isinstance(d.backing, vim.vm.device.VirtualEthernetCard.NetworkBackingInfo)]
    assert [n.backing.deviceName for n in nics] == ["VM Network"]
    assert {d["key"] for d in result["added_devices"]} == {new_disk.key, nics[0].key}


def test_reconfigure_adds_a_nic_on_a_distributed_port_group(rig: Rig) -> None:
    rig.call(RECONFIGURE, vm=VM, add_nic_network="DC0_DVPG0")

    nics: list[Any] = [d for d in _devices(rig, VM) if isinstance(d, vim.vm.device.VirtualVmxnet3)]
    assert [n.backing.port.portgroupKey for n in nics] == [rig.sim.inventory()["portgroups"][0]["moid"]]


@pytest.mark.parametrize(("args", "field"), [
    ({"add_nic_network": "no-such-network"}, "add_nic_network"),
    ({"add_disk_gb": 1, "datastore": "no-such-ds"}, "datastore"),
    ({"add_disk_gb": 60000}, "add_disk_gb"),
    ({"memory_mb": 1030}, "memory_mb"),
    ({"cpu_count": 700}, "cpu_count"),
    ({"datastore": "LocalDS_0"}, "datastore"),
    ({}, "arguments"),
])
def test_reconfigure_refuses_bad_arguments_in_plan_naming_the_field(rig: Rig, args: dict[str, Any],
                                                                      field: str) -> None:
    _power_off(rig, VM)
    before = _devices(rig, VM)

    error = _refused_before_any_task(rig, RECONFIGURE, errors.InvalidArgument, vm=VM, **args)

    assert error.details["field"] == field
    assert [d.key for d in _devices(rig, VM)] == [d.key for d in before]


def test_reconfigure_sizes_outside_the_schema_are_refused_by_validation() -> None:
    for args in ({"cpu_count": 0}, {"memory_mb": 2}, {"add_disk_gb": 0}, {"cpu_count": True}):
        with pytest.raises(errors.InvalidArgument):
            RECONFIGURE.validate({"target": "sim", "vm": VM, **args})


def test_reconfigure_refuses_cpu_changes_on_a_powered_on_vm_without_hot_add(rig: Rig) -> None:
    error = _refused_before_any_task(rig, RECONFIGURE, errors.InvalidState, vm=VM, cpu_count=2)
    assert "power it off" in error.message
    error = _refused_before_any_task(rig, RECONFIGURE, errors.InvalidState, vm=VM, memory_mb=16)
    assert "power it off" in error.message


def test_the_simulator_survives_a_refused_unknown_network(rig: Rig) -> None:
    _refused_before_any_task(rig, RECONFIGURE, errors.InvalidArgument, vm=VM, add_nic_network="nope")
    rig.call(RECONFIGURE, vm=VM, add_nic_network="VM Network")  # would hang if the bad spec had been sent
    assert any(isinstance(d, vim.vm.device.VirtualVmxnet3) for d in _devices(rig, VM))


# --------------------------------------------------------------------------------------------------
# ISO images


def _cdrom_backings(rig: Rig, name: str) -> list[Any]:
    return [d.backing for d in _devices(rig, name) if isinstance(d, vim.vm.device.VirtualCdrom)]


def test_mount_and_unmount_an_iso(rig: Rig) -> None:
    result = rig.call(MOUNT_ISO, vm=VM, iso_path="[LocalDS_1] isos/tools.iso")

    (backing,) = _cdrom_backings(rig, VM)
    assert isinstance(backing, vim.vm.device.VirtualCdrom.IsoBackingInfo)
    assert backing.fileName == "[LocalDS_1] isos/tools.iso"
    assert result["cdrom_added"] is False

    result = rig.call(UNMOUNT_ISO, vm=VM)
    (backing,) = _cdrom_backings(rig, VM)
    assert not isinstance(backing, vim.vm.device.VirtualCdrom.IsoBackingInfo)
    assert result["unmounted"] == ["[LocalDS_1] isos/tools.iso"]
    _refused_before_any_task(rig, UNMOUNT_ISO, errors.InvalidState, vm=VM)


@pytest.mark.parametrize("iso_path", ["[no-such-ds] a.iso", "a.iso", "[LocalDS_0] a.img"])
def test_mount_iso_refuses_a_bad_path_or_datastore(rig: Rig, iso_path: str) -> None:
    error = _refused_before_any_task(rig, MOUNT_ISO, errors.InvalidArgument, vm=VM, iso_path=iso_path)
    assert error.details["field"] == "iso_path"


# --------------------------------------------------------------------------------------------------
# Migrate and clone


def _host_of(rig: Rig, name: str) -> str:
    # The simulator's relocate leaves host.vm alone; the VM's own runtime.host is what moves.
    return str(rig.props(rig.vm(name), "runtime.host")["runtime.host"].name)


def test_migrate_to_another_host_of_the_cluster(rig: Rig) -> None:
    current = _host_of(rig, CLUSTER_VM)
    other = "DC0_C0_H1" if current == "DC0_C0_H0" else "DC0_C0_H0"

    result = rig.call(MIGRATE, vm=CLUSTER_VM, host=other)

    assert _host_of(rig, CLUSTER_VM) == other == result["host"]


def test_migrate_to_another_datastore_and_to_a_standalone_host(rig: Rig) -> None:
    rig.call(MIGRATE, vm=CLUSTER_VM, datastore="LocalDS_1")
    stores = rig.props(rig.vm(CLUSTER_VM), "datastore")["datastore"]
    assert [s.name for s in stores] == ["LocalDS_1"]

    plan = rig.plan(MIGRATE, vm=CLUSTER_VM, host="DC0_H0")
    assert plan.params["pool"]  # another compute resource: its root pool
    rig.execute(MIGRATE, plan)
    assert _host_of(rig, CLUSTER_VM) == "DC0_H0"
    assert rig.props(rig.vm(CLUSTER_VM), "resourcePool")["resourcePool"]._moId == plan.params["pool"]


@pytest.mark.parametrize(("args", "field"), [
    ({"host": "no-such-host"}, "host"),
    ({"datastore": "no-such-ds"}, "datastore"),
    ({"datastore": "LocalDS_0"}, "datastore"),
    ({"resource_pool": "no-such-pool"}, "resource_pool"),
    ({}, "arguments"),
])
def test_migrate_refuses_bad_destinations_naming_the_field(rig: Rig, args: dict[str, Any],
                                                           field: str) -> None:
    error = _refused_before_any_task(rig, MIGRATE, errors.InvalidArgument, vm=CLUSTER_VM, **args)
    assert error.details["field"] == field


def test_migrate_refuses_a_host_in_maintenance_or_disconnected(rig: Rig) -> None:
    rig.sim.control("/host/connection-state", {"host": "DC0_C0_H1", "state": "disconnected"})
    error = _refused_before_any_task(rig, MIGRATE, errors.InvalidArgument, vm=CLUSTER_VM, host="DC0_C0_H1")
    assert "disconnected" in error.message


def test_clone_creates_a_vm_in_the_sources_folder_and_powers_it_on(rig: Rig) -> None:
    plan = rig.plan(CLONE, vm=CLUSTER_VM, name="web-clone", power_on=True)
    assert [a.name for a in plan.affected] == [CLUSTER_VM, "web-clone"]

    result = rig.execute(CLONE, plan)

    clone = rig.vm("web-clone")
    assert result["clone"]["moid"] == clone._moId and result["clone"]["folder"] == "/DC0/vm"
    source_folder = rig.props(rig.vm(CLUSTER_VM), "parent")["parent"]
    assert rig.props(clone, "parent")["parent"]._moId == source_folder._moId
    assert rig.power("web-clone") == "poweredOn"
    assert result["powered_on"] is True


def test_clone_onto_another_datastore_stays_powered_off(rig: Rig) -> None:
    rig.call(CLONE, vm=VM, name="copy", datastore="LocalDS_1")
    path = rig.props(rig.vm("copy"), "config.files.vmPathName")["config.files.vmPathName"]
    assert path.startswith("[LocalDS_1]")
    assert rig.power("copy") == "poweredOff"


@pytest.mark.parametrize(("args", "field"), [
    ({"name": CLUSTER_VM}, "name"),
    ({"name": "DC0_H0_VM1"}, "name"),
    ({"name": "new", "folder": "no-such-folder"}, "folder"),
    ({"name": "new", "datastore": "no-such-ds"}, "datastore"),
    ({"name": "x" * 81}, "name"),
])
def test_clone_refuses_a_used_name_or_bad_placement(rig: Rig, args: dict[str, Any], field: str) -> None:
    before = rig.vm_names()
    error = _refused_before_any_task(rig, CLONE, errors.InvalidArgument, vm=CLUSTER_VM, **args)
    assert error.details["field"] == field
    assert rig.vm_names() == before


@pytest.mark.parametrize(("spec", "args"), [
    (CLONE, {"name": "copy"}), (MIGRATE, {"datastore": "LocalDS_0"}),
])
def test_clone_and_migrate_need_a_vcenter(make_simulator: Callable[..., Simulator], spec: ToolSpec,
                                          args: dict[str, Any]) -> None:
    rigs = start_rig(make_simulator, model="esx", standalone_hosts=0, datastores=1)
    try:
        with pytest.raises(errors.NotSupported) as caught:
            next(rigs).plan(spec, vm="ha-host_VM0", **args)
        assert "standalone ESXi host" in caught.value.message
    finally:
        rigs.close()
