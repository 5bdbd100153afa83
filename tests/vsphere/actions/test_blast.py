"""gateway.vsphere.actions.blast: what a destructive proposal affects, as plain values."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from pyVmomi import vim

from gateway.vsphere.actions.blast import _disks, _size, _snapshot_count, many_vms
from gateway.vsphere.resolve import VmRef

GB = 1024 * 1024


def disk(key: int, kb: int, file: str, label: str | None = None) -> Any:
    return vim.vm.device.VirtualDisk(
        key=key, capacityInKB=kb, controllerKey=1000, unitNumber=key - 2000,
        deviceInfo=vim.Description(label=label, summary="") if label else None,
        backing=vim.vm.device.VirtualDisk.FlatVer2BackingInfo(fileName=file, diskMode="persistent"))


def node(moid: str, *children: Any) -> Any:
    return vim.vm.SnapshotTree(snapshot=vim.vm.Snapshot(moid), name=moid, state="poweredOff",
                               quiesced=False, id=1, createTime=datetime(2026, 1, 1, tzinfo=UTC),
                               childSnapshotList=list(children))


@pytest.mark.parametrize(("kb", "text"), [
    (0, "0 KB"), (512, "512 KB"), (1023, "1023 KB"), (1024, "1 MB"), (512 * 1024, "512 MB"),
    (40 * GB, "40 GB"), (1536 * 1024, "1.5 GB"), (int(1.5 * 1024 * GB), "1.5 TB"), (1024 * GB, "1 TB"),
    (100 * GB + 1, "100 GB"), (123456789, "118 GB"),
])
def test_sizes_for_people(kb: int, text: str) -> None:
    assert _size(kb) == text


def test_snapshot_count_walks_the_whole_tree() -> None:
    tree = vim.vm.SnapshotInfo(rootSnapshotList=[
        node("snapshot-1", node("snapshot-2", node("snapshot-3")), node("snapshot-4")), node("snapshot-5")])
    assert _snapshot_count(tree) == 5


@pytest.mark.parametrize("info", [None, vim.vm.SnapshotInfo()])
def test_no_snapshots(info: Any) -> None:
    assert _snapshot_count(info) == 0


def test_disks_with_size_and_datastore() -> None:
    devices = [
        disk(2000, 40 * GB, "[datastore1] web/web.vmdk", "Hard disk 1"),
        vim.vm.device.VirtualCdrom(key=3000),
        disk(2001, 2048, "web/no-datastore.vmdk"),
        disk(2002, 0, "", "Hard disk 3"),
    ]
    assert _disks(devices) == [
        {"label": "Hard disk 1", "capacity_kb": 40 * GB, "size": "40 GB", "datastore": "datastore1"},
        {"label": "disk 2001", "capacity_kb": 2048, "size": "2 MB", "datastore": None},
        {"label": "Hard disk 3", "capacity_kb": 0, "size": "0 KB", "datastore": None},
    ]


def test_a_datastore_name_with_spaces() -> None:
    (row,) = _disks([disk(2000, GB, "[SAN volume 2] a/a.vmdk", "Hard disk 1")])
    assert row["datastore"] == "SAN volume 2"


def test_no_devices() -> None:
    assert _disks([]) == []


def test_many_vms_lists_each_as_resolved() -> None:
    vms = [VmRef("vm-1", "a", "/DC0/vm", None, "esx-1", "connected", "poweredOn"),
           VmRef("vm-2", "b", "/DC0/vm", None, None, "connected", "poweredOff")]
    assert many_vms(vms) == {"count": 2, "objects": [
        {"name": "a", "moid": "vm-1", "power_state": "poweredOn", "host": "esx-1"},
        {"name": "b", "moid": "vm-2", "power_state": "poweredOff", "host": None}]}
    assert many_vms([]) == {"count": 0, "objects": []}
