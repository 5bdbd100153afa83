"""The snippets of docs/clients.md, run as printed (address, token and paths substituted)
against a real demo: the HTTPS client entry, the Python SDK program and the MCP Inspector CLI commands.
The stdio entry is run in tests/dev/test_demo.py. The ``claude mcp add`` line and the VS Code variant are
not run (neither client is installed here): the entry the line writes is the one that connects."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from support.processes import RunningDemo, free_port, read_until, start_demo, unavailable

from gateway.dev import demo

REPO = Path(__file__).resolve().parents[2]
README_BASE = "https://127.0.0.1:8443"


def section() -> str:
    return (REPO / "docs" / "clients.md").read_text()


def block(language: str, marker: str) -> str:
    found = [b for b in re.findall(rf"```{language}\n(.*?)```", section(), re.S) if marker in b]
    assert len(found) == 1, f"one ```{language} block with {marker!r} in docs/clients.md"
    return found[0]


@pytest.fixture(scope="module")
def demo_run(vcsim_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDemo]:
    port, folder = free_port(), tmp_path_factory.mktemp("clients") / "demo"
    process = start_demo(vcsim_bin, port, folder)
    try:
        yield RunningDemo(process, read_until(process, "Ready:", timeout=120), folder, port)
    finally:
        process.terminate()
        process.wait(60)
        assert process.stdout is not None
        process.stdout.close()


def substitute(text: str, demo_run: RunningDemo) -> str:
    return (text.replace(README_BASE, f"https://127.0.0.1:{demo_run.port}")
            .replace("gwt_...", demo_run.token("demo-admin"))
            .replace("demo/tls/cert.pem", str(demo_run.folder / "tls" / "cert.pem")))


def test_the_https_client_entry_connects(demo_run: RunningDemo) -> None:
    config = json.loads(substitute(block("json", '"type": "http"'), demo_run))
    (server,) = config["mcpServers"].values()
    assert server["type"] == "http"

    async def go() -> list[str]:
        tls = ssl.create_default_context(cafile=str(demo_run.folder / "tls" / "cert.pem"))
        http = httpx2.AsyncClient(headers=server["headers"], verify=tls, timeout=60)
        async with http, Client(streamable_http_client(server["url"], http_client=http)) as client:
            return [tool.name for tool in (await client.list_tools()).tools]

    assert "list_vms" in anyio.run(go)


def claude_mcp_add(line: str) -> dict[str, dict[str, object]]:
    """The ``mcpServers`` entry ``claude mcp add --transport T NAME URL --header "K: V"`` writes."""
    words = shlex.split(line)
    assert words[:3] == ["claude", "mcp", "add"], words
    positional, headers, transport, rest = [], {}, "stdio", iter(words[3:])
    for word in rest:
        if word == "--transport":
            transport = next(rest)
        elif word == "--header":
            key, _, value = next(rest).partition(":")
            headers[key.strip()] = value.strip()
        else:
            positional.append(word)
    name, url = positional
    return {name: {"type": transport, "url": url, "headers": headers}}


def test_the_claude_mcp_add_line_is_the_entry_that_connects(demo_run: RunningDemo) -> None:
    """Claude Code itself is not run here: its line must write the very entry the test above connects
    with, and that entry, under VS Code's ``servers`` key, is what docs/clients.md says VS Code reads."""
    (line,) = re.findall(r"`(claude mcp add [^`]+)`", section().replace("\n", " "))
    entry = json.loads(block("json", '"type": "http"'))["mcpServers"]
    assert claude_mcp_add(line) == entry
    assert '"servers"' in section() and ".vscode/mcp.json" in section()
    (server,) = claude_mcp_add(substitute(line, demo_run)).values()

    async def go() -> list[str]:
        tls = ssl.create_default_context(cafile=str(demo_run.folder / "tls" / "cert.pem"))
        headers = server["headers"]
        assert isinstance(headers, dict) and isinstance(server["url"], str)
        http = httpx2.AsyncClient(headers=headers, verify=tls, timeout=60)
        async with http, Client(streamable_http_client(server["url"], http_client=http)) as client:
            return [tool.name for tool in (await client.list_tools()).tools]

    assert "list_vms" in anyio.run(go)


def test_the_python_sdk_program_runs(demo_run: RunningDemo, tmp_path: Path) -> None:
    program = tmp_path / "client.py"
    program.write_text(substitute(block("python", "streamable_http_client"), demo_run))
    result = subprocess.run([sys.executable, str(program)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "'list_vms'" in result.stdout and "ha-host_VM0" in result.stdout


def test_the_inspector_cli_commands_run(demo_run: RunningDemo, tmp_path: Path) -> None:
    if shutil.which("npx") is None:
        unavailable("Node.js (npx) is not installed; the Inspector needs it (apt-get install nodejs npm)")
    assert f"npx -y {demo.INSPECTOR} --cli" in demo_run.output, "the demo prints the verified release"
    script = substitute(block("sh", "@modelcontextprotocol/inspector"), demo_run)
    assert script.count(demo.INSPECTOR) == 2
    result = subprocess.run(["bash", "-euo", "pipefail", "-c", script], capture_output=True, text=True,
                            timeout=600, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    outputs = re.findall(r"^\{.*?^\}", result.stdout, re.S | re.M)
    assert len(outputs) == 2, result.stdout[:2000]
    tools, call = (json.loads(o) for o in outputs)
    assert "list_vms" in {tool["name"] for tool in tools["tools"]}
    assert not call.get("isError") and "ha-host_VM0" in json.dumps(call)


def test_the_inspector_without_a_token_is_told_to_get_one(demo_run: RunningDemo, tmp_path: Path) -> None:
    """docs/clients.md's promise for a forgotten --header: the gateway's 401 reaches the user, in a
    terminal (a pseudo-terminal from util-linux ``script``) and with --stored-auth-only from a pipe."""
    if shutil.which("npx") is None or shutil.which("script") is None:
        unavailable("Node.js (npx) and util-linux script are needed (apt-get install nodejs npm util-linux)")
    base = f"https://127.0.0.1:{demo_run.port}/mcp"
    command = f"npx -y {demo.INSPECTOR} --cli {base} --transport http --method tools/list"
    env = {**os.environ, "NODE_EXTRA_CA_CERTS": str(demo_run.folder / "tls" / "cert.pem")}
    runs = [["script", "-qec", command, "/dev/null"], ["bash", "-c", command + " --stored-auth-only"]]
    for argv in runs:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env,
                              stdin=subprocess.DEVNULL)
        said = done.stdout + done.stderr
        assert done.returncode != 0, said[-2000:]
        assert "gateway token create" in said and "bearer token is required" in said, said[-2000:]
