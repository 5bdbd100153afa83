"""MCP tasks over HTTPS with the real SDK client (2025-11-25) and the simulator: a clone started as a task
survives the client's disconnect and is polled to completion from a new connection; another is cancelled
in vSphere (the launcher's slow tasks honour CancelTask). The SDK's client has no task methods, so the
requests go through its session's dispatcher as they are (``raw``)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from support.httpserver import Served, audit_rows, build_gateway, mcp_client, serve
from support.simulator import MakeSimulator, count_vms_named, find_vm, pyvmomi_connect

pytestmark = pytest.mark.anyio
SOURCE = "DC0_C0_RP0_VM0"


async def raw(client: Client, method: str, params: dict[str, Any]) -> dict[str, Any]:
    return await client.session._dispatcher.send_raw_request(method, params, {})


async def start_clone(client: Client, name: str, **more: Any) -> str:
    arguments = {"target": "vc1", "vm": SOURCE, "name": name, **more}
    created = await raw(client, "tools/call", {"name": "clone_vm", "task": {"ttl": 60_000},
                                               "arguments": arguments})
    assert created["task"]["status"] == "working", created
    return str(created["task"]["taskId"])


async def poll(client: Client, task_id: str, done: Any, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        task = await raw(client, "tasks/get", {"taskId": task_id})
        if done(task):
            return task
        assert time.monotonic() < deadline, f"task never reached the state wanted: {task}"
        await asyncio.sleep(0.1)


async def test_a_task_survives_a_disconnect_and_another_is_cancelled(
    tmp_path: Path, make_simulator: MakeSimulator
) -> None:
    sim = make_simulator(vms=1)
    sim.control("/slow-task", {"method": "CloneVM_Task", "seconds": 3, "count": 2})
    gateway = build_gateway(tmp_path, sim)
    served: Served = serve(tmp_path, gateway)
    try:
        async with mcp_client(served, served.tokens["alice"], "legacy") as client:
            listed = {t.name: t for t in (await client.list_tools()).tools}
            assert listed["clone_vm"].execution is not None
            assert listed["clone_vm"].execution.task_support == "optional"
            assert listed["power_on_vm"].execution is None
            first = await start_clone(client, "task-clone", idempotency_key="task-key")
        async with mcp_client(served, served.tokens["alice"], "legacy") as client:  # a new connection
            assert await start_clone(client, "task-clone", idempotency_key="task-key") == first  # a retry
            await poll(client, first, lambda t: t["status"] != "working")
            result = await raw(client, "tasks/result", {"taskId": first})
            second = await start_clone(client, "cancelled-clone")
            await poll(client, second, lambda t: "%" in t.get("statusMessage", ""))  # the vSphere task runs
            cancelled = await raw(client, "tasks/cancel", {"taskId": second})
            listed_tasks = await raw(client, "tasks/list", {})
        async with mcp_client(served, served.tokens["bob"], "legacy") as other:
            foreign = await other.session._dispatcher.send_raw_request("tasks/list", {}, {})
    finally:
        served.stop()
        await gateway.close()
    assert result["isError"] is False, result
    assert "task-clone" in result["content"][0]["text"]
    assert cancelled["status"] == "cancelled", cancelled
    si = pyvmomi_connect(sim)
    assert (count_vms_named(si, "task-clone"), count_vms_named(si, "cancelled-clone")) == (1, 0)
    assert {t["taskId"] for t in listed_tasks["tasks"]} == {first, second}
    assert foreign["tasks"] == []  # a task is its caller's only
    (row,) = [r for r in audit_rows(gateway) if r.get("phase") == "task_cancel"]
    assert (row["task_id"], row["outcome"], row["caller"]) == (second, "cancelled", "alice")


async def test_any_replica_answers_for_a_task_and_passes_its_cancellation_on(
    tmp_path: Path, make_simulator: MakeSimulator, pg_url: str
) -> None:
    sim = make_simulator(vms=1)
    sim.control("/slow-task", {"method": "CloneVM_Task", "seconds": 3, "count": 2})
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    replica_a = build_gateway(tmp_path / "a", sim, database_url=pg_url)
    replica_b = build_gateway(tmp_path / "b", sim, database_url=pg_url)
    served_a = serve(tmp_path / "a", replica_a)
    served_b = serve(tmp_path / "b", replica_b, tokens=served_a.tokens)
    try:
        async with mcp_client(served_a, served_a.tokens["alice"], "legacy") as on_a:
            first = await start_clone(on_a, "replica-clone")
            second = await start_clone(on_a, "replica-cancelled")
        async with mcp_client(served_b, served_b.tokens["alice"], "legacy") as on_b:
            await poll(on_b, second, lambda t: "%" in t.get("statusMessage", ""))
            await raw(on_b, "tasks/cancel", {"taskId": second})  # stored; replica A cancels in vSphere
            ended = await poll(on_b, second, lambda t: t["status"] != "working")
            await poll(on_b, first, lambda t: t["status"] != "working")
            result = await raw(on_b, "tasks/result", {"taskId": first})
        rows = audit_rows(replica_a)
    finally:
        served_a.stop()
        served_b.stop()
        await replica_a.close()
        await replica_b.close()
    assert result["isError"] is False and "replica-clone" in result["content"][0]["text"], result
    assert ended["status"] == "cancelled", ended
    si = pyvmomi_connect(sim)
    assert (count_vms_named(si, "replica-clone"), count_vms_named(si, "replica-cancelled")) == (1, 0)
    outcomes = sorted(r["outcome"] for r in rows if r.get("phase") == "task_cancel")
    assert outcomes == ["cancelled", "passed_on"]  # asked on B, done on A


def test_a_task_vsphere_will_not_cancel_is_reported_not_cancelled(make_simulator: MakeSimulator) -> None:
    from gateway.vsphere.task_waiter import cancel_task

    sim = make_simulator(vms=1)
    si = pyvmomi_connect(sim)
    vm = find_vm(si, SOURCE)
    task = vm.PowerOffVM_Task()  # the simulator's own task: done at once, not cancellable
    why = cancel_task(task, "vc1")
    assert why is not None and f"did not cancel task {task._moId}" in why
