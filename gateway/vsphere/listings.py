"""The list tools' answers, each from one sweep; the ``*_rows`` functions shape mirrored objects alike."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
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
    """A list_vms column: the VM paths it reads, the lookups it needs, and how it is read:
    ``plain``, the one path whose value is the column as it is; ``plain`` and ``resolve``, that path's
    value resolved by the names of the other objects swept (``Lookups``, whole once the sweep is read);
    else ``compute``, from the VM alone. Only a ``resolve`` sees the lookups, so a VM's row can be built
    as soon as its page is decoded and its names resolved at the end (``VmRows``)."""

    paths: tuple[str, ...]
    needs: frozenset[str] = frozenset()
    plain: str | None = None
    resolve: Callable[[Any, Lookups], Any] | None = None
    compute: Callable[[ObjectProps], Any] | None = None

    def value(self, o: ObjectProps, lookups: Lookups) -> Any:
        """This column of ``o`` (what ``_row_builder`` writes faster, many VMs at a time)."""
        if self.compute is not None:
            return self.compute(o)
        raw = o.props.get(self.plain) if self.plain is not None else None
        return raw if self.resolve is None else self.resolve(raw, lookups)


def _plain(path: str) -> Column:
    return Column((path,), plain=path)


def _named(path: str, needs: str, resolve: Callable[[Any, Lookups], Any]) -> Column:
    return Column((path,), frozenset({needs}), plain=path, resolve=resolve)


def _folder_path(parent: str | None, lookups: Lookups) -> str | None:
    return lookups.folders.path(parent) if lookups.folders else None


VM_COLUMNS: dict[str, Column] = {
    "moid": Column((), compute=lambda o: o.moid),
    "name": _plain("name"),
    "power_state": _plain("runtime.powerState"),
    "connection_state": _plain("runtime.connectionState"),
    "created_at": Column(("config.createDate",), compute=lambda o: iso(o.props.get("config.createDate"))),
    "host": _named("runtime.host", "hosts", lambda moid, lk: lk.hosts.get(moid)),
    "guest_ip": _plain("guest.ipAddress"),
    "cpu": _plain("config.hardware.numCPU"),
    "memory_mb": _plain("config.hardware.memoryMB"),
    "folder": _named("parent", "folders", _folder_path),
    "resource_pool": _named("resourcePool", "pools", lambda moid, lk: lk.pools.get(moid)),
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


_NONE: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Filter:
    paths: tuple[str, ...]
    needs: frozenset[str]
    test: Callable[[ObjectProps, Lookups, Any], bool]


VM_FILTERS: dict[str, Filter] = {
    "name": Filter(("name",), _NONE, lambda o, _l, v: o.props.get("name") == v),
    "regex": Filter(("name",), _NONE, lambda o, _l, v: bool(v.search(o.props.get("name", "")))),
    "folder": Filter(("parent",), frozenset({"folders"}),
                     lambda o, lk, v: folder_matches(_folder_path(o.props.get("parent"), lk), v)),
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


def vm_rows(objects: Iterable[ObjectProps], query: VmQuery, root_folder: str) -> dict[str, Any]:
    """Filter and shape swept VM objects (plus the host/pool/folder objects swept with them)."""
    rows = VmRows(query, root_folder)
    rows.add(objects)
    return rows.result()


_NO_LOOKUPS = Lookups(hosts={}, pools={}, folders=None)


class VmRows:
    """The list_vms answer built while a sweep is read: ``add`` each page's objects as it is decoded,
    then ``result`` once. A page's VMs are filtered and shaped into rows at once, while the next page
    is on its way, so only the last page's rows follow the sweep; the columns naming other objects
    (host, folder, pool: ``Column.resolve``) are resolved at the end, when every object is known, and
    the rows sorted by name then. A filter that needs those names holds the VMs until then."""

    def __init__(self, query: VmQuery, root_folder: str) -> None:
        _queries, self._active, columns = _vm_plan(query)
        self._query, self._root = query, root_folder
        self._build = _row_builder(tuple(name for name, _column in columns))
        self._resolved = [(name, c.resolve) for name, c in columns if c.resolve is not None]
        self._needs_folders = any("folders" in c.needs for _n, c in columns) or any(
            "folders" in f.needs for f, _v in self._active)
        self._hold = any(f.needs for f, _v in self._active)
        self._dated = query.created_before is not None or query.created_after is not None
        self._others: list[ObjectProps] = []  # hosts, pools, folders, datacenters: the lookups
        self._held: list[ObjectProps] = []
        self._keys: list[tuple[str, str]] = []
        self._rows: list[dict[str, Any]] = []
        self._undated = 0

    def add(self, objects: Iterable[ObjectProps]) -> None:
        """One page of the sweep (or every object at once)."""
        vms: list[ObjectProps] = []
        others = self._others
        for o in objects:
            (vms if o.type == "VirtualMachine" else others).append(o)
        if self._dated:
            self._undated += sum(1 for o in vms if _created(o) is None)
        if self._hold:
            self._held += vms
        else:
            self._take(vms, _NO_LOOKUPS)

    def _take(self, vms: list[ObjectProps], lookups: Lookups) -> None:
        if self._active:
            vms = [o for o in vms if all(f.test(o, lookups, v) for f, v in self._active)]
        self._keys += [(o.props.get("name", ""), o.moid) for o in vms]
        self._rows += self._build(vms)

    def result(self) -> dict[str, Any]:
        """``{"count", "vms"}``, plus ``truncated`` and ``without_created_at`` (see ``list_vms``)."""
        names = {o.moid: o.props.get("name", o.moid) for o in self._others}
        lookups = Lookups(hosts=names, pools=names,
                          folders=FolderTree.from_objects(self._others, self._root) if self._needs_folders
                          else None)
        if self._held:
            held, self._held = self._held, []
            self._take(held, lookups)
        unsorted = self._rows
        rows = [unsorted[i] for i in sorted(range(len(unsorted)), key=self._keys.__getitem__)]
        out: dict[str, Any] = {"count": len(rows)}
        limit = self._query.limit
        if limit is not None and len(rows) > limit:
            rows = rows[:limit]
            out["truncated"] = True
        for name, resolve in self._resolved:
            for row in rows:
                row[name] = resolve(row[name], lookups)
        out["vms"] = rows
        if self._dated and self._undated:
            out["without_created_at"] = self._undated
        return out


RowBuilder = Callable[[Sequence[ObjectProps]], list[dict[str, Any]]]


@functools.lru_cache(maxsize=64)
def _row_builder(names: tuple[str, ...]) -> RowBuilder:
    """The rows of the ``VM_COLUMNS`` called ``names``, built by a list comprehension of one dict display
    written for them: a ``plain`` column is one ``get`` of its path (resolved later when it has a
    ``resolve``), any other a call of its ``compute``.

    Generated (as ``dataclasses`` writes ``__init__``) because a dict display is the cheapest row CPython
    builds, cheaper than a comprehension over the columns. Only the column table's own names and paths
    enter the source, each as a ``repr`` literal."""
    computed: list[Callable[[ObjectProps], Any]] = []
    items = []
    for name in names:
        column = VM_COLUMNS[name]
        if column.plain is not None:
            items.append(f"{name!r}: get({column.plain!r})")
        else:
            assert column.compute is not None
            items.append(f"{name!r}: computed{len(computed)}(o)")
            computed.append(column.compute)
    unpack = f"    {''.join(f'computed{i}, ' for i in range(len(computed)))}= computed\n" if computed else ""
    source = (f"def rows(vms):\n{unpack}"
              f"    return [{{{', '.join(items)}}} for o in vms for get in [o.props.get]]\n")
    namespace: dict[str, Any] = {"computed": tuple(computed)}
    exec(compile(source, f"<list_vms rows: {', '.join(names)}>", "exec"), namespace)
    builder: RowBuilder = namespace["rows"]
    return builder


def list_vms(session: Session, query: VmQuery, *, fast: bool = True) -> dict[str, Any]:
    """VMs matching ``query`` as rows of the requested columns, from one sweep (a constant number of
    requests however many VMs exist): ``{"vms": [...], "count": n}``, plus ``truncated`` when
    ``limit`` cut the list and ``without_created_at`` (VMs a date filter could not judge)."""
    queries, _active, _columns = _vm_plan(query)
    rows = VmRows(query, session.content.rootFolder._moId)
    sweep(session, queries, fast=fast, each_page=rows.add)
    return rows.result()


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
