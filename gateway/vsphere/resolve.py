"""Name and moid resolution: inventory paths of folders, and one object named by exact name or moid.

A miss is ``NotFound`` naming the list tool to call; several matches are ``Ambiguous`` with their moids.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyVmomi import vim, vmodl

from gateway import errors
from gateway.vsphere.collector import (
    HasTarget,
    Query,
    Session,
    by_type,
    managed_object,
    object_spec,
    retrieve,
    sweep,
    traverse,
)
from gateway.vsphere.soap_scan import ObjectProps

# --------------------------------------------------------------------------------------------------
# Inventory paths


@dataclass(frozen=True)
class FolderTree:
    """Names and parents of folders and datacenters, to turn a folder moid into an inventory path."""

    names: dict[str, str]
    parents: dict[str, str]
    root: str
    _paths: dict[str, str | None] = field(default_factory=dict)

    @classmethod
    def from_objects(cls, objects: Iterable[ObjectProps], root: str) -> FolderTree:
        names: dict[str, str] = {}
        parents: dict[str, str] = {}
        for obj in objects:
            if obj.type in ("Folder", "Datacenter"):
                names[obj.moid] = obj.props.get("name", obj.moid)
                if "parent" in obj.props:
                    parents[obj.moid] = obj.props["parent"]
        return cls(names, parents, root)

    def path(self, moid: str | None) -> str | None:
        """``/DC0/vm/prod`` for a folder moid; ``None`` if it is not a known folder or datacenter."""
        if moid is None or moid not in self.names:
            return None
        if moid not in self._paths:
            parts: list[str] = []
            current: str | None = moid
            while current is not None and current != self.root and current in self.names:
                parts.append(self.names[current])
                current = self.parents.get(current)
            self._paths[moid] = "/" + "/".join(reversed(parts))
        return self._paths[moid]

    def datacenter(self, moid: str | None, datacenters: set[str]) -> str | None:
        """The name of the datacenter above folder ``moid``."""
        current = moid
        while current is not None and current != self.root:
            if current in datacenters:
                return self.names.get(current)
            current = self.parents.get(current)
        return None


def folder_matches(path: str | None, wanted: str) -> bool:
    """A folder filter: a value with "/" is a path (that folder or below); otherwise the folder's name."""
    if path is None:
        return False
    if "/" in wanted:
        wanted = "/" + wanted.strip("/")
        return path == wanted or path.startswith(wanted + "/")
    return path.rsplit("/", 1)[-1] == wanted


# --------------------------------------------------------------------------------------------------
# Resolution


@dataclass(frozen=True)
class _Kind:
    label: str
    vim_type: Any
    list_tool: str


_VM = _Kind("VM", vim.VirtualMachine, "list_vms")
_HOST = _Kind("host", vim.HostSystem, "list_hosts")
_CLUSTER = _Kind("cluster", vim.ClusterComputeResource, "list_clusters")
_DATASTORE = _Kind("datastore", vim.Datastore, "list_datastores")
_NETWORK = _Kind("network", vim.Network, "get_host_details")
_POOL = _Kind("resource pool", vim.ResourcePool, "get_cluster_details")
_FOLDER = _Kind("folder", vim.Folder, "list_vms (fields folder)")


def _not_found(session: HasTarget, kind: _Kind, ref: str) -> errors.NotFound:
    target = session.target.name
    return errors.NotFound(
        f"no {kind.label} named or with moid '{ref}' on target '{target}'; call {kind.list_tool} to see "
        "what exists (names are exact and case-sensitive)", target=target, ref=ref)


def _ambiguous(session: HasTarget, kind: _Kind, ref: str, moids: Sequence[str]) -> errors.Ambiguous:
    target = session.target.name
    return errors.Ambiguous(
        f"{len(moids)} {kind.label}s on target '{target}' are named '{ref}'; name one by its moid: "
        f"{', '.join(moids)}", target=target, ref=ref, candidates=list(moids))


def _pick(session: HasTarget, kind: _Kind, ref: str, objects: Sequence[ObjectProps],
         names: Callable[[ObjectProps], Iterable[str]] | None = None) -> ObjectProps:
    """The one object ``ref`` names among ``objects``: a moid wins over names; else NotFound/Ambiguous."""
    for obj in objects:
        if obj.moid == ref:
            return obj
    of = names or (lambda o: (o.props.get("name", ""),))
    matches = [obj for obj in objects if ref in of(obj)]
    if not matches:
        raise _not_found(session, kind, ref)
    if len(matches) > 1:
        raise _ambiguous(session, kind, ref, sorted(m.moid for m in matches))
    return matches[0]


def find_vm_by_name(session: Session, name: str) -> list[str]:
    """Moids of every VM whose name is exactly ``name`` (one sweep of names), sorted."""
    objects = sweep(session, [Query(vim.VirtualMachine, ("name",))])
    return sorted(o.moid for o in objects if o.props.get("name") == name)


def _find(session: Session, kind: _Kind, ref: str) -> str:
    if not ref:
        raise errors.InvalidArgument(kind.label.replace(" ", "_").lower(), "name or moid must not be empty")
    return _pick(session, kind, ref, sweep(session, [Query(kind.vim_type, ("name",))])).moid


@dataclass(frozen=True)
class VmRef:
    """A resolved VM and the facts policy matches on.

    ``folder`` is the inventory path of its folder (``/DC0/vm/prod``); ``resource_pool`` and ``host``
    are names (moids alongside); states are vSphere's values (``poweredOn``, ``orphaned``, ...).
    """

    moid: str
    name: str
    folder: str | None
    resource_pool: str | None
    host: str | None
    connection_state: str | None
    power_state: str | None
    datacenter: str | None = None
    cluster: str | None = None
    folder_moid: str | None = None
    resource_pool_moid: str | None = None
    host_moid: str | None = None
    template: bool = False

    def managed_object(self, session: Session) -> Any:
        return managed_object(session, vim.VirtualMachine, self.moid)

    def facts(self) -> dict[str, Any]:
        """The facts as a JSON-able dict (unset ones omitted)."""
        return {k: v for k, v in self.__dict__.items() if v is not None}


_VM_FACT_PATHS: dict[Any, tuple[str, ...]] = {
    vim.VirtualMachine: ("name", "parent", "resourcePool", "runtime.host", "runtime.connectionState",
                         "runtime.powerState", "config.template"),
    vim.Folder: ("name", "parent"),
    vim.Datacenter: ("name", "parent"),
    vim.ResourcePool: ("name", "owner"),
    vim.ComputeResource: ("name",),
    vim.HostSystem: ("name",),
}

# From the VM up its folder chain, and from its pool to the pool's cluster and that cluster's hosts,
# so that folder path, pool, cluster and host name arrive in the one round trip.
_VM_FACT_TRAVERSAL = (
    traverse("vmFolder", vim.VirtualMachine, "parent", "folderUp", "dcUp"),
    traverse("folderUp", vim.Folder, "parent", "folderUp", "dcUp"),
    traverse("dcUp", vim.Datacenter, "parent", "folderUp"),
    traverse("vmPool", vim.VirtualMachine, "resourcePool", "poolOwner"),
    traverse("poolOwner", vim.ResourcePool, "owner", "ownerHosts"),
    traverse("ownerHosts", vim.ComputeResource, "host"),
)


def vm_facts(session: Session, moid: str) -> VmRef:
    """The facts of the VM ``moid`` in one PropertyCollector round trip (a second one only for a VM
    without a resource pool, to name its host). A VM that no longer exists raises the target's
    ``ManagedObjectNotFound`` fault."""
    vm = managed_object(session, vim.VirtualMachine, moid)
    return _vm_ref(session, moid, retrieve(session, object_spec(vm, _VM_FACT_PATHS, _VM_FACT_TRAVERSAL)))


def _vm_ref(session: Session, moid: str, objects: Sequence[ObjectProps]) -> VmRef:
    """The facts of VM ``moid`` from a retrieval made with ``_VM_FACT_PATHS`` and ``_VM_FACT_TRAVERSAL``."""
    groups = by_type(objects)
    me = next(o for o in groups.get("VirtualMachine", []) if o.moid == moid)
    tree = FolderTree.from_objects(objects, session.content.rootFolder._moId)
    names = {o.moid: o.props.get("name") for o in objects}
    host_moid = me.props.get("runtime.host")
    if host_moid is not None and host_moid not in names:
        host = retrieve(session, object_spec(managed_object(session, vim.HostSystem, host_moid),
                                             {vim.HostSystem: ("name",)}))
        names.update({o.moid: o.props.get("name") for o in host})
    pool_moid = me.props.get("resourcePool")
    clusters = groups.get("ClusterComputeResource", [])
    p = me.props
    return VmRef(
        moid=moid, name=p.get("name", moid), folder=tree.path(p.get("parent")),
        resource_pool=names.get(pool_moid) if pool_moid else None,
        host=names.get(host_moid) if host_moid else None,
        connection_state=p.get("runtime.connectionState"), power_state=p.get("runtime.powerState"),
        datacenter=tree.datacenter(p.get("parent"), {o.moid for o in groups.get("Datacenter", [])}),
        cluster=clusters[0].props.get("name") if clusters else None,
        folder_moid=p.get("parent"), resource_pool_moid=pool_moid, host_moid=host_moid,
        template=bool(p.get("config.template", False)),
    )


def resolve_vm(session: Session, ref: str) -> VmRef:
    """The VM ``ref`` names (exact name or moid) with its facts; NotFound / Ambiguous otherwise."""
    moid = _find(session, _VM, ref)
    try:
        return vm_facts(session, moid)
    except vmodl.fault.ManagedObjectNotFound:  # deleted between the two reads
        raise _not_found(session, _VM, ref) from None


@dataclass(frozen=True)
class HostRef:
    moid: str
    name: str
    cluster: str | None
    connection_state: str | None
    power_state: str | None
    in_maintenance: bool | None
    compute_resource_moid: str | None = None

    def managed_object(self, session: Session) -> Any:
        return managed_object(session, vim.HostSystem, self.moid)


_HOST_PATHS = ("name", "parent", "runtime.connectionState", "runtime.powerState", "runtime.inMaintenanceMode")


def resolve_host(session: Session, ref: str) -> HostRef:
    """The host ``ref`` names (exact name or moid), with its cluster and states, from one sweep."""
    objects = sweep(session, [Query(vim.HostSystem, _HOST_PATHS), Query(vim.ComputeResource, ("name",))])
    groups = by_type(objects)
    host = _pick(session, _HOST, ref, groups.get("HostSystem", []))
    clusters = {o.moid: o.props.get("name") for o in groups.get("ClusterComputeResource", [])}
    p = host.props
    parent = p.get("parent")
    return HostRef(
        moid=host.moid, name=p.get("name", host.moid), cluster=clusters.get(parent) if parent else None,
        connection_state=p.get("runtime.connectionState"), power_state=p.get("runtime.powerState"),
        in_maintenance=p.get("runtime.inMaintenanceMode"), compute_resource_moid=parent,
    )


@dataclass(frozen=True)
class ClusterRef:
    moid: str
    name: str

    def managed_object(self, session: Session) -> Any:
        return managed_object(session, vim.ClusterComputeResource, self.moid)


def resolve_cluster(session: Session, ref: str) -> ClusterRef:
    """The cluster ``ref`` names (exact name or moid)."""
    objects = sweep(session, [Query(vim.ClusterComputeResource, ("name",))])
    found = _pick(session, _CLUSTER, ref, objects)
    return ClusterRef(found.moid, found.props.get("name", found.moid))


@dataclass(frozen=True)
class DatastoreRef:
    moid: str
    name: str
    type: str | None
    accessible: bool | None
    capacity_bytes: int | None
    free_bytes: int | None
    maintenance_mode: str | None

    def managed_object(self, session: Session) -> Any:
        return managed_object(session, vim.Datastore, self.moid)


_DATASTORE_PATHS = ("name", "summary.type", "summary.accessible", "summary.capacity", "summary.freeSpace",
                    "summary.maintenanceMode")


def resolve_datastore(session: Session, ref: str) -> DatastoreRef:
    """The datastore ``ref`` names (exact name or moid) with type, accessibility and space."""
    found = _pick(session, _DATASTORE, ref, sweep(session, [Query(vim.Datastore, _DATASTORE_PATHS)]))
    p = found.props
    return DatastoreRef(
        found.moid, p.get("name", found.moid), p.get("summary.type"), p.get("summary.accessible"),
        p.get("summary.capacity"), p.get("summary.freeSpace"), p.get("summary.maintenanceMode"))


@dataclass(frozen=True)
class NetworkRef:
    """A network: ``type`` is ``Network``, ``DistributedVirtualPortgroup`` or ``OpaqueNetwork``."""

    moid: str
    name: str
    type: str
    accessible: bool | None

    def managed_object(self, session: Session) -> Any:
        return managed_object(session, getattr(vim, self.type, vim.Network), self.moid)


def resolve_network(session: Session, ref: str) -> NetworkRef:
    """The network or distributed port group ``ref`` names (exact name or moid)."""
    objects = sweep(session, [Query(vim.Network, ("name", "summary.accessible"))])
    found = _pick(session, _NETWORK, ref, objects)
    vim_name = {"DistributedVirtualPortgroup": "dvs.DistributedVirtualPortgroup"}.get(found.type, found.type)
    return NetworkRef(found.moid, found.props.get("name", found.moid), vim_name,
                      found.props.get("summary.accessible"))


@dataclass(frozen=True)
class PoolRef:
    """A resource pool (or vApp); ``owner`` is the name of the cluster or standalone host it belongs to."""

    moid: str
    name: str
    owner: str | None
    owner_moid: str | None
    vapp: bool = False

    def managed_object(self, session: Session) -> Any:
        return managed_object(session, vim.VirtualApp if self.vapp else vim.ResourcePool, self.moid)


def resolve_pool(session: Session, ref: str) -> PoolRef:
    """The resource pool ``ref`` names (exact name, ``owner/name`` or moid).

    Every cluster's root pool is called ``Resources``: ``DC0_C0/Resources`` names one of them.
    """
    objects = sweep(session, [Query(vim.ResourcePool, ("name", "owner")),
                              Query(vim.ComputeResource, ("name",))])
    groups = by_type(objects)
    owners = {o.moid: o.props.get("name") for group in ("ComputeResource", "ClusterComputeResource")
              for o in groups.get(group, [])}
    pools = groups.get("ResourcePool", []) + groups.get("VirtualApp", [])

    def names(o: ObjectProps) -> tuple[str, ...]:
        name = o.props.get("name", "")
        return (name, f"{owners.get(o.props.get('owner', ''), '')}/{name}")

    found = _pick(session, _POOL, ref, pools, names)
    owner = found.props.get("owner")
    return PoolRef(found.moid, found.props.get("name", found.moid), owners.get(owner) if owner else None,
                   owner, vapp=found.type == "VirtualApp")


@dataclass(frozen=True)
class FolderRef:
    """A folder: ``path`` is its inventory path; ``child_types`` what it may hold (``VirtualMachine``...)."""

    moid: str
    name: str
    path: str | None
    child_types: tuple[str, ...]

    def managed_object(self, session: Session) -> Any:
        return managed_object(session, vim.Folder, self.moid)


def folder_tree(session: Session, extra: Sequence[str] = ()) -> tuple[FolderTree, list[ObjectProps]]:
    """Every folder and datacenter (name, parent and ``extra`` paths of folders) from one sweep."""
    objects = sweep(session, [Query(vim.Folder, ("name", "parent", *extra)),
                              Query(vim.Datacenter, ("name", "parent"))])
    return FolderTree.from_objects(objects, session.content.rootFolder._moId), objects


def resolve_folder(session: Session, ref: str) -> FolderRef:
    """The folder ``ref`` names: its moid, its inventory path (``/DC0/vm/prod``) or its exact name."""
    tree, objects = folder_tree(session, ("childType",))
    folders = [o for o in objects if o.type == "Folder" and o.moid != tree.root]
    found = _pick(session, _FOLDER, ref, folders,
                 lambda o: (o.props.get("name", ""), tree.path(o.moid) or "", (tree.path(o.moid) or "")[1:]))
    return FolderRef(found.moid, found.props.get("name", found.moid), tree.path(found.moid),
                     tuple(found.props.get("childType", [])))
