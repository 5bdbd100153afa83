"""gateway.vsphere.resolve: inventory paths, folder filters, and picking one object by name or moid."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest

from gateway import errors
from gateway.config import Target
from gateway.vsphere.resolve import (
    _CLUSTER,
    _DATASTORE,
    _FOLDER,
    _HOST,
    _NETWORK,
    _POOL,
    _VM,
    FolderTree,
    VmRef,
    _Kind,
    _pick,
    _vm_ref,
    folder_matches,
)
from gateway.vsphere.soap_scan import ObjectProps

ROOT = "group-d1"


def tree_objects() -> list[ObjectProps]:
    return [
        ObjectProps("Folder", ROOT, {"name": "Datacenters"}),
        ObjectProps("Datacenter", "dc-1", {"name": "DC0", "parent": ROOT}),
        ObjectProps("Folder", "group-v1", {"name": "vm", "parent": "dc-1"}),
        ObjectProps("Folder", "group-v2", {"name": "prod", "parent": "group-v1"}),
        ObjectProps("Folder", "group-v3", {"name": "web", "parent": "group-v2"}),
        ObjectProps("Folder", "group-x", {"name": "orphan"}),
        ObjectProps("VirtualMachine", "vm-1", {"name": "not a folder", "parent": "group-v3"}),
    ]


@pytest.fixture
def tree() -> FolderTree:
    return FolderTree.from_objects(tree_objects(), ROOT)


@pytest.mark.parametrize(("moid", "path"), [
    ("group-v3", "/DC0/vm/prod/web"),
    ("group-v2", "/DC0/vm/prod"),
    ("group-v1", "/DC0/vm"),
    ("dc-1", "/DC0"),
    ("group-x", "/orphan"),
    ("vm-1", None),
    ("nowhere", None),
    (None, None),
])
def test_folder_paths(tree: FolderTree, moid: str | None, path: str | None) -> None:
    assert tree.path(moid) == path


def test_paths_are_kept_once_computed(tree: FolderTree) -> None:
    assert tree.path("group-v3") is tree.path("group-v3")


def test_the_root_folders_path_is_a_slash(tree: FolderTree) -> None:
    assert tree.path(ROOT) == "/"


@pytest.mark.parametrize(("moid", "datacenter"), [
    ("group-v3", "DC0"), ("group-v1", "DC0"), ("dc-1", "DC0"), ("group-x", None), (None, None), (ROOT, None),
])
def test_the_datacenter_above_a_folder(tree: FolderTree, moid: str | None, datacenter: str | None) -> None:
    assert tree.datacenter(moid, {"dc-1"}) == datacenter


def test_a_folder_without_a_name_is_named_by_its_moid() -> None:
    tree = FolderTree.from_objects([ObjectProps("Folder", "group-9", {"parent": ROOT})], ROOT)
    assert tree.path("group-9") == "/group-9"


@pytest.mark.parametrize(("path", "wanted", "matches"), [
    ("/DC0/vm/prod", "prod", True),
    ("/DC0/vm/prod/web", "prod", False),
    ("/DC0/vm/prod", "/DC0/vm/prod", True),
    ("/DC0/vm/prod/web", "/DC0/vm/prod", True),
    ("/DC0/vm/prod/web", "DC0/vm/prod/", True),
    ("/DC0/vm/production", "/DC0/vm/prod", False),
    ("/DC0/vm/prod", "/DC0/vm/prod/web", False),
    ("/DC0/vm/prod", "Prod", False),
    (None, "prod", False),
    (None, "/DC0", False),
])
def test_folder_filters(path: str | None, wanted: str, matches: bool) -> None:
    assert folder_matches(path, wanted) is matches


# --------------------------------------------------------------------------- picking one object


@dataclass(frozen=True)
class Reader:
    target: Target


READER = Reader(Target("vc1", "vc1.example", "VC1"))
VMS = [ObjectProps("VirtualMachine", "vm-1", {"name": "web"}),
       ObjectProps("VirtualMachine", "vm-2", {"name": "web"}),
       ObjectProps("VirtualMachine", "vm-3", {"name": "db"}),
       ObjectProps("VirtualMachine", "vm-4", {"name": "vm-3"})]


def test_a_name_picks_its_object() -> None:
    assert _pick(READER, _VM, "db", VMS).moid == "vm-3"


def test_a_moid_wins_over_a_name() -> None:
    assert _pick(READER, _VM, "vm-3", VMS).moid == "vm-3"


def test_names_are_exact_and_case_sensitive() -> None:
    with pytest.raises(errors.NotFound):
        _pick(READER, _VM, "DB", VMS)


def test_a_name_nothing_carries() -> None:
    with pytest.raises(errors.NotFound) as raised:
        _pick(READER, _VM, "app", VMS)
    assert raised.value.code == "not_found"
    assert raised.value.message == ("no VM named or with moid 'app' on target 'vc1'; call list_vms to see "
                                    "what exists (names are exact and case-sensitive)")
    assert raised.value.details == {"target": "vc1", "ref": "app"}


def test_a_name_several_objects_carry_lists_their_moids() -> None:
    with pytest.raises(errors.Ambiguous) as raised:
        _pick(READER, _VM, "web", list(reversed(VMS)))
    assert raised.value.code == "ambiguous"
    assert raised.value.message == "2 VMs on target 'vc1' are named 'web'; name one by its moid: vm-1, vm-2"
    assert raised.value.details["candidates"] == ["vm-1", "vm-2"]


@pytest.mark.parametrize(("kind", "label", "tool"), [
    (_VM, "VM", "list_vms"), (_HOST, "host", "list_hosts"), (_CLUSTER, "cluster", "list_clusters"),
    (_DATASTORE, "datastore", "list_datastores"), (_NETWORK, "network", "get_host_details"),
    (_POOL, "resource pool", "get_cluster_details"), (_FOLDER, "folder", "list_vms (fields folder)"),
])
def test_not_found_names_the_kind_and_the_tool_to_list_them(kind: _Kind, label: str, tool: str) -> None:
    with pytest.raises(errors.NotFound) as raised:
        _pick(READER, kind, "x", [])
    assert raised.value.message.startswith(f"no {label} named or with moid 'x' on target 'vc1'; call {tool} ")


def test_other_names_of_an_object_can_pick_it() -> None:
    pools = [ObjectProps("ResourcePool", "resgroup-1", {"name": "Resources"}),
             ObjectProps("ResourcePool", "resgroup-2", {"name": "Resources"})]
    owners = {"resgroup-1": "C0", "resgroup-2": "C1"}

    def names(o: ObjectProps) -> tuple[str, ...]:
        return (o.props["name"], f"{owners[o.moid]}/{o.props['name']}")

    assert _pick(READER, _POOL, "C1/Resources", pools, names).moid == "resgroup-2"
    with pytest.raises(errors.Ambiguous):
        _pick(READER, _POOL, "Resources", pools, names)


# --------------------------------------------------------------------------- a VM's facts


def vm_fact_objects(**vm_props: Any) -> list[ObjectProps]:
    props = {"name": "web-1", "parent": "group-v3", "resourcePool": "resgroup-1", "runtime.host": "host-1",
             "runtime.connectionState": "connected", "runtime.powerState": "poweredOn", **vm_props}
    return [*tree_objects()[:5],
            ObjectProps("VirtualMachine", "vm-1", props),
            ObjectProps("ResourcePool", "resgroup-1", {"name": "gold", "owner": "domain-c1"}),
            ObjectProps("ClusterComputeResource", "domain-c1", {"name": "C0"}),
            ObjectProps("HostSystem", "host-1", {"name": "esx-1"})]


#: what ``_vm_ref`` reads of a session when every name is in the retrieval: the root folder's moid
SESSION = SimpleNamespace(content=SimpleNamespace(rootFolder=SimpleNamespace(_moId=ROOT)))


def test_a_vms_facts_from_one_retrieval() -> None:
    vm = _vm_ref(SESSION, "vm-1", vm_fact_objects())
    assert vm == VmRef(moid="vm-1", name="web-1", folder="/DC0/vm/prod/web", resource_pool="gold",
                       host="esx-1", connection_state="connected", power_state="poweredOn", datacenter="DC0",
                       cluster="C0",
                       folder_moid="group-v3", resource_pool_moid="resgroup-1", host_moid="host-1",
                       template=False)


def test_a_template_and_a_vm_without_pool_or_host() -> None:
    objects = vm_fact_objects(**{"config.template": True})
    props = objects[5].props
    del props["resourcePool"], props["runtime.host"]
    vm = _vm_ref(SESSION, "vm-1", objects)
    assert vm.template is True
    assert vm.resource_pool is None and vm.host is None and vm.host_moid is None


def test_vm_facts_omit_what_is_unset() -> None:
    vm = VmRef("vm-1", "web", None, None, None, None, "poweredOff")
    assert vm.facts() == {"moid": "vm-1", "name": "web", "power_state": "poweredOff", "template": False}
