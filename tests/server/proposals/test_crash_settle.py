"""kill -9 during a confirmed delete: the restarted gateway settles the claim at once, audited, and the
change is never executed twice. A real ``gateway serve`` process over HTTPS, a real simulator whose
``Destroy_Task`` is slowed by its control hook, the real MCP client."""

from __future__ import annotations

import json
import os
import re
import signal
import ssl
import time
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
import yaml
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from support.answers import answer_of
from support.httpserver import FAST_HASH, Command, https_argv, run_serve
from support.processes import chattr
from support.simulator import MakeSimulator, complete_rules, wait_until, write_targets

from gateway.audit.query import read_rows
from gateway.auth.tokens import create_token
from gateway.server.edge.tls import create_certificate
from gateway.store import SqliteStore

pytestmark = pytest.mark.anyio
VM = "DC0_C0_RP0_VM0"


def started(command: Command) -> str:
    found = wait_until(
        lambda: (
            command.process.poll() is not None
            or re.search(r"running on https://127\.0\.0\.1:(\d+)", command.output())
        ),
        timeout=60,
        what="gateway serve to listen",
    )
    assert isinstance(found, re.Match), command.output()
    return f"https://localhost:{found.group(1)}"


async def call(base: str, token: str, cafile: Path, tool: str, args: dict[str, Any]) -> Any:
    http = httpx2.AsyncClient(
        headers={"Authorization": f"Bearer {token}"},
        timeout=60,
        verify=ssl.create_default_context(cafile=str(cafile)),
    )
    async with (
        http,
        Client(streamable_http_client(f"{base}/mcp", http_client=http), mode="legacy") as client,
    ):
        result = await client.call_tool(tool, args)
    return result


async def test_kill_9_during_a_confirmed_delete_is_settled_at_restart(
    tmp_path: Path, make_simulator: MakeSimulator
) -> None:
    sim = make_simulator(vms=2)
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    env = write_targets(tmp_path / "targets.yaml", {"vc1": sim})
    env.update(
        {
            "GATEWAY_HOME": str(home),
            "GATEWAY_TARGETS_FILE": str(tmp_path / "targets.yaml"),
            "GATEWAY_ENABLE_DESTRUCTIVE": "true",
        }
    )
    (home / "rules.yaml").write_text(yaml.safe_dump(complete_rules({"defaults": {"destructive": "allow"}})))
    with SqliteStore(home / "state.db") as store:
        token, _ = create_token(store, "ops", "admin", expires_in=None, now=time.time(), hasher=FAST_HASH)
    cert = create_certificate(tmp_path / "tls", ["localhost"], ["127.0.0.1"])
    first = run_serve(tmp_path, env, *https_argv(cert))
    try:
        base = started(first)
        made = await call(
            base,
            token,
            cert.cert,
            "delete_vm",
            {"target": "vc1", "vm": VM, "force_power_off": True},
        )
        proposal = answer_of(made)
        assert proposal["state"] == "pending", made.content
        sim.control("/slow-task", {"method": "Destroy_Task", "seconds": 30, "count": 1})
        log = home / "audit.jsonl"

        def claimed() -> bool:
            return any(
                r.get("proposal_id") == proposal["proposal_id"] for r in read_rows(log, phase="executing")
            )

        async with anyio.create_task_group() as tg:
            tg.start_soon(call, base, token, cert.cert, "confirm_action", {"token": proposal["token"]})
            with anyio.fail_after(60):
                while not claimed():
                    await anyio.sleep(0.05)
            os.kill(first.process.pid, signal.SIGKILL)
            first.process.wait(30)
            tg.cancel_scope.cancel()
    finally:
        if first.process.poll() is None:
            first.process.kill()
            first.process.wait(30)
    with SqliteStore(home / "state.db") as store:
        left = store.get_proposal(proposal["proposal_id"])
    assert left is not None and left.state == "executing" and left.executor, "the dead process's claim"

    second = run_serve(tmp_path, env, *https_argv(cert))
    try:
        base = started(second)
        with SqliteStore(home / "state.db") as store:
            settled = store.get_proposal(proposal["proposal_id"])
        assert settled is not None and settled.state == "outcome_unknown", "settled before serving"
        (row,) = [
            r for r in read_rows(log, phase="outcome_unknown") if r["proposal_id"] == proposal["proposal_id"]
        ]
        assert left.executor in row["reason"] and row["caller"] == "gateway"
        again = await call(base, token, cert.cert, "confirm_action", {"token": proposal["token"]})
        assert again.is_error
        assert json.loads(again.content[0].text)["error"]["code"] == "confirmation_invalid"
        executing = [
            r for r in read_rows(log, phase="executing") if r.get("proposal_id") == proposal["proposal_id"]
        ]
        assert len(executing) == 1, "claimed once, never executed twice"
    finally:
        code = second.stop()
    assert code == 0, second.output()


async def test_an_outcome_row_lost_with_a_killed_process_is_recovered_at_restart(
    tmp_path: Path, make_simulator: MakeSimulator
) -> None:
    """The log turns immutable while a confirmed delete runs: the change finishes, its ``executed`` row
    waits in memory, and the process is killed with it. The restarted gateway finds the proposal
    final in the state store but its row missing from the log, and appends it (``recovered: true``)."""
    sim = make_simulator(vms=2)
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    env = write_targets(tmp_path / "targets.yaml", {"vc1": sim})
    env.update(
        {
            "GATEWAY_HOME": str(home),
            "GATEWAY_TARGETS_FILE": str(tmp_path / "targets.yaml"),
            "GATEWAY_ENABLE_DESTRUCTIVE": "true",
        }
    )
    (home / "rules.yaml").write_text(yaml.safe_dump(complete_rules({"defaults": {"destructive": "allow"}})))
    with SqliteStore(home / "state.db") as store:
        token, _ = create_token(store, "ops", "admin", expires_in=None, now=time.time(), hasher=FAST_HASH)
    cert = create_certificate(tmp_path / "tls", ["localhost"], ["127.0.0.1"])
    log = home / "audit.jsonl"
    first = run_serve(tmp_path, env, *https_argv(cert))
    frozen = False
    try:
        base = started(first)
        made = await call(
            base, token, cert.cert, "delete_vm", {"target": "vc1", "vm": VM, "force_power_off": True}
        )
        proposal = answer_of(made)
        pid = proposal["proposal_id"]
        sim.control("/slow-task", {"method": "Destroy_Task", "seconds": 3, "count": 1})
        answer: dict[str, Any] = {}

        async def confirm() -> None:
            answer["result"] = await call(
                base, token, cert.cert, "confirm_action", {"token": proposal["token"]}
            )

        async with anyio.create_task_group() as tg:
            tg.start_soon(confirm)
            with anyio.fail_after(60):
                while not any(r.get("proposal_id") == pid for r in read_rows(log, phase="executing")):
                    await anyio.sleep(0.05)
            chattr("+i", log)
            frozen = True
        assert not answer["result"].is_error, "the change ran and the caller is told so"
        with SqliteStore(home / "state.db") as store:
            done = store.get_proposal(pid)
        assert done is not None and done.state == "executed"
        os.kill(first.process.pid, signal.SIGKILL)
        first.process.wait(30)
    finally:
        if frozen:
            chattr("-i", log)
        if first.process.poll() is None:
            first.process.kill()
            first.process.wait(30)
    assert [r for r in read_rows(log, phase="executed") if r.get("proposal_id") == pid] == [], (
        "the outcome row died with the process"
    )

    second = run_serve(tmp_path, env, *https_argv(cert))
    try:
        started(second)
        (row,) = [r for r in read_rows(log, phase="executed") if r.get("proposal_id") == pid]
        assert row["recovered"] is True and row["outcome"] == "ok" and row["caller"] == "gateway"
        assert len([r for r in read_rows(log, phase="executing") if r.get("proposal_id") == pid]) == 1
    finally:
        code = second.stop()
    assert code == 0, second.output()
