"""N of M, reasons, blast radius and approvals bound to what was shown, end to end: the real gateway over
HTTPS (uvicorn, the page's API, the MCP client) with two simulated vCenters behind it; vSphere itself is
checked, and changed behind the gateway's back, with pyVmomi.

Rules here: ``prod-*`` needs two distinct people; ``lab-vc`` needs a reason; a bulk call on three or
more VMs is decided by the rule ``big-bulk``, which asks for three approvals."""

from __future__ import annotations

import getpass
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio.to_thread
import pytest
from pyVim.connect import Disconnect
from support.simulator import find_vm, pyvmomi_connect, vm_exists, wait_until
from support.webserver import N_OF_M_RULES, WebServer, decide, mcp_call, propose_delete, signed_in, web_server

from gateway.cli import main

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def served(vcsim_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebServer]:
    with web_server(tmp_path_factory.mktemp("approvals"), vcsim_bin, rules=N_OF_M_RULES, vms=3) as running:
        yield running


def on_vm(served: WebServer, sim: str, name: str, method: str, *args: Any) -> None:
    """Run a task on a VM directly in vSphere (pyVmomi), behind the gateway's back; wait for it."""
    si = pyvmomi_connect(served.sims[sim])
    try:
        task = getattr(find_vm(si, name), method)(*args)
        wait_until(lambda: task.info.state in ("success", "error"), timeout=30, what=f"{method} on {name}")
        assert task.info.state == "success", task.info.error
    finally:
        Disconnect(si)


def rows_of(served: WebServer, proposal_id: str, phase: str) -> list[dict[str, Any]]:
    """The rows of one proposal's moves and approvals in ``phase`` (refused attempts are ``refusals``)."""
    return [r for r in served.audit_rows() if r.get("proposal_id") == proposal_id and r.get("phase") == phase
            and "duration_ms" not in r]


def refusals(served: WebServer, proposal_id: str) -> list[dict[str, Any]]:
    """The rows of refused attempts on one proposal (written by the gate, with the call's duration)."""
    return [r for r in served.audit_rows() if r.get("proposal_id") == proposal_id and r.get("error_code")
            and "duration_ms" in r]


async def approve(served: WebServer, who: str, proposal_id: str, reason: str | None = None) -> Any:
    async with signed_in(served, who) as (client, csrf):
        return await decide(client, served, csrf, proposal_id, "approve", reason)


async def deny(served: WebServer, who: str, proposal_id: str, reason: str | None = None) -> Any:
    async with signed_in(served, who) as (client, csrf):
        return await decide(client, served, csrf, proposal_id, "deny", reason)


async def test_two_of_two_needs_two_different_persons_and_the_first_changes_nothing(
    served: WebServer,
) -> None:
    proposal = await propose_delete(served, "agent", "prod-vc", "DC0_H0_VM0")
    pid = proposal["proposal_id"]
    assert proposal["approvals_required"] == 2 and proposal["approvals_progress"] == "0 of 2 approvals"
    blast = proposal["blast_radius"]["objects"][0]
    assert blast["name"] == "DC0_H0_VM0" and blast["power_state"] == "poweredOn" and blast["host"]
    assert blast["disks"] and all(d["datastore"] and d["capacity_kb"] > 0 for d in blast["disks"])
    assert blast["snapshot_count"] == 0

    first = await approve(served, "alice", pid, "checked with the owner")
    assert first.status_code == 200, first.text
    assert first.json()["result"]["approvals_progress"] == "1 of 2 approvals"
    assert served.proposal_state(pid) == "pending"
    assert vm_exists(served.sims["prod"], "DC0_H0_VM0"), "one approval of two deleted the VM"

    again = await approve(served, "alice", pid, "me again")
    assert again.status_code == 403 and "already" in again.json()["error"]["message"]
    refused = refusals(served, pid)
    assert refused and refused[-1]["reason_code"] == "already_approved"
    assert vm_exists(served.sims["prod"], "DC0_H0_VM0")

    failed, listed = await mcp_call(served, "agent", "list_pending_actions", {})
    assert not failed
    (mine,) = [p for p in listed["pending"] if p["proposal_id"] == pid]
    assert mine["approvals_progress"] == "1 of 2 approvals"
    assert mine["approvals"] == [{"by": "alice", "kind": "person", "role": "admin",
                                  "at": mine["approvals"][0]["at"], "reason": "checked with the owner"}]

    second = await approve(served, "olga", pid, "second pair of eyes")
    assert second.status_code == 200, second.text
    assert served.proposal_state(pid) == "executed"
    assert not vm_exists(served.sims["prod"], "DC0_H0_VM0")
    recorded = rows_of(served, pid, "approval")
    assert [(r["caller"], r["reason"], r["approvals"]) for r in recorded] == [
        ("alice", "checked with the owner", "1 of 2 approvals"),
        ("olga", "second pair of eyes", "2 of 2 approvals"),
    ]
    assert rows_of(served, pid, "approved")[-1]["reason"] == "2 of 2 approvals, by alice, olga"


async def test_a_deny_by_either_approver_ends_it(served: WebServer) -> None:
    pid = (await propose_delete(served, "agent", "prod-vc", "DC0_H0_VM1"))["proposal_id"]
    assert (await approve(served, "alice", pid, "fine by me")).status_code == 200
    denied = await deny(served, "olga", pid, "this one still serves traffic")
    assert denied.status_code == 200, denied.text
    assert served.proposal_state(pid) == "denied"
    assert vm_exists(served.sims["prod"], "DC0_H0_VM1")
    assert rows_of(served, pid, "denied")[-1]["reason"] == "denied by olga: this one still serves traffic"
    late = await approve(served, "olga", pid, "changed my mind")
    assert late.status_code == 409, late.text
    assert served.proposal_state(pid) == "denied" and vm_exists(served.sims["prod"], "DC0_H0_VM1")
    async with signed_in(served, "alice") as (client, _csrf):
        cards = (await client.get("/ui/api/proposals")).json()["proposals"]
    (card,) = [c for c in cards if c["proposal_id"] == pid]
    assert card["deny_reason"] == "this one still serves traffic"


@pytest.mark.parametrize(("vm", "change", "seen"), [
    ("DC0_C0_RP0_VM0", ("Rename_Task", "renamed-between-approvals"), "no VM named"),
    ("DC0_C0_RP0_VM1", ("PowerOnVM_Task",), "DC0_C0_RP0_VM1: power_state"),
])
async def test_a_change_in_vsphere_between_the_approvals_voids_them(
    served: WebServer, vm: str, change: tuple[str, ...], seen: str,
) -> None:
    if change[0] == "PowerOnVM_Task":
        on_vm(served, "prod", vm, "PowerOffVM_Task")
    proposal = await propose_delete(served, "agent", "prod-vc", vm)
    pid = proposal["proposal_id"]
    assert (await approve(served, "alice", pid, "ok")).status_code == 200
    on_vm(served, "prod", vm, *change)
    second = await approve(served, "olga", pid, "ok too")
    assert second.status_code == 409, second.text
    assert second.json()["error"]["code"] == "stale"
    assert "alice" in second.json()["error"]["message"] and "void" in second.json()["error"]["message"]
    assert served.proposal_state(pid) == "stale"
    still = change[1] if change[0] == "Rename_Task" else vm
    assert vm_exists(served.sims["prod"], still), "a stale proposal ran"
    (row,) = rows_of(served, pid, "stale")
    assert "approvals void: alice" in row["reason"] and seen in row["reason"]
    assert not rows_of(served, pid, "executing")


async def test_a_bulk_call_over_min_affected_objects_asks_for_the_stricter_rule(served: WebServer) -> None:
    small_failed, small = await mcp_call(served, "agent", "bulk_vm_action", {
        "target": "lab-vc", "action": "delete_vm", "name_regex": "DC0_H0_VM[01]", "force_power_off": True})
    big_failed, big = await mcp_call(served, "agent", "bulk_vm_action", {
        "target": "lab-vc", "action": "delete_vm", "name_regex": "DC0_H0_VM[0-2]", "force_power_off": True})
    assert not small_failed and not big_failed, (small, big)
    assert small["approvals_required"] == 1
    assert big["approvals_required"] == 3 and big["approvals_progress"] == "0 of 3 approvals"
    assert big["blast_radius"]["count"] == 3
    assert sorted(o["name"] for o in big["blast_radius"]["objects"]) == ["DC0_H0_VM0", "DC0_H0_VM1",
                                                                         "DC0_H0_VM2"]
    for who in ("alice", "lara"):
        assert (await approve(served, who, big["proposal_id"], f"{who} agrees")).status_code == 200
    assert served.proposal_state(big["proposal_id"]) == "pending"
    assert all(vm_exists(served.sims["lab"], f"DC0_H0_VM{i}") for i in range(3))
    for pid in (small["proposal_id"], big["proposal_id"]):
        assert (await deny(served, "olga", pid, "not today")).status_code == 200


async def test_reason_required_refuses_an_approval_without_a_reason(served: WebServer) -> None:
    pid = (await propose_delete(served, "agent", "lab-vc", "DC0_C0_RP0_VM2"))["proposal_id"]
    for reason in (None, "   "):
        bare = await approve(served, "lara", pid, reason)
        assert bare.status_code == 400, bare.text
        assert bare.json()["error"]["code"] == "reason_required"
    refused = refusals(served, pid)
    assert len(refused) == 2 and all(r["error_code"] == "reason_required" for r in refused)
    assert served.proposal_state(pid) == "pending" and vm_exists(served.sims["lab"], "DC0_C0_RP0_VM2")
    given = await approve(served, "lara", pid, "decommissioned, ticket OPS-12 password=hunter2")
    assert given.status_code == 200, given.text
    assert served.proposal_state(pid) == "executed"
    (row,) = rows_of(served, pid, "approval")
    assert row["reason"].startswith("decommissioned, ticket OPS-12") and "hunter2" not in row["reason"]


async def test_the_cli_approval_counts_as_one_persons_approval(
    served: WebServer, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    for name, value in served.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("GATEWAY_ENABLE_DESTRUCTIVE", "1")
    pid = (await propose_delete(served, "agent", "prod-vc", "DC0_H0_VM2"))["proposal_id"]
    capsys.readouterr()
    # the CLI runs its own event loop: in a worker thread, as a shell beside the server would
    assert await anyio.to_thread.run_sync(
        main, ["pending", "approve", pid, "--reason", "from the host", *served.cli_flags()]) == 0
    assert '"approvals_progress": "1 of 2 approvals"' in capsys.readouterr().out
    assert served.proposal_state(pid) == "pending" and vm_exists(served.sims["prod"], "DC0_H0_VM2")
    assert await anyio.to_thread.run_sync(main, ["pending", "list", *served.cli_flags()]) == 0
    listing = capsys.readouterr().out
    me = f"os:{getpass.getuser()}"
    assert f"1 of 2 approvals: {me} (from the host)" in listing
    assert "affects DC0_H0_VM2" in listing and " on LocalDS_" in listing
    assert (await approve(served, "alice", pid, "and me")).status_code == 200
    assert served.proposal_state(pid) == "executed"
    assert not vm_exists(served.sims["prod"], "DC0_H0_VM2")
    assert [r["caller"] for r in rows_of(served, pid, "approval")] == [me, "alice"]


async def test_a_malformed_reason_is_refused_and_audited(served: WebServer) -> None:
    pid = (await propose_delete(served, "agent", "lab-vc", "DC0_C0_RP0_VM0"))["proposal_id"]
    async with signed_in(served, "lara") as (client, csrf):
        response = await client.post(f"/ui/api/proposals/{pid}/approve", json={"reason": ["not", "text"]},
                                     headers={"Origin": served.origin, "X-CSRF-Token": csrf})
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_argument"
    (row,) = [r for r in served.audit_rows()
              if r.get("phase") == "web_refused" and r.get("proposal_id") == pid]
    assert row["caller"] == "lara" and row["error_code"] == "invalid_argument"
    assert served.proposal_state(pid) == "pending"
    assert (await deny(served, "lara", pid, "cleanup")).status_code == 200
