"""gateway.vsphere.actions.hardware: the checks a reconfigure, an ISO mount and a disk removal make."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from pyVmomi import vim

from gateway import errors
from gateway.vsphere.actions.hardware import (
    _DATASTORE_PATH,
    _HOT_RULES,
    _IDE_UNITS,
    _SCSI_UNITS,
    _cdroms,
    _check_hot_change,
    _device_row,
    _find_disk,
    _free_slot,
    _plan_cpu_memory,
    _VmConfig,
    parse_iso_path,
)
from gateway.vsphere.resolve import VmRef

ON = VmRef("vm-1", "web", "/DC0/vm", None, "esx-1", "connected", "poweredOn")
OFF = replace(ON, power_state="poweredOff")
CONFIG = _VmConfig(cpus=2, memory_mb=4096, cpu_hot_add=False, cpu_hot_remove=False, memory_hot_add=False,
                   devices=[], home_datastore="datastore1")
HOST = {"name": "esx-1", "threads": 8, "memory_mb": 16384}


def label(text: str) -> Any:
    return vim.Description(label=text, summary="")


def scsi(key: int) -> Any:
    return vim.vm.device.ParaVirtualSCSIController(key=key, busNumber=0, sharedBus="noSharing")


def at(device: Any, controller: int, unit: int) -> Any:
    device.controllerKey, device.unitNumber = controller, unit
    return device


def disk(key: int, text: str | None = None, file: str = "[ds1] web/web.vmdk") -> Any:
    return vim.vm.device.VirtualDisk(
        key=key, capacityInKB=1024, deviceInfo=label(text) if text else None,
        backing=vim.vm.device.VirtualDisk.FlatVer2BackingInfo(fileName=file, diskMode="persistent"))


# --------------------------------------------------------------------------- CPU and memory


def test_units_leave_out_the_scsi_controllers_own_slot() -> None:
    assert 7 not in _SCSI_UNITS and len(_SCSI_UNITS) == 15
    assert _IDE_UNITS == (0, 1)


def test_cpu_and_memory_changes_are_planned_with_words() -> None:
    params, words = _plan_cpu_memory(OFF, CONFIG, HOST, {"cpu_count": 4, "memory_mb": 8192})
    assert params == {"cpu_count": 4, "memory_mb": 8192}
    assert words == ["CPU count 2 -> 4", "memory 4096 -> 8192 MB"]


def test_nothing_asked_nothing_planned() -> None:
    assert _plan_cpu_memory(OFF, CONFIG, HOST, {}) == ({}, [])


@pytest.mark.parametrize(("args", "message"), [
    ({"memory_mb": 4098}, "memory_mb: must be a multiple of 4 MB"),
    ({"cpu_count": 2}, "cpu_count: VM 'web' (vm-1) already has 2; give another value"),
    ({"memory_mb": 4096}, "memory_mb: VM 'web' (vm-1) already has 4096; give another value"),
    ({"cpu_count": 9}, "cpu_count: 9 exceeds the 8 logical CPUs of host 'esx-1'"),
    ({"memory_mb": 32768}, "memory_mb: 32768 exceeds the 16384 MB of memory of host 'esx-1'"),
])
def test_bad_cpu_and_memory_values(args: dict[str, int], message: str) -> None:
    with pytest.raises(errors.InvalidArgument) as raised:
        _plan_cpu_memory(OFF, CONFIG, HOST, args)
    assert raised.value.message == message


def test_a_host_without_known_limits_limits_nothing() -> None:
    params, _words = _plan_cpu_memory(OFF, CONFIG, {}, {"cpu_count": 64})
    assert params == {"cpu_count": 64}


@pytest.mark.parametrize(("rule", "config", "old", "new", "allowed"), [
    (0, CONFIG, 2, 4, False),
    (0, replace(CONFIG, cpu_hot_add=True), 2, 4, True),
    (0, replace(CONFIG, cpu_hot_add=True), 4, 2, False),
    (0, replace(CONFIG, cpu_hot_remove=True), 4, 2, True),
    (1, replace(CONFIG, memory_hot_add=True), 4096, 8192, True),
    (1, replace(CONFIG, memory_hot_add=True), 8192, 4096, False),
    (1, CONFIG, 4096, 8192, False),
])
def test_hot_changes_of_a_powered_on_vm(rule: int, config: _VmConfig, old: int, new: int,
                                        allowed: bool) -> None:
    if allowed:
        _check_hot_change(ON, config, _HOT_RULES[rule], old, new)
        return
    with pytest.raises(errors.InvalidState) as raised:
        _check_hot_change(ON, config, _HOT_RULES[rule], old, new)
    assert raised.value.details["field"] == _HOT_RULES[rule].field
    assert "while it is powered on" in raised.value.message


def test_the_hot_change_refusal_says_what_to_do() -> None:
    with pytest.raises(errors.InvalidState) as raised:
        _check_hot_change(ON, CONFIG, _HOT_RULES[0], 2, 1)
    assert raised.value.message == ("cannot lower the CPU count of VM 'web' (vm-1) while it is powered on: "
                                    "hot remove is not enabled for it; power it off first (power_off_vm)")


def test_a_powered_off_vm_changes_freely() -> None:
    _check_hot_change(OFF, CONFIG, _HOT_RULES[1], 8192, 1024)
    assert _plan_cpu_memory(OFF, CONFIG, HOST, {"memory_mb": 1024})[0] == {"memory_mb": 1024}


def test_a_powered_on_vm_shrinking_memory_is_refused_in_the_plan() -> None:
    with pytest.raises(errors.InvalidState):
        _plan_cpu_memory(ON, replace(CONFIG, memory_hot_add=True), HOST, {"memory_mb": 2048})


# --------------------------------------------------------------------------- free slots


def test_the_first_free_unit_on_the_first_controller() -> None:
    devices = [scsi(1001), scsi(1000), at(disk(2000), 1000, 0), at(disk(2001), 1000, 1)]
    assert _free_slot(devices, vim.vm.device.VirtualSCSIController, _SCSI_UNITS) == (1000, 2)


def test_a_full_controller_passes_to_the_next() -> None:
    full = [at(disk(2000 + u), 1000, u) for u in _SCSI_UNITS]
    devices = [scsi(1000), scsi(1001), *full]
    assert _free_slot(devices, vim.vm.device.VirtualSCSIController, _SCSI_UNITS) == (1001, 0)


def test_no_controller_no_slot() -> None:
    assert _free_slot([disk(2000)], vim.vm.device.VirtualIDEController, _IDE_UNITS) is None


def test_every_slot_taken() -> None:
    ide = vim.vm.device.VirtualIDEController(key=200, busNumber=0)
    devices = [ide, at(vim.vm.device.VirtualCdrom(key=3000), 200, 0), at(disk(3001), 200, 1)]
    assert _free_slot(devices, vim.vm.device.VirtualIDEController, _IDE_UNITS) is None


# --------------------------------------------------------------------------- devices and disks


def test_cdroms_in_key_order() -> None:
    devices = [vim.vm.device.VirtualCdrom(key=3001), disk(2000), vim.vm.device.VirtualCdrom(key=3000)]
    assert [d.key for d in _cdroms(devices)] == [3000, 3001]


def test_device_rows() -> None:
    assert _device_row(disk(2000, "Hard disk 1")) == {"label": "Hard disk 1", "key": 2000,
                                                      "file": "[ds1] web/web.vmdk"}
    assert _device_row(vim.vm.device.VirtualCdrom(key=3000)) == {"label": "3000", "key": 3000, "file": None}


DISKS = [disk(2000, "Hard disk 1"), disk(2001, "Hard disk 2"), vim.vm.device.VirtualCdrom(key=3000)]


@pytest.mark.parametrize(("ref", "key"), [("Hard disk 2", 2001), ("2000", 2000), ("2001", 2001)])
def test_a_disk_by_label_or_key(ref: str, key: int) -> None:
    assert _find_disk(OFF, DISKS, ref).key == key


@pytest.mark.parametrize("ref", ["hard disk 2", "Hard disk 3", "3000", "disk"])
def test_a_disk_the_vm_does_not_have_lists_its_disks(ref: str) -> None:
    with pytest.raises(errors.InvalidArgument) as raised:
        _find_disk(OFF, DISKS, ref)
    assert raised.value.message == (f"disk: VM 'web' (vm-1) has no disk labelled or keyed '{ref}'; its "
                                    "disks: Hard disk 1 (key 2000), Hard disk 2 (key 2001)")


def test_a_vm_without_disks() -> None:
    with pytest.raises(errors.InvalidArgument, match="its disks: none"):
        _find_disk(OFF, [], "Hard disk 1")


# --------------------------------------------------------------------------- ISO paths


@pytest.mark.parametrize(("value", "parsed"), [
    ("[datastore1] isos/ubuntu.iso", ("datastore1", "isos/ubuntu.iso")),
    ("[SAN 2] a.iso", ("SAN 2", "a.iso")),
])
def test_parse_iso_path(value: str, parsed: tuple[str, str]) -> None:
    assert parse_iso_path(value) == parsed


@pytest.mark.parametrize("value", ["isos/ubuntu.iso", "[datastore1] ../escape.iso", "[] a.iso", ""])
def test_parse_iso_path_refuses(value: str) -> None:
    with pytest.raises(errors.InvalidArgument) as raised:
        parse_iso_path(value)
    assert raised.value.details["field"] == "iso_path"


@pytest.mark.parametrize(("path", "datastore"), [
    ("[datastore1] web/web.vmx", "datastore1"), ("[ds 2]web/web.vmx", "ds 2"), ("web/web.vmx", None),
    ("[a[b] x", None), ("[ds1] ", None),
])
def test_home_datastore_of_a_vmx_path(path: str, datastore: str | None) -> None:
    found = _DATASTORE_PATH.match(path)
    assert (found.group("datastore") if found else None) == datastore
