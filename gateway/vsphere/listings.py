"""The list tools' answers: ``list_vms`` (columns and filters), ``list_hosts``, ``list_clusters`` and
``list_datastores``, each from one sweep; the ``*_rows`` functions shape mirrored objects the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pyVmomi import vim

from gateway import errors
from gateway.guard.patterns import UserRegex
from gateway.vsphere.collector import HasTarget, Query, Session, by_type, iso, sweep
from gateway.vsphere.resolve import _CLUSTER, FolderTree, _pick, folder_matches
from gateway.vsphere.soap_scan import ObjectProps

# --------------------------------------------------------------------------------------------------
# list_vms


@dataclass(frozen=True)
class Lookups:
    """Names the VM rows refer to, read in the same sweep as the VMs."""

    hosts: dict[str, str]
    pools: dict[str, str]
    folders: FolderTree | None


@dataclass(frozen=True)
class Column:
    """A list_vms column: the VM paths it reads, the lookups it needs, how to compute its value;
    ``plain``: the one path whose value is the column as it is (read without calling ``value``)."""

    paths: tuple[str, ...]
    needs: frozenset[str]
    value: Callable[[ObjectProps, Lookups], Any]
    plain: str | None = None


def _prop(path: str) -> Callable[[ObjectProps, Lookups], Any]:
    return lambda o, _l: o.props.get(path)


_NONE: frozenset[str] = frozenset()


def _plain(path: str) -> Column:
    return Column((path,), _NONE, _prop(path), plain=path)


def _folder_path(o: ObjectProps, lookups: Lookups) -> str | None:
    return lookups.folders.path(o.props.get("parent")) if lookups.folders else None


VM_COLUMNS: dict[str, Column] = {
    "moid": Column((), _NONE, lambda o, _l: o.moid),
    "name": _plain("name"),
    "power_state": _plain("runtime.powerState"),
    "connection_state": _plain("runtime.connectionState"),
    "created_at": Column(("config.createDate",), _NONE, lambda o, _l: iso(o.props.get("config.createDate"))),
    "host": Column(("runtime.host",), frozenset({"hosts"}),
                   lambda o, lk: lk.hosts.get(o.props.get("runtime.host", ""))),
    "guest_ip": _plain("guest.ipAddress"),
    "cpu": _plain("config.hardware.numCPU"),
    "memory_mb": _plain("config.hardware.memoryMB"),
    "folder": Column(("parent",), frozenset({"folders"}), _folder_path),
    "resource_pool": Column(("resourcePool",), frozenset({"pools"}),
                            lambda o, lk: lk.pools.get(o.props.get("resourcePool", ""))),
    "template": _plain("config.template"),
    "guest_os": _plain("config.guestFullName"),
}
DEFAULT_VM_FIELDS = (
    "moid", "name", "power_state", "connection_state", "created_at", "host", "guest_ip", "cpu", "memory_mb",
)


@dataclass(frozen=True)
class VmQuery:
    """list_vms filters (all must hold) and the columns to return; see ``VM_FILTERS``."""

    name: str | None = None
    regex: UserRegex | None = None
    folder: str | None = None
    resource_pool: str | None = None
    power_state: str | None = None
    connection_state: str | None = None
    created_before: datetime | None = None
    created_after: datetime | None = None
    fields: tuple[str, ...] = DEFAULT_VM_FIELDS
    limit: int | None = None


def _created(o: ObjectProps) -> datetime | None:
    value = o.props.get("config.createDate")
    return value if isinstance(value, datetime) else None


def _before(o: ObjectProps, _lk: Lookups, when: datetime) -> bool:
    created = _created(o)
    return created is not None and created < when


def _after(o: ObjectProps, _lk: Lookups, when: datetime) -> bool:
    created = _created(o)
    return created is not None and created > when


def _in_pool(o: ObjectProps, lk: Lookups, wanted: str) -> bool:
    pool = o.props.get("resourcePool")
    return pool is not None and (pool == wanted or lk.pools.get(pool) == wanted)


@dataclass(frozen=True)
class Filter:
    paths: tuple[str, ...]
    needs: frozenset[str]
    test: Callable[[ObjectProps, Lookups, Any], bool]


VM_FILTERS: dict[str, Filter] = {
    "name": Filter(("name",), _NONE, lambda o, _l, v: o.props.get("name") == v),
    "regex": Filter(("name",), _NONE, lambda o, _l, v: bool(v.search(o.props.get("name", "")))),
    "folder": Filter(("parent",), frozenset({"folders"}),
                     lambda o, lk, v: folder_matches(_folder_path(o, lk), v)),
    "resource_pool": Filter(("resourcePool",), frozenset({"pools"}), _in_pool),
    "power_state": Filter(("runtime.powerState",), _NONE,
                          lambda o, _l, v: o.props.get("runtime.powerState") == v),
    "connection_state": Filter(("runtime.connectionState",), _NONE,
                               lambda o, _l, v: o.props.get("runtime.connectionState") == v),
    "created_before": Filter(("config.createDate",), _NONE, _before),
    "created_after": Filter(("config.createDate",), _NONE, _after),
}
"""A VM without a creation date (older vSphere, the simulator) matches neither date filter."""


def _vm_plan(query: VmQuery) -> tuple[list[Query], list[tuple[Filter, Any]], list[tuple[str, Column]]]:
    unknown = [f for f in query.fields if f not in VM_COLUMNS]
    if unknown:
        raise errors.InvalidArgument("fields", f"unknown column(s) {', '.join(unknown)}; choose from "
                                     f"{', '.join(VM_COLUMNS)}")
    columns = [(name, VM_COLUMNS[name]) for name in dict.fromkeys(query.fields)]
    active = [(VM_FILTERS[k], getattr(query, k)) for k in VM_FILTERS if getattr(query, k) is not None]
    paths = {p for _n, c in columns for p in c.paths} | {p for f, _v in active for p in f.paths} | {"name"}
    needs = {n for _c, c in columns for n in c.needs} | {n for f, _v in active for n in f.needs}
    queries = [Query(vim.VirtualMachine, tuple(sorted(paths)))]
    if "hosts" in needs:
        queries.append(Query(vim.HostSystem, ("name",)))
    if "pools" in needs:
        queries.append(Query(vim.ResourcePool, ("name",)))
    if "folders" in needs:
        queries += [Query(vim.Folder, ("name", "parent")), Query(vim.Datacenter, ("name", "parent"))]
    return queries, active, columns


def vm_rows(objects: Sequence[ObjectProps], query: VmQuery, root_folder: str) -> dict[str, Any]:
    """Filter and shape swept VM objects (plus the host/pool/folder objects swept with them)."""
    _queries, active, columns = _vm_plan(query)
    groups = by_type(objects)
    names = {o.moid: o.props.get("name", o.moid) for o in objects if o.type != "VirtualMachine"}
    needs_folders = any("folders" in c.needs for _n, c in columns) or any(
        "folders" in f.needs for f, _v in active)
    lookups = Lookups(
        hosts=names, pools=names,
        folders=FolderTree.from_objects(objects, root_folder) if needs_folders else None,
    )
    vms = sorted(groups.get("VirtualMachine", []), key=lambda o: (o.props.get("name", ""), o.moid))
    matching = [o for o in vms if all(f.test(o, lookups, v) for f, v in active)] if active else vms
    rows = _shape(matching, columns, lookups)
    out: dict[str, Any] = {"count": len(rows)}
    if query.limit is not None and len(rows) > query.limit:
        rows = rows[: query.limit]
        out["truncated"] = True
    out["vms"] = rows
    if query.created_before or query.created_after:
        undated = sum(1 for o in vms if _created(o) is None)
        if undated:
            out["without_created_at"] = undated
    return out


def _shape(vms: Sequence[ObjectProps], columns: Sequence[tuple[str, Column]], lookups: Lookups,
           ) -> list[dict[str, Any]]:
    """One row per VM, its keys in the order of ``columns``; a plain column is one ``dict.get``
    (a few times cheaper per VM than calling its ``value``: rows of 30,000 VMs are built per sweep)."""
    spec = [(name, column.plain, column.value) for name, column in columns]
    rows = []
    for o in vms:
        get = o.props.get
        rows.append({name: get(path) if path is not None else value(o, lookups)
                     for name, path, value in spec})
    return rows


def list_vms(session: Session, query: VmQuery, *, fast: bool = True) -> dict[str, Any]:
    """VMs matching ``query`` as rows of the requested columns, from one sweep (a constant number of
    requests however many VMs exist): ``{"vms": [...], "count": n}``, plus ``truncated`` when
    ``limit`` cut the list and ``without_created_at`` (VMs a date filter could not judge)."""
    queries, _active, _columns = _vm_plan(query)
    objects = sweep(session, queries, fast=fast)
    return vm_rows(objects, query, session.content.rootFolder._moId)


# --------------------------------------------------------------------------------------------------
# Hosts, clusters, datastores


_LIST_HOST_PATHS = (
    "name", "parent", "runtime.connectionState", "runtime.powerState", "runtime.inMaintenanceMode",
    "summary.hardware.numCpuCores", "summary.hardware.cpuMhz", "summary.hardware.memorySize",
    "summary.quickStats.overallCpuUsage", "summary.quickStats.overallMemoryUsage", "config.product.version",
    "config.product.build", "vm",
)
_MIB = 1024 * 1024


def _mib(value: int | None) -> int | None:
    return value // _MIB if isinstance(value, int) else None


def _host_row(o: ObjectProps, clusters: Mapping[str, str]) -> dict[str, Any]:
    p = o.props
    return {
        "moid": o.moid, "name": p.get("name"), "cluster": clusters.get(p.get("parent", "")),
        "connection_state": p.get("runtime.connectionState"), "power_state": p.get("runtime.powerState"),
        "maintenance_mode": p.get("runtime.inMaintenanceMode"),
        "cpu_cores": p.get("summary.hardware.numCpuCores"), "cpu_mhz": p.get("summary.hardware.cpuMhz"),
        "memory_mb": _mib(p.get("summary.hardware.memorySize")),
        "cpu_usage_mhz": p.get("summary.quickStats.overallCpuUsage"),
        "memory_usage_mb": p.get("summary.quickStats.overallMemoryUsage"),
        "version": p.get("config.product.version"), "build": p.get("config.product.build"),
        "vm_count": len(p.get("vm", [])),
    }


LIST_HOSTS_QUERIES = (Query(vim.HostSystem, _LIST_HOST_PATHS), Query(vim.ComputeResource, ("name",)))


def host_rows(reader: HasTarget, objects: Sequence[ObjectProps],
              cluster: str | None = None) -> dict[str, Any]:
    """Shape swept (or mirrored) host and compute-resource objects into the list_hosts answer."""
    groups = by_type(objects)
    clusters = {o.moid: o.props.get("name", o.moid) for o in groups.get("ClusterComputeResource", [])}
    hosts = groups.get("HostSystem", [])
    if cluster is not None:
        wanted = _pick(reader, _CLUSTER, cluster, groups.get("ClusterComputeResource", [])).moid
        hosts = [o for o in hosts if o.props.get("parent") == wanted]
    rows = sorted((_host_row(o, clusters) for o in hosts), key=lambda r: (r["name"] or "", r["moid"]))
    return {"hosts": rows, "count": len(rows)}


def list_hosts(session: Session, cluster: str | None = None) -> dict[str, Any]:
    """Hosts (optionally of one cluster, by name or moid) from one sweep: ``{"hosts": [...], "count": n}``."""
    return host_rows(session, sweep(session, LIST_HOSTS_QUERIES), cluster)


_LIST_CLUSTER_PATHS = (
    "name", "parent", "host", "datastore", "summary.numEffectiveHosts", "summary.totalCpu",
    "summary.totalMemory", "summary.effectiveCpu", "summary.effectiveMemory", "overallStatus",
    "configurationEx",
)


def _cluster_row(o: ObjectProps, tree: FolderTree, datacenters: set[str]) -> dict[str, Any]:
    p = o.props
    config = p.get("configurationEx")
    drs = getattr(config, "drsConfig", None)
    das = getattr(config, "dasConfig", None)
    return {
        "moid": o.moid, "name": p.get("name"), "datacenter": tree.datacenter(p.get("parent"), datacenters),
        "host_count": len(p.get("host", [])), "effective_hosts": p.get("summary.numEffectiveHosts"),
        "datastore_count": len(p.get("datastore", [])), "total_cpu_mhz": p.get("summary.totalCpu"),
        "total_memory_mb": _mib(p.get("summary.totalMemory")),
        "effective_cpu_mhz": p.get("summary.effectiveCpu"),
        "effective_memory_mb": p.get("summary.effectiveMemory"), "overall_status": p.get("overallStatus"),
        "drs_enabled": getattr(drs, "enabled", None), "drs_behavior": getattr(drs, "defaultVmBehavior", None),
        "ha_enabled": getattr(das, "enabled", None),
    }


LIST_CLUSTERS_QUERIES = (Query(vim.ClusterComputeResource, _LIST_CLUSTER_PATHS),
                         Query(vim.Folder, ("name", "parent")), Query(vim.Datacenter, ("name", "parent")))


def cluster_rows(objects: Sequence[ObjectProps], root_folder: str) -> dict[str, Any]:
    """Shape swept (or mirrored) cluster, folder and datacenter objects into the list_clusters answer."""
    tree = FolderTree.from_objects(objects, root_folder)
    groups = by_type(objects)
    datacenters = {o.moid for o in groups.get("Datacenter", [])}
    rows = sorted((_cluster_row(o, tree, datacenters) for o in groups.get("ClusterComputeResource", [])),
                  key=lambda r: (r["name"] or "", r["moid"]))
    return {"clusters": rows, "count": len(rows)}


def list_clusters(session: Session) -> dict[str, Any]:
    """Clusters with capacity and DRS/HA switches, from one sweep: ``{"clusters": [...], "count": n}``."""
    objects = sweep(session, LIST_CLUSTERS_QUERIES, objects=True)
    return cluster_rows(objects, session.content.rootFolder._moId)


_LIST_DATASTORE_PATHS = (
    "name", "summary.type", "summary.capacity", "summary.freeSpace", "summary.uncommitted",
    "summary.accessible", "summary.maintenanceMode", "summary.url", "vm",
)


def _datastore_row(o: ObjectProps) -> dict[str, Any]:
    p = o.props
    capacity, free = p.get("summary.capacity"), p.get("summary.freeSpace")
    provisioned = None
    if capacity is not None:
        provisioned = capacity - (free or 0) + (p.get("summary.uncommitted") or 0)
    return {
        "moid": o.moid, "name": p.get("name"), "type": p.get("summary.type"), "capacity_mb": _mib(capacity),
        "free_mb": _mib(free), "provisioned_mb": _mib(provisioned),
        "accessible": p.get("summary.accessible"), "maintenance_mode": p.get("summary.maintenanceMode"),
        "url": p.get("summary.url"), "vm_count": len(p.get("vm", [])),
    }


LIST_DATASTORES_QUERIES = (Query(vim.Datastore, _LIST_DATASTORE_PATHS),)


def datastore_rows(objects: Sequence[ObjectProps]) -> dict[str, Any]:
    """Shape swept (or mirrored) datastore objects into the list_datastores answer."""
    rows = sorted((_datastore_row(o) for o in objects if o.type == "Datastore"),
                  key=lambda r: (r["name"] or "", r["moid"]))
    return {"datastores": rows, "count": len(rows)}


def list_datastores(session: Session) -> dict[str, Any]:
    """Datastores with type, space and accessibility: ``{"datastores": [...], "count": n}``."""
    return datastore_rows(sweep(session, LIST_DATASTORES_QUERIES))
