"""The blast radius of a destructive proposal: what it will affect, read live when planned and re-planned.

Plain JSON facts the proposal shows and its digest binds every approval to (``shown_digest``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import pyVmomi

from gateway.vsphere.actions.planning import _moid, _read
from gateway.vsphere.resolve import VmRef

vim: Any = pyVmomi.vim  # pyVmomi's constructors are untyped

_PATHS = ("runtime.powerState", "runtime.host", "config.hardware.device", "snapshot")
_DATASTORE = re.compile(r"^\[([^\]]+)\]")


def _snapshot_count(info: Any) -> int:
    stack = list(getattr(info, "rootSnapshotList", None) or ())
    count = 0
    while stack:
        node = stack.pop()
        count += 1
        stack.extend(node.childSnapshotList or ())
    return count


def _disks(devices: Sequence[Any]) -> list[dict[str, Any]]:
    out = []
    for disk in devices:
        if not isinstance(disk, vim.vm.device.VirtualDisk):
            continue
        file = str(getattr(disk.backing, "fileName", "") or "")
        found = _DATASTORE.match(file)
        kb = int(disk.capacityInKB or 0)
        out.append({
            "label": disk.deviceInfo.label if disk.deviceInfo is not None else f"disk {disk.key}",
            "capacity_kb": kb, "size": _size(kb),
            "datastore": found[1] if found else None,
        })
    return out


def _size(kb: int) -> str:
    """A disk's capacity for people: ``40 GB``, ``1.5 TB``, ``512 MB``."""
    for unit, scale in (("TB", 1024 ** 3), ("GB", 1024 ** 2), ("MB", 1024)):
        if kb >= scale:
            return f"{kb / scale:.3g} {unit}"
    return f"{kb} KB"


def vm_blast(session: Any, vm: VmRef) -> dict[str, Any]:
    """One VM's facts, read now (not from a cache): power state, host, cluster, snapshots and disks."""
    props = _read(session, vim.VirtualMachine, vm.moid, _PATHS)
    host = _moid(props.get("runtime.host"))
    return {
        "name": vm.name, "moid": vm.moid,
        "power_state": props.get("runtime.powerState") or vm.power_state,
        "host": vm.host if host in (None, vm.host_moid) else host,
        "cluster": vm.cluster,
        "snapshot_count": _snapshot_count(props.get("snapshot")),
        "disks": _disks(props.get("config.hardware.device") or ()),
    }


def one_vm(session: Any, vm: VmRef) -> dict[str, Any]:
    """The blast radius of a change to one VM."""
    return {"count": 1, "objects": [vm_blast(session, vm)]}


def many_vms(vms: Sequence[VmRef]) -> dict[str, Any]:
    """The blast radius of a bulk call: the count and each VM as resolved for this plan."""
    return {"count": len(vms), "objects": [{"name": vm.name, "moid": vm.moid, "power_state": vm.power_state,
                                             "host": vm.host} for vm in vms]}
