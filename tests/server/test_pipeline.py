"""The guarded call pipeline end to end: real simulator, real store, real audit file, real policy file."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml
from support.gateway_env import (
    ADMIN,
    HUMAN,
    OTHER,
    PERMISSIVE,
    READER,
    VM0,
    VM1,
    Env,
    propose_delete,
    role,
    token_principal,
    write_roles,
)
from support.simulator import (
    find_vm,
    pyvmomi_connect,
    read_properties,
    wait_until,
    write_targets,
)

from gateway.audit.verify import verify
from gateway.auth.tokens import Principal
from gateway.errors import (
    ApprovalRequired,
    AuditUnavailable,
    ConfigError,
    ConfirmationExpired,
    ConfirmationInvalid,
    Forbidden,
    GatewayError,
    NotFound,
    PolicyDenied,
    RateLimited,
    Stale,
)
from gateway.server.runtime import Gateway
from gateway.vocabulary import Kind

pytestmark = pytest.mark.anyio


# ---------------------------------------------------------------- writes


async def test_a_write_on_all_targets_is_denied_and_audited(env: Env) -> None:
    gw = env.build()
    with pytest.raises(PolicyDenied, match="exactly one explicit target"):
        await gw.calls.call(ADMIN, "power_off_vm", {"target": "all", "vm": VM0})
    (row,) = env.rows(phase="denied")
    assert row["tool"] == "power_off_vm" and row["decision"]["rule"] == "target:single"
    assert env.power_state(VM0) == "poweredOn"


async def test_an_allowed_write_executes_and_is_audited(env: Env) -> None:
    gw = env.build()
    result = await gw.calls.call(ADMIN, "power_off_vm",
                                 {"target": "vc1", "vm": VM0, "guest_timeout_seconds": 0})
    assert result["target"] == "vc1"
    assert env.power_state(VM0) == "poweredOff"
    (row,) = env.rows(phase="executed")
    assert row["caller"] == "agent-a" and row["target"] == "vc1" and row["decision"]["allowed"] is True
    assert "result_digest" in row and "result" not in row


async def test_strict_defaults_deny_destructive_calls(env: Env) -> None:
    gw = env.build(rules={})
    with pytest.raises(PolicyDenied):
        await propose_delete(gw)
    assert env.rows(phase="denied")[0]["tool"] == "delete_vm"
    assert gw.store.list_proposals() == []


async def test_a_role_without_the_tool_is_refused_like_an_unknown_tool(env: Env) -> None:
    gw = env.build()
    with pytest.raises(NotFound, match="unknown tool 'power_on_vm'"):
        await gw.calls.call(READER, "power_on_vm", {"target": "vc1", "vm": VM0})
    (row,) = env.rows(phase="denied")
    assert row["decision"]["rule"] == "role:reader" and row["caller"] == "watcher"
    assert "power_on_vm" not in {t.name for t in gw.facts.tools_for(READER)}


async def test_bad_arguments_never_reach_vsphere(env: Env) -> None:
    gw = env.build()
    with pytest.raises(GatewayError) as info:
        await gw.calls.call(ADMIN, "reconfigure_vm", {"target": "vc1", "vm": VM0, "cpus": "four"})
    assert info.value.code == "invalid_argument"


# ---------------------------------------------------------------- two-phase confirmation


async def test_delete_is_proposed_then_executed_once(env: Env) -> None:
    gw = env.build()
    proposal = await propose_delete(gw)
    assert proposal["state"] == "pending" and proposal["target"] == "vc1"
    assert proposal["target_host"] == env.sim.address
    assert [a["name"] for a in proposal["affected"]] == [VM0]
    assert proposal["expires_in_seconds"] == 120 and "Nothing has changed yet" in proposal["note"]
    assert env.vm_exists(VM0), "a proposal must change nothing"

    done = await gw.calls.call(ADMIN, "confirm_action", {"token": proposal["token"]})
    assert done["state"] == "executed" and done["target"] == "vc1"
    assert not env.vm_exists(VM0)
    with pytest.raises(ConfirmationInvalid):
        await gw.calls.call(ADMIN, "confirm_action", {"token": proposal["token"]})
    phases = [r["phase"] for r in env.rows(tool="delete_vm")]
    # the intent before vSphere, the outcome after it, and the refused second confirm, all on record
    assert phases == ["proposed", "executing", "executed", "denied"]
    assert all(proposal["token"] not in json.dumps(r) for r in env.rows())
    assert verify(env.tmp / "audit.jsonl").ok


async def test_two_concurrent_confirms_execute_exactly_once(env: Env) -> None:
    gw = env.build()
    proposal = await propose_delete(gw)
    outcomes: list[str] = []

    async def confirm() -> None:
        try:
            await gw.calls.call(ADMIN, "confirm_action", {"token": proposal["token"]})
            outcomes.append("executed")
        except ConfirmationInvalid:
            outcomes.append("refused")

    async with anyio.create_task_group() as tg:
        for _ in range(4):
            tg.start_soon(confirm)
    assert sorted(outcomes) == ["executed", "refused", "refused", "refused"]
    assert len(env.rows(phase="executed")) == 1


async def test_another_caller_cannot_confirm(env: Env) -> None:
    gw = env.build()
    proposal = await propose_delete(gw)
    with pytest.raises(ConfirmationInvalid):
        await gw.calls.call(OTHER, "confirm_action", {"token": proposal["token"]})
    assert env.vm_exists(VM0)
    await gw.calls.call(ADMIN, "confirm_action", {"token": proposal["token"]})
    assert not env.vm_exists(VM0)


async def test_an_expired_proposal_cannot_run_and_its_expiry_is_audited(env: Env) -> None:
    gw = env.build()
    proposal = await propose_delete(gw)
    env.clock.now += 121
    with pytest.raises(ConfirmationExpired):
        await gw.calls.call(ADMIN, "confirm_action", {"token": proposal["token"]})
    gw.moves.expire_due()
    assert [r["proposal_id"] for r in env.rows(phase="expired")] == [proposal["proposal_id"]]
    assert gw.store.get_proposal(proposal["proposal_id"]).state == "expired"  # type: ignore[union-attr]
    assert env.vm_exists(VM0)


async def test_cancel_kills_the_token(env: Env) -> None:
    gw = env.build()
    proposal = await propose_delete(gw)
    await gw.calls.call(ADMIN, "cancel_action", {"token": proposal["token"]})
    with pytest.raises(ConfirmationInvalid):
        await gw.calls.call(ADMIN, "confirm_action", {"token": proposal["token"]})
    assert env.vm_exists(VM0) and env.rows(phase="cancelled")


async def test_a_renamed_vm_makes_the_proposal_stale(env: Env) -> None:
    gw = env.build()
    proposal = await propose_delete(gw, vm=VM1)
    si = pyvmomi_connect(env.sim)
    vm = find_vm(si, VM1)
    task = vm.Rename_Task(newName="renamed-meanwhile")
    wait_until(lambda: read_properties(si, task, "info.state")["info.state"] in ("success", "error"))
    with pytest.raises(Stale):
        await gw.calls.call(ADMIN, "confirm_action", {"token": proposal["token"]})
    assert env.vm_exists("renamed-meanwhile")
    assert gw.store.get_proposal(proposal["proposal_id"]).state == "stale"  # type: ignore[union-attr]
    (row,) = env.rows(phase="stale")
    assert row["proposal_id"] == proposal["proposal_id"]


async def test_policy_is_checked_again_at_confirmation(env: Env) -> None:
    gw = env.build()
    proposal = await propose_delete(gw)
    env.write_rules({"defaults": {"destructive": "deny"}})
    with pytest.raises(PolicyDenied):
        await gw.calls.call(ADMIN, "confirm_action", {"token": proposal["token"]})
    assert env.vm_exists(VM0)


async def test_web_approval_gates_the_agent_and_a_human_executes(env: Env) -> None:
    gw = env.build(rules={**PERMISSIVE, "targets": {"vc1": {"require_web_approval": True}}})
    proposal = await propose_delete(gw)
    assert proposal["requires_human_approval"] is True
    with pytest.raises(ApprovalRequired):
        await gw.calls.call(ADMIN, "confirm_action", {"token": proposal["token"]})
    assert env.vm_exists(VM0)
    result = (await gw.actions.approve(proposal["proposal_id"], HUMAN)).value
    assert result["state"] == "executed" and not env.vm_exists(VM0)
    approved = env.rows(phase="approved")
    assert approved[0]["caller"] == "alice" and approved[0]["surface"] == "web"


async def test_dry_run_runs_everything_but_the_change(env: Env) -> None:
    gw = env.build(targets_extra={"dry_run": True})
    proposal = await propose_delete(gw)
    result = await gw.calls.call(ADMIN, "confirm_action", {"token": proposal["token"]})
    assert result["dry_run"] is True and "would" in result
    assert env.vm_exists(VM0)
    assert env.rows(phase="dry_run")
    off = await gw.calls.call(ADMIN, "power_off_vm", {"target": "vc1", "vm": VM0})
    assert off["dry_run"] is True and env.power_state(VM0) == "poweredOn"


async def test_bulk_over_the_limit_is_denied_before_any_proposal(env: Env) -> None:
    gw = env.build(rules={**PERMISSIVE, "defaults": {**PERMISSIVE["defaults"], "max_bulk_objects": 1}})
    with pytest.raises(PolicyDenied, match=r"bulk|objects"):
        await gw.calls.call(
            ADMIN,
            "bulk_vm_action",
            {
                "target": "vc1",
                "action": "delete_vm",
                "name_regex": "DC0_C0_RP0_VM.*",
                "force_power_off": True,
            },
        )
    assert gw.store.list_proposals() == []
    assert env.vm_exists(VM0) and env.vm_exists(VM1)


async def test_rate_limit_per_target_and_category(env: Env) -> None:
    limits = {**PERMISSIVE["defaults"], "max_calls_per_minute": {"write": 2}}
    gw = env.build(rules={"defaults": limits})
    for vm in (VM0, VM1):
        await gw.calls.call(ADMIN, "power_off_vm", {"target": "vc1", "vm": vm, "guest_timeout_seconds": 0})
    with pytest.raises(RateLimited) as info:
        await gw.calls.call(ADMIN, "power_on_vm", {"target": "vc1", "vm": VM0})
    assert info.value.retry_after > 0
    await gw.calls.call(ADMIN, "list_vms", {"target": "vc1"})  # reads are not throttled


# ---------------------------------------------------------------- fail closed


async def test_a_broken_rules_edit_fails_closed(env: Env) -> None:
    gw = env.build(rules=PERMISSIVE)
    (env.tmp / "rules.yaml").write_text("defaults: {write: allow\n")
    with pytest.raises(PolicyDenied, match="not valid YAML"):
        await gw.calls.call(ADMIN, "power_off_vm", {"target": "vc1", "vm": VM0})
    assert env.power_state(VM0) == "poweredOn"  # nothing fell back to the permissive rules before
    with pytest.raises(PolicyDenied, match="policy file"):  # reads included
        await gw.calls.call(ADMIN, "list_vms", {"target": "vc1"})


def rules_cuts(text: str) -> list[int]:
    """Where a rules file cut at a section boundary ends: before each top-level key, and right after a
    ``key:`` line whose entries follow on the next lines."""
    cuts, offset = [], 0
    for line in text.splitlines(keepends=True):
        if not line.startswith((" ", "-", "#")):
            cuts.append(offset)
            if line.rstrip().endswith(":"):
                cuts.append(offset + len(line))
        offset += len(line)
    return cuts


async def test_a_rules_file_cut_at_a_section_boundary_fails_closed(env: Env) -> None:
    rules = {**PERMISSIVE, "protected": [{"name": "keep-vm0", "vm_patterns": [VM0]}],
             "targets": {"vc1": {"require_web_approval": True}}}
    gw = env.build(rules=rules)
    full = (env.tmp / "rules.yaml").read_text()
    for index, cut in enumerate(rules_cuts(full)):
        (env.tmp / "rules.yaml").write_text(full[:cut])
        agent = Principal(name=f"agent-{index}", role="admin", surface="test")  # no runaway breaker trip
        with pytest.raises(PolicyDenied, match="policy file"):
            await gw.calls.call(agent, "delete_vm", {"target": "vc1", "vm": VM0, "force_power_off": True})
        with pytest.raises(PolicyDenied, match="policy file"):
            await propose_delete(gw, VM1, agent)
    assert env.vm_exists(VM0) and env.vm_exists(VM1)


async def test_a_broken_rules_file_at_start_fails_closed(env: Env) -> None:
    gw = env.build()
    (env.tmp / "rules.yaml").write_text("defaults: {read: allow}\nprotected:\n")
    fresh = Gateway.build(gw.settings)
    env.gateways.append(fresh)
    with pytest.raises(PolicyDenied, match=r"missing section 'rules'"):
        await fresh.calls.call(ADMIN, "list_vms", {"target": "vc1"})
    with pytest.raises(PolicyDenied, match="policy file"):
        await fresh.calls.call(ADMIN, "power_off_vm", {"target": "vc1", "vm": VM0})
    assert env.power_state(VM0) == "poweredOn"
    assert "no usable rules file (`gateway check` shows why)" in fresh.readiness()
    assert "no usable rules file (`gateway check` shows why)" in gw.readiness()  # no rules before stay


async def test_an_unwritable_audit_log_refuses_the_call_before_vsphere(env: Env) -> None:
    gw = env.build()
    audit = env.tmp / "audit.jsonl"
    audit.unlink(missing_ok=True)
    audit.mkdir()  # a directory where the log should be: every append fails, even as root
    with pytest.raises(AuditUnavailable):
        await gw.calls.call(ADMIN, "power_off_vm", {"target": "vc1", "vm": VM0, "guest_timeout_seconds": 0})
    assert env.power_state(VM0) == "poweredOn"
    with pytest.raises(AuditUnavailable):
        await propose_delete(gw)
    assert gw.store.list_proposals() == []
    assert "audit log not writable" in gw.readiness()


async def test_read_only_mode_withholds_every_change(env: Env) -> None:
    gw = env.build(read_only=True)
    names = {t.name for t in gw.facts.tools_for(ADMIN)}
    assert "list_vms" in names and not names & {"power_on_vm", "delete_vm", "confirm_action"}
    with pytest.raises(NotFound):
        await gw.calls.call(ADMIN, "power_on_vm", {"target": "vc1", "vm": VM0})


# ---------------------------------------------------------------- reads


async def test_read_fan_out_answers_per_target(env: Env) -> None:
    gw = env.build()
    one = await gw.calls.call(ADMIN, "list_vms", {"target": "vc1"})
    assert {row["name"] for row in one["vms"]} >= {VM0, VM1}
    many = await gw.calls.call(ADMIN, "list_vms", {"target": "all"})
    assert set(many) == {"vc1"} and "ok" in many["vc1"]
    with pytest.raises(NotFound, match="unknown target 'nope'"):
        await gw.calls.call(ADMIN, "list_vms", {"target": ["vc1", "nope"]})
    (row,) = [r for r in env.rows(phase="call") if r["target"] == "all"]
    assert row["outcome"] == "ok"


def write_read_role(home: Path, name: str, targets: str) -> None:
    """A roles.yaml with one custom role that reads the targets matching ``targets``."""
    role = {
        "tools": "read",
        "allow_write": [],
        "allow_destructive": [],
        "targets": [targets],
        "approve": "none",
    }
    (home / "roles.yaml").write_text(yaml.safe_dump({"roles": {name: role}}))
    os.chmod(home / "roles.yaml", 0o600)


async def test_list_targets_hides_addresses_from_narrow_roles(env: Env, tmp_path: Path) -> None:
    write_read_role(tmp_path, "narrow", "vc1")
    gw = env.build()
    wide = await gw.calls.call(ADMIN, "list_targets", {})
    assert wide["targets"][0]["host"] == env.sim.host
    narrow = await gw.calls.call(Principal(name="n", role="narrow", surface="test"), "list_targets", {})
    assert narrow["targets"][0]["name"] == "vc1" and "host" not in narrow["targets"][0]


async def test_role_without_targets_gets_forbidden_for_all(env: Env, tmp_path: Path) -> None:
    write_read_role(tmp_path, "lab", "lab-*")
    gw = env.build()
    lab = Principal(name="l", role="lab", surface="test")
    with pytest.raises(Forbidden):
        await gw.calls.call(lab, "list_vms", {"target": "all"})
    with pytest.raises(NotFound, match="unknown target 'vc1'"):
        await gw.calls.call(lab, "list_vms", {"target": "vc1"})
    (row,) = env.rows(phase="denied", target="vc1")
    assert row["caller"] == "l" and row["decision"]["rule"] == "role:lab"
    assert [r["error_code"] for r in env.rows(phase="denied")] == ["forbidden", "not_found"]


async def test_a_claim_without_a_process_is_settled_after_the_grace(env: Env) -> None:
    gw = env.build()
    proposal = await propose_delete(gw)
    pid = proposal["proposal_id"]
    assert gw.store.transition(pid, ["pending"], "executing", decided_at=env.clock.now)
    assert gw.moves.settle_interrupted() == [], "a claim naming no process may still be running elsewhere"
    env.clock.now += 3 * 86400
    assert gw.moves.settle_interrupted() == [pid]
    settled = gw.store.get_proposal(pid)
    assert settled is not None and settled.state == "outcome_unknown" and settled.outcome == "outcome_unknown"
    assert env.rows(phase="outcome_unknown")[-1]["error_code"] == "outcome_unknown"


async def test_a_dead_process_claim_is_settled_at_once_a_live_one_never(env: Env) -> None:
    from gateway.store.instance import Instance

    gw = env.build()
    dead, live = Instance(env.tmp), Instance(env.tmp)
    dead_pid = (await propose_delete(gw, VM0))["proposal_id"]
    live_pid = (await propose_delete(gw, VM1))["proposal_id"]
    assert gw.store.transition(dead_pid, ["pending"], "executing", executor=dead.acquire())
    assert gw.store.transition(live_pid, ["pending"], "executing", executor=live.acquire())
    dead.close()  # what the kernel does to the lock of a process that died
    try:
        assert gw.moves.settle_interrupted() == [dead_pid]
        assert gw.moves.settle_interrupted() == []
        p = gw.store.get_proposal(live_pid)
        assert p is not None and p.state == "executing"
        (row,) = env.rows(phase="outcome_unknown")
        assert row["proposal_id"] == dead_pid and dead.id in row["reason"]
    finally:
        live.close()


async def test_the_pending_command_is_a_human_approval_path(
    env: Env, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from gateway.cli import main
    from gateway.server.edge.mcp import stdio_principal

    gw = env.build(rules={**PERMISSIVE, "targets": {"vc1": {"require_web_approval": True}}})
    desktop = stdio_principal()  # the desktop user's agent session proposes; that user, a person, approves
    proposal = await propose_delete(gw, who=desktop)
    with pytest.raises(ApprovalRequired):
        await gw.calls.call(desktop, "confirm_action", {"token": proposal["token"]})
    for key, value in write_targets(env.tmp / "targets.yaml", {"vc1": env.sim}).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("GATEWAY_ENABLE_DESTRUCTIVE", "true")
    home = ["--home", str(env.tmp)]
    assert await anyio.to_thread.run_sync(main, ["pending", "list", *home]) == 0
    listing = capsys.readouterr().out
    assert proposal["proposal_id"] in listing and "BLOCKED until approved" in listing and "vc1" in listing
    assert proposal["token"] not in listing
    assert await anyio.to_thread.run_sync(main, ["pending", "approve", proposal["proposal_id"], *home]) == 0
    assert not env.vm_exists(VM0)
    approved = env.rows(phase="approved")[-1]
    assert approved["surface"] == "cli" and approved["caller"].startswith("os:")
    assert (approved["kind"], approved["requested_by"]) == ("person", desktop.name)
    assert env.rows(phase="proposed")[-1]["kind"] == "agent"


async def test_a_refused_human_approval_is_audited(env: Env) -> None:
    gw = env.build(rules={**PERMISSIVE, "targets": {"vc1": {"require_web_approval": True}}})
    proposal = await propose_delete(gw)
    with pytest.raises(NotFound):
        await gw.actions.approve(proposal["proposal_id"], Principal(name="bob", role="reader", surface="web",
                                                                    kind=Kind.PERSON))
    row = env.rows(phase="denied")[-1]
    assert (row["caller"], row["kind"], row["reason_code"]) == ("bob", "person", "not_visible")
    for agent in (ADMIN, OTHER):  # the proposer itself, and another admin agent
        with pytest.raises(Forbidden) as refused:
            await gw.actions.approve(proposal["proposal_id"], agent)
        assert refused.value.details["reason_code"] == "not_a_person"
        row = env.rows(phase="denied")[-1]
        assert (row["caller"], row["kind"], row["via"], row["reason_code"], row["decision"]["rule"]) == (
            agent.name, "agent", "approve", "not_a_person", "kind:agent")
    assert env.vm_exists(VM0)


async def test_every_proposal_move_is_audited_then_announced_to_listeners(env: Env) -> None:
    gw = env.build(rules={**PERMISSIVE, "targets": {"vc1": {"require_web_approval": True}}})
    seen: list[tuple[str, str, int]] = []
    gw.moves.add_lifecycle_listener(
        lambda event, p: seen.append((event, p.state, len(env.rows(phase=event)))))
    gw.moves.add_lifecycle_listener(lambda event, p: 1 / 0)  # a failing listener never breaks the move
    approved = await propose_delete(gw, VM0)
    await gw.actions.approve(approved["proposal_id"], HUMAN)
    cancelled = await propose_delete(gw, VM1)
    await gw.calls.call(ADMIN, "cancel_action", {"token": cancelled["token"]})
    moves = ["proposed", "approved", "executing", "executed", "proposed", "cancelled"]
    assert [e for e, _, _ in seen] == moves
    assert [s for e, s, _ in seen if e != "proposed"] == [m for m in moves if m != "proposed"]
    assert all(rows >= 1 for _, _, rows in seen), "each move's row is written before listeners hear of it"


# ---------------------------------------------------------------- configuration loads are audited


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def config_rows(env: Env, file: str) -> list[dict[str, Any]]:
    return [row for row in env.rows(phase="config_reload") if row["file"] == file]


async def test_every_configuration_load_is_an_audit_row(env: Env) -> None:
    (env.tmp / "notifications.yaml").write_text(
        "notifications:\n  channels:\n    - {name: team, kind: chat, url_env: TEAM_CHAT_URL}\n")
    gw = env.build(rules={**PERMISSIVE, "protected": [{"name": "keep-vm0", "vm_patterns": [VM0]}]},
                   notify_env={"TEAM_CHAT_URL": "https://chat.example.com/hook"})
    rows = {row["file"]: row for row in env.rows(phase="config_reload")}
    assert rows["targets"]["sha256"] == sha256_of(env.tmp / "targets.yaml")
    assert rows["targets"]["counts"] == {"targets": 1} and rows["targets"]["outcome"] == "loaded"
    assert rows["notifications"]["counts"] == {"channels": 1}
    assert rows["rules"]["sha256"] == sha256_of(env.tmp / "rules.yaml") and rows["rules"]["at_start"]
    assert rows["rules"]["counts"]["protected"] == 1 and rows["rules"]["caller"] == "gateway"

    env.write_rules({**PERMISSIVE, "rules": [{"name": "no-vc2", "action": "deny",
                                              "match": {"targets": ["vc1"], "tools": ["delete_vm"]}}]})
    await gw.calls.call(ADMIN, "list_vms", {"target": "vc1"})
    changed = config_rows(env, "rules")[-1]
    assert changed["outcome"] == "loaded" and changed["sha256"] == sha256_of(env.tmp / "rules.yaml")
    assert changed["changed"]["rules"] == {"added": 1} and changed["changed"]["protected"] == {"removed": 1}

    cut = (env.tmp / "rules.yaml").read_text().split("rules:")[0]
    (env.tmp / "rules.yaml").write_text(cut)
    for _ in range(2):  # the second read: the same content, no second row
        with pytest.raises(PolicyDenied, match="missing section 'rules'"):  # fails closed, reads included
            await gw.calls.call(ADMIN, "list_vms", {"target": "vc1"})
    refused = config_rows(env, "rules")
    assert len(refused) == 3 and refused[-1]["outcome"] == "refused"
    assert "missing section 'rules'" in refused[-1]["error"] and "no earlier rules" in refused[-1]["effect"]
    assert refused[-1]["sha256"] == sha256_of(env.tmp / "rules.yaml")

    (env.tmp / "roles.yaml").write_text(yaml.safe_dump({"roles": {"ops": {
        "tools": "read", "allow_write": [], "allow_destructive": [], "targets": "*", "approve": "none"}}}))
    os.chmod(env.tmp / "roles.yaml", 0o600)
    assert "ops" in gw.roles.roles()
    (env.tmp / "roles.yaml").write_text("roles: {ops: {tools: read}}\n")
    assert "ops" not in gw.roles.roles()
    roles = config_rows(env, "roles")
    assert [r["outcome"] for r in roles] == ["loaded", "refused"]
    assert roles[0]["counts"] == {"roles": 1} and roles[0]["sha256"] != roles[1]["sha256"]
    assert "approve" in roles[1]["error"]


@pytest.mark.parametrize(("file", "text", "problem"), [
    ("targets", "targets:\n  - {name: vc1}\n", "host"),
    ("notifications", "notifications:\n  channels:\n    - {name: x, kind: carrier-pigeon}\n", "kind"),
])
async def test_a_file_refused_at_start_is_an_audit_row(env: Env, file: str, text: str, problem: str) -> None:
    gw = env.build()
    (env.tmp / f"{file}.yaml").write_text(text)
    with pytest.raises(ConfigError):
        Gateway.build(gw.settings)
    (row,) = [r for r in config_rows(env, file) if r["outcome"] == "refused"]
    assert problem in row["error"] and row["effect"] == "the gateway did not start"
    assert row["sha256"] == sha256_of(env.tmp / f"{file}.yaml")


# ---------------------------------------------------------------- bulk calls: reach, and each object


async def test_bulk_delete_needs_delete_vm_in_the_role(env: Env) -> None:
    write_roles(env.tmp, {"bulker": role(destructive=("bulk_vm_action",))})
    gw = env.build()
    bulker = token_principal(gw, "bulk-agent", "bulker")
    with pytest.raises(Forbidden, match="delete_vm"):
        await gw.calls.call(
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


async def test_each_object_of_a_bulk_call_is_judged_as_the_tool_it_runs(env: Env) -> None:
    rules = {
        **PERMISSIVE,
        "rules": [
            {"name": "keep-vm1", "action": "deny", "match": {"tools": ["delete_vm"], "vm_patterns": [VM1]}}
        ],
    }
    gw = env.build(rules=rules)
    with pytest.raises(PolicyDenied, match="keep-vm1"):
        await gw.calls.call(
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
    proposal = await gw.calls.call(agent, "delete_vm", {"target": "vc1", "vm": VM0, "force_power_off": True})
    gw.store.update_token("agent-d", role="writer")  # what `gateway token set-role` does
    demoted = Principal(name=agent.name, role="writer", token_id=agent.token_id, surface="https")
    with pytest.raises(GatewayError) as caught:
        await gw.calls.call(demoted, "confirm_action", {"token": proposal["token"]})
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
    proposal = await gw.calls.call(agent, "delete_vm", {"target": "vc1", "vm": VM0, "force_power_off": True})
    assert proposal["requires_human_approval"] is True
    gw.store.update_token("agent-d", role="writer")
    with pytest.raises(GatewayError):
        await gw.actions.approve(proposal["proposal_id"], HUMAN)
    assert env.vm_exists(VM0)


async def test_confirm_after_target_gained_web_approval_is_refused(env: Env) -> None:
    gw = env.build()
    agent = token_principal(gw, "agent-w", "admin")
    proposal = await gw.calls.call(agent, "delete_vm", {"target": "vc1", "vm": VM0, "force_power_off": True})
    assert proposal["requires_human_approval"] is False
    env.write_rules({**PERMISSIVE, "targets": {"vc1": {"require_web_approval": True}}})
    with pytest.raises(ApprovalRequired):
        await gw.calls.call(agent, "confirm_action", {"token": proposal["token"]})
    assert env.vm_exists(VM0)


async def test_approval_after_revoke_is_refused_and_revoke_cancels(env: Env) -> None:
    gw = env.build(rules={**PERMISSIVE, "targets": {"vc1": {"require_web_approval": True}}})
    agent = token_principal(gw, "agent-r", "admin")
    proposal = await gw.calls.call(agent, "delete_vm", {"target": "vc1", "vm": VM0, "force_power_off": True})
    gw.store.update_token("agent-r", revoked=True)  # a revoke that bypassed the server's own path
    with pytest.raises((ConfirmationInvalid, Forbidden, NotFound)):
        await gw.actions.approve(proposal["proposal_id"], HUMAN)
    assert env.vm_exists(VM0)


async def test_revoking_a_token_cancels_its_pending_proposals_audited(env: Env) -> None:
    gw = env.build(rules={**PERMISSIVE, "targets": {"vc1": {"require_web_approval": True}}})
    agent = token_principal(gw, "agent-r", "admin")
    proposal = await gw.calls.call(agent, "delete_vm", {"target": "vc1", "vm": VM0, "force_power_off": True})
    cancelled = gw.moves.revoke_token("agent-r", by=Principal(name="cli:root", role="admin", surface="cli"))
    assert cancelled == [proposal["proposal_id"]]
    p = gw.store.get_proposal(proposal["proposal_id"])
    assert p is not None and p.state == "cancelled"
    (row,) = [r for r in env.rows(phase="cancelled") if r["proposal_id"] == proposal["proposal_id"]]
    assert row["reason"] == "token revoked"


async def test_the_server_cancels_proposals_of_tokens_revoked_elsewhere(env: Env) -> None:
    gw = env.build()
    agent = token_principal(gw, "agent-r", "admin")
    proposal = await gw.calls.call(agent, "delete_vm", {"target": "vc1", "vm": VM0, "force_power_off": True})
    assert gw.moves.cancel_orphaned() == []
    gw.store.update_token("agent-r", revoked=True)  # another process, without the gateway's path
    assert gw.moves.cancel_orphaned() == [proposal["proposal_id"]]
    with pytest.raises(Forbidden, match="revoked"):  # the token first, before anything about the proposal
        await gw.calls.call(agent, "confirm_action", {"token": proposal["token"]})
    (row,) = [r for r in env.rows(phase="cancelled") if r["proposal_id"] == proposal["proposal_id"]]
    assert row["reason"] == "token revoked" and row["caller"] == "gateway"
    assert env.vm_exists(VM0)
