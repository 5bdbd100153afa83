"""Refused callers learn nothing (issue 24): the policy decides before any precondition that lists what a
VM has, over the real HTTPS server, the MCP client and the simulator."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from support.answers import answer_of
from support.gateway_env import HUMAN, PERMISSIVE, VM0, VM1, Env
from support.httpserver import Served, audit_rows, build_gateway, mcp_client, serve
from support.simulator import MakeSimulator, find_vm, pyvmomi_connect, wait_until

from gateway.errors import PolicyDenied
from gateway.server.runtime import Gateway

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


# ---------------------------------------------------------------- in the pipeline: policy before state


@pytest.mark.anyio
async def test_protected_powered_on_vm_delete_gets_the_policy_denial(env: Env) -> None:
    rules = {**PERMISSIVE, "protected": [{"name": "keep-vm0", "vm_patterns": [VM0]}]}
    gw = env.build(rules=rules)
    assert env.power_state(VM0) == "poweredOn"
    with pytest.raises(PolicyDenied, match="keep-vm0") as caught:
        await gw.calls.call(HUMAN, "delete_vm", {"target": "vc1", "vm": VM0})
    assert "power" not in caught.value.message.lower()


@pytest.mark.anyio
async def test_broken_rules_file_answers_with_the_policy_error(env: Env) -> None:
    first = env.build()
    (env.tmp / "rules.yaml").write_text("defaults: [this is not\n")
    gw = Gateway.build(first.settings)  # broken at its start: no good rules to keep
    env.gateways.append(gw)
    with pytest.raises(PolicyDenied, match="policy file") as caught:
        await gw.calls.call(HUMAN, "delete_vm", {"target": "vc1", "vm": VM1})
    assert "power" not in caught.value.message.lower()


@pytest.mark.anyio
async def test_power_state_advice_only_after_the_policy(env: Env) -> None:
    rules = {
        **PERMISSIVE,
        "protected": [{"name": "keep-vm0", "vm_patterns": [VM0], "min_risk_level": "medium"}],
    }
    gw = env.build(rules=rules)
    with pytest.raises(PolicyDenied, match="keep-vm0"):  # already on: still the policy's answer first
        await gw.calls.call(HUMAN, "power_on_vm", {"target": "vc1", "vm": VM0})
    from gateway.errors import InvalidState

    with pytest.raises(InvalidState, match="poweredOn"):  # allowed by policy: now the state advice
        await gw.calls.call(HUMAN, "power_on_vm", {"target": "vc1", "vm": VM1})


# ---------------------------------------------------------------- a denied call hears no state


#: (case, tool, arguments, how to put VM0 in the state the plan objects to)
STATE_CASES = [
    ("orphaned power", "power_off_vm", {"vm": "DC0_C0_RP0_VM0"}, "orphaned"),
    ("orphaned snapshot", "create_snapshot", {"vm": "DC0_C0_RP0_VM0", "name": "s1"}, "orphaned"),
    ("orphaned delete", "delete_vm", {"vm": "DC0_C0_RP0_VM0", "force_power_off": True}, "orphaned"),
    (
        "orphaned bulk",
        "bulk_vm_action",
        {"action": "delete_vm", "name_regex": "DC0_C0_RP0_VM0", "force_power_off": True},
        "orphaned",
    ),
    ("hot add", "reconfigure_vm", {"vm": "DC0_C0_RP0_VM0", "cpu_count": 2}, "powered on"),
    ("no iso", "unmount_iso", {"vm": "DC0_C0_RP0_VM0"}, "powered on"),
    ("no snapshot", "revert_snapshot", {"vm": "DC0_C0_RP0_VM0"}, "powered on"),
]


@pytest.mark.anyio
@pytest.mark.parametrize(("case", "tool", "args", "state"), STATE_CASES, ids=[c[0] for c in STATE_CASES])
@pytest.mark.parametrize("denied", [True, False], ids=["denied", "allowed"])
async def test_a_denied_call_never_hears_about_object_state(
    tmp_path: Path,
    make_simulator: MakeSimulator,
    case: str,
    tool: str,
    args: dict[str, Any],
    state: str,
    denied: bool,
) -> None:
    """A deny rule naming the VM answers with the denial, whatever state the VM is in; a caller the policy
    lets through hears the state advice (``invalid_state``) and nothing reaches vSphere."""
    from gateway.errors import InvalidState, PolicyDenied

    env = Env(tmp_path, make_simulator(vms=2))
    rule = {"name": "hands-off-vm0", "action": "deny", "match": {"vm_patterns": [VM0]}}
    gw = env.build(rules={**PERMISSIVE, "rules": [rule] if denied else []})
    try:
        if state == "orphaned":
            env.sim.control("/vm/connection-state", {"vm": VM0, "state": "orphaned"})
        expected = PolicyDenied if denied else InvalidState
        with pytest.raises((PolicyDenied, InvalidState)) as caught:
            await gw.calls.call(HUMAN, tool, {"target": "vc1", **args})
        assert type(caught.value) is expected, f"{case}: {caught.value.code}: {caught.value.message}"
        if denied:
            assert "hands-off-vm0" in caught.value.message
            for word in ("orphaned", "power", "hot", "iso", "snapshot"):
                assert word not in caught.value.message.lower(), caught.value.message
        assert env.vm_exists(VM0)
    finally:
        await gw.close()
