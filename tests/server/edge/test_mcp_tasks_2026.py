"""MCP tasks on 2026-07-28 (the ``io.modelcontextprotocol/tasks`` extension) over HTTPS with the SDK's client.

The real client in its default mode, the real server and the simulator: a clone made a task is polled to
completion from a new client session; another is cancelled in vSphere (the launcher's slow tasks honour
CancelTask); other callers can neither see, answer nor cancel a task, and a task showing its caller's name
under another key is not its caller's; each revision keeps its own task methods; another replica answers
and passes a cancellation on. The person at the client is asked before any task is made: a clone on a
gated ``confirm_by: elicitation`` target sends the client's person to the card first (the person approves
there, on the real page), and only the accepting retry becomes a task, which ends once the clone ran; a
declined one runs nothing and leaves no task; a client that can be asked still gets a task where nobody
need be. The installed SDK declares extensions but ships no tasks extension, so its wire shapes (from the
extension's schema) are written here as the SDK's ``ClientExtension`` and models."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import ssl
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal

import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from pydantic import Field
from support.httpserver import (
    FAST_HASH,
    Served,
    audit_rows,
    build_gateway,
    https_argv,
    mcp_client,
    run_serve,
    serve,
)
from support.simulator import MakeSimulator, count_vms_named, pyvmomi_connect, write_targets
from support.webserver import WebServer, decide, signed_in, web_server

from gateway.audit.query import read_rows
from gateway.auth.principal import CallerKey
from gateway.auth.tokens import create_token
from gateway.server.edge.tls import create_certificate
from gateway.store import SqliteStore
from gateway.store.task_records import TaskRecord
from gateway.vocabulary import Kind

pytestmark = pytest.mark.anyio
SOURCE = "DC0_C0_RP0_VM0"
EXTENSION = "io.modelcontextprotocol/tasks"


class CreateTaskResult(types.Result):
    """A tools/call answered with a task handle (``resultType: "task"``)."""

    result_type: Literal["task"] = "task"
    task_id: str
    status: str
    status_message: str | None = None
    created_at: str
    last_updated_at: str
    ttl_ms: int | None
    poll_interval_ms: int | None = None


class TaskParams(types.RequestParams):
    task_id: str


class UpdateParams(TaskParams):
    input_responses: dict[str, Any] = Field(default_factory=dict)


class GetTask(types.Request[TaskParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    name_param = "taskId"  # the extension's Mcp-Name header, for routing to the task's replica
    params: TaskParams


class CancelTask(types.Request[TaskParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    name_param = "taskId"  # the extension's Mcp-Name header, for routing to the task's replica
    params: TaskParams


class UpdateTask(types.Request[UpdateParams, Literal["tasks/update"]]):
    method: Literal["tasks/update"] = "tasks/update"
    name_param = "taskId"  # the extension's Mcp-Name header, for routing to the task's replica
    params: UpdateParams


class ResultOf(types.Request[TaskParams, Literal["tasks/result"]]):
    method: Literal["tasks/result"] = "tasks/result"
    name_param = "taskId"  # the extension's Mcp-Name header, for routing to the task's replica
    params: TaskParams


class ListTasks(types.Request[types.PaginatedRequestParams, Literal["tasks/list"]]):
    method: Literal["tasks/list"] = "tasks/list"
    params: types.PaginatedRequestParams


class GetTaskResult(types.Result):
    result_type: str
    task_id: str
    status: str
    status_message: str | None = None
    created_at: str
    last_updated_at: str
    ttl_ms: int | None
    poll_interval_ms: int | None = None
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None


async def _not_resolved(created: CreateTaskResult, ctx: ClaimContext) -> types.CallToolResult:
    raise AssertionError("these tests take the task handle themselves (allow_claimed)")


class Tasks(ClientExtension):
    """The client side of the extension: declared on every request, and the ``task`` result claimed."""

    identifier = EXTENSION

    def claims(self) -> Sequence[ResultClaim[Any]]:
        return (ResultClaim(result_type="task", model=CreateTaskResult, resolve=_not_resolved),)


def tasks_client(served: Served, token: str, mode: str = "auto", **options: Any) -> Any:
    return mcp_client(served, token, mode, extensions=[Tasks()], **options)


class PollingTasks(ClientExtension):
    """The extension as a client running in its default mode uses it: a task handle is polled with
    tasks/get until it ends, and the call answers with the task's result (``made`` keeps each handle)."""

    identifier = EXTENSION

    def __init__(self) -> None:
        self.made: list[CreateTaskResult] = []

    def claims(self) -> Sequence[ResultClaim[Any]]:
        return (ResultClaim(result_type="task", model=CreateTaskResult, resolve=self._resolve),)

    async def _resolve(self, created: CreateTaskResult, ctx: ClaimContext) -> types.CallToolResult:
        self.made.append(created)
        deadline = time.monotonic() + 60
        while True:
            task = await ctx.session.send_request(GetTask(params=TaskParams(task_id=created.task_id)),
                                                  GetTaskResult)
            if task.status != "working":
                assert task.result is not None, task
                return types.CallToolResult.model_validate(task.result)
            assert time.monotonic() < deadline, f"the task never ended: {task}"
            await asyncio.sleep(0.1)


class CardPerson:
    """The person at the client, sent to the proposal's card: approves it there on the real page (as
    ``approver``) and answers ``accept``, or declines without opening it. ``tasks_when_asked``: how many
    tasks existed when they were asked."""

    def __init__(self, web: WebServer, *, approver: str | None) -> None:
        self.web, self.approver = web, approver
        self.asked: list[types.ElicitRequestParams] = []
        self.tasks_when_asked: list[int] = []

    async def __call__(self, _ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        self.asked.append(params)
        self.tasks_when_asked.append(task_count(self.web))
        if self.approver is None or not isinstance(params, types.ElicitRequestURLParams):
            return types.ElicitResult(action="decline")
        proposal_id = params.url.split("#proposal=", 1)[1]
        async with signed_in(self.web, self.approver) as (page, csrf):
            approved = await decide(page, self.web, csrf, proposal_id, "approve")
        assert approved.status_code == 200, approved.text
        return types.ElicitResult(action="accept")


def task_count(web: WebServer) -> int:
    """How many MCP tasks the gateway's store holds (any caller's)."""
    rows = web.gateway.backends.tasks.store._read("count tasks", "SELECT COUNT(*) AS n FROM mcp_tasks")
    return int(rows[0]["n"])


#: the approval page's rules, with lab-vc gated for writes and confirmed by the person at the client
GATED_LAB = """\
defaults:
  destructive: allow
  max_calls_per_minute:
    write: null
    destructive: null
targets:
  "lab-vc":
    write: require_approval
    confirm_by: elicitation
protected: []
rules: []
maintenance_windows: []
"""


@asynccontextmanager
async def web_client(web: WebServer, who: str, extension: ClientExtension,
                     person: Any) -> AsyncIterator[Client]:
    """``who``'s SDK client in its default mode, with the tasks extension and an elicitation callback."""
    token = {"Authorization": f"Bearer {web.tokens[who]}"}
    http = httpx2.AsyncClient(verify=web.tls(), timeout=60, headers=token)
    transport = streamable_http_client(f"{web.origin}/mcp", http_client=http)
    options = {"extensions": [extension], "elicitation_callback": person}
    async with http, Client(transport, mode="auto", **options) as client:
        yield client


async def start_clone(client: Client, name: str, **more: Any) -> CreateTaskResult:
    arguments = {"target": "vc1", "vm": SOURCE, "name": name, **more}
    created = await client.session.call_tool("clone_vm", arguments, allow_claimed=True)
    assert isinstance(created, CreateTaskResult), created
    return created


async def get(client: Client, task_id: str) -> GetTaskResult:
    return await client.session.send_request(GetTask(params=TaskParams(task_id=task_id)), GetTaskResult)


async def poll(client: Client, task_id: str, done: Any, timeout: float = 60) -> GetTaskResult:
    deadline = time.monotonic() + timeout
    while True:
        task = await get(client, task_id)
        if done(task):
            return task
        assert time.monotonic() < deadline, f"task never reached the state wanted: {task}"
        await asyncio.sleep(0.1)


async def refused(call: Any) -> MCPError:
    with pytest.raises(MCPError) as caught:
        await call
    return caught.value


async def test_a_task_is_polled_to_completion_after_the_client_reconnects(
    tmp_path: Path, make_simulator: MakeSimulator
) -> None:
    sim = make_simulator(vms=1)
    sim.control("/slow-task", {"method": "CloneVM_Task", "seconds": 3, "count": 1})
    gateway = build_gateway(tmp_path, sim)
    served = serve(tmp_path, gateway)
    try:
        async with tasks_client(served, served.tokens["alice"]) as client:
            version, offered = client.protocol_version, client.server_capabilities.extensions
            created = await start_clone(client, "task-clone", idempotency_key="task-key")
        async with tasks_client(served, served.tokens["alice"]) as client:  # a new session, the same token
            again = await start_clone(client, "task-clone", idempotency_key="task-key")  # a retry
            done = await poll(client, created.task_id, lambda t: t.status != "working")
    finally:
        served.stop()
        await gateway.close()
    assert version == "2026-07-28" and offered is not None and EXTENSION in offered
    assert (created.status, created.ttl_ms, created.poll_interval_ms) == ("working", 3_600_000, 500)
    assert again.task_id == created.task_id
    assert done.status == "completed" and done.result is not None, done
    assert done.result["isError"] is False and "task-clone" in done.result["content"][0]["text"], done
    assert count_vms_named(pyvmomi_connect(sim), "task-clone") == 1  # made once


async def test_the_wire_shapes_are_the_extensions_and_a_late_cancel_is_acknowledged(
    tmp_path: Path, make_simulator: MakeSimulator
) -> None:
    """What the conformance suite's tasks scenarios check on their fixture tools, on clone_vm: the handle
    and tasks/get carry ``ttlMs``/``pollIntervalMs`` (no 2025-11-25 ``ttl``/``pollInterval``), no
    ``requestState``, and the inlined result no ``related-task`` _meta; a tasks/cancel of a task that
    already ended is the same empty acknowledgement (-32602 is for an unknown task only), and a row; a
    tasks/get whose Mcp-Name header is not its taskId is refused as a header mismatch (-32020)."""
    sim = make_simulator(vms=1)
    gateway = build_gateway(tmp_path, sim)
    served = serve(tmp_path, gateway)
    try:
        async with tasks_client(served, served.tokens["alice"]) as client:
            created = await start_clone(client, "shaped-clone")
            working = await get(client, created.task_id)
            done = await poll(client, created.task_id, lambda t: t.status != "working")
            late = await client.session.send_request(CancelTask(params=TaskParams(task_id=created.task_id)),
                                                     types.EmptyResult)
            after = await get(client, created.task_id)
            meta = {types.PROTOCOL_VERSION_META_KEY: client.protocol_version,
                    types.CLIENT_CAPABILITIES_META_KEY: {"extensions": {EXTENSION: {}}}}
        async with served.http(served.tokens["alice"]) as http:
            mismatched = await http.post("/mcp", json={
                "jsonrpc": "2.0", "id": 7, "method": "tasks/get",
                "params": {"taskId": created.task_id, "_meta": meta}}, headers={
                "Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2026-07-28",
                "Mcp-Method": "tasks/get", "Mcp-Name": "another-task"})
        rows = audit_rows(gateway)
    finally:
        served.stop()
        await gateway.close()
    for shown in (created, working, done):
        extra = shown.model_extra or {}
        assert not {"ttl", "pollInterval", "requestState", "task"} & set(extra), extra
        assert isinstance(shown.ttl_ms, int) and shown.ttl_ms > 0 and shown.poll_interval_ms == 500
    assert created.created_at.endswith("Z") and created.last_updated_at.endswith("Z")
    assert done.status == "completed" and done.result is not None and done.result["isError"] is False
    assert "io.modelcontextprotocol/related-task" not in (done.result.get("_meta") or {}), done.result
    assert late.result_type == "complete" and not (late.model_extra or {}), late
    assert after.status == "completed"  # nothing changed
    (row,) = [r for r in rows if r.get("phase") == "task_cancel"]
    assert (row["task_id"], row["outcome"], row["caller"]) == (created.task_id, "ended_already", "alice")
    assert mismatched.json()["error"]["code"] == -32020, mismatched.text


async def test_a_task_is_cancelled_in_vsphere(tmp_path: Path, make_simulator: MakeSimulator) -> None:
    sim = make_simulator(vms=1)
    sim.control("/slow-task", {"method": "CloneVM_Task", "seconds": 5, "count": 1})
    gateway = build_gateway(tmp_path, sim)
    served = serve(tmp_path, gateway)
    try:
        async with tasks_client(served, served.tokens["alice"]) as client:
            created = await start_clone(client, "cancelled-clone")
            await poll(client, created.task_id, lambda t: "%" in (t.status_message or ""))  # vSphere runs it
            ack = await client.session.send_request(CancelTask(params=TaskParams(task_id=created.task_id)),
                                                    types.EmptyResult)
            ended = await poll(client, created.task_id, lambda t: t.status != "working")
        rows = audit_rows(gateway)
    finally:
        served.stop()
        await gateway.close()
    assert ack.result_type == "complete"
    assert ended.status == "cancelled" and ended.result is None, ended
    assert count_vms_named(pyvmomi_connect(sim), "cancelled-clone") == 0  # vSphere never made it
    (row,) = [r for r in rows if r.get("phase") == "task_cancel"]
    assert (row["task_id"], row["outcome"], row["caller"]) == (created.task_id, "cancelled", "alice")


async def test_a_cancel_before_vsphere_runs_the_task_is_acknowledged_and_done_once_it_runs(
    tmp_path: Path, make_simulator: MakeSimulator
) -> None:
    """tasks/cancel while vSphere has not yet answered the clone with its task (the simulator delays
    CloneVM_Task): the extension's empty acknowledgement (not a refusal to ask again), a ``deferred``
    row, and the clone is cancelled in vSphere once its vSphere task runs."""
    sim = make_simulator(vms=1)
    sim.control("/slow-task", {"method": "CloneVM_Task", "seconds": 5, "count": 1})
    sim.control("/delay", {"method_delay": {"CloneVM_Task": 2000}})  # vSphere answers the clone late
    gateway = build_gateway(tmp_path, sim)
    served = serve(tmp_path, gateway)
    try:
        async with tasks_client(served, served.tokens["alice"]) as client:
            created = await start_clone(client, "early-cancelled")
            first = await get(client, created.task_id)
            ack = await client.session.send_request(CancelTask(params=TaskParams(task_id=created.task_id)),
                                                    types.EmptyResult)
            ended = await poll(client, created.task_id, lambda t: t.status != "working")
        rows = audit_rows(gateway)
    finally:
        served.stop()
        await gateway.close()
    assert first.status == "working" and "%" not in (first.status_message or ""), first
    assert ack.result_type == "complete"
    assert ended.status == "cancelled", ended
    assert count_vms_named(pyvmomi_connect(sim), "early-cancelled") == 0
    outcomes = [r["outcome"] for r in rows if r.get("phase") == "task_cancel"]
    assert outcomes[0] == "deferred" and outcomes[-1] == "cancelled", outcomes


async def test_another_caller_cannot_see_answer_or_cancel_a_task(
    tmp_path: Path, make_simulator: MakeSimulator
) -> None:
    sim = make_simulator(vms=1)
    sim.control("/slow-task", {"method": "CloneVM_Task", "seconds": 3, "count": 1})
    gateway = build_gateway(tmp_path, sim)
    served = serve(tmp_path, gateway)
    # a task another caller showing alice's name started (a person "alice" at an identity provider): it
    # is written to the store as the runner writes one, so alice's own requests meet it
    now = time.time()
    namesake = TaskRecord(uuid.uuid4().hex, "alice", "clone_vm", "vc1", "working", now, now, now + 600,
                          caller_key=str(CallerKey.person("https://idp.example", "alice")))
    gateway.backends.tasks.add(namesake)
    try:
        async with tasks_client(served, served.tokens["alice"]) as client:
            created = await start_clone(client, "owned-clone")
            not_hers = await refused(client.session.send_request(
                GetTask(params=TaskParams(task_id=namesake.task_id)), GetTaskResult))
        task = TaskParams(task_id=created.task_id)
        errors: list[MCPError] = []
        for name in ("bob", "carol"):
            async with tasks_client(served, served.tokens[name]) as other:
                errors.append(await refused(other.session.send_request(GetTask(params=task), GetTaskResult)))
                errors.append(await refused(other.session.send_request(
                    UpdateTask(params=UpdateParams(task_id=created.task_id)), types.EmptyResult)))
                errors.append(await refused(other.session.send_request(CancelTask(params=task),
                                                                       types.EmptyResult)))
        async with tasks_client(served, served.tokens["alice"]) as client:
            done = await poll(client, created.task_id, lambda t: t.status != "working")
        rows = audit_rows(gateway)
    finally:
        served.stop()
        await gateway.close()
    assert [e.error.code for e in [not_hers, *errors]] == [types.INVALID_PARAMS] * 7, errors
    assert all("of yours" in e.error.message for e in [not_hers, *errors])
    assert done.status == "completed" and done.result is not None and done.result["isError"] is False, done
    assert count_vms_named(pyvmomi_connect(sim), "owned-clone") == 1  # nobody else cancelled it
    refusals = [(r["tool"], r["caller"], r["task_id"]) for r in rows
                if r.get("reason_code") == "not_your_task"]
    assert sorted(refusals) == sorted([("tasks/get", "alice", namesake.task_id)] + [
        (method, name, created.task_id) for method in ("tasks/get", "tasks/update", "tasks/cancel")
        for name in ("bob", "carol")])
    assert not [r for r in rows if r.get("phase") == "task_cancel"]


async def test_each_revision_keeps_its_own_task_methods(
    tmp_path: Path, make_simulator: MakeSimulator
) -> None:
    sim = make_simulator(vms=1)
    gateway = build_gateway(tmp_path, sim)
    served = serve(tmp_path, gateway)
    arguments = {"target": "vc1", "vm": SOURCE, "name": "plain-clone"}
    try:
        async with mcp_client(served, served.tokens["alice"], "auto") as plain:  # no extension declared
            blocking = await plain.call_tool("clone_vm", arguments)
            undeclared = await refused(plain.session.send_request(GetTask(params=TaskParams(task_id="x")),
                                                                  GetTaskResult))
        async with tasks_client(served, served.tokens["alice"]) as client:
            created = await start_clone(client, "extension-clone")
            task = TaskParams(task_id=created.task_id)
            no_result = await refused(client.session.send_request(ResultOf(params=task), types.EmptyResult))
            no_list = await refused(client.session.send_request(
                ListTasks(params=types.PaginatedRequestParams()), types.EmptyResult))
            update = await client.session.send_request(
                UpdateTask(params=UpdateParams(task_id=created.task_id, input_responses={"never-asked": {}})),
                types.EmptyResult)
            await poll(client, created.task_id, lambda t: t.status != "working")
        async with mcp_client(served, served.tokens["alice"], "legacy") as legacy:
            legacy_caps = legacy.server_capabilities
            no_update = await refused(legacy.session._dispatcher.send_raw_request(
                "tasks/update", {"taskId": created.task_id, "inputResponses": {}}, {}))
            old_get = await legacy.session._dispatcher.send_raw_request(
                "tasks/get", {"taskId": created.task_id}, {})
    finally:
        served.stop()
        await gateway.close()
    text = blocking.content[0]
    assert blocking.is_error is False and isinstance(text, types.TextContent) and "plain-clone" in text.text
    assert undeclared.error.code == types.MISSING_REQUIRED_CLIENT_CAPABILITY
    assert undeclared.error.data == {"requiredCapabilities": {"extensions": {EXTENSION: {}}}}
    assert (no_result.error.code, no_list.error.code) == (types.METHOD_NOT_FOUND,) * 2
    assert update.result_type == "complete"
    assert legacy_caps.tasks is not None and not (legacy_caps.extensions or {}).get(EXTENSION)
    assert no_update.error.code == types.METHOD_NOT_FOUND
    assert old_get["status"] == "completed" and "ttl" in old_get and "result" not in old_get  # the old shape


async def test_any_replica_answers_for_a_task_and_passes_its_cancellation_on(
    tmp_path: Path, make_simulator: MakeSimulator, pg_url: str
) -> None:
    sim = make_simulator(vms=1)
    sim.control("/slow-task", {"method": "CloneVM_Task", "seconds": 5, "count": 1})
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    replica_a = build_gateway(tmp_path / "a", sim, database_url=pg_url)
    replica_b = build_gateway(tmp_path / "b", sim, database_url=pg_url)
    served_a = serve(tmp_path / "a", replica_a)
    served_b = serve(tmp_path / "b", replica_b, tokens=served_a.tokens)
    try:
        async with tasks_client(served_a, served_a.tokens["alice"]) as on_a:
            created = await start_clone(on_a, "replica-cancelled")
        async with tasks_client(served_b, served_b.tokens["alice"]) as on_b:
            await poll(on_b, created.task_id, lambda t: "%" in (t.status_message or ""))
            await on_b.session.send_request(CancelTask(params=TaskParams(task_id=created.task_id)),
                                            types.EmptyResult)  # stored; replica A cancels in vSphere
            ended = await poll(on_b, created.task_id, lambda t: t.status != "working")
        rows = audit_rows(replica_a)
    finally:
        served_a.stop()
        served_b.stop()
        await replica_a.close()
        await replica_b.close()
    assert ended.status == "cancelled", ended
    assert count_vms_named(pyvmomi_connect(sim), "replica-cancelled") == 0
    outcomes = sorted(r["outcome"] for r in rows if r.get("phase") == "task_cancel")
    assert outcomes == ["cancelled", "passed_on"]  # asked on B, done on A


async def test_the_person_is_asked_before_a_task_and_only_the_accepting_retry_is_the_task(
    tmp_path: Path, vcsim_bin: Path
) -> None:
    """A clone on a gated ``confirm_by: elicitation`` target: the client's elicitation callback is asked
    first (the URL of the proposal's card, while no task exists); the person approves on the page and
    accepts; the retry is the task, which ends with the proposal run: the clone exists once."""
    with web_server(tmp_path, vcsim_bin, rules=GATED_LAB) as web:
        lab = web.sims["lab"]
        arguments = {"target": "lab-vc", "vm": lab.vm_names()[0], "name": "asked-clone"}
        person, tasks = CardPerson(web, approver="alice"), PollingTasks()
        async with web_client(web, "adam", tasks, person) as client:
            result = await client.call_tool("clone_vm", arguments)
            version = client.protocol_version
        rows = web.audit_rows()
        (made,) = tasks.made
        kept = task_count(web)
        clones = count_vms_named(pyvmomi_connect(lab), "asked-clone")
        calls = web.gateway.metrics.render()
    assert version == "2026-07-28"
    # the first round and the task's retry: two rounds of one call, both counted
    assert 'gateway_tool_calls_total{outcome="ok",target="lab-vc",tool="clone_vm"} 2.0' in calls
    (asked,) = person.asked
    assert isinstance(asked, types.ElicitRequestURLParams) and "/ui#proposal=" in asked.url
    assert person.tasks_when_asked == [0]  # asked before any task was made
    assert (made.status, kept) == ("working", 1) and not (made.model_extra or {}).get("requestState")
    answer = json.loads(result.content[0].text)  # type: ignore[union-attr]
    assert result.is_error is False and answer["state"] == "executed", answer
    assert answer["proposal_id"] == asked.url.split("#proposal=", 1)[1]
    assert clones == 1  # run once, by the approval
    assert [r["answer"] for r in rows if r.get("phase") == "elicited"] == ["accept"]
    assert len([r for r in rows if r.get("phase") == "executed"]) == 1


async def test_a_declined_round_runs_nothing_and_leaves_no_task(tmp_path: Path, vcsim_bin: Path) -> None:
    with web_server(tmp_path, vcsim_bin, rules=GATED_LAB) as web:
        lab = web.sims["lab"]
        arguments = {"target": "lab-vc", "vm": lab.vm_names()[0], "name": "declined-clone"}
        person, tasks = CardPerson(web, approver=None), PollingTasks()
        async with web_client(web, "adam", tasks, person) as client:
            result = await client.call_tool("clone_vm", arguments)
        rows = web.audit_rows()
        kept = task_count(web)
        clones = count_vms_named(pyvmomi_connect(lab), "declined-clone")
    assert len(person.asked) == 1 and tasks.made == [] and kept == 0
    answer = json.loads(result.content[0].text)  # type: ignore[union-attr]
    assert answer["state"] == "pending" and answer["person_asked"] == "decline", answer
    assert clones == 0
    assert [r["answer"] for r in rows if r.get("phase") == "elicited"] == ["decline"]
    assert not [r for r in rows if r.get("phase") in ("executing", "approved")]


async def test_a_client_that_can_be_asked_gets_a_task_where_nobody_need_be(
    tmp_path: Path, make_simulator: MakeSimulator
) -> None:
    sim = make_simulator(vms=1)
    rules = {"defaults": {"read": "allow", "write": "allow", "destructive": "allow",
                          "confirm_by": "elicitation"}}
    gateway = build_gateway(tmp_path, sim, rules)
    served = serve(tmp_path, gateway)
    asked: list[Any] = []

    async def person(_ctx: Any, params: Any) -> types.ElicitResult:
        asked.append(params)
        return types.ElicitResult(action="decline")

    try:
        async with tasks_client(served, served.tokens["alice"], elicitation_callback=person) as client:
            created = await start_clone(client, "unasked-clone")
            done = await poll(client, created.task_id, lambda t: t.status != "working")
    finally:
        served.stop()
        await gateway.close()
    assert asked == [] and created.status == "working"
    assert done.status == "completed" and done.result is not None and done.result["isError"] is False, done
    assert count_vms_named(pyvmomi_connect(sim), "unasked-clone") == 1


async def _never_asked(_ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
    raise AssertionError("these tests answer the round themselves")


async def _accepted_task(client: Client, arguments: dict[str, Any]) -> tuple[str, CreateTaskResult]:
    """The rounds of a gated clone driven by hand: the card's URL, then the accepting retry's task."""
    first = await client.session.call_tool("clone_vm", arguments, allow_input_required=True)
    assert isinstance(first, types.InputRequiredResult) and first.request_state is not None, first
    request = (first.input_requests or {})["confirm"]
    assert isinstance(request, types.ElicitRequest)
    assert isinstance(request.params, types.ElicitRequestURLParams)
    accept: dict[str, types.InputResponse] = {"confirm": types.ElicitResult(action="accept")}
    created = await client.session.call_tool("clone_vm", arguments, input_responses=accept,
                                             request_state=first.request_state, allow_claimed=True)
    assert isinstance(created, CreateTaskResult), created
    return request.params.url.split("#proposal=", 1)[1], created


async def test_a_task_follows_its_proposal_until_a_human_approves_it(tmp_path: Path, vcsim_bin: Path) -> None:
    with web_server(tmp_path, vcsim_bin, rules=GATED_LAB) as web:
        lab = web.sims["lab"]
        arguments = {"target": "lab-vc", "vm": lab.vm_names()[0], "name": "approved-later"}
        async with web_client(web, "adam", Tasks(), _never_asked) as client:
            proposal_id, created = await _accepted_task(client, arguments)
            waiting = await poll(client, created.task_id, lambda t: "waiting" in (t.status_message or ""))
            assert count_vms_named(pyvmomi_connect(lab), "approved-later") == 0  # nothing ran yet
            async with signed_in(web, "alice") as (page, csrf):
                approved = await decide(page, web, csrf, proposal_id, "approve")
            done = await poll(client, created.task_id, lambda t: t.status != "working")
        clones = count_vms_named(pyvmomi_connect(lab), "approved-later")
    assert approved.status_code == 200, approved.text
    assert waiting.status == "working" and proposal_id in (waiting.status_message or "")
    assert created.ttl_ms is not None and created.ttl_ms > 3_600_000  # kept past the proposal's expiry
    assert done.status == "completed" and done.result is not None and done.result["isError"] is False, done
    shown = json.loads(done.result["content"][0]["text"])
    assert (shown["state"], shown["proposal_id"], shown["approved_by"]) == ("executed", proposal_id, "alice")
    assert clones == 1


async def test_cancelling_a_task_that_follows_a_proposal_stops_following_and_runs_nothing(
    tmp_path: Path, vcsim_bin: Path
) -> None:
    with web_server(tmp_path, vcsim_bin, rules=GATED_LAB) as web:
        lab = web.sims["lab"]
        arguments = {"target": "lab-vc", "vm": lab.vm_names()[0], "name": "unfollowed"}
        async with web_client(web, "adam", Tasks(), _never_asked) as client:
            proposal_id, created = await _accepted_task(client, arguments)
            await poll(client, created.task_id, lambda t: "waiting" in (t.status_message or ""))
            ack = await client.session.send_request(CancelTask(params=TaskParams(task_id=created.task_id)),
                                                    types.EmptyResult)
            ended = await poll(client, created.task_id, lambda t: t.status != "working")
        state = web.proposal_state(proposal_id)
        rows = web.audit_rows()
        clones = count_vms_named(pyvmomi_connect(lab), "unfollowed")
    assert ack.result_type == "complete"
    assert ended.status == "cancelled" and "cancel_action" in (ended.status_message or ""), ended
    assert state == "pending" and clones == 0  # the proposal waits on, nothing ran
    (row,) = [r for r in rows if r.get("phase") == "task_cancel"]
    assert (row["task_id"], row["outcome"]) == (created.task_id, "cancelled")


@asynccontextmanager
async def _client_of(base: str, cafile: Path, token: str) -> AsyncIterator[Client]:
    """An SDK client in its default mode, with the tasks extension, of a ``gateway serve`` at ``base``."""
    http = httpx2.AsyncClient(verify=ssl.create_default_context(cafile=str(cafile)), timeout=60,
                              headers={"Authorization": f"Bearer {token}"})
    transport = streamable_http_client(f"{base}/mcp", http_client=http)
    async with http, Client(transport, mode="auto", extensions=[Tasks()],
                            elicitation_callback=_never_asked) as client:
        yield client


async def test_a_task_whose_following_process_died_ends_as_its_proposal_does(
    tmp_path: Path, make_simulator: MakeSimulator
) -> None:
    """kill -9 of the ``gateway serve`` following two gated proposals for their tasks: the restarted
    process reads each proposal in the dead one's stead (nothing ran, so nothing is "unknown"): one task
    works on, showing its wait, until a person approves its proposal on the page, then ends with the
    clone made once; another, cancelled, stops following and its proposal waits on; a third, cancelled
    after a person denied its proposal, ends as the proposal did."""
    sim = make_simulator(vms=1)
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    env = write_targets(tmp_path / "targets.yaml", {"lab-vc": sim})
    env.update({"GATEWAY_HOME": str(home), "GATEWAY_TARGETS_FILE": str(tmp_path / "targets.yaml"),
                "GATEWAY_ENABLE_DESTRUCTIVE": "true"})
    (home / "rules.yaml").write_text(GATED_LAB)
    with SqliteStore(home / "state.db") as store:
        adam = create_token(store, "adam", "admin", expires_in=None, now=time.time(), hasher=FAST_HASH)[0]
        alice = create_token(store, "alice", "admin", expires_in=None, now=time.time(), hasher=FAST_HASH,
                             kind=Kind.PERSON)[0]
    cert = create_certificate(tmp_path / "tls", ["localhost"], ["127.0.0.1"])
    source = sim.vm_names()[0]
    first = run_serve(tmp_path, env, *https_argv(cert), "--web")
    try:
        async with _client_of(first.base(), cert.cert, adam) as client:
            made = [await _accepted_task(client, {"target": "lab-vc", "vm": source, "name": name})
                    for name in ("approved-after", "unfollowed-after", "denied-before")]
            for _pid, created in made:
                await poll(client, created.task_id, lambda t: "waiting" in (t.status_message or ""))
        os.kill(first.process.pid, signal.SIGKILL)
        first.process.wait(30)
    finally:
        if first.process.poll() is None:
            first.process.kill()
            first.process.wait(30)
    (approved_pid, approved), (waiting_pid, unfollowed), (denied_pid, denied) = made
    second = run_serve(tmp_path, env, *https_argv(cert), "--web")
    try:
        base = second.base()
        async with _client_of(base, cert.cert, adam) as client:
            orphan = await get(client, approved.task_id)
            ack = await client.session.send_request(CancelTask(params=TaskParams(task_id=unfollowed.task_id)),
                                                    types.EmptyResult)
            stopped = await get(client, unfollowed.task_id)
            page = httpx2.AsyncClient(base_url=base, timeout=60,
                                      verify=ssl.create_default_context(cafile=str(cert.cert)))
            async with page:
                signed = await page.post("/ui/api/sign-in", json={"token": alice}, headers={"Origin": base})
                assert signed.status_code == 200, signed.text
                change = {"Origin": base, "X-CSRF-Token": signed.json()["csrf"]}
                refused = await page.post(f"/ui/api/proposals/{denied_pid}/deny", json={"reason": "no"},
                                          headers=change)
                cancel = CancelTask(params=TaskParams(task_id=denied.task_id))
                late = await client.session.send_request(cancel, types.EmptyResult)
                ended = await get(client, denied.task_id)
                decided = await page.post(f"/ui/api/proposals/{approved_pid}/approve", json={},
                                          headers=change)
            done = await poll(client, approved.task_id, lambda t: t.status != "working")
        with SqliteStore(home / "state.db") as store:
            left = store.get_proposal(waiting_pid)
        cancels = read_rows(home / "audit.jsonl", phase="task_cancel")
    finally:
        code = second.stop()
    assert code == 0, second.output()
    assert orphan.status == "working", orphan  # not "failed", its outcome "unknown": it ran nothing
    assert approved_pid in (orphan.status_message or "") and "stopped" in (orphan.status_message or "")
    assert decided.status_code == 200, decided.text
    assert done.status == "completed" and done.result is not None and done.result["isError"] is False, done
    shown = json.loads(done.result["content"][0]["text"])
    assert (shown["state"], shown["proposal_id"], shown["approved_by"]) == ("executed", approved_pid, "alice")
    assert ack.result_type == "complete"
    assert stopped.status == "cancelled" and "cancel_action" in (stopped.status_message or ""), stopped
    assert left is not None and left.state == "pending"  # the proposal waits on: nothing withdrew it
    assert refused.status_code == 200 and late.result_type == "complete", refused.text
    assert ended.status == "completed" and ended.result is not None, ended  # as its proposal: denied
    assert json.loads(ended.result["content"][0]["text"])["state"] == "denied"
    assert [(r["task_id"], r["outcome"]) for r in cancels] == [(unfollowed.task_id, "cancelled"),
                                                               (denied.task_id, "ended_already")]
    lab = pyvmomi_connect(sim)
    names = ("approved-after", "unfollowed-after", "denied-before")
    assert [count_vms_named(lab, name) for name in names] == [1, 0, 0]
