"""Each way around the guard that issue 9 found, closed: real simulator, real store, real rules file.

Every test here was first run against the old pipeline and seen to fail (see the branch's report).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from gateway_env import PERMISSIVE, VM0, VM1, Env

from gateway.auth.tokens import Principal, create_token
from gateway.errors import (
    ApprovalRequired,
    ConfirmationInvalid,
    Forbidden,
    GatewayError,
    NotFound,
    PolicyDenied,
    RateLimited,
)
from gateway.server.pipeline import Gateway
from gateway.vocabulary import Kind

pytestmark = pytest.mark.anyio

HUMAN = Principal(name="alice", role="admin", surface="web", kind=Kind.PERSON)


def write_roles(home: Path, roles: dict[str, Any]) -> None:
    (home / "roles.yaml").write_text(yaml.safe_dump({"roles": roles}))
    os.chmod(home / "roles.yaml", 0o600)


def role(
    *, write: tuple[str, ...] = (), destructive: tuple[str, ...] = (), targets: Any = "*"
) -> dict[str, Any]:
    return {
        "tools": "read",
        "allow_write": list(write),
        "allow_destructive": list(destructive),
        "targets": targets,
        "approve": "none",
    }


def token_principal(gw: Gateway, name: str, role_name: str) -> Principal:
    """A principal backed by a real token record, as the HTTPS server would hand the pipeline."""
    _, rec = create_token(gw.store, name, role_name, expires_in=None, now=gw.clock())
    return Principal(name=rec.name, role=rec.role, token_id=rec.token_id, surface="https")


# ---------------------------------------------------------------- composite reach


async def test_bulk_delete_needs_delete_vm_in_the_role(env: Env) -> None:
    write_roles(env.tmp, {"bulker": role(destructive=("bulk_vm_action",))})
    gw = env.build()
    bulker = token_principal(gw, "bulk-agent", "bulker")
    with pytest.raises(Forbidden, match="delete_vm"):
        await gw.call(
            bulker,
            "bulk_vm_action",
            {
                "target": "vc1",
                "action": "delete_vm",
                "name_regex": "DC0_C0_RP0_VM.*",
                "force_power_off": True,
            },
        )
    assert gw.store.list_proposals(["pending"]) == []
    (row,) = env.rows(phase="denied", tool="bulk_vm_action")
    assert "delete_vm" in row["decision"]["reason"]


# ---------------------------------------------------------------- re-authorization at execution


async def test_confirm_after_demotion_is_refused(env: Env) -> None:
    write_roles(
        env.tmp,
        {
            "deleter": role(write=("power_off_vm",), destructive=("delete_vm",)),
            "writer": role(write=("power_off_vm",)),
        },
    )
    gw = env.build()
    agent = token_principal(gw, "agent-d", "deleter")
    proposal = await gw.call(agent, "delete_vm", {"target": "vc1", "vm": VM0, "force_power_off": True})
    gw.store.update_token("agent-d", role="writer")  # what `gateway token set-role` does
    demoted = Principal(name=agent.name, role="writer", token_id=agent.token_id, surface="https")
    with pytest.raises(GatewayError) as caught:
        await gw.call(demoted, "confirm_action", {"token": proposal["token"]})
    assert caught.value.code in ("forbidden", "not_found", "policy_denied")
    assert env.vm_exists(VM0)


async def test_approval_after_demotion_is_refused(env: Env) -> None:
    write_roles(
        env.tmp,
        {
            "deleter": role(write=("power_off_vm",), destructive=("delete_vm",)),
            "writer": role(write=("power_off_vm",)),
        },
    )
    gw = env.build(rules={**PERMISSIVE, "targets": {"vc1": {"require_web_approval": True}}})
    agent = token_principal(gw, "agent-d", "deleter")
    proposal = await gw.call(agent, "delete_vm", {"target": "vc1", "vm": VM0, "force_power_off": True})
    assert proposal["requires_human_approval"] is True
    gw.store.update_token("agent-d", role="writer")
    with pytest.raises(GatewayError):
        await gw.approve(proposal["proposal_id"], HUMAN)
    assert env.vm_exists(VM0)


async def test_confirm_after_target_gained_web_approval_is_refused(env: Env) -> None:
    gw = env.build()
    agent = token_principal(gw, "agent-w", "admin")
    proposal = await gw.call(agent, "delete_vm", {"target": "vc1", "vm": VM0, "force_power_off": True})
    assert proposal["requires_human_approval"] is False
    env.write_rules({**PERMISSIVE, "targets": {"vc1": {"require_web_approval": True}}})
    with pytest.raises(ApprovalRequired):
        await gw.call(agent, "confirm_action", {"token": proposal["token"]})
    assert env.vm_exists(VM0)


async def test_approval_after_revoke_is_refused_and_revoke_cancels(env: Env) -> None:
    gw = env.build(rules={**PERMISSIVE, "targets": {"vc1": {"require_web_approval": True}}})
    agent = token_principal(gw, "agent-r", "admin")
    proposal = await gw.call(agent, "delete_vm", {"target": "vc1", "vm": VM0, "force_power_off": True})
    gw.store.update_token("agent-r", revoked=True)  # a revoke that bypassed the server's own path
    with pytest.raises((ConfirmationInvalid, Forbidden, NotFound)):
        await gw.approve(proposal["proposal_id"], HUMAN)
    assert env.vm_exists(VM0)


async def test_revoking_a_token_cancels_its_pending_proposals_audited(env: Env) -> None:
    gw = env.build(rules={**PERMISSIVE, "targets": {"vc1": {"require_web_approval": True}}})
    agent = token_principal(gw, "agent-r", "admin")
    proposal = await gw.call(agent, "delete_vm", {"target": "vc1", "vm": VM0, "force_power_off": True})
    cancelled = gw.revoke_token("agent-r", by=Principal(name="cli:root", role="admin", surface="cli"))
    assert cancelled == [proposal["proposal_id"]]
    p = gw.store.get_proposal(proposal["proposal_id"])
    assert p is not None and p.state == "cancelled"
    (row,) = [r for r in env.rows(phase="cancelled") if r["proposal_id"] == proposal["proposal_id"]]
    assert row["reason"] == "token revoked"


# ---------------------------------------------------------------- reads under policy


async def test_read_deny_rule_is_enforced(env: Env) -> None:
    rules = {
        **PERMISSIVE,
        "rules": [
            {
                "name": "no-reads-for-watcher",
                "action": "deny",
                "match": {"tools": ["read"], "callers": ["watcher"]},
            }
        ],
    }
    gw = env.build(rules=rules)
    watcher = Principal(name="watcher", role="reader", surface="test")
    with pytest.raises(PolicyDenied, match="no-reads-for-watcher"):
        await gw.call(watcher, "list_vms", {"target": "vc1"})
    (row,) = env.rows(phase="denied", tool="list_vms")
    assert row["decision"]["rule"] == "rule:no-reads-for-watcher"
    other = Principal(name="someone", role="reader", surface="test")
    assert (await gw.call(other, "list_vms", {"target": "vc1"}))["count"] >= 2


async def test_read_rate_limit_is_enforced(env: Env) -> None:
    gw = env.build(rules={**PERMISSIVE, "targets": {"vc1": {"max_calls_per_minute": {"read": 2}}}})
    reader = Principal(name="watcher", role="reader", surface="test")
    for _ in range(2):
        await gw.call(reader, "list_vms", {"target": "vc1"})
    with pytest.raises(RateLimited):
        await gw.call(reader, "list_vms", {"target": "vc1"})


async def test_one_callers_reads_never_spend_another_callers_budget(env: Env) -> None:
    gw = env.build(rules={**PERMISSIVE, "targets": {"vc1": {"max_calls_per_minute": {"read": 3}}}})
    reader = Principal(name="watcher", role="reader", surface="test")
    for _ in range(3):
        await gw.call(reader, "list_vms", {"target": "vc1"})
    with pytest.raises(RateLimited) as spent:
        await gw.call(reader, "list_vms", {"target": "vc1"})
    assert (await gw.call(HUMAN, "list_vms", {"target": "vc1"}))["count"] >= 2  # alice's own budget
    assert "caller 'watcher'" in spent.value.message


async def test_the_target_wide_ceiling_counts_every_caller_together(env: Env) -> None:
    limits = {"max_calls_per_minute": {"read": 5}, "target_max_calls_per_minute": {"read": 3}}
    gw = env.build(rules={**PERMISSIVE, "targets": {"vc1": limits}})
    callers = [Principal(name=f"agent-{i}", role="reader", surface="test") for i in range(3)]
    for caller in callers:
        await gw.call(caller, "list_vms", {"target": "vc1"})
    with pytest.raises(RateLimited, match=r"target_max_calls_per_minute\.read"):
        await gw.call(HUMAN, "list_vms", {"target": "vc1"})
    (row,) = env.rows(phase="denied", tool="list_vms")
    assert row["caller"] == "alice" and row["error_code"] == "rate_limited"


# ---------------------------------------------------------------- order: policy before state


async def test_protected_powered_on_vm_delete_gets_the_policy_denial(env: Env) -> None:
    rules = {**PERMISSIVE, "protected": [{"name": "keep-vm0", "vm_patterns": [VM0]}]}
    gw = env.build(rules=rules)
    assert env.power_state(VM0) == "poweredOn"
    with pytest.raises(PolicyDenied, match="keep-vm0") as caught:
        await gw.call(HUMAN, "delete_vm", {"target": "vc1", "vm": VM0})
    assert "power" not in caught.value.message.lower()


async def test_broken_rules_file_answers_with_the_policy_error(env: Env) -> None:
    first = env.build()
    (env.tmp / "rules.yaml").write_text("defaults: [this is not\n")
    gw = Gateway.build(first.settings)  # broken at its start: no good rules to keep
    env.gateways.append(gw)
    with pytest.raises(PolicyDenied, match="policy file") as caught:
        await gw.call(HUMAN, "delete_vm", {"target": "vc1", "vm": VM1})
    assert "power" not in caught.value.message.lower()


async def test_gateway_token_revoke_cancels_the_tokens_proposals(
    env: Env, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import anyio
    from simulator import write_targets

    from gateway.cli import main

    gw = env.build(rules={**PERMISSIVE, "targets": {"vc1": {"require_web_approval": True}}})
    agent = token_principal(gw, "agent-r", "admin")
    proposal = await gw.call(agent, "delete_vm", {"target": "vc1", "vm": VM0, "force_power_off": True})
    for key, value in write_targets(env.tmp / "targets.yaml", {"vc1": env.sim}).items():
        monkeypatch.setenv(key, value)
    assert await anyio.to_thread.run_sync(main, ["token", "revoke", "agent-r", "--home", str(env.tmp)]) == 0
    assert proposal["proposal_id"] in capsys.readouterr().out
    p = gw.store.get_proposal(proposal["proposal_id"])
    assert p is not None and p.state == "cancelled"
    (row,) = env.rows(phase="token_revoked")
    assert row["cancelled_proposals"] == [proposal["proposal_id"]] and row["caller"].startswith("os:")


async def test_the_server_cancels_proposals_of_tokens_revoked_elsewhere(env: Env) -> None:
    gw = env.build()
    agent = token_principal(gw, "agent-r", "admin")
    proposal = await gw.call(agent, "delete_vm", {"target": "vc1", "vm": VM0, "force_power_off": True})
    assert gw.cancel_orphaned() == []
    gw.store.update_token("agent-r", revoked=True)  # another process, without the gateway's path
    assert gw.cancel_orphaned() == [proposal["proposal_id"]]
    with pytest.raises(Forbidden, match="revoked"):  # the token first, before anything about the proposal
        await gw.call(agent, "confirm_action", {"token": proposal["token"]})
    (row,) = [r for r in env.rows(phase="cancelled") if r["proposal_id"] == proposal["proposal_id"]]
    assert row["reason"] == "token revoked" and row["caller"] == "gateway"
    assert env.vm_exists(VM0)


# ---------------------------------------------------------------- each object of a bulk call


async def test_each_object_of_a_bulk_call_is_judged_as_the_tool_it_runs(env: Env) -> None:
    rules = {
        **PERMISSIVE,
        "rules": [
            {"name": "keep-vm1", "action": "deny", "match": {"tools": ["delete_vm"], "vm_patterns": [VM1]}}
        ],
    }
    gw = env.build(rules=rules)
    with pytest.raises(PolicyDenied, match="keep-vm1"):
        await gw.call(
            HUMAN,
            "bulk_vm_action",
            {
                "target": "vc1",
                "action": "delete_vm",
                "name_regex": "DC0_C0_RP0_VM.*",
                "force_power_off": True,
            },
        )
    assert gw.store.list_proposals(["pending"]) == []


# ---------------------------------------------------------------- sanitized text


async def test_proposals_and_pending_lists_carry_no_hidden_characters(env: Env) -> None:
    from simulator import find_vm, pyvmomi_connect, read_properties, wait_until

    from gateway.server.pipeline import proposal_view

    sneaky = "DC0_C0_RP0_VM0\u202etxt.exe\u200b"
    si = pyvmomi_connect(env.sim)
    task = find_vm(si, VM0).Rename_Task(newName=sneaky)
    wait_until(lambda: read_properties(si, task, "info.state")["info.state"] in ("success", "error"))
    gw = env.build()
    proposal = await gw.call(HUMAN, "delete_vm", {"target": "vc1", "vm": sneaky, "force_power_off": True})
    listed = (await gw.call(HUMAN, "list_pending_actions", {}))["pending"]
    stored = gw.store.get_proposal(proposal["proposal_id"])
    assert stored is not None
    shown = [proposal["summary"], proposal["affected"], listed, proposal_view(stored, gw.clock())]
    for text in map(str, shown):
        assert "\u202e" not in text and "\u200b" not in text
    assert "txt.exe" in proposal["summary"], "the name is still there, its hidden characters made visible"


async def test_power_state_advice_only_after_the_policy(env: Env) -> None:
    rules = {
        **PERMISSIVE,
        "protected": [{"name": "keep-vm0", "vm_patterns": [VM0], "min_risk_level": "medium"}],
    }
    gw = env.build(rules=rules)
    with pytest.raises(PolicyDenied, match="keep-vm0"):  # already on: still the policy's answer first
        await gw.call(HUMAN, "power_on_vm", {"target": "vc1", "vm": VM0})
    from gateway.errors import InvalidState

    with pytest.raises(InvalidState, match="poweredOn"):  # allowed by policy: now the state advice
        await gw.call(HUMAN, "power_on_vm", {"target": "vc1", "vm": VM1})
