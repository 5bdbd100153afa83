"""The read-tool table: declarations, argument parsing, every tool against a vCenter and an ESXi
simulator through its ToolSpec, list_targets folding, and get_access_info."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from support.simulator import MakeSimulator, Simulator, credentials_env, open_pool, sim_target

from gateway import errors
from gateway.config import Target
from gateway.tools import read
from gateway.tools.spec import TARGETS, ToolSpec, by_name
from gateway.vocabulary import Category, Risk
from gateway.vsphere.access import PrivilegeCheck
from gateway.vsphere.pool import SessionPool
from gateway.vsphere.scheduler import Scheduler

TOOLS = by_name(read.READ_TOOLS)


def call(pool: SessionPool, name: str, **args: Any) -> Any:
    """Validate ``args`` as the pipeline does, then run the tool's read handler on the pool."""
    spec = TOOLS.get(name) or read.access_info_tool(read.READ_TOOLS)
    checked = spec.validate({"target": pool.target.name, **args})
    assert spec.read is not None
    return pool.run(lambda session: spec.read(session, checked))  # type: ignore[misc]


# --------------------------------------------------------------------------------------------------
# declarations


def test_every_read_tool_is_a_low_risk_fanout_read_taking_targets_first() -> None:
    expected = {
        "list_vms", "get_vm_details", "get_vm_performance", "list_hosts", "get_host_details", "list_clusters",
        "get_cluster_details", "list_datastores", "get_datastore_details", "get_events", "get_tasks",
        "get_customization_status", "list_snapshots",
    }
    assert set(TOOLS) == expected
    for spec in [*read.READ_TOOLS, read.access_info_tool(read.READ_TOOLS)]:
        assert (spec.kind, spec.risk, spec.target_mode) == (Category.READ, Risk.LOW, "fanout"), spec.name
        assert spec.params[0] == TARGETS and spec.read is not None, spec.name
        assert spec.annotations()["readOnlyHint"] is True
    assert (read.LIST_TARGETS.kind, read.LIST_TARGETS.target_mode, read.LIST_TARGETS.read) == (
        Category.READ, "none", None)


def test_access_info_table_covers_every_vsphere_tool() -> None:
    other = ToolSpec(name="power_on_vm", description="x", category=Category.WRITE, risk=Risk.MEDIUM,
                     privileges=("VirtualMachine.Interact.PowerOn",))
    spec = read.access_info_tool([read.LIST_TARGETS, *read.READ_TOOLS, other])
    assert spec.name == "get_access_info"
    with pytest.raises(errors.InvalidArgument, match="power_off_vm"):
        spec.read(None, {"tool": "power_off_vm"})  # type: ignore[misc]


# --------------------------------------------------------------------------------------------------
# argument parsing


@pytest.mark.parametrize(("text", "expected"), [
    ("2025-01-31T14:00:00Z", datetime(2025, 1, 31, 14, tzinfo=UTC)),
    ("2025-01-31T15:00:00+01:00", datetime(2025, 1, 31, 15, tzinfo=timezone(timedelta(hours=1)))),
    ("2025-01-31T14:00:00", datetime(2025, 1, 31, 14, tzinfo=UTC)),
    ("2025-01-31", datetime(2025, 1, 31, tzinfo=UTC)),
])
def test_timestamps_are_iso_8601_and_naive_means_utc(text: str, expected: datetime) -> None:
    assert read.parse_time("start", text) == expected


@pytest.mark.parametrize(("field", "value", "fn"), [
    ("start", "yesterday", read.parse_time),
    ("end", "31/01/2025", read.parse_time),
    ("regex", "web-(", read.parse_regex),
    ("regex", "a" * 300, read.parse_regex),
])
def test_bad_arguments_name_the_field(field: str, value: str, fn: Callable[[str, str], Any]) -> None:
    with pytest.raises(errors.InvalidArgument) as caught:
        fn(field, value)
    assert caught.value.details["field"] == field


def test_vm_query_and_windows_from_arguments() -> None:
    query = read.vm_query({"regex": "^web", "created_after": "2025-01-01T00:00:00Z",
                           "fields": ["name", "host"]})
    assert query.regex is not None and query.regex.pattern == "^web"
    assert query.fields == ("name", "host") and query.created_after == datetime(2025, 1, 1, tzinfo=UTC)
    with pytest.raises(errors.InvalidArgument, match="colour"):
        read.vm_query({"fields": ["name", "colour"]})
    now = datetime(2025, 6, 1, 12, tzinfo=UTC)
    assert read.window({"minutes": 30}, now).start == now - timedelta(minutes=30)
    explicit = read.window({"start": "2025-06-01T08:00:00Z", "end": "2025-06-01T09:00:00Z", "minutes": 5},
                           now)
    assert (explicit.start.hour, explicit.end.hour) == (8, 9)
    with pytest.raises(errors.InvalidArgument, match="start"):
        read.window({"start": "2025-06-01T10:00:00Z", "end": "2025-06-01T09:00:00Z"}, now)
    events = read.event_query({"event_type": "VmPoweredOnEvent", "entity_name": "web", "max_scan": 10}, now)
    assert events.event_types == ("VmPoweredOnEvent",) and events.max_scan == 10
    tasks = read.task_query({"state": "error", "task_id": "task-7"}, now)
    assert tasks.states == ("error",) and tasks.task_id == "task-7"


# --------------------------------------------------------------------------------------------------
# every tool on a vCenter and on an ESXi host


def test_every_tool_answers_on_a_vcenter(vc1: SessionPool) -> None:
    vms = call(vc1, "list_vms", regex="_VM0$", power_state="poweredOn", fields=["name", "folder"])
    assert vms == {"count": 2, "vms": [{"name": "DC0_C0_RP0_VM0", "folder": "/DC0/vm"},
                                      {"name": "DC0_H0_VM0", "folder": "/DC0/vm"}]}
    assert call(vc1, "get_vm_details", vm="DC0_H0_VM0")["host"] == "DC0_H0"
    perf = call(vc1, "get_vm_performance", vm="DC0_H0_VM0", samples=3)
    assert {m["name"] for m in perf["metrics"]} >= {"cpu.usage.average", "mem.usage.average"}
    assert all(m["samples"] == 3 for m in perf["metrics"]) and "disk.usage.average" in perf["unavailable"]
    assert call(vc1, "list_hosts", cluster="DC0_C0")["count"] == 2
    assert call(vc1, "get_host_details", host="DC0_C0_H0")["cluster"] == "DC0_C0"
    assert call(vc1, "list_clusters")["count"] == 1
    assert call(vc1, "get_cluster_details", cluster="DC0_C0")["host_count"] == 2
    assert call(vc1, "list_datastores")["count"] == 2
    assert call(vc1, "get_datastore_details", datastore="LocalDS_1")["vms"] == []
    events = call(vc1, "get_events", minutes=120, event_type="VmPoweredOnEvent", entity_name="^DC0_H0_VM")
    assert sorted(e["vm"] for e in events["events"]) == ["DC0_H0_VM0", "DC0_H0_VM1"]
    # the launcher keeps task history (tests/vsphere/test_history.py)
    tasks = call(vc1, "get_tasks", minutes=30)
    assert tasks["count"] == len(tasks["tasks"]) and "window" in tasks
    assert call(vc1, "get_customization_status", vm="DC0_H0_VM1")["finished"] is False
    assert call(vc1, "list_snapshots", vm="DC0_H0_VM1")["count"] == 0


def test_every_tool_answers_on_an_esxi_host(esx: SessionPool) -> None:
    assert call(esx, "list_vms")["count"] == 2
    assert call(esx, "get_vm_details", vm="ha-host_VM0")["datacenter"] == "ha-datacenter"
    assert call(esx, "get_vm_performance", vm="ha-host_VM0")["metrics"]
    [host] = call(esx, "list_hosts")["hosts"]
    assert call(esx, "get_host_details", host=host["name"])["vms"] == ["ha-host_VM0", "ha-host_VM1"]
    assert call(esx, "list_clusters") == {"clusters": [], "count": 0}
    with pytest.raises(errors.NotFound, match="list_clusters"):
        call(esx, "get_cluster_details", cluster="DC0_C0")
    [ds] = call(esx, "list_datastores")["datastores"]
    assert call(esx, "get_datastore_details", datastore=ds["name"])["vm_count"] == 2
    assert call(esx, "get_events", minutes=120)["count"] > 0
    assert "tasks" in call(esx, "get_tasks")  # ESXi keeps task history too (the launcher records it)
    assert call(esx, "get_customization_status", vm="ha-host_VM1")["status"] == "not_started"
    assert call(esx, "list_snapshots", vm="ha-host_VM1")["snapshots"] == []


def test_fan_out_answers_per_target(sim_vc1: Simulator, sim_esx: Simulator) -> None:
    targets = [sim_target("vc1", sim_vc1), sim_target("esx", sim_esx)]
    scheduler = Scheduler(targets, credentials_env({"vc1": sim_vc1, "esx": sim_esx}))
    spec = TOOLS["list_vms"]
    args = spec.validate({"target": "all", "name": "ha-host_VM0"})
    try:
        results = asyncio.run(scheduler.fan_out(["vc1", "esx"], lambda s: spec.read(s, args),  # type: ignore[misc]
                                                deadline=30))
        about = asyncio.run(scheduler.fan_out(["vc1", "esx"], read.target_about, deadline=30))
    finally:
        scheduler.close()
    assert results["vc1"] == {"ok": {"count": 0, "vms": []}}
    assert [r["name"] for r in results["esx"]["ok"]["vms"]] == ["ha-host_VM0"]
    rows = {r["name"]: r for r in read.summarize_targets(targets, about)}
    assert rows["vc1"]["instance_uuid"] == sim_vc1.instance_uuid
    assert rows["vc1"]["api_type"] == "VirtualCenter"
    assert rows["esx"]["instance_uuid"] is None and rows["esx"]["connectivity"] == "ok"


# --------------------------------------------------------------------------------------------------
# list_targets


def test_summarize_targets_reports_errors_and_shared_instances() -> None:
    targets = [Target("a", "vc.example", "A", tags=("prod",)), Target("b", "alias.example", "B", port=8443),
               Target("c", "esx.example", "C", standalone_host=True), Target("d", "down.example", "D")]
    about = {"product": "VMware vCenter Server", "full_name": "VMware vCenter Server 8.0", "version": "8.0",
             "build": "1", "api_type": "VirtualCenter", "instance_uuid": "u-1"}
    results: Mapping[str, Mapping[str, Any]] = {
        "a": {"ok": about}, "b": {"ok": about},
        "c": {"ok": {**about, "api_type": "HostAgent", "instance_uuid": None}},
        "d": {"error": {"code": "unreachable", "message": "target 'd': the connection was refused"}},
    }
    rows = {r["name"]: r for r in read.summarize_targets(targets, results)}
    assert rows["a"]["shares_instance_with"] == ["b"] and rows["b"]["shares_instance_with"] == ["a"]
    assert "shares_instance_with" not in rows["c"] and "shares_instance_with" not in rows["d"]
    assert (rows["a"]["address"], rows["b"]["address"], rows["a"]["tags"]) == (
        "vc.example", "alias.example:8443", ["prod"])
    assert rows["d"]["connectivity"] == "error" and rows["d"]["last_error"]["code"] == "unreachable"
    assert rows["a"]["connectivity"] == "ok" and rows["a"]["last_error"] is None
    missing = read.summarize_targets([Target("e", "e.example", "E")], {})
    assert missing[0]["connectivity"] == "error"


def test_two_entries_for_one_instance_are_flagged(make_simulator: MakeSimulator) -> None:
    uuid = "5f1e6d1a-0c1b-4f55-9a31-0000000000aa"
    sims = {name: make_simulator(vms=1, instance_uuid=uuid) for name in ("first", "again")}
    results = {}
    for name, sim in sims.items():
        pool = open_pool(name, sim)
        try:
            results[name] = {"ok": pool.run(read.target_about)}
        finally:
            pool.close()
    rows = read.summarize_targets([sim_target(n, s) for n, s in sims.items()], results)
    assert [r["shares_instance_with"] for r in rows] == [["again"], ["first"]]


# --------------------------------------------------------------------------------------------------
# get_access_info


def test_access_info_on_the_simulator(vc1: SessionPool, sim_vc1: Simulator) -> None:
    info = call(vc1, "get_access_info")
    assert info["user"] == sim_vc1.user and info["checked_on"] == "root folder"
    tools = {t["tool"]: t for t in info["tools"]}
    assert set(tools) == {*TOOLS, "get_access_info"}
    assert {t["status"] for t in tools.values()} == {"ready"}  # the simulator grants everything
    assert tools["get_vm_performance"]["privileges"] == ["System.View", "System.Read"]
    one = call(vc1, "get_access_info", tool="list_vms")
    assert [t["tool"] for t in one["tools"]] == ["list_vms"]
    assert one["privileges"] == {"System.View": "granted"}


def test_access_report_never_reports_undetermined_as_granted() -> None:
    tools = {"list_vms": ("System.View",), "power_on_vm": ("System.View", "VirtualMachine.Interact.PowerOn"),
             "delete_vm": ("System.View", "VirtualMachine.Inventory.Delete")}
    held: dict[str, bool | None] = {
        "System.View": True, "VirtualMachine.Interact.PowerOn": False,
        "VirtualMachine.Inventory.Delete": None,
    }
    check = PrivilegeCheck("svc@vsphere.local", held)
    report = read.access_report(check, tools)
    statuses = {t["tool"]: t["status"] for t in report["tools"]}
    assert statuses == {"list_vms": "ready", "power_on_vm": "missing", "delete_vm": "undetermined"}
    assert report["tools"][2]["missing"] == ["VirtualMachine.Interact.PowerOn"]
    assert report["privileges"]["VirtualMachine.Inventory.Delete"] == "undetermined"
    failed = read.access_report(PrivilegeCheck(None, {"System.View": None}, "NotAuthenticated"), tools)
    assert {t["status"] for t in failed["tools"]} == {"undetermined"}
    assert failed["lookup_error"] == "NotAuthenticated" and failed["user"] is None
