"""A VM's hardware: reconfigure it, mount and unmount an ISO image, and remove a disk."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyVmomi

from gateway import errors
from gateway.guard import datastore_path
from gateway.vocabulary import AffectedObject, Plan
from gateway.vsphere.actions.blast import one_vm
from gateway.vsphere.actions.execution import Execution, _executor
from gateway.vsphere.actions.planning import (
    Args,
    _argument,
    _datastore_on_host,
    _host_facts,
    _label,
    _moid,
    _moids,
    _on,
    _read,
    _resolve_vm,
    _state_after_policy,
    _vm_params,
    vm_affected,
)
from gateway.vsphere.actions.safety import SafetyTarget, _maybe_safety
from gateway.vsphere.resolve import NetworkRef, VmRef, resolve_network

vim: Any = pyVmomi.vim  # pyVmomi's constructors are untyped
KB_PER_GB = 1024 * 1024
_SCSI_UNITS = tuple(u for u in range(16) if u != 7)  # unit 7 is the SCSI controller itself
_IDE_UNITS = (0, 1)


# --------------------------------------------------------------------------------------------------
# Reconfigure: CPU, memory, one new disk, one new NIC; nothing else


_VM_CONFIG_PATHS = (
    "config.hardware.numCPU", "config.hardware.memoryMB", "config.cpuHotAddEnabled",
    "config.cpuHotRemoveEnabled", "config.memoryHotAddEnabled", "config.hardware.device",
    "config.files.vmPathName",
)
_DATASTORE_PATH = re.compile(r"^\[(?P<datastore>[^\[\]]+)\]\s*(?P<path>\S.*)$")


@dataclass(frozen=True)
class _VmConfig:
    cpus: int
    memory_mb: int
    cpu_hot_add: bool
    cpu_hot_remove: bool
    memory_hot_add: bool
    devices: list[Any]
    home_datastore: str | None


def _vm_config(session: Any, moid: str) -> _VmConfig:
    p = _read(session, vim.VirtualMachine, moid, _VM_CONFIG_PATHS)
    home = _DATASTORE_PATH.match(p.get("config.files.vmPathName") or "")
    return _VmConfig(
        cpus=int(p.get("config.hardware.numCPU") or 0), memory_mb=int(p.get("config.hardware.memoryMB") or 0),
        cpu_hot_add=bool(p.get("config.cpuHotAddEnabled")),
        cpu_hot_remove=bool(p.get("config.cpuHotRemoveEnabled")),
        memory_hot_add=bool(p.get("config.memoryHotAddEnabled")),
        devices=list(p.get("config.hardware.device") or []),
        home_datastore=home.group("datastore") if home else None)


@dataclass(frozen=True)
class _HotRule:
    """When a powered-on VM may change a value: growing needs ``grow`` enabled, shrinking ``shrink``."""

    field: str
    what: str
    grow: Callable[[_VmConfig], bool]
    shrink: Callable[[_VmConfig], bool]


_HOT_RULES = (
    _HotRule("cpu_count", "CPU count", lambda c: c.cpu_hot_add, lambda c: c.cpu_hot_remove),
    _HotRule("memory_mb", "memory", lambda c: c.memory_hot_add, lambda _c: False),
)


def _check_hot_change(vm: VmRef, config: _VmConfig, rule: _HotRule, old: int, new: int) -> None:
    if vm.power_state != "poweredOn":
        return
    allowed = rule.grow(config) if new > old else rule.shrink(config)
    if not allowed:
        direction = "raise" if new > old else "lower"
        raise errors.InvalidState(
            f"cannot {direction} the {rule.what} of {_label(vm)} while it is powered on: hot "
            f"{'add' if new > old else 'remove'} is not enabled for it; power it off first (power_off_vm)",
            moid=vm.moid, field=rule.field)


def _plan_cpu_memory(
    vm: VmRef, config: _VmConfig, host: Mapping[str, Any], args: Args
) -> tuple[dict[str, Any], list[str]]:
    params: dict[str, Any] = {}
    words: list[str] = []
    for rule, key, current, limit, unit in (
        (_HOT_RULES[0], "cpu_count", config.cpus, host.get("threads"), "logical CPUs"),
        (_HOT_RULES[1], "memory_mb", config.memory_mb, host.get("memory_mb"), "MB of memory"),
    ):
        value = args.get(key)
        if value is None:
            continue
        if key == "memory_mb" and value % 4:
            raise errors.InvalidArgument(key, "must be a multiple of 4 MB")
        if value == current:
            raise errors.InvalidArgument(key, f"{_label(vm)} already has {value}; give another value")
        if limit and value > limit:
            raise errors.InvalidArgument(key, f"{value} exceeds the {limit} {unit} of host '{host['name']}'")
        _check_hot_change(vm, config, rule, current, value)
        params[key] = int(value)
        words.append(f"{rule.what} {current} -> {value}" + (" MB" if key == "memory_mb" else ""))
    return params, words


def _free_slot(devices: Sequence[Any], controller_type: Any, units: Sequence[int]) -> tuple[int, int] | None:
    """The first (controller key, unit number) free on a controller of ``controller_type``."""
    for controller in sorted((d for d in devices if isinstance(d, controller_type)), key=lambda d: d.key):
        used = {d.unitNumber for d in devices if d.controllerKey == controller.key}
        free = next((u for u in units if u not in used), None)
        if free is not None:
            return controller.key, free
    return None


def _plan_disk(
    session: Any, vm: VmRef, config: _VmConfig, host: Mapping[str, Any], args: Args
) -> dict[str, Any]:
    size_gb = int(args["add_disk_gb"])
    ref = args.get("datastore") or config.home_datastore
    if ref is None:
        raise errors.InvalidArgument("datastore", f"{_label(vm)} has no home datastore to default to")
    ds = _datastore_on_host(session, "datastore", str(ref), host)
    if ds.free_bytes is not None and size_gb * 1024**3 > ds.free_bytes:
        raise errors.InvalidArgument(
            "add_disk_gb",
            f"{size_gb} GB exceeds the {ds.free_bytes // 1024**3} GB free on datastore '{ds.name}'")
    slot = _free_slot(config.devices, vim.vm.device.VirtualSCSIController, _SCSI_UNITS)
    if slot is None:
        raise errors.InvalidState(f"{_label(vm)} has no SCSI controller with a free slot for another disk",
                                  moid=vm.moid)
    return {"size_gb": size_gb, "datastore": ds.moid, "datastore_name": ds.name,
            "controller_key": slot[0], "unit_number": slot[1]}


def _plan_nic(session: Any, vm: VmRef, host: Mapping[str, Any], ref: str) -> dict[str, Any]:
    net = _argument("add_nic_network", resolve_network, session, ref)
    if host and net.moid not in host["networks"]:
        raise errors.InvalidArgument(
            "add_nic_network", f"network '{net.name}' is not available on host '{host['name']}' where "
            f"{_label(vm)} runs")
    nic: dict[str, Any] = {"network": net.moid, "network_name": net.name, "type": net.type}
    if net.type == "dvs.DistributedVirtualPortgroup":
        nic.update(_portgroup_facts(session, net))
    elif net.type != "Network":
        raise errors.InvalidArgument("add_nic_network", f"network '{net.name}' is a {net.type}; only "
                                     "standard networks and distributed port groups are supported")
    return nic


def _portgroup_facts(session: Any, net: NetworkRef) -> dict[str, Any]:
    p = _read(session, vim.dvs.DistributedVirtualPortgroup, net.moid,
              ("key", "config.distributedVirtualSwitch", "config.uplink"))
    if p.get("config.uplink"):
        raise errors.InvalidArgument("add_nic_network", f"'{net.name}' is an uplink port group, not for VMs")
    switch = _moid(p.get("config.distributedVirtualSwitch"))
    if switch is None:
        raise errors.InvalidArgument("add_nic_network", f"port group '{net.name}' has no distributed switch")
    dvs = _read(session, vim.DistributedVirtualSwitch, switch, ("uuid", "config.uplinkPortgroup"))
    if net.moid in _moids(dvs.get("config.uplinkPortgroup")):
        raise errors.InvalidArgument("add_nic_network", f"'{net.name}' is an uplink port group, not for VMs")
    uuid = dvs.get("uuid")
    return {"portgroup_key": p.get("key") or net.moid, "switch_uuid": uuid}


@_state_after_policy
def plan_reconfigure(session: Any, args: Args) -> Plan:
    """Plan CPU/memory changes, one new disk and one new NIC, each checked against the VM and its host."""
    if args.get("datastore") is not None and args.get("add_disk_gb") is None:
        raise errors.InvalidArgument("datastore", "only used with add_disk_gb (where to create the new disk)")
    if all(args.get(k) is None for k in ("cpu_count", "memory_mb", "add_disk_gb", "add_nic_network")):
        raise errors.InvalidArgument("arguments", "give at least one of cpu_count, memory_mb, add_disk_gb, "
                                     "add_nic_network")
    vm = _resolve_vm(session, args, "reconfiguring")
    config = _vm_config(session, vm.moid)
    host = _host_facts(session, vm.host_moid)
    params, words = _plan_cpu_memory(vm, config, host, args)
    if args.get("add_disk_gb") is not None:
        params["disk"] = _plan_disk(session, vm, config, host, args)
        disk = params["disk"]
        words.append(f"add a {disk['size_gb']} GB disk on datastore '{disk['datastore_name']}'")
    if args.get("add_nic_network") is not None:
        params["nic"] = _plan_nic(session, vm, host, str(args["add_nic_network"]))
        words.append(f"add a network adapter on '{params['nic']['network_name']}'")
    params.update(_vm_params(vm, args))
    return Plan(_on(session, f"Reconfigure {_label(vm)}: {'; '.join(words)}"), (vm_affected(vm),), params)


def _disk_spec(call: Execution, disk: Mapping[str, Any]) -> Any:
    backing = vim.vm.device.VirtualDisk.FlatVer2BackingInfo(
        fileName=f"[{disk['datastore_name']}]", diskMode="persistent", thinProvisioned=True,
        datastore=call.obj(vim.Datastore, disk["datastore"]))
    device = vim.vm.device.VirtualDisk(
        key=-101, controllerKey=disk["controller_key"], unitNumber=disk["unit_number"],
        capacityInKB=disk["size_gb"] * KB_PER_GB, backing=backing)
    return vim.vm.device.VirtualDeviceSpec(operation="add", fileOperation="create", device=device)


def _nic_backing(call: Execution, nic: Mapping[str, Any]) -> Any:
    if nic["type"] == "Network":
        return vim.vm.device.VirtualEthernetCard.NetworkBackingInfo(
            deviceName=nic["network_name"], network=call.obj(vim.Network, nic["network"]))
    port = vim.dvs.PortConnection(switchUuid=nic["switch_uuid"], portgroupKey=nic["portgroup_key"])
    return vim.vm.device.VirtualEthernetCard.DistributedVirtualPortBackingInfo(port=port)


def _nic_spec(call: Execution, nic: Mapping[str, Any]) -> Any:
    device = vim.vm.device.VirtualVmxnet3(
        key=-102, addressType="generated", backing=_nic_backing(call, nic),
        connectable=vim.vm.device.VirtualDevice.ConnectInfo(startConnected=True, connected=True,
                                                            allowGuestControl=True))
    return vim.vm.device.VirtualDeviceSpec(operation="add", device=device)


def _device_row(device: Any) -> dict[str, Any]:
    info = device.deviceInfo
    return {"label": info.label if info is not None else str(device.key), "key": device.key,
            "file": getattr(device.backing, "fileName", None)}


@_executor
def execute_reconfigure(call: Execution) -> dict[str, Any]:
    """Apply the planned changes in one ReconfigVM_Task; report the devices it added."""
    p = call.params
    spec = vim.vm.ConfigSpec()
    if "cpu_count" in p:
        spec.numCPUs = p["cpu_count"]
    if "memory_mb" in p:
        spec.memoryMB = p["memory_mb"]
    spec.deviceChange = ([_disk_spec(call, p["disk"])] if "disk" in p else []) + (
        [_nic_spec(call, p["nic"])] if "nic" in p else [])
    before = {d.key for d in _vm_config(call.session, p["vm"]).devices}
    call.task(call.vm().ReconfigVM_Task, destructive=False, label=f"reconfigure {p['vm_name']}", spec=spec)
    after = _vm_config(call.session, p["vm"])
    added = [_device_row(d) for d in after.devices if d.key not in before]
    return call.result(vm=p["vm_name"], moid=p["vm"], cpu_count=after.cpus, memory_mb=after.memory_mb,
                       added_devices=added)


# --------------------------------------------------------------------------------------------------
# ISO images


def parse_iso_path(value: str) -> tuple[str, str]:
    """``"[datastore] folder/image.iso"`` -> (datastore, canonical path inside it), by
    ``guard.datastore_path`` (no ``..`` out of the datastore); InvalidArgument("iso_path") otherwise."""
    found = datastore_path.iso_path(value)
    return found.datastore, found.path


def _cdroms(devices: Sequence[Any]) -> list[Any]:
    return sorted((d for d in devices if isinstance(d, vim.vm.device.VirtualCdrom)), key=lambda d: d.key)


@_state_after_policy
def plan_mount_iso(session: Any, args: Args) -> Plan:
    """Plan inserting an ISO: the datastore must exist and be mounted on the VM's host; the first CD-ROM
    drive is used, or a new one is added on a free IDE slot."""
    ds_name, path = parse_iso_path(str(args["iso_path"]))
    vm = _resolve_vm(session, args, "changing CD-ROM media")
    host = _host_facts(session, vm.host_moid)
    ds = _datastore_on_host(session, "iso_path", ds_name, host)
    config = _vm_config(session, vm.moid)
    params = {**_vm_params(vm, args), "iso_path": f"[{ds.name}] {path}", "datastore": ds.moid}
    drives = _cdroms(config.devices)
    if drives:
        params["cdrom_key"] = drives[0].key
        where = f"in {drives[0].deviceInfo.label if drives[0].deviceInfo else 'its CD-ROM drive'}"
    else:
        slot = _free_slot(config.devices, vim.vm.device.VirtualIDEController, _IDE_UNITS)
        if slot is None:
            raise errors.InvalidState(f"{_label(vm)} has no CD-ROM drive and no free IDE slot to add one",
                                      moid=vm.moid)
        params["controller_key"], params["unit_number"] = slot
        where = "in a new CD-ROM drive"
    summary = f"Mount ISO '{params['iso_path']}' {where} of {_label(vm)}"
    return Plan(_on(session, summary), (vm_affected(vm),), params)


def _iso_backing(call: Execution) -> Any:
    return vim.vm.device.VirtualCdrom.IsoBackingInfo(
        fileName=call.params["iso_path"], datastore=call.obj(vim.Datastore, call.params["datastore"]))


def _connected(connected: bool) -> Any:
    return vim.vm.device.VirtualDevice.ConnectInfo(startConnected=connected, connected=connected,
                                                   allowGuestControl=True)


def _device_by_key(call: Execution, key: int) -> Any:
    device = next((d for d in _vm_config(call.session, call.params["vm"]).devices if d.key == key), None)
    if device is None:
        raise errors.NotFound(f"{call.params['vm_name']} no longer has the device with key {key}; plan again",
                              target=call.target, moid=call.params["vm"])
    return device


@_executor
def execute_mount_iso(call: Execution) -> dict[str, Any]:
    """Point the CD-ROM drive at the ISO (connected), adding the drive first if the plan says so."""
    p = call.params
    if "cdrom_key" in p:
        device = _device_by_key(call, int(p["cdrom_key"]))
        operation = "edit"
    else:
        device = vim.vm.device.VirtualCdrom(
            key=-103, controllerKey=p["controller_key"], unitNumber=p["unit_number"])
        operation = "add"
    device.backing = _iso_backing(call)
    device.connectable = _connected(True)
    change = vim.vm.device.VirtualDeviceSpec(operation=operation, device=device)
    spec = vim.vm.ConfigSpec(deviceChange=[change])
    call.task(call.vm().ReconfigVM_Task, destructive=False, label=f"mount ISO on {p['vm_name']}", spec=spec)
    return call.result(vm=p["vm_name"], moid=p["vm"], iso_path=p["iso_path"], cdrom_added=operation == "add")


@_state_after_policy
def plan_unmount_iso(session: Any, args: Args) -> Plan:
    """Plan ejecting every ISO image mounted on the VM; a VM with none is refused."""
    vm = _resolve_vm(session, args, "changing CD-ROM media")
    drives = [d for d in _cdroms(_vm_config(session, vm.moid).devices)
              if isinstance(d.backing, vim.vm.device.VirtualCdrom.IsoBackingInfo)]
    if not drives:
        raise errors.InvalidState(f"{_label(vm)} has no ISO image mounted; nothing to unmount", moid=vm.moid)
    isos = [d.backing.fileName for d in drives]
    params = {**_vm_params(vm, args), "cdrom_keys": [d.key for d in drives], "isos": isos}
    summary = f"Unmount {', '.join(repr(i) for i in isos)} from {_label(vm)}"
    return Plan(_on(session, summary), (vm_affected(vm),), params)


@_executor
def execute_unmount_iso(call: Execution) -> dict[str, Any]:
    """Leave each planned drive empty (client device, disconnected)."""
    p = call.params
    changes = []
    for key in p["cdrom_keys"]:
        device = _device_by_key(call, int(key))
        device.backing = vim.vm.device.VirtualCdrom.RemotePassthroughBackingInfo(
            deviceName="", exclusive=False, useAutoDetect=False)
        device.connectable = _connected(False)
        changes.append(vim.vm.device.VirtualDeviceSpec(operation="edit", device=device))
    call.task(call.vm().ReconfigVM_Task, destructive=False, label=f"unmount ISO from {p['vm_name']}",
              spec=vim.vm.ConfigSpec(deviceChange=changes))
    return call.result(vm=p["vm_name"], moid=p["vm"], unmounted=p["isos"])


# --------------------------------------------------------------------------------------------------
# Destructive: remove a disk


def _find_disk(vm: VmRef, devices: Sequence[Any], ref: str) -> Any:
    disks = [d for d in devices if isinstance(d, vim.vm.device.VirtualDisk)]
    for disk in disks:
        label = disk.deviceInfo.label if disk.deviceInfo is not None else None
        if ref == label or (ref.isdigit() and int(ref) == disk.key):
            return disk
    known = ", ".join(f"{_device_row(d)['label']} (key {d.key})" for d in disks) or "none"
    raise errors.InvalidArgument("disk", f"{_label(vm)} has no disk labelled or keyed '{ref}'; its disks: "
                                 f"{known}")


@_state_after_policy
def plan_remove_disk(session: Any, args: Args) -> Plan:
    """Plan detaching one disk by label ("Hard disk 2") or device key; ``delete_files`` also destroys it."""
    vm = _resolve_vm(session, args, "removing a disk")
    disk = _find_disk(vm, _vm_config(session, vm.moid).devices, str(args["disk"]))
    row = _device_row(disk)
    delete = bool(args.get("delete_files", False))
    params = {**_vm_params(vm, args), "disk_key": disk.key, "disk_label": row["label"],
              "disk_file": row["file"], "delete_files": delete}
    what = (f"and PERMANENTLY DELETE its file {row['file']}" if delete
            else "keeping its file on the datastore")
    summary = f"Remove {row['label']} (key {disk.key}) from {_label(vm)}, {what}"
    affected = (vm_affected(vm), AffectedObject("disk", row["label"], f"{vm.moid}/{disk.key}"))
    return Plan(_on(session, summary), affected, params, blast_radius=one_vm(session, vm))


@_executor
def execute_remove_disk(call: Execution) -> dict[str, Any]:
    """Detach the disk. A safety snapshot (when policy asks) is taken only when the file is kept: deleting the
    file would fail against, or break, a snapshot that still references it."""
    p = call.params
    delete = bool(p["delete_files"])
    safety = [] if delete else _maybe_safety(call, [SafetyTarget(p["vm"], p["vm_name"])], "remove_disk")
    device = _device_by_key(call, int(p["disk_key"]))
    change = vim.vm.device.VirtualDeviceSpec(operation="remove", device=device)
    if delete:
        change.fileOperation = "destroy"
    call.task(call.vm().ReconfigVM_Task, destructive=True,
              label=f"remove {p['disk_label']} from {p['vm_name']}",
              spec=vim.vm.ConfigSpec(deviceChange=[change]))
    result = call.result(vm=p["vm_name"], moid=p["vm"], removed_disk={
        "label": p["disk_label"], "key": p["disk_key"], "file": p["disk_file"]}, files_deleted=delete,
        safety_snapshots=safety)
    if delete and call.params.get("auto_snapshot"):
        result["note"] = "no safety snapshot: the disk's file was deleted, which a snapshot could not protect"
    return result
