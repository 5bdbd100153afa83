"""Refused callers learn nothing (issue 24): the policy decides before any precondition that lists what a
VM has, over the real HTTPS server, the MCP client and the simulator."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from answers import answer_of
from httpserver import Served, audit_rows, build_gateway, mcp_client, serve
from simulator import MakeSimulator, find_vm, pyvmomi_connect, wait_until

PROTECTED = "DC0_C0_RP0_VM0"
OPEN = "DC0_C0_RP0_VM1"
SNAPSHOT = "before-upgrade"
RULES = {
    "defaults": {"read": "allow", "write": "allow", "destructive": "allow"},
    "protected": [{"name": "crown-jewels", "vm_patterns": [PROTECTED]}],
}


@pytest.fixture
def served(make_simulator: MakeSimulator, tmp_path: Path) -> Iterator[Served]:
    sim = make_simulator()
    si = pyvmomi_connect(sim)
    for name in (PROTECTED, OPEN):
        find_vm(si, name).CreateSnapshot_Task(name=SNAPSHOT, description="", memory=False, quiesce=False)
    wait_until(lambda: all(find_vm(si, n).snapshot is not None for n in (PROTECTED, OPEN)),
               what="snapshots taken")
    running = serve(tmp_path, build_gateway(tmp_path, sim, RULES))
    yield running
    running.stop()
    anyio.run(running.gateway.close)


def _call(served: Served, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    async def call() -> dict[str, Any]:
        async with mcp_client(served, served.tokens["alice"], "2026-07-28") as client:
            result = await client.call_tool(tool, {"target": "vc1", **args})
        assert result.is_error
        return answer_of(result)["error"]

    return anyio.run(call)


CASES = [
    ("remove_disk", {"disk": "Hard disk 9"}, ("disk-", "(key ", "its disks")),
    ("delete_snapshot", {"snapshot": "nope"}, (SNAPSHOT, "snapshot-", "its snapshots")),
    ("revert_snapshot", {"snapshot": "nope"}, (SNAPSHOT, "snapshot-", "its snapshots")),
]


@pytest.mark.parametrize(("tool", "args", "secrets"), CASES, ids=[c[0] for c in CASES])
def test_a_protected_vm_answers_policy_denied_without_listing_what_it_has(
    served: Served, tool: str, args: dict[str, Any], secrets: tuple[str, ...]
) -> None:
    error = _call(served, tool, {"vm": PROTECTED, **args})
    assert error["code"] == "policy_denied", error
    assert "crown-jewels" in error["message"]
    for word in secrets:
        assert word not in str(error), error
    (row,) = [r for r in audit_rows(served.gateway) if r.get("tool") == tool]
    assert row["phase"] == "denied" and row["error_code"] == "policy_denied"
    assert not any(word in str(row) for word in secrets), row


@pytest.mark.parametrize(("tool", "args", "secrets"), CASES, ids=[c[0] for c in CASES])
def test_a_vm_the_policy_allows_hears_what_it_has(
    served: Served, tool: str, args: dict[str, Any], secrets: tuple[str, ...]
) -> None:
    error = _call(served, tool, {"vm": OPEN, **args})
    assert error["code"] == "invalid_argument", error
    assert error["field"] in ("disk", "snapshot")
    assert secrets[0] in error["message"] and secrets[2] in error["message"]


def test_a_name_two_vms_carry_is_judged_on_both_before_the_candidates_are_named(
    make_simulator: MakeSimulator, tmp_path: Path
) -> None:
    from pyVmomi import vim

    sim = make_simulator()
    si = pyvmomi_connect(sim)
    for name in (PROTECTED, OPEN):  # the simulator, like vCenter in other folders, allows a second one
        vm = find_vm(si, name)
        vm.CloneVM_Task(folder=vm.parent, name=name, spec=vim.vm.CloneSpec(location=vim.vm.RelocateSpec()))
    served = serve(tmp_path, build_gateway(tmp_path, sim, RULES))
    try:
        error = _call(served, "delete_vm", {"vm": PROTECTED, "force_power_off": True})
        assert error["code"] == "policy_denied", error
        assert "candidates" not in error and "moid" not in error["message"], error
        error = _call(served, "delete_vm", {"vm": OPEN, "force_power_off": True})
        assert error["code"] == "ambiguous", error
        assert len(error["candidates"]) == 2
    finally:
        served.stop()
        anyio.run(served.gateway.close)
