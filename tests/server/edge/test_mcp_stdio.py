"""The MCP server without HTTP: tools/list and tools/call mapping, and ``gateway serve`` over stdio.

The mapping tests drive ``build_mcp_server`` in-process with the SDK's own client in both protocol
revisions (2025-11-25 handshake, 2026-07-28 stateless) against a stand-in pipeline whose answers are
chosen per tool name. The stdio test runs the real command as a subprocess against a simulator.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from support.answers import answer_of
from support.simulator import Simulator, write_targets

from gateway.answer import Answer
from gateway.auth.tokens import Principal
from gateway.config import Target
from gateway.errors import NotFound, PolicyDenied
from gateway.role import BUILTIN_ROLES, Role
from gateway.server.edge.mcp import ProgressSink, build_mcp_server, instructions_for, stdio_principal
from gateway.tools.spec import TARGET, TARGETS, Param, ToolSpec
from gateway.vocabulary import Category, Risk

pytestmark = pytest.mark.anyio
MODES = ("legacy", "2026-07-28")
REPO = Path(__file__).resolve().parents[3]
GATEWAY_MAIN = "from gateway.cli import main; raise SystemExit(main())"  # the `gateway` command


SPECS = (
    ToolSpec("list_vms", "List VMs.", Category.READ, Risk.LOW,
             params=(TARGETS, Param("name", "string", "Name.")), target_mode="fanout"),
    ToolSpec("power_off_vm", "Power off a VM.", Category.WRITE, Risk.MEDIUM,
             params=(TARGET, Param("vm", "string", "VM name or moid.", required=True))),
    ToolSpec("explode", "Fails unexpectedly.", Category.READ, Risk.LOW, params=(TARGETS,)),
)


class StandInPipeline:
    """Answers like the pipeline: readers see read tools only; a hidden tool is 'unknown'."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []

    @property
    def facts(self) -> StandInPipeline:  # what the caller may see and use: this stand-in answers it
        return self

    @property
    def calls(self) -> StandInPipeline:  # where tool calls are answered: this stand-in too
        return self

    def tools_of(self, role: Role) -> list[ToolSpec]:
        return [s for s in SPECS if role.name == "admin" or s.category is Category.READ]

    async def answer(self, principal: Principal, name: str, args: Mapping[str, Any] | None, *,
                     progress: ProgressSink | None = None, correlation_id: str | None = None) -> Answer:
        self.seen.append({"caller": principal.name, "tool": name, "progress": progress is not None,
                          "correlation_id": correlation_id})
        if name not in {s.name for s in self.tools_of(BUILTIN_ROLES[principal.role])}:
            raise NotFound(f"unknown tool '{name}'; call tools/list to see the tools available to you")
        if name == "explode":
            raise RuntimeError("password=hunter2 in a stack frame")
        if name == "power_off_vm":
            raise PolicyDenied("denied by rule 'protect-prod'", decision={"rule": "protect-prod"})
        if progress is not None:
            await progress(0.5, "halfway")
        target = dict(args or {}).get("target")
        return Answer.of({"target": target, "vms": [{"name": "web-1", "moid": "vm-1"}]})

    async def role_now(self, principal: Principal) -> Role:
        return BUILTIN_ROLES[principal.role]  # the real built-ins: the reader covers every target too

    def visible_targets(self, role: Any) -> list[Target]:
        return [Target("vc1", "vc1.example.com", "VC1"), Target("esx", "10.0.0.9", "ESX", port=8443)]


ADMIN = Principal("alice", "admin", token_id="aaaaaaaaaaaa")
READER = Principal("bob", "reader", token_id="bbbbbbbbbbbb")


@asynccontextmanager
async def connected(principal: Principal | None, mode: str,
                    pipeline: StandInPipeline | None = None) -> AsyncIterator[Client]:
    server = build_mcp_server(pipeline or StandInPipeline(), lambda: principal)
    async with Client(server, mode=mode) as client:
        yield client


@pytest.mark.parametrize("mode", MODES)
async def test_tools_are_listed_per_caller(mode: str) -> None:
    async with connected(ADMIN, mode) as admin, connected(READER, mode) as reader:
        admin_tools = {t.name: t for t in (await admin.list_tools()).tools}
        reader_tools = [t.name for t in (await reader.list_tools()).tools]
    assert set(admin_tools) == {"list_vms", "power_off_vm", "explode"}
    assert reader_tools == ["list_vms", "explode"]
    listed = admin_tools["power_off_vm"]
    assert listed.input_schema == SPECS[1].input_schema()
    assert listed.annotations is not None
    assert listed.annotations.read_only_hint is False and listed.annotations.destructive_hint is False


@pytest.mark.parametrize("mode", MODES)
async def test_success_is_one_text_block_of_json_and_no_structured_copy(mode: str) -> None:
    async with connected(ADMIN, mode) as client:
        result = await client.call_tool("list_vms", {"target": "vc1"})
    assert not result.is_error
    assert result.structured_content is None
    assert result.content[0].text == '{"target":"vc1","vms":[{"name":"web-1","moid":"vm-1"}]}'  # type: ignore[union-attr]
    assert answer_of(result) == {"target": "vc1", "vms": [{"name": "web-1", "moid": "vm-1"}]}


@pytest.mark.parametrize("mode", MODES)
async def test_expected_failure_is_a_tool_error_for_the_model(mode: str) -> None:
    async with connected(ADMIN, mode) as client:
        result = await client.call_tool("power_off_vm", {"target": "vc1", "vm": "web-1"})
    assert result.is_error
    denied = {"code": "policy_denied", "message": "denied by rule 'protect-prod'",
              "decision": {"rule": "protect-prod"}}
    assert answer_of(result) == {"error": denied}


@pytest.mark.parametrize("mode", MODES)
async def test_hidden_tool_answers_exactly_like_an_unknown_one(mode: str) -> None:
    async with connected(READER, mode) as client:
        hidden = await client.call_tool("power_off_vm", {"target": "vc1", "vm": "web-1"})
        unknown = await client.call_tool("no_such_tool", {})
    assert hidden.is_error and unknown.is_error
    assert answer_of(hidden)["error"]["code"] == "not_found"
    assert answer_of(hidden)["error"]["message"].replace("power_off_vm", "X") == (
        answer_of(unknown)["error"]["message"].replace("no_such_tool", "X"))


@pytest.mark.parametrize("mode", MODES)
async def test_crash_is_a_generic_error_with_the_traceback_in_the_log(
    mode: str, caplog: pytest.LogCaptureFixture,
) -> None:
    pipeline = StandInPipeline()
    async with connected(ADMIN, mode, pipeline) as client:
        result = await client.call_tool("explode", {"target": "vc1"})
    correlation_id = pipeline.seen[-1]["correlation_id"]
    assert result.is_error and correlation_id
    error = answer_of(result)["error"]
    assert error == {"code": "internal", "correlation_id": correlation_id,
                     "message": f"internal error (see server log, correlation id {correlation_id})"}
    assert "hunter2" not in result.model_dump_json()
    logged = [r for r in caplog.records if r.name == "gateway.server.edge.mcp" and r.levelno == logging.ERROR]
    assert logged and correlation_id in logged[0].getMessage() and logged[0].exc_info is not None


# In-process 2026-07-28 calls carry progress without a wire token; test_server_http covers that revision.
@pytest.mark.parametrize("mode", ["legacy"])
async def test_progress_is_relayed_only_when_the_client_asks(mode: str) -> None:
    pipeline = StandInPipeline()
    received: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        received.append((progress, total, message))

    async with connected(ADMIN, mode, pipeline) as client:
        await client.call_tool("list_vms", {"target": "vc1"})
        await client.call_tool("list_vms", {"target": "vc1"}, progress_callback=on_progress)
    assert [seen["progress"] for seen in pipeline.seen] == [False, True]
    assert received == [(0.5, 1.0, "halfway")]


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_instructions_list_addresses_to_admin_only_not_the_reader(mode: str) -> None:
    async with connected(ADMIN, mode) as admin, connected(READER, mode) as reader:
        assert admin.instructions is not None and reader.instructions is not None
        assert "Targets: vc1 (vc1.example.com); esx (10.0.0.9:8443)." in admin.instructions
        assert "confirm_action" in reader.instructions and "vc1.example.com" not in reader.instructions
        assert admin.instructions.startswith(instructions_for(None))


@pytest.mark.parametrize("mode", MODES)
async def test_a_request_without_a_caller_is_refused(mode: str) -> None:
    pipeline = StandInPipeline()
    async with connected(None, mode, pipeline) as client:
        result = await client.call_tool("list_vms", {"target": "vc1"})
        with pytest.raises(Exception, match="no authenticated caller"):
            await client.list_tools()
    assert result.is_error and answer_of(result)["error"]["code"] == "unauthorized"
    assert pipeline.seen == []


def test_stdio_caller_is_the_local_user_as_admin() -> None:
    """The desktop user's agent session: an admin agent, so it never approves (its proposals wait for a
    person: ``os:<user>`` with ``gateway pending``, or someone on the page)."""
    principal = stdio_principal()
    assert principal.name.startswith("stdio:") and len(principal.name) > len("stdio:")
    assert (principal.role, principal.surface, principal.token_id) == ("admin", "stdio", None)
    assert principal.kind == "agent"


def test_stdio_with_web_refuses_to_start_and_names_the_fix(tmp_path: Path) -> None:
    """``--web`` is never silently dropped: stdio serves no page, so it refuses, naming what to run."""
    (tmp_path / "targets.yaml").write_text(
        "targets: [{name: vc1, host: 127.0.0.1, port: 9, credential_env_prefix: VC1, insecure: true}]\n")
    env = {"GATEWAY_HOME": str(tmp_path / "home"), "GATEWAY_TARGETS_FILE": str(tmp_path / "targets.yaml"),
           "VC1_USER": "u", "VC1_PASSWORD": "p", "PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", GATEWAY_MAIN, "serve", "--transport", "stdio", "--web"],
                          env=env, cwd=str(REPO), stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 1, (done.returncode, done.stderr)
    assert "--web cannot be honoured" in done.stderr
    assert "--transport https --web" in done.stderr and "gateway pending approve" in done.stderr
    assert done.stdout == ""


# ---------------------------------------------------------------------------- the real command


async def test_serve_over_stdio_lists_tools_and_reads_a_simulator(sim_vc1: Simulator, tmp_path: Path) -> None:
    env = write_targets(tmp_path / "targets.yaml", {"vc1": sim_vc1})
    env.update({"GATEWAY_HOME": str(tmp_path / "home"), "PATH": os.environ.get("PATH", ""),
                "GATEWAY_TARGETS_FILE": str(tmp_path / "targets.yaml"), "PYTHONPATH": str(REPO)})
    command = ["-c", GATEWAY_MAIN, "serve", "--transport", "stdio"]
    params = StdioServerParameters(command=sys.executable, args=command, env=env, cwd=str(REPO))
    async with Client(params, mode="legacy") as client:
        names = {t.name for t in (await client.list_tools()).tools}
        assert {"list_targets", "list_vms"} <= names
        result = await client.call_tool("list_vms", {"target": "vc1"})
    assert not result.is_error, result.content
    found = json.dumps(answer_of(result))
    assert all(vm in found for vm in sim_vc1.vm_names())
    audit = (tmp_path / "home" / "audit.jsonl").read_text()
    assert '"surface": "stdio"' in audit or '"surface":"stdio"' in audit
