"""gateway.vsphere.details: snapshot trees, device rows and guest NICs decoded from pyVmomi values."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from pyVmomi import vim

from gateway.vsphere.details import _device_rows, _guest_nics, _names, _one, flatten_snapshots
from gateway.vsphere.soap_scan import ObjectProps

WHEN = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def node(moid: str, name: str, *children: Any, description: str = "") -> Any:
    return vim.vm.SnapshotTree(snapshot=vim.vm.Snapshot(moid), name=name, description=description, id=1,
                               createTime=WHEN, state="poweredOff", quiesced=False,
                               childSnapshotList=list(children))


def test_flatten_snapshots_depth_first_with_parents() -> None:
    roots = [node("snapshot-1", "base", node("snapshot-2", "mid", node("snapshot-3", "top")),
                  node("snapshot-4", "side"), description="first"),
             node("snapshot-5", "other")]
    rows = flatten_snapshots(roots, "snapshot-3")
    assert [(r["moid"], r["parent"], r["depth"], r["current"]) for r in rows] == [
        ("snapshot-1", None, 0, False), ("snapshot-2", "snapshot-1", 1, False),
        ("snapshot-3", "snapshot-2", 2, True), ("snapshot-4", "snapshot-1", 1, False),
        ("snapshot-5", None, 0, False)]
    assert rows[0] == {"moid": "snapshot-1", "name": "base", "description": "first",
                       "created": "2026-01-01T12:00:00+00:00", "state": "poweredOff", "quiesced": False,
                       "parent": None, "depth": 0, "current": False, "id": 1}


def test_no_snapshots() -> None:
    assert flatten_snapshots([], None) == []


def test_no_current_snapshot_marks_none() -> None:
    assert [r["current"] for r in flatten_snapshots([node("snapshot-1", "a")], None)] == [False]


def label(text: str) -> Any:
    return vim.Description(label=text, summary="")


def connected(on: bool) -> Any:
    return vim.vm.device.VirtualDevice.ConnectInfo(connected=on, startConnected=on, allowGuestControl=True)


def test_device_rows_by_kind() -> None:
    flat = vim.vm.device.VirtualDisk.FlatVer2BackingInfo(fileName="[ds1] a/a.vmdk", diskMode="persistent",
                                                         thinProvisioned=True)
    named = vim.vm.device.VirtualEthernetCard.NetworkBackingInfo(deviceName="VM Network")
    port = vim.vm.device.VirtualEthernetCard.DistributedVirtualPortBackingInfo(
        port=vim.dvs.PortConnection(portgroupKey="dvportgroup-9", switchUuid="u"))
    iso = vim.vm.device.VirtualCdrom.IsoBackingInfo(fileName="[ds1] x.iso")
    devices = [
        vim.vm.device.VirtualDisk(key=2000, capacityInKB=2 * 1024 * 1024, deviceInfo=label("Hard disk 1"),
                                  backing=flat),
        vim.vm.device.VirtualVmxnet3(key=4000, macAddress="00:50:56:00:00:01",
                                     deviceInfo=label("Network adapter 1"), connectable=connected(True),
                                     backing=named),
        vim.vm.device.VirtualE1000(key=4001, macAddress="00:50:56:00:00:02", connectable=connected(False),
                                   backing=port),
        vim.vm.device.VirtualCdrom(key=3000, deviceInfo=label("CD/DVD drive 1"), connectable=connected(True),
                                   backing=iso),
        vim.vm.device.VirtualIDEController(key=200, busNumber=0),
    ]
    rows = _device_rows(devices, {"dvportgroup-9": "prod-pg"})
    assert rows["disks"] == [{"label": "Hard disk 1", "key": 2000, "capacity_mb": 2048,
                              "file": "[ds1] a/a.vmdk", "thin": True}]
    assert rows["nics"] == [
        {"label": "Network adapter 1", "key": 4000, "mac": "00:50:56:00:00:01", "connected": True,
         "network": "VM Network", "portgroup_key": None, "adapter": "VirtualVmxnet3"},
        {"label": "4001", "key": 4001, "mac": "00:50:56:00:00:02", "connected": False, "network": "prod-pg",
         "portgroup_key": "dvportgroup-9", "adapter": "VirtualE1000"},
    ]
    assert rows["cdroms"] == [{"label": "CD/DVD drive 1", "key": 3000, "connected": True,
                               "iso": "[ds1] x.iso"}]


def test_an_opaque_network_nic_is_named_by_its_network() -> None:
    nic = vim.vm.device.VirtualVmxnet3(key=4000, backing=vim.vm.device.VirtualEthernetCard.NetworkBackingInfo(
        network=vim.Network("network-7")))
    assert _device_rows([nic], {"network-7": "lab"})["nics"][0]["network"] == "lab"
    assert _device_rows([nic], {})["nics"][0]["network"] == "network-7"


def test_no_devices() -> None:
    assert _device_rows([], {}) == {"disks": [], "nics": [], "cdroms": []}


def test_guest_nics() -> None:
    nets = [vim.vm.GuestInfo.NicInfo(network="VM Network", macAddress="aa", connected=True,
                                     ipAddress=["10.0.0.1", "fe80::1"], deviceConfigId=4000),
            vim.vm.GuestInfo.NicInfo(macAddress="bb", connected=False, deviceConfigId=4001)]
    assert _guest_nics(nets) == [
        {"network": "VM Network", "mac": "aa", "connected": True, "ip_addresses": ["10.0.0.1", "fe80::1"]},
        {"network": None, "mac": "bb", "connected": False, "ip_addresses": []}]
    assert _guest_nics(None) == []


def test_one_and_names() -> None:
    objects = [ObjectProps("Datastore", "ds-1", {"name": "alpha"}), ObjectProps("Network", "network-1", {}),
               ObjectProps("HostSystem", "host-1", {"name": "esx"})]
    assert _one(objects, "ds-1") == {"name": "alpha"}
    assert _one(objects, "nothing") == {}
    assert _names(objects, ("Datastore", "Network")) == {"ds-1": "alpha", "network-1": "network-1"}
