"""Audit before action (issue 10): no change reaches vSphere without a durable ``executing`` row, and the
outcome of a change that ran is never lost when the audit log breaks during it. With the audit unable to
take rows (what /readyz reports), a change or a confirm is refused before its first vSphere read: a relay
in front of the simulator counts zero connections and zero bytes.

The log is made immutable with ``chattr +i`` (root on a filesystem that supports it; the test fails,
not skips, under CI=true when it cannot), the change is slowed with the simulator's slow-task hook.
"""

from __future__ import annotations

import math
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from support.gateway_env import ADMIN, OTHER, PERMISSIVE, VM0, VM1, Env
from support.httpserver import build_gateway
from support.processes import chattr, unavailable
from support.simulator import CountingRelay, MakeSimulator, complete_rules, complete_rules_text

from gateway.audit.query import read_rows
from gateway.errors import AuditUnavailable, InvalidArgument

pytestmark = pytest.mark.anyio
OFF = {"target": "vc1", "vm": VM0, "guest_timeout_seconds": 0}
VM = "DC0_C0_RP0_VM0"
CHANGES = [
    ("power_off_vm", {"vm": VM, "guest_timeout_seconds": 0}),
    ("delete_vm", {"vm": VM, "force_power_off": True}),
    ("remove_disk", {"vm": VM, "disk": "Hard disk 9"}),
]


@pytest.fixture
def immutable() -> Iterator[Any]:
    frozen: list[Path] = []

    def freeze(path: Path) -> None:
        chattr("+i", path)
        frozen.append(path)

    def thaw() -> None:
        while frozen:
            chattr("-i", frozen.pop())

    freeze.thaw = thaw  # type: ignore[attr-defined]
    yield freeze
    thaw()


async def wait_for(condition: Any, what: str, timeout: float = 30.0) -> None:
    with anyio.fail_after(timeout):
        while not condition():
            await anyio.sleep(0.05)
    assert condition(), what


async def test_a_log_broken_during_a_slow_change_keeps_intent_and_outcome(env: Env, immutable: Any) -> None:
    gw = env.build()
    env.sim.control("/slow-task", {"method": "PowerOffVM_Task", "seconds": 3, "count": 1})
    log = env.tmp / "audit.jsonl"
    async with anyio.create_task_group() as tg:
        result: dict[str, Any] = {}

        async def run() -> None:
            result.update(await gw.calls.call(ADMIN, "power_off_vm", OFF))

        tg.start_soon(run)
        await wait_for(lambda: bool(log.exists() and env.rows(phase="executing")), "intent row written")
        immutable(log)
    assert result["target"] == "vc1", "the change ran, and the caller is told so"
    assert env.power_state(VM0) == "poweredOff"
    (intent,) = env.rows(phase="executing")
    assert intent["tool"] == "power_off_vm" and intent["caller"] == ADMIN.name and intent["risk"] == "high"
    assert env.rows(phase="executed") == []
    assert any("wait for the audit log" in r for r in gw.readiness())
    immutable.thaw()
    assert gw.trail.flush_waiting() == 1
    (outcome,) = env.rows(phase="executed")
    assert outcome["delayed"] is True and outcome["outcome"] == "ok"
    assert gw.readiness() == []


async def test_nothing_reaches_vsphere_when_the_intent_cannot_be_written(env: Env, immutable: Any) -> None:
    gw = env.build()
    await gw.calls.call(ADMIN, "list_targets", {})  # the log exists
    proposal = await gw.calls.call(ADMIN, "delete_vm", {"target": "vc1", "vm": VM0, "force_power_off": True})
    immutable(env.tmp / "audit.jsonl")
    with pytest.raises(AuditUnavailable):
        await gw.calls.call(ADMIN, "power_off_vm", OFF)
    with pytest.raises(AuditUnavailable):
        await gw.calls.call(ADMIN, "confirm_action", {"token": proposal["token"]})
    assert env.power_state(VM0) == "poweredOn"
    assert env.vm_exists(VM0)
    p = gw.store.get_proposal(proposal["proposal_id"])
    assert p is not None and p.state == "pending", "a refused claim leaves the proposal as it was"
    immutable.thaw()
    assert gw.trail.flush_waiting() == 2
    refused = env.rows(phase="refused")
    assert [r["tool"] for r in refused] == ["power_off_vm", "delete_vm"]


# ---------------------------------------------------------------- complete rows


async def test_invalid_arguments_are_refused_and_audited_in_a_few_hundred_bytes(env: Env) -> None:
    gw = env.build()
    huge = "x" * 500_000
    with pytest.raises(InvalidArgument, match="at most"):
        await gw.calls.call(ADMIN, "list_vms", {"target": huge})
    with pytest.raises(InvalidArgument, match="finite"):
        await gw.calls.call(ADMIN, "get_events", {"target": "vc1", "minutes": math.nan})
    with pytest.raises(InvalidArgument, match="unknown parameter"):
        await gw.calls.call(ADMIN, "confirm_action", {"token": "gwc_x", "extra": 1})
    rows = env.rows(phase="invalid")
    assert [r["tool"] for r in rows] == ["list_vms", "get_events", "confirm_action"]
    assert all(r["error_code"] == "invalid_argument" for r in rows)
    assert len((env.tmp / "audit.jsonl").read_text().splitlines()[0]) < 1500
    assert rows[0]["args"]["target"]["size"] == 500_000  # cut by the sink, with its size and digest


async def test_pending_lists_and_foreign_cancels_are_audited(env: Env) -> None:

    gw = env.build()
    proposal = await gw.calls.call(ADMIN, "delete_vm", {"target": "vc1", "vm": VM0, "force_power_off": True})
    listed = await gw.calls.call(ADMIN, "list_pending_actions", {})
    assert listed["count"] == 1
    with pytest.raises(Exception) as caught:
        await gw.calls.call(OTHER, "cancel_action", {"token": proposal["token"]})
    assert getattr(caught.value, "code", None) == "confirmation_invalid"
    (listing,) = env.rows(tool="list_pending_actions")
    assert listing["proposal_ids"] == [proposal["proposal_id"]]
    (foreign,) = env.rows(phase="denied", tool="cancel_action")
    assert foreign["caller"] == OTHER.name and foreign["proposal_id"] == proposal["proposal_id"]


async def test_a_fan_out_records_each_targets_outcome(env: Env) -> None:
    gw = env.build()
    await gw.calls.call(ADMIN, "list_vms", {"target": "all"})
    (row,) = env.rows(tool="list_vms")
    assert row["outcomes"] == {"vc1": "ok"} and row["outcome"] == "ok"


# ---------------------------------------------------------------- a held audit lock never stalls the server


async def test_a_held_audit_lock_refuses_changes_while_health_answers(
    tmp_path: Path, make_simulator: MakeSimulator
) -> None:
    import fcntl

    from support.httpserver import mcp_client, real_gateway, serve

    sim = make_simulator(vms=2)
    gw = real_gateway(sim, tmp_path)
    (tmp_path / "home" / "rules.yaml").write_text(complete_rules_text("defaults: {write: allow}\n"))
    gw.policy.current()  # loaded now (a reload audits roles too), not under the held lock below
    served = serve(tmp_path, gw)
    try:
        async with mcp_client(served, served.tokens["alice"], "legacy") as client:
            assert not (await client.call_tool("list_targets", {})).is_error  # the log and its lock exist
            (listed,) = read_rows(gw.settings.audit_log, tool="list_targets")
            assert listed["client"].startswith("mcp"), "the row names the MCP client's declared name/version"
            lock = os.open(f"{gw.settings.audit_log}.lock", os.O_RDWR)
            fcntl.flock(lock, fcntl.LOCK_EX)  # another process holds the audit lock
            try:
                async with anyio.create_task_group() as tg:
                    answer: dict[str, Any] = {}

                    async def change() -> None:
                        answer["result"] = await client.call_tool("power_off_vm", OFF)

                    tg.start_soon(change)
                    async with served.http() as http:
                        health = await http.get("/healthz")
                    assert health.status_code == 200, "health answers while the audit lock is held"
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
                os.close(lock)
        result = answer["result"]
        assert result.is_error and "audit_unavailable" in result.content[0].text
        assert sim_power(sim) == "poweredOn", "nothing reached vSphere"
    finally:
        served.stop()
        await gw.close()


def sim_power(sim: Any) -> str:
    from support.simulator import find_vm, pyvmomi_connect, read_properties

    si = pyvmomi_connect(sim)
    return str(read_properties(si, find_vm(si, VM0), "runtime.powerState")["runtime.powerState"])


async def test_a_fan_out_row_records_each_targets_own_outcome(
    tmp_path: Path, make_simulator: MakeSimulator
) -> None:
    """Three targets: one answers, one is down, one the policy refuses to this caller."""
    import yaml
    from support.simulator import write_targets

    from gateway.server.runtime import Gateway
    from gateway.settings import Settings

    sims = {"vc1": make_simulator(vms=1), "vc2": make_simulator(vms=1), "vc3": make_simulator(vms=1)}
    env_vars = write_targets(tmp_path / "targets.yaml", sims, {"vc2": {"timeout_seconds": 5}})
    rules = {
        **PERMISSIVE,
        "rules": [{"name": "no-vc3", "action": "deny", "match": {"targets": ["vc3"], "tools": ["read"]}}],
    }
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(complete_rules(rules)))
    gw = Gateway.build(Settings.from_env({"GATEWAY_HOME": str(tmp_path), **env_vars}))
    sims["vc2"].stop()
    try:
        result = await gw.calls.call(ADMIN, "list_vms", {"target": "all"})
    finally:
        await gw.close()
    assert "ok" in result["vc1"] and "error" in result["vc2"]
    assert result["vc3"]["error"]["code"] == "policy_denied"
    (row,) = read_rows(tmp_path / "audit.jsonl", tool="list_vms", phase="call")
    assert row["outcome"] == "partial"
    assert row["outcomes"]["vc1"] == "ok" and row["outcomes"]["vc3"] == "policy_denied"
    assert row["outcomes"]["vc2"] == result["vc2"]["error"]["code"] != "ok"
    (denied,) = read_rows(tmp_path / "audit.jsonl", tool="list_vms", phase="denied")
    assert denied["target"] == "vc3" and denied["decision"]["rule"] == "rule:no-vc3"


# ---------------------------------------------------------------- a full disk during a slow change


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MB tmpfs mounted for the audit log (root; fails, not skips, under CI=true if impossible)."""
    mount = tmp_path / "auditfs"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        unavailable(f"cannot mount a small tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True, check=False)


def fill(disk: Path) -> Path:
    """Write a file until the filesystem refuses with ENOSPC; the file (remove it to free the disk)."""
    import errno

    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for chunk in (1 << 16, 1 << 12, 1):
            try:
                while True:
                    os.write(fd, b"\0" * chunk)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
    finally:
        os.close(fd)
    return filler


async def use_up_the_logs_last_block(gw: Any) -> None:
    """A full filesystem still takes appends into the free end of the log's last block: small reads
    (each writes a row) use it up until the audit refuses one."""
    for _ in range(100):
        try:
            await gw.calls.call(ADMIN, "list_targets", {})
        except AuditUnavailable:
            return
    pytest.fail("the audit log kept taking rows on a full filesystem")


async def test_a_disk_filled_during_a_slow_change_keeps_intent_and_true_state(
    env: Env, small_disk: Path
) -> None:
    """The audit log lives on a 1 MB filesystem that fills up while a confirmed delete runs: the change
    had its ``executing`` row, so it finishes and the proposal says ``executed``; its outcome row
    waits; a new change is refused with audit_unavailable and nothing of it reaches vSphere."""
    log = small_disk / "audit.jsonl"
    gw = env.build(audit_log=log)
    proposal = await gw.calls.call(ADMIN, "delete_vm", {"target": "vc1", "vm": VM0, "force_power_off": True})
    env.sim.control("/slow-task", {"method": "Destroy_Task", "seconds": 5, "count": 1})
    result: dict[str, Any] = {}
    async with anyio.create_task_group() as tg:

        async def confirm() -> None:
            result.update(await gw.calls.call(ADMIN, "confirm_action", {"token": proposal["token"]}))

        tg.start_soon(confirm)
        await wait_for(
            lambda: any(
                r.get("proposal_id") == proposal["proposal_id"] for r in read_rows(log, phase="executing")
            ),
            "intent row written",
        )
        filler = fill(small_disk)
        await use_up_the_logs_last_block(gw)
        assert not result, "the slow change was still running when the disk filled up"
    assert result["state"] == "executed" and not env.vm_exists(VM0), "the claimed change ran"
    p = gw.store.get_proposal(proposal["proposal_id"])
    assert p is not None and p.state == "executed", "the proposal keeps its true state"
    assert read_rows(log, phase="executed") == [], "its row waits: the disk is full"
    assert any("wait for the audit log" in r for r in gw.readiness())

    with pytest.raises(AuditUnavailable):
        await gw.calls.call(ADMIN, "power_off_vm", {"target": "vc1", "vm": VM1, "guest_timeout_seconds": 0})
    assert env.power_state(VM1) == "poweredOn", "no change without an executing row"
    assert [r for r in read_rows(log, phase="executing") if r["tool"] == "power_off_vm"] == []

    filler.unlink()
    assert gw.trail.flush_waiting() >= 2
    (outcome,) = read_rows(log, phase="executed")
    assert outcome["proposal_id"] == proposal["proposal_id"] and outcome["delayed"] is True
    refused = read_rows(log, phase="refused")
    assert [r["tool"] for r in refused] == ["power_off_vm"]
    assert gw.readiness() == []


# ---------------------------------------------------------------- an audit taking no rows: no vSphere call


def _break_the_log(tmp: Path) -> None:
    log = tmp / "audit.jsonl"
    log.unlink(missing_ok=True)
    log.mkdir()  # a directory where the log should be: not writable, even as root


@pytest.mark.parametrize(("tool", "args"), CHANGES, ids=[c[0] for c in CHANGES])
def test_an_unwritable_audit_refuses_a_change_before_any_vsphere_call(
    make_simulator: MakeSimulator, tmp_path: Path, tool: str, args: dict[str, Any]
) -> None:
    sim = make_simulator()
    relay = CountingRelay(sim.host, sim.port)
    gateway = build_gateway(tmp_path, sim, target={"port": relay.port})
    _break_the_log(tmp_path)

    async def scenario() -> None:
        try:
            assert "audit log not writable" in gateway.readiness()
            with pytest.raises(AuditUnavailable) as refused:
                await gateway.calls.call(ADMIN, tool, {"target": "vc1", **args})
            assert (relay.connections, relay.bytes_sent) == (0, 0), "the refused change reached vSphere"
            assert "nothing was read from or sent to vSphere" in refused.value.message
            (row,) = list(gateway.trail.waiting)
            assert row["phase"] == "refused" and row["tool"] == tool
            assert row["error_code"] == "audit_unavailable"
            # the relay is on the path: with the log back, the same gateway reaches vSphere through it
            (tmp_path / "audit.jsonl").rmdir()
            await gateway.calls.call(ADMIN, "list_vms", {"target": "vc1"})
            assert relay.bytes_sent > 0
        finally:
            await gateway.close()
            relay.close()

    anyio.run(scenario)


def test_an_unwritable_audit_refuses_a_confirm_before_any_vsphere_call(
    make_simulator: MakeSimulator, tmp_path: Path
) -> None:
    sim = make_simulator()
    relay = CountingRelay(sim.host, sim.port)
    gateway = build_gateway(tmp_path, sim, target={"port": relay.port})

    async def scenario() -> None:
        try:
            args = {"target": "vc1", "vm": VM, "force_power_off": True}
            proposal = await gateway.calls.call(ADMIN, "delete_vm", args)
            _break_the_log(tmp_path)
            before = relay.bytes_sent
            with pytest.raises(AuditUnavailable) as refused:
                await gateway.calls.call(ADMIN, "confirm_action", {"token": proposal["token"]})
            assert relay.bytes_sent == before, "the refused confirm reached vSphere"
            assert "nothing was read from or sent to vSphere" in refused.value.message
            found = gateway.store.get_proposal(proposal["proposal_id"])
            assert found is not None and found.state == "pending"
        finally:
            await gateway.close()
            relay.close()

    anyio.run(scenario)
