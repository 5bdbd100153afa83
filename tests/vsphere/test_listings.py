"""gateway.vsphere.listings: list rows shaped from plain swept objects (filters, columns, lookups)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest

from gateway import errors
from gateway.config import Target
from gateway.guard.patterns import compile_user_regex
from gateway.vsphere.listings import (
    DEFAULT_VM_FIELDS,
    VM_COLUMNS,
    VmQuery,
    VmRows,
    cluster_rows,
    datastore_rows,
    host_rows,
    vm_rows,
)
from gateway.vsphere.soap_scan import ObjectProps

ROOT = "group-d1"
MIB = 1024 * 1024
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def inventory() -> list[ObjectProps]:
    """Two datacenters' worth of folders, a host, a pool and three VMs."""
    return [
        ObjectProps("Folder", ROOT, {"name": "Datacenters"}),
        ObjectProps("Datacenter", "dc-1", {"name": "DC0", "parent": ROOT}),
        ObjectProps("Folder", "group-v1", {"name": "vm", "parent": "dc-1"}),
        ObjectProps("Folder", "group-v2", {"name": "prod", "parent": "group-v1"}),
        ObjectProps("HostSystem", "host-1", {"name": "esx-1"}),
        ObjectProps("ResourcePool", "resgroup-1", {"name": "gold"}),
        ObjectProps("VirtualMachine", "vm-2", {
            "name": "web-2", "runtime.powerState": "poweredOff", "runtime.connectionState": "connected",
            "config.createDate": T0 + timedelta(days=2), "runtime.host": "host-1", "parent": "group-v2",
            "resourcePool": "resgroup-1", "config.hardware.numCPU": 2, "config.hardware.memoryMB": 2048}),
        ObjectProps("VirtualMachine", "vm-1", {
            "name": "web-1", "runtime.powerState": "poweredOn", "runtime.connectionState": "connected",
            "config.createDate": T0, "runtime.host": "host-1", "parent": "group-v1",
            "guest.ipAddress": "10.0.0.5", "config.hardware.numCPU": 1, "config.hardware.memoryMB": 1024}),
        ObjectProps("VirtualMachine", "vm-3", {
            "name": "db-1", "runtime.powerState": "poweredOn", "runtime.connectionState": "orphaned",
            "parent": "group-v2", "resourcePool": "resgroup-1", "config.template": True}),
    ]


def rows(**query: Any) -> dict[str, Any]:
    return vm_rows(inventory(), VmQuery(**query), ROOT)


def names(out: dict[str, Any]) -> list[str]:
    return [row["name"] for row in out["vms"]]


# --------------------------------------------------------------------------- list_vms


def test_every_vm_sorted_by_name_with_the_default_columns() -> None:
    out = rows()
    assert out["count"] == 3 and names(out) == ["db-1", "web-1", "web-2"]
    assert list(out["vms"][1]) == list(DEFAULT_VM_FIELDS)
    assert out["vms"][1] == {
        "moid": "vm-1", "name": "web-1", "power_state": "poweredOn", "connection_state": "connected",
        "created_at": "2026-01-01T00:00:00+00:00", "host": "esx-1", "guest_ip": "10.0.0.5", "cpu": 1,
        "memory_mb": 1024}
    assert "truncated" not in out and "without_created_at" not in out


def test_unset_values_are_none() -> None:
    db = rows()["vms"][0]
    assert db["created_at"] is None and db["host"] is None and db["guest_ip"] is None


def test_folder_and_pool_columns_resolve_names() -> None:
    out = rows(fields=("name", "folder", "resource_pool", "template"))
    assert out["vms"] == [
        {"name": "db-1", "folder": "/DC0/vm/prod", "resource_pool": "gold", "template": True},
        {"name": "web-1", "folder": "/DC0/vm", "resource_pool": None, "template": None},
        {"name": "web-2", "folder": "/DC0/vm/prod", "resource_pool": "gold", "template": None},
    ]


def test_a_column_asked_twice_appears_once() -> None:
    assert list(rows(fields=("name", "name", "moid"))["vms"][0]) == ["name", "moid"]


def test_unknown_columns_are_refused_by_name() -> None:
    with pytest.raises(errors.InvalidArgument) as raised:
        rows(fields=("name", "colour", "size"))
    assert raised.value.details["field"] == "fields"
    assert raised.value.message.startswith("fields: unknown column(s) colour, size; choose from moid, name, ")


@pytest.mark.parametrize(("query", "expected"), [
    ({"name": "web-1"}, ["web-1"]),
    ({"name": "WEB-1"}, []),
    ({"regex": compile_user_regex("name_regex", "^web")}, ["web-1", "web-2"]),
    ({"regex": compile_user_regex("name_regex", "1$")}, ["db-1", "web-1"]),
    ({"power_state": "poweredOn"}, ["db-1", "web-1"]),
    ({"connection_state": "orphaned"}, ["db-1"]),
    ({"folder": "prod"}, ["db-1", "web-2"]),
    ({"folder": "/DC0/vm"}, ["db-1", "web-1", "web-2"]),
    ({"folder": "DC0/vm/prod/"}, ["db-1", "web-2"]),
    ({"folder": "vm"}, ["web-1"]),
    ({"folder": "/DC0/v"}, []),
    ({"resource_pool": "gold"}, ["db-1", "web-2"]),
    ({"resource_pool": "resgroup-1"}, ["db-1", "web-2"]),
    ({"resource_pool": "silver"}, []),
    ({"created_before": T0 + timedelta(days=1)}, ["web-1"]),
    ({"created_after": T0}, ["web-2"]),
    ({"created_after": T0 - timedelta(days=1), "created_before": T0 + timedelta(days=3)}, ["web-1", "web-2"]),
    ({"power_state": "poweredOn", "folder": "prod"}, ["db-1"]),
])
def test_filters_all_hold(query: dict[str, Any], expected: list[str]) -> None:
    assert names(rows(fields=("name",), **query)) == expected


def test_date_filters_count_the_vms_they_could_not_judge() -> None:
    out = rows(created_after=T0 - timedelta(days=1))
    assert out["without_created_at"] == 1
    assert "without_created_at" not in rows(power_state="poweredOn")


def test_limit_cuts_after_sorting_and_says_so() -> None:
    out = rows(limit=2)
    assert out["count"] == 3 and out["truncated"] is True and names(out) == ["db-1", "web-1"]
    assert "truncated" not in rows(limit=3)


def test_rows_can_be_added_page_by_page() -> None:
    objects = inventory()
    listing = VmRows(VmQuery(fields=("name", "host", "folder")), ROOT)
    for obj in reversed(objects):  # the VMs before the names they refer to
        listing.add([obj])
    out = listing.result()
    assert out["vms"][1] == {"name": "web-1", "host": "esx-1", "folder": "/DC0/vm"}


def test_a_filter_needing_names_holds_the_vms_until_the_end() -> None:
    objects = inventory()
    listing = VmRows(VmQuery(fields=("name",), folder="prod"), ROOT)
    listing.add([o for o in objects if o.type == "VirtualMachine"])
    listing.add([o for o in objects if o.type != "VirtualMachine"])
    assert names(listing.result()) == ["db-1", "web-2"]


def test_vms_with_one_name_sort_by_moid() -> None:
    twins = [ObjectProps("VirtualMachine", m, {"name": "same"}) for m in ("vm-9", "vm-10", "vm-1")]
    out = vm_rows(twins, VmQuery(fields=("moid",)), ROOT)
    assert [r["moid"] for r in out["vms"]] == ["vm-1", "vm-10", "vm-9"]


def test_no_vms() -> None:
    assert vm_rows([], VmQuery(), ROOT) == {"count": 0, "vms": []}


def test_every_column_reads_without_lookups() -> None:
    vm = ObjectProps("VirtualMachine", "vm-1", {"name": "a", "config.guestFullName": "Linux"})
    out = vm_rows([vm], VmQuery(fields=tuple(VM_COLUMNS)), ROOT)
    (row,) = out["vms"]
    assert set(row) == set(VM_COLUMNS)
    assert row["guest_os"] == "Linux" and row["moid"] == "vm-1"


# --------------------------------------------------------------------------- hosts, clusters, datastores


@dataclass(frozen=True)
class Reader:
    target: Target


READER = Reader(Target("vc1", "vc1.example", "VC1"))


def hosts() -> list[ObjectProps]:
    return [
        ObjectProps("ClusterComputeResource", "domain-c1", {"name": "C0"}),
        ObjectProps("ComputeResource", "domain-s1", {"name": "standalone"}),
        ObjectProps("HostSystem", "host-2", {
            "name": "esx-b", "parent": "domain-c1", "runtime.connectionState": "connected",
            "runtime.powerState": "poweredOn", "runtime.inMaintenanceMode": False,
            "summary.hardware.numCpuCores": 8, "summary.hardware.cpuMhz": 2400,
            "summary.hardware.memorySize": 64 * 1024 * MIB, "summary.quickStats.overallCpuUsage": 100,
            "summary.quickStats.overallMemoryUsage": 2048, "config.product.version": "8.0.2",
            "config.product.build": "123", "vm": ["vm-1", "vm-2"]}),
        ObjectProps("HostSystem", "host-1", {"name": "esx-a", "parent": "domain-s1"}),
    ]


def test_host_rows() -> None:
    out = host_rows(READER, hosts())
    assert out["count"] == 2 and [r["name"] for r in out["hosts"]] == ["esx-a", "esx-b"]
    assert out["hosts"][1] == {
        "moid": "host-2", "name": "esx-b", "cluster": "C0", "connection_state": "connected",
        "power_state": "poweredOn", "maintenance_mode": False, "cpu_cores": 8, "cpu_mhz": 2400,
        "memory_mb": 65536, "cpu_usage_mhz": 100, "memory_usage_mb": 2048, "version": "8.0.2", "build": "123",
        "vm_count": 2}
    standalone = out["hosts"][0]
    assert standalone["cluster"] is None and standalone["memory_mb"] is None and standalone["vm_count"] == 0


@pytest.mark.parametrize("cluster", ["C0", "domain-c1"])
def test_host_rows_of_one_cluster(cluster: str) -> None:
    assert [r["name"] for r in host_rows(READER, hosts(), cluster)["hosts"]] == ["esx-b"]


def test_host_rows_of_an_unknown_cluster() -> None:
    with pytest.raises(errors.NotFound) as raised:
        host_rows(READER, hosts(), "C9")
    assert raised.value.message == ("no cluster named or with moid 'C9' on target 'vc1'; call list_clusters "
                                    "to see what exists (names are exact and case-sensitive)")


def test_cluster_rows() -> None:
    config = SimpleNamespace(drsConfig=SimpleNamespace(enabled=True, defaultVmBehavior="fullyAutomated"),
                             dasConfig=SimpleNamespace(enabled=False))
    objects = [
        ObjectProps("Folder", ROOT, {"name": "Datacenters"}),
        ObjectProps("Datacenter", "dc-1", {"name": "DC0", "parent": ROOT}),
        ObjectProps("Folder", "group-h1", {"name": "host", "parent": "dc-1"}),
        ObjectProps("ClusterComputeResource", "domain-c2", {"name": "B", "parent": "group-h1"}),
        ObjectProps("ClusterComputeResource", "domain-c1", {
            "name": "A", "parent": "group-h1", "host": ["host-1", "host-2"], "datastore": ["ds-1"],
            "summary.numEffectiveHosts": 2, "summary.totalCpu": 9600, "summary.totalMemory": 8 * 1024 * MIB,
            "summary.effectiveCpu": 9000, "summary.effectiveMemory": 7000, "overallStatus": "green",
            "configurationEx": config}),
    ]
    out = cluster_rows(objects, ROOT)
    assert out["count"] == 2 and [r["name"] for r in out["clusters"]] == ["A", "B"]
    assert out["clusters"][0] == {
        "moid": "domain-c1", "name": "A", "datacenter": "DC0", "host_count": 2, "effective_hosts": 2,
        "datastore_count": 1, "total_cpu_mhz": 9600, "total_memory_mb": 8192, "effective_cpu_mhz": 9000,
        "effective_memory_mb": 7000, "overall_status": "green", "drs_enabled": True,
        "drs_behavior": "fullyAutomated", "ha_enabled": False}
    b = out["clusters"][1]
    assert b["drs_enabled"] is None and b["ha_enabled"] is None and b["host_count"] == 0
    assert b["datacenter"] == "DC0"


def test_datastore_rows() -> None:
    objects = [
        ObjectProps("Datastore", "ds-2", {"name": "zeta"}),
        ObjectProps("Datastore", "ds-1", {
            "name": "alpha", "summary.type": "VMFS", "summary.capacity": 100 * MIB,
            "summary.freeSpace": 40 * MIB, "summary.uncommitted": 10 * MIB, "summary.accessible": True,
            "summary.maintenanceMode": "normal", "summary.url": "ds:///vmfs/volumes/1/", "vm": ["vm-1"]}),
        ObjectProps("HostSystem", "host-1", {"name": "not a datastore"}),
    ]
    out = datastore_rows(objects)
    assert out["count"] == 2
    assert out["datastores"][0] == {
        "moid": "ds-1", "name": "alpha", "type": "VMFS", "capacity_mb": 100, "free_mb": 40,
        "provisioned_mb": 70, "accessible": True, "maintenance_mode": "normal",
        "url": "ds:///vmfs/volumes/1/", "vm_count": 1}
    zeta = out["datastores"][1]
    assert zeta["capacity_mb"] is None and zeta["provisioned_mb"] is None and zeta["vm_count"] == 0


@pytest.mark.parametrize(("capacity", "free", "uncommitted", "provisioned"), [
    (100, None, None, 100), (100, 100, None, 0), (100, 0, 50, 150), (0, 0, 0, 0),
])
def test_provisioned_space(capacity: int, free: int | None, uncommitted: int | None,
                           provisioned: int) -> None:
    props: dict[str, Any] = {"name": "d", "summary.capacity": capacity * MIB}
    if free is not None:
        props["summary.freeSpace"] = free * MIB
    if uncommitted is not None:
        props["summary.uncommitted"] = uncommitted * MIB
    (row,) = datastore_rows([ObjectProps("Datastore", "ds-1", props)])["datastores"]
    assert row["provisioned_mb"] == provisioned
