"""``GATEWAY_ALLOW_WRITE=a,b`` beside ``GATEWAY_READ_ONLY`` (issue 34): the environment form of
``serve --allow-write``, checked as the flag is (exit 2 listing the valid names), the flag winning."""

from __future__ import annotations

import os
import ssl
import subprocess
import sys
import time
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from support.httpserver import FAST_HASH, REPO, https_argv, run_serve, serve_home
from support.simulator import Simulator

from gateway.auth.tokens import create_token
from gateway.server.edge.tls import create_certificate
from gateway.settings import Settings
from gateway.store.sqlite import SqliteStore
from gateway.tools.exposure import write_tool_names
from gateway.tools.registry import all_tools
from gateway.vocabulary import Category

ALLOWED = ("create_snapshot", "power_on_vm")


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    return {**env, **extra}


def test_the_variable_sets_the_allowed_writes_and_the_flag_wins(tmp_path: Path) -> None:
    env = {"GATEWAY_HOME": str(tmp_path), "GATEWAY_READ_ONLY": "true",
           "GATEWAY_ALLOW_WRITE": " create_snapshot, power_on_vm,"}
    assert Settings.from_env(env).allow_write == ALLOWED
    flagged = Settings.from_env({**env, "GATEWAY_ALLOW_WRITE": "no_such_tool"}, allow_write=("reset_vm",))
    assert (flagged.allow_write, flagged.allow_write_env) == (("reset_vm",), None)
    unset = Settings.from_env({"GATEWAY_HOME": str(tmp_path), "GATEWAY_ALLOW_WRITE": ""})
    assert unset.allow_write_env is None


def test_a_bad_name_in_the_variable_stops_serve_with_exit_2_and_the_valid_names(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "gateway", "serve", "--read-only", "--home", str(tmp_path)],
        capture_output=True, text=True, cwd=REPO, timeout=60, check=False, stdin=subprocess.DEVNULL,
        env=clean_env(GATEWAY_ALLOW_WRITE="create_snapshot,delete_vm"))
    assert proc.returncode == 2, proc.stderr
    assert "GATEWAY_ALLOW_WRITE" in proc.stderr and "'delete_vm' is not a write tool" in proc.stderr
    assert all(name in proc.stderr for name in write_tool_names()) and "Traceback" not in proc.stderr


def test_the_flag_wins_over_a_bad_variable(tmp_path: Path) -> None:
    """A good --allow-write is served although GATEWAY_ALLOW_WRITE names no write tool: serve gets past
    the exposure check (it then stops for want of a targets file, exit 1, not 2)."""
    proc = subprocess.run(
        [sys.executable, "-m", "gateway", "serve", "--read-only", "--allow-write", "reset_vm",
         "--home", str(tmp_path), "--targets", str(tmp_path / "none.yaml")],
        capture_output=True, text=True, cwd=REPO, timeout=60, check=False, stdin=subprocess.DEVNULL,
        env=clean_env(GATEWAY_ALLOW_WRITE="delete_vm"))
    assert proc.returncode == 1, proc.stderr
    assert "GATEWAY_ALLOW_WRITE" not in proc.stderr and "Traceback" not in proc.stderr


def offered_tools(base: str, cafile: Path, token: str) -> list[str]:
    async def run() -> list[str]:
        http = httpx2.AsyncClient(base_url=base, verify=ssl.create_default_context(cafile=str(cafile)),
                                  headers={"Authorization": f"Bearer {token}"}, timeout=30)
        async with http, Client(streamable_http_client(f"{base}/mcp", http_client=http),
                                mode="2026-07-28") as client:
            listed = await client.list_tools()
        return sorted(tool.name for tool in listed.tools)

    return anyio.run(run)


@pytest.mark.parametrize("destructive", [False, True])
def test_served_tools_list_offers_the_reads_and_exactly_the_named_writes(
    sim_vc1: Simulator, tmp_path: Path, destructive: bool,
) -> None:
    home, env = serve_home(tmp_path, {"vc1": sim_vc1})
    env.update({"GATEWAY_READ_ONLY": "true", "GATEWAY_ALLOW_WRITE": ",".join(ALLOWED),
                "GATEWAY_ENABLE_DESTRUCTIVE": "true" if destructive else "false"})
    with SqliteStore(home / "state.db") as store:
        token, _ = create_token(store, "ops", "admin", expires_in=None, now=time.time(), hasher=FAST_HASH)
    cert = create_certificate(tmp_path / "tls", ["localhost"], ["127.0.0.1"])
    command = run_serve(tmp_path, env, *https_argv(cert))
    try:
        offered = offered_tools(command.base(), cert.cert, token)
    finally:
        code = command.stop()
    assert code == 0, command.output()
    reads = sorted(s.name for s in all_tools(destructive=destructive) if s.kind is Category.READ)
    assert offered == sorted([*reads, *ALLOWED]), command.output()
