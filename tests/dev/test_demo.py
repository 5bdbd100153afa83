"""The quick start for real: ``python -m gateway.dev.demo`` as a subprocess on a free port, an MCP call over
HTTPS with the token it printed, then Ctrl-C (SIGINT) and no process it started left behind."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from support.answers import answer_of
from support.processes import RunningDemo, free_port, read_until, start_demo

from gateway.auth.roles import RoleBook
from gateway.dev import demo
from gateway.guard.policy.model import Policy
from gateway.guard.policy.store import PolicyStore

REPO = Path(__file__).resolve().parents[2]


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(parent, []).append(int(entry.name))
    found: set[int] = set()
    pending = [pid]
    while pending:
        for child in children.get(pending.pop(), []):
            found.add(child)
            pending.append(child)
    return found


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.fixture
def running_demo(vcsim_bin: Path, tmp_path: Path) -> Iterator[RunningDemo]:
    port = free_port()
    folder = tmp_path / "demo"
    process = start_demo(vcsim_bin, port, folder)
    try:
        yield RunningDemo(process, read_until(process, "Ready:", timeout=120), folder, port)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(30)
        assert process.stdout is not None
        process.stdout.close()


async def call_over_https(demo_run: RunningDemo, token: str) -> tuple[list[str], dict[str, object]]:
    verify = ssl.create_default_context(cafile=str(demo_run.folder / "tls" / "cert.pem"))
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, verify=verify, timeout=60)
    transport = streamable_http_client(f"https://127.0.0.1:{demo_run.port}/mcp", http_client=http)
    async with http, Client(transport, mode="legacy") as client:
        tools = [tool.name for tool in (await client.list_tools()).tools]
        result = await client.call_tool("list_vms", {"target": "all"})
    assert not result.is_error, result.content
    return tools, answer_of(result)


async def sign_in_to_the_page(demo_run: RunningDemo, token: str) -> tuple[int, dict[str, Any]]:
    """POST the token to the page's sign-in as the page itself would: (status, answer)."""
    origin = f"https://127.0.0.1:{demo_run.port}"
    verify = ssl.create_default_context(cafile=str(demo_run.folder / "tls" / "cert.pem"))
    async with httpx2.AsyncClient(base_url=origin, verify=verify, timeout=60) as http:
        response = await http.post("/ui/api/sign-in", json={"token": token}, headers={"Origin": origin})
    return response.status_code, response.json()


async def call_over_stdio(demo_run: RunningDemo) -> dict[str, object]:
    """The desktop-client form the demo printed: its stdio.sh launcher."""
    launcher = str(demo_run.folder / "stdio.sh")
    params = StdioServerParameters(command=launcher, env={"PATH": os.environ["PATH"]})
    async with Client(params, mode="legacy") as client:
        result = await client.call_tool("list_vms", {"target": "esx-1"})
    assert not result.is_error, result.content
    return answer_of(result)


def test_the_demo_serves_mcp_over_https_and_ctrl_c_stops_everything(running_demo: RunningDemo) -> None:
    children = descendants(running_demo.process.pid)
    assert len(children) >= 4, "three simulators and the gateway"

    tools, listing = anyio.run(call_over_https, running_demo, running_demo.token("demo-admin"))
    reader_tools, _ = anyio.run(call_over_https, running_demo, running_demo.token("demo-reader"))
    local = anyio.run(call_over_stdio, running_demo)
    agent_at_page = anyio.run(sign_in_to_the_page, running_demo, running_demo.token("demo-admin"))
    assert agent_at_page[0] == 403 and agent_at_page[1]["error"]["reason_code"] == "agent_token", \
        "the MCP clients' admin token must not approve through the page"
    person_at_page = anyio.run(sign_in_to_the_page, running_demo, running_demo.token("demo-person"))

    assert {"list_vms", "power_off_vm", "delete_vm", "confirm_action"} <= set(tools)
    assert "power_off_vm" not in reader_tools and "list_vms" in reader_tools
    text = json.dumps(listing)
    assert all(name in text for name in ("vc-1", "vc-2", "esx-1", "DC0_C0_RP0_VM0", "ha-host_VM0"))
    assert "ha-host_VM0" in json.dumps(local)
    assert f"https://127.0.0.1:{running_demo.port}/ui" in running_demo.output
    assert "sign in with the demo-person token" in running_demo.output
    assert person_at_page[0] == 200 and (person_at_page[1]["kind"], person_at_page[1]["approve"]) == (
        "person", "any")
    assert '"Authorization": "Bearer gwt_' in running_demo.output and "stdio.sh" in running_demo.output
    secrets = running_demo.folder / "gateway.env"
    assert secrets.stat().st_mode & 0o077 == 0 and "_PASSWORD=" in secrets.read_text()

    os.killpg(running_demo.process.pid, signal.SIGINT)  # Ctrl-C: the whole group, simulators included
    assert running_demo.process.wait(60) == 0
    assert running_demo.process.stdout is not None
    rest = running_demo.process.stdout.read().decode(errors="replace")
    assert "stopped: the gateway and the simulators are down" in rest, rest
    assert "the gateway exited with status" not in rest, rest
    assert not [pid for pid in children if alive(pid)], "processes the demo started outlived it"
    log = (running_demo.folder / "gateway.log").read_text()
    assert running_demo.token("demo-admin") not in log and "stopping: readiness fails" in log


def test_the_demo_configuration_is_valid(tmp_path: Path) -> None:
    files = demo.prepare_folder(tmp_path / "demo")
    (files.folder / "roles.yaml").write_text(demo.ROLES)
    (files.folder / "roles.yaml").chmod(0o600)
    (files.folder / "rules.yaml").write_text(demo.RULES)
    roles = RoleBook(files.folder / "roles.yaml")
    assert roles.check() == [] and {"lab-operator", "approver"} <= set(roles.roles())
    policy = PolicyStore(files.folder / "rules.yaml").current()
    assert isinstance(policy, Policy) and policy.target_settings("vc-2").require_web_approval


def test_the_demo_refuses_a_folder_it_did_not_make(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(demo.DemoError, match="not made by the demo"):
        demo.prepare_folder(tmp_path)
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_the_demo_empties_its_own_folder_on_a_new_run(tmp_path: Path) -> None:
    files = demo.prepare_folder(tmp_path / "demo")
    (files.folder / "audit.jsonl").write_text("old\n")
    again = demo.prepare_folder(tmp_path / "demo")
    assert not (again.folder / "audit.jsonl").exists() and (again.folder / demo.MARKER).is_file()


def run_demo(args: list[str], timeout: float = 90) -> subprocess.CompletedProcess[str]:
    """``python -m gateway.dev.demo ARGS`` to completion; still running after ``timeout`` fails the test."""
    process = subprocess.Popen([sys.executable, "-m", "gateway.dev.demo", *args], cwd=REPO,
                               env={**os.environ, "PYTHONPATH": str(REPO)}, stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        pytest.fail(f"the demo was still running after {timeout}s (it should have refused):\n{out}\n{err}")
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != "gateway.log"}


def test_a_second_demo_on_the_same_folder_refuses_before_touching_anything(
    running_demo: RunningDemo, vcsim_bin: Path,
) -> None:
    before = snapshot(running_demo.folder)
    assert "tls/cert.pem" in before and "home/state.db" in before

    folder = str(running_demo.folder)
    second = run_demo(["--port", str(free_port()), "--dir", folder, "--vcsim", str(vcsim_bin)])

    assert second.returncode == 1, second
    assert "another demo" in second.stderr and str(running_demo.folder) in second.stderr, second.stderr
    assert "starting simulators" not in second.stdout
    after = snapshot(running_demo.folder)
    assert after.keys() == before.keys()
    assert all(after[k] == before[k] for k in before if k != "home/state.db")
    tools, _ = anyio.run(call_over_https, running_demo, running_demo.token("demo-admin"))
    assert "list_vms" in tools


def test_the_gateway_child_holds_the_folder_lock_too(running_demo: RunningDemo) -> None:
    lock = str(running_demo.folder / demo.LOCK)
    holders = set()
    for pid in descendants(running_demo.process.pid):
        with contextlib.suppress(OSError):
            if any(os.readlink(fd) == lock for fd in Path(f"/proc/{pid}/fd").iterdir()):
                holders.add(Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[-2].decode())
    assert holders == {"--web"}, "only the gateway (its last argument is --web) inherits the lock"


def test_every_child_dies_when_the_demo_is_killed(running_demo: RunningDemo) -> None:
    children = descendants(running_demo.process.pid)
    assert len(children) >= 4, "three simulators and the gateway"

    running_demo.process.kill()
    running_demo.process.wait(30)

    deadline = time.monotonic() + 60
    while [pid for pid in children if alive(pid)] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [pid for pid in children if alive(pid)], "children outlived a SIGKILLed demo"


def test_a_busy_port_is_refused_in_one_line_before_anything_starts(tmp_path: Path, vcsim_bin: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        result = run_demo(["--port", str(port), "--dir", str(tmp_path / "demo"), "--vcsim", str(vcsim_bin)])
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"port {port} is in use (Errno 98)" in lines[0], result.stderr
    assert "starting simulators" not in result.stdout and not (tmp_path / "demo").exists()


@pytest.mark.parametrize("args, message", [
    (["--port", "99999"], "between 1 and 65535"),
    (["--port", "http"], "not a port number"),
    (["--vcsim", "/nonexistent/vcsim-gw"], "/nonexistent/vcsim-gw is missing"),
])
def test_bad_arguments_are_refused_at_once(tmp_path: Path, args: list[str], message: str) -> None:
    result = run_demo(["--dir", str(tmp_path / "demo"), *args], timeout=30)
    assert result.returncode == 2, result
    assert message in result.stderr and "starting simulators" not in result.stdout, result.stderr
    assert not (tmp_path / "demo").exists()


def clients_json(heading: str, marker: str) -> dict[str, object]:
    """The JSON block of docs/clients.md under ``heading`` that contains ``marker``."""
    text = (REPO / "docs" / "clients.md").read_text()
    section = text.split(heading, 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```json\n(.*?)```", section, re.S)
    chosen = [block for block in blocks if marker in block]
    assert len(chosen) == 1, f"one JSON block with {marker!r} under {heading!r}"
    parsed: dict[str, object] = json.loads(chosen[0])
    return parsed


def demo_credentials(folder: Path) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in (folder / "gateway.env").read_text().splitlines() if "=" in line)
    return {key: value.strip("'") for key, value in pairs if key.endswith(("_USER", "_PASSWORD"))}


def test_the_stdio_snippet_works_as_printed_against_the_demo_folder(running_demo: RunningDemo) -> None:
    config = clients_json("## Over stdio", '"stdio"')
    (server,) = config["mcpServers"].values()  # type: ignore[attr-defined]
    env = dict(server["env"])
    placeholders = {k for k, v in env.items() if v == "..."}
    assert set(env) - placeholders == {"GATEWAY_HOME"}, "only GATEWAY_HOME plus credentials"
    env = {"GATEWAY_HOME": str(running_demo.folder / "home"), **demo_credentials(running_demo.folder)}
    command = server["command"].replace("/path/to/.venv/bin", str(Path(sys.executable).parent))

    async def go() -> dict[str, object]:
        params = StdioServerParameters(command=command, args=server["args"], env=env)
        async with Client(params, mode="legacy") as client:
            result = await client.call_tool("list_vms", {"target": "all"})
        assert not result.is_error, result.content
        return answer_of(result)

    listing = json.dumps(anyio.run(go))
    assert all(name in listing for name in ("vc-1", "vc-2", "esx-1", "ha-host_VM0"))
