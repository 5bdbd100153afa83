"""Task status notifications on 2026-07-28 (``subscriptions/listen`` with ``taskIds``) over real HTTPS.

The installed SDK's client listens for list changes only (it knows no ``taskIds`` and drops
``notifications/tasks``), so these tests speak the wire as the tasks extension writes it, with the httpx
client the SDK itself uses: the real server, the simulator, a clone made a task. A listen for the
caller's task is acknowledged with that task, sent its status as it changes with the clone's result at
the end, and then ended gracefully; another caller's task, an unknown one and a listen without the
extension are refused or left out, and each leaves a row."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import mcp_types as types
import pytest
from mcp.shared.exceptions import MCPError
from support.httpserver import audit_rows, served_gateway
from support.simulator import MakeSimulator, count_vms_named, pyvmomi_connect

from gateway.server.edge.mcp_task_notices import notice_of, requested_ids
from gateway.server.edge.mcp_tasks_2026 import detailed
from gateway.store.task_records import TaskRecord

pytestmark = pytest.mark.anyio
SOURCE = "DC0_C0_RP0_VM0"
EXTENSION = "io.modelcontextprotocol/tasks"
SUBSCRIPTION = "io.modelcontextprotocol/subscriptionId"


def envelope(extension: bool) -> dict[str, Any]:
    capabilities: dict[str, Any] = {"extensions": {EXTENSION: {}}} if extension else {}
    return {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientInfo": {"name": "wire-test", "version": "1"},
            "io.modelcontextprotocol/clientCapabilities": capabilities}


def headers(token: str, method: str, name: str | None = None) -> dict[str, str]:
    sent = {"Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream",
            "Content-Type": "application/json", "Mcp-Protocol-Version": "2026-07-28", "Mcp-Method": method}
    return {**sent, **({"Mcp-Name": name} if name else {})}


async def start_clone(http: httpx2.AsyncClient, token: str, name: str) -> str:
    params = {"name": "clone_vm", "arguments": {"target": "vc1", "vm": SOURCE, "name": name},
              "_meta": envelope(True)}
    answer = await http.post("/mcp", headers=headers(token, "tools/call", "clone_vm"),
                             json={"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params})
    result = answer.json()["result"]
    assert result["resultType"] == "task", result
    return str(result["taskId"])


@asynccontextmanager
async def listen(http: httpx2.AsyncClient, token: str, task_ids: list[str], *,
                 extension: bool = True) -> AsyncIterator[httpx2.Response]:
    params = {"notifications": {"taskIds": task_ids}, "_meta": envelope(extension)}
    body = {"jsonrpc": "2.0", "id": "listen-1", "method": "subscriptions/listen", "params": params}
    async with http.stream("POST", "/mcp", headers=headers(token, "subscriptions/listen"), json=body,
                           timeout=90) as answer:
        yield answer


async def messages(answer: httpx2.Response) -> AsyncIterator[dict[str, Any]]:
    """The JSON-RPC messages of an event stream, as they arrive."""
    async for line in answer.aiter_lines():
        if line.startswith("data:"):
            yield json.loads(line[len("data:"):])


async def test_a_listen_follows_the_callers_task_to_its_result_and_then_ends(
    tmp_path: Path, make_simulator: MakeSimulator
) -> None:
    sim = make_simulator(vms=1)
    sim.control("/slow-task", {"method": "CloneVM_Task", "seconds": 2, "count": 1})
    seen: list[dict[str, Any]] = []
    async with served_gateway(tmp_path, sim) as served, served.http() as http:
        alice, bob = served.tokens["alice"], served.tokens["bob"]
        task_id = await start_clone(http, alice, "noticed-clone")
        started = time.monotonic()
        async with listen(http, alice, [task_id, "no-such-task"]) as answer:
            content_type = answer.headers["content-type"]
            async for message in messages(answer):
                seen.append(message)
                assert time.monotonic() - started < 60, seen
        async with listen(http, bob, [task_id]) as other:  # another caller names alice's task
            theirs = [message async for message in messages(other)]
        rows = audit_rows(served.gateway)
    assert content_type.startswith("text/event-stream")
    ack, *notices, end = seen
    assert ack["method"] == "notifications/subscriptions/acknowledged", ack
    assert ack["params"]["notifications"] == {"taskIds": [task_id]}  # the unknown id is left out
    assert ack["params"]["_meta"][SUBSCRIPTION] == "listen-1"
    assert notices and all(n["method"] == "notifications/tasks" for n in notices), notices
    assert {n["params"]["taskId"] for n in notices} == {task_id}
    assert all(n["params"]["_meta"][SUBSCRIPTION] == "listen-1" for n in notices)
    assert notices[0]["params"]["status"] == "working" and notices[-1]["params"]["status"] == "completed"
    result = notices[-1]["params"]["result"]
    assert result["isError"] is False and "noticed-clone" in result["content"][0]["text"], result
    assert end["id"] == "listen-1" and end["result"]["_meta"][SUBSCRIPTION] == "listen-1"  # graceful end
    assert count_vms_named(pyvmomi_connect(sim), "noticed-clone") == 1
    their_ack, their_end = theirs  # nothing of alice's task is shown to bob, and the stream ends
    assert their_ack["params"]["notifications"] == {"taskIds": []} and "result" in their_end
    refusals = [r for r in rows if r.get("tool") == "subscriptions/listen"]
    assert [(r["caller"], r["reason_code"], r["task_ids"]) for r in refusals] == \
        [("alice", "not_your_task", 1), ("bob", "not_your_task", 1)]


async def test_a_listen_for_tasks_without_the_extension_is_refused(
    tmp_path: Path, make_simulator: MakeSimulator
) -> None:
    async with served_gateway(tmp_path, make_simulator(vms=1)) as served, served.http() as http:
        async with listen(http, served.tokens["alice"], ["any"], extension=False) as answer:
            status, body = answer.status_code, json.loads(await answer.aread())
        discovered = await http.post("/mcp", headers=headers(served.tokens["alice"], "server/discover"),
                                     json={"jsonrpc": "2.0", "id": 2, "method": "server/discover",
                                           "params": {"_meta": envelope(True)}})
    assert status in (200, 400) and body["error"]["code"] == -32021, body
    assert body["error"]["data"] == {"requiredCapabilities": {"extensions": {EXTENSION: {}}}}
    tools = discovered.json()["result"]["capabilities"]["tools"]
    assert tools.get("listChanged") is not True  # listen serves task notices; the tool list never changes


@pytest.mark.parametrize(("notifications", "wanted"), [
    ({}, None),
    ({"toolsListChanged": True}, None),  # the revision's own kinds: none of them names tasks
    ({"taskIds": []}, []),
    ({"taskIds": ["b", "a", "b"]}, ["b", "a"]),  # once each, in the order asked
])
def test_the_task_ids_a_listen_asks_for(notifications: dict[str, Any], wanted: list[str] | None) -> None:
    assert requested_ids(types.SubscriptionFilter.model_validate(notifications)) == wanted


@pytest.mark.parametrize("given", ["t1", [1, 2], [None], {"t1": True}])
def test_task_ids_that_are_not_a_list_of_strings_are_invalid_params(given: Any) -> None:
    with pytest.raises(MCPError) as refused:
        requested_ids(types.SubscriptionFilter.model_validate({"taskIds": given}))
    assert refused.value.error.code == types.INVALID_PARAMS


def test_a_notice_is_the_task_as_tasks_get_shows_it_with_the_stream_id() -> None:
    rec = TaskRecord("t1", "alice", "clone_vm", "vc1", "completed", 100.0, 160.0, 3700.0, result='{"ok":1}')
    notice = notice_of(rec, {SUBSCRIPTION: "listen-7"})
    dumped = notice.model_dump(by_alias=True, mode="json", exclude_none=True)
    assert dumped["method"] == "notifications/tasks"
    assert dumped["params"] == {**{k: v for k, v in detailed(rec).items() if k != "resultType"},
                                "_meta": {SUBSCRIPTION: "listen-7"}}
    assert dumped["params"]["result"]["content"][0]["text"] == '{"ok":1}'
