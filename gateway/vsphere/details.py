"""One object in depth (VM, host, cluster, datastore) and a VM's snapshot tree, decoded by pyVmomi."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pyVmomi import vim, vmodl

from gateway.vsphere.collector import (
    Query,
    Session,
    by_type,
    iso,
    managed_object,
    object_spec,
    retrieve,
    retrieve_objects,
    sweep,
    traverse,
)
from gateway.vsphere.listings import _LIST_CLUSTER_PATHS, _cluster_row, _datastore_row, _mib
from gateway.vsphere.resolve import (
    _HOST_PATHS,
    _VM,
    _VM_FACT_PATHS,
    _VM_FACT_TRAVERSAL,
    FolderTree,
    _find,
    _not_found,
    _vm_ref,
    resolve_cluster,
    resolve_datastore,
    resolve_host,
    resolve_vm,
)
from gateway.vsphere.soap_scan import ObjectProps, Props

# --------------------------------------------------------------------------------------------------
# Details (data objects: decoded by pyVmomi)


_NETWORK_TYPES = ("Network", "DistributedVirtualPortgroup", "OpaqueNetwork")


def _one(objects: Sequence[ObjectProps], moid: str) -> Props:
    return next((o.props for o in objects if o.moid == moid), {})


def _names(objects: Sequence[ObjectProps], type_names: Sequence[str]) -> dict[str, str]:
    return {o.moid: o.props.get("name", o.moid) for o in objects if o.type in type_names}


_VM_DETAIL_PATHS = (
    "config.guestFullName", "config.guestId", "config.annotation", "config.uuid", "config.instanceUuid",
    "config.version", "config.hardware.numCPU", "config.hardware.numCoresPerSocket",
    "config.hardware.memoryMB", "config.hardware.device", "config.createDate", "config.files.vmPathName",
    "guest.ipAddress", "guest.hostName", "guest.toolsRunningStatus", "guest.toolsVersionStatus2",
    "guest.guestState", "guest.net",
    "runtime.bootTime", "summary.quickStats.overallCpuUsage", "summary.quickStats.guestMemoryUsage",
    "summary.quickStats.uptimeSeconds", "summary.storage.committed", "summary.storage.uncommitted",
    "snapshot.currentSnapshot", "datastore", "network", "overallStatus",
)
_VM_DETAIL_TRAVERSAL = (
    traverse("vmDatastores", vim.VirtualMachine, "datastore"),
    traverse("vmNetworks", vim.VirtualMachine, "network"),
)


def _device_rows(devices: Sequence[Any], networks: Mapping[str, str]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {"disks": [], "nics": [], "cdroms": []}
    for device in devices or []:
        label = device.deviceInfo.label if device.deviceInfo else str(device.key)
        backing = device.backing
        connected = device.connectable.connected if device.connectable else None
        if isinstance(device, vim.vm.device.VirtualDisk):
            out["disks"].append({
                "label": label, "key": device.key, "capacity_mb": (device.capacityInKB or 0) // 1024,
                "file": getattr(backing, "fileName", None), "thin": getattr(backing, "thinProvisioned", None),
            })
        elif isinstance(device, vim.vm.device.VirtualEthernetCard):
            port = getattr(backing, "port", None)
            portgroup = getattr(port, "portgroupKey", None)
            network = getattr(backing, "deviceName", None) or networks.get(portgroup or "")
            if network is None and getattr(backing, "network", None) is not None:
                network = networks.get(backing.network._moId, backing.network._moId)
            out["nics"].append({
                "label": label, "key": device.key, "mac": device.macAddress, "connected": connected,
                "network": network, "portgroup_key": portgroup,
                "adapter": type(device).__name__.rsplit(".", 1)[-1],
            })
        elif isinstance(device, vim.vm.device.VirtualCdrom):
            out["cdroms"].append({"label": label, "key": device.key, "connected": connected,
                                  "iso": getattr(backing, "fileName", None)})
    return out


def _guest_nics(nets: Sequence[Any] | None) -> list[dict[str, Any]]:
    return [{"network": n.network, "mac": n.macAddress, "connected": n.connected,
             "ip_addresses": list(n.ipAddress or [])} for n in nets or []]


Lookup = Callable[[Any, str], str | None]
"""``lookup(vim_type, ref)``: the moid the caller already knows ``ref`` names (a live inventory mirror's
index), or None. A hint only: a read given one checks it against what it reads live and searches as
usual when the object is gone or no longer carries that name."""


def get_vm_details(session: Session, ref: str, lookup: Lookup | None = None) -> dict[str, Any]:
    """One VM in depth: identity, placement facts, hardware and devices, guest, storage, networks.

    With a ``lookup`` hint the name search (a sweep of every VM's name) is skipped when the hinted VM,
    read live, still is ``ref`` (its moid or its current name)."""
    hinted = lookup(vim.VirtualMachine, ref) if lookup is not None and ref else None
    if hinted is not None:
        details = _vm_details(session, hinted)
        if details is not None and ref in (details["moid"], details["name"]):
            return details
    # The name sweep, then ONE retrieval for both the placement facts and the details (they used to be
    # two round trips: resolve_vm's facts, then the details).
    details = _vm_details(session, _find(session, _VM, ref))
    if details is None:  # deleted between the two reads
        raise _not_found(session, _VM, ref)
    return details


def vm_details_spec(session: Session, moid: str) -> Any:
    """The one retrieval get_vm_details makes for VM ``moid``: its placement facts and details, and the
    names of what they refer to (host, cluster, folders, datastores, networks)."""
    paths = {**_VM_FACT_PATHS, vim.Datastore: ("name",), vim.Network: ("name",)}
    paths[vim.VirtualMachine] = tuple(dict.fromkeys(_VM_FACT_PATHS[vim.VirtualMachine] + _VM_DETAIL_PATHS))
    return object_spec(managed_object(session, vim.VirtualMachine, moid), paths,
                       _VM_FACT_TRAVERSAL + _VM_DETAIL_TRAVERSAL)


def _vm_details(session: Session, moid: str) -> dict[str, Any] | None:
    """get_vm_details' answer for the VM ``moid``, read in one retrieval; None when it does not exist."""
    try:
        objects = retrieve_objects(session, vm_details_spec(session, moid))
    except vmodl.fault.ManagedObjectNotFound:
        return None
    if not any(o.moid == moid for o in objects):
        return None
    vm = _vm_ref(session, moid, objects)
    p = _one(objects, vm.moid)
    networks = _names(objects, _NETWORK_TYPES)
    datastores = _names(objects, ("Datastore",))
    current = p.get("snapshot.currentSnapshot")
    return {
        **vm.facts(),
        "guest_os": p.get("config.guestFullName"), "guest_id": p.get("config.guestId"),
        "annotation": p.get("config.annotation"), "uuid": p.get("config.uuid"),
        "instance_uuid": p.get("config.instanceUuid"), "hardware_version": p.get("config.version"),
        "cpu": p.get("config.hardware.numCPU"),
        "cores_per_socket": p.get("config.hardware.numCoresPerSocket"),
        "memory_mb": p.get("config.hardware.memoryMB"), "created_at": iso(p.get("config.createDate")),
        "vmx_path": p.get("config.files.vmPathName"), "overall_status": p.get("overallStatus"),
        "guest": {
            "ip_address": p.get("guest.ipAddress"), "hostname": p.get("guest.hostName"),
            "state": p.get("guest.guestState"), "tools_running": p.get("guest.toolsRunningStatus"),
            "tools_version_status": p.get("guest.toolsVersionStatus2"),
            "nics": _guest_nics(p.get("guest.net")),
        },
        "boot_time": iso(p.get("runtime.bootTime")),
        "uptime_seconds": p.get("summary.quickStats.uptimeSeconds"),
        "cpu_usage_mhz": p.get("summary.quickStats.overallCpuUsage"),
        "guest_memory_usage_mb": p.get("summary.quickStats.guestMemoryUsage"),
        "storage_committed_mb": _mib(p.get("summary.storage.committed")),
        "storage_uncommitted_mb": _mib(p.get("summary.storage.uncommitted")),
        "datastores": sorted(datastores.values()), "networks": sorted(networks.values()),
        "current_snapshot": current,
        **_device_rows(p.get("config.hardware.device") or [], networks),
    }


_HOST_DETAIL_PATHS = (
    "summary.hardware.vendor", "summary.hardware.model", "summary.hardware.cpuModel",
    "summary.hardware.numCpuPkgs", "summary.hardware.numCpuCores", "summary.hardware.numCpuThreads",
    "summary.hardware.cpuMhz", "summary.hardware.memorySize", "summary.quickStats.overallCpuUsage",
    "summary.quickStats.overallMemoryUsage", "summary.quickStats.uptime", "config.product.fullName",
    "config.product.version", "config.product.build", "runtime.bootTime", "overallStatus", "datastore",
    "network", "vm",
)
_HOST_DETAIL_TRAVERSAL = (
    traverse("hostDatastores", vim.HostSystem, "datastore"),
    traverse("hostNetworks", vim.HostSystem, "network"),
    traverse("hostVms", vim.HostSystem, "vm"),
)


def get_host_details(session: Session, ref: str) -> dict[str, Any]:
    """One host in depth: hardware, product, states, usage, and the names of its datastores, networks, VMs."""
    host = resolve_host(session, ref)
    objects = retrieve(session, object_spec(
        host.managed_object(session),
        {vim.HostSystem: _HOST_DETAIL_PATHS, vim.Datastore: ("name",), vim.Network: ("name",),
         vim.VirtualMachine: ("name",)},
        _HOST_DETAIL_TRAVERSAL))
    p = _one(objects, host.moid)
    return {
        "moid": host.moid, "name": host.name, "cluster": host.cluster,
        "connection_state": host.connection_state,
        "power_state": host.power_state, "maintenance_mode": host.in_maintenance,
        "vendor": p.get("summary.hardware.vendor"), "model": p.get("summary.hardware.model"),
        "cpu_model": p.get("summary.hardware.cpuModel"), "cpu_packages": p.get("summary.hardware.numCpuPkgs"),
        "cpu_cores": p.get("summary.hardware.numCpuCores"),
        "cpu_threads": p.get("summary.hardware.numCpuThreads"),
        "cpu_mhz": p.get("summary.hardware.cpuMhz"), "memory_mb": _mib(p.get("summary.hardware.memorySize")),
        "cpu_usage_mhz": p.get("summary.quickStats.overallCpuUsage"),
        "memory_usage_mb": p.get("summary.quickStats.overallMemoryUsage"),
        "uptime_seconds": p.get("summary.quickStats.uptime"), "product": p.get("config.product.fullName"),
        "version": p.get("config.product.version"), "build": p.get("config.product.build"),
        "boot_time": iso(p.get("runtime.bootTime")), "overall_status": p.get("overallStatus"),
        "datastores": sorted(_names(objects, ("Datastore",)).values()),
        "networks": sorted(_names(objects, _NETWORK_TYPES).values()),
        "vms": sorted(_names(objects, ("VirtualMachine",)).values()),
    }


_CLUSTER_DETAIL_TRAVERSAL = (
    traverse("clusterHosts", vim.ComputeResource, "host"),
    traverse("clusterDatastores", vim.ComputeResource, "datastore"),
    traverse("clusterPool", vim.ComputeResource, "resourcePool", "childPools"),
    traverse("childPools", vim.ResourcePool, "resourcePool", "childPools"),
)


def get_cluster_details(session: Session, ref: str) -> dict[str, Any]:
    """One cluster: capacity, DRS/HA, its hosts (with states), datastores and resource pools."""
    cluster = resolve_cluster(session, ref)
    objects = retrieve_objects(session, object_spec(
        cluster.managed_object(session),
        {vim.ClusterComputeResource: _LIST_CLUSTER_PATHS, vim.HostSystem: _HOST_PATHS,
         vim.Datastore: ("name",), vim.ResourcePool: ("name", "parent")},
        _CLUSTER_DETAIL_TRAVERSAL))
    groups = by_type(objects)
    me = next(o for o in groups.get("ClusterComputeResource", []) if o.moid == cluster.moid)
    tree = FolderTree({}, {}, session.content.rootFolder._moId)
    row = _cluster_row(me, tree, set())
    row.pop("datacenter")
    hosts = [{"moid": o.moid, "name": o.props.get("name"),
              "connection_state": o.props.get("runtime.connectionState"),
              "power_state": o.props.get("runtime.powerState"),
              "maintenance_mode": o.props.get("runtime.inMaintenanceMode")}
             for o in groups.get("HostSystem", [])]
    pool_names = _names(objects, ("ResourcePool", "VirtualApp"))
    pools = [{"moid": o.moid, "name": o.props.get("name"),
              "parent": pool_names.get(o.props.get("parent", ""))}
             for o in groups.get("ResourcePool", []) + groups.get("VirtualApp", [])]
    return {
        **row, "hosts": sorted(hosts, key=lambda h: h["name"] or ""),
        "datastores": sorted(_names(objects, ("Datastore",)).values()),
        "resource_pools": sorted(pools, key=lambda r: r["name"] or ""),
    }


def get_datastore_details(session: Session, ref: str) -> dict[str, Any]:
    """One datastore: space, type, URL, the hosts that mount it (with mount state) and its VMs."""
    ds = resolve_datastore(session, ref)
    objects = retrieve_objects(session, object_spec(
        ds.managed_object(session),
        {vim.Datastore: ("summary", "host", "info.name", "vm"), vim.VirtualMachine: ("name",)},
        (traverse("dsVms", vim.Datastore, "vm"),)))
    p = _one(objects, ds.moid)
    hosts = sweep(session, [Query(vim.HostSystem, ("name",))])
    host_names = {o.moid: o.props.get("name", o.moid) for o in hosts}
    mounts = [{"host": host_names.get(m.key._moId, m.key._moId), "accessible": m.mountInfo.accessible,
               "mounted": m.mountInfo.mounted, "mode": m.mountInfo.accessMode} for m in p.get("host") or []]
    summary = p.get("summary")
    fields = ("type", "capacity", "freeSpace", "uncommitted", "accessible", "maintenanceMode", "url")
    props = {f"summary.{f}": getattr(summary, f, None) for f in fields}
    props.update(name=ds.name, vm=[o.moid for o in objects if o.type == "VirtualMachine"])
    row = _datastore_row(ObjectProps("Datastore", ds.moid, props))
    return {**row, "hosts": sorted(mounts, key=lambda m: m["host"]),
            "vms": sorted(_names(objects, ("VirtualMachine",)).values())}


# --------------------------------------------------------------------------------------------------
# Snapshots


def flatten_snapshots(roots: Sequence[Any], current: str | None) -> list[dict[str, Any]]:
    """A snapshot tree (``VirtualMachineSnapshotTree`` nodes) as a depth-first list with parent links."""
    rows: list[dict[str, Any]] = []

    def walk(nodes: Sequence[Any], parent: Any, depth: int) -> None:
        for node in nodes or []:
            moid = node.snapshot._moId if node.snapshot is not None else None
            rows.append({
                "moid": moid, "name": node.name, "description": node.description or "",
                "created": iso(node.createTime), "state": node.state, "quiesced": node.quiesced,
                "parent": parent, "depth": depth, "current": moid is not None and moid == current,
                "id": node.id,
            })
            walk(node.childSnapshotList, moid, depth + 1)

    walk(roots, None, 0)
    return rows


def read_snapshot_info(session: Session, vm_moid: str) -> Any:
    """The VM's ``snapshot`` property (``None`` when it has none), read through the PropertyCollector:
    the simulator's property accessor fails on VMs without snapshots."""
    vm = managed_object(session, vim.VirtualMachine, vm_moid)
    objects = retrieve_objects(session, object_spec(vm, {vim.VirtualMachine: ("snapshot",)}))
    return _one(objects, vm_moid).get("snapshot")


def list_snapshots(session: Session, ref: str) -> dict[str, Any]:
    """The VM's snapshots, flattened depth-first: ``{"vm", "snapshots": [...], "count", "current"}``."""
    vm = resolve_vm(session, ref)
    info = read_snapshot_info(session, vm.moid)
    current = info.currentSnapshot._moId if info is not None and info.currentSnapshot is not None else None
    rows = flatten_snapshots(info.rootSnapshotList if info is not None else [], current)
    return {"vm": vm.name, "vm_moid": vm.moid, "snapshots": rows, "count": len(rows), "current": current}
